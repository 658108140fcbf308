//! The pool policy: the two rules every deployment on one pool must share,
//! because the index orders and counts entries by them (`lua/prelude/record.lua`).

use std::fmt;
use std::time::Duration;

/// `maxHealthCheckAge` and `minRemainingTTL` of one pool. The first write
/// records it in the pool's `meta` field (docs/data-model.md); a caller
/// configured otherwise is refused (`OutageClass::Policy`) with both
/// values, never answered from an index ordered for another policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPolicy {
    /// Oldest acceptable successful health check.
    pub max_health_check_age: Duration,
    /// Least life a proxy handed out must have left.
    pub min_remaining_ttl: Duration,
}

impl Default for PoolPolicy {
    /// The configuration's defaults: 120 s and 30 s.
    fn default() -> Self {
        Self {
            max_health_check_age: Duration::from_secs(120),
            min_remaining_ttl: Duration::from_secs(30),
        }
    }
}

impl PoolPolicy {
    /// The scripts' form: `"<maxHealthCheckAge ms>|<minRemainingTTL ms>"`.
    pub fn script_arg(&self) -> String {
        format!(
            "{}|{}",
            self.max_health_check_age.as_millis(),
            self.min_remaining_ttl.as_millis()
        )
    }

    /// Parses the scripts' form (as recorded in the pool's `meta` field).
    pub fn parse_script_arg(s: &str) -> Option<Self> {
        let (age, ttl) = s.split_once('|')?;
        Some(Self {
            max_health_check_age: Duration::from_millis(age.parse().ok()?),
            min_remaining_ttl: Duration::from_millis(ttl.parse().ok()?),
        })
    }

    /// How a policy recorded in the pool (its scripts' form, from a
    /// script's `POLICY` refusal or the `meta` field) is named in a
    /// refusal: only its parsed numbers, never other text.
    pub(super) fn describe_recorded(recorded: &str) -> String {
        Self::parse_script_arg(recorded).map_or_else(|| "another one".into(), |p| p.to_string())
    }
}

impl fmt::Display for PoolPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "maxHealthCheckAge {}, minRemainingTTL {}",
            seconds(self.max_health_check_age),
            seconds(self.min_remaining_ttl)
        )
    }
}

/// `90 s`, or `1.5 s` when not whole.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_form_round_trips() {
        let p = PoolPolicy {
            max_health_check_age: Duration::from_millis(1500),
            min_remaining_ttl: Duration::from_secs(30),
        };
        assert_eq!(p.script_arg(), "1500|30000");
        assert_eq!(PoolPolicy::parse_script_arg("1500|30000"), Some(p));
        assert_eq!(PoolPolicy::parse_script_arg("1500"), None);
        assert_eq!(PoolPolicy::parse_script_arg("x|1"), None);
        assert_eq!(
            p.to_string(),
            "maxHealthCheckAge 1.5 s, minRemainingTTL 30 s"
        );
    }
}
