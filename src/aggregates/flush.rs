//! The flush: closed hours of usage counters move from Redis to PostgreSQL,
//! off the extraction path (the scheduled invocation, `proxy-pool
//! aggregates flush`).
//!
//! Per closed hour, oldest first: read its hash; in one PostgreSQL
//! transaction claim the hour in the ledger (`usage_hours`, keyed by hour:
//! a second claim finds it taken and writes nothing) and insert its rows;
//! commit; only then forget the hash in Redis. A crash between commit and
//! forgetting leaves the hash; the next flush finds the hour claimed and
//! just forgets it. Two flushes at once: the second claim waits for the
//! first transaction and then finds the hour taken. So an hour is counted
//! once, whatever fails or runs twice.
//!
//! When PostgreSQL cannot be used, the counters stay in Redis (until their
//! lifetime ends) and the hours are remembered with their totals in
//! `{pp}:usage:unflushed`; a later flush that finds such an hour gone from
//! Redis and not in the ledger records it as dropped, so the loss is
//! counted, not silent.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::{Instant, timeout_at};

use super::Aggregates;
use super::database::Database;
use super::error::AggregatesError;
use crate::pool::{RedisPool, UsageStore};

/// Closed hours moved per flush at most (the rest wait for the next run),
/// so one run stays short whatever the backlog.
const MAX_HOURS_PER_FLUSH: usize = 24;

/// What one flush did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlushReport {
    /// Closed hours moved to PostgreSQL by this flush.
    pub hours_flushed: u32,
    /// Calls counted in them.
    pub calls_flushed: u64,
    /// Proxies handed out in them.
    pub proxies_flushed: u64,
    /// Closed hours PostgreSQL already held (an earlier or concurrent
    /// flush moved them): forgotten in Redis, not counted again.
    pub hours_already_flushed: u32,
    /// Hours found expired in Redis before they could be moved, recorded
    /// as dropped by this flush.
    pub hours_dropped: u32,
    /// Calls lost with them.
    pub calls_dropped: u64,
    /// Closed hours still in Redis after this flush.
    pub hours_pending: u32,
    /// The oldest of them, Unix seconds of its start.
    pub oldest_pending_hour: Option<i64>,
    /// Hours still being counted into.
    pub hours_open: u32,
    /// Counter fields that could not be read (damaged from outside), left out.
    pub unreadable_fields: u64,
    /// Why the flush stopped early (no URL, password or SQL in it).
    pub error: Option<String>,
}

impl Aggregates {
    /// Moves the closed hours of `pool`'s usage counters to PostgreSQL.
    /// Never fails extraction nor leaves a half-counted hour; a problem is
    /// reported in [`FlushReport::error`], and what is left waits for the
    /// next flush. PostgreSQL is not contacted when there is nothing to do.
    pub async fn flush(&self, pool: &RedisPool) -> FlushReport {
        let mut report = FlushReport::default();
        let counters = UsageStore::new(pool);
        let backlog = match counters.backlog(self.options.retention).await {
            Ok(b) => b,
            Err(e) => return failed(report, e.into()),
        };
        report.hours_open = backlog.open;
        let gone: Vec<(i64, (u64, u64))> = backlog
            .unflushed
            .iter()
            .filter(|(hour, _)| !backlog.closed.contains(hour))
            .map(|(h, seen)| (*h, *seen))
            .collect();
        let mut pending: Vec<i64> = backlog.closed.clone();
        if pending.is_empty() && gone.is_empty() {
            return report;
        }
        let deadline = Instant::now() + self.options.timeout;
        let outcome = self
            .move_hours(&counters, &mut pending, &gone, deadline, &mut report)
            .await;
        if let Err(e) = outcome {
            report.error = Some(e.to_string());
            // Remember what could not be moved, so its loss can be told if
            // it expires first. Best effort: Redis may be the problem.
            let marks = self.marks(&counters, &pending, &backlog.unflushed).await;
            if let Err(e) = counters
                .mark_unflushed(
                    &marks,
                    self.options.retention * 2 + Duration::from_secs(86_400),
                )
                .await
            {
                tracing::warn!(error = %e, "usage hours left in Redis could not be marked");
            }
        }
        report.hours_pending = pending.len() as u32;
        report.oldest_pending_hour = pending.first().copied();
        report
    }

    /// The flush proper: connect, move each closed hour, record the hours
    /// gone. `pending` keeps the closed hours not yet moved.
    async fn move_hours(
        &self,
        counters: &UsageStore,
        pending: &mut Vec<i64>,
        gone: &[(i64, (u64, u64))],
        deadline: Instant,
        report: &mut FlushReport,
    ) -> Result<(), AggregatesError> {
        let mut db = bounded(deadline, self.connect()).await?;
        let hours: Vec<i64> = pending.iter().take(MAX_HOURS_PER_FLUSH).copied().collect();
        for hour in hours {
            let usage = counters.hour(hour).await?;
            if usage.calls.is_empty() && usage.proxies.is_empty() && usage.unreadable == 0 {
                // Gone since the backlog was read: another flush moved it
                // (and claimed it first), or it expired (its mark, if any,
                // reports it). Nothing to claim.
                pending.retain(|h| *h != hour);
                continue;
            }
            report.unreadable_fields += usage.unreadable;
            if bounded(deadline, db.record_hour(&usage)).await? {
                report.hours_flushed += 1;
                report.calls_flushed += usage.total_calls();
                report.proxies_flushed += usage.total_proxies();
            } else {
                report.hours_already_flushed += 1;
            }
            pending.retain(|h| *h != hour);
            // Committed: from here on a failure only leaves the hash for
            // the next flush to forget.
            counters.forget(hour).await?;
        }
        for (hour, (calls, proxies)) in gone {
            if bounded(deadline, db.record_dropped(*hour, *calls, *proxies)).await? {
                report.hours_dropped += 1;
                report.calls_dropped += calls;
                tracing::warn!(
                    hour = crate::clock::rfc3339(hour * 1000),
                    calls,
                    proxies,
                    "usage counters expired in Redis before they reached PostgreSQL"
                );
            }
            counters.forget(*hour).await?;
        }
        Ok(())
    }

    /// Totals of the pending hours not yet marked (read from Redis; a hour
    /// that cannot be read is left unmarked), for [`UsageStore::mark_unflushed`].
    async fn marks(
        &self,
        counters: &UsageStore,
        pending: &[i64],
        marked: &std::collections::BTreeMap<i64, (u64, u64)>,
    ) -> Vec<(i64, u64, u64)> {
        let mut marks = Vec::new();
        for hour in pending.iter().filter(|h| !marked.contains_key(h)) {
            match counters.hour(*hour).await {
                Ok(u) => marks.push((*hour, u.total_calls(), u.total_proxies())),
                Err(_) => break,
            }
        }
        marks
    }

    /// A connection with the schema migrated, within the flush's time.
    pub(super) async fn connect(&self) -> Result<Database, AggregatesError> {
        let url = self.source.url().await?;
        let tls = self.tls().await?;
        Database::connect(&url, tls, self.options.timeout).await
    }
}

/// `op`, or `Unavailable("timed out")` once `deadline` passes. Dropping a
/// transaction half way rolls it back (the server sees the connection go).
pub(super) async fn bounded<T>(
    deadline: Instant,
    op: impl Future<Output = Result<T, AggregatesError>>,
) -> Result<T, AggregatesError> {
    timeout_at(deadline, op)
        .await
        .unwrap_or_else(|_| Err(AggregatesError::Unavailable("timed out".into())))
}

fn failed(mut report: FlushReport, e: AggregatesError) -> FlushReport {
    report.error = Some(e.to_string());
    report
}
