//! The inventory `stats` prints: per combination (protocol, region,
//! carrier, upstream) what extraction could hand out now, what of it
//! expires within five minutes, and what is indexed but spent; grouped and
//! totalled by any of the four dimensions.
//!
//! `lua/inventory.lua` counts it all, a page of combinations per call, from
//! the index's deadline families: `eligible` is exactly what extraction
//! could take under the pool policy, `indexed` adds the entries whose
//! deadline has passed (stale health, past margin or minRemainingTTL) that
//! no prune removed yet. The pages are not one atomic snapshot: a pool that
//! changes meanwhile is counted as it was at each page.

use std::collections::BTreeMap;

use clap::ValueEnum;
use proxy_pool::pool::{BucketInventory, Maintenance, RedisPool};
use serde::Serialize;

/// A dimension of the pool to group by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Dimension {
    /// `http`, `https`, `socks5`.
    Protocol,
    /// Region ("" when unknown).
    Region,
    /// Carrier ("" when unknown).
    Carrier,
    /// Upstream provider.
    Upstream,
}

impl Dimension {
    /// The column and JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Protocol => "protocol",
            Self::Region => "region",
            Self::Carrier => "carrier",
            Self::Upstream => "upstream",
        }
    }

    fn of(self, row: &Row) -> &str {
        match self {
            Self::Protocol => &row.protocol,
            Self::Region => &row.region,
            Self::Carrier => &row.carrier,
            Self::Upstream => &row.upstream,
        }
    }
}

/// The counts `stats` reports, for a combination, a group or the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// What extraction could hand out now: indexed, at least minRemainingTTL
    /// left, within its safety margin, health checked recently enough.
    pub eligible: u64,
    /// Of `eligible`, those whose TTL ends within five minutes (see
    /// `BucketInventory::expiring_soon`).
    pub expiring_within_5_minutes: u64,
    /// Indexed, but past its deadline (margin, minRemainingTTL or health
    /// check age): never handed out, removed by the next prune.
    pub stale: u64,
    /// Every index entry (eligible, stale, and those with less than
    /// minRemainingTTL left).
    pub indexed: u64,
}

impl Counts {
    fn add(&mut self, other: &Self) {
        self.eligible += other.eligible;
        self.expiring_within_5_minutes += other.expiring_within_5_minutes;
        self.stale += other.stale;
        self.indexed += other.indexed;
    }
}

/// One combination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// Region, "" when unknown.
    pub region: String,
    /// Carrier, "" when unknown.
    pub carrier: String,
    /// Upstream provider.
    pub upstream: String,
    /// Its counts.
    #[serde(flatten)]
    pub counts: Counts,
}

/// The combinations sharing the values of the grouped dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Group {
    /// The values, one per grouped dimension, in the order asked for.
    pub key: Vec<String>,
    /// Combinations in the group.
    pub combinations: u64,
    /// Their counts, summed.
    #[serde(flatten)]
    pub counts: Counts,
}

/// The whole inventory at one moment (of the Redis clock, within the time
/// the reads take).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Redis `TIME` of the first count, Unix ms.
    pub at_ms: i64,
    /// Proxies held by Gateway Workers (the pool counts them as a whole).
    pub held: u64,
    /// Every combination in the index, sorted by upstream, protocol,
    /// region, carrier.
    pub rows: Vec<Row>,
    /// `false` when more entries were spent than one count reads, so that
    /// `eligible` counts some spent ones too (the next prune sets it right).
    pub exact: bool,
    /// The pool's records (indexed or not).
    pub records: u64,
    /// Proxies handed out whose tombstone the prune has not yet ended.
    pub tombstones: u64,
}

impl Inventory {
    /// Counts `pool` under its policy.
    pub async fn count(pool: &RedisPool) -> Result<Self, Box<dyn std::error::Error>> {
        let inventory = Maintenance::new(pool).inventory().await?;
        Ok(Self {
            at_ms: inventory.at_ms,
            held: inventory.held,
            rows: inventory.buckets.iter().map(row).collect(),
            exact: inventory.exact,
            records: inventory.records,
            tombstones: inventory.tombstones,
        })
    }

    /// The pool's totals.
    pub fn totals(&self) -> Counts {
        let mut total = Counts::default();
        for row in &self.rows {
            total.add(&row.counts);
        }
        total
    }
}

/// Groups `rows` by `by` (in that order), sorted by key.
pub fn group(rows: &[Row], by: &[Dimension]) -> Vec<Group> {
    let mut groups: BTreeMap<Vec<String>, Group> = BTreeMap::new();
    for row in rows {
        let key: Vec<String> = by.iter().map(|d| d.of(row).to_owned()).collect();
        let group = groups.entry(key.clone()).or_insert_with(|| Group {
            key,
            combinations: 0,
            counts: Counts::default(),
        });
        group.combinations += 1;
        group.counts.add(&row.counts);
    }
    groups.into_values().collect()
}

/// The groups `--top` leaves out, summed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rest {
    /// Groups left out.
    pub groups: u64,
    /// Their combinations.
    pub combinations: u64,
    /// Their counts, summed.
    #[serde(flatten)]
    pub counts: Counts,
}

/// The `n` groups with the most eligible proxies (ties: by key), and the
/// rest summed.
pub fn top(mut groups: Vec<Group>, n: usize) -> (Vec<Group>, Option<Rest>) {
    groups.sort_by(|a, b| {
        b.counts
            .eligible
            .cmp(&a.counts.eligible)
            .then_with(|| a.key.cmp(&b.key))
    });
    if groups.len() <= n {
        return (groups, None);
    }
    let mut rest = Rest {
        groups: 0,
        combinations: 0,
        counts: Counts::default(),
    };
    for g in groups.split_off(n) {
        rest.groups += 1;
        rest.combinations += g.combinations;
        rest.counts.add(&g.counts);
    }
    (groups, Some(rest))
}

/// One combination's row.
fn row(b: &BucketInventory) -> Row {
    Row {
        protocol: b.protocol.clone(),
        region: b.region.clone(),
        carrier: b.carrier.clone(),
        upstream: b.upstream.clone(),
        counts: Counts {
            eligible: b.eligible,
            expiring_within_5_minutes: b.expiring_soon.min(b.eligible),
            stale: b.indexed.saturating_sub(b.eligible),
            indexed: b.indexed,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A combination's row: spent entries are what is indexed and not
    /// eligible; what expires soon is never more than what is eligible.
    #[test]
    fn rows_from_the_inventory() {
        let bucket = |eligible, indexed, expiring_soon| BucketInventory {
            protocol: "http".into(),
            region: "shanghai".into(),
            carrier: "telecom".into(),
            upstream: "provider-a".into(),
            eligible,
            indexed,
            expiring_soon,
        };
        assert_eq!(
            super::row(&bucket(10, 12, 3)).counts,
            Counts {
                eligible: 10,
                expiring_within_5_minutes: 3,
                stale: 2,
                indexed: 12
            }
        );
        assert_eq!(
            super::row(&bucket(1, 4, 3))
                .counts
                .expiring_within_5_minutes,
            1
        );
    }

    fn row(p: &str, r: &str, u: &str, eligible: u64) -> Row {
        Row {
            protocol: p.into(),
            region: r.into(),
            carrier: "telecom".into(),
            upstream: u.into(),
            counts: Counts {
                eligible,
                indexed: eligible + 1,
                ..Counts::default()
            },
        }
    }

    /// Groups sum their combinations; top keeps the largest and sums the rest.
    #[test]
    fn groups_and_tops() {
        let rows = [
            row("http", "shanghai", "provider-a", 5),
            row("https", "shanghai", "provider-a", 1),
            row("http", "beijing", "provider-b", 9),
            row("http", "guangzhou", "provider-c", 2),
        ];
        let by_upstream = group(&rows, &[Dimension::Upstream]);
        assert_eq!(
            by_upstream
                .iter()
                .map(|g| (g.key[0].as_str(), g.combinations, g.counts.eligible))
                .collect::<Vec<_>>(),
            [
                ("provider-a", 2, 6),
                ("provider-b", 1, 9),
                ("provider-c", 1, 2)
            ]
        );
        let two = group(&rows, &[Dimension::Protocol, Dimension::Upstream]);
        assert_eq!(two[0].key, ["http", "provider-a"]);
        assert_eq!(two.len(), 4);
        let (shown, rest) = top(by_upstream, 2);
        assert_eq!(shown[0].key, ["provider-b"]);
        assert_eq!(shown[1].key, ["provider-a"]);
        let rest = rest.unwrap();
        assert_eq!(
            (rest.groups, rest.combinations, rest.counts.eligible),
            (1, 1, 2)
        );
        assert_eq!(rest.counts.indexed, 3);
        let (all, none) = top(group(&rows, &[Dimension::Region]), 3);
        assert_eq!(all.len(), 3);
        assert!(none.is_none());
    }
}
