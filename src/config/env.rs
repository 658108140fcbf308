//! Reading [`Config`] from the environment: every variable, its default
//! (from [`Config::default`]), its bound and its error message, in one
//! table, with a test of each bound.

use std::time::Duration;

use ipnet::IpNet;

use super::{
    AuthSchemes, Config, ConfigError, DatabaseUrl, Fulfillment, MAX_COUNT_HARD_CAP, PoolName, Rate,
    SourcePolicy, parse_net,
};

impl Config {
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

    use crate::config::tests::from;

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
        assert_eq!(
            c.aggregates_ca_file.as_deref(),
            Some(std::path::Path::new("/etc/rds.pem"))
        );
        assert_eq!(c.aggregates_retention, Duration::from_secs(48 * 3600));
        assert_eq!(c.aggregates_timeout, Duration::from_millis(1500));
        // The database password never shows, even in Debug.
        assert!(!format!("{c:?}").contains("hunter2"));
        assert!(!Config::default().aggregates_enabled());
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
}
