//! The Redis client registry's storage: credential digest -> client id
//! ([`PoolKeys::client_credentials`](super::keys::PoolKeys::client_credentials)) and client id -> entry
//! ([`PoolKeys::client_entries`](super::keys::PoolKeys::client_entries)), under the pool's own hash tag: each pool
//! (`PROXY_POOL_NAME`) has its own registry. Entries are opaque JSON here; the security
//! layer gives them meaning.

use super::error::PoolError;

use super::redis_pool::RedisPool;
use super::scripts;

/// Most clients sent to `lua/client_put.lua` per call.
pub const MAX_CLIENT_BATCH: usize = 1000;
/// Most credentials one client may hold.
pub const MAX_CLIENT_CREDENTIALS: usize = 64;
/// Entries asked for per `HSCAN` step of [`ClientStore::entries`].
const SCAN_COUNT: usize = 1000;

/// One client to store: its id, its entry (JSON) and the credential fields
/// (`"<kind>:<hex sha256>"`) that must resolve to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredClient {
    /// Client id.
    pub id: String,
    /// Its entry, JSON in the registry document's form.
    pub entry: String,
    /// Its credential fields.
    pub credentials: Vec<String>,
}

/// How [`ClientStore::put`] treats an id already registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutMode {
    /// Refuse it.
    Add,
    /// Require it.
    Replace,
    /// Either.
    Put,
}

/// The answer of [`ClientStore::put`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutOutcome {
    /// Stored: how many were new and how many replaced.
    Stored {
        /// New ids.
        added: u64,
        /// Ids replaced.
        replaced: u64,
    },
    /// Nothing stored: why (`exists`, `unknown`, `taken`, `duplicate`,
    /// `malformed`) and which id.
    Refused {
        /// The script's reason.
        reason: String,
        /// The client it is about.
        id: String,
    },
}

/// The Redis client registry's storage (one entry per client, credentials
/// by hash). Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct ClientStore {
    pool: RedisPool,
}

impl ClientStore {
    /// The client registry stored in `pool`'s Redis.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// The entry of the client owning credential `field`, one script call
    /// (`lua/client_lookup.lua`, two `HGET`s).
    pub async fn by_credential(&self, field: &str) -> Result<Option<String>, PoolError> {
        let mut inv = scripts::CLIENT_LOOKUP.prepare_invoke();
        inv.key(self.pool.keys().client_credentials())
            .key(self.pool.keys().client_entries())
            .arg(field);
        self.pool.invoke(&inv, true).await
    }

    /// The entry of client `id`, if registered.
    pub async fn entry(&self, id: &str) -> Result<Option<String>, PoolError> {
        let mut conn = self.pool.connection();
        self.pool
            .bounded(async {
                Ok(redis::cmd("HGET")
                    .arg(self.pool.keys().client_entries())
                    .arg(id)
                    .query_async(&mut conn)
                    .await?)
            })
            .await
    }

    /// Stores up to [`MAX_CLIENT_BATCH`] clients atomically (`lua/client_put.lua`):
    /// all or none.
    pub async fn put(
        &self,
        mode: PutMode,
        batch: &[StoredClient],
    ) -> Result<PutOutcome, PoolError> {
        if batch.is_empty()
            || batch.len() > MAX_CLIENT_BATCH
            || batch
                .iter()
                .any(|c| c.credentials.len() > MAX_CLIENT_CREDENTIALS)
        {
            return Err(PoolError::Internal("client batch out of range".into()));
        }
        let mut inv = scripts::CLIENT_PUT.prepare_invoke();
        inv.key(self.pool.keys().client_credentials())
            .key(self.pool.keys().client_entries())
            .arg(match mode {
                PutMode::Add => "add",
                PutMode::Replace => "replace",
                PutMode::Put => "put",
            });
        for c in batch {
            inv.arg(&c.id).arg(&c.entry).arg(c.credentials.len());
            for field in &c.credentials {
                inv.arg(field);
            }
        }
        // Repeating a put stores the same thing again.
        let reply: Vec<String> = self.pool.invoke(&inv, true).await?;
        let bad = || PoolError::Internal("unexpected client_put reply".into());
        match reply.as_slice() {
            [ok, added, replaced] if ok == "ok" => Ok(PutOutcome::Stored {
                added: added.parse().map_err(|_| bad())?,
                replaced: replaced.parse().map_err(|_| bad())?,
            }),
            [refused, reason, id] if refused == "refused" => Ok(PutOutcome::Refused {
                reason: reason.clone(),
                id: id.clone(),
            }),
            _ => Err(bad()),
        }
    }

    /// Removes client `id` and its credentials (`lua/client_revoke.lua`):
    /// `Some(credentials removed)`, or `None` when it is not registered.
    pub async fn revoke(&self, id: &str) -> Result<Option<u64>, PoolError> {
        let mut inv = scripts::CLIENT_REVOKE.prepare_invoke();
        inv.key(self.pool.keys().client_credentials())
            .key(self.pool.keys().client_entries())
            .arg(id);
        let removed: i64 = self.pool.invoke(&inv, false).await?;
        Ok(u64::try_from(removed).ok())
    }

    /// Every client entry, read in `HSCAN` steps (a client changed during
    /// the scan may be missed or seen twice, as `HSCAN` promises).
    pub async fn entries(&self) -> Result<Vec<(String, String)>, PoolError> {
        let mut out = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut conn = self.pool.connection();
            let (next, flat): (u64, Vec<String>) = self
                .pool
                .bounded(async {
                    Ok(redis::cmd("HSCAN")
                        .arg(self.pool.keys().client_entries())
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SCAN_COUNT)
                        .query_async(&mut conn)
                        .await?)
                })
                .await?;
            let mut pairs = flat.into_iter();
            while let (Some(id), Some(entry)) = (pairs.next(), pairs.next()) {
                out.push((id, entry));
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }
}
