//! Who a caller is, and the contract of whatever resolves one: the
//! [`Identity`] of a request, why none was resolved ([`Unresolved`]), the
//! [`IdentityResolver`] trait, and how current the registry it reads is.
//! Admission, the rate limits and the handler take these; the resolver
//! that makes them (`Guard`) is in `auth.rs`.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::Duration;

use lambda_http::Request;

use super::directory::DirectoryError;
use super::source::UnknownSource;
use crate::config::Rate;
use crate::pool::PoolError;

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

/// Why a caller was not resolved. `Display` of a refusal is the
/// problem's `detail`.
#[derive(Debug, thiserror::Error)]
pub enum Unresolved {
    /// The request's source address is not known (403).
    #[error(transparent)]
    SourceUnknown(#[from] UnknownSource),
    /// The source address is denied, or not one the client may use (403).
    #[error("requests from this source address are not allowed")]
    SourceForbidden,
    /// Authentication failed (401).
    #[error("{why}")]
    Unauthenticated {
        /// What was wrong with the credentials.
        why: Unauthenticated,
        /// A `WWW-Authenticate` challenge per enabled scheme.
        challenges: Vec<&'static str>,
    },
    /// The client registry document was never loaded (503).
    #[error("the client registry is not loaded yet")]
    RegistryMissing,
    /// The client's Redis registry entry cannot be used (500).
    #[error("client registry entry unusable")]
    RegistryEntry(#[source] DirectoryError),
    /// The Redis client registry could not be read.
    #[error(transparent)]
    Pool(PoolError),
}

/// A resolution in progress.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = Result<Identity, Unresolved>> + Send + 'a>>;

/// Resolves the caller of a request from its headers and transport only
/// (never the body).
pub trait IdentityResolver: Send + Sync {
    /// Resolves `request`'s caller.
    fn resolve<'a>(&'a self, request: &'a Request) -> Resolving<'a>;

    /// How current the client registry it authenticates against is
    /// (readiness reports a missing or stale copy); by default always current.
    fn registry_state(&self) -> RegistryState {
        RegistryState::Current
    }
}

/// Why the credentials did not authenticate a client (each a 401;
/// `Display` is its `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unauthenticated {
    /// None presented, and anonymous callers are not served.
    #[error("credentials are required")]
    Missing,
    /// Two credentials, repeated headers, an unknown scheme, a bad encoding.
    #[error("malformed credentials")]
    Malformed,
    /// A credential of a scheme that is not enabled.
    #[error("this authentication scheme is not enabled")]
    SchemeDisabled,
    /// No client has this credential.
    #[error("invalid credentials")]
    Invalid,
}

/// How current the client registry a resolver authenticates against is,
/// for readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistryState {
    /// Always current: not needed by the enabled schemes, read from Redis on
    /// every request, or fixed (never reloaded).
    Current,
    /// Never loaded: every authenticated request answers 503.
    Missing {
        /// Anonymous callers (scheme `none`) are still served.
        anonymous_served: bool,
    },
    /// A copy read `age` ago, meant to be read again every `refresh`.
    Loaded {
        /// Since the copy in use was read.
        age: Duration,
        /// The reload period.
        refresh: Duration,
    },
}
