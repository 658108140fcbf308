//! Names of the pool's Redis keys. All share one hash tag, so every script
//! touches a single Redis Cluster slot.

use sha2::{Digest, Sha256};

/// The hash tag every pool key starts with.
pub const HASH_TAG: &str = "{pp}";

/// `ZSET`, score 0: the allocatable index, one member per proxy that may be
/// handed out, `"<protocol>|<region>|<carrier>|<upstream>|<expiresAt ms, 13 digits>|<id>"`,
/// so each bucket is a lexicographic range sorted by expiry.
pub const AVAIL: &str = "{pp}:avail";
/// `HASH` bucket -> number of its members in [`AVAIL`].
pub const BUCKETS: &str = "{pp}:buckets";
/// `HASH` proxy id -> record (JSON), or a credential-free tombstone once extracted.
pub const PROXIES: &str = "{pp}:proxies";
/// `HASH` proxy id -> Worker id, for proxies CLAIMED or DRAINING.
pub const HELD: &str = "{pp}:held";
/// `HASH` bucket -> `"<expiresAt ms, 13 digits>|<id>"`, a lower bound of the
/// bucket's first entry in [`AVAIL`] that may still be eligible (`"~"`: none).
/// Written by extraction, lowered by every script that adds to [`AVAIL`]; it
/// only decides which buckets an extraction probes, never what it may take.
pub const HEADS: &str = "{pp}:heads";
/// `ZSET` proxy id -> expiresAt ms, for pruning expired records.
pub const EXPIRY: &str = "{pp}:expiry";

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
