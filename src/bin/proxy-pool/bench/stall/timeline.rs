//! What `bench --stall` reports: each second, each prune run, and the
//! timeline's table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use proxy_pool::scheduled;
use serde::Serialize;

use crate::bench::plan::{Plan, StallPlan};
use crate::bench::report::{human, status_mix};

/// What one second of the timeline saw.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Second {
    /// Seconds from the stall (the second [t, t + 1)).
    pub t: i64,
    /// Extractions answered in it.
    pub extractions: usize,
    /// Of them, 200 with a proxy.
    pub served: usize,
    /// Their latencies, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Slowest.
    pub max_us: u64,
    /// Answers by HTTP status (0: no answer).
    pub statuses: BTreeMap<u16, usize>,
    /// Spent index entries not yet pruned at its end
    /// (`ZCOUNT {pp}:v4:due -inf now`).
    pub backlog: u64,
    /// Index entries eligible at its end (`ZCOUNT {pp}:v4:due (now (1e13`).
    pub eligible: u64,
    /// Fresh proxies the Controller added in it.
    pub added: u64,
    /// Index entries the prune runs that ended in it removed.
    pub pruned: u64,
    /// Another client's slowest `PING` in it, microseconds.
    pub ping_max_us: u64,
    /// The longest extraction call in it (`SLOWLOG`: 0 under 1 ms), us.
    pub slowest_call_us: u64,
    /// Extraction calls over 5 ms in it.
    pub calls_over_5ms: u64,
    /// The longest call of another script in it (the Controller's
    /// upserts, the prune), us.
    pub slowest_other_us: u64,
}

/// One run of the scheduled prune.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneRun {
    /// Seconds from the stall when it started.
    pub started_at: f64,
    /// Its wall time, seconds.
    pub seconds: f64,
    /// Records and tombstones deleted.
    pub records: u64,
    /// Spent index entries removed.
    pub index_entries: u64,
    /// Script calls.
    pub batches: u32,
    /// It finished (false: its budget ran out first).
    pub complete: bool,
}

/// The outcome of `bench --stall`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timeline {
    /// What was asked for.
    pub plan: Plan,
    /// `redis_version` from `INFO server`.
    pub redis_version: String,
    /// Pool size N.
    pub pool: usize,
    /// Its shape, `PxRxCxU`.
    pub shape: String,
    /// Seconds the fill took.
    pub fill_seconds: f64,
    /// Seconds from the end of the fill to the stall.
    pub idle_seconds: f64,
    /// Second by second, from `-lead_seconds`.
    pub seconds: Vec<Second>,
    /// The prune runs.
    pub prunes: Vec<PruneRun>,
    /// After the stall: every extraction's latency percentiles, us.
    pub p50_us: u64,
    /// 99th percentile after the stall.
    pub p99_us: u64,
    /// Slowest after the stall.
    pub max_us: u64,
    /// Answers by status after the stall.
    pub statuses: BTreeMap<u16, usize>,
    /// Seconds from the stall until the backlog was 0 (none: never).
    pub backlog_cleared_at: Option<i64>,
    /// Another client's slowest `PING` after the stall, us.
    pub ping_max_us: u64,
    /// The longest extraction call after the stall, us.
    pub slowest_call_us: u64,
    /// Extraction calls over 5 ms after the stall.
    pub calls_over_5ms: u64,
}

impl Timeline {
    /// The human-readable timeline.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let stall = self
            .plan
            .stall
            .clone()
            .unwrap_or_else(|| StallPlan::for_pool(self.pool));
        let _ = writeln!(
            out,
            "proxy-pool bench --stall: redis {}, N={} ({}, {} combinations) filled in {:.1} s, every health check stale {} ({:.1} s after the fill); {} clients count=1 (partial / allOrNothing alternately), a Controller adding {}/s, the scheduled prune (batch {}, budget {} s) every {} s from t={}; another client PINGs every {} ms",
            self.redis_version,
            human(self.pool),
            self.shape,
            self.plan
                .combinations
                .first()
                .map_or(0, |c| c.combinations()),
            self.fill_seconds,
            if stall.spread_seconds == 0 {
                "at t=0".to_string()
            } else {
                format!("from t=-{} to t=0, one by one", stall.spread_seconds)
            },
            self.idle_seconds + stall.lead_seconds as f64,
            stall.clients,
            stall.fresh_per_sec,
            scheduled::PRUNE_BATCH,
            scheduled::PRUNE_BUDGET.as_secs(),
            stall.prune_every,
            stall.prune_every,
            self.plan.ping_every_ms.max(1),
        );
        let _ = writeln!(
            out,
            "    t  ext/s  served   p50 us   p99 us   max us    backlog  eligible  added  pruned  ping max us  slowest call us  >5ms  other script us  statuses"
        );
        for s in &self.seconds {
            let _ = writeln!(
                out,
                "{:>5} {:>6} {:>7} {:>8} {:>8} {:>8} {:>10} {:>9} {:>6} {:>7} {:>12} {:>16} {:>5} {:>16}  {}",
                s.t,
                s.extractions,
                s.served,
                s.p50_us,
                s.p99_us,
                s.max_us,
                s.backlog,
                s.eligible,
                s.added,
                s.pruned,
                s.ping_max_us,
                s.slowest_call_us,
                s.calls_over_5ms,
                s.slowest_other_us,
                status_mix(&s.statuses)
            );
        }
        for p in &self.prunes {
            let _ = writeln!(
                out,
                "prune at t={:.1} s: {} spent index entries and {} records removed in {} calls, {:.2} s{}",
                p.started_at,
                p.index_entries,
                p.records,
                p.batches,
                p.seconds,
                if p.complete {
                    ", done"
                } else {
                    ", budget spent"
                }
            );
        }
        let _ = writeln!(
            out,
            "after the stall: p50 {} us, p99 {} us, max {} us; statuses {}; backlog {}; slowest PING {} us; slowest extraction call {} us, {} calls over 5 ms",
            self.p50_us,
            self.p99_us,
            self.max_us,
            status_mix(&self.statuses),
            match self.backlog_cleared_at {
                Some(t) => format!("cleared at t={t} s"),
                None => "not cleared".to_owned(),
            },
            self.ping_max_us,
            self.slowest_call_us,
            self.calls_over_5ms
        );
        let _ = writeln!(
            out,
            "served = 200 with a proxy; backlog = ZCOUNT {{pp}}:v4:due -inf now (spent entries not yet pruned) at the end of the second; eligible = entries whose deadline is ahead; slowest call = the longest extraction script call SLOWLOG kept in the second (0: none took 1 ms), >5ms = how many took over 5 ms; other script = the longest call of the Controller's upserts or the prune; statuses = HTTP status: answers (409: allOrNothing with nothing eligible)."
        );
        out
    }
}
