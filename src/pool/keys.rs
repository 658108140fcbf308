//! Names of the pool's Redis keys. All share one hash tag, so every script
//! touches a single Redis Cluster slot. The tag is the pool's name
//! (`PROXY_POOL_NAME`, [`PoolName`]): pools of different names share one
//! Redis Cluster, each on its own slot, and the product builds every key
//! name from its pool's [`PoolKeys`]. The constants below are the default
//! pool's (`pp`) names, kept for tests and documentation.
//!
//! This module only names the keys: docs/data-model.md ("The keys") is the
//! one description of each (its type, fields or members, and TTL), and
//! `tests/key_layout.rs` fails when the two disagree.

use sha2::{Digest, Sha256};

// The name is a setting (`PROXY_POOL_NAME`, or a CLI flag), so its type
// lives with the settings; every key below is built from it.
pub use crate::config::{InvalidPoolName, PoolName};

/// The default pool's hash tag, which every one of its keys starts with.
pub const HASH_TAG: &str = "{pp}";

/// The pool layout these keys hold (`lua/prelude/base.lua`), recorded in
/// the pool's meta field with its policy: a pool of another layout is
/// refused, never misread.
pub const LAYOUT: &str = "4";

/// The proxies' records (a proxy handed out has none: its tombstone is its
/// [`DUE`] member alone).
pub const RECORDS: &str = "{pp}:v4:rec";
/// When each record next needs attention (its deadline, or its expiry),
/// and each tombstone's expiry.
pub const DUE: &str = "{pp}:v4:due";
/// The index: the locators of the indexed proxies.
pub const INDEX: &str = "{pp}:v4:ax";
/// The head of every combination with indexed proxies.
pub const HEADS: &str = "{pp}:v4:hd";
/// The counts, and the pool's `meta` field (its layout and policy).
pub const COUNTS: &str = "{pp}:v4:cnt";
/// Committed extractions for replay, by [`idempotency`] field.
pub const IDEMPOTENCY: &str = "{pp}:v4:idem";
/// When each idempotency record stops being in force.
pub const IDEMPOTENCY_DUE: &str = "{pp}:v4:idemx";

/// The keys every pool script takes first, in the order `lua/prelude/base.lua`
/// binds them. None carries a Redis TTL: under a `volatile-*` eviction
/// policy only keys with one can be evicted, and losing any of these would
/// lose proxies or a guarantee. The scripts remove what expires.
pub const POOL: [&str; 7] = [
    RECORDS,
    DUE,
    INDEX,
    HEADS,
    COUNTS,
    IDEMPOTENCY,
    IDEMPOTENCY_DUE,
];

/// Closed hours of usage counters a flush saw but could not move to
/// PostgreSQL, so a later flush can tell what expired before it was moved.
pub const USAGE_UNFLUSHED: &str = "{pp}:usage:unflushed";

/// One hour's usage counters (written by `lua/extract.lua`), by the Unix
/// second its hour starts at.
pub fn usage_hour(hour_start_s: i64) -> String {
    usage_hour_under(HASH_TAG, hour_start_s)
}

fn usage_hour_under(hash_tag: &str, hour_start_s: i64) -> String {
    format!("{hash_tag}:usage:{hour_start_s}")
}
/// The credential digests of the Redis client registry.
pub const CLIENT_CREDENTIALS: &str = "{pp}:clients";
/// The client entries of the Redis client registry.
pub const CLIENT_ENTRIES: &str = "{pp}:client";

/// The global rate limit's state.
pub const RATE_GLOBAL: &str = "{pp}:rl:global";

/// One client's rate limit state (its id hashed).
pub fn rate_client(client_id: &str) -> String {
    rate_client_under(HASH_TAG, client_id)
}

fn rate_client_under(hash_tag: &str, client_id: &str) -> String {
    format!(
        "{hash_tag}:rl:client:{}",
        hex::encode(Sha256::digest(client_id.as_bytes()))
    )
}

/// Every key name of one pool, all under its hash tag; the constants of
/// this module describe each (they are the default pool's names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolKeys {
    hash_tag: String,
    pool: [String; 7],
    usage_unflushed: String,
    client_credentials: String,
    client_entries: String,
    rate_global: String,
}

impl PoolKeys {
    /// The keys of pool `name`.
    pub fn new(name: &PoolName) -> Self {
        let tag = name.hash_tag();
        let key = |suffix: &str| format!("{tag}:{suffix}");
        Self {
            pool: ["rec", "due", "ax", "hd", "cnt", "idem", "idemx"]
                .map(|s| key(&format!("v{LAYOUT}:{s}"))),
            usage_unflushed: key("usage:unflushed"),
            client_credentials: key("clients"),
            client_entries: key("client"),
            rate_global: key("rl:global"),
            hash_tag: tag,
        }
    }

    /// The hash tag every key starts with (`{<name>}`), as [`HASH_TAG`].
    pub fn hash_tag(&self) -> &str {
        &self.hash_tag
    }

    /// The keys every pool script takes first, as [`POOL`].
    pub fn pool(&self) -> [&str; 7] {
        self.pool.each_ref().map(String::as_str)
    }

    /// The proxy records, as [`RECORDS`].
    pub fn records(&self) -> &str {
        &self.pool[0]
    }

    /// The records' due instants and the tombstones, as [`DUE`].
    pub fn due(&self) -> &str {
        &self.pool[1]
    }

    /// The locators of indexed proxies, as [`INDEX`].
    pub fn index(&self) -> &str {
        &self.pool[2]
    }

    /// The counts and meta field, as [`COUNTS`].
    pub fn counts(&self) -> &str {
        &self.pool[4]
    }

    /// Closed hours a flush could not move, as [`USAGE_UNFLUSHED`].
    pub fn usage_unflushed(&self) -> &str {
        &self.usage_unflushed
    }

    /// One hour's usage counters, as [`usage_hour`].
    pub fn usage_hour(&self, hour_start_s: i64) -> String {
        usage_hour_under(&self.hash_tag, hour_start_s)
    }

    /// The registry's credential digests, as [`CLIENT_CREDENTIALS`].
    pub fn client_credentials(&self) -> &str {
        &self.client_credentials
    }

    /// The registry's client entries, as [`CLIENT_ENTRIES`].
    pub fn client_entries(&self) -> &str {
        &self.client_entries
    }

    /// The global rate limit's state, as [`RATE_GLOBAL`].
    pub fn rate_global(&self) -> &str {
        &self.rate_global
    }

    /// One client's rate limit state, as [`rate_client`].
    pub fn rate_client(&self, client_id: &str) -> String {
        rate_client_under(&self.hash_tag, client_id)
    }
}

impl Default for PoolKeys {
    fn default() -> Self {
        Self::new(&PoolName::default())
    }
}

/// The field of [`IDEMPOTENCY`] holding one committed extraction for
/// replay, scoped to a client and its `Idempotency-Key` (hashed, so neither
/// is stored).
pub fn idempotency(client_id: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(client_id.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client and key are both part of the scope, and nothing is ambiguous.
    #[test]
    fn idempotency_keys_are_scoped() {
        assert_ne!(idempotency("a", "bkey0000"), idempotency("b", "bkey0000"));
        assert_ne!(idempotency("ab", "c"), idempotency("a", "bc"));
        assert_eq!(idempotency("a", "b").len(), 64);
    }

    /// The default pool's keys are the constants, so neither can drift.
    #[test]
    fn default_pool_keys_are_the_constants() {
        let keys = PoolKeys::new(&PoolName::parse("pp").unwrap());
        assert_eq!(keys, PoolKeys::default());
        assert_eq!(keys.hash_tag(), HASH_TAG);
        assert_eq!(keys.pool(), POOL);
        assert_eq!(
            [keys.records(), keys.due(), keys.index(), keys.counts()],
            [RECORDS, DUE, INDEX, COUNTS]
        );
        assert_eq!(keys.usage_unflushed(), USAGE_UNFLUSHED);
        assert_eq!(keys.usage_hour(3600), usage_hour(3600));
        assert_eq!(keys.client_credentials(), CLIENT_CREDENTIALS);
        assert_eq!(keys.client_entries(), CLIENT_ENTRIES);
        assert_eq!(keys.rate_global(), RATE_GLOBAL);
        assert_eq!(keys.rate_client("c1"), rate_client("c1"));
    }

    /// Another name moves every key under its own tag, and only valid
    /// names are accepted.
    #[test]
    fn named_pools_have_their_own_keys() {
        let keys = PoolKeys::new(&PoolName::parse("eu-West_2").unwrap());
        assert_eq!(keys.hash_tag(), "{eu-West_2}");
        assert_eq!(keys.records(), "{eu-West_2}:v4:rec");
        assert_eq!(keys.pool()[6], "{eu-West_2}:v4:idemx");
        assert_eq!(keys.usage_hour(7200), "{eu-West_2}:usage:7200");
        assert!(keys.rate_client("c1").starts_with("{eu-West_2}:rl:client:"));
        assert!(PoolName::parse(&"a".repeat(32)).is_ok());
        for bad in ["", "a b", "a}", "{a", "a:b", "é", &"a".repeat(33)] {
            assert_eq!(PoolName::parse(bad), Err(InvalidPoolName), "{bad:?}");
        }
    }
}
