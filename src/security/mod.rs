//! Who is calling, and may they: source address (trusted proxies), source
//! control, authentication against the client registry, and rate limits.
//! All of it runs before the request body is read.
//!
//! * `identity.rs`: the resolved caller ([`Identity`]), why none was
//!   ([`Unresolved`]), and the [`IdentityResolver`] contract.
//! * `source.rs`: the caller's address behind trusted proxies.
//! * `auth.rs`: the standard resolver, [`Guard`]: source control, then
//!   authentication against a [`Directory`].
//! * [`registry`], [`credentials`]: the client registry document and its
//!   credential digests; `directory.rs`: the Redis registry.
//! * `ratelimit.rs`: the global and per-client limits ([`RateLimiter`]).

mod auth;
pub mod credentials;
mod directory;
mod identity;
mod ratelimit;
pub mod registry;
mod source;

pub use auth::{AuthSchemes, Directory, Guard, RegistryHandle, SchemesError, SourcePolicy};
pub use directory::{DirectoryError, Imported, RedisRegistry};
pub use identity::{
    Identity, IdentityResolver, RegistryState, Resolving, Unauthenticated, Unresolved,
};
pub use ratelimit::{Rate, RateError, RateLimitHeaders, RateLimiter, Refusal};
pub use registry::{ClientEntry, ClientRegistry, RegistryError};
pub use source::{PeerAddr, UnknownSource};
