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
//! * the scheduled invocation ([`scheduled::run`]: prune, inventory, and
//!   the usage flush when an aggregates database is given) every
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
//! the cells' fill measures alone (bench/writers.rs, docs/performance.md). Every
//! proxy handed out is checked against all the others: no life of a
//! proxy (its id and expiry) may come twice; an id may come back in a
//! later life, once the tombstone of the one it was handed out in has
//! expired and the Controller has added it anew.
//!
//! The parts: [`clients`] (extraction), [`writers`] (everything else that
//! writes), [`summary`] (the figures and tables).

mod clients;
mod plot;
mod summary;
mod writers;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use proxy_pool::aggregates::{Aggregates, DatabaseSource};
use proxy_pool::clock::now_ms;
use proxy_pool::pool::{RedisOptions, RedisPool};
use tokio::task::JoinSet;

use super::figures::{info_field, percentile};
use super::plan::Plan;
use super::progress::Progress;
use super::report::human;
use super::{
    Bench, BenchError, Stage, Target, bench_config, bystander, sleep_until_ms, stage, wind_down,
};

use clients::{Sample, spawn_clients};
pub use plot::draw;
use summary::{JobRun, Shares, SteadyReport, SteadySecond, summarise};
use writers::{Done, controller, health_checker, job, workers};

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
    let config = bench_config(&plan, &url)?;
    let options = RedisOptions {
        functions: false,
        ..config.redis_options()
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
    let pinger = bystander(&bench)?;
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
    let aggregates = steady
        .aggregates
        .clone()
        .map(|url| Aggregates::new(DatabaseSource::Url(url), config.aggregates_options()));
    tasks.spawn(job(
        writer_pool()?,
        aggregates,
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
    wind_down(&bench, &stop, &mut tasks).await?;

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
    let ids: HashSet<&str> = unique
        .iter()
        .map(|life| life.split(' ').next().unwrap_or(life))
        .collect();
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
        later_lives: (unique.len() - ids.len()) as u64,
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
/// entries and the records (live and tombstones: `due` holds one member
/// for each).
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
        .cmd("ZCARD")
        .arg(bench.pool.keys().due())
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
