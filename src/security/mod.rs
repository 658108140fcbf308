//! Who is calling: source address and client identity, resolved before the
//! request body is read.

mod source;

pub use source::{PeerAddr, canonical_ip, source_ip};

use std::collections::BTreeSet;
use std::net::IpAddr;

use lambda_http::Request;

use crate::httpapi::Problem;

/// The resolved caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// Stable client id: a registered client's id, or `ip:<canonical address>`.
    pub client_id: String,
    /// The caller's address after trusted-proxy resolution.
    pub source_ip: IpAddr,
    /// Upstreams this client may use; `None` means all.
    pub allowed_upstreams: Option<BTreeSet<String>>,
    /// Per-client cap on `count`, below the server's.
    pub max_count: Option<u32>,
}

/// Resolves the caller of a request from its headers and transport only
/// (never the body). `Err` is the problem to answer with (401, 403, 503).
pub trait IdentityResolver: Send + Sync {
    /// Resolves `request`'s caller.
    fn resolve(&self, request: &Request) -> Result<Identity, Problem>;
}

/// No authentication: every caller is an anonymous client named by its
/// canonical source address.
#[derive(Debug, Clone, Default)]
pub struct AnonymousResolver;

impl IdentityResolver for AnonymousResolver {
    fn resolve(&self, request: &Request) -> Result<Identity, Problem> {
        let ip = source_ip(request).ok_or_else(|| {
            Problem::forbidden("SOURCE_UNKNOWN", "the request's source address is unknown")
        })?;
        Ok(Identity {
            client_id: format!("ip:{ip}"),
            source_ip: ip,
            allowed_upstreams: None,
            max_count: None,
        })
    }
}
