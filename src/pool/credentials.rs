//! Re-reading the Redis credentials after Redis refused them (a rotated
//! AUTH token), so a rotation needs no redeploy.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a fresh Redis URL comes from when Redis refuses the current
/// credentials (e.g. the Secrets Manager secret holding a rotated AUTH
/// token). `None`: nothing new could be read.
pub trait CredentialSource: Send + Sync {
    /// Reads the URL again.
    fn fresh_url(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>>;
}

/// Re-reading credentials after an authentication failure: at most one
/// read at a time, and at most one per [`CREDENTIAL_REREAD_EVERY`].
pub(super) struct Reread {
    pub(super) source: Arc<dyn CredentialSource>,
    pub(super) url: Mutex<String>,
    pub(super) last: Mutex<Option<Instant>>,
    pub(super) running: AtomicBool,
}

/// Least time between two re-reads of the credentials (the first one after
/// a failure is immediate).
pub const CREDENTIAL_REREAD_EVERY: Duration = Duration::from_secs(10);
