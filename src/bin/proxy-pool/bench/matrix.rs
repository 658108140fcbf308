//! The cells' matrix: for each pool size and shape, a fill (with the
//! writers' costs), then every cell of the plan in turn.

use std::time::Instant;

use proxy_pool::local::RedisServer;

use super::counters::SlowlogConfig;
use super::error::BenchError;
use super::figures::info_field;
use super::plan::Plan;
use super::progress::Progress;
use super::replicas::{RelayThread, start_replicas};
use super::report::{Fill, Report, human, peak_rss_kib, relate, row};
use super::rig::{Bench, Target, Variant};
use super::writers;

/// Runs `plan` against `target`.
pub async fn run(plan: Plan, target: Target, progress: Progress) -> Result<Report, BenchError> {
    // The private Redis lives as long as this function.
    let mut private = None;
    let mut replicas = Vec::new();
    let relay_thread = RelayThread::start()?;
    let url = match target {
        Target::Private => {
            let server = RedisServer::start().await?;
            let url = server.url();
            replicas = start_replicas(&server, plan.replicas, &relay_thread).await?;
            private = Some(server);
            url
        }
        Target::Url(url) => url,
    };
    let (replica_servers, relays): (Vec<_>, Vec<_>) = replicas.into_iter().unzip();
    let (mut bench, redis_version) = Bench::new(&plan, &url, relays, progress).await?;
    let slowlog = SlowlogConfig::set(&bench.conn).await;
    let mut fills = Vec::new();
    let mut cells = Vec::new();
    for &n in &plan.sizes {
        for &shape in &plan.combinations {
            bench.flush().await?;
            bench.set_shape(shape);
            bench.progress.start(
                n as u64,
                format!(
                    "filling a pool of {} over {} combinations",
                    human(n),
                    shape.combinations()
                ),
            );
            let started = Instant::now();
            let before = bench.server_stats().await?;
            bench.add(n, true, None).await?;
            let seconds = started.elapsed().as_secs_f64();
            let fill_usec = bench.server_stats().await?.script_usec - before.script_usec;
            bench.progress.note(format!(
                "filled {} proxies over {} combinations in {seconds:.1} s ({:.0}/s)",
                human(n),
                shape.combinations(),
                n as f64 / seconds
            ));
            // The fill's own calls fill SLOWLOG (~36 MB at 1M): forgotten
            // first, so the figure is the pool's.
            bench.forget_slow_calls().await;
            let memory: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut bench.conn.clone())
                .await?;
            let used = info_field(&memory, "used_memory").and_then(|v| v.parse::<f64>().ok());
            let writers = bench.writers(n, fill_usec).await?;
            bench.progress.note(format!(
                "writers, Redis time a proxy: fill {:.1} us, refresh {:.1} us, health result {:.1} us in batches ({:.1} us alone): recording {} proxies within {} s takes {:.1}% of Redis",
                writers.fill_us,
                writers.refresh_us,
                writers.health_batched_us,
                writers.health_single_us,
                human(n),
                writers::HEALTH_AGE.as_secs(),
                100.0 * writers.health_share
            ));
            fills.push(Fill {
                pool: n,
                combinations: shape,
                seconds,
                per_sec: n as f64 / seconds,
                redis_bytes_per_proxy: used.map(|b| b / n as f64),
                writers,
            });
            bench.register_clients().await?;
            let total = plan.filters.len()
                * plan.counts.len()
                * plan.concurrency.len()
                * plan.replica_lags_ms.len()
                * plan.replica_acks.len()
                * plan.script_calls.len();
            bench.progress.start(
                total as u64,
                format!("N={}, {} combinations", human(n), shape.combinations()),
            );
            for &lag_ms in &plan.replica_lags_ms {
                for (a, &acks) in plan.replica_acks.iter().enumerate() {
                    for &filter in &plan.filters {
                        for &count in &plan.counts {
                            for &c in &plan.concurrency {
                                // The ways of calling the scripts back to back.
                                for (s, &calls) in plan.script_calls.iter().enumerate() {
                                    let app = a * plan.script_calls.len() + s;
                                    bench.set_variant(Variant {
                                        lag_ms,
                                        acks,
                                        calls,
                                        app,
                                    });
                                    let cell = bench.cell(&plan, n, filter, count, c).await?;
                                    bench.progress.note(row(&cell, &plan));
                                    bench.progress.inc(1);
                                    cells.push(cell);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    bench.progress.finish();
    relate(&mut cells);
    slowlog.restore(&bench.conn).await;
    bench.flush().await?;
    bench.servers.shutdown().await;
    drop(bench);
    drop(replica_servers);
    drop(private);
    Ok(Report {
        plan,
        redis_version,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        fills,
        cells,
        peak_rss_kib: peak_rss_kib(),
    })
}
