//! Looking after the pool: `stats` (the inventory: a summary line, then
//! every combination or groups of them, as a table; or JSON) and `prune`.

use std::time::Instant;

use proxy_pool::clock::rfc3339;
use proxy_pool::pool::{EXPIRING_WITHIN, Maintenance};
use serde_json::json;

use crate::cli::{CliResult, operator_pool};
use crate::cli::{PruneArgs, StatsArgs};
use crate::inventory::{Counts, Dimension, Group, Inventory, Rest, group, top};
use crate::output::{say, table};

/// The count columns of every table, in order.
const COUNT_COLUMNS: [&str; 4] = ["eligible", "expiring<5m", "stale", "indexed"];

/// `stats`.
pub async fn stats(args: StatsArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let policy = pool.policy();
    let inventory = Inventory::count(&pool).await?;
    let totals = inventory.totals();
    let groups = (!args.by.is_empty()).then(|| {
        let groups = group(&inventory.rows, &args.by);
        match args.top {
            Some(n) => top(groups, n),
            None => (groups, None),
        }
    });
    if args.json {
        let mut doc = json!({
            "at": rfc3339(inventory.at_ms),
            "minRemainingTtlSeconds": policy.min_remaining_ttl.as_secs(),
            "maxHealthCheckAgeSeconds": policy.max_health_check_age.as_secs(),
            "expiringWithinSeconds": EXPIRING_WITHIN.as_secs(),
            "heldByWorkers": inventory.held,
            "records": inventory.records,
            "tombstones": inventory.tombstones,
            "exact": inventory.exact,
            "combinations": inventory.rows.len(),
            "buckets": inventory.rows,
        });
        merge_counts(&mut doc, &totals);
        if let Some((shown, rest)) = &groups {
            let by: Vec<&str> = args.by.iter().map(|d| d.as_str()).collect();
            doc["by"] = json!(by);
            doc["groups"] = json!(shown);
            if let Some(rest) = rest {
                doc["otherGroups"] = json!(rest);
            }
        }
        say!("{doc:#}");
        return Ok(());
    }
    say!(
        "eligible {}{} ({policy}), expiring within 5 min {}, stale {} (past their deadline, until the next prune), held by Workers {}; indexed {} in {} combinations; records {}, tombstones {} (handed out, kept until their expiry); at {}",
        totals.eligible,
        if inventory.exact {
            ""
        } else {
            " or fewer (over 10,000 spent entries: prune first)"
        },
        totals.expiring_within_5_minutes,
        totals.stale,
        inventory.held,
        totals.indexed,
        inventory.rows.len(),
        inventory.records,
        inventory.tombstones,
        rfc3339(inventory.at_ms)
    );
    match groups {
        None => print_combinations(&inventory, args.top),
        Some((shown, rest)) => print_groups(&args.by, &shown, rest.as_ref()),
    }
}

/// One row per combination (the `top` with the most eligible, if given).
fn print_combinations(inventory: &Inventory, top_n: Option<usize>) -> CliResult {
    let dims = [
        Dimension::Upstream,
        Dimension::Protocol,
        Dimension::Region,
        Dimension::Carrier,
    ];
    // Every combination is a group of one.
    let groups = group(&inventory.rows, &dims);
    let (shown, rest) = match top_n {
        Some(n) => top(groups, n),
        None => (groups, None),
    };
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|g| cells(g.key.clone(), &g.counts))
        .collect();
    let header: Vec<&str> = dims
        .iter()
        .map(|d| d.as_str())
        .chain(COUNT_COLUMNS)
        .collect();
    table(&header, &rows, dims.len())?;
    if let Some(rest) = rest {
        say!("{}", others(&rest, "combinations"));
    }
    Ok(())
}

/// One row per group, then the groups left out by `--top`.
fn print_groups(by: &[Dimension], shown: &[Group], rest: Option<&Rest>) -> CliResult {
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|g| {
            let mut row = cells(g.key.clone(), &g.counts);
            row.push(g.combinations.to_string());
            row
        })
        .collect();
    let header: Vec<&str> = by
        .iter()
        .map(|d| d.as_str())
        .chain(COUNT_COLUMNS)
        .chain(["combinations"])
        .collect();
    table(&header, &rows, by.len())?;
    if let Some(rest) = rest {
        say!("{}", others(rest, "groups"));
    }
    Ok(())
}

fn cells(mut key: Vec<String>, c: &Counts) -> Vec<String> {
    key.extend(
        [c.eligible, c.expiring_within_5_minutes, c.stale, c.indexed].map(|n| n.to_string()),
    );
    key
}

/// The line that accounts for what `--top` left out.
fn others(rest: &Rest, what: &str) -> String {
    format!(
        "... and {} more {what}: eligible {}, expiring within 5 min {}, stale {}, indexed {}",
        rest.groups,
        rest.counts.eligible,
        rest.counts.expiring_within_5_minutes,
        rest.counts.stale,
        rest.counts.indexed
    )
}

fn merge_counts(doc: &mut serde_json::Value, counts: &Counts) {
    if let (Some(doc), serde_json::Value::Object(counts)) = (doc.as_object_mut(), json!(counts)) {
        doc.extend(counts);
    }
}

/// `prune`: until nothing is left, then what it removed, in how many
/// calls and how long.
pub async fn prune(args: PruneArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.pool)?;
    let started = Instant::now();
    let report = Maintenance::new(&pool)
        .prune_expired(args.batch, u32::MAX, None)
        .await?;
    say!(
        "pruned {} expired proxies and tombstones, {} spent index entries and {} idempotency records in {} calls of batch {}, {:.2} s",
        report.records,
        report.index_entries,
        report.idempotency_records,
        report.batches,
        args.batch,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
