//! Why the pool could not answer.

use redis::RedisError;

/// Why the pool could not answer. Messages carry Redis error kinds and codes,
/// never Redis error text or topology.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// Redis is unreachable, too slow, out of memory, busy or read-only: retry later (503).
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or a damaged pool (500).
    #[error("redis failure: {0}")]
    Internal(String),
}

impl From<RedisError> for PoolError {
    fn from(e: RedisError) -> Self {
        const TRANSIENT: [&str; 10] = [
            "OOM",
            "BUSY",
            "LOADING",
            "READONLY",
            "MASTERDOWN",
            "CLUSTERDOWN",
            "TRYAGAIN",
            "NOREPLICAS",
            "MISCONF",
            "MOVED",
        ];
        let code = e.code().unwrap_or("");
        let what = format!("{:?} {code}", e.kind());
        if e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || TRANSIENT.contains(&code)
        {
            Self::Unavailable(what)
        } else {
            Self::Internal(what)
        }
    }
}
