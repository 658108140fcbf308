//! Why the aggregates database could not be used. Messages name kinds and
//! SQLSTATE codes, never a URL, a password, SQL text or a server's words.

use crate::config::InvalidDatabaseUrl;
use crate::pool::PoolError;

/// Why a flush or a usage query did not finish.
#[derive(Debug, thiserror::Error)]
pub enum AggregatesError {
    /// The database URL, its secret or the CA file cannot be used.
    #[error("aggregates database settings: {0}")]
    Settings(String),
    /// PostgreSQL unreachable, gone mid-way, too slow, or TLS failed.
    #[error("postgres unavailable: {0}")]
    Unavailable(String),
    /// PostgreSQL refused a statement or the login.
    #[error("postgres refused: SQLSTATE {0}")]
    Refused(String),
    /// The Redis side (reading or forgetting counters).
    #[error(transparent)]
    Pool(#[from] PoolError),
}

impl From<InvalidDatabaseUrl> for AggregatesError {
    fn from(e: InvalidDatabaseUrl) -> Self {
        Self::Settings(e.to_string())
    }
}

impl From<tokio_postgres::Error> for AggregatesError {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            let code = db.code().code();
            // Connection exceptions and shutdowns: the server, not the statement.
            if code.starts_with("08") || code.starts_with("57P") {
                return Self::Unavailable(format!("SQLSTATE {code}"));
            }
            return Self::Refused(code.to_owned());
        }
        if e.is_closed() {
            return Self::Unavailable("connection closed".into());
        }
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            if let Some(tls) = s.downcast_ref::<rustls::Error>() {
                return Self::Unavailable(format!("TLS: {tls}"));
            }
            if let Some(io) = s.downcast_ref::<std::io::Error>() {
                if let Some(tls) = io
                    .get_ref()
                    .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                {
                    return Self::Unavailable(format!("TLS: {tls}"));
                }
                return Self::Unavailable(format!("{:?}", io.kind()));
            }
            source = s.source();
        }
        Self::Unavailable("connection failed".into())
    }
}
