//! `/health/ready`, honestly: beyond "Redis answers", what this instance
//! serves with. Each check gives [`Finding`]s: an unavailable one makes
//! readiness a 503 problem, a degraded one a 200 with status `degraded`.
//! Either way the reasons, machine-readable tokens ([`Reason::as_str`]), are
//! listed in the [`REASONS_HEADER`] header: the contract's `Health` body
//! admits no other field. A new check is one more function returning
//! findings, called from [`findings`].

use std::time::Duration;

use lambda_http::http::HeaderValue;

use super::app::App;
use crate::pool::{PoolError, UsageBacklog, UsageStore};
use crate::security::RegistryState;

/// The response header listing why readiness is not plainly `ok`
/// (comma-separated [`Reason`] tokens).
pub const REASONS_HEADER: &str = "readiness-reasons";

/// How long past its refresh period a client registry copy may serve
/// before it counts as stale: the time one reload may take.
pub const REFRESH_ALLOWANCE: Duration = Duration::from_secs(30);

/// How long after its hour ends a closed hour of usage counters may wait in
/// Redis for the flush before it counts as unflushed (the scheduled check
/// flushes every minute by default; the pool closes an hour two minutes
/// after its end).
pub const FLUSH_ALLOWANCE: Duration = Duration::from_secs(15 * 60);

/// What a finding does to readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// Still serving, not as configured: 200 `degraded`.
    Degraded,
    /// Not serving: 503.
    Unavailable,
}

/// Why readiness is not plainly `ok`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Shutting down: finishing open requests, taking no new ones.
    Draining,
    /// Redis cannot be used (or the extraction script not loaded).
    RedisUnavailable,
    /// The pool records another policy than this deployment's.
    PoolPolicyMismatch,
    /// The pool records another layout version than this deployment reads.
    PoolLayoutMismatch,
    /// Redis runs an `allkeys-*` eviction policy, which may evict the pool.
    EvictionPolicy,
    /// The client registry was never loaded: authenticated callers get 503.
    ClientRegistryMissing,
    /// The client registry copy in use is older than its refresh period.
    ClientRegistryStale,
    /// Closed hours of usage counters wait in Redis: a flush failed or has
    /// not run.
    UsageUnflushed,
}

impl Reason {
    /// The token in [`REASONS_HEADER`].
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Draining => "draining",
            Self::RedisUnavailable => "redis-unavailable",
            Self::PoolPolicyMismatch => "pool-policy-mismatch",
            Self::PoolLayoutMismatch => "pool-layout-mismatch",
            Self::EvictionPolicy => "eviction-policy",
            Self::ClientRegistryMissing => "client-registry-missing",
            Self::ClientRegistryStale => "client-registry-stale",
            Self::UsageUnflushed => "usage-unflushed",
        }
    }
}

/// One thing readiness reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Why.
    pub reason: Reason,
    /// What it does to readiness.
    pub severity: Severity,
    /// For the 503 problem's `detail` (no secrets, no topology).
    pub detail: String,
}

/// Every check: draining, Redis, the client registry, the usage flush. A
/// Redis failure is the error (the caller maps it to a 503 as extraction's
/// are); draining ends the checks.
pub(super) async fn findings(app: &App) -> Result<Vec<Finding>, PoolError> {
    if app.is_draining() {
        return Ok(vec![Finding {
            reason: Reason::Draining,
            severity: Severity::Unavailable,
            detail: "the service is draining".into(),
        }]);
    }
    app.pool.ping().await?;
    let mut found: Vec<Finding> = registry(app.identity.registry_state())
        .into_iter()
        .collect();
    if let Some(retention) = app.usage_retention {
        found.extend(usage(&UsageStore::new(&app.pool).backlog(retention).await?));
    }
    Ok(found)
}

/// The header value listing `reasons`.
pub(super) fn header_value(reasons: &[Reason]) -> Option<HeaderValue> {
    let tokens: Vec<&str> = reasons.iter().map(|r| r.as_str()).collect();
    HeaderValue::from_str(&tokens.join(", ")).ok()
}

/// A registry never loaded, or older than its refresh period allows.
fn registry(state: RegistryState) -> Option<Finding> {
    match state {
        RegistryState::Current => None,
        RegistryState::Missing { anonymous_served } => Some(Finding {
            reason: Reason::ClientRegistryMissing,
            severity: if anonymous_served {
                Severity::Degraded
            } else {
                Severity::Unavailable
            },
            detail: "the client registry is not loaded yet".into(),
        }),
        RegistryState::Loaded { age, refresh } if age > refresh + REFRESH_ALLOWANCE => {
            Some(Finding {
                reason: Reason::ClientRegistryStale,
                severity: Severity::Degraded,
                detail: "the client registry copy is older than its refresh period".into(),
            })
        }
        RegistryState::Loaded { .. } => None,
    }
}

/// Closed hours a flush could not move, or that waited past
/// [`FLUSH_ALLOWANCE`] (by the Redis clock).
fn usage(backlog: &UsageBacklog) -> Option<Finding> {
    let waited_too_long =
        |hour: &i64| (hour + 3600 + FLUSH_ALLOWANCE.as_secs() as i64) * 1000 <= backlog.now_ms;
    backlog
        .closed
        .iter()
        .any(|hour| backlog.unflushed.contains_key(hour) || waited_too_long(hour))
        .then(|| Finding {
            reason: Reason::UsageUnflushed,
            severity: Severity::Degraded,
            detail: "closed hours of usage counters wait in Redis for a flush".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A copy is stale only past its refresh period plus one reload's time;
    /// a missing one stops authenticated callers, anonymous ones aside.
    #[test]
    fn judges_the_registry() {
        let refresh = Duration::from_secs(300);
        let fresh = RegistryState::Loaded {
            age: refresh + REFRESH_ALLOWANCE,
            refresh,
        };
        assert_eq!(registry(fresh), None);
        let stale = RegistryState::Loaded {
            age: refresh + REFRESH_ALLOWANCE + Duration::from_millis(1),
            refresh,
        };
        assert_eq!(
            registry(stale).map(|f| (f.reason, f.severity)),
            Some((Reason::ClientRegistryStale, Severity::Degraded))
        );
        let missing = |anonymous_served| {
            registry(RegistryState::Missing { anonymous_served }).map(|f| f.severity)
        };
        assert_eq!(missing(false), Some(Severity::Unavailable));
        assert_eq!(missing(true), Some(Severity::Degraded));
        assert_eq!(registry(RegistryState::Current), None);
    }

    /// An hour just closed may wait for the next flush; one a flush failed
    /// on, or one waiting past the allowance, is unflushed.
    #[test]
    fn judges_the_usage_backlog() {
        let hour = 1_700_002_800; // an hour's start, Unix s
        let due = (hour + 3600 + FLUSH_ALLOWANCE.as_secs() as i64) * 1000;
        let backlog = |now_ms, failed: bool| UsageBacklog {
            now_ms,
            closed: vec![hour],
            open: 1,
            unflushed: if failed {
                [(hour, (3, 5))].into_iter().collect()
            } else {
                Default::default()
            },
        };
        assert_eq!(usage(&backlog(due - 1, false)), None);
        assert_eq!(
            usage(&backlog(due, false)).map(|f| f.reason),
            Some(Reason::UsageUnflushed)
        );
        assert!(usage(&backlog(due - 600_000, true)).is_some());
        assert_eq!(usage(&UsageBacklog::default()), None);
    }

    /// The header lists every reason, in order.
    #[test]
    fn lists_reasons() {
        let v = header_value(&[Reason::ClientRegistryStale, Reason::UsageUnflushed]).unwrap();
        assert_eq!(v, "client-registry-stale, usage-unflushed");
    }
}
