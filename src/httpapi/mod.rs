//! Shared HTTP plumbing: request ids, RFC 9457 problems and JSON responses.

mod problem;
mod request_id;

pub use problem::{Code, InvalidParam, Problem};
pub use request_id::RequestId;

use lambda_http::Body;
use lambda_http::http::{HeaderValue, Response, StatusCode, header};
use serde::Serialize;

/// Serialises `value` as JSON. A failure (impossible for the plain structs
/// this crate serialises, but never silent) is logged and answered as a
/// cause-free 500.
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, Problem> {
    serde_json::to_string(value).map_err(|e| {
        tracing::error!(error = %e, "a response could not be serialised");
        Problem::internal()
    })
}

/// Builds a JSON response carrying the request id; never cached, since
/// extraction responses hold live credentials.
pub fn json_response(status: StatusCode, body: String, request_id: &RequestId) -> Response<Body> {
    respond(status, "application/json", body, request_id)
}

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: String,
    request_id: &RequestId,
) -> Response<Body> {
    let mut response = Response::new(Body::Text(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(RequestId::HEADER, request_id.header_value());
    response
}
