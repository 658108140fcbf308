//! Wall-clock time as the service shows it: Unix milliseconds and RFC 3339.
//! (Every rule about a proxy's life is decided at the Redis server's clock,
//! inside the scripts; this is for defaults, rendering and parsing.)

use std::time::{SystemTime, UNIX_EPOCH};

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Milliseconds since the Unix epoch by this machine's clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// RFC 3339 UTC at whole seconds (floor), e.g. `2026-07-28T10:30:00Z`.
pub fn rfc3339(unix_ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix_ms.div_euclid(1000))
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// A timestamp that is not RFC 3339, or out of the 13-digit range of
/// milliseconds the pool's index sorts by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// Not an RFC 3339 timestamp.
    #[error("not an RFC 3339 timestamp")]
    Format,
    /// Before 1970 or after 2286.
    #[error("out of range")]
    Range,
}

/// Parses an RFC 3339 timestamp into Unix milliseconds (0 to 13 digits).
pub fn parse_rfc3339(s: &str) -> Result<i64, TimeError> {
    let t = OffsetDateTime::parse(s, &Rfc3339).map_err(|_| TimeError::Format)?;
    let ms = t.unix_timestamp_nanos() / 1_000_000;
    if !(0..10_000_000_000_000).contains(&ms) {
        return Err(TimeError::Range);
    }
    Ok(ms as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rendering floors to the second; parsing keeps milliseconds.
    #[test]
    fn round_trips() {
        assert_eq!(rfc3339(1_785_234_600_999), "2026-07-28T10:30:00Z");
        assert_eq!(
            parse_rfc3339("2026-07-28T10:30:00.5Z"),
            Ok(1_785_234_600_500)
        );
        assert_eq!(parse_rfc3339("tomorrow"), Err(TimeError::Format));
        assert_eq!(parse_rfc3339("1960-01-01T00:00:00Z"), Err(TimeError::Range));
        assert!(now_ms() > 1_700_000_000_000);
    }
}
