//! Why the pool could not answer.

use std::fmt;

use redis::{ErrorKind, RedisError};

use super::policy::PoolPolicy;

/// Why the pool could not answer. Messages carry Redis error kinds and codes,
/// never Redis error text, secrets or topology.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Redis cannot serve the call now: retry later (503).
    #[error("redis unavailable: {0}")]
    Unavailable(Outage),
    /// Anything else: a bug or a damaged pool (500).
    #[error("redis failure: {0}")]
    Internal(String),
}

impl PoolError {
    /// An outage of `class`, described by `detail` (no secret, no Redis text).
    pub fn unavailable(class: OutageClass, detail: impl Into<String>) -> Self {
        Self::Unavailable(Outage {
            class,
            detail: detail.into(),
        })
    }

    /// The outage's class, when this is one.
    pub fn outage_class(&self) -> Option<OutageClass> {
        match self {
            Self::Unavailable(outage) => Some(outage.class),
            Self::Internal(_) => None,
        }
    }
}

/// A Redis outage: its class and a short, secret-free description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outage {
    /// What kind of outage, for logs and alarms.
    pub class: OutageClass,
    /// Error kind and code, or what was found (e.g. a version).
    pub detail: String,
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}", self.class.as_str(), self.detail)
    }
}

/// Kinds of Redis outage, named in every log line about one, so that an
/// operator can tell a rotated password from a dead server or a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutageClass {
    /// Not reachable: refused, reset or dropped connection, unknown host.
    Connection,
    /// No answer within `PROXY_POOL_REDIS_TIMEOUT_MS`.
    Timeout,
    /// The password or user was refused (`NOAUTH`, `WRONGPASS`, failed `AUTH`).
    Authentication,
    /// The user may not run a command the pool needs (`NOPERM`).
    Permission,
    /// Redis is at a limit: `maxclients` reached, out of memory.
    Capacity,
    /// Redis is busy: a script over its time limit, a dataset loading.
    Busy,
    /// A failover or resharding is under way: read-only, master or cluster
    /// down, `TRYAGAIN`, `MOVED`, `ASK`.
    Failover,
    /// Fewer replicas acknowledged than required (`NOREPLICAS`, `WAIT`),
    /// or the `WAIT` behind the write got no answer.
    Replication,
    /// Redis refuses writes after a failed snapshot (`MISCONF`).
    Persistence,
    /// The server is older than the scripts need.
    Version,
    /// The pool records another policy than this deployment's (`POLICY`):
    /// a configuration to fix, not an outage to wait out.
    Policy,
    /// The pool records another layout version than this deployment reads
    /// (`LAYOUT`): a deployment or a migration to make.
    Layout,
    /// Redis runs an `allkeys-*` eviction policy, which may evict the pool.
    Eviction,
}

impl OutageClass {
    /// The class as logged (`class=authentication`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Timeout => "timeout",
            Self::Authentication => "authentication",
            Self::Permission => "permission",
            Self::Capacity => "capacity",
            Self::Busy => "busy",
            Self::Failover => "failover",
            Self::Replication => "replication",
            Self::Persistence => "persistence",
            Self::Version => "version",
            Self::Policy => "policy",
            Self::Layout => "layout",
            Self::Eviction => "eviction",
        }
    }
}

/// The outage class of a Redis error, `None` for errors that are not
/// outages (a script error, a wrong type: a bug or a damaged pool).
pub(crate) fn outage_class(e: &RedisError) -> Option<OutageClass> {
    if e.kind() == ErrorKind::AuthenticationFailed {
        return Some(OutageClass::Authentication);
    }
    if e.is_timeout() {
        return Some(OutageClass::Timeout);
    }
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        return Some(OutageClass::Connection);
    }
    let class = match e.code().unwrap_or("") {
        "NOAUTH" | "WRONGPASS" => OutageClass::Authentication,
        "NOPERM" => OutageClass::Permission,
        "OOM" => OutageClass::Capacity,
        "BUSY" | "LOADING" => OutageClass::Busy,
        "READONLY" | "MASTERDOWN" | "CLUSTERDOWN" | "TRYAGAIN" | "MOVED" | "ASK" => {
            OutageClass::Failover
        }
        "NOREPLICAS" => OutageClass::Replication,
        "MISCONF" => OutageClass::Persistence,
        "POLICY" => OutageClass::Policy,
        "LAYOUT" => OutageClass::Layout,
        "ERR"
            if e.detail()
                .is_some_and(|d| d.starts_with("max number of clients")) =>
        {
            OutageClass::Capacity
        }
        _ => return None,
    };
    Some(class)
}

/// `true` when the error proves the command was not executed (refused
/// before it ran), so repeating it can never apply it twice.
pub(crate) fn refused_before_running(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("MOVED" | "ASK" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "LOADING" | "READONLY")
    )
}

impl From<RedisError> for PoolError {
    fn from(e: RedisError) -> Self {
        if e.code() == Some("POLICY") {
            // The script names the pool's policy; only its parsed numbers
            // are kept.
            let recorded = e
                .detail()
                .and_then(|d| d.split_whitespace().next())
                .unwrap_or("");
            return Self::unavailable(OutageClass::Policy, PoolPolicy::describe_recorded(recorded));
        }
        if e.code() == Some("LAYOUT") {
            // The script names the pool's layout version: kept when it is
            // a plain token, nothing else of the error text.
            let recorded = e
                .detail()
                .and_then(|d| d.split_whitespace().next())
                .filter(|v| v.len() <= 16 && v.bytes().all(|b| b.is_ascii_alphanumeric()))
                .unwrap_or("unknown");
            return Self::unavailable(OutageClass::Layout, recorded.to_owned());
        }
        let what = match e.code() {
            Some(code) => format!("{:?} {code}", e.kind()),
            None => format!("{:?}", e.kind()),
        };
        match outage_class(&e) {
            Some(class) => Self::unavailable(class, what),
            None => Self::Internal(what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        redis::make_extension_error(code.into(), Some(detail.into()))
    }

    #[test]
    fn classes_of_server_errors() {
        let cases = [
            (
                "NOAUTH",
                "Authentication required.",
                OutageClass::Authentication,
            ),
            (
                "WRONGPASS",
                "invalid username-password pair",
                OutageClass::Authentication,
            ),
            (
                "NOPERM",
                "this user has no permissions",
                OutageClass::Permission,
            ),
            ("OOM", "command not allowed", OutageClass::Capacity),
            ("MISCONF", "snapshot", OutageClass::Persistence),
            (
                "NOREPLICAS",
                "not enough good replicas",
                OutageClass::Replication,
            ),
            (
                "ERR",
                "max number of clients reached",
                OutageClass::Capacity,
            ),
        ];
        for (code, detail, class) in cases {
            let e = PoolError::from(server(code, detail));
            assert_eq!(e.outage_class(), Some(class), "{code}");
            assert!(!e.to_string().contains(detail), "{e}");
        }
        let policy = PoolError::from(server(
            "POLICY",
            "120000|30000 script: 8a64de, on @user_script:1.",
        ));
        assert_eq!(policy.outage_class(), Some(OutageClass::Policy));
        assert!(
            policy
                .to_string()
                .ends_with("maxHealthCheckAge 120 s, minRemainingTTL 30 s"),
            "{policy}"
        );
        assert!(!policy.to_string().contains("script"), "{policy}");
        let wrong_type = PoolError::from(server("WRONGTYPE", "Operation against a key"));
        assert!(matches!(wrong_type, PoolError::Internal(_)));
    }
}
