//! Typed settings, read once from `PROXY_POOL_*` environment variables.
//!
//! A leaf: this module imports nothing from the crate. [`Config`] is plain
//! data: numbers, durations, flags, text, and the value types a setting is
//! made of ([`PoolName`], [`Fulfillment`], [`Rate`], [`AuthSchemes`],
//! [`SourcePolicy`], [`DatabaseUrl`]), each with its grammar; the layers
//! that use those re-export them. A `Config` is checked whole when it is
//! read, so a bad variable stops the process at start-up with an error
//! naming it. Each layer builds its own option struct from a `Config`,
//! next to that struct: `Config::policy` in `extraction`,
//! `Config::settings` in `distribution`, `Config::aggregates_options` in
//! `aggregates`, and `Config::redis_options` in `startup` (the pool never
//! sees `Config`).
//!
//! Files: this one holds the settings, their defaults and their digest
//! (`version`); `env.rs` reads them from the environment (every variable,
//! its bound and its error message, with the tests of each); `values.rs`
//! holds the value types.

mod env;
mod values;

use std::time::Duration;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

pub use values::{
    AuthSchemes, DatabaseUrl, Fulfillment, InvalidDatabaseUrl, InvalidPoolName, PoolName, Rate,
    RateError, SchemesError, SourcePolicy, parse_net,
};

/// Hard upper bound for `PROXY_POOL_MAX_COUNT_PER_REQUEST` (the OpenAPI maximum).
pub const MAX_COUNT_HARD_CAP: u32 = 1000;

/// Every setting of the Distribution function.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `PROXY_POOL_REDIS_URL`: where the pool lives (`redis://` or `rediss://`).
    pub redis_url: Option<String>,
    /// `PROXY_POOL_NAME`: the pool's name (default `pp`), its keys' hash
    /// tag: pools of different names share one Redis (Cluster), each in its
    /// own slot, with their own client registry and rate limits.
    pub pool_name: PoolName,
    /// `PROXY_POOL_MAX_COUNT_PER_REQUEST`: largest `count` accepted (default 100).
    pub max_count_per_request: u32,
    /// `PROXY_POOL_DEFAULT_FULFILLMENT`: used when a request omits `fulfillment`.
    pub default_fulfillment: Fulfillment,
    /// `PROXY_POOL_MIN_REMAINING_TTL_SECONDS`: a proxy must live at least this long.
    pub min_remaining_ttl: Duration,
    /// `PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS`: oldest acceptable health check.
    pub max_health_check_age: Duration,
    /// `PROXY_POOL_RESERVE_FOR_GATEWAY`: eligible proxies always left for the Gateway.
    pub reserve_for_gateway: u32,
    /// `PROXY_POOL_IDEMPOTENCY_TTL_SECONDS`: how long an extraction can be replayed.
    pub idempotency_ttl: Duration,
    /// `PROXY_POOL_MAX_BODY_BYTES`: largest request body accepted.
    pub max_body_bytes: usize,
    /// `PROXY_POOL_REDIS_TIMEOUT_MS`: bound on connecting to and waiting for Redis.
    pub redis_timeout: Duration,
    /// `PROXY_POOL_REDIS_CLUSTER`: `true` when the URL names Redis Cluster
    /// seed nodes (comma-separated), e.g. ElastiCache cluster mode enabled.
    pub redis_cluster: bool,
    /// `PROXY_POOL_REDIS_FUNCTIONS`: run the scripts as Redis Functions
    /// (default `true`; `false` runs them by `EVALSHA`, as happens on its
    /// own where Redis refuses Functions).
    pub redis_functions: bool,
    /// `PROXY_POOL_REDIS_CA_FILE`: PEM CA bundle trusted for `rediss://`
    /// instead of the system roots.
    pub redis_ca_file: Option<std::path::PathBuf>,
    /// `PROXY_POOL_REPLICA_ACKS`: replicas that must acknowledge an
    /// extraction (`WAIT`) before it is answered (default 0: off).
    pub replica_acks: u32,
    /// `PROXY_POOL_REPLICA_ACK_TIMEOUT_MS`: how long to wait for them;
    /// below `PROXY_POOL_REDIS_TIMEOUT_MS`.
    pub replica_ack_timeout: Duration,
    /// `PROXY_POOL_REDIS_SECRET_ID`: Secrets Manager secret holding the Redis
    /// URL or password (`{"url": ..}`, `{"password": .., "username": ..}` or a bare string).
    pub redis_secret_id: Option<String>,
    /// `PROXY_POOL_AUTH_SCHEMES`: enabled schemes, e.g. `apiKey,bearer` (default `apiKey`).
    pub auth_schemes: AuthSchemes,
    /// `PROXY_POOL_CLIENTS_SECRET_ID`: Secrets Manager secret holding the client registry.
    pub clients_secret_id: Option<String>,
    /// `PROXY_POOL_CLIENTS_REFRESH_SECONDS`: how often the registry is reloaded.
    pub clients_refresh: Duration,
    /// `PROXY_POOL_CLIENT_REGISTRY`: `redis` reads clients from the pool's
    /// Redis on every request instead of a document (default `false`: the document).
    pub clients_in_redis: bool,
    /// `PROXY_POOL_TRUSTED_PROXIES`, `PROXY_POOL_ALLOWED_SOURCES`,
    /// `PROXY_POOL_DENIED_SOURCES`: comma-separated CIDRs;
    /// `PROXY_POOL_TRUST_ALB`: believe an ALB event's `X-Forwarded-For`;
    /// `PROXY_POOL_ANONYMOUS_IPV6_PREFIX`: the network (32..128, default 64)
    /// anonymous IPv6 callers are rate limited by.
    pub sources: SourcePolicy,
    /// `PROXY_POOL_GLOBAL_RATE`: `RATE[:BURST]` for all callers together (default `off`).
    pub global_rate: Option<Rate>,
    /// `PROXY_POOL_CLIENT_RATE`: `RATE[:BURST]` per client unless the registry says otherwise.
    pub client_rate: Option<Rate>,
    /// `PROXY_POOL_AGGREGATES_DATABASE_URL`: PostgreSQL for the usage
    /// aggregates (`postgres://…`); with it (or the secret) every
    /// extraction's outcome is counted.
    pub aggregates_database_url: Option<DatabaseUrl>,
    /// `PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID`: Secrets Manager secret
    /// holding that URL (or RDS's `username`/`password`/`host` document).
    pub aggregates_database_secret_id: Option<String>,
    /// `PROXY_POOL_AGGREGATES_CA_FILE`: PEM CA bundle trusted for the
    /// database's TLS instead of the system roots.
    pub aggregates_ca_file: Option<std::path::PathBuf>,
    /// `PROXY_POOL_AGGREGATES_RETENTION_HOURS`: how long hourly counters
    /// wait in Redis for a flush (default 168).
    pub aggregates_retention: Duration,
    /// `PROXY_POOL_AGGREGATES_TIMEOUT_MS`: bound on one flush's PostgreSQL
    /// work (default 4000).
    pub aggregates_timeout: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            redis_url: None,
            pool_name: PoolName::default(),
            max_count_per_request: 100,
            default_fulfillment: Fulfillment::Partial,
            min_remaining_ttl: Duration::from_secs(30),
            max_health_check_age: Duration::from_secs(120),
            reserve_for_gateway: 0,
            idempotency_ttl: Duration::from_secs(600),
            max_body_bytes: 16 * 1024,
            redis_timeout: Duration::from_millis(2000),
            redis_cluster: false,
            redis_functions: true,
            redis_ca_file: None,
            replica_acks: 0,
            replica_ack_timeout: Duration::from_millis(500),
            redis_secret_id: None,
            auth_schemes: AuthSchemes {
                api_key: true,
                ..AuthSchemes::default()
            },
            clients_secret_id: None,
            clients_refresh: Duration::from_secs(300),
            clients_in_redis: false,
            sources: SourcePolicy::default(),
            global_rate: None,
            client_rate: Some(Rate {
                per_second: 20.0,
                burst: 40,
            }),
            aggregates_database_url: None,
            aggregates_database_secret_id: None,
            aggregates_ca_file: None,
            aggregates_retention: Duration::from_secs(168 * 3600),
            aggregates_timeout: Duration::from_millis(4000),
        }
    }
}

/// A setting that could not be used; names the variable, never echoes secrets.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {reason}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub variable: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl Config {
    /// Whether an aggregates database is configured, and so extractions
    /// are counted.
    pub fn aggregates_enabled(&self) -> bool {
        self.aggregates_database_url.is_some() || self.aggregates_database_secret_id.is_some()
    }

    /// The health probes' `configVersion`: 16 hex digits of SHA-256 over
    /// every setting, one `name=value` line each, passwords left out (of
    /// the Redis and database URLs; secret ids are names and count). The
    /// same settings give the same version, on every instance and restart.
    pub fn version(&self) -> String {
        // Destructured whole, so a new setting cannot be left out unseen.
        let Self {
            redis_url,
            pool_name,
            max_count_per_request,
            default_fulfillment,
            min_remaining_ttl,
            max_health_check_age,
            reserve_for_gateway,
            idempotency_ttl,
            max_body_bytes,
            redis_timeout,
            redis_cluster,
            redis_functions,
            redis_ca_file,
            replica_acks,
            replica_ack_timeout,
            redis_secret_id,
            auth_schemes,
            clients_secret_id,
            clients_refresh,
            clients_in_redis,
            sources,
            global_rate,
            client_rate,
            aggregates_database_url,
            aggregates_database_secret_id,
            aggregates_ca_file,
            aggregates_retention,
            aggregates_timeout,
        } = self;
        let ms = |d: &Duration| d.as_millis().to_string();
        let text = |v: &Option<String>| v.clone().unwrap_or_default();
        let path = |p: &Option<std::path::PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        let rate =
            |r: &Option<Rate>| r.map_or("off".into(), |r| format!("{}:{}", r.per_second, r.burst));
        let nets = |n: &[IpNet]| n.iter().map(IpNet::to_string).collect::<Vec<_>>().join(",");
        let schemes = [
            ("apiKey", auth_schemes.api_key),
            ("basic", auth_schemes.basic),
            ("bearer", auth_schemes.bearer),
            ("none", auth_schemes.none),
        ]
        .iter()
        .filter(|(_, on)| *on)
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(",");
        let settings = [
            (
                "redis_url",
                redis_url
                    .as_deref()
                    .map(without_password)
                    .unwrap_or_default(),
            ),
            ("pool_name", pool_name.to_string()),
            ("max_count_per_request", max_count_per_request.to_string()),
            ("default_fulfillment", default_fulfillment.as_str().into()),
            ("min_remaining_ttl_ms", ms(min_remaining_ttl)),
            ("max_health_check_age_ms", ms(max_health_check_age)),
            ("reserve_for_gateway", reserve_for_gateway.to_string()),
            ("idempotency_ttl_ms", ms(idempotency_ttl)),
            ("max_body_bytes", max_body_bytes.to_string()),
            ("redis_timeout_ms", ms(redis_timeout)),
            ("redis_cluster", redis_cluster.to_string()),
            ("redis_functions", redis_functions.to_string()),
            ("redis_ca_file", path(redis_ca_file)),
            ("replica_acks", replica_acks.to_string()),
            ("replica_ack_timeout_ms", ms(replica_ack_timeout)),
            ("redis_secret_id", text(redis_secret_id)),
            ("auth_schemes", schemes),
            ("clients_secret_id", text(clients_secret_id)),
            ("clients_refresh_ms", ms(clients_refresh)),
            ("clients_in_redis", clients_in_redis.to_string()),
            ("trusted_proxies", nets(&sources.trusted_proxies)),
            ("trust_alb", sources.trust_alb.to_string()),
            ("allowed_sources", nets(&sources.allowed)),
            ("denied_sources", nets(&sources.denied)),
            (
                "anonymous_ipv6_prefix",
                sources.anonymous_ipv6_prefix.to_string(),
            ),
            ("global_rate", rate(global_rate)),
            ("client_rate", rate(client_rate)),
            (
                "aggregates_database_url",
                aggregates_database_url
                    .as_ref()
                    .map(DatabaseUrl::without_password)
                    .unwrap_or_default(),
            ),
            (
                "aggregates_database_secret_id",
                text(aggregates_database_secret_id),
            ),
            ("aggregates_ca_file", path(aggregates_ca_file)),
            ("aggregates_retention_ms", ms(aggregates_retention)),
            ("aggregates_timeout_ms", ms(aggregates_timeout)),
        ];
        let mut digest = Sha256::new();
        for (name, value) in settings {
            digest.update(format!("{name}={value}\n"));
        }
        hex::encode(digest.finalize())[..16].to_owned()
    }
}

/// A Redis URL (or comma-separated seed URLs) without user names and
/// passwords: `rediss://host:6379/0`.
fn without_password(urls: &str) -> String {
    urls.split(',')
        .map(|url| {
            let url = url.trim();
            match url.split_once("://") {
                Some((scheme, rest)) => {
                    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                    format!("{scheme}://{host}")
                }
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The configuration an environment of `pairs` gives.
    pub(in crate::config) fn from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    /// The version names the settings, not the secrets: the same settings
    /// give the same version, any setting changes it, a password does not.
    #[test]
    fn version_digests_settings_without_passwords() {
        let base = from(&[
            ("PROXY_POOL_REDIS_URL", "rediss://app:pw-one@cache:6379/0"),
            (
                "PROXY_POOL_AGGREGATES_DATABASE_URL",
                "postgres://app:db-pw-one@db:5432/usage",
            ),
        ])
        .unwrap();
        let version = base.version();
        assert_eq!(version.len(), 16);
        assert!(version.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(version, base.clone().version());
        let rotated = from(&[
            ("PROXY_POOL_REDIS_URL", "rediss://app:pw-two@cache:6379/0"),
            (
                "PROXY_POOL_AGGREGATES_DATABASE_URL",
                "postgres://app:db-pw-two@db:5432/usage",
            ),
        ])
        .unwrap();
        assert_eq!(rotated.version(), version);
        let mut other = base.clone();
        other.reserve_for_gateway = 1;
        assert_ne!(other.version(), version);
        let mut other = base.clone();
        other.pool_name = PoolName::parse("eu").unwrap();
        assert_ne!(other.version(), version);
        let mut other = base.clone();
        other.redis_url = Some("rediss://app:pw-one@other-cache:6379/0".into());
        assert_ne!(other.version(), version);
        assert_eq!(
            without_password("redis://:p@ss@h1:1/,rediss://u:x@h2:2"),
            "redis://h1:1/,rediss://h2:2"
        );
    }
}
