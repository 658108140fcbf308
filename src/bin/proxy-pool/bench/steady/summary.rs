//! What `bench --steady` reports: each second, each step, the job's runs,
//! the headroom, and the tables.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::bench::figures::percentile;
use crate::bench::plan::{Plan, SteadyPlan};
use crate::bench::report::{human, status_mix};

/// What Redis spent one second on, as shares of it (`INFO
/// commandstats`: extraction runs as `FCALL`, the writers by `EVALSHA`).
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shares {
    /// Extraction calls.
    pub extract: f64,
    /// The writers together: Controller, health checker, Workers, job.
    pub writers: f64,
}

impl Shares {
    fn add(&mut self, o: &Self) {
        self.extract += o.extract;
        self.writers += o.writers;
    }

    fn scaled(&self, by: f64) -> Self {
        Self {
            extract: self.extract * by,
            writers: self.writers * by,
        }
    }
}

/// One second of the run.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SteadySecond {
    /// Seconds from the start of the quiet phase.
    pub t: u64,
    /// The extraction rate asked for (0: none).
    pub rate: u64,
    /// Extractions answered in it.
    pub extractions: usize,
    /// Their latency percentiles, us.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Answers by HTTP status (0: no answer).
    pub statuses: BTreeMap<u16, usize>,
    /// Redis time by operation, as shares of the second.
    pub shares: Shares,
    /// Proxies the Controller refreshed (or tried to: one handed out is
    /// refused).
    pub refreshed: u64,
    /// Fresh proxies it added, one for each proxy handed out.
    pub added: u64,
    /// Proxies handed out in it.
    pub handed: u64,
    /// Health results recorded.
    pub health: u64,
    /// Worker operations applied.
    pub worker_ops: u64,
    /// Spent index entries not yet pruned (`ZCOUNT due -inf now`).
    pub backlog: u64,
    /// Redis `used_memory`, bytes.
    pub memory: u64,
    /// Records, live and tombstones (`ZCARD due`): a proxy handed out stays
    /// a tombstone until its expiry, so memory follows them.
    pub records: u64,
    /// The bystander's `PING`, 99th percentile and slowest, us.
    pub ping_p99_us: u64,
    /// Slowest.
    pub ping_max_us: u64,
}

/// One extraction rate, held for `step_seconds`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    /// Calls per second asked for (for the quiet phase: without writers).
    pub rate: u64,
    /// With the writers running.
    pub writers: bool,
    /// Calls per second answered.
    pub achieved: f64,
    /// Latency percentiles over the step, us.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// Answers by status.
    pub statuses: BTreeMap<u16, usize>,
    /// Mean shares of Redis time per second.
    pub shares: Shares,
    /// Writers' items per second: refreshes, proxies added (one for each
    /// handed out), health results, Worker operations.
    pub refreshed_per_sec: f64,
    /// Fresh proxies added per second.
    pub added_per_sec: f64,
    /// Proxies handed out per second.
    pub handed_per_sec: f64,
    /// Health results per second.
    pub health_per_sec: f64,
    /// Worker operations per second.
    pub worker_ops_per_sec: f64,
    /// Every writer reached 95% of its rate.
    pub writers_kept_up: bool,
    /// The bystander's `PING` 99th percentile (the worst second), us.
    pub ping_p99_us: u64,
    /// Backlog and memory at the step's end.
    pub backlog: u64,
    /// `used_memory` at its end, bytes.
    pub memory: u64,
    /// Records (live and tombstones) at its end.
    pub records: u64,
}

/// One run of the scheduled job.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRun {
    /// Seconds from the start of the quiet phase.
    pub started_at: f64,
    /// The health check's wall time (prune, inventory), seconds.
    pub seconds: f64,
    /// Expired records and tombstones the prune deleted.
    pub records: u64,
    /// Spent index entries the prune drained.
    pub index_entries: u64,
    /// The prune finished within its budget.
    pub complete: bool,
    /// The usage flush after it, when an aggregates database is given.
    pub flush: Option<FlushRun>,
}

/// One usage flush of the scheduled job.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlushRun {
    /// Its wall time, seconds.
    pub seconds: f64,
    /// Closed hours it moved to PostgreSQL.
    pub hours: u32,
    /// Calls counted in them.
    pub calls: u64,
    /// Why it stopped early, if it did.
    pub error: Option<String>,
}

/// The outcome of `bench --steady`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SteadyReport {
    /// What was asked for.
    pub plan: Plan,
    /// `redis_version`.
    pub redis_version: String,
    /// N.
    pub pool: usize,
    /// `PxRxCxU`.
    pub shape: String,
    /// Seconds the fill took.
    pub fill_seconds: f64,
    /// The quiet phase, then each rate.
    pub steps: Vec<Step>,
    /// Second by second.
    pub seconds: Vec<SteadySecond>,
    /// The scheduled job's runs.
    pub jobs: Vec<JobRun>,
    /// The highest rate whose step kept every writer up, answered 95% of
    /// its calls and kept p99 within 2x of the quiet phase's (0: none).
    pub headroom: u64,
    /// Proxies handed out.
    pub handed_out: u64,
    /// Of them, a life of a proxy (id and expiry) handed out before: must
    /// be 0.
    pub duplicates: u64,
    /// Of them, an id handed out before in an earlier life (its tombstone
    /// expired and the Controller added it again): allowed.
    pub later_lives: u64,
}

/// The quiet phase and each step, from the seconds (each step's first
/// second left out: the rate changes in it).
pub(super) fn summarise(
    steady: &SteadyPlan,
    seconds: &[SteadySecond],
    latencies: &[Vec<u64>],
) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut from = 0usize;
    let phases = std::iter::once((steady.quiet_seconds, steady.rates[0], false))
        .chain(steady.rates.iter().map(|&r| (steady.step_seconds, r, true)));
    for (len, rate, writers) in phases {
        // The quiet phase's first half lets the pool settle after its fill.
        let skip = if writers { 1 } else { len as usize / 2 };
        let range = (from + skip).min(from + len as usize)..from + len as usize;
        from += len as usize;
        let secs = &seconds[range.clone()];
        let k = secs.len().max(1) as f64;
        let mut all: Vec<u64> = latencies[range].iter().flatten().copied().collect();
        all.sort_unstable();
        let mut statuses = BTreeMap::new();
        let mut shares = Shares::default();
        for s in secs {
            for (status, n) in &s.statuses {
                *statuses.entry(*status).or_default() += n;
            }
            shares.add(&s.shares);
        }
        let per_sec = |f: fn(&SteadySecond) -> u64| secs.iter().map(f).sum::<u64>() as f64 / k;
        let (refreshed, health, worker_ops) = (
            per_sec(|s| s.refreshed),
            per_sec(|s| s.health),
            per_sec(|s| s.worker_ops),
        );
        let (added, handed) = (per_sec(|s| s.added), per_sec(|s| s.handed));
        let kept_up = |got: f64, want: u64| got >= 0.95 * want as f64;
        steps.push(Step {
            rate,
            writers,
            achieved: secs.iter().map(|s| s.extractions).sum::<usize>() as f64 / k,
            p50_us: percentile(&all, 0.5),
            p99_us: percentile(&all, 0.99),
            statuses,
            shares: shares.scaled(1.0 / k),
            refreshed_per_sec: refreshed,
            added_per_sec: added,
            handed_per_sec: handed,
            health_per_sec: health,
            worker_ops_per_sec: worker_ops,
            writers_kept_up: !writers
                || (kept_up(refreshed, steady.refresh_per_sec)
                    && added >= 0.95 * handed
                    && kept_up(health, steady.health_per_sec)
                    && worker_ops >= steady.worker_cycles_per_sec as f64 * 0.95),
            ping_p99_us: secs.iter().map(|s| s.ping_p99_us).max().unwrap_or(0),
            backlog: secs.last().map_or(0, |s| s.backlog),
            memory: secs.last().map_or(0, |s| s.memory),
            records: secs.last().map_or(0, |s| s.records),
        });
    }
    steps
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

impl SteadyReport {
    /// The human-readable report: the steps, the headroom, the job runs,
    /// then the timeline.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let Some(steady) = self.plan.steady.clone() else {
            return out;
        };
        let _ = writeln!(
            out,
            "proxy-pool bench --steady: redis {}, N={} ({}) filled in {:.1} s; writers: Controller {} refreshes/s, health checker {} results/s ({}% failed, 64 a call), Workers {} claim cycles/s, the scheduled job every {} s; {} extraction clients (counts {:?} in turn; filters none, seed example, region, region+carrier in turn); another client PINGs every {} ms",
            self.redis_version,
            human(self.pool),
            self.shape,
            self.fill_seconds,
            steady.refresh_per_sec,
            steady.health_per_sec,
            steady.health_fail_share * 100.0,
            steady.worker_cycles_per_sec,
            steady.job_every,
            steady.clients,
            steady.counts,
            self.plan.ping_every_ms.max(1),
        );
        let _ = writeln!(
            out,
            "   rate  writers  achieved  proxies/s   p50 us   p99 us  extract  writers  refresh/s  added/s  health/s  worker ops/s  kept up  ping p99 us   backlog  memory MB   records  B/record  statuses"
        );
        for s in &self.steps {
            let _ = writeln!(
                out,
                "{:>7} {:>8} {:>9.0} {:>10.0} {:>8} {:>8} {:>8} {:>8} {:>10.0} {:>8.0} {:>9.0} {:>13.0} {:>8} {:>12} {:>9} {:>10.1} {:>9} {:>9.0}  {}",
                s.rate,
                if s.writers { "on" } else { "off" },
                s.achieved,
                s.handed_per_sec,
                s.p50_us,
                s.p99_us,
                pct(s.shares.extract),
                pct(s.shares.writers),
                s.refreshed_per_sec,
                s.added_per_sec,
                s.health_per_sec,
                s.worker_ops_per_sec,
                if s.writers_kept_up { "yes" } else { "NO" },
                s.ping_p99_us,
                s.backlog,
                s.memory as f64 / 1e6,
                s.records,
                s.memory as f64 / s.records.max(1) as f64,
                status_mix(&s.statuses)
            );
        }
        let _ = writeln!(
            out,
            "headroom: {} extractions/s (the highest rate whose step kept every writer up, answered 95% of its calls, had no 503 and kept p99 within 2x of the quiet phase's); {} proxies handed out, {} of them in a life (id and expiry) handed out before, {} an id again in a later life (its tombstone expired, the Controller added it anew)",
            self.headroom, self.handed_out, self.duplicates, self.later_lives
        );
        for j in &self.jobs {
            let flush = match &j.flush {
                Some(f) => format!(
                    "; usage flush {:.2} s, {} hours ({} calls) moved{}",
                    f.seconds,
                    f.hours,
                    f.calls,
                    f.error
                        .as_deref()
                        .map(|e| format!(", stopped: {e}"))
                        .unwrap_or_default()
                ),
                None => String::new(),
            };
            let _ = writeln!(
                out,
                "scheduled job at t={:.1} s: {:.2} s, pruned {} expired records and tombstones and {} spent index entries{}{flush}",
                j.started_at,
                j.seconds,
                j.records,
                j.index_entries,
                if j.complete {
                    ""
                } else {
                    " (prune budget spent)"
                }
            );
        }
        let _ = writeln!(
            out,
            "    t   rate  ext/s   p50 us   p99 us  extract  writers  refresh  health  w.ops  backlog  memory MB  ping p99/max us  statuses"
        );
        for s in &self.seconds {
            let _ = writeln!(
                out,
                "{:>5} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>6} {:>8} {:>10.1} {:>16}  {}",
                s.t,
                s.rate,
                s.extractions,
                s.p50_us,
                s.p99_us,
                pct(s.shares.extract),
                pct(s.shares.writers),
                s.refreshed,
                s.health,
                s.worker_ops,
                s.backlog,
                s.memory as f64 / 1e6,
                format!("{}/{}", s.ping_p99_us, s.ping_max_us),
                status_mix(&s.statuses)
            );
        }
        let _ = writeln!(
            out,
            "extract, writers = Redis time over wall time (INFO commandstats: the handlers' FCALL, the writers' EVALSHA); writers = Controller + health checker + Workers + scheduled job; kept up = every writer reached 95% of its rate (the Controller's additions 95% of the proxies handed out); backlog = spent index entries not yet pruned; memory = used_memory; records = live records and tombstones (a proxy handed out stays a tombstone until its expiry, so memory follows records, not time). Each step's first second is left out of its summary, the quiet phase's first half (the pool settling after its fill)."
        );
        out
    }
}
