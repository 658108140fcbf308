//! The value types settings are made of, each with its grammar: what a
//! `PROXY_POOL_*` variable (and, for some, a CLI flag, a request field or a
//! registry entry) may hold. They live here so the settings need no layer;
//! the layers that use them re-export them where they have always been
//! (`pool::PoolName`, `security::Rate`, `aggregates::DatabaseUrl`, ...) and
//! add there what they do with them.

use std::fmt;
use std::str::FromStr;

use ipnet::IpNet;
use serde::Serialize;

/// A pool's name: 1 to 32 characters of `A-Z a-z 0-9 _ -`, the hash tag
/// (`{<name>}`) every key of the pool starts with.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolName(String);

/// Why a pool name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a pool name is 1 to 32 characters of A-Z, a-z, 0-9, `_` and `-`")]
pub struct InvalidPoolName;

impl PoolName {
    /// The name of the pool every deployment used before pools had names.
    pub const DEFAULT: &str = "pp";

    /// Validates `name`.
    pub fn parse(name: &str) -> Result<Self, InvalidPoolName> {
        let valid = (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if valid {
            Ok(Self(name.to_owned()))
        } else {
            Err(InvalidPoolName)
        }
    }

    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hash tag every key of the pool starts with: `{<name>}`.
    pub fn hash_tag(&self) -> String {
        format!("{{{}}}", self.0)
    }
}

impl Default for PoolName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for PoolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for PoolName {
    type Err = InvalidPoolName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// What to do when fewer proxies are eligible than requested.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Fulfillment {
    /// Return what is available, possibly none.
    #[serde(rename = "partial")]
    Partial,
    /// Return exactly `count` or nothing (409).
    #[serde(rename = "allOrNothing")]
    AllOrNothing,
}

impl Fulfillment {
    /// Parses the wire name (`partial`, `allOrNothing`).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "partial" => Some(Self::Partial),
            "allOrNothing" => Some(Self::AllOrNothing),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Partial => "partial",
            Self::AllOrNothing => "allOrNothing",
        }
    }
}

/// A limit: a sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Sustained requests per second (> 0).
    pub per_second: f64,
    /// Requests admissible at once from a full bucket (>= 1).
    pub burst: u32,
}

/// A rate that is not `RATE[:BURST]` or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// RATE is not a number of requests per second above 0.
    #[error("must be RATE[:BURST] with RATE requests per second (> 0), or `off`")]
    Rate,
    /// BURST is not a whole number in range.
    #[error("BURST must be a whole number from 1 to 1000000")]
    Burst,
}

impl Rate {
    /// Parses `RATE[:BURST]` (e.g. `10`, `0.5:3`, `100:200`); `off` is `None`.
    /// Burst defaults to the rate rounded up.
    pub fn parse(s: &str) -> Result<Option<Self>, RateError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let (rate, burst) = s.split_once(':').unwrap_or((s, ""));
        let per_second: f64 = rate
            .parse()
            .ok()
            .filter(|r: &f64| r.is_finite() && *r > 0.0 && *r <= 1_000_000.0)
            .ok_or(RateError::Rate)?;
        let burst = if burst.is_empty() {
            per_second.ceil() as u32
        } else {
            burst
                .parse()
                .ok()
                .filter(|b| (1..=1_000_000).contains(b))
                .ok_or(RateError::Burst)?
        };
        Ok(Some(Self { per_second, burst }))
    }
}

/// Which authentication schemes are enabled (`PROXY_POOL_AUTH_SCHEMES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuthSchemes {
    /// `X-API-Key`.
    pub api_key: bool,
    /// HTTP Basic.
    pub basic: bool,
    /// HTTP Bearer.
    pub bearer: bool,
    /// Anonymous callers, identified by source address.
    pub none: bool,
}

/// A scheme list that is not a comma list of the known schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SchemesError {
    /// A word that names no scheme.
    #[error("must list apiKey, basic, bearer and/or none")]
    Unknown,
    /// Nothing enabled.
    #[error("must enable at least one of apiKey, basic, bearer, none")]
    Empty,
}

impl AuthSchemes {
    /// Parses a comma list of `apiKey`, `basic`, `bearer`, `none`.
    pub fn parse(s: &str) -> Result<Self, SchemesError> {
        let mut out = Self::default();
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_lowercase().as_str() {
                "apikey" => out.api_key = true,
                "basic" => out.basic = true,
                "bearer" => out.bearer = true,
                "none" => out.none = true,
                _ => return Err(SchemesError::Unknown),
            }
        }
        if out == Self::default() {
            return Err(SchemesError::Empty);
        }
        Ok(out)
    }
}

/// Source address rules (`PROXY_POOL_TRUSTED_PROXIES`, `..._TRUST_ALB`,
/// `..._ALLOWED_SOURCES`, `..._DENIED_SOURCES`, `..._ANONYMOUS_IPV6_PREFIX`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourcePolicy {
    /// Peers whose forwarded headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// Whether an ALB event's `X-Forwarded-For` is believed (an ALB event
    /// names no peer address, so it cannot be trusted by CIDR).
    pub trust_alb: bool,
    /// When non-empty, callers must be inside one of these.
    pub allowed: Vec<IpNet>,
    /// Callers inside one of these are refused.
    pub denied: Vec<IpNet>,
    /// Anonymous IPv6 callers in one network of this prefix length share
    /// one per-client rate limit (64: a subscriber's usual allocation).
    pub anonymous_ipv6_prefix: u8,
}

/// Default of [`SourcePolicy::anonymous_ipv6_prefix`].
const DEFAULT_ANONYMOUS_IPV6_PREFIX: u8 = 64;

impl Default for SourcePolicy {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            trust_alb: false,
            allowed: Vec::new(),
            denied: Vec::new(),
            anonymous_ipv6_prefix: DEFAULT_ANONYMOUS_IPV6_PREFIX,
        }
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

/// A PostgreSQL URL (`postgres://user:password@host:port/db?sslmode=…`).
/// It carries a password: its `Debug` shows nothing, and no message quotes it.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl(String);

/// Why a database URL was refused (never quoting it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDatabaseUrl {
    /// Another scheme than `postgres://` or `postgresql://`.
    #[error("the database URL must start with postgres:// or postgresql://")]
    Scheme,
    /// Not a URL tokio-postgres understands.
    #[error("the database URL is not a valid PostgreSQL URL")]
    Syntax,
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatabaseUrl(<redacted>)")
    }
}

impl DatabaseUrl {
    /// Checks that `url` is a PostgreSQL URL tokio-postgres understands.
    pub fn parse(url: &str) -> Result<Self, InvalidDatabaseUrl> {
        let url = url.trim();
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(InvalidDatabaseUrl::Scheme);
        }
        tokio_postgres::Config::from_str(url).map_err(|_| InvalidDatabaseUrl::Syntax)?;
        Ok(Self(url.to_owned()))
    }

    /// The URL as tokio-postgres connects with it (password included).
    pub fn postgres_config(&self) -> Result<tokio_postgres::Config, InvalidDatabaseUrl> {
        tokio_postgres::Config::from_str(&self.0).map_err(|_| InvalidDatabaseUrl::Syntax)
    }

    /// Which database it names, without its password:
    /// `user@host:port,host:port/dbname`.
    pub fn without_password(&self) -> String {
        let Ok(config) = self.postgres_config() else {
            return String::new();
        };
        // One port serves every host; none: the default.
        let ports = config.get_ports();
        let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let hosts: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| (host, port(i)))
            .map(|(host, port)| match host {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
            })
            .collect();
        format!(
            "{}@{}/{}",
            config.get_user().unwrap_or_default(),
            hosts.join(","),
            config.get_dbname().unwrap_or_default()
        )
    }
}
