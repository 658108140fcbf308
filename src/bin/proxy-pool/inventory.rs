//! The inventory `stats` prints: per combination (protocol, region,
//! carrier, upstream) what extraction could hand out now, what of it
//! expires within five minutes, and what is indexed but stale; grouped and
//! totalled by any of the four dimensions.
//!
//! `lua/inventory.lua` counts, per combination, the index entries expiring
//! late enough (`eligible`) and all of them (`indexed`); it cannot see
//! health ages or safety margins, which the scheduled health check prunes
//! before it counts. `stats` does not prune (it only reads), so it finds
//! the stale entries itself: the due members of the index's two time sets
//! (`usable` by safety margin, `checked` by health check age, as
//! `lua/prelude.lua` describes them) that are still indexed, judged by the
//! rules `lua/prune.lua` applies. It reads pages of them, so its cost is
//! that of the stale entries, nothing when the pool is fresh. The reads are
//! not one atomic snapshot: a pool that changes meanwhile is counted as it
//! was at each page.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use clap::ValueEnum;
use proxy_pool::pool::{BucketInventory, RedisPool, keys};
use serde::Serialize;

/// What "expiring soon" means: within this much of the Redis clock.
pub const SOON: Duration = Duration::from_secs(300);
/// Time-set members read (and checked against the index) per call.
const STALE_PAGE: usize = 10_000;

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
    /// Of `eligible`, those whose TTL ends within five minutes.
    pub expiring_within_5_minutes: u64,
    /// Indexed, but past the safety margin or with a health check older
    /// than maxHealthCheckAge: never handed out, removed by the next prune.
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
}

impl Inventory {
    /// Counts `pool`: eligible with `min_ttl` left, and stale by `max_age`.
    pub async fn count(
        pool: &RedisPool,
        min_ttl: Duration,
        max_age: Duration,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let now = pool.inventory(min_ttl).await?;
        let soon_ttl = min_ttl.max(SOON);
        let later = if soon_ttl == min_ttl {
            now.clone()
        } else {
            pool.inventory(soon_ttl).await?
        };
        let stale = StaleEntries::read(pool, max_age, min_ttl, soon_ttl).await?;
        Ok(Self {
            at_ms: now.at_ms,
            held: now.held,
            rows: merge(&now.buckets, &later.buckets, &stale.by_combination),
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

/// Stale index entries of one combination.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct StaleCount {
    /// Stale entries.
    entries: u64,
    /// Of them, those `lua/inventory.lua` counted as eligible (expiring at
    /// or after now + minRemainingTTL).
    counted_eligible: u64,
    /// Of them, those it counted with five minutes' TTL asked for.
    counted_later: u64,
}

/// Every stale index entry, by combination (`p|r|c|u`).
struct StaleEntries {
    by_combination: HashMap<String, StaleCount>,
}

impl StaleEntries {
    /// Reads the due members of the time sets and keeps those still
    /// indexed: `usable` up to now (past the safety margin), `checked`
    /// before now - `max_age` (health check too old), each entry once.
    async fn read(
        pool: &RedisPool,
        max_age: Duration,
        min_ttl: Duration,
        later_ttl: Duration,
    ) -> Result<Self, redis::RedisError> {
        let mut conn = pool.connection();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let now = secs * 1000 + micros / 1000;
        let health_cutoff = now - max_age.as_millis() as i64;
        // lua/inventory.lua counts an entry expiring at or after now + TTL (at least 1 ms).
        let eligible_from = now + (min_ttl.as_millis() as i64).max(1);
        let later_from = now + (later_ttl.as_millis() as i64).max(1);
        let mut stale = Self {
            by_combination: HashMap::new(),
        };
        let mut classify = |locator: &str| {
            // "<protocol>|<region>|<carrier>|<upstream>|<expiry, 13 digits>|<id>"
            let mut fields = locator.rsplitn(3, '|');
            let (Some(_id), Some(expiry), Some(combination)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return;
            };
            let Ok(expiry) = expiry.parse::<i64>() else {
                return;
            };
            let count = stale
                .by_combination
                .entry(combination.to_owned())
                .or_default();
            count.entries += 1;
            if expiry >= eligible_from {
                count.counted_eligible += 1;
            }
            if expiry >= later_from {
                count.counted_later += 1;
            }
        };
        // Health too old: every due member still in the index.
        let due = due_count(&mut conn, keys::IX_CHECKED, &format!("({health_cutoff}")).await?;
        for start in (0..due).step_by(STALE_PAGE) {
            let page = ranks(&mut conn, keys::IX_CHECKED, start, due).await?;
            let indexed = scores(&mut conn, keys::IX_ATOM, &page).await?;
            for (locator, score) in page.iter().zip(&indexed) {
                if score.is_some() {
                    classify(locator);
                }
            }
        }
        // Past the safety margin: those still indexed and not counted above.
        let due = due_count(&mut conn, keys::IX_USABLE, &now.to_string()).await?;
        for start in (0..due).step_by(STALE_PAGE) {
            let page = ranks(&mut conn, keys::IX_USABLE, start, due).await?;
            let indexed = scores(&mut conn, keys::IX_ATOM, &page).await?;
            let checked = scores(&mut conn, keys::IX_CHECKED, &page).await?;
            for ((locator, indexed), checked) in page.iter().zip(&indexed).zip(&checked) {
                let counted = checked.is_some_and(|at| at < health_cutoff as f64);
                if indexed.is_some() && !counted {
                    classify(locator);
                }
            }
        }
        Ok(stale)
    }
}

/// How many members of `set` score up to `bound`: they are its first
/// ranks, read a page at a time by rank (O(log N) a page, where paging by
/// score with an offset would walk the offset again on every page).
async fn due_count(
    conn: &mut proxy_pool::pool::PoolConnection,
    set: &str,
    bound: &str,
) -> Result<usize, redis::RedisError> {
    redis::cmd("ZCOUNT")
        .arg(set)
        .arg("-inf")
        .arg(bound)
        .query_async(conn)
        .await
}

/// The members of `set` ranked `start` to `start + STALE_PAGE` (below `end`).
async fn ranks(
    conn: &mut proxy_pool::pool::PoolConnection,
    set: &str,
    start: usize,
    end: usize,
) -> Result<Vec<String>, redis::RedisError> {
    redis::cmd("ZRANGE")
        .arg(set)
        .arg(start)
        .arg(end.min(start + STALE_PAGE) - 1)
        .query_async(conn)
        .await
}

/// The scores of `members` in `set` (`None`: not a member), one call.
async fn scores(
    conn: &mut proxy_pool::pool::PoolConnection,
    set: &str,
    members: &[String],
) -> Result<Vec<Option<f64>>, redis::RedisError> {
    if members.is_empty() {
        return Ok(Vec::new());
    }
    redis::cmd("ZMSCORE")
        .arg(set)
        .arg(members)
        .query_async(conn)
        .await
}

/// One row per combination: eligible and expiring counts from the two
/// inventory passes (now + minRemainingTTL, now + five minutes), less the
/// stale entries each pass counted.
fn merge(
    now: &[BucketInventory],
    later: &[BucketInventory],
    stale: &HashMap<String, StaleCount>,
) -> Vec<Row> {
    let combination =
        |b: &BucketInventory| format!("{}|{}|{}|{}", b.protocol, b.region, b.carrier, b.upstream);
    let later: HashMap<String, u64> = later.iter().map(|b| (combination(b), b.eligible)).collect();
    now.iter()
        .map(|b| {
            let key = combination(b);
            let s = stale.get(&key).copied().unwrap_or_default();
            let eligible = b.eligible.saturating_sub(s.counted_eligible);
            let eligible_later = later
                .get(&key)
                .copied()
                .unwrap_or(0)
                .saturating_sub(s.counted_later)
                .min(eligible);
            Row {
                protocol: b.protocol.clone(),
                region: b.region.clone(),
                carrier: b.carrier.clone(),
                upstream: b.upstream.clone(),
                counts: Counts {
                    eligible,
                    expiring_within_5_minutes: eligible - eligible_later,
                    stale: s.entries.min(b.indexed),
                    indexed: b.indexed,
                },
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(p: &str, r: &str, u: &str, eligible: u64, indexed: u64) -> BucketInventory {
        BucketInventory {
            protocol: p.into(),
            region: r.into(),
            carrier: "telecom".into(),
            upstream: u.into(),
            eligible,
            indexed,
        }
    }

    /// The two passes and the stale entries make one row per combination:
    /// stale entries come off what each pass counted as eligible.
    #[test]
    fn merges_passes_and_stale_entries() {
        let now = [
            bucket("http", "shanghai", "provider-a", 10, 12),
            bucket("socks5", "beijing", "provider-b", 4, 4),
        ];
        let later = [bucket("http", "shanghai", "provider-a", 7, 12)];
        let stale = HashMap::from([(
            "http|shanghai|telecom|provider-a".to_owned(),
            StaleCount {
                entries: 3,
                counted_eligible: 2,
                counted_later: 1,
            },
        )]);
        let rows = merge(&now, &later, &stale);
        assert_eq!(
            rows[0].counts,
            Counts {
                eligible: 8,
                expiring_within_5_minutes: 2,
                stale: 3,
                indexed: 12
            }
        );
        // Absent from the later pass: all of it expires within five minutes.
        assert_eq!(
            rows[1].counts,
            Counts {
                eligible: 4,
                expiring_within_5_minutes: 4,
                stale: 0,
                indexed: 4
            }
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
