//! Who is calling, and may they: source address (trusted proxies), source
//! control, authentication against the client registry, and rate limits.
//! All of it runs before the request body is read.

mod auth;
pub mod credentials;
mod ratelimit;
pub mod registry;
mod source;

pub use auth::{AuthSchemes, Guard, RegistryHandle, SchemesError, SourcePolicy};
pub use ratelimit::{Rate, RateError, RateLimitHeaders, RateLimiter, Refusal};
pub use registry::{ClientRegistry, RegistryError};
pub use source::PeerAddr;

use std::collections::BTreeSet;
use std::net::IpAddr;

use lambda_http::Request;

use crate::httpapi::Problem;

/// The resolved caller of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Identity {
    /// Stable client id: a registered client's id, or `ip:<canonical address>`.
    /// It scopes idempotency keys and names the caller in the access log.
    pub client_id: String,
    /// Whom the per-client rate limit charges: the client id, or for an
    /// anonymous IPv6 caller `ip:<its network>/<prefix>`.
    pub rate_key: String,
    /// The caller's address after trusted-proxy resolution.
    pub source_ip: IpAddr,
    /// Upstreams this client may use; `None` means all.
    pub allowed_upstreams: Option<BTreeSet<String>>,
    /// Per-client cap on `count`, below the server's.
    pub max_count: Option<u32>,
    /// The client's own rate limit, if the registry sets one.
    pub rate: Option<Rate>,
}

/// Resolves the caller of a request from its headers and transport only
/// (never the body). `Err` is the problem to answer with (401, 403, 503).
pub trait IdentityResolver: Send + Sync {
    /// Resolves `request`'s caller.
    fn resolve(&self, request: &Request) -> Result<Identity, Problem>;
}
