//! The standard [`IdentityResolver`]: source address, source control,
//! authentication and client identity, in that order.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use base64::Engine;
use ipnet::{IpNet, Ipv6Net};
use lambda_http::Request;
use lambda_http::http::{HeaderMap, header};

use super::directory::{DirectoryError, RedisRegistry};
use super::identity::{
    Identity, IdentityResolver, RegistryState, Resolving, Unauthenticated, Unresolved,
};
use super::registry::{Client, ClientRegistry, CredentialKind};
use super::source::client_ip;
// Settings (`PROXY_POOL_AUTH_SCHEMES` and the source variables), so their
// types live with the settings; what admission does with them is here.
pub use crate::config::{AuthSchemes, SchemesError, SourcePolicy};

/// Longest credential header value considered.
const MAX_CREDENTIAL_LEN: usize = 1024;

impl AuthSchemes {
    /// Whether any scheme needs the client registry.
    pub fn need_registry(self) -> bool {
        self.api_key || self.basic || self.bearer
    }

    /// A `WWW-Authenticate` challenge per enabled scheme.
    fn challenges(self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.api_key {
            c.push("ApiKey realm=\"proxy-pool\", header=\"X-API-Key\"");
        }
        if self.basic {
            c.push("Basic realm=\"proxy-pool\", charset=\"UTF-8\"");
        }
        if self.bearer {
            c.push("Bearer realm=\"proxy-pool\"");
        }
        c
    }
}

/// The registry as last loaded (`None` until a first load succeeds), when
/// it was read, and how often it is meant to be read again.
#[derive(Clone, Default)]
pub struct RegistryHandle(Arc<RwLock<Loaded>>);

#[derive(Default)]
struct Loaded {
    registry: Option<Arc<ClientRegistry>>,
    at: Option<Instant>,
    refresh: Option<Duration>,
}

impl RegistryHandle {
    /// A handle holding `registry` for good (it is never reloaded).
    pub fn with(registry: ClientRegistry) -> Self {
        let h = Self::default();
        h.replace(registry);
        h
    }

    /// An empty handle that is to be loaded, and reloaded every `period`.
    pub fn refreshed_every(period: Duration) -> Self {
        Self(Arc::new(RwLock::new(Loaded {
            refresh: Some(period),
            ..Loaded::default()
        })))
    }

    /// Installs a registry read just now.
    pub fn replace(&self, registry: ClientRegistry) {
        self.replace_read_at(registry, Instant::now());
    }

    /// Installs a registry read at `read_at` (when its read started: the
    /// copy is as old as that).
    pub fn replace_read_at(&self, registry: ClientRegistry, read_at: Instant) {
        if let Ok(mut slot) = self.0.write() {
            slot.registry = Some(Arc::new(registry));
            slot.at = Some(read_at);
        }
    }

    /// The current registry, if one was ever loaded.
    pub fn current(&self) -> Option<Arc<ClientRegistry>> {
        self.0.read().ok().and_then(|slot| slot.registry.clone())
    }

    /// How current the copy is (`anonymous_served` completes a `Missing`).
    fn state(&self, anonymous_served: bool) -> RegistryState {
        let Ok(slot) = self.0.read() else {
            return RegistryState::Missing { anonymous_served };
        };
        match (&slot.registry, slot.at, slot.refresh) {
            (None, _, _) => RegistryState::Missing { anonymous_served },
            (Some(_), Some(at), Some(refresh)) => RegistryState::Loaded {
                age: at.elapsed(),
                refresh,
            },
            (Some(_), _, None) | (Some(_), None, _) => RegistryState::Current,
        }
    }
}

/// Where the guard finds clients (`PROXY_POOL_CLIENT_REGISTRY`).
#[derive(Clone)]
pub enum Directory {
    /// A registry document held in memory (Secrets Manager, a file, fixed):
    /// every stored digest of the scheme compared in constant time.
    Document(RegistryHandle),
    /// The Redis registry: one lookup by digest per request.
    Redis(RedisRegistry),
}

impl From<RegistryHandle> for Directory {
    fn from(handle: RegistryHandle) -> Self {
        Self::Document(handle)
    }
}

impl From<RedisRegistry> for Directory {
    fn from(registry: RedisRegistry) -> Self {
        Self::Redis(registry)
    }
}

/// Resolves callers per the configured schemes, registry and source policy.
pub struct Guard {
    schemes: AuthSchemes,
    sources: SourcePolicy,
    registry: Directory,
}

enum Presented {
    Nothing,
    Credential(CredentialKind, Vec<u8>),
    Malformed,
}

impl Guard {
    /// A guard enforcing `schemes` against `registry` and `sources`.
    pub fn new(
        schemes: AuthSchemes,
        sources: SourcePolicy,
        registry: impl Into<Directory>,
    ) -> Self {
        Self {
            schemes,
            sources,
            registry: registry.into(),
        }
    }

    fn unauthenticated(&self, why: Unauthenticated) -> Unresolved {
        Unresolved::Unauthenticated {
            why,
            challenges: self.schemes.challenges(),
        }
    }

    /// The anonymous client at `ip`: identified by its address; an IPv6
    /// address is rate limited with its whole `anonymous_ipv6_prefix`
    /// network, so rotating addresses inside it gains nothing.
    fn anonymous(&self, ip: IpAddr) -> Identity {
        let rate_key = match ip {
            IpAddr::V6(v6) => Ipv6Net::new(v6, self.sources.anonymous_ipv6_prefix)
                .map_or_else(|_| format!("ip:{ip}"), |net| format!("ip:{}", net.trunc())),
            IpAddr::V4(_) => format!("ip:{ip}"),
        };
        Identity {
            client_id: format!("ip:{ip}"),
            rate_key,
            source_ip: ip,
            allowed_upstreams: None,
            max_count: None,
            rate: None,
        }
    }
}

impl IdentityResolver for Guard {
    fn resolve<'a>(&'a self, request: &'a Request) -> Resolving<'a> {
        Box::pin(self.identify(request))
    }

    fn registry_state(&self) -> RegistryState {
        match &self.registry {
            Directory::Document(handle) if self.schemes.need_registry() => {
                handle.state(self.schemes.none)
            }
            Directory::Document(_) | Directory::Redis(_) => RegistryState::Current,
        }
    }
}

impl Guard {
    async fn identify(&self, request: &Request) -> Result<Identity, Unresolved> {
        let ip = client_ip(
            request,
            &self.sources.trusted_proxies,
            self.sources.trust_alb,
        )?;
        if inside(&self.sources.denied, &ip)
            || (!self.sources.allowed.is_empty() && !inside(&self.sources.allowed, &ip))
        {
            return Err(Unresolved::SourceForbidden);
        }
        // With `none` the only scheme there is nothing to check credentials
        // against and no challenge to send, and a 401 without one breaks
        // RFC 9110 (15.5.2): credential headers are not read at all.
        if !self.schemes.need_registry() {
            return Ok(self.anonymous(ip));
        }
        let (kind, secret) = match presented(request.headers()) {
            Presented::Nothing if self.schemes.none => return Ok(self.anonymous(ip)),
            Presented::Nothing => return Err(self.unauthenticated(Unauthenticated::Missing)),
            Presented::Malformed => return Err(self.unauthenticated(Unauthenticated::Malformed)),
            Presented::Credential(kind, secret) => (kind, secret),
        };
        let enabled = match kind {
            CredentialKind::ApiKey => self.schemes.api_key,
            CredentialKind::Basic => self.schemes.basic,
            CredentialKind::Bearer => self.schemes.bearer,
        };
        if !enabled {
            return Err(self.unauthenticated(Unauthenticated::SchemeDisabled));
        }
        let client = match &self.registry {
            Directory::Document(handle) => {
                let registry = handle.current().ok_or(Unresolved::RegistryMissing)?;
                registry.authenticate(kind, &secret).cloned()
            }
            Directory::Redis(redis) => match redis.authenticate(kind, &secret).await {
                Ok(client) => client,
                Err(DirectoryError::Pool(e)) => return Err(Unresolved::Pool(e)),
                Err(e) => return Err(Unresolved::RegistryEntry(e)),
            },
        };
        let client = client.ok_or_else(|| self.unauthenticated(Unauthenticated::Invalid))?;
        self.admit_client(client, ip)
    }

    /// The identity of `client` calling from `ip`, if its sources allow.
    fn admit_client(&self, client: Client, ip: IpAddr) -> Result<Identity, Unresolved> {
        if !client.allowed_sources.is_empty() && !inside(&client.allowed_sources, &ip) {
            return Err(Unresolved::SourceForbidden);
        }
        Ok(Identity {
            rate_key: client.id.clone(),
            client_id: client.id,
            source_ip: ip,
            allowed_upstreams: client.allowed_upstreams,
            max_count: client.max_count,
            rate: client.rate,
        })
    }
}

/// Whether `ip` is inside any of `nets`.
fn inside(nets: &[IpNet], ip: &IpAddr) -> bool {
    nets.iter().any(|n| n.contains(ip))
}

/// The one credential a request carries. Two credentials, repeated headers,
/// unknown `Authorization` schemes and bad encodings are all malformed.
fn presented(headers: &HeaderMap) -> Presented {
    let api_keys: Vec<_> = headers.get_all("x-api-key").iter().collect();
    let auths: Vec<_> = headers.get_all(header::AUTHORIZATION).iter().collect();
    let total = api_keys.len() + auths.len();
    if total == 0 {
        return Presented::Nothing;
    }
    if total > 1
        || api_keys
            .iter()
            .chain(&auths)
            .any(|v| v.len() > MAX_CREDENTIAL_LEN)
    {
        return Presented::Malformed;
    }
    if let Some(key) = api_keys.first() {
        let key = key.as_bytes();
        if key.is_empty() || !key.iter().all(u8::is_ascii_graphic) {
            return Presented::Malformed;
        }
        return Presented::Credential(CredentialKind::ApiKey, key.to_vec());
    }
    let Some(auth) = auths.first().and_then(|v| v.to_str().ok()) else {
        return Presented::Malformed;
    };
    let (scheme, rest) = auth.split_once(' ').unwrap_or((auth, ""));
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        let token68 = |b: u8| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b);
        if rest.is_empty() || !rest.bytes().all(token68) {
            return Presented::Malformed;
        }
        return Presented::Credential(CredentialKind::Bearer, rest.as_bytes().to_vec());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        return match base64::engine::general_purpose::STANDARD.decode(rest) {
            Ok(decoded) if decoded.contains(&b':') && !decoded.iter().any(u8::is_ascii_control) => {
                Presented::Credential(CredentialKind::Basic, decoded)
            }
            _ => Presented::Malformed,
        };
    }
    Presented::Malformed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scheme lists parse case-insensitively; empty or unknown is an error.
    #[test]
    fn parses_schemes() {
        let s = AuthSchemes::parse("apiKey, Bearer").unwrap();
        assert!(s.api_key && s.bearer && !s.basic && !s.none);
        assert!(AuthSchemes::parse("none").unwrap().none);
        assert!(!AuthSchemes::parse("none").unwrap().need_registry());
        assert!(AuthSchemes::parse("").is_err());
        assert!(AuthSchemes::parse("apiKey,digest").is_err());
    }
}
