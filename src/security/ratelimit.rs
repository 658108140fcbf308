//! Global and per-client rate limits, held in Redis so every Lambda instance
//! shares them (GCRA, one round trip, `lua/ratelimit.lua`).

use lambda_http::http::{HeaderName, HeaderValue};

use super::Identity;
use crate::pool::{Limit, PoolError, RedisPool};

/// A limit: a sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained requests per second (> 0).
    pub per_second: f64,
    /// Requests admissible at once from a full bucket (>= 1).
    pub burst: u32,
}

/// A rate that is not `RATE[:BURST]` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// RATE is not a number of requests per second above 0.
    #[error("must be RATE[:BURST] with RATE requests per second (> 0), or `off`")]
    Rate,
    /// BURST is not a whole number in range.
    #[error("BURST must be a whole number from 1 to 1000000")]
    Burst,
}

impl Rate {
    /// Parses `RATE[:BURST]` (e.g. `10`, `0.5:3`, `100:200`); `off` is `None`.
    /// Burst defaults to the rate rounded up.
    pub fn parse(s: &str) -> Result<Option<Self>, RateError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let (rate, burst) = s.split_once(':').unwrap_or((s, ""));
        let per_second: f64 = rate
            .parse()
            .ok()
            .filter(|r: &f64| r.is_finite() && *r > 0.0 && *r <= 1_000_000.0)
            .ok_or(RateError::Rate)?;
        let burst = if burst.is_empty() {
            per_second.ceil() as u32
        } else {
            burst
                .parse()
                .ok()
                .filter(|b| (1..=1_000_000).contains(b))
                .ok_or(RateError::Burst)?
        };
        Ok(Some(Self { per_second, burst }))
    }

    fn interval_ms(self) -> f64 {
        1000.0 / self.per_second
    }

    /// Seconds a full bucket takes to refill (the policy window).
    fn window_secs(self) -> u64 {
        ((f64::from(self.burst) / self.per_second).ceil() as u64).max(1)
    }
}

/// One limit applied to a request: its policy name, key and rate.
struct Applied {
    name: &'static str,
    key: String,
    rate: Rate,
}

/// Admission control: the global limit and the caller's own.
#[derive(Clone)]
pub struct RateLimiter {
    pool: RedisPool,
    global: Option<Rate>,
    client_default: Option<Rate>,
}

/// `RateLimit-Policy` and `RateLimit` headers (IETF httpapi draft) to put
/// on the response of an admitted request.
pub type RateLimitHeaders = Vec<(HeaderName, HeaderValue)>;

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// Over a limit (429).
    #[error("rate limit exceeded, retry in {retry_after_secs} s")]
    Limited {
        /// When to retry (`Retry-After`), in whole seconds, at least 1.
        retry_after_secs: u64,
        /// The limits' state, as an admitted request would have had it.
        headers: RateLimitHeaders,
    },
    /// The limits could not be checked: they fail closed.
    #[error(transparent)]
    Pool(PoolError),
}

impl RateLimiter {
    /// Limits over `pool`; `None` disables a limit.
    pub fn new(pool: RedisPool, global: Option<Rate>, client_default: Option<Rate>) -> Self {
        Self {
            pool,
            global,
            client_default,
        }
    }

    /// Admits `identity`'s request, or refuses it: over a limit, or Redis
    /// unavailable (limits fail closed). Nothing is charged to any limit
    /// unless every limit admits the request.
    pub async fn admit(&self, identity: &Identity) -> Result<RateLimitHeaders, Refusal> {
        let mut applied = Vec::with_capacity(2);
        if let Some(rate) = self.global {
            applied.push(Applied {
                name: "global",
                key: self.pool.keys().rate_global().to_owned(),
                rate,
            });
        }
        if let Some(rate) = identity.rate.or(self.client_default) {
            applied.push(Applied {
                name: "client",
                key: self.pool.keys().rate_client(&identity.rate_key),
                rate,
            });
        }
        if applied.is_empty() {
            return Ok(Vec::new());
        }
        let limits: Vec<Limit> = applied
            .iter()
            .map(|a| Limit {
                key: &a.key,
                interval_ms: a.rate.interval_ms(),
                burst: a.rate.burst,
            })
            .collect();
        // Limits fail closed: no Redis, no admission.
        let verdict = self.pool.admit(&limits).await.map_err(Refusal::Pool)?;
        let policy = applied
            .iter()
            .map(|a| {
                format!(
                    "\"{}\";q={};w={}",
                    a.name,
                    a.rate.burst,
                    a.rate.window_secs()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let state = applied
            .iter()
            .zip(&verdict.limits)
            .map(|(a, limit)| {
                format!(
                    "\"{}\";r={};t={}",
                    a.name,
                    limit.remaining,
                    limit.reset_ms.div_ceil(1000)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let headers = vec![
            (
                HeaderName::from_static("ratelimit-policy"),
                HeaderValue::from_str(&policy).unwrap_or(HeaderValue::from_static("")),
            ),
            (
                HeaderName::from_static("ratelimit"),
                HeaderValue::from_str(&state).unwrap_or(HeaderValue::from_static("")),
            ),
        ];
        if verdict.admitted {
            Ok(headers)
        } else {
            Err(Refusal::Limited {
                retry_after_secs: verdict.retry_after_ms.div_ceil(1000).max(1),
                headers,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RATE[:BURST]` and `off` parse; nonsense does not.
    #[test]
    fn parses_rates() {
        assert_eq!(
            Rate::parse("10").unwrap(),
            Some(Rate {
                per_second: 10.0,
                burst: 10
            })
        );
        assert_eq!(
            Rate::parse("0.5:3").unwrap(),
            Some(Rate {
                per_second: 0.5,
                burst: 3
            })
        );
        assert_eq!(Rate::parse("OFF").unwrap(), None);
        for bad in ["", "0", "-1", "fast", "5:0", "5:x", "NaN"] {
            assert!(Rate::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Rate::parse("0.5:3").unwrap().unwrap().window_secs(), 6);
    }
}
