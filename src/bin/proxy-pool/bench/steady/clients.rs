//! The extraction clients of `bench --steady`: paced requests over the
//! filter mix, each answer sampled and every proxy handed out recorded.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use lambda_http::http::Request;
use proxy_pool::clock::now_ms;
use proxy_pool::distribution::EXTRACT_PATH;
use proxy_pool::security::PeerAddr;
use tokio::task::JoinSet;

use crate::bench::caller::Caller;
use crate::bench::filters::FilterShape;
use crate::bench::plan::SteadyPlan;
use crate::bench::{Bench, BenchError, sleep_until_ms};

/// The extraction mix: the filter shape of request k is `MIX[k % 4]`.
const MIX: [FilterShape; 4] = [
    FilterShape::None,
    FilterShape::SeedExample,
    FilterShape::Region,
    FilterShape::RegionCarrier,
];

/// One answered extraction.
pub(super) struct Sample {
    /// Completion, ms from the start of the quiet phase.
    pub(super) at_ms: i64,
    pub(super) latency_us: u64,
    pub(super) status: u16,
    pub(super) proxies: u64,
}

/// The extraction clients: `clients` tasks sharing one schedule, paced at
/// the rate of the second (a call late by more than a second is skipped,
/// so a rate Redis cannot sustain shows as calls not answered).
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_clients(
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
                    Some((_, text)) => proxy_lives(&text),
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

/// The lives a 200 answer handed out, each `<id> <expiresAt>`: an id may
/// come back once the life it was handed out in is over (its tombstone
/// expired, the Controller adds it again with a new expiry), a life never.
fn proxy_lives(body: &str) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    value["proxies"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .filter_map(|p| {
                    Some(format!(
                        "{} {}",
                        p["id"].as_str()?,
                        p["expiresAt"].as_str()?
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}
