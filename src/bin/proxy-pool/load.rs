//! Adding proxies: `load` (JSON Lines) and `load-demo` (the demo pool).

use std::io::{BufRead, IsTerminal};

use proxy_pool::clock::now_ms;
use proxy_pool::local::demo_proxies;
use proxy_pool::pool::{NewProxy, PoolError, RedisPool, UpsertStatus};

use crate::cli::{LoadArgs, LoadDemoArgs};
use crate::{CliResult, operator_pool};

/// Lines parsed per upsert round trip.
const LOAD_BATCH: usize = 500;

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
            Err(why) => tally.reject(number, &why.to_string()),
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
    println!(
        "loaded {}, refreshed {}, rejected {}",
        tally.added, tally.refreshed, tally.rejected
    );
    Ok(())
}

/// `load-demo`: the demo pool `serve` starts with.
pub async fn load_demo(args: LoadDemoArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let statuses = pool.upsert(&demo_proxies(args.size, now_ms())).await?;
    let count = |want: UpsertStatus| statuses.iter().filter(|s| **s == want).count();
    let added = count(UpsertStatus::Added);
    let refreshed = count(UpsertStatus::Refreshed);
    println!(
        "demo pool: added {added}, refreshed {refreshed}, refused {} (extracted in their current TTL life)",
        statuses.len() - added - refreshed
    );
    Ok(())
}

/// What a load did, line by line.
#[derive(Default)]
struct Tally {
    added: usize,
    refreshed: usize,
    rejected: usize,
}

impl Tally {
    fn reject(&mut self, line: usize, why: &str) {
        self.rejected += 1;
        eprintln!("line {line}: skipped: {why}");
    }

    async fn apply(
        &mut self,
        pool: &RedisPool,
        batch: &mut Vec<(usize, NewProxy)>,
    ) -> Result<(), PoolError> {
        let proxies: Vec<NewProxy> = batch.iter().map(|(_, p)| p.clone()).collect();
        let statuses = pool.upsert(&proxies).await?;
        for ((line, _), status) in batch.iter().zip(statuses) {
            match status {
                UpsertStatus::Added => self.added += 1,
                UpsertStatus::Refreshed => self.refreshed += 1,
                UpsertStatus::Extracted => {
                    self.reject(*line, "already extracted in its current TTL life")
                }
                UpsertStatus::Expired => {
                    self.reject(*line, "already expired (or past its safety margin)")
                }
            }
        }
        batch.clear();
        Ok(())
    }
}
