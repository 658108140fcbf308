//! Lines of standard input a command skipped: the first few named by
//! number as they come (never by contents), every one counted by reason
//! for the command's summary line, so that a file of a million bad lines
//! reads as a few lines and a count, not a million lines.

use std::collections::BTreeMap;

/// Skipped lines named one by one; the rest are only counted.
const NAMED: usize = 20;
/// Reasons counted apart; lines skipped for any further one count as
/// "other" (a reason may name a field, so the map stays bounded).
const REASONS: usize = 32;

/// The skipped lines of one command, by reason.
#[derive(Debug, Default)]
pub struct Skipped {
    total: usize,
    by_reason: BTreeMap<String, usize>,
}

impl Skipped {
    /// Counts line `line` as skipped for `why` (which names no value of
    /// the line); names it on standard error while fewer than [`NAMED`]
    /// were. Its reason is `why` less a JSON error's ` (column N)`.
    pub fn skip(&mut self, line: usize, why: &str) {
        self.total += 1;
        if self.total <= NAMED {
            eprintln!("line {line}: skipped: {why}");
        } else if self.total == NAMED + 1 {
            eprintln!("(further skipped lines are only counted)");
        }
        let reason = match why.rfind(" (column ") {
            Some(at) if why.ends_with(')') => &why[..at],
            _ => why,
        };
        let known = self.by_reason.contains_key(reason) || self.by_reason.len() < REASONS;
        let reason = if known { reason } else { "other" };
        *self.by_reason.entry(reason.to_owned()).or_default() += 1;
    }

    /// The summary line's part: `N`, and when it is not 0
    /// ` (n <reason>; n <reason>...)`.
    pub fn summary(&self) -> String {
        if self.total == 0 {
            return "0".into();
        }
        let reasons: Vec<String> = self
            .by_reason
            .iter()
            .map(|(why, n)| format!("{n} {why}"))
            .collect();
        format!("{} ({})", self.total, reasons.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_every_line_by_reason_and_bounds_the_reasons() {
        let mut s = Skipped::default();
        assert_eq!(s.summary(), "0");
        for line in 1..=5 {
            s.skip(line, "not JSON");
        }
        s.skip(6, "`id` is required");
        s.skip(7, "not valid JSON (column 12)");
        assert_eq!(s.total, 7);
        assert_eq!(
            s.summary(),
            "7 (1 `id` is required; 5 not JSON; 1 not valid JSON)"
        );
        for i in 0..100 {
            s.skip(8 + i, &format!("unknown field `f{i}`"));
        }
        assert_eq!(s.total, 107);
        assert_eq!(s.by_reason.len(), REASONS + 1, "{:?}", s.by_reason.keys());
        assert_eq!(s.by_reason["other"], 100 - (REASONS - 3));
    }
}
