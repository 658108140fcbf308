use lambda_http::Body;
use lambda_http::http::{HeaderValue, Response, StatusCode, header};

use super::request_id::RequestId;

/// Builds a JSON response carrying the request id; never cached, since
/// extraction responses hold live credentials.
pub fn json_response(status: StatusCode, body: String, request_id: &RequestId) -> Response<Body> {
    respond(status, "application/json", body, request_id)
}

/// Builds every answer, a problem's too: `body` as `content_type`, never
/// cached, carrying the request id.
pub(super) fn respond(
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
