//! The 200 body rendered from the committed result of an extraction.

use std::collections::BTreeSet;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::Serialize;

use crate::clock::rfc3339;
use crate::pool::{CommittedExtraction, PooledProxy};

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExtractResponse<'a> {
    request_id: &'a str,
    requested: u32,
    returned: usize,
    proxies: Vec<ExtractedProxy<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExtractedProxy<'a> {
    id: &'a str,
    protocol: &'a str,
    host: &'a str,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<&'a str>,
    url: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    region: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    carrier: &'a str,
    upstream: &'a str,
    expires_at: String,
    remaining_ttl_seconds: i64,
    extracted_at: String,
}

/// Characters left as they are in URL userinfo (RFC 3986 unreserved).
const USERINFO: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

impl PooledProxy {
    /// `protocol://user:password@host:port`, userinfo percent-encoded.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let userinfo = match (&self.username, &self.password) {
            (Some(u), Some(p)) => format!(
                "{}:{}@",
                utf8_percent_encode(u, USERINFO),
                utf8_percent_encode(p, USERINFO)
            ),
            (Some(u), None) => format!("{}@", utf8_percent_encode(u, USERINFO)),
            _ => String::new(),
        };
        format!("{}://{userinfo}{host}:{}", self.protocol, self.port)
    }
}

/// `expiresAt - extractedAt` exactly as the body shows them: each floored to
/// the whole second, then subtracted, so a client can check one against the
/// other, and `extractedAt + remainingTtlSeconds` is `expiresAt`, never after
/// the true expiry. (Flooring the millisecond difference instead answers one
/// second less whenever the extraction's millisecond is past the expiry's.)
fn remaining_ttl_seconds(expires_at_ms: i64, extracted_at_ms: i64) -> i64 {
    (expires_at_ms.div_euclid(1000) - extracted_at_ms.div_euclid(1000)).max(0)
}

impl CommittedExtraction {
    /// The response body. Deterministic, so a replay is byte for byte the
    /// same. (Plain fields: serialising them does not fail.)
    pub fn render(&self) -> Result<String, serde_json::Error> {
        let extracted_at = rfc3339(self.extracted_at);
        let body = ExtractResponse {
            request_id: &self.request_id,
            requested: self.requested,
            returned: self.proxies.len(),
            proxies: self
                .proxies
                .iter()
                .map(|p| ExtractedProxy {
                    id: &p.id,
                    protocol: &p.protocol,
                    host: &p.host,
                    port: p.port,
                    username: p.username.as_deref(),
                    password: p.password.as_deref(),
                    url: p.url(),
                    region: &p.region,
                    carrier: &p.carrier,
                    upstream: &p.upstream,
                    expires_at: rfc3339(p.expires_at),
                    remaining_ttl_seconds: remaining_ttl_seconds(p.expires_at, self.extracted_at),
                    extracted_at: extracted_at.clone(),
                })
                .collect(),
        };
        serde_json::to_string(&body)
    }

    /// The distinct upstreams handed out (for the access log).
    pub fn upstreams(&self) -> BTreeSet<&str> {
        self.proxies.iter().map(|p| p.upstream.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxy() -> PooledProxy {
        PooledProxy {
            id: "px_1".into(),
            protocol: "http".into(),
            host: "192.0.2.10".into(),
            port: 8080,
            username: Some("USER".into()),
            password: Some("p@ss:w/rd".into()),
            region: "shanghai".into(),
            carrier: String::new(),
            upstream: "provider-a".into(),
            expires_at: 1_785_234_600_000,
        }
    }

    /// Credentials are percent-encoded in the URL; IPv6 hosts are bracketed.
    #[test]
    fn builds_urls() {
        assert_eq!(proxy().url(), "http://USER:p%40ss%3Aw%2Frd@192.0.2.10:8080");
        let mut v6 = proxy();
        v6.host = "2001:db8::1".into();
        v6.username = None;
        v6.password = None;
        assert_eq!(v6.url(), "http://[2001:db8::1]:8080");
    }

    /// The rendered body carries floor-second times and the remaining TTL
    /// between them: the seed's example, 10:30:00 - 10:28:37 = 83.
    #[test]
    fn renders_the_seed_shape() {
        let c = CommittedExtraction {
            request_id: "req_1".into(),
            requested: 5,
            extracted_at: 1_785_234_517_900,
            proxies: vec![proxy()],
        };
        let body: serde_json::Value = serde_json::from_str(&c.render().unwrap()).unwrap();
        assert_eq!(body["returned"], 1);
        let p = &body["proxies"][0];
        assert_eq!(p["expiresAt"], "2026-07-28T10:30:00Z");
        assert_eq!(p["extractedAt"], "2026-07-28T10:28:37Z");
        assert_eq!(p["remainingTtlSeconds"], 83);
        assert!(p.get("carrier").is_none());
    }
}
