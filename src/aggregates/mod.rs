//! Usage aggregates in PostgreSQL, off the extraction path.
//!
//! Extraction counts its outcome in Redis, inside its own script call
//! (`lua/extract.lua`, hourly hashes `{pp}:usage:<hour>`, see
//! [`crate::pool::UsageScope`]); nothing on that path knows PostgreSQL. The
//! scheduled invocation and `proxy-pool aggregates flush` move closed hours
//! here ([`Aggregates::flush`], the protocol in `flush.rs`), and `proxy-pool
//! usage` reads them back ([`Aggregates::usage`]). Only counts by client,
//! outcome, upstream, protocol and region are stored: never a proxy's id,
//! address or credentials, never a per-extraction record.

mod database;
mod error;
mod flush;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::Config;
use crate::secrets::SecretStore;

pub use database::{DatabaseUrl, database_url_from_secret};
pub use error::AggregatesError;
pub use flush::FlushReport;
pub use report::{Dimension, UsageQuery, UsageTable};

/// How to use the aggregates database (everything but where it is).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AggregatesOptions {
    /// PEM CA bundle trusted for TLS instead of the system's roots (RDS:
    /// Amazon's RDS CA bundle).
    pub ca_file: Option<PathBuf>,
    /// How long an hour's counters may wait in Redis for a flush.
    pub retention: Duration,
    /// Bound on one flush's (or query's) PostgreSQL work, connecting included.
    pub timeout: Duration,
}

impl Config {
    /// How to use the aggregates database (everything but where it is).
    pub fn aggregates_options(&self) -> AggregatesOptions {
        AggregatesOptions {
            ca_file: self.aggregates_ca_file.clone(),
            retention: self.aggregates_retention,
            timeout: self.aggregates_timeout,
        }
    }
}

/// Where the database URL comes from.
#[derive(Clone)]
pub enum DatabaseSource {
    /// Given directly (`PROXY_POOL_AGGREGATES_DATABASE_URL`).
    Url(DatabaseUrl),
    /// A Secrets Manager secret, read at every flush (so a rotated
    /// password is picked up).
    Secret {
        /// The client.
        store: SecretStore,
        /// `PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID`.
        id: String,
    },
}

impl DatabaseSource {
    async fn url(&self) -> Result<DatabaseUrl, AggregatesError> {
        match self {
            Self::Url(url) => Ok(url.clone()),
            Self::Secret { store, id } => {
                let secret = store.fetch(id).await.map_err(|e| {
                    AggregatesError::Settings(format!(
                        "PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID: {e}"
                    ))
                })?;
                database_url_from_secret(&secret)
            }
        }
    }
}

/// The aggregates database and how to reach it: flushes and usage queries.
pub struct Aggregates {
    source: DatabaseSource,
    options: AggregatesOptions,
    tls: OnceCell<MakeRustlsConnect>,
}

impl Aggregates {
    /// Nothing is contacted until the first flush or query.
    pub fn new(source: DatabaseSource, options: AggregatesOptions) -> Self {
        Self {
            source,
            options,
            tls: OnceCell::new(),
        }
    }

    /// The TLS connector, built once (the CA file or system roots read once).
    async fn tls(&self) -> Result<MakeRustlsConnect, AggregatesError> {
        self.tls
            .get_or_try_init(|| async { database::tls_connector(self.options.ca_file.as_deref()) })
            .await
            .cloned()
    }
}
