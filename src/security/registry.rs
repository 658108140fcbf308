//! The client registry: who may call, with which credentials, from where,
//! how often and for what. One JSON document, from AWS Secrets Manager in
//! Lambda or a file locally (or, for many clients, one entry of this form per
//! client in Redis: `security::directory`):
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
use serde::{Deserialize, Serialize};

use super::credentials::{CredentialHash, find};
use crate::config::Rate;
// The grammar of a CIDR setting, shared with `allowedSources`.
pub use crate::config::parse_net;
use crate::pool::MAX_CLIENT_CREDENTIALS;

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

impl From<String> for RegistryError {
    fn from(why: String) -> Self {
        Self(why)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    clients: Vec<ClientEntry>,
}

/// One client as the registry document writes it (digests, never secrets).
/// The Redis registry stores each client in this form.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientEntry {
    /// Client id.
    pub id: String,
    /// API key digests (`sha256:<hex>`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub api_keys: Vec<String>,
    /// Bearer token digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bearer_tokens: Vec<String>,
    /// Basic `user:password` digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub basic: Vec<String>,
    /// Upstreams it may use; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_upstreams: Option<Vec<String>>,
    /// Source CIDRs it may call from; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_sources: Vec<String>,
    /// `RATE[:BURST]` or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<String>,
    /// Its cap on `count`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_count: Option<u32>,
}

impl ClientEntry {
    /// Parses one stored entry (JSON) and checks it.
    pub fn parse(json: &str) -> Result<Client, RegistryError> {
        let entry: Self = serde_json::from_str(json)
            .map_err(|e| RegistryError(format!("not a client entry ({:?})", e.classify())))?;
        entry.check().map_err(RegistryError)
    }

    /// Its credentials as `"<kind>:<hex sha256>"`, the Redis registry's
    /// lookup fields (valid digests only: [`ClientEntry::check`] refuses others).
    pub fn credential_fields(&self) -> Vec<String> {
        [
            (CredentialKind::ApiKey, &self.api_keys),
            (CredentialKind::Bearer, &self.bearer_tokens),
            (CredentialKind::Basic, &self.basic),
        ]
        .into_iter()
        .flat_map(|(kind, list)| {
            list.iter()
                .filter_map(move |d| CredentialHash::parse(d).map(|h| lookup_field(kind, &h)))
        })
        .collect()
    }

    /// Checks every field; the reason names the field, never a value.
    pub fn check(&self) -> Result<Client, String> {
        let c = self;
        if c.id.is_empty()
            || c.id.len() > 64
            || !c
                .id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err("`id` must be 1 to 64 characters of A-Z a-z 0-9 . _ -".into());
        }
        if c.api_keys.len() + c.bearer_tokens.len() + c.basic.len() > MAX_CLIENT_CREDENTIALS {
            return Err(format!(
                "at most {MAX_CLIENT_CREDENTIALS} credentials per client"
            ));
        }
        let hashes = |list: &[String], field: &str| {
            list.iter()
                .map(|h| CredentialHash::parse(h))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| format!("`{field}` entries must be sha256:<64 hex>"))
        };
        let allowed_sources = c
            .allowed_sources
            .iter()
            .map(|s| parse_net(s))
            .collect::<Option<Vec<_>>>()
            .ok_or("`allowedSources` entries must be CIDRs or addresses")?;
        let rate = match &c.rate_limit {
            None => None,
            Some(s) => Rate::parse(s).map_err(|e| format!("`rateLimit` {e}"))?,
        };
        if c.max_count == Some(0) {
            return Err("`maxCount` must be at least 1".into());
        }
        Ok(Client {
            api_keys: hashes(&c.api_keys, "apiKeys")?,
            bearer_tokens: hashes(&c.bearer_tokens, "bearerTokens")?,
            basic: hashes(&c.basic, "basic")?,
            id: c.id.clone(),
            allowed_upstreams: c
                .allowed_upstreams
                .as_ref()
                .map(|u| u.iter().cloned().collect()),
            allowed_sources,
            rate,
            max_count: c.max_count,
        })
    }
}

/// The Redis registry's lookup field of a credential digest:
/// `"<kind>:<hex sha256>"`.
pub fn lookup_field(kind: CredentialKind, digest: &CredentialHash) -> String {
    let kind = match kind {
        CredentialKind::ApiKey => "apiKey",
        CredentialKind::Bearer => "bearer",
        CredentialKind::Basic => "basic",
    };
    format!("{kind}:{}", digest.hex())
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
        Ok(Self {
            clients: parse_entries(json)?
                .iter()
                .map(|e| e.check().map_err(RegistryError))
                .collect::<Result<_, _>>()?,
        })
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

/// The entries of a registry document, each checked, ids unique.
pub fn parse_entries(json: &str) -> Result<Vec<ClientEntry>, RegistryError> {
    let doc: Document = serde_json::from_str(json).map_err(|e| {
        RegistryError(format!(
            "not a valid registry document (line {}, column {}: {:?})",
            e.line(),
            e.column(),
            e.classify()
        ))
    })?;
    let mut seen = BTreeSet::new();
    for (i, c) in doc.clients.iter().enumerate() {
        c.check()
            .map_err(|why| RegistryError(format!("clients[{i}]: {why}")))?;
        if !seen.insert(c.id.as_str()) {
            return Err(RegistryError(format!("clients[{i}]: duplicate `id`")));
        }
    }
    Ok(doc.clients)
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
