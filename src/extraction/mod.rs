//! Exclusive extraction: the request and response types and the service
//! that applies the client's identity and the server's policy before the
//! pool's atomic script runs.

mod request;
mod response;
mod service;

pub use request::{ExtractRequest, RequestError};
pub use service::{
    ANONYMOUS_USAGE_CLIENT, ExtractionService, IdempotencyKey, Policy, ServiceError,
};
