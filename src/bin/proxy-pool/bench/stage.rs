//! What a timeline (`--stall`, `--steady`) runs on, and its clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proxy_pool::local::{PoolShape, RedisServer};
use tokio::task::JoinSet;

use super::error::BenchError;
use super::pinger::Pinger;
use super::plan::Plan;
use super::progress::Progress;
use super::rig::{Bench, Target};

/// What a timeline (`--stall`, `--steady`) runs on: the bench on its
/// Redis (a private `redis-server` unless `--redis-url`, alive as long as
/// `private`), with a bystander's `PING` read second by second, emptied
/// and set to the plan's first pool size and shape.
pub(super) struct Stage {
    pub(super) bench: Bench,
    pub(super) url: String,
    pub(super) redis_version: String,
    pub(super) n: usize,
    pub(super) shape: PoolShape,
    pub(super) private: Option<RedisServer>,
}

pub(super) async fn stage(
    plan: &Plan,
    target: Target,
    progress: Progress,
) -> Result<Stage, BenchError> {
    let mut private = None;
    let url = match target {
        Target::Private => {
            let server = RedisServer::start().await?;
            let url = server.url();
            private = Some(server);
            url
        }
        Target::Url(url) => url,
    };
    let pinging = Plan {
        ping_every_ms: plan.ping_every_ms.max(1),
        ..plan.clone()
    };
    let (bench, redis_version) = Bench::new(&pinging, &url, Vec::new(), progress).await?;
    let n = plan.sizes.first().copied().unwrap_or(1_000_000);
    let shape = plan
        .combinations
        .first()
        .copied()
        .unwrap_or(PoolShape::SMALL);
    bench.flush().await?;
    bench.set_shape(shape);
    Ok(Stage {
        bench,
        url,
        redis_version,
        n,
        shape,
        private,
    })
}

/// Sleeps until the wall clock reads `ms` (Unix ms).
pub(super) async fn sleep_until_ms(ms: i64) {
    let wait = ms - proxy_pool::clock::now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
}

/// The bystander's `PING` reader of a timeline's bench (a stage always
/// starts one).
pub(super) fn bystander(bench: &Bench) -> Result<&Pinger, BenchError> {
    bench
        .pinger
        .as_ref()
        .ok_or_else(|| BenchError::Failed("no pinger".into()))
}

/// Ends a timeline: tells its tasks to stop, waits for each (the first
/// failure is the run's), then stops the `PING` reading and the progress.
pub(super) async fn wind_down(
    bench: &Bench,
    stop: &AtomicBool,
    tasks: &mut JoinSet<Result<(), BenchError>>,
) -> Result<(), BenchError> {
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| BenchError::Failed(e.to_string()))??;
    }
    bystander(bench)?.record(false);
    bench.progress.finish();
    Ok(())
}
