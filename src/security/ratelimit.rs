//! Global and per-client rate limits, held in Redis so every Lambda instance
//! shares them (GCRA, one round trip, `lua/ratelimit.lua`).

use lambda_http::http::{HeaderName, HeaderValue};

use super::identity::Identity;
// A setting (`PROXY_POOL_GLOBAL_RATE`, `PROXY_POOL_CLIENT_RATE`) and a
// registry field (`rateLimit`), so its type lives with the settings; what
// the limiter computes from it is here.
pub use crate::config::{Rate, RateError};
use crate::pool::{Limit, PoolError, RateLimits, RedisPool};

impl Rate {
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
    limits: RateLimits,
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
            limits: RateLimits::new(&pool),
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
                key: self.limits.keys().rate_global().to_owned(),
                rate,
            });
        }
        if let Some(rate) = identity.rate.or(self.client_default) {
            applied.push(Applied {
                name: "client",
                key: self.limits.keys().rate_client(&identity.rate_key),
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
        let verdict = self.limits.admit(&limits).await.map_err(Refusal::Pool)?;
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
