//! Usage counters in Redis (one hash per hour, `{pp}:usage:<hour>`, counted
//! into by `lua/extract.lua` in the scope `query::UsageScope` names): the
//! Redis side of moving closed hours elsewhere: which hours are closed
//! (`lua/usage_backlog.lua`), reading one, forgetting one, and remembering
//! the hours a flush could not move.
//!
//! Fields of an hour's hash (written only by `lua/extract.lua`):
//! `f|<client>|<requested>|<upstream>|<protocol>|<region>` -> commits that
//! got all `requested` proxies from that one tuple (one increment for the
//! common call); otherwise `c|<client>|<outcome>|<requested>` -> calls,
//! and `p|<client>|<upstream>|<protocol>|<region>` -> proxies handed out.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::error::PoolError;
use super::query::{HOUR_S, hour_of};
use super::redis_pool::RedisPool;
use super::scripts;

/// An hour is closed (never counted into again) this long after it ends:
/// a margin for a Redis clock that steps back, e.g. after a failover.
pub(crate) const CLOSE_GRACE_S: i64 = 120;
/// Fields read per `HSCAN` call.
const SCAN_PAGE: usize = 1000;

/// How a counted extraction call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum UsageOutcome {
    /// Committed (possibly zero proxies, under `partial`).
    Ok,
    /// `allOrNothing` refused for lack of inventory (409).
    Short,
    /// An `Idempotency-Key` replay: nothing extracted.
    Replay,
}

impl UsageOutcome {
    /// The name in counter fields and in PostgreSQL.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Short => "short",
            Self::Replay => "replay",
        }
    }

    /// Parses [`UsageOutcome::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Ok, Self::Short, Self::Replay]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

/// Calls of one client with one outcome and one requested count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallCounter {
    /// The client's usage label.
    pub client: String,
    /// How the calls ended.
    pub outcome: UsageOutcome,
    /// The `count` they asked for.
    pub requested: u32,
    /// How many.
    pub calls: u64,
}

/// Proxies of one (upstream, protocol, region) handed to one client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyCounter {
    /// The client's usage label.
    pub client: String,
    /// Upstream provider.
    pub upstream: String,
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// Region ("" when unknown).
    pub region: String,
    /// How many.
    pub proxies: u64,
}

/// One hour's counters as Redis holds them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HourUsage {
    /// The hour, Unix seconds of its start.
    pub hour: i64,
    /// Call counters.
    pub calls: Vec<CallCounter>,
    /// Proxy counters.
    pub proxies: Vec<ProxyCounter>,
    /// Fields that are neither (damaged from outside), left out.
    pub unreadable: u64,
}

impl HourUsage {
    /// Calls counted in the hour.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().map(|c| c.calls).sum()
    }

    /// Proxies handed out in the hour.
    pub fn total_proxies(&self) -> u64 {
        self.proxies.iter().map(|p| p.proxies).sum()
    }

    /// The counters of an hour's fields (each field once), merged and sorted.
    fn from_fields<'a>(hour: i64, fields: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        type CallKey<'a> = (&'a str, UsageOutcome, u32);
        type ProxyKey<'a> = (&'a str, &'a str, &'a str, &'a str);
        let mut calls: BTreeMap<CallKey<'a>, u64> = BTreeMap::new();
        let mut proxies: BTreeMap<ProxyKey<'a>, u64> = BTreeMap::new();
        let mut unreadable = 0;
        for (field, value) in fields {
            let Ok(n) = value.parse::<u64>() else {
                unreadable += 1;
                continue;
            };
            let parts: Vec<&str> = field.split('|').collect();
            match parts.as_slice() {
                ["f", client, requested, upstream, protocol, region] if !client.is_empty() => {
                    let Ok(requested) = requested.parse::<u32>() else {
                        unreadable += 1;
                        continue;
                    };
                    *calls
                        .entry((client, UsageOutcome::Ok, requested))
                        .or_default() += n;
                    *proxies
                        .entry((client, upstream, protocol, region))
                        .or_default() += n.saturating_mul(u64::from(requested));
                }
                ["c", client, outcome, requested] if !client.is_empty() => {
                    match (UsageOutcome::parse(outcome), requested.parse::<u32>()) {
                        (Some(outcome), Ok(requested)) => {
                            *calls.entry((client, outcome, requested)).or_default() += n;
                        }
                        _ => unreadable += 1,
                    }
                }
                ["p", client, upstream, protocol, region] if !client.is_empty() => {
                    *proxies
                        .entry((client, upstream, protocol, region))
                        .or_default() += n;
                }
                _ => unreadable += 1,
            }
        }
        Self {
            hour,
            calls: calls
                .into_iter()
                .map(|((client, outcome, requested), calls)| CallCounter {
                    client: client.into(),
                    outcome,
                    requested,
                    calls,
                })
                .collect(),
            proxies: proxies
                .into_iter()
                .map(
                    |((client, upstream, protocol, region), proxies)| ProxyCounter {
                        client: client.into(),
                        upstream: upstream.into(),
                        protocol: protocol.into(),
                        region: region.into(),
                        proxies,
                    },
                )
                .collect(),
            unreadable,
        }
    }
}

/// The hours of counters Redis holds, at the Redis clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageBacklog {
    /// Redis `TIME`, Unix ms.
    pub now_ms: i64,
    /// Closed hours whose hash exists, oldest first.
    pub closed: Vec<i64>,
    /// Hours still open (counted into) whose hash exists.
    pub open: u32,
    /// Hours an earlier flush saw closed but could not move, with the
    /// calls and proxies it saw in them.
    pub unflushed: BTreeMap<i64, (u64, u64)>,
}

/// The hourly usage counters extraction writes, as the flush reads and
/// forgets them. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct UsageStore {
    pool: RedisPool,
}

impl UsageStore {
    /// The usage counters of `pool`.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// Which hours of counters exist and which are closed: every hour that
    /// can still exist `retention` after its end (by this machine's clock,
    /// with an hour's margin either way), and every hour an earlier flush
    /// could not move.
    pub async fn backlog(&self, retention: Duration) -> Result<UsageBacklog, PoolError> {
        // Off the extraction path: a full readiness check first finds (and
        // replaces) a dead connection and checks the server's version.
        self.pool.ping().await?;
        let mut conn = self.pool.connection();
        let raw: HashMap<String, String> = self
            .pool
            .bounded(async {
                Ok(redis::cmd("HGETALL")
                    .arg(self.pool.keys().usage_unflushed())
                    .query_async(&mut conn)
                    .await?)
            })
            .await?;
        let unflushed: BTreeMap<i64, (u64, u64)> = raw
            .iter()
            .filter_map(|(hour, seen)| {
                let (calls, proxies) = seen.split_once(' ')?;
                Some((
                    hour.parse().ok()?,
                    (calls.parse().ok()?, proxies.parse().ok()?),
                ))
            })
            .collect();
        let now_s = crate::clock::now_ms().div_euclid(1000);
        let retention_s = retention.as_secs() as i64;
        let mut hours: Vec<i64> = (hour_of(now_s - retention_s - 2 * HOUR_S)
            ..=hour_of(now_s + HOUR_S))
            .step_by(HOUR_S as usize)
            .chain(unflushed.keys().copied())
            .collect();
        hours.sort_unstable();
        hours.dedup();
        let mut inv = scripts::USAGE_BACKLOG.prepare_invoke();
        for hour in &hours {
            inv.key(self.pool.keys().usage_hour(*hour)).arg(*hour);
        }
        inv.arg(CLOSE_GRACE_S);
        let (now, closed, open): (String, Vec<i64>, u32) = self.pool.invoke(&inv, true).await?;
        Ok(UsageBacklog {
            now_ms: now
                .parse()
                .map_err(|_| PoolError::Internal("unexpected usage backlog reply".into()))?,
            closed,
            open,
            unflushed,
        })
    }

    /// One hour's counters (`HSCAN`, a page per call, each call bounded).
    pub async fn hour(&self, hour: i64) -> Result<HourUsage, PoolError> {
        let key = self.pool.keys().usage_hour(hour);
        // A closed hour no longer changes, but HSCAN may repeat a field.
        let mut fields: HashMap<String, String> = HashMap::new();
        let mut cursor = 0u64;
        loop {
            let mut conn = self.pool.connection();
            let (next, page): (u64, Vec<(String, String)>) = self
                .pool
                .bounded(async {
                    Ok(redis::cmd("HSCAN")
                        .arg(&key)
                        .arg(cursor)
                        .arg("COUNT")
                        .arg(SCAN_PAGE)
                        .query_async(&mut conn)
                        .await?)
                })
                .await?;
            fields.extend(page);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        Ok(HourUsage::from_fields(
            hour,
            fields.iter().map(|(f, v)| (f.as_str(), v.as_str())),
        ))
    }

    /// Forgets an hour once PostgreSQL holds it: its hash (`UNLINK`: freed
    /// in the background) and its unflushed mark. Both are idempotent.
    pub async fn forget(&self, hour: i64) -> Result<(), PoolError> {
        let mut conn = self.pool.connection();
        self.pool
            .bounded(async {
                let _: () = redis::pipe()
                    .cmd("UNLINK")
                    .arg(self.pool.keys().usage_hour(hour))
                    .ignore()
                    .cmd("HDEL")
                    .arg(self.pool.keys().usage_unflushed())
                    .arg(hour)
                    .ignore()
                    .query_async(&mut conn)
                    .await?;
                Ok(())
            })
            .await
    }

    /// Remembers closed hours a flush could not move, with their calls and
    /// proxies, for `keep` (so a later flush can report them if they expire
    /// before it moves them).
    pub async fn mark_unflushed(
        &self,
        marks: &[(i64, u64, u64)],
        keep: Duration,
    ) -> Result<(), PoolError> {
        if marks.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for (hour, calls, proxies) in marks {
            pipe.cmd("HSET")
                .arg(self.pool.keys().usage_unflushed())
                .arg(*hour)
                .arg(format!("{calls} {proxies}"))
                .ignore();
        }
        pipe.cmd("EXPIRE")
            .arg(self.pool.keys().usage_unflushed())
            .arg(keep.as_secs().max(1))
            .ignore();
        let mut conn = self.pool.connection();
        self.pool
            .bounded(async {
                let _: () = pipe.query_async(&mut conn).await?;
                Ok(())
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields parse into counters, a one-tuple commit (`f|`) into both a
    /// call and its proxies, merged with the other fields of the same
    /// counter; anything else is counted as unreadable.
    #[test]
    fn fields_parse() {
        let u = HourUsage::from_fields(
            7,
            [
                ("c|acme|ok|5", "3"),
                ("f|acme|5|provider-a|http|", "2"),
                ("p|acme|provider-a|http|", "7"),
                ("c|acme|maybe|5", "1"),
                ("p|acme|x|y", "1"),
                ("c|acme|short|5", "lots"),
            ],
        );
        assert_eq!(u.hour, 7);
        assert_eq!(u.total_calls(), 5);
        assert_eq!(
            (u.calls.len(), u.calls[0].outcome, u.calls[0].requested),
            (1, UsageOutcome::Ok, 5)
        );
        assert_eq!(u.proxies.len(), 1);
        assert_eq!((u.total_proxies(), u.proxies[0].region.as_str()), (17, ""));
        assert_eq!(u.unreadable, 3);
    }
}
