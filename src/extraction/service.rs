use lambda_http::http::HeaderMap;

use super::{ExtractRequest, RequestError};
use crate::config::Config;
use crate::httpapi::InvalidParam;
use crate::pool::{
    ExtractionOutcome, ExtractionQuery, Extractor, Fulfillment, IdempotencyScope, PoolError,
    RedisPool, UsageScope, keys,
};
use crate::security::Identity;

/// A validated `Idempotency-Key`: 8 to 128 visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The request header.
    pub const HEADER: &'static str = "idempotency-key";

    /// Reads the optional header; a present but invalid key is refused.
    pub fn from_headers(headers: &HeaderMap) -> Result<Option<Self>, RequestError> {
        let mut values = headers.get_all(Self::HEADER).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        let bytes = value.as_bytes();
        if values.next().is_some()
            || !(8..=128).contains(&bytes.len())
            || !bytes.iter().all(|b| (0x21..=0x7e).contains(b))
        {
            return Err(RequestError::IdempotencyKey(InvalidParam::new(
                "Idempotency-Key",
                "must be one header of 8 to 128 visible ASCII characters",
            )));
        }
        Ok(Some(Self(String::from_utf8_lossy(bytes).into_owned())))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The server-side rules every extraction runs under (the time rules,
/// shared by every deployment on one pool, are the pool's: `PoolPolicy`).
#[derive(Debug, Clone)]
pub struct Policy {
    /// `maxCountPerRequest`.
    pub max_count_per_request: u32,
    /// Used when the request names no fulfillment.
    pub default_fulfillment: Fulfillment,
    /// Eligible proxies (per request's filters) always left for the Gateway.
    pub reserve_for_gateway: u32,
    /// How long an `Idempotency-Key` can replay its extraction.
    pub idempotency_ttl: std::time::Duration,
    /// Count each extraction's outcome in the hourly usage counters, kept
    /// this long after their hour in Redis; `None`: not counted.
    pub usage_retention: Option<std::time::Duration>,
}

impl Config {
    /// The rules every extraction runs under.
    pub fn policy(&self) -> Policy {
        Policy {
            max_count_per_request: self.max_count_per_request,
            default_fulfillment: self.default_fulfillment,
            reserve_for_gateway: self.reserve_for_gateway,
            idempotency_ttl: self.idempotency_ttl,
            usage_retention: self
                .aggregates_enabled()
                .then_some(self.aggregates_retention),
        }
    }
}

/// The usage label of every anonymous caller (`ip:<address>` clients): one,
/// so the counters stay bounded whatever the callers' addresses, and no
/// address is kept for long-term analysis.
pub const ANONYMOUS_USAGE_CLIENT: &str = "anonymous";

/// The label `identity`'s extractions are counted under.
fn usage_client(identity: &Identity) -> &str {
    if identity.client_id.starts_with("ip:") {
        ANONYMOUS_USAGE_CLIENT
    } else {
        &identity.client_id
    }
}

/// Applies identity and policy to a request, then runs the atomic extraction.
#[derive(Clone)]
pub struct ExtractionService {
    policy: Policy,
    extractor: Extractor,
}

impl ExtractionService {
    /// A service drawing from `pool` under `policy`.
    pub fn new(policy: Policy, pool: RedisPool) -> Self {
        Self {
            policy,
            extractor: Extractor::new(&pool),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Largest `count` this client may ask for.
    pub fn max_count(&self, identity: &Identity) -> u32 {
        identity
            .max_count
            .map_or(self.policy.max_count_per_request, |m| {
                m.min(self.policy.max_count_per_request)
            })
    }

    /// Extracts for `identity`: refused when the request's
    /// `allowedUpstreams` would widen what the client may use.
    pub async fn extract(
        &self,
        identity: &Identity,
        request: &ExtractRequest,
        key: Option<&IdempotencyKey>,
        request_id: &str,
    ) -> Result<ExtractionOutcome, ServiceError> {
        // `allowedUpstreams` narrows the client's permission, never widens it.
        let permitted = identity.allowed_upstreams.as_ref();
        let requested = &request.filters.allowed_upstreams;
        if permitted.is_some_and(|p| requested.iter().any(|u| !p.contains(u))) {
            return Err(ServiceError::UpstreamForbidden);
        }
        let fulfillment = request
            .fulfillment
            .unwrap_or(self.policy.default_fulfillment);
        let query = ExtractionQuery {
            count: request.count,
            fulfillment,
            reserve: self.policy.reserve_for_gateway,
            filters: &request.filters,
            permitted_upstreams: permitted,
            request_id,
            idempotency: match key {
                Some(k) => Some(IdempotencyScope {
                    key: keys::idempotency(&identity.client_id, k.as_str()),
                    digest: request.digest(fulfillment).map_err(ServiceError::Digest)?,
                    ttl: self.policy.idempotency_ttl,
                }),
                None => None,
            },
            usage: self.policy.usage_retention.and_then(|retention| {
                UsageScope::new(usage_client(identity), retention, crate::clock::now_ms())
            }),
        };
        Ok(self.extractor.extract(&query).await?)
    }
}

/// Why an extraction did not reach a verdict. `Display` of a refusal is
/// the problem's `detail`.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// `allowedUpstreams` names an upstream the client may not use (403):
    /// it may only narrow the client's permission.
    #[error("allowedUpstreams names an upstream this client may not use")]
    UpstreamForbidden,
    /// The request's digest could not be serialised (never expected: 500).
    #[error("the request digest could not be computed")]
    Digest(#[source] serde_json::Error),
    /// The pool failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
}
