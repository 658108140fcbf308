use lambda_http::Body;
use lambda_http::http::{HeaderName, HeaderValue, Response, StatusCode};
use serde::Serialize;

use super::{RequestId, respond};

/// Base of every problem `type` URI.
const TYPE_BASE: &str = "https://proxy-pool.local/problems/";

/// One field at fault in a request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidParam {
    /// JSON path or header name, e.g. `filters.protocols[1]`.
    pub name: String,
    /// Why it was refused (never echoes the value).
    pub reason: String,
}

impl InvalidParam {
    /// A field and the reason it was refused.
    pub fn new(name: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            reason: reason.into(),
        }
    }
}

/// An RFC 9457 problem: every non-2xx answer of the API is one of these.
#[derive(Debug, Clone)]
pub struct Problem {
    status: StatusCode,
    code: &'static str,
    title: &'static str,
    detail: String,
    invalid_params: Vec<InvalidParam>,
    headers: Vec<(HeaderName, HeaderValue)>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body_<'a> {
    #[serde(rename = "type")]
    type_: String,
    title: &'a str,
    status: u16,
    code: &'a str,
    detail: &'a str,
    request_id: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    invalid_params: &'a [InvalidParam],
}

impl Problem {
    fn new(status: StatusCode, code: &'static str, title: &'static str, detail: String) -> Self {
        Self {
            status,
            code,
            title,
            detail,
            invalid_params: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// 400: malformed JSON, wrong types, unknown fields or bad headers.
    pub fn bad_request(detail: impl Into<String>, params: Vec<InvalidParam>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "BAD_REQUEST",
            "Bad request",
            detail.into(),
        )
        .with_params(params)
    }

    /// 401: authentication failed; `challenges` become `WWW-Authenticate` headers.
    pub fn unauthorized(detail: &'static str, challenges: &[&'static str]) -> Self {
        let mut p = Self::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHORIZED",
            "Unauthorized",
            detail.into(),
        );
        for c in challenges {
            p.headers.push((
                HeaderName::from_static("www-authenticate"),
                HeaderValue::from_static(c),
            ));
        }
        p
    }

    /// 429: a rate limit refused the request; `Retry-After` in whole seconds.
    pub fn too_many_requests(
        retry_after_secs: u64,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> Self {
        let mut p = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "RATE_LIMITED",
            "Too many requests",
            format!("rate limit exceeded, retry in {retry_after_secs} s"),
        );
        p.headers.push((
            HeaderName::from_static("retry-after"),
            HeaderValue::from(retry_after_secs),
        ));
        p.headers.extend(headers);
        p
    }

    /// 403: the source or the client may not do this.
    pub fn forbidden(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, "Forbidden", detail.into())
    }

    /// 404: no such endpoint.
    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            "Not found",
            "no such endpoint".into(),
        )
    }

    /// 405: the endpoint exists but not for this method.
    pub fn method_not_allowed(allow: &'static str) -> Self {
        let mut p = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "METHOD_NOT_ALLOWED",
            "Method not allowed",
            format!("this endpoint accepts {allow}"),
        );
        p.headers.push((
            HeaderName::from_static("allow"),
            HeaderValue::from_static(allow),
        ));
        p
    }

    /// 409: `allOrNothing` could not be met.
    pub fn insufficient_proxies(requested: u32, available: u64) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "INSUFFICIENT_PROXIES",
            "Insufficient proxies",
            format!("requested {requested} proxies but only {available} are currently eligible"),
        )
    }

    /// 409: `allOrNothing` could not be met from what the extraction could
    /// reach past a backlog of spent entries (a stalled health checker); the
    /// index is being cleared, so a retry soon may succeed.
    pub fn insufficient_behind_backlog(requested: u32, reached: u64) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "INSUFFICIENT_PROXIES",
            "Insufficient proxies",
            format!(
                "requested {requested} proxies but only {reached} could be reached past a backlog of expired or stale entries now being cleared; retry shortly"
            ),
        )
    }

    /// 409: an `Idempotency-Key` reused with another request body.
    pub fn idempotency_key_reused() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "IDEMPOTENCY_KEY_REUSED",
            "Idempotency key reused",
            "this Idempotency-Key was already used with a different request".into(),
        )
    }

    /// 413: the body is larger than the configured limit.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            "Payload too large",
            format!("the request body must not exceed {limit} bytes"),
        )
    }

    /// 415: the body is not `application/json`.
    pub fn unsupported_media_type() -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "Unsupported media type",
            "the request body must be application/json".into(),
        )
    }

    /// 422: well-formed, but against the business rules.
    pub fn unprocessable(params: Vec<InvalidParam>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "VALIDATION_FAILED",
            "Validation failed",
            "the request violates a business constraint".into(),
        )
        .with_params(params)
    }

    /// 503: this deployment's pool policy is not the one the pool records
    /// (the values go to the log, not to the public body).
    pub fn pool_policy_mismatch() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "POOL_POLICY_MISMATCH",
            "Service unavailable",
            "the pool records another policy than this deployment's".into(),
        )
    }

    /// 503: the pool records another layout version than this deployment
    /// reads (`detail` names both; build facts, nothing secret).
    pub fn pool_layout_mismatch(detail: String) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "POOL_LAYOUT_MISMATCH",
            "Service unavailable",
            detail,
        )
    }

    /// 503: the pool cannot be reached or the service is draining.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "SERVICE_UNAVAILABLE",
            "Service unavailable",
            detail.into(),
        )
    }

    /// 500: says nothing about the cause, which goes to the log instead.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "INTERNAL_ERROR",
            "Internal server error",
            "the request could not be completed".into(),
        )
    }

    /// The same problem answered with one more header.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    fn with_params(mut self, params: Vec<InvalidParam>) -> Self {
        self.invalid_params = params;
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The machine-readable code, e.g. `INSUFFICIENT_PROXIES`.
    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The `application/problem+json` response.
    pub fn into_response(self, request_id: &RequestId) -> Response<Body> {
        let body = Body_ {
            type_: format!(
                "{TYPE_BASE}{}",
                self.code.to_ascii_lowercase().replace('_', "-")
            ),
            title: self.title,
            status: self.status.as_u16(),
            code: self.code,
            detail: &self.detail,
            request_id: request_id.as_str(),
            invalid_params: &self.invalid_params,
        };
        // The fallback is itself a problem document (for a 500 that cannot be
        // serialised, which never happens with these plain fields).
        let json = serde_json::to_string(&body).unwrap_or_else(|e| {
            tracing::error!(error = %e, "a problem could not be serialised");
            format!(
                r#"{{"type":"{TYPE_BASE}internal-error","title":"Internal error","status":500,"code":"INTERNAL_ERROR","detail":"internal error","requestId":"{}"}}"#,
                request_id.as_str()
            )
        });
        let mut response = respond(self.status, "application/problem+json", json, request_id);
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response
    }
}
