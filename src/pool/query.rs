//! What an extraction asks of the pool and what the script answers: the
//! contract of `lua/extract.lua`, in Rust types.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Serialize;

use super::keys::PoolKeys;
// A setting too (`PROXY_POOL_DEFAULT_FULFILLMENT`), so its type lives with
// the settings.
pub use crate::config::Fulfillment;

/// The proxy protocols the pool knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// `http`.
    Http,
    /// `https`.
    Https,
    /// `socks5`.
    Socks5,
}

impl Protocol {
    /// Every protocol, in their usual order.
    pub const ALL: [Self; 3] = [Self::Http, Self::Https, Self::Socks5];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
            Self::Socks5 => "socks5",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The wire names, comma-separated, for messages.
    pub fn names() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

/// Which proxies a request may be given: OR within a dimension, AND across
/// dimensions; an empty list does not restrict. The one filter type of the
/// extraction path: validated and sorted once, when the request is decoded
/// (`extraction::ExtractRequest::decode`), and taken by the pool as it is.
/// Serialised as the request names them, empty lists left out (the
/// canonical form an idempotency digest is taken of).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Filters {
    /// Any of these protocols (sorted, duplicate-free).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub protocols: Vec<String>,
    /// Any of these regions (sorted, duplicate-free; "" is the unknown one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub regions: Vec<String>,
    /// Any of these carriers (sorted, duplicate-free; "" is the unknown one).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub carriers: Vec<String>,
    /// Any of these upstreams (sorted, duplicate-free): only narrows what
    /// the client may use ([`ExtractionQuery::permitted_upstreams`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_upstreams: Vec<String>,
}

impl Filters {
    /// The upstreams an extraction may draw from: the ones these filters
    /// name, else all the client may use (`permitted`; `None`: any, so no
    /// restriction; an empty set: none). The caller has refused filters
    /// naming an upstream outside `permitted`: they narrow, never widen.
    pub fn upstreams<'a>(
        &'a self,
        permitted: Option<&'a BTreeSet<String>>,
    ) -> Option<Vec<&'a String>> {
        if self.allowed_upstreams.is_empty() {
            permitted.map(|p| p.iter().collect())
        } else {
            Some(self.allowed_upstreams.iter().collect())
        }
    }
}

/// Where a committed extraction is recorded for replay.
#[derive(Debug, Clone)]
pub struct IdempotencyScope {
    /// Its field in the idempotency hash, from [`keys::idempotency`](super::keys::idempotency).
    pub key: String,
    /// The request's digest (64 hex characters), so a reuse of the key with
    /// another request is told apart.
    pub digest: String,
    /// How long the record is in force.
    pub ttl: Duration,
}

/// Everything `lua/extract.lua` needs for one extraction (the time rules
/// are the pool policy's: see [`PoolPolicy`](super::PoolPolicy)).
#[derive(Debug, Clone)]
pub struct ExtractionQuery<'a> {
    /// Proxies asked for.
    pub count: u32,
    /// Effective fulfillment mode.
    pub fulfillment: Fulfillment,
    /// Eligible proxies to leave for the Gateway.
    pub reserve: u32,
    /// Which proxies match, as the request named them.
    pub filters: &'a Filters,
    /// The upstreams the client may use at all (its registry entry);
    /// `None`: any. The filters' `allowed_upstreams` narrow them.
    pub permitted_upstreams: Option<&'a BTreeSet<String>>,
    /// Copied into the committed result.
    pub request_id: &'a str,
    /// Present when the caller sent an `Idempotency-Key`.
    pub idempotency: Option<IdempotencyScope>,
    /// Present when the outcome is counted in the hourly usage counters.
    pub usage: Option<UsageScope>,
}

/// The script's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractionOutcome {
    /// Proxies removed from the pool and (if scoped) recorded.
    Committed(CommittedExtraction),
    /// The same request was committed before: its result, nothing extracted.
    Replayed(CommittedExtraction),
    /// The `Idempotency-Key` was used with another request.
    KeyReused,
    /// `allOrNothing` could not be met; `available` = eligible minus reserve.
    Insufficient {
        /// What could have been handed out.
        available: u64,
        /// The Redis clock it was decided at, Unix ms.
        at_ms: i64,
        /// `available` is what could be reached past a backlog of spent
        /// entries (the index is being cleared), not an exact count.
        behind_backlog: bool,
    },
    /// Committed (or replayed) on the primary, but fewer replicas than
    /// configured acknowledged it in time: not to be handed to the client,
    /// since a failover now could lose it and hand the proxies out again.
    /// The idempotency record (if any) holds the result for a retry.
    NotReplicated {
        /// Replicas that did acknowledge.
        acknowledged: u64,
    },
}

/// A proxy as recorded in the pool (the public part of its record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PooledProxy {
    /// Stable proxy id.
    pub id: String,
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// Host name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Proxy user, if any.
    pub username: Option<String>,
    /// Proxy password, if any.
    pub password: Option<String>,
    /// Region ("" when unknown).
    pub region: String,
    /// Carrier ("" when unknown).
    pub carrier: String,
    /// Upstream provider.
    pub upstream: String,
    /// Hard expiry, Unix ms.
    pub expires_at: i64,
}

/// What one committed extraction recorded: the source of the 200 body,
/// stored in the idempotency record so a replay renders the same bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedExtraction {
    /// Request id of the request that committed it.
    pub request_id: String,
    /// The `count` asked for.
    pub requested: u32,
    /// Redis time of the commit, Unix ms.
    pub extracted_at: i64,
    /// The proxies taken, soonest-expiring first.
    pub proxies: Vec<PooledProxy>,
}

impl PooledProxy {
    /// A record as `lua/extract.lua` hands it out: its locator
    /// `<p>|<r>|<c>|<u>|<expiry ms, 13 digits>|<id>`, then tab-separated
    /// host, port, user and password ("" for none) (`lua/prelude/record.lua`).
    fn parse(record: &str) -> Option<Self> {
        let mut fields = record.split('\t');
        let locator = fields.next()?;
        let mut parts = locator.split('|');
        let mut part = || parts.next().map(str::to_owned);
        let (protocol, region, carrier, upstream) = (part()?, part()?, part()?, part()?);
        let expires_at = part()?.parse().ok()?;
        let id = part()?;
        let host = fields.next()?.to_owned();
        let port = fields.next()?.parse().ok()?;
        let secret = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let username = secret(fields.next()?);
        let password = secret(fields.next()?);
        Some(Self {
            id,
            protocol,
            host,
            port,
            username,
            password,
            region,
            carrier,
            upstream,
            expires_at,
        })
    }
}

impl CommittedExtraction {
    /// Parses a result as `lua/extract.lua` records it: `<requestId>\n<count>
    /// \n<extractedAt ms>`, then `\n<record>` per proxy.
    pub fn parse(result: &str) -> Option<Self> {
        let mut lines = result.split('\n');
        let request_id = lines.next()?.to_owned();
        let requested = lines.next()?.parse().ok()?;
        let extracted_at = lines.next()?.parse().ok()?;
        let proxies = lines.map(PooledProxy::parse).collect::<Option<_>>()?;
        Some(Self {
            request_id,
            requested,
            extracted_at,
            proxies,
        })
    }
}

/// Seconds in an hour: the counters' granularity.
pub(crate) const HOUR_S: i64 = 3600;
/// How far the caller's clock may be from the Redis clock for a call to be
/// counted: the call declares the hashes of the hours its own time minus
/// and plus this falls in, and the script takes the one its `TIME` is in.
const CLOCK_SLACK_S: i64 = 600;

/// The start (Unix s) of the hour `unix_s` falls in.
pub fn hour_of(unix_s: i64) -> i64 {
    unix_s - unix_s.rem_euclid(HOUR_S)
}

/// Where one extraction's outcome is counted: the client's label and the
/// two hourly hashes the Redis clock may be in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageScope {
    client: String,
    hours: [i64; 2],
    retention_s: u64,
}

impl UsageScope {
    /// Counts under `client` (1 to 128 bytes, no `|`, no control
    /// characters: else `None`), in hashes that live `retention` after
    /// their hour ends; `now_ms` is the caller's clock.
    pub fn new(client: &str, retention: Duration, now_ms: i64) -> Option<Self> {
        if client.is_empty()
            || client.len() > 128
            || client.contains('|')
            || client.chars().any(char::is_control)
        {
            return None;
        }
        let now_s = now_ms.div_euclid(1000);
        Some(Self {
            client: client.to_owned(),
            hours: [
                hour_of(now_s - CLOCK_SLACK_S),
                hour_of(now_s + CLOCK_SLACK_S),
            ],
            retention_s: retention.as_secs(),
        })
    }

    /// Adds the counters' two keys and four arguments to an extraction
    /// call of pool `keys` (where `lua/extract.lua` expects them).
    pub(super) fn declare(&self, keys: &PoolKeys, inv: &mut super::scripts::Invocation<'_>) {
        inv.key(keys.usage_hour(self.hours[0]))
            .key(keys.usage_hour(self.hours[1]))
            .arg(&self.client)
            .arg(self.hours[0])
            .arg(self.hours[1])
            .arg(self.retention_s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two declared hours bracket the caller's clock by ten minutes.
    #[test]
    fn scope_brackets_the_clock() {
        let day = Duration::from_secs(86_400);
        let mid = UsageScope::new("acme", day, 1_785_234_600_000).unwrap(); // 10:30
        assert_eq!(mid.hours, [1_785_232_800, 1_785_232_800]);
        let late = UsageScope::new("acme", day, 1_785_236_100_000).unwrap(); // 10:55
        assert_eq!(late.hours, [1_785_232_800, 1_785_236_400]);
        assert!(UsageScope::new("a|b", day, 0).is_none());
        assert!(UsageScope::new("", day, 0).is_none());
        assert!(UsageScope::new("a\nb", day, 0).is_none());
    }
}
