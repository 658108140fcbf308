//! Rate limits in Redis (`lua/ratelimit.lua`, GCRA): many limits checked
//! and charged in one atomic call.

use super::error::PoolError;
use super::redis_pool::RedisPool;
use super::scripts;

/// One rate limit for [`RateLimits::admit`] (GCRA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit<'a> {
    /// The Redis key holding its state, e.g. [`PoolKeys::rate_global`].
    pub key: &'a str,
    /// Milliseconds per request at the sustained rate (may be fractional).
    pub interval_ms: f64,
    /// Requests admissible at once from a full bucket.
    pub burst: u32,
}

/// Where one limit stands after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Requests still admissible right now.
    pub remaining: u64,
    /// Milliseconds until the bucket is full again.
    pub reset_ms: u64,
}

/// The rate limiter's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Every limit admitted the request (and was charged).
    pub admitted: bool,
    /// When refused: how long until it would be admitted.
    pub retry_after_ms: u64,
    /// Per limit, in the order given.
    pub limits: Vec<LimitState>,
}

/// Admission against rate limits held in the pool's Redis. Cheap to clone;
/// clones share the connection.
#[derive(Clone)]
pub struct RateLimits {
    pool: RedisPool,
}

impl RateLimits {
    /// Rate limits kept in `pool`'s Redis.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// The names of the pool's keys (where each limit's state lives).
    pub fn keys(&self) -> &super::keys::PoolKeys {
        self.pool.keys()
    }

    /// Runs `lua/ratelimit.lua` over `limits`: admitted only if every limit
    /// admits, and only then charged.
    pub async fn admit(&self, limits: &[Limit<'_>]) -> Result<Admission, PoolError> {
        let mut inv = scripts::RATELIMIT.prepare_invoke();
        for limit in limits {
            inv.key(limit.key)
                .arg(limit.interval_ms.to_string())
                .arg(limit.burst);
        }
        // A repeat after a lost reply charges the limit twice at worst.
        let reply: Vec<i64> = self.pool.invoke(&inv, true).await?;
        let [admitted, retry_after, rest @ ..] = reply.as_slice() else {
            return Err(PoolError::Internal("unexpected ratelimit reply".into()));
        };
        if rest.len() != 2 * limits.len() {
            return Err(PoolError::Internal("unexpected ratelimit reply".into()));
        }
        Ok(Admission {
            admitted: *admitted == 1,
            retry_after_ms: (*retry_after).max(0) as u64,
            limits: rest
                .chunks(2)
                .map(|p| LimitState {
                    remaining: p[0].max(0) as u64,
                    reset_ms: p[1].max(0) as u64,
                })
                .collect(),
        })
    }
}
