//! The usage aggregates: `aggregates flush` (closed hours from Redis to
//! PostgreSQL) and `usage` (the sums, as a table or JSON).

use proxy_pool::aggregates::{Aggregates, DatabaseUrl, Dimension, FlushReport, UsageQuery};
use proxy_pool::clock::{now_ms, parse_rfc3339, rfc3339};
use proxy_pool::config::Config;
use proxy_pool::pool::RedisPool;
use proxy_pool::startup;
use serde_json::{Map, Value, json};

use crate::cli::CliResult;
use crate::cli::{DatabaseArgs, FlushArgs, UsageArgs};
use crate::output::{self, say};

/// `aggregates flush`.
pub async fn flush(args: FlushArgs) -> CliResult {
    let (mut config, aggregates) = database(&args.database).await?;
    config.pool_name = args.pool.pool_name.clone();
    let pool = RedisPool::with_options(&args.pool.redis_url, &config.redis_options())?;
    let report = aggregates.flush(&pool).await;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        say!("{}", summary(&report));
    }
    match report.error {
        Some(e) => Err(format!("flush incomplete: {e}").into()),
        None => Ok(()),
    }
}

/// `usage`.
pub async fn usage(args: UsageArgs) -> CliResult {
    let by = args
        .by
        .iter()
        .filter(|d| !d.trim().is_empty())
        .map(|d| {
            Dimension::parse(d).ok_or_else(|| {
                format!(
                    "--by {d}: not one of {}",
                    Dimension::ALL.map(Dimension::as_str).join(", ")
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let now = now_ms();
    let query = UsageQuery {
        by,
        client: args.client,
        since_ms: args
            .since
            .as_deref()
            .map(|s| instant(s, now, "--since"))
            .transpose()?,
        until_ms: args
            .until
            .as_deref()
            .map(|s| instant(s, now, "--until"))
            .transpose()?,
    };
    let (_, aggregates) = database(&args.database).await?;
    let table = aggregates.usage(&query).await?;
    let names: Vec<&str> = table.by.iter().map(|d| d.as_str()).collect();
    if args.json {
        let rows: Vec<Value> = table
            .rows
            .iter()
            .map(|(group, counts)| {
                let mut row = Map::new();
                for (name, value) in names.iter().zip(group) {
                    row.insert((*name).into(), json!(value));
                }
                for (name, n) in table.counts.iter().zip(counts) {
                    row.insert((*name).into(), json!(n));
                }
                Value::Object(row)
            })
            .collect();
        let doc = json!({
            "by": names,
            "since": query.since_ms.map(rfc3339),
            "until": query.until_ms.map(rfc3339),
            "client": query.client,
            "rows": rows,
            "droppedHours": table.dropped_hours,
            "droppedCalls": table.dropped_calls,
        });
        say!("{doc:#}");
        return Ok(());
    }
    let header: Vec<String> = names
        .iter()
        .chain(table.counts.iter())
        .map(|s| s.to_string())
        .collect();
    let rows: Vec<Vec<String>> = table
        .rows
        .iter()
        .map(|(group, counts)| {
            group
                .iter()
                .cloned()
                .chain(counts.iter().map(i64::to_string))
                .collect()
        })
        .collect();
    output::table(&header, &rows, names.len())?;
    if table.dropped_hours > 0 {
        say!(
            "{} hours in this range expired in Redis before they were flushed ({} calls lost, all clients)",
            table.dropped_hours,
            table.dropped_calls
        );
    }
    Ok(())
}

/// The settings and the aggregates database (`--database-url`, else the
/// configuration's URL or secret).
async fn database(args: &DatabaseArgs) -> Result<(Config, Aggregates), Box<dyn std::error::Error>> {
    let mut config = Config::from_env()?;
    if let Some(url) = &args.database_url {
        // As an aggregates error, so the message keeps its prefix.
        let url = DatabaseUrl::parse(url).map_err(proxy_pool::aggregates::AggregatesError::from)?;
        config.aggregates_database_url = Some(url);
    }
    let store = startup::secret_store(&config).await;
    let aggregates = startup::aggregates(&config, store.as_ref()).ok_or(
        "no aggregates database: set PROXY_POOL_AGGREGATES_DATABASE_URL (or --database-url) or PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID",
    )?;
    Ok((config, aggregates))
}

/// RFC 3339, or a span back from `now`: `<N>h` or `<N>d`.
fn instant(s: &str, now: i64, flag: &str) -> Result<i64, String> {
    let s = s.trim();
    let span = |n: &str, unit: i64| n.parse::<i64>().ok().map(|n| now - n * unit);
    let parsed = if let Some(n) = s.strip_suffix('h') {
        span(n, 3_600_000)
    } else if let Some(n) = s.strip_suffix('d') {
        span(n, 86_400_000)
    } else {
        parse_rfc3339(s).ok()
    };
    parsed.ok_or_else(|| format!("{flag} {s}: not RFC 3339 nor a span like 36h or 30d"))
}

/// One line saying what a flush did.
fn summary(r: &FlushReport) -> String {
    let mut line = format!(
        "flushed {} hours ({} calls, {} proxies), {} already flushed; pending {} closed hours",
        r.hours_flushed,
        r.calls_flushed,
        r.proxies_flushed,
        r.hours_already_flushed,
        r.hours_pending
    );
    if let Some(oldest) = r.oldest_pending_hour {
        line.push_str(&format!(" (oldest {})", rfc3339(oldest * 1000)));
    }
    line.push_str(&format!(", {} open", r.hours_open));
    if r.hours_dropped > 0 {
        line.push_str(&format!(
            "; dropped {} hours ({} calls) that expired in Redis unflushed",
            r.hours_dropped, r.calls_dropped
        ));
    }
    if r.unreadable_fields > 0 {
        line.push_str(&format!(
            "; {} unreadable fields left out",
            r.unreadable_fields
        ));
    }
    line
}
