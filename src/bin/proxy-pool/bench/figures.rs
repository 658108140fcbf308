//! Figures read from replies and samples: a field of an `INFO` reply, the
//! count an extraction returned, a percentile.

/// The value of `name` in an `INFO` reply.
pub(super) fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// `returned` of a 200 extraction body, read without parsing the whole body.
pub(super) fn returned(body: &str) -> Option<u64> {
    let at = body.find("\"returned\":")? + "\"returned\":".len();
    let digits: String = body[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The `q` quantile of sorted `values` (nearest rank).
pub(super) fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nearest-rank percentiles.
    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    /// The returned count is read from the rendered body.
    #[test]
    fn reads_returned() {
        assert_eq!(
            returned(r#"{"requestId":"req_1","requested":5,"returned":3,"proxies":[]}"#),
            Some(3)
        );
        assert_eq!(returned("{}"), None);
    }
}
