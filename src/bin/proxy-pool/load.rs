//! Adding proxies: `load` (JSON Lines) and `load-demo` (the demo pool).

use std::io::{BufRead, IsTerminal};

use proxy_pool::clock::now_ms;
use proxy_pool::local::{PoolShape, synthetic_proxy};
use proxy_pool::pool::{NewProxy, PoolContract, PoolError, RedisPool, UpsertStatus};

use crate::cli::{CliResult, operator_pool};
use crate::cli::{LoadArgs, LoadDemoArgs};
use crate::output::say;
use crate::skipped::Skipped;

/// Lines parsed per upsert round trip.
const LOAD_BATCH: usize = 500;
/// Demo proxies generated and written at a time.
const DEMO_CHUNK: usize = 10_000;

/// `load`: one proxy per line; bad lines are reported by number (never by
/// contents) and skipped; ends with `loaded N, refreshed N, rejected N`.
pub async fn load(args: LoadArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let file = args.file;
    let reader: Box<dyn BufRead> = if file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(&file).map_err(|e| format!("{file}: {e}"))?,
        ))
    };
    let progress = std::io::stderr().is_terminal();
    let mut tally = Tally::default();
    let mut batch: Vec<(usize, NewProxy)> = Vec::with_capacity(LOAD_BATCH);
    for (i, line) in reader.lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| format!("line {number}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        match NewProxy::from_json_line(&line, now_ms()) {
            Ok(p) => batch.push((number, p)),
            Err(why) => tally.rejected.skip(number, &why.to_string()),
        }
        if batch.len() == LOAD_BATCH {
            tally.apply(&pool, &mut batch).await?;
            if progress {
                eprint!("\r{number} lines read");
            }
        }
    }
    tally.apply(&pool, &mut batch).await?;
    if progress {
        eprintln!();
    }
    say!(
        "loaded {}, refreshed {}, rejected {}",
        tally.added,
        tally.refreshed,
        tally.rejected.summary()
    );
    Ok(())
}

/// `load-demo`: the demo pool `serve` starts with, or a synthetic pool of
/// any size and shape (generated and written a chunk at a time).
pub async fn load_demo(args: LoadDemoArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let shape = args.combinations.unwrap_or(PoolShape::DEMO);
    let now = now_ms();
    let (mut added, mut refreshed) = (0, 0);
    for start in (0..args.size).step_by(DEMO_CHUNK) {
        let chunk: Vec<NewProxy> = (start..args.size.min(start + DEMO_CHUNK))
            .map(|seq| synthetic_proxy(seq, now, shape))
            .collect();
        for status in PoolContract::new(&pool).upsert(&chunk).await? {
            match status {
                UpsertStatus::Added => added += 1,
                UpsertStatus::Refreshed => refreshed += 1,
                UpsertStatus::Extracted | UpsertStatus::Expired => {}
            }
        }
    }
    say!(
        "demo pool: added {added}, refreshed {refreshed}, refused {} (extracted in their current TTL life) over {} combinations",
        args.size - added - refreshed,
        shape.combinations()
    );
    Ok(())
}

/// What a load did, line by line.
#[derive(Default)]
struct Tally {
    added: usize,
    refreshed: usize,
    rejected: Skipped,
}

impl Tally {
    async fn apply(
        &mut self,
        pool: &RedisPool,
        batch: &mut Vec<(usize, NewProxy)>,
    ) -> Result<(), PoolError> {
        let proxies: Vec<NewProxy> = batch.iter().map(|(_, p)| p.clone()).collect();
        let statuses = PoolContract::new(pool).upsert(&proxies).await?;
        for ((line, _), status) in batch.iter().zip(statuses) {
            match status {
                UpsertStatus::Added => self.added += 1,
                UpsertStatus::Refreshed => self.refreshed += 1,
                UpsertStatus::Extracted => self
                    .rejected
                    .skip(*line, "already extracted in its current TTL life"),
                UpsertStatus::Expired => self
                    .rejected
                    .skip(*line, "already expired (or past its safety margin)"),
            }
        }
        batch.clear();
        Ok(())
    }
}
