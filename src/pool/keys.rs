//! Names of the pool's Redis keys. All share one hash tag, so every script
//! touches a single Redis Cluster slot.

use sha2::{Digest, Sha256};

/// The hash tag every pool key starts with.
pub const HASH_TAG: &str = "{pp}";

/// The pool layout these keys hold (`lua/prelude/base.lua`), recorded in
/// the pool's meta field with its policy: a pool of another layout is
/// refused, never misread.
pub const LAYOUT: &str = "2";

/// `HASH` proxy id -> its record: one fixed-format string holding its
/// state and details (`lua/prelude/record.lua`), or once it is handed out
/// its tombstone, kept until its expiry.
pub const RECORDS: &str = "{pp}:v2:rec";
/// `ZSET` locator -> the instant the record next needs attention: its
/// deadline while indexed (below 1e13), 1e13 + its expiry otherwise.
pub const DUE: &str = "{pp}:v2:due";
/// `ZSET` (lex) of the locators `<p>|<r>|<c>|<u>|<expiry>|<id>` of every
/// indexed proxy: one slice per combination, in expiry order.
pub const INDEX: &str = "{pp}:v2:ax";
/// `ZSET` (lex): the head (first entry) of every combination with indexed
/// proxies, in five groupings (`G|`, `P|<p>|`, `R|<p>|<r>|`, `C|<p>|<c>|`,
/// `U|<p>|<u>|`), each then `<expiry>|<id>|<p>|<r>|<c>|<u>`.
pub const HEADS: &str = "{pp}:v2:hd";
/// `HASH`: `<p>|<r>|<c>|<u>` -> `<head>\t<indexed entries>`; `P|<p>`,
/// `R|<p>|<r>`, `C|<p>|<c>`, `U|<p>|<u>` -> `<indexed entries>|<combinations
/// with a head>`; `V|<R, C or U>|<p>` -> the values with such a counter,
/// each after a newline; `held` -> records CLAIMED or DRAINING; `meta` ->
/// `<layout>|<maxHealthCheckAge ms>|<minRemainingTTL ms>`, recorded by the
/// first write.
pub const COUNTS: &str = "{pp}:v2:cnt";
/// `HASH` [`idempotency`] field -> a committed extraction for replay:
/// `<digest><in force until, 13 digits of ms><result>`.
pub const IDEMPOTENCY: &str = "{pp}:v2:idem";
/// `ZSET` [`idempotency`] field -> the instant its record stops being in force.
pub const IDEMPOTENCY_DUE: &str = "{pp}:v2:idemx";

/// The keys every pool script takes first, in the order `lua/prelude/base.lua`
/// names them. None carries a Redis TTL: under a `volatile-*` eviction
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

/// `HASH` hour (Unix s of its start) -> `"<calls> <proxies>"`: closed hours
/// of usage counters a flush saw but could not move to PostgreSQL, so a
/// later flush can tell what expired before it was moved.
pub const USAGE_UNFLUSHED: &str = "{pp}:usage:unflushed";

/// `HASH` of one hour's usage counters (`lua/extract.lua`, step 6), by the
/// Unix second its hour starts at.
pub fn usage_hour(hour_start_s: i64) -> String {
    format!("{HASH_TAG}:usage:{hour_start_s}")
}
/// `HASH` `"<kind>:<hex sha256>"` -> client id: every credential digest of
/// the Redis client registry (`kind` is `apiKey`, `bearer` or `basic`).
pub const CLIENT_CREDENTIALS: &str = "{pp}:clients";
/// `HASH` client id -> its entry (JSON, the registry document's form:
/// digests and settings, never a secret).
pub const CLIENT_ENTRIES: &str = "{pp}:client";

/// `STRING`: the global rate limit's theoretical arrival time (GCRA, ms).
pub const RATE_GLOBAL: &str = "{pp}:rl:global";

/// `STRING`: one client's rate limit state (client id hashed).
pub fn rate_client(client_id: &str) -> String {
    format!(
        "{HASH_TAG}:rl:client:{}",
        hex::encode(Sha256::digest(client_id.as_bytes()))
    )
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
}
