//! Looking after the pool: `stats` (the inventory, as a table or JSON) and
//! `prune`.

use proxy_pool::clock::rfc3339;
use proxy_pool::pool::MAX_PRUNE_BATCH;

use crate::cli::{PoolArgs, StatsArgs};
use crate::{CliResult, operator_pool};

/// `stats`.
pub async fn stats(args: StatsArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let policy = pool.policy();
    let inventory = pool.inventory().await?;
    let eligible: u64 = inventory.buckets.iter().map(|b| b.eligible).sum();
    let indexed: u64 = inventory.buckets.iter().map(|b| b.indexed).sum();
    if args.json {
        let doc = serde_json::json!({
            "at": rfc3339(inventory.at_ms),
            "minRemainingTtlSeconds": policy.min_remaining_ttl.as_secs(),
            "maxHealthCheckAgeSeconds": policy.max_health_check_age.as_secs(),
            "eligible": eligible,
            "indexed": indexed,
            "heldByWorkers": inventory.held,
            "buckets": inventory.buckets,
        });
        println!("{doc:#}");
        return Ok(());
    }
    let rows: Vec<[String; 6]> = inventory
        .buckets
        .iter()
        .map(|b| {
            [
                b.upstream.clone(),
                b.protocol.clone(),
                b.region.clone(),
                b.carrier.clone(),
                b.eligible.to_string(),
                b.indexed.to_string(),
            ]
        })
        .collect();
    print_table(
        [
            "upstream", "protocol", "region", "carrier", "eligible", "indexed",
        ],
        &rows,
    );
    println!(
        "eligible {eligible} of {indexed} allocatable ({policy}), held by Workers {}, at {}",
        inventory.held,
        rfc3339(inventory.at_ms)
    );
    Ok(())
}

/// `prune`.
pub async fn prune(args: PoolArgs) -> CliResult {
    let (_, pool) = operator_pool(&args)?;
    let report = pool.prune_expired(MAX_PRUNE_BATCH, u32::MAX, None).await?;
    println!(
        "pruned {} expired proxies and {} index entries in {} calls",
        report.records, report.index_entries, report.batches
    );
    Ok(())
}

/// Prints `rows` under `header` in aligned columns: the first four
/// left-aligned, the rest (numbers) right-aligned.
pub fn print_table<const N: usize>(header: [&str; N], rows: &[[String; N]]) {
    let header = header.map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i >= 4 {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
}
