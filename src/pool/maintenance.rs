//! Pool upkeep for the scheduled health check: pruning expired proxies
//! (`lua/prune.lua`) and counting the inventory extraction could draw from
//! (`lua/inventory.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;
use serde::Serialize;

use super::keys;
use super::redis_pool::{PoolError, RedisPool};

static PRUNE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../../lua/prune.lua")));
static INVENTORY: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/inventory.lua")));

/// Largest batch one `lua/prune.lua` call accepts (it bounds the script's run time).
pub const MAX_PRUNE_BATCH: u32 = 1000;

/// What [`RedisPool::prune_expired`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    /// Expired proxy records and tombstones deleted (with their expiry entries).
    pub records: u64,
    /// Expired entries removed from the allocatable index.
    pub index_entries: u64,
    /// Script calls made.
    pub batches: u32,
    /// `false` when the batch limit was reached with more left to prune.
    pub complete: bool,
}

/// One bucket of the allocatable index, as counted by `lua/inventory.lua`.
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
    /// Index entries with at least minRemainingTTL left: an upper bound of what
    /// extraction could hand out (it re-checks health age, safety margin and
    /// ownership per record).
    pub eligible: u64,
    /// All index entries of the bucket.
    pub indexed: u64,
}

/// The pool's inventory at one instant of the Redis clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Redis `TIME` when it was counted, Unix ms.
    pub at_ms: i64,
    /// One entry per bucket, sorted.
    pub buckets: Vec<BucketInventory>,
    /// Proxies held by Workers (CLAIMED or DRAINING).
    pub held: u64,
}

impl RedisPool {
    /// Loads the maintenance scripts (`SCRIPT LOAD`), so a later `EVALSHA`
    /// finds them; the extraction script is loaded by [`RedisPool::ping`].
    pub async fn load_maintenance_scripts(&self) -> Result<(), PoolError> {
        let mut conn = self.connection();
        self.bounded(async {
            PRUNE.load_async(&mut conn).await?;
            INVENTORY.load_async(&mut conn).await?;
            Ok(())
        })
        .await
    }

    /// Removes proxies whose TTL life is over, `batch` entries per script call
    /// (clamped to 1..=[`MAX_PRUNE_BATCH`]) and at most `max_batches` calls,
    /// so one run stays bounded however much has expired.
    pub async fn prune_expired(
        &self,
        batch: u32,
        max_batches: u32,
    ) -> Result<PruneReport, PoolError> {
        let batch = batch.clamp(1, MAX_PRUNE_BATCH);
        let mut report = PruneReport {
            complete: true,
            ..PruneReport::default()
        };
        while report.batches < max_batches {
            let mut inv = PRUNE.prepare_invoke();
            inv.key(keys::AVAIL)
                .key(keys::BUCKETS)
                .key(keys::PROXIES)
                .key(keys::EXPIRY)
                .key(keys::HELD)
                .arg(batch);
            // Repeating a prune after a dropped connection removes nothing twice.
            let (records, index_entries, more): (u64, u64, u8) = self.invoke(&inv, true).await?;
            report.batches += 1;
            report.records += records;
            report.index_entries += index_entries;
            report.complete = more == 0;
            if report.complete {
                break;
            }
        }
        Ok(report)
    }

    /// Counts, per bucket, the index entries extraction could draw from now.
    pub async fn inventory(&self, min_remaining_ttl: Duration) -> Result<Inventory, PoolError> {
        let mut inv = INVENTORY.prepare_invoke();
        inv.key(keys::AVAIL)
            .key(keys::BUCKETS)
            .key(keys::HELD)
            .arg(min_remaining_ttl.as_millis() as u64);
        let (at_ms, rows, held): (i64, Vec<(String, u64, u64)>, u64) =
            self.invoke(&inv, true).await?;
        let mut buckets = Vec::with_capacity(rows.len());
        for (bucket, eligible, indexed) in rows {
            let mut parts = bucket.split('|');
            let (Some(protocol), Some(region), Some(carrier), Some(upstream), None) = (
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
                parts.next(),
            ) else {
                // upsert.lua never writes such a name: skip it, and log no contents.
                tracing::warn!(len = bucket.len(), "malformed bucket in the pool index");
                continue;
            };
            buckets.push(BucketInventory {
                protocol: protocol.into(),
                region: region.into(),
                carrier: carrier.into(),
                upstream: upstream.into(),
                eligible,
                indexed,
            });
        }
        buckets.sort_by(|a, b| {
            (&a.upstream, &a.protocol, &a.region, &a.carrier).cmp(&(
                &b.upstream,
                &b.protocol,
                &b.region,
                &b.carrier,
            ))
        });
        Ok(Inventory {
            at_ms,
            buckets,
            held,
        })
    }
}
