//! Shared HTTP plumbing: request ids, RFC 9457 problems and JSON responses.
//!
//! * `request_id.rs`: the `X-Request-ID` every answer carries.
//! * `response.rs`: the form every answer takes (content type, `no-store`,
//!   request id); JSON answers.
//! * `problem.rs`: a problem's code, status and body, and [`to_json`], whose
//!   one failure is a problem.

mod problem;
mod request_id;
mod response;

pub use problem::{Code, InvalidParam, Problem, to_json};
pub use request_id::RequestId;
pub use response::json_response;
