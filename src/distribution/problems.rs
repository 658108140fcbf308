//! The one place a failure becomes a problem. The layers below answer with
//! error values: the request's ([`RequestError`]), the service's
//! ([`ServiceError`]), the caller's resolution ([`Unresolved`]), the rate
//! limits' ([`Refusal`]) and the pool's ([`PoolError`]); the adapter has its
//! own ([`HandlerError`], [`RefusedHead`]). Each maps here to its RFC 9457
//! problem: the code (which fixes status and title), the `detail` (a
//! refusal's `Display`; a 5xx says nothing of its cause, which is logged
//! here), and the headers the answer needs.

use lambda_http::http::{HeaderName, HeaderValue};

use super::head::{MAX_HEAD_BYTES, MAX_HEADER_BYTES, MAX_HEADER_FIELDS, RefusedHead};
use super::readiness;
use crate::extraction::{RequestError, ServiceError};
use crate::httpapi::{Code, InvalidParam, Problem};
use crate::pool::{OutageClass, PoolError};
use crate::security::{Refusal, Unresolved};

/// Why the adapter itself did not answer 200. `Display` is the problem's
/// `detail`, except for a 500 (whose detail says nothing of the cause)
/// and [`HandlerError::PoolNotReady`] (the pool error's problem).
#[derive(Debug, thiserror::Error)]
pub(super) enum HandlerError {
    /// The request headers are larger than [`MAX_HEADER_BYTES`] (400).
    #[error("request headers exceed {MAX_HEADER_BYTES} bytes")]
    HeadersTooLarge,
    /// `X-Request-ID` is not one header of at most 128 printable ASCII
    /// characters (400).
    #[error("invalid X-Request-ID header")]
    RequestId,
    /// No such endpoint (404).
    #[error("no such endpoint")]
    NotFound,
    /// The endpoint exists, but only for method `allow` (405).
    #[error("this endpoint accepts {allow}")]
    MethodNotAllowed {
        /// The method it accepts, for the `Allow` header.
        allow: &'static str,
    },
    /// The service is shutting down (503).
    #[error("the service is draining")]
    Draining,
    /// The body is larger than `limit` bytes (413).
    #[error("the request body must not exceed {limit} bytes")]
    PayloadTooLarge {
        /// The configured limit.
        limit: usize,
    },
    /// The body is not `application/json` (415).
    #[error("the request body must be application/json")]
    UnsupportedMediaType,
    /// Committed on the primary, not confirmed by enough replicas (503).
    #[error(
        "the extraction was not confirmed by the pool's replicas in time; retry with the same Idempotency-Key"
    )]
    NotReplicated,
    /// The `Idempotency-Key` was used with another request (409).
    #[error("this Idempotency-Key was already used with a different request")]
    KeyReused,
    /// `allOrNothing` could not be met (409).
    #[error("requested {requested} proxies but only {available} are currently eligible")]
    Insufficient {
        /// The request's `count`.
        requested: u32,
        /// What was eligible.
        available: u64,
    },
    /// `allOrNothing` could not be met from what the extraction reached
    /// past a backlog of spent entries (a stalled health checker); the
    /// index is being cleared, so a retry soon may succeed (409).
    #[error(
        "requested {requested} proxies but only {reached} could be reached past a backlog of expired or stale entries now being cleared; retry shortly"
    )]
    InsufficientBehindBacklog {
        /// The request's `count`.
        requested: u32,
        /// What could be reached.
        reached: u64,
    },
    /// The extraction's body could not be serialised (never expected: 500).
    #[error("the response could not be serialised")]
    Render(#[source] serde_json::Error),
    /// A readiness finding makes the service unavailable (503).
    #[error("{detail}")]
    NotReady {
        /// The finding's description (no secrets, no topology).
        detail: String,
        /// The [`readiness::REASONS_HEADER`] value.
        reasons: Option<HeaderValue>,
    },
    /// Readiness could not ask the pool (503 or 500, as the pool error).
    #[error("not ready: {error}")]
    PoolNotReady {
        /// Why.
        error: PoolError,
        /// The [`readiness::REASONS_HEADER`] value.
        reasons: Option<HeaderValue>,
    },
}

impl From<HandlerError> for Problem {
    fn from(e: HandlerError) -> Self {
        let detail = e.to_string();
        match e {
            HandlerError::HeadersTooLarge => Problem::new(Code::BadRequest, detail),
            HandlerError::RequestId => {
                Problem::new(Code::BadRequest, detail).with_params(vec![InvalidParam::new(
                    "X-Request-ID",
                    "must be one header of at most 128 printable ASCII characters",
                )])
            }
            HandlerError::NotFound => Problem::new(Code::NotFound, detail),
            HandlerError::MethodNotAllowed { allow } => {
                Problem::new(Code::MethodNotAllowed, detail).with_header(
                    HeaderName::from_static("allow"),
                    HeaderValue::from_static(allow),
                )
            }
            HandlerError::Draining | HandlerError::NotReplicated => {
                Problem::new(Code::ServiceUnavailable, detail)
            }
            HandlerError::PayloadTooLarge { .. } => Problem::new(Code::PayloadTooLarge, detail),
            HandlerError::UnsupportedMediaType => Problem::new(Code::UnsupportedMediaType, detail),
            HandlerError::KeyReused => Problem::new(Code::IdempotencyKeyReused, detail),
            HandlerError::Insufficient { .. } | HandlerError::InsufficientBehindBacklog { .. } => {
                Problem::new(Code::InsufficientProxies, detail)
            }
            HandlerError::NotReady { reasons, .. } => {
                with_reasons(Problem::new(Code::ServiceUnavailable, detail), reasons)
            }
            HandlerError::PoolNotReady { error, reasons } => with_reasons(error.into(), reasons),
            HandlerError::Render(cause) => {
                tracing::error!(error = %cause, "a response could not be serialised");
                Problem::internal()
            }
        }
    }
}

/// A readiness problem with its reasons header, when there is one.
fn with_reasons(problem: Problem, reasons: Option<HeaderValue>) -> Problem {
    match reasons {
        Some(value) => {
            problem.with_header(HeaderName::from_static(readiness::REASONS_HEADER), value)
        }
        None => problem,
    }
}

impl From<RefusedHead> for Problem {
    fn from(head: RefusedHead) -> Self {
        match head {
            RefusedHead::TooLarge => Problem::new(
                Code::HeadersTooLarge,
                format!(
                    "a request head may hold at most {MAX_HEADER_FIELDS} header fields and {MAX_HEAD_BYTES} bytes"
                ),
            ),
            RefusedHead::Malformed => Problem::new(
                Code::BadRequest,
                "the request line or a header line is malformed",
            ),
        }
    }
}

impl From<RequestError> for Problem {
    fn from(e: RequestError) -> Self {
        let detail = e.to_string();
        match e {
            RequestError::NotJson { .. } | RequestError::NotAnObject => {
                Problem::new(Code::BadRequest, detail)
            }
            RequestError::Schema(params) => {
                Problem::new(Code::BadRequest, detail).with_params(params)
            }
            RequestError::IdempotencyKey(param) => {
                Problem::new(Code::BadRequest, detail).with_params(vec![param])
            }
            RequestError::Rules(params) => {
                Problem::new(Code::ValidationFailed, detail).with_params(params)
            }
        }
    }
}

impl From<ServiceError> for Problem {
    fn from(e: ServiceError) -> Self {
        match e {
            ServiceError::UpstreamForbidden => Problem::new(Code::UpstreamForbidden, e.to_string()),
            ServiceError::Digest(cause) => {
                tracing::error!(error = %cause, "a response could not be serialised");
                Problem::internal()
            }
            ServiceError::Pool(e) => e.into(),
        }
    }
}

impl From<Unresolved> for Problem {
    fn from(e: Unresolved) -> Self {
        let detail = e.to_string();
        match e {
            Unresolved::SourceUnknown(_) => Problem::new(Code::SourceUnknown, detail),
            Unresolved::SourceForbidden => Problem::new(Code::SourceForbidden, detail),
            Unresolved::Unauthenticated { challenges, .. } => challenges.into_iter().fold(
                Problem::new(Code::Unauthorized, detail),
                |problem, challenge| {
                    problem.with_header(
                        HeaderName::from_static("www-authenticate"),
                        HeaderValue::from_static(challenge),
                    )
                },
            ),
            Unresolved::RegistryMissing => Problem::new(Code::ServiceUnavailable, detail),
            Unresolved::RegistryEntry(cause) => {
                tracing::error!(error = %cause, "client registry entry unusable");
                Problem::internal()
            }
            Unresolved::Pool(e) => e.into(),
        }
    }
}

impl From<Refusal> for Problem {
    fn from(e: Refusal) -> Self {
        let detail = e.to_string();
        match e {
            Refusal::Limited {
                retry_after_secs,
                headers,
            } => headers.into_iter().fold(
                Problem::new(Code::RateLimited, detail).with_header(
                    HeaderName::from_static("retry-after"),
                    HeaderValue::from(retry_after_secs),
                ),
                |problem, (name, value)| problem.with_header(name, value),
            ),
            Refusal::Pool(e) => e.into(),
        }
    }
}

/// A pool failure: a 503 (retry later; the policy and layout mismatches
/// have codes of their own) or a cause-free 500. The cause (Redis error
/// kinds and codes, never their text) is logged here.
impl From<PoolError> for Problem {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Unavailable(outage) if outage.class == OutageClass::Policy => {
                tracing::error!(class = outage.class.as_str(), error = %outage, "pool policy mismatch");
                Problem::new(
                    Code::PoolPolicyMismatch,
                    "the pool records another policy than this deployment's",
                )
            }
            PoolError::Unavailable(outage) if outage.class == OutageClass::Layout => {
                tracing::error!(class = outage.class.as_str(), error = %outage, "pool layout mismatch");
                Problem::new(Code::PoolLayoutMismatch, outage.detail)
            }
            PoolError::Unavailable(outage) => {
                tracing::warn!(class = outage.class.as_str(), error = %outage, "pool unavailable");
                Problem::new(
                    Code::ServiceUnavailable,
                    "the proxy pool is unavailable, retry later",
                )
            }
            PoolError::Internal(_) => {
                tracing::error!(error = %e, "pool failure");
                Problem::internal()
            }
        }
    }
}
