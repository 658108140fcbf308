//! Typed settings, read once from `PROXY_POOL_*` environment variables.
//!
//! Over 600 lines on purpose: every setting, its default, its bound and its
//! error message sit in one table, so an operator's question ("what does
//! this variable accept?") has one place to look; the unit tests beside it
//! check each bound.

use std::time::Duration;

use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::aggregates::{AggregatesOptions, DatabaseUrl};
use crate::distribution::Settings;
use crate::extraction::Policy;
use crate::pool::{Fulfillment, PoolName, PoolPolicy, RedisOptions};
use crate::security::{AuthSchemes, Rate, SourcePolicy, registry::parse_net};

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
    /// How to reach Redis (everything but the URL).
    pub fn redis_options(&self) -> RedisOptions {
        RedisOptions {
            timeout: self.redis_timeout,
            cluster: self.redis_cluster,
            functions: self.redis_functions,
            ca_file: self.redis_ca_file.clone(),
            replica_acks: self.replica_acks,
            replica_ack_timeout: self.replica_ack_timeout,
            policy: PoolPolicy {
                max_health_check_age: self.max_health_check_age,
                min_remaining_ttl: self.min_remaining_ttl,
            },
            pool: self.pool_name.clone(),
        }
    }

    /// Whether an aggregates database is configured, and so extractions
    /// are counted.
    pub fn aggregates_enabled(&self) -> bool {
        self.aggregates_database_url.is_some() || self.aggregates_database_secret_id.is_some()
    }

    /// How to use the aggregates database (everything but where it is).
    pub fn aggregates_options(&self) -> AggregatesOptions {
        AggregatesOptions {
            ca_file: self.aggregates_ca_file.clone(),
            retention: self.aggregates_retention,
            timeout: self.aggregates_timeout,
        }
    }

    /// The rules every extraction runs under.
    pub fn policy(&self) -> Policy {
        Policy {
            max_count_per_request: self.max_count_per_request,
            default_fulfillment: self.default_fulfillment,
            reserve_for_gateway: self.reserve_for_gateway,
            idempotency_ttl: self.idempotency_ttl,
            usage_retention: self
                .aggregates_enabled()
                .then_some(self.aggregates_retention),
        }
    }

    /// What the HTTP handler takes from the configuration.
    pub fn settings(&self) -> Settings {
        Settings {
            config_version: self.version(),
            policy: self.policy(),
            max_body_bytes: self.max_body_bytes,
            global_rate: self.global_rate,
            client_rate: self.client_rate,
        }
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

    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let d = Self::default();
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let redis_cluster = flag(&get, "PROXY_POOL_REDIS_CLUSTER", d.redis_cluster)?;
        let redis_url = get("PROXY_POOL_REDIS_URL");
        if let Some(url) = &redis_url {
            let nodes: Vec<&str> = url.split(',').map(str::trim).collect();
            if nodes
                .iter()
                .any(|u| !(u.starts_with("redis://") || u.starts_with("rediss://")))
            {
                return Err(ConfigError {
                    variable: "PROXY_POOL_REDIS_URL",
                    reason: "must start with redis:// or rediss://".into(),
                });
            }
            if nodes.len() > 1 && !redis_cluster {
                return Err(ConfigError {
                    variable: "PROXY_POOL_REDIS_URL",
                    reason: "several URLs are only allowed with PROXY_POOL_REDIS_CLUSTER=true"
                        .into(),
                });
            }
        }
        let redis_timeout = number(
            &get,
            "PROXY_POOL_REDIS_TIMEOUT_MS",
            d.redis_timeout.as_millis() as u64,
            10..=60_000,
        )
        .map(Duration::from_millis)?;
        let replica_acks = number(&get, "PROXY_POOL_REPLICA_ACKS", 0, 0..=16)? as u32;
        let replica_ack_timeout = number(
            &get,
            "PROXY_POOL_REPLICA_ACK_TIMEOUT_MS",
            d.replica_ack_timeout.as_millis() as u64,
            1..=60_000,
        )
        .map(Duration::from_millis)?;
        if replica_acks > 0 && replica_ack_timeout >= redis_timeout {
            return Err(ConfigError {
                variable: "PROXY_POOL_REPLICA_ACK_TIMEOUT_MS",
                reason: "must be below PROXY_POOL_REDIS_TIMEOUT_MS".into(),
            });
        }
        let pool_name = match get("PROXY_POOL_NAME") {
            None => d.pool_name,
            Some(v) => PoolName::parse(v.trim()).map_err(|e| ConfigError {
                variable: "PROXY_POOL_NAME",
                reason: e.to_string(),
            })?,
        };
        let max_count_per_request = number(
            &get,
            "PROXY_POOL_MAX_COUNT_PER_REQUEST",
            d.max_count_per_request.into(),
            1..=MAX_COUNT_HARD_CAP.into(),
        )? as u32;
        let default_fulfillment = match get("PROXY_POOL_DEFAULT_FULFILLMENT") {
            None => d.default_fulfillment,
            Some(v) => Fulfillment::parse(v.trim()).ok_or_else(|| ConfigError {
                variable: "PROXY_POOL_DEFAULT_FULFILLMENT",
                reason: "must be `partial` or `allOrNothing`".into(),
            })?,
        };
        let secs = |name, default: Duration, range| {
            number(&get, name, default.as_secs(), range).map(Duration::from_secs)
        };
        Ok(Self {
            redis_url,
            pool_name,
            max_count_per_request,
            default_fulfillment,
            min_remaining_ttl: secs(
                "PROXY_POOL_MIN_REMAINING_TTL_SECONDS",
                d.min_remaining_ttl,
                0..=86_400,
            )?,
            max_health_check_age: secs(
                "PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS",
                d.max_health_check_age,
                1..=86_400,
            )?,
            reserve_for_gateway: number(&get, "PROXY_POOL_RESERVE_FOR_GATEWAY", 0, 0..=100_000)?
                as u32,
            idempotency_ttl: secs(
                "PROXY_POOL_IDEMPOTENCY_TTL_SECONDS",
                d.idempotency_ttl,
                1..=86_400,
            )?,
            max_body_bytes: number(
                &get,
                "PROXY_POOL_MAX_BODY_BYTES",
                d.max_body_bytes as u64,
                256..=1024 * 1024,
            )? as usize,
            redis_timeout,
            redis_cluster,
            redis_functions: flag(&get, "PROXY_POOL_REDIS_FUNCTIONS", d.redis_functions)?,
            redis_ca_file: get("PROXY_POOL_REDIS_CA_FILE").map(std::path::PathBuf::from),
            replica_acks,
            replica_ack_timeout,
            redis_secret_id: get("PROXY_POOL_REDIS_SECRET_ID"),
            auth_schemes: match get("PROXY_POOL_AUTH_SCHEMES") {
                None => d.auth_schemes,
                Some(v) => AuthSchemes::parse(&v).map_err(|e| ConfigError {
                    variable: "PROXY_POOL_AUTH_SCHEMES",
                    reason: e.to_string(),
                })?,
            },
            clients_secret_id: get("PROXY_POOL_CLIENTS_SECRET_ID"),
            clients_refresh: secs(
                "PROXY_POOL_CLIENTS_REFRESH_SECONDS",
                d.clients_refresh,
                10..=86_400,
            )?,
            clients_in_redis: match get("PROXY_POOL_CLIENT_REGISTRY").as_deref() {
                None | Some("document") => false,
                Some("redis") => true,
                Some(_) => {
                    return Err(ConfigError {
                        variable: "PROXY_POOL_CLIENT_REGISTRY",
                        reason: "must be `document` or `redis`".into(),
                    });
                }
            },
            sources: SourcePolicy {
                trusted_proxies: nets(&get, "PROXY_POOL_TRUSTED_PROXIES")?,
                trust_alb: flag(&get, "PROXY_POOL_TRUST_ALB", d.sources.trust_alb)?,
                allowed: nets(&get, "PROXY_POOL_ALLOWED_SOURCES")?,
                denied: nets(&get, "PROXY_POOL_DENIED_SOURCES")?,
                anonymous_ipv6_prefix: number(
                    &get,
                    "PROXY_POOL_ANONYMOUS_IPV6_PREFIX",
                    d.sources.anonymous_ipv6_prefix.into(),
                    32..=128,
                )? as u8,
            },
            global_rate: rate(&get, "PROXY_POOL_GLOBAL_RATE", d.global_rate)?,
            client_rate: rate(&get, "PROXY_POOL_CLIENT_RATE", d.client_rate)?,
            aggregates_database_url: get("PROXY_POOL_AGGREGATES_DATABASE_URL")
                .map(|url| {
                    DatabaseUrl::parse(&url).map_err(|_| ConfigError {
                        variable: "PROXY_POOL_AGGREGATES_DATABASE_URL",
                        reason: "must be a postgres:// or postgresql:// URL".into(),
                    })
                })
                .transpose()?,
            aggregates_database_secret_id: get("PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID"),
            aggregates_ca_file: get("PROXY_POOL_AGGREGATES_CA_FILE").map(std::path::PathBuf::from),
            aggregates_retention: number(
                &get,
                "PROXY_POOL_AGGREGATES_RETENTION_HOURS",
                d.aggregates_retention.as_secs() / 3600,
                1..=720,
            )
            .map(|h| Duration::from_secs(h * 3600))?,
            aggregates_timeout: number(
                &get,
                "PROXY_POOL_AGGREGATES_TIMEOUT_MS",
                d.aggregates_timeout.as_millis() as u64,
                100..=60_000,
            )
            .map(Duration::from_millis)?,
        })
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

fn flag(
    get: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    default: bool,
) -> Result<bool, ConfigError> {
    match get(variable).as_deref().map(str::trim) {
        None => Ok(default),
        Some(v) if v.eq_ignore_ascii_case("true") || v == "1" => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") || v == "0" => Ok(false),
        Some(_) => Err(ConfigError {
            variable,
            reason: "must be `true` or `false`".into(),
        }),
    }
}

fn nets(
    get: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
) -> Result<Vec<IpNet>, ConfigError> {
    let Some(raw) = get(variable) else {
        return Ok(Vec::new());
    };
    raw.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            parse_net(s).ok_or_else(|| ConfigError {
                variable,
                reason: "must be a comma-separated list of CIDRs or addresses".into(),
            })
        })
        .collect()
}

fn rate(
    get: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    default: Option<Rate>,
) -> Result<Option<Rate>, ConfigError> {
    match get(variable) {
        None => Ok(default),
        Some(v) => Rate::parse(&v).map_err(|e| ConfigError {
            variable,
            reason: e.to_string(),
        }),
    }
}

fn number(
    get: &impl Fn(&str) -> Option<String>,
    variable: &'static str,
    default: u64,
    range: std::ops::RangeInclusive<u64>,
) -> Result<u64, ConfigError> {
    let Some(raw) = get(variable) else {
        return Ok(default);
    };
    let bad = || ConfigError {
        variable,
        reason: format!(
            "must be a whole number from {} to {}",
            range.start(),
            range.end()
        ),
    };
    let value: u64 = raw.trim().parse().map_err(|_| bad())?;
    if range.contains(&value) {
        Ok(value)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    /// An empty environment gives the documented defaults.
    #[test]
    fn defaults() {
        assert_eq!(from(&[]).unwrap(), Config::default());
    }

    /// Each setting is read from its own variable.
    #[test]
    fn reads_every_variable() {
        let c = from(&[
            ("PROXY_POOL_REDIS_URL", "redis://127.0.0.1:1/"),
            ("PROXY_POOL_NAME", "eu-west_1"),
            ("PROXY_POOL_MAX_COUNT_PER_REQUEST", "1000"),
            ("PROXY_POOL_DEFAULT_FULFILLMENT", "allOrNothing"),
            ("PROXY_POOL_MIN_REMAINING_TTL_SECONDS", "5"),
            ("PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS", "7"),
            ("PROXY_POOL_RESERVE_FOR_GATEWAY", "3"),
            ("PROXY_POOL_IDEMPOTENCY_TTL_SECONDS", "9"),
            ("PROXY_POOL_MAX_BODY_BYTES", "4096"),
            ("PROXY_POOL_REDIS_TIMEOUT_MS", "250"),
            ("PROXY_POOL_REDIS_CLUSTER", "true"),
            ("PROXY_POOL_REDIS_FUNCTIONS", "false"),
            ("PROXY_POOL_REDIS_CA_FILE", "/etc/ca.pem"),
            ("PROXY_POOL_REPLICA_ACKS", "1"),
            ("PROXY_POOL_REPLICA_ACK_TIMEOUT_MS", "200"),
            ("PROXY_POOL_AUTH_SCHEMES", "basic,none"),
            ("PROXY_POOL_CLIENTS_SECRET_ID", "clients"),
            ("PROXY_POOL_REDIS_SECRET_ID", "redis"),
            ("PROXY_POOL_CLIENTS_REFRESH_SECONDS", "60"),
            ("PROXY_POOL_CLIENT_REGISTRY", "redis"),
            ("PROXY_POOL_TRUSTED_PROXIES", "10.0.0.0/8, 192.0.2.1"),
            ("PROXY_POOL_TRUST_ALB", "true"),
            ("PROXY_POOL_ANONYMOUS_IPV6_PREFIX", "56"),
            ("PROXY_POOL_DENIED_SOURCES", "203.0.113.0/24"),
            ("PROXY_POOL_GLOBAL_RATE", "100:200"),
            ("PROXY_POOL_CLIENT_RATE", "off"),
            (
                "PROXY_POOL_AGGREGATES_DATABASE_URL",
                "postgres://app:hunter2@db:5432/usage",
            ),
            ("PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID", "aggregates"),
            ("PROXY_POOL_AGGREGATES_CA_FILE", "/etc/rds.pem"),
            ("PROXY_POOL_AGGREGATES_RETENTION_HOURS", "48"),
            ("PROXY_POOL_AGGREGATES_TIMEOUT_MS", "1500"),
        ])
        .unwrap();
        assert_eq!(c.redis_url.as_deref(), Some("redis://127.0.0.1:1/"));
        assert_eq!(c.pool_name.as_str(), "eu-west_1");
        assert_eq!(c.redis_options().pool, c.pool_name);
        assert_eq!(c.max_count_per_request, 1000);
        assert_eq!(c.default_fulfillment, Fulfillment::AllOrNothing);
        assert_eq!(c.min_remaining_ttl, Duration::from_secs(5));
        assert_eq!(c.max_health_check_age, Duration::from_secs(7));
        assert_eq!(c.reserve_for_gateway, 3);
        assert_eq!(c.idempotency_ttl, Duration::from_secs(9));
        assert_eq!(c.max_body_bytes, 4096);
        assert_eq!(c.redis_timeout, Duration::from_millis(250));
        assert!(c.redis_cluster);
        assert!(!c.redis_functions);
        assert!(!c.redis_options().functions);
        assert_eq!(
            c.redis_ca_file.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        assert_eq!(c.replica_acks, 1);
        assert_eq!(c.replica_ack_timeout, Duration::from_millis(200));
        assert!(c.auth_schemes.basic && c.auth_schemes.none && !c.auth_schemes.api_key);
        assert_eq!(c.clients_secret_id.as_deref(), Some("clients"));
        assert_eq!(c.redis_secret_id.as_deref(), Some("redis"));
        assert_eq!(c.clients_refresh, Duration::from_secs(60));
        assert!(c.clients_in_redis);
        assert_eq!(c.sources.trusted_proxies.len(), 2);
        assert!(c.sources.trust_alb);
        assert_eq!(c.sources.anonymous_ipv6_prefix, 56);
        assert_eq!(c.sources.denied.len(), 1);
        assert!(c.sources.allowed.is_empty());
        assert_eq!(c.global_rate.map(|r| r.burst), Some(200));
        assert_eq!(c.client_rate, None);
        assert!(c.aggregates_enabled());
        assert_eq!(
            c.aggregates_database_secret_id.as_deref(),
            Some("aggregates")
        );
        let options = c.aggregates_options();
        assert_eq!(
            options.ca_file.as_deref(),
            Some(std::path::Path::new("/etc/rds.pem"))
        );
        assert_eq!(options.retention, Duration::from_secs(48 * 3600));
        assert_eq!(options.timeout, Duration::from_millis(1500));
        assert_eq!(c.policy().usage_retention, Some(options.retention));
        // The database password never shows, even in Debug.
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(Config::default().policy().usage_retention, None);
    }

    /// A bad value is refused with the variable's name, never silently defaulted.
    #[test]
    fn names_the_bad_variable() {
        for (var, value) in [
            ("PROXY_POOL_NAME", "{pp}"),
            ("PROXY_POOL_NAME", "ppppppppppppppppppppppppppppppppp"),
            ("PROXY_POOL_MAX_COUNT_PER_REQUEST", "1001"),
            ("PROXY_POOL_MAX_COUNT_PER_REQUEST", "0"),
            ("PROXY_POOL_DEFAULT_FULFILLMENT", "some"),
            ("PROXY_POOL_IDEMPOTENCY_TTL_SECONDS", "-1"),
            ("PROXY_POOL_REDIS_URL", "http://x"),
            ("PROXY_POOL_MAX_BODY_BYTES", "lots"),
            ("PROXY_POOL_AUTH_SCHEMES", "digest"),
            ("PROXY_POOL_TRUSTED_PROXIES", "10.0.0.0/33"),
            ("PROXY_POOL_GLOBAL_RATE", "lots"),
            ("PROXY_POOL_REDIS_CLUSTER", "yes"),
            ("PROXY_POOL_REPLICA_ACKS", "17"),
            ("PROXY_POOL_TRUST_ALB", "yes"),
            ("PROXY_POOL_ANONYMOUS_IPV6_PREFIX", "129"),
            ("PROXY_POOL_ANONYMOUS_IPV6_PREFIX", "16"),
            ("PROXY_POOL_AGGREGATES_DATABASE_URL", "mysql://db/x"),
            ("PROXY_POOL_AGGREGATES_RETENTION_HOURS", "0"),
            ("PROXY_POOL_AGGREGATES_TIMEOUT_MS", "lots"),
        ] {
            let err = from(&[(var, value)]).unwrap_err();
            assert_eq!(err.variable, var);
            assert!(err.to_string().starts_with(var));
        }
    }

    /// Several seed nodes need cluster mode; the WAIT must end before the
    /// client gives up on Redis, or a missing replica would look like an outage.
    #[test]
    fn cluster_urls_and_ack_timeout_are_checked() {
        let nodes = "redis://127.0.0.1:1/,redis://127.0.0.1:2/";
        let err = from(&[("PROXY_POOL_REDIS_URL", nodes)]).unwrap_err();
        assert_eq!(err.variable, "PROXY_POOL_REDIS_URL");
        let c = from(&[
            ("PROXY_POOL_REDIS_URL", nodes),
            ("PROXY_POOL_REDIS_CLUSTER", "true"),
        ])
        .unwrap();
        assert!(c.redis_cluster);
        let err = from(&[
            ("PROXY_POOL_REPLICA_ACKS", "1"),
            ("PROXY_POOL_REDIS_TIMEOUT_MS", "500"),
            ("PROXY_POOL_REPLICA_ACK_TIMEOUT_MS", "500"),
        ])
        .unwrap_err();
        assert_eq!(err.variable, "PROXY_POOL_REPLICA_ACK_TIMEOUT_MS");
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
