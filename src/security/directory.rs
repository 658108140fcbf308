//! The Redis client registry: one entry per client (the registry document's
//! form) and one field per credential digest, in the Redis the pool already
//! uses (`{pp}:clients`, `{pp}:client`). A request's credential is found by
//! its digest in one script call, O(1) whatever the number of clients, and
//! read on every request, so an add, rotation, revocation or change of
//! limits is seen by the next request on every instance (no cache).
//!
//! Looking a digest up in a hash is not a constant-time comparison, and
//! need not be: the digest is SHA-256 of a high-entropy secret, so timing
//! says nothing usable about any stored one.

use super::credentials::CredentialHash;
use super::registry::{
    Client, ClientEntry, CredentialKind, RegistryError, lookup_field, parse_entries,
};
use crate::pool::{
    ClientStore, MAX_CLIENT_BATCH, PoolError, PutMode, PutOutcome, RedisPool, StoredClient,
};

/// The client registry held in Redis.
#[derive(Clone)]
pub struct RedisRegistry {
    store: ClientStore,
}

/// A registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// Redis failed.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// An entry (given or stored) is not a valid client entry.
    #[error(transparent)]
    Entry(#[from] RegistryError),
    /// Redis refused the change, and changed nothing.
    #[error("client {id}: {}", refusal(.reason))]
    Refused {
        /// The script's reason word.
        reason: String,
        /// The client it is about.
        id: String,
    },
}

/// What a refusal word of `lua/client_put.lua` means.
fn refusal(reason: &str) -> &'static str {
    match reason {
        "exists" => "is already registered",
        "unknown" => "is not registered",
        "taken" => "a credential belongs to another client",
        "duplicate" => "appears twice (or shares a credential) in the batch",
        _ => "refused as malformed",
    }
}

/// What an import did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Imported {
    /// Clients that were new.
    pub added: u64,
    /// Clients replaced.
    pub replaced: u64,
}

impl RedisRegistry {
    /// The registry in `pool`'s Redis.
    pub fn new(pool: RedisPool) -> Self {
        Self {
            store: ClientStore::new(&pool),
        }
    }

    /// The client owning `presented` of `kind`, by digest (one round trip).
    pub async fn authenticate(
        &self,
        kind: CredentialKind,
        presented: &[u8],
    ) -> Result<Option<Client>, DirectoryError> {
        let field = lookup_field(kind, &CredentialHash::of(presented));
        match self.store.by_credential(&field).await? {
            None => Ok(None),
            Some(json) => Ok(Some(ClientEntry::parse(&json)?)),
        }
    }

    /// Client `id`'s entry, if registered.
    pub async fn entry(&self, id: &str) -> Result<Option<ClientEntry>, DirectoryError> {
        match self.store.entry(id).await? {
            None => Ok(None),
            Some(json) => Ok(Some(serde_json::from_str(&json).map_err(|_| {
                RegistryError::from(format!("client {id}: stored entry is not valid"))
            })?)),
        }
    }

    /// Stores up to [`MAX_CLIENT_BATCH`] entries atomically: all, or none
    /// and the reason.
    pub async fn store(
        &self,
        mode: PutMode,
        entries: &[ClientEntry],
    ) -> Result<Imported, DirectoryError> {
        let batch = entries
            .iter()
            .map(|e| {
                e.check()
                    .map_err(|why| RegistryError::from(format!("client {}: {why}", e.id)))?;
                Ok(StoredClient {
                    id: e.id.clone(),
                    entry: serde_json::to_string(e)
                        .map_err(|_| RegistryError::from("unencodable entry".to_owned()))?,
                    credentials: e.credential_fields(),
                })
            })
            .collect::<Result<Vec<_>, DirectoryError>>()?;
        match self.store.put(mode, &batch).await? {
            PutOutcome::Stored { added, replaced } => Ok(Imported { added, replaced }),
            PutOutcome::Refused { reason, id } => Err(DirectoryError::Refused { reason, id }),
        }
    }

    /// Removes client `id` and every credential it owns: `Some(credentials
    /// removed)`, `None` when it is not registered.
    pub async fn revoke(&self, id: &str) -> Result<Option<u64>, DirectoryError> {
        Ok(self.store.revoke(id).await?)
    }

    /// Every entry, sorted by id.
    pub async fn list(&self) -> Result<Vec<ClientEntry>, DirectoryError> {
        let mut out = self
            .store
            .entries()
            .await?
            .into_iter()
            .map(|(id, json)| {
                serde_json::from_str(&json).map_err(|_| {
                    DirectoryError::from(RegistryError::from(format!(
                        "client {id}: stored entry is not valid"
                    )))
                })
            })
            .collect::<Result<Vec<ClientEntry>, _>>()?;
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    /// Adds or replaces every client of a registry document, in atomic
    /// batches of [`MAX_CLIENT_BATCH`] (the document is checked whole
    /// first; a refused batch stops the import, earlier batches stay).
    pub async fn import(&self, document: &str) -> Result<Imported, DirectoryError> {
        let entries = parse_entries(document)?;
        let mut total = Imported::default();
        for chunk in entries.chunks(MAX_CLIENT_BATCH) {
            let done = self.store(PutMode::Put, chunk).await?;
            total.added += done.added;
            total.replaced += done.replaced;
        }
        Ok(total)
    }
}
