//! Why the bench could not run.

use proxy_pool::local::LocalError;
use proxy_pool::pool::PoolError;

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The private Redis did not start.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// The pool failed (kind and code only).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A raw Redis command failed (kind and code only).
    #[error("redis: {0}")]
    Redis(String),
    /// The run cannot go on (e.g. the fill was refused).
    #[error("{0}")]
    Failed(String),
}

impl From<redis::RedisError> for BenchError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(format!("{:?} {}", e.kind(), e.code().unwrap_or("")))
    }
}
