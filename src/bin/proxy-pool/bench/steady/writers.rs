//! The writers of `bench --steady`, each paced ten times a second: the
//! Controller, the health checker, the Gateway Workers and the scheduled
//! job.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proxy_pool::aggregates::Aggregates;
use proxy_pool::clock::now_ms;
use proxy_pool::local::{PoolShape, synthetic_id, synthetic_proxy};
use proxy_pool::pool::{CONTRACT_BATCH, ContractOp, PoolContract, RedisPool, Verdict};
use proxy_pool::scheduled;

use crate::bench::{BenchError, sleep_until_ms};

use super::summary::{FlushRun, JobRun};

/// Writers act ten times a second.
const TICK: Duration = Duration::from_millis(100);

/// A proxy's life when the Controller refreshes it, ms.
const LIFE_MS: i64 = 1_800_000;

/// The Worker all claims are made for.
const WORKER: &str = "bench-worker";

/// Items the writers got through, cumulative.
#[derive(Default)]
pub(super) struct Done {
    pub(super) refreshed: AtomicU64,
    pub(super) added: AtomicU64,
    pub(super) health: AtomicU64,
    pub(super) worker_ops: AtomicU64,
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
pub(super) async fn controller(
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
            PoolContract::new(&pool).upsert(&batch).await?;
            done.refreshed
                .fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        let fresh = owed.swap(0, Ordering::Relaxed);
        let first = next_fresh.fetch_add(fresh, Ordering::Relaxed);
        let fresh: Vec<_> = (first..first + fresh).map(renewed).collect();
        for chunk in fresh.chunks(2_000) {
            PoolContract::new(&pool).upsert(chunk).await?;
            done.added.fetch_add(chunk.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The health checker: a result for every proxy in id order, `fail` of
/// them failed (a different share of ids each pass), 64 a call.
pub(super) async fn health_checker(
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
            PoolContract::new(&pool).apply_batch(batch).await?;
            done.health.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// Gateway Workers: each cycle claims a proxy, and when it got it, drains,
/// acknowledges (0, 0) and releases it: one call each, as a Worker and the
/// Controller make them.
pub(super) async fn workers(
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
            let reply = PoolContract::new(&pool).apply(&claim).await?;
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
                PoolContract::new(&pool).apply(&op).await?;
                done.worker_ops.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// The scheduled invocation every `every` seconds once the writers run:
/// the health check, then the usage flush when `aggregates` is given (timed
/// apart, as [`scheduled::run`] runs them one after the other).
#[allow(clippy::too_many_arguments)]
pub(super) async fn job(
    pool: RedisPool,
    aggregates: Option<Aggregates>,
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
        let seconds = began.elapsed().as_secs_f64();
        let flush = match &aggregates {
            Some(a) => {
                let began = Instant::now();
                let report = a.flush(&pool).await;
                Some(FlushRun {
                    seconds: began.elapsed().as_secs_f64(),
                    hours: report.hours_flushed,
                    calls: report.calls_flushed,
                    error: report.error,
                })
            }
            None => None,
        };
        jobs.lock().unwrap_or_else(|e| e.into_inner()).push(JobRun {
            started_at,
            seconds,
            records: report.pruned.records,
            index_entries: report.pruned.index_entries,
            complete: report.pruned.complete,
            flush,
        });
        at += every as i64 * 1000;
    }
    Ok(())
}
