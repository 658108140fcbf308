//! `bench --stall`: the stale-backlog timeline. A health checker that
//! stalls lets the whole pool go stale at once; from then on every
//! extraction walks past spent entries until the scheduled prune clears
//! them. This fills N proxies whose last health check makes them all stale
//! at one instant shortly after the fill ends (the bench's policy is
//! maxHealthCheckAge 3,600 s: their `healthCheckedAt` is set 3,600 s
//! before that instant), or each at its own instant over the
//! `spread_seconds` up to it (`--stall-spread`: a checker that stops, its
//! last results stamped one by one), then, from a few seconds before the
//! stall to `seconds` after it:
//!
//! * a Controller adds fresh proxies at a steady rate (a batch every
//!   20 ms, through `lua/upsert.lua`, as the bench's fills do);
//! * C extraction clients call the handler back to back, `count=1`, every
//!   other request `allOrNothing` (the others partial);
//! * the scheduled job's prune ([`Maintenance::prune_expired`] with
//!   [`scheduled::PRUNE_BATCH`] and [`scheduled::PRUNE_BUDGET`], what the
//!   EventBridge schedule runs) every `prune_every` seconds, the first one
//!   period after the stall (EventBridge runs it once a minute);
//! * another client's `PING` every millisecond ([`super::pinger::Pinger`]);
//!
//! and prints, per second: extractions, p50/p99/max latency, the status
//! mix, the backlog left (`ZCOUNT {pp}:v4:due -inf now`: spent entries not
//! yet pruned), the eligible count, what the prune removed and the slowest
//! `PING`.
//!
//! What it reports, and its table, are in [`timeline`].

mod timeline;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lambda_http::http::{Request, StatusCode};
use proxy_pool::distribution::EXTRACT_PATH;
use proxy_pool::scheduled;
use proxy_pool::security::PeerAddr;
use tokio::task::JoinSet;

use super::caller::Caller;
use super::figures::{percentile, returned};
use super::fill::Checks;
use super::plan::{Plan, StallPlan};
use super::progress::Progress;
use super::report::human;

pub use timeline::Timeline;
use timeline::{PruneRun, Second};

use super::{
    Bench, BenchError, SlowlogConfig, Stage, Target, bystander, sleep_until_ms, stage, wind_down,
};
use proxy_pool::pool::Maintenance;

/// The policy's maxHealthCheckAge in the bench's configuration (see
/// `bench_config`), ms.
const HEALTH_AGE_MS: i64 = 3_600_000;

/// One answered extraction.
struct Sample {
    /// Completion, ms from the stall.
    at_ms: i64,
    latency_us: u64,
    status: u16,
    served: bool,
}

/// Runs the stale-backlog timeline of `plan.stall`.
pub async fn run(plan: Plan, target: Target, progress: Progress) -> Result<Timeline, BenchError> {
    let stall = plan
        .stall
        .clone()
        .ok_or_else(|| BenchError::Failed("no stall plan".into()))?;
    let Stage {
        bench,
        redis_version,
        url: _,
        n,
        shape,
        private,
    } = stage(&plan, target, progress).await?;
    let slowlog = SlowlogConfig::set(&bench.conn).await;

    // The fill: every health check 3,600 s before the stall instant (or
    // spread over the seconds up to that).
    let fill_start_ms = proxy_pool::clock::now_ms();
    let stall_ms = fill_start_ms + (stall.after_seconds * 1000.0) as i64;
    bench.progress.start(
        n as u64,
        format!(
            "filling {} proxies over {} combinations ({shape}), stale {} {:.0} s after the fill started",
            human(n),
            shape.combinations(),
            if stall.spread_seconds == 0 {
                "together".to_string()
            } else {
                format!("one by one over the {} s up to", stall.spread_seconds)
            },
            stall.after_seconds
        ),
    );
    let started = Instant::now();
    let spread_ms = (stall.spread_seconds as i64) * 1000;
    let checks = Checks {
        last_ms: stall_ms - HEALTH_AGE_MS - 1,
        spread_ms,
    };
    bench.add(n, true, Some(checks)).await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let fill_end_ms = proxy_pool::clock::now_ms();
    let indexed: u64 = redis::cmd("ZCARD")
        .arg(bench.pool.keys().index())
        .query_async(&mut bench.conn.clone())
        .await?;
    let margin_seconds = stall.lead_seconds + stall.spread_seconds;
    if fill_end_ms + (margin_seconds as i64) * 1000 >= stall_ms || indexed != n as u64 {
        return Err(BenchError::Failed(format!(
            "the fill took {fill_seconds:.1} s ({indexed} of {n} indexed): it must end {margin_seconds} s before the stall; raise --stall-after (now {:.0})",
            stall.after_seconds
        )));
    }
    bench.progress.note(format!(
        "filled {} proxies in {fill_seconds:.1} s; the stall is in {:.1} s",
        human(n),
        (stall_ms - fill_end_ms) as f64 / 1000.0
    ));

    // The timeline runs from `lead_seconds` before the stall.
    let begin_ms = stall_ms - (stall.lead_seconds as i64) * 1000;
    sleep_until_ms(begin_ms).await;
    bench.forget_slow_calls().await;
    bench.progress.start(
        stall.lead_seconds + stall.seconds,
        format!(
            "stale backlog: {} clients, {} fresh/s, prune every {} s",
            stall.clients, stall.fresh_per_sec, stall.prune_every
        ),
    );
    let end_ms = stall_ms + (stall.seconds as i64) * 1000;
    let bench = Arc::new(bench);
    let pinger = bystander(&bench)?;
    let samples = Arc::new(Mutex::new(Vec::<Sample>::new()));
    let added = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    spawn_clients(&mut tasks, &bench, &stall, stall_ms, &samples, &stop);
    spawn_controller(&mut tasks, &bench, &stall, &added, &stop);
    let prunes = Arc::new(Mutex::new(Vec::<(PruneRun, i64)>::new()));
    spawn_prune(&mut tasks, &bench, &stall, stall_ms, end_ms, &prunes, &stop);

    // Second by second: the backlog, the eligible count, what was added,
    // the pings.
    pinger.record(true);
    let mut seconds = Vec::new();
    let mut t = -(stall.lead_seconds as i64);
    let mut added_before = 0;
    while stall_ms + t * 1000 < end_ms {
        sleep_until_ms(stall_ms + (t + 1) * 1000).await;
        let now = proxy_pool::clock::now_ms();
        let mut conn = bench.conn.clone();
        let (backlog, eligible): (u64, u64) = redis::pipe()
            .cmd("ZCOUNT")
            .arg(bench.pool.keys().due())
            .arg("-inf")
            .arg(now)
            .cmd("ZCOUNT")
            .arg(bench.pool.keys().due())
            .arg(format!("({now}"))
            .arg("(10000000000000")
            .query_async(&mut conn)
            .await?;
        let pings = pinger.take();
        let slow = bench.slow_calls().await.unwrap_or_default();
        let total_added = added.load(Ordering::Relaxed);
        seconds.push(Second {
            t,
            backlog,
            eligible,
            added: total_added - added_before,
            ping_max_us: pings.max_us,
            slowest_call_us: slow.slowest_us,
            calls_over_5ms: slow.over_5ms,
            slowest_other_us: slow.other_slowest_us,
            ..Second::default()
        });
        added_before = total_added;
        bench.progress.inc(1);
        t += 1;
    }
    wind_down(&bench, &stop, &mut tasks).await?;

    // Each answer and prune run into its second.
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    let prunes = std::mem::take(&mut *prunes.lock().unwrap_or_else(|e| e.into_inner()));
    let first = -(stall.lead_seconds as i64);
    let mut latencies: Vec<Vec<u64>> = vec![Vec::new(); seconds.len()];
    let mut after: Vec<u64> = Vec::new();
    let mut statuses = BTreeMap::new();
    for s in &samples {
        let i = s.at_ms.div_euclid(1000) - first;
        let Some(second) = usize::try_from(i).ok().and_then(|i| seconds.get_mut(i)) else {
            continue;
        };
        second.extractions += 1;
        second.served += usize::from(s.served);
        *second.statuses.entry(s.status).or_default() += 1;
        latencies[i as usize].push(s.latency_us);
        if s.at_ms >= 0 {
            after.push(s.latency_us);
            *statuses.entry(s.status).or_default() += 1;
        }
    }
    for (second, mut l) in seconds.iter_mut().zip(latencies) {
        l.sort_unstable();
        second.p50_us = percentile(&l, 0.5);
        second.p99_us = percentile(&l, 0.99);
        second.max_us = l.last().copied().unwrap_or(0);
    }
    for (run, ended_ms) in &prunes {
        let i = ended_ms.div_euclid(1000) - first;
        if let Some(second) = usize::try_from(i).ok().and_then(|i| seconds.get_mut(i)) {
            second.pruned += run.index_entries;
        }
    }
    after.sort_unstable();
    let after_stall = || seconds.iter().filter(|s| s.t >= 0);
    let ping_max_us = after_stall().map(|s| s.ping_max_us).max().unwrap_or(0);
    let slowest_call_us = after_stall().map(|s| s.slowest_call_us).max().unwrap_or(0);
    let calls_over_5ms = after_stall().map(|s| s.calls_over_5ms).sum();
    let backlog_cleared_at = after_stall().find(|s| s.backlog == 0).map(|s| s.t);
    let timeline = Timeline {
        plan,
        redis_version,
        pool: n,
        shape: shape.to_string(),
        fill_seconds,
        idle_seconds: (begin_ms - fill_end_ms) as f64 / 1000.0,
        p50_us: percentile(&after, 0.5),
        p99_us: percentile(&after, 0.99),
        max_us: after.last().copied().unwrap_or(0),
        statuses,
        backlog_cleared_at,
        ping_max_us,
        slowest_call_us,
        calls_over_5ms,
        seconds,
        prunes: prunes.into_iter().map(|(run, _)| run).collect(),
    };
    slowlog.restore(&bench.conn).await;
    bench.flush().await?;
    drop(bench);
    drop(private);
    Ok(timeline)
}

/// The extraction clients: back to back, count=1, every other request
/// allOrNothing.
fn spawn_clients(
    tasks: &mut JoinSet<Result<(), BenchError>>,
    bench: &Arc<Bench>,
    stall: &StallPlan,
    stall_ms: i64,
    samples: &Arc<Mutex<Vec<Sample>>>,
    stop: &Arc<AtomicBool>,
) {
    for task in 0..stall.clients {
        let front = bench.front();
        let samples = samples.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let peer = PeerAddr(([127, 0, 0, 1], 40_000 + task as u16).into());
            let mut caller = Caller::connect(front, peer)
                .await
                .ok_or_else(|| BenchError::Failed("no connection to the handler".into()))?;
            let mut i = task;
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let body = if i % 2 == 0 {
                    r#"{"count":1,"fulfillment":"partial"}"#
                } else {
                    r#"{"count":1,"fulfillment":"allOrNothing"}"#
                };
                i += 1;
                let request =
                    Request::post(EXTRACT_PATH).header("content-type", "application/json");
                let started = Instant::now();
                let answer = caller.call(request, body.to_owned()).await;
                let latency_us = started.elapsed().as_micros() as u64;
                let at_ms = proxy_pool::clock::now_ms() - stall_ms;
                let (status, served) = match &answer {
                    Some((s, text)) => (
                        s.as_u16(),
                        *s == StatusCode::OK && returned(text).is_some_and(|n| n > 0),
                    ),
                    None => (0, false),
                };
                mine.push(Sample {
                    at_ms,
                    latency_us,
                    status,
                    served,
                });
            }
            samples
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(mine);
            Ok(())
        });
    }
}

/// The Controller: `fresh_per_sec` healthy proxies a second, in fifty
/// batches (one upsert call each: a larger batch holds Redis longer).
fn spawn_controller(
    tasks: &mut JoinSet<Result<(), BenchError>>,
    bench: &Arc<Bench>,
    stall: &StallPlan,
    added: &Arc<AtomicU64>,
    stop: &Arc<AtomicBool>,
) {
    let bench = bench.clone();
    let added = added.clone();
    let stop = stop.clone();
    let per_tick = stall.fresh_per_sec.div_ceil(50) as usize;
    if per_tick == 0 {
        return;
    }
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            bench.add(per_tick, false, None).await?;
            added.fetch_add(per_tick as u64, Ordering::Relaxed);
        }
        Ok(())
    });
}

/// The scheduled prune, every `prune_every` seconds from one period after
/// the stall; each run's report and the instant it ended (ms from the
/// stall).
fn spawn_prune(
    tasks: &mut JoinSet<Result<(), BenchError>>,
    bench: &Arc<Bench>,
    stall: &StallPlan,
    stall_ms: i64,
    end_ms: i64,
    prunes: &Arc<Mutex<Vec<(PruneRun, i64)>>>,
    stop: &Arc<AtomicBool>,
) {
    if stall.prune_every == 0 {
        return;
    }
    let bench = bench.clone();
    let prunes = prunes.clone();
    let stop = stop.clone();
    let every = stall.prune_every as i64 * 1000;
    tasks.spawn(async move {
        let mut at = stall_ms + every;
        while at < end_ms && !stop.load(Ordering::Relaxed) {
            sleep_until_ms(at).await;
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let started = Instant::now();
            let started_at = (proxy_pool::clock::now_ms() - stall_ms) as f64 / 1000.0;
            let report = Maintenance::new(&bench.pool)
                .prune_expired(
                    scheduled::PRUNE_BATCH,
                    u32::MAX,
                    Some(scheduled::PRUNE_BUDGET),
                )
                .await?;
            let run = PruneRun {
                started_at,
                seconds: started.elapsed().as_secs_f64(),
                records: report.records,
                index_entries: report.index_entries,
                batches: report.batches,
                complete: report.complete,
            };
            bench.progress.note(format!(
                "prune at {started_at:.1} s: {} spent entries removed in {} calls, {:.2} s{}",
                run.index_entries,
                run.batches,
                run.seconds,
                if run.complete { "" } else { " (budget spent)" }
            ));
            let ended = proxy_pool::clock::now_ms() - stall_ms;
            prunes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((run, ended));
            at += every;
        }
        Ok(())
    });
}
