//! PostgreSQL: the URL (never shown), TLS with rustls, the schema's
//! migrations (run by the tool itself, under an advisory lock), and the
//! statements the flush runs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::error::AggregatesError;
// A setting (`PROXY_POOL_AGGREGATES_DATABASE_URL`), so its type lives with
// the settings.
pub use crate::config::DatabaseUrl;
use crate::pool::{HourUsage, UsageOutcome};

/// The schema, in order: (version, name, SQL). Applied versions are kept in
/// `proxy_pool_migrations`; a migration is never edited once released.
const MIGRATIONS: [(i32, &str, &str); 1] =
    [(1, "usage", include_str!("migrations/0001_usage.sql"))];
/// `pg_advisory_xact_lock` key serialising migrations ("pp-aggr").
const MIGRATION_LOCK: i64 = 0x0070_702d_6167_6772;
/// Rows sent per `INSERT … SELECT FROM unnest(…)`.
const ROWS_PER_STATEMENT: usize = 5000;

/// The database URL from a Secrets Manager secret: a bare `postgres://`
/// URL, `{"url": …}`, or the document RDS keeps for a managed password
/// (`{"username", "password", "host", "port", "dbname"}`, which becomes a
/// URL with `sslmode=require`).
pub fn database_url_from_secret(secret: &str) -> Result<DatabaseUrl, AggregatesError> {
    let secret = secret.trim();
    let Ok(serde_json::Value::Object(doc)) = serde_json::from_str::<serde_json::Value>(secret)
    else {
        return Ok(DatabaseUrl::parse(secret)?);
    };
    let text = |k: &str| doc.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    if let Some(url) = text("url") {
        return Ok(DatabaseUrl::parse(&url)?);
    }
    let (Some(user), Some(password), Some(host)) =
        (text("username"), text("password"), text("host"))
    else {
        return Err(AggregatesError::Settings(
            "the database secret has neither `url` nor `username`, `password` and `host`".into(),
        ));
    };
    let port = match doc.get("port") {
        None => 5432,
        Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
        Some(_) => 0,
    };
    if !(1..=65535).contains(&port) {
        return Err(AggregatesError::Settings(
            "the database secret's `port` is not a port".into(),
        ));
    }
    let enc = |s: &str| {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    };
    let dbname = text("dbname").unwrap_or_else(|| "postgres".into());
    Ok(DatabaseUrl::parse(&format!(
        "postgres://{}:{}@{host}:{port}/{}?sslmode=require",
        enc(&user),
        enc(&password),
        enc(&dbname)
    ))?)
}

/// The TLS connector: rustls (aws-lc-rs), trusting `ca_file` (PEM) or else
/// the system's roots. Used when the URL's `sslmode` is `prefer` (the
/// default) or `require`; rustls always verifies the server's certificate
/// and host name, so there is no unverified TLS.
pub fn tls_connector(ca_file: Option<&Path>) -> Result<MakeRustlsConnect, AggregatesError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let unreadable = || {
                AggregatesError::Settings(
                    "PROXY_POOL_AGGREGATES_CA_FILE cannot be read as PEM certificates".into(),
                )
            };
            for cert in CertificateDer::pem_file_iter(path).map_err(|_| unreadable())? {
                roots
                    .add(cert.map_err(|_| unreadable())?)
                    .map_err(|_| unreadable())?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                // A system root rustls cannot parse is of no use to it.
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|_| AggregatesError::Settings("TLS cannot be set up".into()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// One open connection to the aggregates database, schema migrated.
pub struct Database {
    client: Client,
}

impl Database {
    /// Connects (within `connect_timeout` unless the URL sets its own) and
    /// applies the migrations this build knows and the database lacks.
    pub async fn connect(
        url: &DatabaseUrl,
        tls: MakeRustlsConnect,
        connect_timeout: Duration,
    ) -> Result<Self, AggregatesError> {
        let mut config = url.postgres_config()?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(connect_timeout);
        }
        config.application_name("proxy-pool");
        let (mut client, connection) = config.connect(tls).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %AggregatesError::from(e), "aggregates database connection ended");
            }
        });
        migrate(&mut client).await?;
        Ok(Self { client })
    }

    /// The connection, for queries.
    pub(super) fn client(&self) -> &Client {
        &self.client
    }

    /// Records one hour's counters and claims the hour in the ledger, in
    /// one transaction. `false`: the ledger already had the hour (flushed
    /// or dropped before), nothing was written.
    pub async fn record_hour(&mut self, usage: &HourUsage) -> Result<bool, AggregatesError> {
        let tx = self.client.transaction().await?;
        let claimed = tx
            .query_opt(
                "INSERT INTO usage_hours (hour, status, calls, proxies) \
                 VALUES (to_timestamp($1::bigint), 'flushed', $2, $3) \
                 ON CONFLICT (hour) DO NOTHING RETURNING 1",
                &[
                    &usage.hour,
                    &count(usage.total_calls()),
                    &count(usage.total_proxies()),
                ],
            )
            .await?;
        if claimed.is_none() {
            tx.rollback().await?;
            return Ok(false);
        }
        let calls = call_rows(usage);
        for chunk in calls.chunks(ROWS_PER_STATEMENT) {
            let client: Vec<&str> = chunk.iter().map(|r| r.0).collect();
            let outcome: Vec<&str> = chunk.iter().map(|r| r.1.as_str()).collect();
            let n: Vec<i64> = chunk.iter().map(|r| r.2.calls).collect();
            let requested: Vec<i64> = chunk.iter().map(|r| r.2.requested).collect();
            let returned: Vec<i64> = chunk.iter().map(|r| r.2.returned).collect();
            tx.execute(
                "INSERT INTO usage_calls (hour, client_id, outcome, calls, requested, returned) \
                 SELECT to_timestamp($1::bigint), * FROM \
                 unnest($2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])",
                &[&usage.hour, &client, &outcome, &n, &requested, &returned],
            )
            .await?;
        }
        for chunk in usage.proxies.chunks(ROWS_PER_STATEMENT) {
            let client: Vec<&str> = chunk.iter().map(|p| p.client.as_str()).collect();
            let upstream: Vec<&str> = chunk.iter().map(|p| p.upstream.as_str()).collect();
            let protocol: Vec<&str> = chunk.iter().map(|p| p.protocol.as_str()).collect();
            let region: Vec<&str> = chunk.iter().map(|p| p.region.as_str()).collect();
            let n: Vec<i64> = chunk.iter().map(|p| count(p.proxies)).collect();
            tx.execute(
                "INSERT INTO usage_proxies (hour, client_id, upstream, protocol, region, proxies) \
                 SELECT to_timestamp($1::bigint), * FROM \
                 unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[])",
                &[&usage.hour, &client, &upstream, &protocol, &region, &n],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Records an hour that expired in Redis before it was moved, with the
    /// calls and proxies a flush had seen in it. `false`: the ledger
    /// already had the hour (it was moved after all).
    pub async fn record_dropped(
        &self,
        hour: i64,
        calls: u64,
        proxies: u64,
    ) -> Result<bool, AggregatesError> {
        let row = self
            .client
            .query_opt(
                "INSERT INTO usage_hours (hour, status, calls, proxies) \
                 VALUES (to_timestamp($1::bigint), 'dropped', $2, $3) \
                 ON CONFLICT (hour) DO NOTHING RETURNING 1",
                &[&hour, &count(calls), &count(proxies)],
            )
            .await?;
        Ok(row.is_some())
    }
}

/// A counter as PostgreSQL's `bigint` (saturating: counts never get there).
fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sums of one (client, outcome) row of `usage_calls`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct CallSums {
    calls: i64,
    requested: i64,
    returned: i64,
}

/// The hour's `usage_calls` rows: calls and requested proxies per (client,
/// outcome), and the proxies returned (all by `ok` calls) from the proxy
/// counters.
fn call_rows(usage: &HourUsage) -> Vec<(&str, UsageOutcome, CallSums)> {
    let mut rows: BTreeMap<(&str, UsageOutcome), CallSums> = BTreeMap::new();
    for c in &usage.calls {
        let row = rows.entry((c.client.as_str(), c.outcome)).or_default();
        row.calls = row.calls.saturating_add(count(c.calls));
        row.requested = row
            .requested
            .saturating_add(count(c.calls).saturating_mul(i64::from(c.requested)));
    }
    for p in &usage.proxies {
        let row = rows
            .entry((p.client.as_str(), UsageOutcome::Ok))
            .or_default();
        row.returned = row.returned.saturating_add(count(p.proxies));
    }
    rows.into_iter().map(|((c, o), s)| (c, o, s)).collect()
}

/// Applies the migrations the database lacks, in one transaction holding
/// an advisory lock, so concurrent flushes migrate once.
async fn migrate(client: &mut Client) -> Result<(), AggregatesError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS proxy_pool_migrations (\
         version integer PRIMARY KEY, name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let applied: Vec<i32> = tx
        .query("SELECT version FROM proxy_pool_migrations", &[])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    for (version, name, sql) in MIGRATIONS {
        if applied.contains(&version) {
            continue;
        }
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO proxy_pool_migrations (version, name) VALUES ($1, $2)",
            &[&version, &name],
        )
        .await?;
        tracing::info!(version, name, "aggregates database migrated");
    }
    tx.commit().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{CallCounter, ProxyCounter};

    /// Every documented secret shape yields a URL; the URL never shows.
    #[test]
    fn secret_shapes() {
        let bare = database_url_from_secret("postgres://u:p@db:5432/x").unwrap();
        assert_eq!(
            bare,
            DatabaseUrl::parse("postgres://u:p@db:5432/x").unwrap()
        );
        let url = database_url_from_secret(r#"{"url":"postgresql://u:p@db/x"}"#).unwrap();
        assert_eq!(url, DatabaseUrl::parse("postgresql://u:p@db/x").unwrap());
        let rds = database_url_from_secret(
            r#"{"engine":"postgres","username":"app","password":"p@ss word","host":"db.example","port":5432,"dbname":"usage"}"#,
        )
        .unwrap();
        assert_eq!(
            rds,
            DatabaseUrl::parse(
                "postgres://app:p%40ss%20word@db.example:5432/usage?sslmode=require"
            )
            .unwrap()
        );
        assert_eq!(format!("{rds:?}"), "DatabaseUrl(<redacted>)");
        assert!(database_url_from_secret(r#"{"username":"app"}"#).is_err());
        assert!(database_url_from_secret("mysql://u:p@db/x").is_err());
        let err = database_url_from_secret("postgres://u:hunter2@db:notaport/x").unwrap_err();
        assert!(!err.to_string().contains("hunter2"));
    }

    /// Calls sum per (client, outcome); returned proxies join the `ok` row.
    #[test]
    fn call_rows_sum() {
        let usage = HourUsage {
            hour: 0,
            calls: vec![
                CallCounter {
                    client: "a".into(),
                    outcome: UsageOutcome::Ok,
                    requested: 2,
                    calls: 3,
                },
                CallCounter {
                    client: "a".into(),
                    outcome: UsageOutcome::Ok,
                    requested: 5,
                    calls: 1,
                },
                CallCounter {
                    client: "a".into(),
                    outcome: UsageOutcome::Short,
                    requested: 9,
                    calls: 1,
                },
            ],
            proxies: vec![ProxyCounter {
                client: "a".into(),
                upstream: "u".into(),
                protocol: "http".into(),
                region: "".into(),
                proxies: 8,
            }],
            unreadable: 0,
        };
        let rows = call_rows(&usage);
        assert_eq!(
            rows,
            vec![
                (
                    "a",
                    UsageOutcome::Ok,
                    CallSums {
                        calls: 4,
                        requested: 11,
                        returned: 8
                    }
                ),
                (
                    "a",
                    UsageOutcome::Short,
                    CallSums {
                        calls: 1,
                        requested: 9,
                        returned: 0
                    }
                ),
            ]
        );
    }
}
