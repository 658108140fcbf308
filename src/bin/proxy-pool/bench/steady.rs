//! `bench --steady`: a pool's whole life at once. It fills N proxies, then
//! measures extraction alone for a few seconds (the quiet value), then
//! runs, step by step at growing extraction rates, everything a deployed
//! pool lives with on its one Redis:
//!
//! * the Controller refreshing proxies as they near expiry (N / 1,800 a
//!   second: 30-minute lives), adding a fresh proxy for each one it may
//!   not refresh (handed out, or over);
//! * the health checker recording every proxy's result within 120 s (N /
//!   120 a second, 64 a call as `proxy-pool health -` sends them), a share
//!   of them failed, so entries leave the index and come back;
//! * Gateway Workers claiming, draining, acknowledging and releasing;
//! * the scheduled invocation ([`scheduled::run`]: prune, inventory) every
//!   `job_every` seconds;
//! * extraction clients at the step's rate (paced), count=1 and count=10,
//!   unfiltered, the seed's example, one region, one region and carrier
//!   (the counts and the rates are settings);
//! * another client's `PING` every millisecond.
//!
//! Redis time is read from `INFO commandstats` every second: the handlers
//! call the scripts as Functions (`FCALL`), the writers by `EVALSHA` (each
//! writer on a connection of its own), so the two counters split Redis's
//! time exactly between extraction and the writers. (A writer's `EVALSHA`
//! runs the prelude's definitions on every call: a few microseconds a call
//! more than `FCALL`, so the writers' share is an upper bound.) Each
//! writer's own share is its items a second times its cost a proxy, which
//! the cells' fill measures alone (`writers`, docs/performance.md). Every
//! proxy handed out is checked against all the others: none may come
//! twice.
//!
//! Over 500 lines on purpose: the run, its writers, its per-second
//! sampling and its tables are one measurement.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lambda_http::http::Request;
use proxy_pool::clock::now_ms;
use proxy_pool::distribution::EXTRACT_PATH;
use proxy_pool::local::{PoolShape, synthetic_id, synthetic_proxy};
use proxy_pool::pool::{CONTRACT_BATCH, ContractOp, RedisOptions, RedisPool, Verdict};
use proxy_pool::scheduled;
use proxy_pool::security::PeerAddr;
use serde::Serialize;
use tokio::task::JoinSet;

use super::caller::Caller;
use super::figures::{info_field, percentile};
use super::filters::FilterShape;
use super::plan::{Plan, SteadyPlan};
use super::progress::Progress;
use super::report::{human, status_mix};
use super::{Bench, BenchError, Stage, Target, bench_config, sleep_until_ms, stage};

/// Writers act ten times a second.
const TICK: Duration = Duration::from_millis(100);
/// A proxy's life when the Controller refreshes it, ms.
const LIFE_MS: i64 = 1_800_000;
/// The Worker all claims are made for.
const WORKER: &str = "bench-worker";
/// The extraction mix: the filter shape of request k is `MIX[k % 4]`.
const MIX: [FilterShape; 4] = [
    FilterShape::None,
    FilterShape::SeedExample,
    FilterShape::Region,
    FilterShape::RegionCarrier,
];

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

/// Items the writers got through, cumulative.
#[derive(Default)]
struct Done {
    refreshed: AtomicU64,
    added: AtomicU64,
    health: AtomicU64,
    worker_ops: AtomicU64,
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
    /// Records, live and tombstones (`HLEN rec`): a proxy handed out stays
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
    /// Its wall time, seconds.
    pub seconds: f64,
    /// Spent index entries and records the prune removed.
    pub pruned: u64,
    /// The prune finished within its budget.
    pub complete: bool,
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
    /// Proxies handed out, and how many of them more than once (must be 0).
    pub handed_out: u64,
    /// Handed out twice or more.
    pub duplicates: u64,
}

/// One answered extraction.
struct Sample {
    /// Completion, ms from the start of the quiet phase.
    at_ms: i64,
    latency_us: u64,
    status: u16,
    proxies: u64,
}

/// Runs `plan.steady`.
pub async fn run(
    plan: Plan,
    target: Target,
    progress: Progress,
) -> Result<SteadyReport, BenchError> {
    let steady = plan
        .steady
        .clone()
        .ok_or_else(|| BenchError::Failed("no steady plan".into()))?;
    let Stage {
        bench,
        url,
        redis_version,
        n,
        shape,
        private,
    } = stage(&plan, target, progress).await?;
    bench.progress.start(
        n as u64,
        format!(
            "filling {} proxies over {} combinations ({shape})",
            human(n),
            shape.combinations()
        ),
    );
    let started = Instant::now();
    bench.add(n, true, None).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let first_seq = bench.next_seq.load(Ordering::Relaxed) - n as u64;

    // Each writer on a pool of its own (its own connection), as the
    // separate programs they are.
    let options = RedisOptions {
        functions: false,
        ..bench_config(&plan, &url)?.redis_options()
    };
    let writer_pool = || RedisPool::with_options(&url, &options);
    let total: u64 = steady.quiet_seconds + steady.step_seconds * steady.rates.len() as u64;
    bench.progress.start(
        total,
        format!(
            "steady state: quiet {} s, then {} s at each of {:?} extractions/s with every writer",
            steady.quiet_seconds, steady.step_seconds, steady.rates
        ),
    );
    let bench = Arc::new(bench);
    let pinger = bench
        .pinger
        .as_ref()
        .ok_or_else(|| BenchError::Failed("no pinger".into()))?;
    let start_ms = now_ms();
    let writers_from_ms = start_ms + steady.quiet_seconds as i64 * 1000;
    let end_ms = start_ms + total as i64 * 1000;
    // The rate each second asks for.
    let schedule: Vec<(u64, u64)> = std::iter::once((steady.quiet_seconds, steady.rates[0]))
        .chain(steady.rates.iter().map(|&r| (steady.step_seconds, r)))
        .collect();
    let rate_at = move |t: u64| {
        let mut from = 0;
        for &(len, rate) in &schedule {
            if t < from + len {
                return rate;
            }
            from += len;
        }
        0
    };

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Done::default());
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let handed = Arc::new(Mutex::new(Vec::<String>::new()));
    // Proxies handed out that the Controller has not replaced yet.
    let owed = Arc::new(AtomicU64::new(0));
    let jobs = Arc::new(Mutex::new(Vec::<JobRun>::new()));
    let mut tasks: JoinSet<Result<(), BenchError>> = JoinSet::new();
    let rate_at = Arc::new(rate_at);
    spawn_clients(
        &mut tasks,
        &bench,
        &steady,
        start_ms,
        rate_at.clone(),
        &samples,
        &handed,
        &owed,
        &stop,
    );
    let ids = first_seq..first_seq + n as u64;
    let next_fresh = Arc::new(AtomicU64::new(first_seq + n as u64));
    tasks.spawn(controller(
        writer_pool()?,
        shape,
        ids.clone(),
        next_fresh,
        owed,
        steady.refresh_per_sec,
        writers_from_ms,
        done.clone(),
        stop.clone(),
    ));
    tasks.spawn(health_checker(
        writer_pool()?,
        ids.clone(),
        steady.health_per_sec,
        steady.health_fail_share,
        writers_from_ms,
        done.clone(),
        stop.clone(),
    ));
    tasks.spawn(workers(
        writer_pool()?,
        ids,
        steady.worker_cycles_per_sec,
        writers_from_ms,
        done.clone(),
        stop.clone(),
    ));
    tasks.spawn(job(
        writer_pool()?,
        steady.job_every,
        start_ms,
        writers_from_ms,
        end_ms,
        jobs.clone(),
        stop.clone(),
    ));

    // Second by second.
    pinger.record(true);
    let mut seconds = Vec::new();
    let mut before = (0, 0, 0, 0);
    let mut usec_before = sample_redis(&bench).await?.usec;
    for t in 0..total {
        sleep_until_ms(start_ms + (t as i64 + 1) * 1000).await;
        let sample = sample_redis(&bench).await?;
        let shares = Shares {
            extract: sample.usec.0.saturating_sub(usec_before.0) as f64 / 1e6,
            writers: sample.usec.1.saturating_sub(usec_before.1) as f64 / 1e6,
        };
        usec_before = sample.usec;
        let pings = pinger.take();
        let now = (
            done.refreshed.load(Ordering::Relaxed),
            done.health.load(Ordering::Relaxed),
            done.worker_ops.load(Ordering::Relaxed),
            done.added.load(Ordering::Relaxed),
        );
        seconds.push(SteadySecond {
            t,
            rate: rate_at(t),
            shares,
            refreshed: now.0 - before.0,
            health: now.1 - before.1,
            worker_ops: now.2 - before.2,
            added: now.3 - before.3,
            backlog: sample.backlog,
            memory: sample.memory,
            records: sample.records,
            ping_p99_us: pings.p99_us,
            ping_max_us: pings.max_us,
            ..SteadySecond::default()
        });
        before = now;
        bench.progress.inc(1);
    }
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| BenchError::Failed(e.to_string()))??;
    }
    pinger.record(false);
    bench.progress.finish();

    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); seconds.len()];
    for s in &samples {
        let i = s.at_ms.div_euclid(1000);
        let Some(second) = usize::try_from(i).ok().and_then(|i| seconds.get_mut(i)) else {
            continue;
        };
        second.extractions += 1;
        second.handed += s.proxies;
        *second.statuses.entry(s.status).or_default() += 1;
        latencies[i as usize].push(s.latency_us);
    }
    for (second, l) in seconds.iter_mut().zip(latencies.iter_mut()) {
        l.sort_unstable();
        second.p50_us = percentile(l, 0.5);
        second.p99_us = percentile(l, 0.99);
    }
    let steps = summarise(&steady, &seconds, &latencies);
    let quiet_p99 = steps.first().map_or(0, |s| s.p99_us);
    let headroom = steps
        .iter()
        .filter(|s| {
            s.writers
                && s.writers_kept_up
                && s.achieved >= 0.95 * s.rate as f64
                && s.p99_us <= 2 * quiet_p99
                && !s.statuses.contains_key(&503)
        })
        .map(|s| s.rate)
        .max()
        .unwrap_or(0);
    let handed = std::mem::take(&mut *handed.lock().unwrap_or_else(|e| e.into_inner()));
    let unique: HashSet<&String> = handed.iter().collect();
    let report = SteadyReport {
        plan,
        redis_version,
        pool: n,
        shape: shape.to_string(),
        fill_seconds,
        steps,
        seconds,
        jobs: std::mem::take(&mut *jobs.lock().unwrap_or_else(|e| e.into_inner())),
        headroom,
        handed_out: handed.len() as u64,
        duplicates: (handed.len() - unique.len()) as u64,
    };
    bench.flush().await?;
    drop(bench);
    drop(private);
    Ok(report)
}

/// What one second's sample reads of Redis.
struct RedisSample {
    /// Script time so far, us: `FCALL` (extraction), `EVALSHA` (writers).
    usec: (u64, u64),
    memory: u64,
    backlog: u64,
    records: u64,
}

/// Redis's script time so far, `used_memory`, the backlog of spent
/// entries and the records (live and tombstones).
async fn sample_redis(bench: &Bench) -> Result<RedisSample, BenchError> {
    let stats = bench.server_stats().await?;
    let mut conn = bench.conn.clone();
    let memory: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await?;
    let (backlog, records): (u64, u64) = redis::pipe()
        .cmd("ZCOUNT")
        .arg(bench.pool.keys().due())
        .arg("-inf")
        .arg(now_ms())
        .cmd("HLEN")
        .arg(bench.pool.keys().records())
        .query_async(&mut conn)
        .await?;
    Ok(RedisSample {
        usec: (stats.fcall_usec, stats.script_usec - stats.fcall_usec),
        memory: info_field(&memory, "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0),
        backlog,
        records,
    })
}

/// The extraction clients: `clients` tasks sharing one schedule, paced at
/// the rate of the second (a call late by more than a second is skipped,
/// so a rate Redis cannot sustain shows as calls not answered).
#[allow(clippy::too_many_arguments)]
fn spawn_clients(
    tasks: &mut JoinSet<Result<(), BenchError>>,
    bench: &Arc<Bench>,
    steady: &SteadyPlan,
    start_ms: i64,
    rate_at: Arc<impl Fn(u64) -> u64 + Send + Sync + 'static>,
    samples: &Arc<Mutex<Vec<Sample>>>,
    handed: &Arc<Mutex<Vec<String>>>,
    owed: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) {
    let clock = Arc::new(Mutex::new((0u64, 0.0f64)));
    let shape = bench.shape();
    for task in 0..steady.clients {
        let front = bench.front();
        let counts = steady.counts.clone();
        let owed = owed.clone();
        let (samples, handed, stop, clock, rate_at) = (
            samples.clone(),
            handed.clone(),
            stop.clone(),
            clock.clone(),
            rate_at.clone(),
        );
        tasks.spawn(async move {
            let peer = PeerAddr(([127, 0, 0, 1], 41_000 + task as u16).into());
            let mut caller = Caller::connect(front, peer)
                .await
                .ok_or_else(|| BenchError::Failed("no connection to the handler".into()))?;
            let (mut mine, mut ids) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                // The next call's slot on the shared schedule (ms from start).
                let (k, due) = {
                    let mut c = clock.lock().unwrap_or_else(|e| e.into_inner());
                    let now = (now_ms() - start_ms) as f64;
                    let rate = rate_at((now.max(0.0) / 1000.0) as u64).max(1) as f64;
                    c.1 = (c.1 + 1000.0 / rate).max(now - 1000.0);
                    c.0 += 1;
                    (c.0, c.1)
                };
                sleep_until_ms(start_ms + due as i64).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let count = counts[(k % counts.len() as u64) as usize];
                let body = MIX[(k % 4) as usize].body(count, k, shape);
                let request =
                    Request::post(EXTRACT_PATH).header("content-type", "application/json");
                let began = Instant::now();
                let answer = caller.call(request, body).await;
                let latency_us = began.elapsed().as_micros() as u64;
                let status = answer.as_ref().map_or(0, |(s, _)| s.as_u16());
                let got = match answer.filter(|(s, _)| s.is_success()) {
                    Some((_, text)) => proxy_ids(&text),
                    None => Vec::new(),
                };
                owed.fetch_add(got.len() as u64, Ordering::Relaxed);
                mine.push(Sample {
                    at_ms: now_ms() - start_ms,
                    latency_us,
                    status,
                    proxies: got.len() as u64,
                });
                ids.extend(got);
            }
            samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(mine);
            handed.lock().unwrap_or_else(|e| e.into_inner()).extend(ids);
            Ok(())
        });
    }
}

/// The ids of the proxies a 200 answer handed out.
fn proxy_ids(body: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    value["proxies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| p["id"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits for `from_ms`, then ticks until `stop`: the number of items due
/// in this tick at `per_sec`.
struct Pace {
    tick: tokio::time::Interval,
    per_tick: f64,
    owed: f64,
}

impl Pace {
    async fn start(from_ms: i64, per_sec: u64) -> Self {
        sleep_until_ms(from_ms).await;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self {
            tick,
            per_tick: per_sec as f64 * TICK.as_secs_f64(),
            owed: 0.0,
        }
    }

    async fn next(&mut self) -> usize {
        self.tick.tick().await;
        self.owed += self.per_tick;
        let now = self.owed.floor();
        self.owed -= now;
        now as usize
    }
}

/// The Controller: refreshes the pool's proxies in id order (a new
/// 30-minute life each), and adds a fresh proxy for each one handed out
/// (`owed`), so the pool stays at N.
#[allow(clippy::too_many_arguments)]
async fn controller(
    pool: RedisPool,
    shape: PoolShape,
    ids: std::ops::Range<u64>,
    next_fresh: Arc<AtomicU64>,
    owed: Arc<AtomicU64>,
    per_sec: u64,
    from_ms: i64,
    done: Arc<Done>,
    stop: Arc<AtomicBool>,
) -> Result<(), BenchError> {
    let mut pace = Pace::start(from_ms, per_sec).await;
    let mut cursor = ids.start;
    while !stop.load(Ordering::Relaxed) {
        let due = pace.next().await;
        let now = now_ms();
        let renewed = |seq: u64| {
            let mut p = synthetic_proxy(seq as usize, now, shape);
            p.expires_at = now + LIFE_MS + (seq % 60_000) as i64;
            p.usable_until = p.expires_at - 30_000;
            p
        };
        let batch: Vec<_> = (0..due)
            .map(|i| renewed(ids.start + (cursor - ids.start + i as u64) % (ids.end - ids.start)))
            .collect();
        cursor = ids.start + (cursor - ids.start + due as u64) % (ids.end - ids.start);
        if !batch.is_empty() {
            pool.upsert(&batch).await?;
            done.refreshed
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        let fresh = owed.swap(0, Ordering::Relaxed);
        let first = next_fresh.fetch_add(fresh, Ordering::Relaxed);
        let fresh: Vec<_> = (first..first + fresh).map(renewed).collect();
        for chunk in fresh.chunks(2_000) {
            pool.upsert(chunk).await?;
            done.added.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The health checker: a result for every proxy in id order, `fail` of
/// them failed (a different share of ids each pass), 64 a call.
async fn health_checker(
    pool: RedisPool,
    ids: std::ops::Range<u64>,
    per_sec: u64,
    fail: f64,
    from_ms: i64,
    done: Arc<Done>,
    stop: Arc<AtomicBool>,
) -> Result<(), BenchError> {
    let mut pace = Pace::start(from_ms, per_sec).await;
    let (mut cursor, mut pass) = (0u64, 0u64);
    let size = ids.end - ids.start;
    while !stop.load(Ordering::Relaxed) {
        let due = pace.next().await;
        let ops: Vec<ContractOp> = (0..due as u64)
            .map(|i| {
                let at = (cursor + i) % size;
                let mix =
                    (at ^ pass.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
                ContractOp::Health {
                    id: synthetic_id((ids.start + at) as usize),
                    ok: (mix % 10_000) as f64 >= fail * 10_000.0,
                    checked_at: None,
                }
            })
            .collect();
        pass += (cursor + due as u64) / size;
        cursor = (cursor + due as u64) % size;
        for batch in ops.chunks(CONTRACT_BATCH) {
            pool.apply_batch(batch).await?;
            done.health.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Gateway Workers: each cycle claims a proxy, and when it got it, drains,
/// acknowledges (0, 0) and releases it: one call each, as a Worker and the
/// Controller make them.
async fn workers(
    pool: RedisPool,
    ids: std::ops::Range<u64>,
    cycles_per_sec: u64,
    from_ms: i64,
    done: Arc<Done>,
    stop: Arc<AtomicBool>,
) -> Result<(), BenchError> {
    let mut pace = Pace::start(from_ms, cycles_per_sec).await;
    let mut k = 0u64;
    let size = ids.end - ids.start;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..pace.next().await {
            k += 1;
            let id = synthetic_id((ids.start + k.wrapping_mul(7_919) % size) as usize);
            let claim = ContractOp::Claim {
                id: id.clone(),
                worker: WORKER.into(),
                min_remaining_ttl: Duration::from_secs(60),
                max_health_check_age: Duration::from_secs(3_600),
            };
            let reply = pool.apply(&claim).await?;
            done.worker_ops.fetch_add(1, Ordering::Relaxed);
            if reply.verdict != Verdict::Ok {
                continue;
            }
            let epoch = reply.epoch;
            let worker = || WORKER.to_owned();
            for op in [
                ContractOp::Drain {
                    id: id.clone(),
                    worker: worker(),
                    epoch,
                },
                ContractOp::Ack {
                    id: id.clone(),
                    worker: worker(),
                    epoch,
                    active: 0,
                    reserved: 0,
                },
                ContractOp::Release {
                    id: id.clone(),
                    worker: worker(),
                    epoch,
                },
            ] {
                pool.apply(&op).await?;
                done.worker_ops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// The scheduled invocation every `every` seconds once the writers run.
async fn job(
    pool: RedisPool,
    every: u64,
    start_ms: i64,
    from_ms: i64,
    end_ms: i64,
    jobs: Arc<Mutex<Vec<JobRun>>>,
    stop: Arc<AtomicBool>,
) -> Result<(), BenchError> {
    if every == 0 {
        return Ok(());
    }
    let mut at = from_ms + every as i64 * 1000;
    while at < end_ms && !stop.load(Ordering::Relaxed) {
        sleep_until_ms(at).await;
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let began = Instant::now();
        let started_at = (now_ms() - start_ms) as f64 / 1000.0;
        let report = scheduled::run(&pool, None).await?;
        jobs.lock().unwrap_or_else(|e| e.into_inner()).push(JobRun {
            started_at,
            seconds: began.elapsed().as_secs_f64(),
            pruned: report.pruned.index_entries + report.pruned.records,
            complete: report.pruned.complete,
        });
        at += every as i64 * 1000;
    }
    Ok(())
}

/// The quiet phase and each step, from the seconds (each step's first
/// second left out: the rate changes in it).
fn summarise(steady: &SteadyPlan, seconds: &[SteadySecond], latencies: &[Vec<u64>]) -> Vec<Step> {
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
            "headroom: {} extractions/s (the highest rate whose step kept every writer up, answered 95% of its calls, had no 503 and kept p99 within 2x of the quiet phase's); {} proxies handed out, {} of them more than once",
            self.headroom, self.handed_out, self.duplicates
        );
        for j in &self.jobs {
            let _ = writeln!(
                out,
                "scheduled job at t={:.1} s: {:.2} s, {} entries and records pruned{}",
                j.started_at,
                j.seconds,
                j.pruned,
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
