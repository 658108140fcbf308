use lambda_http::Body;
use lambda_http::http::{HeaderName, HeaderValue, Response, StatusCode};
use serde::Serialize;

use super::request_id::RequestId;
use super::response::respond;

/// Base of every problem `type` URI.
const TYPE_BASE: &str = "https://proxy-pool.local/problems/";

/// Declares [`Code`]: each variant with its text, status and title, and
/// [`Code::ALL`], which therefore cannot miss one.
macro_rules! codes {
    ($($(#[doc = $doc:literal])+ $variant:ident = $text:literal, $status:ident, $title:literal;)+) => {
        /// Every machine-readable `code` a problem can carry. Each has one
        /// status and one title; `api/openapi/proxy-pool.yaml` documents
        /// exactly these (`tests/openapi.rs` holds the two together).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Code {
            $($(#[doc = $doc])+ $variant,)+
        }

        impl Code {
            /// Every code, by status.
            pub const ALL: &'static [Code] = &[$(Code::$variant,)+];

            /// The code as a body carries it, e.g. `INSUFFICIENT_PROXIES`.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $text,)+
                }
            }

            /// The status every problem of this code is answered with.
            pub const fn status(self) -> StatusCode {
                match self {
                    $(Code::$variant => StatusCode::$status,)+
                }
            }

            /// The problem's `title`.
            pub const fn title(self) -> &'static str {
                match self {
                    $(Code::$variant => $title,)+
                }
            }
        }
    };
}

codes! {
    /// 400: malformed JSON, wrong types, unknown fields, bad headers, or a
    /// request head the HTTP/1.1 parser of `serve` could not read.
    BadRequest = "BAD_REQUEST", BAD_REQUEST, "Bad request";
    /// 401: authentication failed.
    Unauthorized = "UNAUTHORIZED", UNAUTHORIZED, "Unauthorized";
    /// 403: the request's source address is not known.
    SourceUnknown = "SOURCE_UNKNOWN", FORBIDDEN, "Forbidden";
    /// 403: the source address is denied, or not one the client may use.
    SourceForbidden = "SOURCE_FORBIDDEN", FORBIDDEN, "Forbidden";
    /// 403: `allowedUpstreams` names an upstream the client may not use.
    UpstreamForbidden = "UPSTREAM_FORBIDDEN", FORBIDDEN, "Forbidden";
    /// 404: no such endpoint.
    NotFound = "NOT_FOUND", NOT_FOUND, "Not found";
    /// 405: the endpoint exists but not for this method.
    MethodNotAllowed = "METHOD_NOT_ALLOWED", METHOD_NOT_ALLOWED, "Method not allowed";
    /// 409: an `Idempotency-Key` reused with another request body.
    IdempotencyKeyReused = "IDEMPOTENCY_KEY_REUSED", CONFLICT, "Idempotency key reused";
    /// 409: `allOrNothing` could not be met.
    InsufficientProxies = "INSUFFICIENT_PROXIES", CONFLICT, "Insufficient proxies";
    /// 413: the body is larger than the configured limit.
    PayloadTooLarge = "PAYLOAD_TOO_LARGE", PAYLOAD_TOO_LARGE, "Payload too large";
    /// 415: the body is not `application/json`.
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE", UNSUPPORTED_MEDIA_TYPE, "Unsupported media type";
    /// 422: well-formed, but against the business rules.
    ValidationFailed = "VALIDATION_FAILED", UNPROCESSABLE_ENTITY, "Validation failed";
    /// 429: a rate limit refused the request.
    RateLimited = "RATE_LIMITED", TOO_MANY_REQUESTS, "Too many requests";
    /// 431: a request head with too many header fields or too many bytes
    /// for the HTTP/1.1 parser of `serve`.
    HeadersTooLarge = "HEADERS_TOO_LARGE", REQUEST_HEADER_FIELDS_TOO_LARGE, "Request header fields too large";
    /// 500: anything else; the body says nothing about the cause.
    InternalError = "INTERNAL_ERROR", INTERNAL_SERVER_ERROR, "Internal server error";
    /// 503: the pool cannot be reached, or the service is draining.
    ServiceUnavailable = "SERVICE_UNAVAILABLE", SERVICE_UNAVAILABLE, "Service unavailable";
    /// 503: the pool records another policy than this deployment's.
    PoolPolicyMismatch = "POOL_POLICY_MISMATCH", SERVICE_UNAVAILABLE, "Service unavailable";
    /// 503: the pool records another layout version than this deployment reads.
    PoolLayoutMismatch = "POOL_LAYOUT_MISMATCH", SERVICE_UNAVAILABLE, "Service unavailable";
}

impl Code {
    /// The problem `type` URI: [`TYPE_BASE`] and the code in lower case,
    /// `-` for `_` (`https://proxy-pool.local/problems/insufficient-proxies`).
    pub fn type_uri(self) -> String {
        format!(
            "{TYPE_BASE}{}",
            self.as_str().to_ascii_lowercase().replace('_', "-")
        )
    }
}

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

/// Serialises `value` as JSON. A failure (impossible for the plain structs
/// this crate serialises, but never silent) is logged and answered as a
/// cause-free 500 (here, beside the same fallback of a problem's own body).
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, Problem> {
    serde_json::to_string(value).map_err(|e| {
        tracing::error!(error = %e, "a response could not be serialised");
        Problem::internal()
    })
}

/// An RFC 9457 problem: every non-2xx answer of the API is one of these.
/// Built from the error values of the layers in one place,
/// `distribution::problems`; here only its form.
#[derive(Debug, Clone)]
pub struct Problem {
    code: Code,
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
    /// A problem of `code` (whose status and title it takes) saying `detail`.
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        Self {
            code,
            detail: detail.into(),
            invalid_params: Vec::new(),
            headers: Vec::new(),
        }
    }

    /// 500: says nothing about the cause, which goes to the log instead.
    pub fn internal() -> Self {
        Self::new(Code::InternalError, "the request could not be completed")
    }

    /// The same problem answered with one more header (appended: a name
    /// may repeat, as `WWW-Authenticate` does).
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// The same problem naming the fields at fault (`invalidParams`).
    pub fn with_params(mut self, params: Vec<InvalidParam>) -> Self {
        self.invalid_params = params;
        self
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.code.status()
    }

    /// The machine-readable code, e.g. `INSUFFICIENT_PROXIES`.
    pub fn code(&self) -> &'static str {
        self.code.as_str()
    }

    /// The `application/problem+json` response.
    pub fn into_response(self, request_id: &RequestId) -> Response<Body> {
        let body = Body_ {
            type_: self.code.type_uri(),
            title: self.code.title(),
            status: self.status().as_u16(),
            code: self.code.as_str(),
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
        let mut response = respond(self.status(), "application/problem+json", json, request_id);
        for (name, value) in self.headers {
            response.headers_mut().append(name, value);
        }
        response
    }
}
