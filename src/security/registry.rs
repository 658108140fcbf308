//! The client registry: who may call, with which credentials, from where,
//! how often and for what. One JSON document, from AWS Secrets Manager in
//! Lambda or a file locally:
//!
//! ```json
//! {"clients": [{
//!   "id": "acme",
//!   "apiKeys": ["sha256:<hex>"], "bearerTokens": ["sha256:<hex>"],
//!   "basic": ["sha256:<hex of sha256(\"user:password\")>"],
//!   "allowedUpstreams": ["provider-a"], "allowedSources": ["198.51.100.0/24"],
//!   "rateLimit": "10:20", "maxCount": 50
//! }]}
//! ```

use std::collections::BTreeSet;

use ipnet::IpNet;
use serde::Deserialize;

use super::credentials::{CredentialHash, find};
use super::ratelimit::Rate;

/// One registered client.
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    /// Stable id (`[A-Za-z0-9._-]`, 1..=64): the idempotency and rate-limit scope.
    pub id: String,
    api_keys: Vec<CredentialHash>,
    bearer_tokens: Vec<CredentialHash>,
    basic: Vec<CredentialHash>,
    /// Upstreams it may use; `None` means all.
    pub allowed_upstreams: Option<BTreeSet<String>>,
    /// Source networks it may call from; empty means any.
    pub allowed_sources: Vec<IpNet>,
    /// Its own rate limit, overriding `PROXY_POOL_CLIENT_RATE`.
    pub rate: Option<Rate>,
    /// Its cap on `count`, below the server's.
    pub max_count: Option<u32>,
}

/// Every registered client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientRegistry {
    clients: Vec<Client>,
}

/// The document could not be used. Never quotes the document.
#[derive(Debug, thiserror::Error)]
#[error("client registry: {0}")]
pub struct RegistryError(String);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    clients: Vec<ClientDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClientDoc {
    id: String,
    #[serde(default)]
    api_keys: Vec<String>,
    #[serde(default)]
    bearer_tokens: Vec<String>,
    #[serde(default)]
    basic: Vec<String>,
    allowed_upstreams: Option<Vec<String>>,
    #[serde(default)]
    allowed_sources: Vec<String>,
    rate_limit: Option<String>,
    max_count: Option<u32>,
}

/// Which presented credential a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    /// `X-API-Key`.
    ApiKey,
    /// `Authorization: Bearer`.
    Bearer,
    /// `Authorization: Basic`, hashed as `user:password`.
    Basic,
}

impl ClientRegistry {
    /// Parses and checks the registry document.
    pub fn parse(json: &str) -> Result<Self, RegistryError> {
        let doc: Document = serde_json::from_str(json).map_err(|e| {
            RegistryError(format!(
                "not a valid registry document (line {}, column {}: {:?})",
                e.line(),
                e.column(),
                e.classify()
            ))
        })?;
        let mut seen = BTreeSet::new();
        let mut clients = Vec::with_capacity(doc.clients.len());
        for (i, c) in doc.clients.into_iter().enumerate() {
            let at = |what: &str| RegistryError(format!("clients[{i}]: {what}"));
            if c.id.is_empty()
                || c.id.len() > 64
                || !c
                    .id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(at("`id` must be 1 to 64 characters of A-Z a-z 0-9 . _ -"));
            }
            if !seen.insert(c.id.clone()) {
                return Err(at("duplicate `id`"));
            }
            let hashes = |list: Vec<String>, field: &str| {
                list.iter()
                    .map(|h| CredentialHash::parse(h))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| at(&format!("`{field}` entries must be sha256:<64 hex>")))
            };
            let allowed_sources = c
                .allowed_sources
                .iter()
                .map(|s| parse_net(s))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| at("`allowedSources` entries must be CIDRs or addresses"))?;
            let rate = match &c.rate_limit {
                None => None,
                Some(s) => Rate::parse(s).map_err(|e| at(&format!("`rateLimit` {e}")))?,
            };
            if c.max_count == Some(0) {
                return Err(at("`maxCount` must be at least 1"));
            }
            clients.push(Client {
                api_keys: hashes(c.api_keys, "apiKeys")?,
                bearer_tokens: hashes(c.bearer_tokens, "bearerTokens")?,
                basic: hashes(c.basic, "basic")?,
                id: c.id,
                allowed_upstreams: c.allowed_upstreams.map(|u| u.into_iter().collect()),
                allowed_sources,
                rate,
                max_count: c.max_count,
            });
        }
        Ok(Self { clients })
    }

    /// The client owning `presented` of `kind`, in constant time over all
    /// stored credentials of that kind.
    pub fn authenticate(&self, kind: CredentialKind, presented: &[u8]) -> Option<&Client> {
        let presented = CredentialHash::of(presented);
        let entries = self.clients.iter().flat_map(|c| {
            let list = match kind {
                CredentialKind::ApiKey => &c.api_keys,
                CredentialKind::Bearer => &c.bearer_tokens,
                CredentialKind::Basic => &c.basic,
            };
            list.iter().map(move |h| (h, c))
        });
        find(&presented, entries)
    }

    /// Number of clients.
    pub fn len(&self) -> usize {
        self.clients.len()
    }

    /// True when no client is registered.
    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

/// A CIDR (`10.0.0.0/8`) or a single address (`192.0.2.1`).
pub fn parse_net(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))
        .map(|n| n.trunc())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str) -> String {
        format!(
            r#"{{"clients":[{{"id":"acme","apiKeys":["{}"],"basic":["{}"],"allowedUpstreams":["provider-a"],"allowedSources":["198.51.100.0/24","192.0.2.1"],"rateLimit":"5:10","maxCount":7}},{{"id":"beta","bearerTokens":["{}"]}}]}}"#,
            CredentialHash::of(key.as_bytes()).encode(),
            CredentialHash::of(b"acme:pw").encode(),
            CredentialHash::of(b"tok").encode(),
        )
    }

    /// Each credential kind finds its own client and nothing else.
    #[test]
    fn authenticates_by_kind() {
        let r = ClientRegistry::parse(&doc("key-1")).unwrap();
        assert_eq!(r.len(), 2);
        let acme = r.authenticate(CredentialKind::ApiKey, b"key-1").unwrap();
        assert_eq!(acme.id, "acme");
        assert_eq!(acme.max_count, Some(7));
        assert_eq!(acme.allowed_sources.len(), 2);
        assert!(r.authenticate(CredentialKind::Bearer, b"key-1").is_none());
        assert!(r.authenticate(CredentialKind::ApiKey, b"key-2").is_none());
        assert_eq!(
            r.authenticate(CredentialKind::Basic, b"acme:pw")
                .unwrap()
                .id,
            "acme"
        );
        assert_eq!(
            r.authenticate(CredentialKind::Bearer, b"tok").unwrap().id,
            "beta"
        );
    }

    /// Bad documents are refused with a reason that quotes nothing.
    #[test]
    fn refuses_bad_documents() {
        for bad in [
            "{".to_owned(),
            r#"{"clients":[{"id":"a:b"}]}"#.to_owned(),
            r#"{"clients":[{"id":"a"},{"id":"a"}]}"#.to_owned(),
            r#"{"clients":[{"id":"a","apiKeys":["plaintext-secret"]}]}"#.to_owned(),
            r#"{"clients":[{"id":"a","allowedSources":["nonsense"]}]}"#.to_owned(),
            r#"{"clients":[{"id":"a","rateLimit":"fast"}]}"#.to_owned(),
            r#"{"clients":[{"id":"a","maxCount":0}]}"#.to_owned(),
            r#"{"clients":[{"id":"a","password":"plaintext-secret"}]}"#.to_owned(),
        ] {
            let err = ClientRegistry::parse(&bad).unwrap_err().to_string();
            assert!(!err.contains("plaintext-secret"), "{err}");
        }
    }
}
