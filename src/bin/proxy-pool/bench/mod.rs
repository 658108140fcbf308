//! `proxy-pool bench`: extraction throughput and latency through the real
//! handler, measured against the ceiling of the same Redis in the same run.
//!
//! For each pool size N and pool shape ([`PoolShape`]: how many protocol x
//! region x carrier x upstream combinations, 18 to a city-keyed 10,800, or
//! any composition spelled `PxRxCxU`, e.g. 3x400x3x5 or 2x16x25x25) the
//! database is flushed and filled with N synthetic proxies
//! ([`synthetic_proxy`], TEST-NET addresses). Then every (filter shape,
//! count, C) cell:
//!
//! 1. runs a trivial `EVALSHA` (`return 1`) from C tasks over the same kind of
//!    connection the handler uses (the pool's `PoolConnection`), for half
//!    the baseline time, before and again after the extraction, so slow
//!    neighbours on a shared machine hit both sides of the ratio alike;
//! 2. drives [`distribution::handle`] from C tasks with
//!    `POST /api/v1/proxies/extract` `{"count":K}` and the cell's filters
//!    ([`FilterShape`]: none, one region, region + carrier, protocol +
//!    upstream, or the adversarial shapes: the costliest legal requests;
//!    the values rotate from request to request over the pool's own),
//!    anonymous (`AuthSchemes` `none`; with `--registry-clients N`,
//!    an API key of one of N clients in the Redis registry), rate limits
//!    off, no `Idempotency-Key` unless asked, the usage counters on (as with
//!    an aggregates database) unless `--no-usage-counters`, and the access
//!    log formatted as in Lambda (JSON) but discarded. With `--http` the
//!    requests go over HTTP/1.1 through the server `proxy-pool serve` runs
//!    (loopback, one keep-alive connection per task).
//!
//! Extraction consumes the pool, so a cell runs in rounds: before each round
//! the pool is topped up to its target size and a round takes at most half of
//! it. The target is N, except where C concurrent requests of `count` would
//! not fit in half of N; there it is `2 * C * count` (marked `*` in the table).
//! Only the rounds are timed; top-ups are not. Every request must return 200
//! with `count` proxies; anything else is counted as short or failed.
//!
//! Besides the client-side figures, each cell reads Redis's own cost of the
//! extraction script (`INFO commandstats` `usec` / `calls` of `fcall` and `evalsha`, and
//! `INFO cpu` per call) over exactly the timed rounds, the trivial script's
//! the same way over its own windows, and the bench's own CPU time per
//! request (handler + redis-rs + tokio, from `/proc/self/task/*/schedstat`).
//! It also reads `SLOWLOG` (set to keep calls of 1 ms or more) for the
//! longest extraction call, and has another client `PING` Redis every
//! millisecond ([`pinger`]) for the longest any bystander waited. Each
//! cell's cost is also read against the unfiltered count=1 cell of the same
//! run, and its answers are counted by HTTP status.
//!
//! `--stall` and `--steady` run something else: the stale-backlog
//! timeline ([`stall`]) and the steady state ([`steady`]), each on the
//! [`stage`] they share.
//!
//! The parts, one concern each: [`args`] (the flags, checked into a plan),
//! [`plan`] (what to measure: the matrix, and how a pool size is written),
//! [`filters`] (the filter sets a cell's requests carry: the one place a
//! new set is added), [`rig`] (what a run shares: the handlers, the pool,
//! its connections, where it lives) and [`error`], [`matrix`] (the cells'
//! matrix: a fill, then every cell), [`fill`] (the pool generator:
//! filling, top-ups, the registry's clients), [`writers`] (the writers'
//! Redis time a proxy), [`caller`] (a request in process or over HTTP),
//! [`replicas`] (replicas behind relays that delay replication), [`cell`]
//! (the cell runner: rounds, the trivial-script baseline), [`counters`]
//! (Redis's counters and `SLOWLOG`), [`figures`] (`INFO` fields,
//! percentiles), [`pinger`] (the bystander's `PING`), [`report`] (cells,
//! fills, the table) and [`progress`].

pub mod args;
mod caller;
mod cell;
mod counters;
mod error;
mod figures;
mod fill;
mod filters;
mod matrix;
mod pinger;
pub mod plan;
mod progress;
mod replicas;
mod report;
mod rig;
mod stage;
mod stall;
mod steady;
mod writers;

use std::io::IsTerminal;

use crate::cli::CliResult;
use crate::output::say;
use args::BenchArgs;
use progress::Progress;

// What the parts share, named here so that a part writes `super::Bench`.
use counters::SlowlogConfig;
use error::BenchError;
use rig::{Bench, Target, Variant, bench_config};
use stage::{Stage, bystander, sleep_until_ms, stage, wind_down};

/// `bench`: checks the arguments, runs the plan they describe, prints the
/// report (a table, or JSON).
pub async fn command(args: BenchArgs) -> CliResult {
    let json = args.json;
    let plot = args.plot.clone();
    let (plan, target) = args.into_plan()?;
    if cfg!(debug_assertions) {
        eprintln!("proxy-pool bench: this is a debug build; measure with --release");
    }
    let progress = Progress::new(std::io::stderr().is_terminal());
    if plan.steady.is_some() {
        let report = steady::run(plan, target, progress).await?;
        if let Some(path) = &plot {
            steady::draw(&report, path)?;
            eprintln!(
                "proxy-pool bench: the timeline is drawn in {}",
                path.display()
            );
        }
        if json {
            say!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            say!("{}", report.table().trim_end());
        }
        return Ok(());
    }
    if plan.stall.is_some() {
        let timeline = stall::run(plan, target, progress).await?;
        if json {
            say!("{}", serde_json::to_string_pretty(&timeline)?);
        } else {
            say!("{}", timeline.table().trim_end());
        }
        return Ok(());
    }
    let report = matrix::run(plan, target, progress).await?;
    if json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        say!("{}", report.table().trim_end());
    }
    Ok(())
}
