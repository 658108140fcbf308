//! The cell runner: one (N, shape, filter, count, C) cell as timed rounds
//! of requests from C tasks, between two windows of the trivial script, with
//! Redis's own counters read around each.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use lambda_http::http::{Request, StatusCode};
use proxy_pool::distribution::EXTRACT_PATH;
use proxy_pool::security::PeerAddr;
use tokio::task::JoinSet;

use super::caller::Caller;
use super::counters::SlowCalls;
use super::error::BenchError;
use super::figures::{percentile, returned};
use super::fill::client_key;
use super::filters::FilterShape;
use super::plan::Plan;
use super::report::Cell;
use super::rig::Bench;

/// What the C tasks of one round observed.
#[derive(Default)]
pub(super) struct Round {
    pub latencies_us: Vec<u64>,
    pub proxies: u64,
    pub short: usize,
    pub failed: usize,
    /// Answers by HTTP status (0: no answer).
    pub statuses: BTreeMap<u16, usize>,
}

impl Round {
    /// Adds what `other` observed to this one.
    pub(super) fn absorb(&mut self, other: Round) {
        self.latencies_us.extend(other.latencies_us);
        self.proxies += other.proxies;
        self.short += other.short;
        self.failed += other.failed;
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
    }
}

/// How one request goes: its filters, count and fulfillment.
#[derive(Clone, Copy)]
pub(super) struct Ask {
    pub filter: FilterShape,
    pub count: u32,
    /// Every request asks `allOrNothing` (else the default, partial).
    pub all_or_nothing: bool,
    /// Every other request asks `allOrNothing`, starting with the second.
    pub alternate: bool,
}

impl Ask {
    /// The body of the `seq`th request.
    fn body(&self, seq: u64, shape: proxy_pool::local::PoolShape) -> String {
        let body = self.filter.body(self.count, seq, shape);
        if self.all_or_nothing || (self.alternate && seq % 2 == 1) {
            format!("{{\"fulfillment\":\"allOrNothing\",{}", &body[1..])
        } else {
            body
        }
    }
}

impl Bench {
    /// Runs one cell.
    pub(super) async fn cell(
        &self,
        plan: &Plan,
        n: usize,
        filter: FilterShape,
        count: u32,
        c: usize,
    ) -> Result<Cell, BenchError> {
        let ask = Ask {
            filter,
            count,
            all_or_nothing: plan.all_or_nothing,
            alternate: false,
        };
        let target = n.max(2 * c * count as usize);
        let per_round = (target / 2 / count as usize).max(c);
        let baseline = Duration::from_secs_f64(plan.baseline_seconds / 2.0);
        let timed = Duration::from_secs_f64(plan.seconds);

        // Warm-up: connections, script cache, allocator.
        self.top_up(target).await?;
        self.round(ask, c, c, Duration::from_secs(5), plan.pace)
            .await;

        let mut trivial = self.trivial(c, baseline).await?;
        let mut all = Round::default();
        let mut elapsed = Duration::ZERO;
        let (mut calls, mut fcalls, mut usec) = (0u64, 0u64, 0u64);
        let (mut redis_cpu, mut client_cpu) = (0.0f64, 0.0f64);
        let mut cpu_known = true;
        let mut slow = Some(SlowCalls::default());
        if let Some(pinger) = &self.pinger {
            pinger.take();
        }
        while elapsed < timed && all.latencies_us.len() < plan.max_requests {
            self.top_up(target).await?;
            let budget = per_round.min(plan.max_requests - all.latencies_us.len());
            // What the top-up logged is not read (its upserts are slow calls).
            self.forget_slow_calls().await;
            let before = self.server_stats().await?;
            let cpu_before = process_cpu_seconds();
            let started = Instant::now();
            if let Some(pinger) = &self.pinger {
                pinger.record(true);
            }
            let round = self.round(ask, c, budget, timed - elapsed, plan.pace).await;
            if let Some(pinger) = &self.pinger {
                pinger.record(false);
            }
            elapsed += started.elapsed();
            let cpu_after = process_cpu_seconds();
            let after = self.server_stats().await?;
            slow = match (slow, self.slow_calls().await) {
                (Some(a), Some(b)) => Some(a.and(b)),
                _ => None,
            };
            calls += after.script_calls.saturating_sub(before.script_calls);
            fcalls += after.fcall_calls.saturating_sub(before.fcall_calls);
            usec += after.script_usec.saturating_sub(before.script_usec);
            redis_cpu += after.cpu_seconds - before.cpu_seconds;
            match (cpu_before, cpu_after) {
                (Some(a), Some(b)) => client_cpu += b - a,
                _ => cpu_known = false,
            }
            all.absorb(round);
        }
        let pings = self.pinger.as_ref().map(|p| p.take());
        let after = self.trivial(c, baseline).await?;
        trivial.calls += after.calls;
        trivial.seconds += after.seconds;
        trivial.server_calls += after.server_calls;
        trivial.server_usec += after.server_usec;

        let requests = all.latencies_us.len();
        let seconds = elapsed.as_secs_f64();
        all.latencies_us.sort_unstable();
        let pct = |q: f64| percentile(&all.latencies_us, q);
        let rate = requests as f64 / seconds.max(1e-9);
        let trivial_rate = trivial.calls as f64 / trivial.seconds.max(1e-9);
        let per_call = |total: f64| (calls > 0).then(|| total / calls as f64);
        Ok(Cell {
            pool: n,
            combinations: self.shape(),
            filter,
            pool_at_round_start: target,
            count,
            concurrency: c,
            replica_lag_ms: self.variant().lag_ms,
            replica_acks: self.variant().acks,
            script_calls: self.variant().calls,
            fcall_share: per_call(fcalls as f64),
            requests,
            proxies: all.proxies,
            seconds,
            extractions_per_sec: rate,
            proxies_per_sec: all.proxies as f64 / seconds.max(1e-9),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            max_us: all.latencies_us.last().copied().unwrap_or(0),
            trivial_evalsha_per_sec: trivial_rate,
            ratio: rate / trivial_rate.max(1e-9),
            trivial_server_us_per_call: (trivial.server_calls > 0)
                .then(|| trivial.server_usec as f64 / trivial.server_calls as f64),
            server_us_per_call: per_call(usec as f64),
            redis_cpu_us_per_call: per_call(redis_cpu * 1e6),
            client_cpu_us_per_request: (cpu_known && requests > 0)
                .then(|| client_cpu * 1e6 / requests as f64),
            short: all.short,
            failed: all.failed,
            statuses: all.statuses,
            vs_unfiltered: None,
            slowest_call_us: slow.map(|s| s.slowest_us),
            calls_over_1ms: slow.map(|s| s.over_1ms),
            calls_over_5ms: slow.map(|s| s.over_5ms),
            ping_max_us: pings.map(|p| p.max_us),
            ping_p99_us: pings.map(|p| p.p99_us),
            pings: pings.map_or(0, |p| p.count),
            redis_busy: usec as f64 / 1e6 / seconds.max(1e-9),
        })
    }

    /// `budget` requests through the handler from `c` tasks, or until
    /// `limit`; with `pace`, at most that many requests per second in all
    /// (each task waits for its turn on one schedule).
    pub(super) async fn round(
        &self,
        ask: Ask,
        c: usize,
        budget: usize,
        limit: Duration,
        pace: Option<f64>,
    ) -> Round {
        let count = ask.count;
        let remaining = Arc::new(AtomicUsize::new(budget));
        let started = Instant::now();
        let deadline = started + limit;
        let tickets = Arc::new(AtomicU64::new(0));
        let shape = self.shape();
        let mut tasks = JoinSet::new();
        let front = self.front();
        for task in 0..c {
            let front = front.clone();
            let remaining = remaining.clone();
            let tickets = tickets.clone();
            let first = self.next_request.fetch_add(1 << 32, Ordering::Relaxed);
            let keys = self
                .idempotency
                .then(|| self.next_key.fetch_add(1, Ordering::Relaxed));
            let clients = self.registry_clients;
            tasks.spawn(async move {
                let mut round = Round::default();
                let peer = PeerAddr(([127, 0, 0, 1], 40_000 + task as u16).into());
                let Some(mut caller) = Caller::connect(front, peer).await else {
                    round.failed += 1;
                    return round;
                };
                let mut i = 0u64;
                while remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                    .is_ok()
                    && Instant::now() < deadline
                {
                    if let Some(pace) = pace {
                        let ticket = tickets.fetch_add(1, Ordering::Relaxed);
                        let at = started + Duration::from_secs_f64(ticket as f64 / pace);
                        if at >= deadline {
                            break;
                        }
                        tokio::time::sleep_until(at.into()).await;
                    }
                    let mut request =
                        Request::post(EXTRACT_PATH).header("content-type", "application/json");
                    if let Some(base) = keys {
                        request = request.header("idempotency-key", format!("bench-{base:x}-{i}"));
                    }
                    if clients > 0 {
                        let client = (task * 7919 + i as usize) % clients;
                        request = request.header("x-api-key", client_key(client));
                    }
                    let body = ask.body(first + i, shape);
                    i += 1;
                    let started = Instant::now();
                    let answer = caller.call(request, body).await;
                    round
                        .latencies_us
                        .push(started.elapsed().as_micros() as u64);
                    let status = answer.as_ref().map_or(0, |(s, _)| s.as_u16());
                    *round.statuses.entry(status).or_default() += 1;
                    let Some((StatusCode::OK, text)) = answer else {
                        round.failed += 1;
                        continue;
                    };
                    let returned = returned(&text).unwrap_or(0);
                    round.proxies += returned;
                    if returned < u64::from(count) {
                        round.short += 1;
                    }
                }
                round
            });
        }
        let mut all = Round::default();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(r) = joined {
                all.absorb(r);
            }
        }
        all
    }

    /// Trivial `EVALSHA` calls from `c` tasks for `limit`, with Redis's own
    /// count and time of them.
    async fn trivial(&self, c: usize, limit: Duration) -> Result<Trivial, BenchError> {
        self.trivial
            .invoke_async::<_, i64>(&mut self.conn.clone())
            .await?;
        let before = self.server_stats().await?;
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + limit;
        let mut tasks = JoinSet::new();
        for _ in 0..c {
            let mut conn = self.conn.clone();
            let script = self.trivial.clone();
            let done = done.clone();
            tasks.spawn(async move {
                while Instant::now() < deadline {
                    script.invoke_async::<_, i64>(&mut conn).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, redis::RedisError>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| BenchError::Failed(e.to_string()))??;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = self.server_stats().await?;
        Ok(Trivial {
            calls: done.load(Ordering::Relaxed),
            seconds,
            server_calls: after.script_calls.saturating_sub(before.script_calls),
            server_usec: after.script_usec.saturating_sub(before.script_usec),
        })
    }
}

/// What a trivial-`EVALSHA` window measured.
struct Trivial {
    calls: u64,
    seconds: f64,
    server_calls: u64,
    server_usec: u64,
}

/// CPU time this process's threads have run, seconds: the sum over
/// `/proc/self/task/*/schedstat` (nanoseconds on a CPU, first field).
/// `/proc/self/schedstat` alone is the main thread's, which the Tokio
/// workers doing the requests are not; the runtime's worker threads live
/// as long as the bench, so no thread's time is lost between two reads.
fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0f64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        // A thread that ended since the listing has no file left: skip it.
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        ns += stat.split_whitespace().next()?.parse::<f64>().ok()?;
    }
    Some(ns / 1e9)
}
