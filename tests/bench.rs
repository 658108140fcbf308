//! `proxy-pool bench` as an operator runs it: a tiny smoke run of the real
//! binary against its private Redis (the full matrix is run by hand, see
//! docs/performance.md).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use serde_json::Value;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-pool");

/// Runs `proxy-pool bench --json` with `args`; it must succeed, and its
/// JSON is returned.
async fn bench_json(args: &[&str]) -> Value {
    let out = Command::new(BIN)
        .args(["bench", "--json"])
        .args(args)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// The report of `proxy-pool bench --quick --json` with `args`.
async fn bench_report(args: &[&str]) -> Value {
    bench_json(&[&["--quick"], args].concat()).await
}

/// A quick run fills a pool, drives the handler and the trivial-EVALSHA
/// baseline, and reports every cell with full extractions and no failures;
/// pool and filter shapes are cells of their own.
#[tokio::test]
async fn quick_bench_reports_every_cell() {
    let report = bench_report(&[
        "--sizes",
        "1k",
        "--counts",
        "1,10",
        "--concurrency",
        "1,4",
        "--combinations",
        "18,54",
        "--filters",
        "none,region-carrier",
        "--max-requests",
        "60",
        "--seconds",
        "0.2",
        "--baseline-seconds",
        "0.1",
    ])
    .await;
    let cells = report["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 16);
    for cell in cells {
        assert!(cell["requests"].as_u64().unwrap() > 0, "{cell}");
        assert_eq!(cell["failed"], 0, "{cell}");
        assert_eq!(cell["short"], 0, "{cell}");
        assert_eq!(
            cell["proxies"].as_u64().unwrap(),
            cell["requests"].as_u64().unwrap() * cell["count"].as_u64().unwrap()
        );
        assert!(cell["trivialEvalshaPerSec"].as_f64().unwrap() > 0.0);
        assert!(cell["ratio"].as_f64().unwrap() > 0.0);
        assert!(cell["serverUsPerCall"].as_f64().unwrap() > 0.0);
        assert!(cell["trivialServerUsPerCall"].as_f64().unwrap() > 0.0);
        // The bench's own CPU, summed over all its threads: a request through
        // the handler costs tens of µs even in a release build (hundreds in
        // this debug one); the idle main thread alone showed 2-10.
        assert!(
            cell["clientCpuUsPerRequest"].as_f64().unwrap() > 15.0,
            "{cell}"
        );
    }
    let shapes: std::collections::BTreeSet<(u64, String)> = cells
        .iter()
        .map(|c| {
            (
                c["combinations"].as_u64().unwrap(),
                c["filter"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(shapes.len(), 4, "{shapes:?}");
}

/// `--http` drives `serve`'s HTTP server over loopback, here with a replica
/// 2 ms behind and the acknowledged handler next to the plain one: every
/// request of both cells comes back 200 with its proxies.
#[tokio::test]
async fn http_bench_with_a_replica_answers_every_request() {
    let report = bench_report(&[
        "--http",
        "--counts",
        "1",
        "--concurrency",
        "4",
        "--replicas",
        "1",
        "--replica-lag-ms",
        "2",
        "--replica-acks",
        "0,1",
        "--max-requests",
        "40",
        "--seconds",
        "0.2",
        "--baseline-seconds",
        "0.1",
    ])
    .await;
    assert_eq!(report["plan"]["http"], true);
    let cells = report["cells"].as_array().unwrap();
    let acks: Vec<u64> = cells
        .iter()
        .map(|c| c["replicaAcks"].as_u64().unwrap())
        .collect();
    assert_eq!(acks, [0, 1]);
    for cell in cells {
        assert!(cell["requests"].as_u64().unwrap() > 0, "{cell}");
        assert_eq!(cell["failed"], 0, "{cell}");
        assert_eq!(cell["proxies"], cell["requests"], "{cell}");
    }
}

/// `--compare-evalsha` runs each cell twice in a row, with the scripts as
/// Functions and then by `EVALSHA`, and Redis counts each cell's calls
/// under the command it was told: all `FCALL`, then all `EVALSHA`.
#[tokio::test]
async fn compare_evalsha_runs_each_cell_both_ways() {
    let report = bench_report(&[
        "--compare-evalsha",
        "--counts",
        "1,10",
        "--concurrency",
        "2",
        "--max-requests",
        "40",
        "--seconds",
        "0.2",
        "--baseline-seconds",
        "0.1",
    ])
    .await;
    let cells = report["cells"].as_array().unwrap();
    let ways: Vec<(u64, &str, f64)> = cells
        .iter()
        .map(|c| {
            assert_eq!(c["failed"], 0, "{c}");
            (
                c["count"].as_u64().unwrap(),
                c["scriptCalls"].as_str().unwrap(),
                c["fcallShare"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ways,
        [
            (1, "fcall", 1.0),
            (1, "evalsha", 0.0),
            (10, "fcall", 1.0),
            (10, "evalsha", 0.0)
        ]
    );
    // Each way is related to its own unfiltered count=1 cell.
    assert_eq!(cells[1]["vsUnfiltered"].as_f64(), Some(1.0));
}

/// An existing Redis is flushed only with explicit consent.
#[tokio::test]
async fn bench_refuses_to_flush_without_consent() {
    let out = Command::new(BIN)
        .args(["bench", "--quick", "--redis-url", "redis://127.0.0.1:1/"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--flush"));
}

/// `--filters adversarial` runs the unfiltered call and every adversarial
/// shape as cells of their own, each with its status mix, its Redis time
/// against the unfiltered call and another client's PING; on a pool of
/// 3 x 40 x 3 x 5 combinations every one of them is answered (200).
#[tokio::test]
async fn adversarial_filters_run_and_report() {
    let report = bench_report(&[
        "--sizes",
        "4k",
        "--combinations",
        "3x40x3x5",
        "--filters",
        "adversarial",
        "--counts",
        "1",
        "--concurrency",
        "2",
        "--max-requests",
        "30",
        "--seconds",
        "0.1",
        "--baseline-seconds",
        "0.05",
    ])
    .await;
    let cells = report["cells"].as_array().unwrap();
    let names: Vec<&str> = cells
        .iter()
        .map(|c| c["filter"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "none",
            "regions64-proto",
            "regions64-car-up",
            "regions16-every",
            "invented-regions",
            "invented-every",
            "restricted-client",
            "seed-example",
            "all-but-one",
            "multi-worst",
            "protocol-only",
            "regions2-carrier"
        ]
    );
    for cell in cells {
        let requests = cell["requests"].as_u64().unwrap();
        assert!(requests > 0, "{cell}");
        let answered: u64 = cell["statuses"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(answered, requests, "{cell}");
        assert!(cell["vsUnfiltered"].as_f64().unwrap() > 0.0, "{cell}");
        assert!(cell["pings"].as_u64().unwrap() > 0, "{cell}");
        assert!(cell["pingMaxUs"].as_u64().unwrap() > 0, "{cell}");
        assert!(cell["slowestCallUs"].is_u64(), "{cell}");
        let status = |s: &str| cell["statuses"][s].as_u64().unwrap_or(0);
        match cell["filter"].as_str().unwrap() {
            "none" => assert_eq!(cell["vsUnfiltered"], 1.0),
            "invented-regions" | "invented-every" => {
                assert_eq!(
                    (status("200"), cell["proxies"].as_u64()),
                    (requests, Some(0))
                );
            }
            _ => assert_eq!(status("200"), requests, "{cell}"),
        }
    }
}

/// `--stall` fills a pool that goes stale at once, then reports second by
/// second, from before the stall: extractions, latencies, statuses (200
/// or 409, never a 503), the backlog and what the prune removed.
#[tokio::test]
async fn stall_timeline_runs_and_reports() {
    let timeline = bench_json(&[
        "--stall",
        "--sizes",
        "30k",
        "--combinations",
        "18",
        "--stall-after",
        "8",
        "--stall-seconds",
        "3",
        "--prune-every",
        "1",
        "--fresh-per-sec",
        "100",
        "--concurrency",
        "2",
    ])
    .await;
    let seconds = timeline["seconds"].as_array().unwrap();
    let ts: Vec<i64> = seconds.iter().map(|s| s["t"].as_i64().unwrap()).collect();
    assert_eq!(ts, [-2, -1, 0, 1, 2]);
    for s in seconds {
        assert!(s["extractions"].as_u64().unwrap() > 0, "{s}");
        for status in s["statuses"].as_object().unwrap().keys() {
            assert!(status == "200" || status == "409", "{s}");
        }
    }
    // What was left of the pool at the stall is backlog until the prune (30k
    // proxies: two clients take a few thousand before the stall).
    assert!(seconds[1]["backlog"].as_u64().unwrap() > 0, "{timeline}");
    let pruned: u64 = timeline["prunes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["indexEntries"].as_u64().unwrap())
        .sum();
    assert!(pruned > 0, "{timeline}");
    assert!(timeline["p99Us"].as_u64().unwrap() > 0);
}

/// `--stall-spread` lets the checks go stale one by one over the seconds
/// before the stall: the backlog grows through them instead of appearing
/// at once.
#[tokio::test]
async fn stall_spread_lets_the_pool_go_stale_over_time() {
    let timeline = bench_json(&[
        "--stall",
        "--sizes",
        "20k",
        "--combinations",
        "18",
        "--stall-after",
        "12",
        "--stall-spread",
        "2",
        "--stall-seconds",
        "1",
        "--prune-every",
        "0",
        "--fresh-per-sec",
        "100",
        "--concurrency",
        "1",
    ])
    .await;
    let backlog = |t: i64| {
        timeline["seconds"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["t"].as_i64() == Some(t))
            .map(|s| s["backlog"].as_u64().unwrap())
            .unwrap_or_else(|| panic!("no second {t}: {timeline}"))
    };
    // Stale between t=-2 and t=0: none at the end of t=-4 (a second
    // before), part at the end of t=-2 (one second in), more at the end
    // of t=-1 (the stall).
    assert_eq!(backlog(-4), 0, "{timeline}");
    assert!(backlog(-2) > 0, "{timeline}");
    assert!(backlog(-1) > backlog(-2), "{timeline}");
}

/// `--steady` runs extraction alone, then every writer beside it at each
/// rate: the writers get through their items and take Redis time only
/// while they run, the scheduled job runs, every answer is a 200, and no
/// proxy is handed out twice; `--plot` draws the timeline, a line a
/// measure over every second; with `--aggregates-url` every job run also
/// reports its usage flush (here to a database that is never reached: a
/// few seconds close no hour, so nothing is moved).
#[tokio::test]
async fn steady_state_runs_every_writer_and_reports() {
    let dir = std::env::temp_dir().join(format!("steady-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("steady.svg");
    let report = bench_json(&[
        "--plot",
        svg.to_str().unwrap(),
        "--steady",
        "--sizes",
        "20k",
        "--combinations",
        "18",
        "--quiet-seconds",
        "2",
        "--steady-rates",
        "100,200",
        "--step-seconds",
        "3",
        "--job-every",
        "2",
        "--concurrency",
        "2",
        "--aggregates-url",
        "postgres://nobody@127.0.0.1:1/none",
    ])
    .await;
    let steps = report["steps"].as_array().unwrap();
    let rates: Vec<(u64, bool)> = steps
        .iter()
        .map(|s| (s["rate"].as_u64().unwrap(), s["writers"].as_bool().unwrap()))
        .collect();
    assert_eq!(rates, [(100, false), (100, true), (200, true)]);
    assert_eq!(report["seconds"].as_array().unwrap().len(), 8);
    let quiet = &steps[0];
    assert_eq!(quiet["shares"]["writers"], 0.0, "{quiet}");
    assert!(
        quiet["shares"]["extract"].as_f64().unwrap() > 0.0,
        "{quiet}"
    );
    for step in &steps[1..] {
        for field in ["refreshedPerSec", "healthPerSec", "workerOpsPerSec"] {
            assert!(step[field].as_f64().unwrap() > 0.0, "{field}: {step}");
        }
        assert!(step["shares"]["writers"].as_f64().unwrap() > 0.0, "{step}");
        assert!(step["memory"].as_u64().unwrap() > 0, "{step}");
    }
    for step in steps {
        let statuses = step["statuses"].as_object().unwrap();
        assert_eq!(statuses.keys().collect::<Vec<_>>(), ["200"], "{step}");
    }
    let jobs = report["jobs"].as_array().unwrap();
    assert!(!jobs.is_empty(), "{report}");
    for job in jobs {
        assert!(
            job["records"].is_u64() && job["indexEntries"].is_u64(),
            "{job}"
        );
        assert_eq!(job["flush"]["hours"], 0, "{job}");
    }
    assert!(report["handedOut"].as_u64().unwrap() > 500, "{report}");
    assert_eq!(report["duplicates"], 0);

    let picture = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(picture.starts_with("<svg"), "{picture:.200}");
    for caption in [
        "share of Redis time, %",
        "99th percentile, ms",
        "spent index entries not yet pruned",
        "Redis used_memory, MB",
        "100 alone, 100, 200",
    ] {
        assert!(picture.contains(caption), "{caption} missing");
    }
    // Six lines (extraction and writers, extraction and PING, backlog,
    // memory), each through all eight seconds.
    let lines: Vec<&str> = picture
        .split("<polyline")
        .skip(1)
        .filter(|l| l.contains("stroke-width=\"2\""))
        .collect();
    assert_eq!(lines.len(), 6, "{picture:.400}");
    for line in lines {
        let points = line
            .split("points=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert_eq!(points.split_whitespace().count(), 8, "{points}");
    }
}
