//! The scheduled health check, run when EventBridge invokes the function on
//! its schedule: readiness ping (which also loads the extraction script),
//! loading the maintenance scripts, pruning expired proxies, and the
//! eligible inventory by upstream, protocol and region, reported as
//! CloudWatch Embedded Metric Format (EMF) lines and as a JSON summary;
//! then, when an aggregates database is configured, the flush of closed
//! usage hours to it (whose failure is reported, never fails the check).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::aggregates::{Aggregates, FlushReport};
use crate::pool::{Maintenance, PoolError, PruneReport, RedisPool};

/// CloudWatch namespace of every metric the health check emits.
pub const METRICS_NAMESPACE: &str = "ProxyPool";
/// Entries each prune script call examines per sweep (a few milliseconds of
/// Redis time per call, so other clients never wait long behind one).
pub const PRUNE_BATCH: u32 = 128;
/// Wall time one run may prune for (the function's timeout is 10 s): a
/// stalled health checker's whole pool going stale at once is cleared by
/// a few runs, and nothing waits for it meanwhile.
pub const PRUNE_BUDGET: Duration = Duration::from_secs(4);
/// EMF dimension value for an empty region (CloudWatch refuses empty values).
const UNKNOWN: &str = "unknown";
/// EMF `Function` dimension outside Lambda, where there is no function name.
const LOCAL_FUNCTION: &str = "local";

/// The JSON summary one health check returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheckReport {
    /// Redis answered and every script is loaded (a failed check is an error instead).
    pub ready: bool,
    /// Redis clock when the inventory was counted, Unix ms.
    pub checked_at: i64,
    /// What the prune removed.
    pub pruned: PruneReport,
    /// Sum of `inventory[].eligible`.
    pub eligible_total: u64,
    /// Proxies held by Gateway Workers (CLAIMED or DRAINING).
    pub held_by_workers: u64,
    /// The pool's records (the proxies it holds, indexed or not).
    pub records: u64,
    /// Proxies handed out, each a tombstone until its expiry: memory grows
    /// with them (docs/operations.md, sizing).
    pub tombstones: u64,
    /// Eligible proxies by upstream, protocol and region (carriers summed), sorted.
    pub inventory: Vec<InventoryLine>,
    /// What the aggregates flush did (absent without an aggregates database).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aggregates: Option<FlushReport>,
    /// Wall time of the whole check.
    pub duration_ms: u64,
}

/// Eligible proxies of one (upstream, protocol, region).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryLine {
    /// Upstream provider.
    pub upstream: String,
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// Region, "" when unknown.
    pub region: String,
    /// Index entries extraction could hand out now (deadline ahead, under
    /// the pool policy), counted right after the prune.
    pub eligible: u64,
}

/// Runs one health check against `pool`, then flushes the usage aggregates
/// to `aggregates` if given. Any Redis failure of the check ends it with
/// that error: a half-done check is not reported as a success.
pub async fn run(
    pool: &RedisPool,
    aggregates: Option<&Aggregates>,
) -> Result<HealthCheckReport, PoolError> {
    let started = Instant::now();
    pool.ping().await?;
    let maintenance = Maintenance::new(pool);
    maintenance.load_scripts().await?;
    let pruned = maintenance
        .prune_expired(PRUNE_BATCH, u32::MAX, Some(PRUNE_BUDGET))
        .await?;
    let inventory = maintenance.inventory().await?;
    let checked_at = inventory.at_ms;
    let (held_by_workers, records, tombstones) =
        (inventory.held, inventory.records, inventory.tombstones);

    let mut by_dimensions: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    for b in inventory.buckets {
        *by_dimensions
            .entry((b.upstream, b.protocol, b.region))
            .or_default() += b.eligible;
    }
    let inventory: Vec<InventoryLine> = by_dimensions
        .into_iter()
        .map(|((upstream, protocol, region), eligible)| InventoryLine {
            upstream,
            protocol,
            region,
            eligible,
        })
        .collect();
    let aggregates = match aggregates {
        Some(a) => Some(a.flush(pool).await),
        None => None,
    };
    Ok(HealthCheckReport {
        ready: true,
        checked_at,
        pruned,
        eligible_total: inventory.iter().map(|l| l.eligible).sum(),
        held_by_workers,
        records,
        tombstones,
        inventory,
        aggregates,
        duration_ms: started.elapsed().as_millis() as u64,
    })
}

/// EMF lines for a successful check: one `EligibleProxies` line per
/// (upstream, protocol, region), one summary line, and with aggregates one
/// line of the flush, all dimensioned by `function` so several deployments
/// can share the namespace.
pub fn metric_lines(report: &HealthCheckReport, function: &str, timestamp_ms: i64) -> Vec<String> {
    let function = function_dimension(function);
    let mut lines = Vec::with_capacity(report.inventory.len() + 1);
    for line in &report.inventory {
        let region = if line.region.is_empty() {
            UNKNOWN
        } else {
            &line.region
        };
        lines.push(emf(
            timestamp_ms,
            &["Function", "Upstream", "Protocol", "Region"],
            &[("EligibleProxies", "Count")],
            json!({
                "Function": function,
                "Upstream": line.upstream,
                "Protocol": line.protocol,
                "Region": region,
                "EligibleProxies": line.eligible,
            }),
        ));
    }
    lines.push(emf(
        timestamp_ms,
        &["Function"],
        &[
            ("Ready", "Count"),
            ("EligibleProxiesTotal", "Count"),
            ("HeldByWorkers", "Count"),
            ("PoolRecords", "Count"),
            ("Tombstones", "Count"),
            ("PrunedProxies", "Count"),
            ("PrunedIndexEntries", "Count"),
            ("HealthCheckDuration", "Milliseconds"),
        ],
        json!({
            "Function": function,
            "Ready": 1,
            "EligibleProxiesTotal": report.eligible_total,
            "HeldByWorkers": report.held_by_workers,
            "PoolRecords": report.records,
            "Tombstones": report.tombstones,
            "PrunedProxies": report.pruned.records,
            "PrunedIndexEntries": report.pruned.index_entries,
            "HealthCheckDuration": report.duration_ms,
        }),
    ));
    if let Some(flush) = &report.aggregates {
        lines.push(emf(
            timestamp_ms,
            &["Function"],
            &[
                ("UsageHoursFlushed", "Count"),
                ("UsageHoursPending", "Count"),
                ("UsageCallsDropped", "Count"),
                ("UsageFlushFailed", "Count"),
            ],
            json!({
                "Function": function,
                "UsageHoursFlushed": flush.hours_flushed,
                "UsageHoursPending": flush.hours_pending,
                "UsageCallsDropped": flush.calls_dropped,
                "UsageFlushFailed": u8::from(flush.error.is_some()),
            }),
        ));
    }
    lines
}

/// The EMF line for a failed check (`Ready` = 0), so an alarm can fire on it.
pub fn failure_metric_line(function: &str, timestamp_ms: i64) -> String {
    let function = function_dimension(function);
    emf(
        timestamp_ms,
        &["Function"],
        &[("Ready", "Count")],
        json!({"Function": function, "Ready": 0}),
    )
}

/// Writes EMF lines to standard output, where the Lambda log agent picks
/// them up (one JSON object per line, unmixed with `tracing`'s stderr).
pub fn emit(lines: &[String]) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for line in lines {
        let _ = writeln!(out, "{line}");
    }
    let _ = out.flush();
}

fn function_dimension(function: &str) -> &str {
    if function.is_empty() {
        LOCAL_FUNCTION
    } else {
        function
    }
}

fn emf(timestamp_ms: i64, dimensions: &[&str], metrics: &[(&str, &str)], values: Value) -> String {
    let mut doc = values;
    doc["_aws"] = json!({
        "Timestamp": timestamp_ms,
        "CloudWatchMetrics": [{
            "Namespace": METRICS_NAMESPACE,
            "Dimensions": [dimensions],
            "Metrics": metrics
                .iter()
                .map(|(name, unit)| json!({"Name": name, "Unit": unit}))
                .collect::<Vec<_>>(),
        }],
    });
    doc.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> HealthCheckReport {
        HealthCheckReport {
            ready: true,
            checked_at: 1_700_000_000_000,
            pruned: PruneReport {
                records: 2,
                index_entries: 3,
                idempotency_records: 0,
                batches: 1,
                complete: true,
            },
            eligible_total: 7,
            held_by_workers: 1,
            records: 8,
            tombstones: 11,
            inventory: vec![
                InventoryLine {
                    upstream: "provider-a".into(),
                    protocol: "http".into(),
                    region: "".into(),
                    eligible: 5,
                },
                InventoryLine {
                    upstream: "provider-b".into(),
                    protocol: "socks5".into(),
                    region: "beijing".into(),
                    eligible: 2,
                },
            ],
            aggregates: Some(FlushReport {
                hours_flushed: 1,
                hours_pending: 2,
                error: Some("postgres unavailable: timed out".into()),
                ..FlushReport::default()
            }),
            duration_ms: 4,
        }
    }

    /// Every line is an EMF document: its directive names metrics and
    /// dimensions that are all present as top-level members.
    #[test]
    fn metric_lines_are_embedded_metric_format() {
        let lines = metric_lines(&report(), "proxy-pool-fn", 1_700_000_000_123);
        assert_eq!(lines.len(), 4);
        for line in &lines {
            assert!(!line.contains('\n'));
            let doc: Value = serde_json::from_str(line).unwrap();
            assert_eq!(doc["_aws"]["Timestamp"], 1_700_000_000_123_i64);
            let directive = &doc["_aws"]["CloudWatchMetrics"][0];
            assert_eq!(directive["Namespace"], METRICS_NAMESPACE);
            for dimension in directive["Dimensions"][0].as_array().unwrap() {
                let name = dimension.as_str().unwrap();
                let value = doc[name].as_str().unwrap();
                assert!(!value.is_empty(), "{name} is empty in {line}");
            }
            for metric in directive["Metrics"].as_array().unwrap() {
                assert!(doc[metric["Name"].as_str().unwrap()].is_number(), "{line}");
            }
            assert_eq!(doc["Function"], "proxy-pool-fn");
        }
        let first: Value = serde_json::from_str(&lines[0]).unwrap();
        assert_eq!(
            (&first["Region"], &first["EligibleProxies"]),
            (&json!("unknown"), &json!(5))
        );
        let summary: Value = serde_json::from_str(&lines[2]).unwrap();
        assert_eq!(summary["EligibleProxiesTotal"], 7);
        assert_eq!(summary["PrunedProxies"], 2);
        assert_eq!(summary["PrunedIndexEntries"], 3);
        assert_eq!(
            (&summary["PoolRecords"], &summary["Tombstones"]),
            (&json!(8), &json!(11))
        );
        let flush: Value = serde_json::from_str(&lines[3]).unwrap();
        assert_eq!(flush["UsageHoursPending"], 2);
        assert_eq!(flush["UsageFlushFailed"], 1);
    }

    /// A failed check is one line with Ready = 0; no function name becomes `local`.
    #[test]
    fn failure_line_reports_not_ready() {
        let doc: Value = serde_json::from_str(&failure_metric_line("", 1)).unwrap();
        assert_eq!(doc["Ready"], 0);
        assert_eq!(doc["Function"], "local");
    }
}
