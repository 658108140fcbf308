//! Names of the pool's Redis keys. All share one hash tag, so every script
//! touches a single Redis Cluster slot.

use sha2::{Digest, Sha256};

/// The hash tag every pool key starts with.
pub const HASH_TAG: &str = "{pp}";

/// `HASH` proxy id -> details (JSON): exactly the fields an extraction
/// returns; deleted when the proxy is handed out.
pub const PROXIES: &str = "{pp}:proxies";
/// `HASH` proxy id -> state (JSON): health, margin, ownership; a tombstone
/// (`{"status":"EXTRACTED","expiresAt":…}`) once extracted.
pub const STATE: &str = "{pp}:state";
/// The fields of a proxy's details (in [`PROXIES`]): what an extraction returns.
pub const DETAIL_FIELDS: [&str; 10] = [
    "id",
    "protocol",
    "host",
    "port",
    "username",
    "password",
    "region",
    "carrier",
    "upstream",
    "expiresAt",
];
/// The fields a loader sets in a proxy's state (in [`STATE`]).
pub const STATE_FIELDS: [&str; 3] = ["safetyMarginSeconds", "healthCheckedAt", "healthOk"];
/// `ZSET` proxy id -> expiresAt ms: every proxy and tombstone, for pruning.
pub const EXPIRY: &str = "{pp}:expiry";
/// `HASH` proxy id -> Worker id, for proxies CLAIMED or DRAINING.
pub const HELD: &str = "{pp}:held";
/// Expiry family `pool` (lex `ZSET`): every indexed proxy, in expiry order.
pub const IX_POOL: &str = "{pp}:ix:pool";
/// Expiry family `region` (lex `ZSET`): one slice per region.
pub const IX_REGION: &str = "{pp}:ix:region";
/// Expiry family `kind` (lex `ZSET`): one slice per (protocol, carrier, upstream).
pub const IX_KIND: &str = "{pp}:ix:kind";
/// Expiry family `atom` (lex `ZSET`): one slice per (protocol, region, carrier,
/// upstream); its members are the entries' locators.
pub const IX_ATOM: &str = "{pp}:ix:atom";
/// `ZSET` locator -> deadline (the instant the entry stops being eligible):
/// the index itself, every indexed proxy once.
pub const IX_LIVE: &str = "{pp}:ix:live";
/// Deadline family `region` (lex `ZSET`): one slice per region, by deadline.
pub const IX_DREGION: &str = "{pp}:ix:dregion";
/// Deadline family `kind` (lex `ZSET`): one slice per kind, by deadline.
pub const IX_DKIND: &str = "{pp}:ix:dkind";
/// Deadline family `atom` (lex `ZSET`): one slice per combination, by deadline.
pub const IX_DATOM: &str = "{pp}:ix:datom";
/// `HASH` slice (`"<region>|"`, `"<p>|<c>|<u>|"` or `"<p>|<r>|<c>|<u>|"`) ->
/// lower bound of the slice's first entry: the order in which a many-slice
/// extraction probes, never what it may take. Exactly the slices that hold
/// entries have one.
pub const IX_HINT: &str = "{pp}:ix:hint";
/// `HASH` `"<protocol>|<region>|<carrier>|<upstream>|"` -> indexed entries.
pub const IX_ATOMS: &str = "{pp}:ix:atoms";
/// `HASH` protocol -> combinations in the index with it.
pub const IX_PROTOCOLS: &str = "{pp}:ix:vp";
/// `HASH` region -> combinations in the index with it.
pub const IX_REGIONS: &str = "{pp}:ix:vr";
/// `HASH` carrier -> combinations in the index with it.
pub const IX_CARRIERS: &str = "{pp}:ix:vc";
/// `HASH` upstream -> combinations in the index with it.
pub const IX_UPSTREAMS: &str = "{pp}:ix:vu";
/// `HASH` `"<protocol>|<carrier>|<upstream>"` -> combinations of that kind.
pub const IX_KINDS: &str = "{pp}:ix:kinds";
/// `STRING` `"<maxHealthCheckAge ms>|<minRemainingTTL ms>"`: the pool's
/// policy, recorded by the first write and kept while the pool holds anything.
pub const POLICY: &str = "{pp}:policy";

/// The keys every pool script takes first, in the order `lua/prelude.lua` names them.
pub const POOL: [&str; 20] = [
    PROXIES,
    STATE,
    EXPIRY,
    HELD,
    IX_POOL,
    IX_REGION,
    IX_KIND,
    IX_ATOM,
    IX_LIVE,
    IX_DREGION,
    IX_DKIND,
    IX_DATOM,
    IX_HINT,
    IX_ATOMS,
    IX_PROTOCOLS,
    IX_REGIONS,
    IX_CARRIERS,
    IX_UPSTREAMS,
    IX_KINDS,
    POLICY,
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

/// `STRING` holding one committed extraction for replay, scoped to a client
/// and its `Idempotency-Key` (hashed, so neither appears in key names).
pub fn idempotency(client_id: &str, key: &str) -> String {
    let mut h = Sha256::new();
    h.update(client_id.as_bytes());
    h.update([0]);
    h.update(key.as_bytes());
    format!("{HASH_TAG}:idem:{}", hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Client and key are both part of the scope, and nothing is ambiguous.
    #[test]
    fn idempotency_keys_are_scoped() {
        assert_ne!(idempotency("a", "bkey0000"), idempotency("b", "bkey0000"));
        assert_ne!(idempotency("ab", "c"), idempotency("a", "bc"));
        assert!(idempotency("a", "b").starts_with("{pp}:idem:"));
    }
}
