//! Pool upkeep for the scheduled health check: pruning expired proxies
//! (`lua/prune.lua`) and counting the inventory extraction could draw from
//! (`lua/inventory.lua`).

use std::time::{Duration, Instant};

use serde::Serialize;

use super::error::PoolError;
use super::redis_pool::RedisPool;
use super::scripts;

/// Largest batch one `lua/prune.lua` call accepts (it bounds the script's run time).
pub const MAX_PRUNE_BATCH: u32 = 1000;
/// Combinations `lua/inventory.lua` counts per call.
const INVENTORY_PAGE: u32 = 500;
/// One `lua/inventory.lua` reply: Redis time, (combination, eligible,
/// indexed, expiring soon) rows, proxies held, the cursor of the next page,
/// whether `eligible` is exact (1), the live records and the tombstones.
type InventoryPage = (i64, Vec<(String, u64, u64, u64)>, u64, String, u8, u64, u64);
/// What the inventory counts as expiring soon: within five minutes.
pub const EXPIRING_WITHIN: Duration = Duration::from_secs(300);

/// What [`Maintenance::prune_expired`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    /// Expired proxy records and tombstones deleted (with their expiry entries).
    pub records: u64,
    /// Spent entries taken out of the allocatable index.
    pub index_entries: u64,
    /// Idempotency records out of force deleted.
    pub idempotency_records: u64,
    /// Script calls made.
    pub batches: u32,
    /// `false` when the batch limit was reached with more left to prune.
    pub complete: bool,
}

/// One combination (protocol, region, carrier, upstream) of the index, as
/// counted by `lua/inventory.lua`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BucketInventory {
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// Region, "" when unknown.
    pub region: String,
    /// Carrier, "" when unknown.
    pub carrier: String,
    /// Upstream provider.
    pub upstream: String,
    /// Index entries whose deadline is ahead: exactly what extraction could
    /// hand out now under the pool policy.
    pub eligible: u64,
    /// All index entries of the combination (spent ones too, until pruned).
    pub indexed: u64,
    /// Of `eligible`, about those expiring within [`EXPIRING_WITHIN`]:
    /// counted in expiry order, where an entry spent since the last prune
    /// may still be, so at most `eligible` and exact on a pruned pool.
    pub expiring_soon: u64,
}

/// The pool's inventory at one instant of the Redis clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Redis `TIME` when it was counted, Unix ms.
    pub at_ms: i64,
    /// One entry per combination in the index, sorted.
    pub buckets: Vec<BucketInventory>,
    /// Proxies held by Workers (CLAIMED or DRAINING).
    pub held: u64,
    /// `false` when so many entries were spent (a stalled health checker, no
    /// prune yet) that `eligible` also counts some spent ones.
    pub exact: bool,
    /// The pool's records: proxies it holds, indexed or not (as the last
    /// page counted them).
    pub records: u64,
    /// Proxies handed out whose TTL life the prune has not yet ended: each
    /// keeps a tombstone until its expiry, the pool's one memory that grows
    /// with traffic rather than with its size (docs/operations.md).
    pub tombstones: u64,
}

/// The scheduled job's upkeep of the pool: prune and inventory. Cheap to
/// clone; clones share the connection.
#[derive(Clone)]
pub struct Maintenance {
    pool: RedisPool,
}

impl Maintenance {
    /// Upkeep of `pool`.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// Loads the maintenance scripts (the function library, or `SCRIPT
    /// LOAD` where Functions are refused); the extraction script is loaded
    /// by [`RedisPool::ping`].
    pub async fn load_scripts(&self) -> Result<(), PoolError> {
        let mut conn = self.pool.connection();
        self.pool
            .bounded(async {
                self.pool
                    .load_scripts(&mut conn, &[&scripts::PRUNE, &scripts::INVENTORY])
                    .await
            })
            .await
    }

    /// Removes proxies whose TTL life is over, and index entries past their
    /// deadline (expired, past their margin or minRemainingTTL, or with a
    /// health check older than the pool policy allows), `batch` entries per
    /// sweep per script call (clamped to 1..=[`MAX_PRUNE_BATCH`]; ended
    /// records and tombstones four times as many, at most 1,000), until
    /// done, `max_batches` calls or (if given) `budget` of wall time, so one
    /// run stays bounded however much is due. Nothing waits for it: counts
    /// and walks leave spent entries out.
    pub async fn prune_expired(
        &self,
        batch: u32,
        max_batches: u32,
        budget: Option<Duration>,
    ) -> Result<PruneReport, PoolError> {
        let started = Instant::now();
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let mut report = PruneReport {
            complete: true,
            ..PruneReport::default()
        };
        while report.batches < max_batches {
            let mut inv = self.pool.invocation(&scripts::PRUNE);
            inv.arg(batch);
            // Repeating a prune after a dropped connection removes nothing twice.
            let (records, index_entries, idempotency_records, more): (u64, u64, u64, u8) =
                self.pool.invoke(&inv, true).await?;
            report.batches += 1;
            report.records += records;
            report.index_entries += index_entries;
            report.idempotency_records += idempotency_records;
            report.complete = more == 0;
            if report.complete || budget.is_some_and(|b| started.elapsed() >= b) {
                break;
            }
        }
        Ok(report)
    }

    /// Counts, per combination, the index entries extraction could draw
    /// from now under the pool policy: one script call per page of
    /// combinations.
    pub async fn inventory(&self) -> Result<Inventory, PoolError> {
        // By combination: a scan may report one twice.
        let mut buckets = std::collections::BTreeMap::new();
        let mut cursor = "0".to_owned();
        let mut exact = true;
        loop {
            let mut inv = self.pool.invocation(&scripts::INVENTORY);
            inv.arg(&cursor)
                .arg(INVENTORY_PAGE)
                .arg(EXPIRING_WITHIN.as_millis() as u64);
            let (at_ms, rows, held, next, page_exact, records, tombstones): InventoryPage =
                self.pool.invoke(&inv, true).await?;
            exact &= page_exact == 1;
            for (combination, eligible, indexed, soon) in rows {
                let mut parts = combination.split('|');
                let (Some(protocol), Some(region), Some(carrier), Some(upstream), None) = (
                    parts.next(),
                    parts.next(),
                    parts.next(),
                    parts.next(),
                    parts.next(),
                ) else {
                    // The script only reports combinations' counters: log no contents.
                    tracing::warn!(
                        len = combination.len(),
                        "malformed combination in the pool counters"
                    );
                    continue;
                };
                buckets.insert(
                    combination.clone(),
                    BucketInventory {
                        protocol: protocol.into(),
                        region: region.into(),
                        carrier: carrier.into(),
                        upstream: upstream.into(),
                        eligible,
                        indexed,
                        expiring_soon: soon.min(eligible),
                    },
                );
            }
            if next == "0" {
                return Ok(Inventory {
                    at_ms,
                    buckets: sorted_buckets(buckets),
                    held,
                    exact,
                    records,
                    tombstones,
                });
            }
            cursor = next;
        }
    }
}

/// The combinations' counts sorted by upstream, protocol, region, carrier.
fn sorted_buckets(
    buckets: std::collections::BTreeMap<String, BucketInventory>,
) -> Vec<BucketInventory> {
    let mut buckets: Vec<BucketInventory> = buckets.into_values().collect();
    buckets.sort_by(|a, b| {
        (&a.upstream, &a.protocol, &a.region, &a.carrier).cmp(&(
            &b.upstream,
            &b.protocol,
            &b.region,
            &b.carrier,
        ))
    });
    buckets
}
