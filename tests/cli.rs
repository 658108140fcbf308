//! The `proxy-pool` binary as an operator runs it: `load` from JSON Lines and
//! `serve` with its embedded default (private Redis, demo pool).
//!
//! The contract subcommands, `stats` and `hash-credential` are here too.
//! Over 600 lines on purpose: one surface (the binary, run as a process, its
//! output read back), whose tests share how it is run (`run`,
//! `run_with_input`, `load`) over one Redis.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::process::Stdio;

use common::{Harness, http, now_ms};
use proxy_pool::clock::rfc3339;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-pool");

fn line(id: &str, expires_in_ms: i64) -> String {
    format!(
        r#"{{"id":"{id}","protocol":"http","host":"192.0.2.7","port":3128,"username":"u","password":"LOADPW-{id}","region":"shanghai","carrier":"telecom","upstream":"provider-a","expiresAt":"{}","safetyMarginSeconds":5}}"#,
        rfc3339(now_ms() + expires_in_ms)
    )
}

async fn load(url: &str, contents: &str) -> (bool, String, String) {
    let path = std::env::temp_dir().join(format!("proxy-pool-load-{}.jsonl", ulid_like()));
    std::fs::write(&path, contents).unwrap();
    let out = Command::new(BIN)
        .args(["load", "--redis-url", url])
        .arg(&path)
        .output()
        .await
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A name no other test in this process (or another) uses at the same time.
fn ulid_like() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// Good lines load, bad ones are named by line number without their
/// contents, and a second run refreshes instead of adding.
#[tokio::test]
async fn load_reports_each_line() {
    let h = Harness::start().await;
    let contents = [
        line("px_a", 600_000),
        r#"{"id":"px_bad","protocol":"ftp","password":"LOADPW-bad"}"#.to_owned(),
        line("px_b", 600_000),
        "not json LOADPW-x".to_owned(),
        line("px_old", 1_000), // inside its 5 s safety margin already
    ]
    .join("\n");
    let (ok, stdout, stderr) = load(&h.redis.url(), &contents).await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim(),
        "loaded 2, refreshed 0, rejected 3 (1 `protocol` must be one of http, https, socks5; 1 already expired (or past its safety margin); 1 not valid JSON)"
    );
    assert!(stderr.contains("line 2: skipped"), "{stderr}");
    assert!(stderr.contains("line 4: skipped"), "{stderr}");
    assert!(
        stderr.contains("line 5: skipped: already expired"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("LOADPW") && !stderr.contains("192.0.2"),
        "{stderr}"
    );

    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["px_a"]);
    let (ok, stdout, stderr) = load(&h.redis.url(), &contents).await;
    assert!(ok);
    assert_eq!(
        stdout.trim(),
        "loaded 0, refreshed 1, rejected 4 (1 `protocol` must be one of http, https, socks5; 1 already expired (or past its safety margin); 1 already extracted in its current TTL life; 1 not valid JSON)"
    );
    assert!(
        stderr.contains("line 1: skipped: already extracted"),
        "{stderr}"
    );
}

/// A file of many bad lines reads as the first 20 named by number and a
/// count by reason, not a message a line; none of their contents shows.
#[tokio::test]
async fn load_names_the_first_bad_lines_and_counts_the_rest() {
    let h = Harness::start().await;
    let mut contents: Vec<String> = (0..60).map(|i| format!("LOADPW-{i} not json")).collect();
    contents.push(line("px_kept", 600_000));
    contents.extend((0..40).map(|i| format!(r#"{{"id":"px_{i}","LOADPW":1}}"#)));
    let (ok, stdout, stderr) = load(&h.redis.url(), &contents.join("\n")).await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim(),
        "loaded 1, refreshed 0, rejected 100 (60 not valid JSON; 40 unknown field `LOADPW`)"
    );
    let named = stderr.lines().filter(|l| l.starts_with("line ")).count();
    assert_eq!(named, 20, "{stderr}");
    assert!(stderr.contains("line 20: skipped"), "{stderr}");
    assert!(!stderr.contains("line 21:"), "{stderr}");
    assert!(
        stderr.contains("further skipped lines are only counted"),
        "{stderr}"
    );
    assert!(!stderr.contains("LOADPW-"), "{stderr}");
}

/// `load` from standard input, and a clear failure when Redis is absent.
#[tokio::test]
async fn load_from_stdin_and_unreachable_redis() {
    let h = Harness::start().await;
    let mut child = Command::new(BIN)
        .args(["load", "--redis-url", &h.redis.url(), "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(line("px_in", 600_000).as_bytes())
            .await
            .unwrap();
    }
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "loaded 1, refreshed 0, rejected 0"
    );

    let mut dead = Harness::start().await;
    let url = dead.redis.url();
    dead.redis.stop().await;
    let (ok, _, stderr) = load(&url, &line("px_x", 600_000)).await;
    assert!(!ok);
    assert!(
        stderr.starts_with("proxy-pool: redis unavailable"),
        "{stderr}"
    );
}

/// `health -` records many results from JSON lines on standard input, in
/// batches: a failed one takes its proxy out of the pool, a passed one
/// (with an old `checkedAt` refused as stale, an unknown id refused) is
/// counted by reason, a bad line is named by number without its contents.
#[tokio::test]
async fn health_results_from_json_lines() {
    let h = Harness::start().await;
    let ids: Vec<String> = (0..600).map(|i| format!("hc-{i:04}")).collect();
    let lines: Vec<String> = ids.iter().map(|id| line(id, 600_000)).collect();
    let (ok, _, _) = load(&h.redis.url(), &lines.join("\n")).await;
    assert!(ok);
    let mut results: Vec<String> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| format!(r#"{{"id":"{id}","ok":{}}}"#, i % 3 != 0))
        .collect();
    results.push(format!(
        r#"{{"id":"hc-0001","ok":true,"checkedAt":"{}"}}"#,
        rfc3339(now_ms() - 3_600_000)
    ));
    results.push(r#"{"id":"nobody","ok":true}"#.to_owned());
    results.push(r#"{"id":"hc-0002","ok":"SECRET-maybe"}"#.to_owned());
    let (ok, stdout, stderr) = run_with_input(
        &["health", "--redis-url", &h.redis.url(), "-"],
        &results.join("\n"),
    )
    .await;
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.trim(),
        "recorded 600, refused 2 (stale 1, unknown 1), rejected 1 (1 not a health result)"
    );
    assert!(stderr.contains("line 603: skipped"), "{stderr}");
    assert!(!stderr.contains("SECRET"), "{stderr}");
    // The 200 that failed their check are out of the pool.
    let left = extract_all(&h).await;
    assert_eq!(left.len(), 400);
    assert!(
        left.iter()
            .all(|id| id[3..].parse::<usize>().unwrap() % 3 != 0)
    );
}

/// The Worker commands take many operations as JSON lines too: `claim -`
/// prints each claim's epoch, then every command counts what it applied,
/// what was refused by reason, and the lines it could not read (by
/// number, never their contents); the pool follows each step.
#[tokio::test]
async fn worker_commands_from_json_lines() {
    let h = Harness::start().await;
    let url = h.redis.url();
    let ids: Vec<String> = (0..200).map(|i| format!("wk-{i:04}")).collect();
    let lines: Vec<String> = ids.iter().map(|id| line(id, 600_000)).collect();
    assert!(load(&url, &lines.join("\n")).await.0);
    let claimed = &ids[..150];

    let mut claims: Vec<String> = claimed
        .iter()
        .map(|id| format!(r#"{{"id":"{id}","worker":"w1"}}"#))
        .collect();
    claims.push(r#"{"id":"nobody","worker":"w1"}"#.to_owned());
    claims.push(r#"{"id":"wk-0199","worker":"SECRET-maybe","epoch":1}"#.to_owned());
    let (ok, out, err) =
        run_with_input(&["claim", "--redis-url", &url, "-"], &claims.join("\n")).await;
    assert!(ok, "{err}");
    let out: Vec<&str> = out.lines().collect();
    assert_eq!(out.len(), 151, "{out:?}");
    for (id, printed) in claimed.iter().zip(&out) {
        assert_eq!(*printed, format!("ok {id} (epoch 1)"));
    }
    assert_eq!(
        out[150],
        "claimed 150, refused 1 (unknown 1), rejected 1 (1 not a claim)"
    );
    assert!(err.contains("line 152: skipped: not a claim"), "{err}");
    assert!(!err.contains("SECRET"), "{err}");

    let holder = |epoch: u64, extra: &str| -> String {
        claimed
            .iter()
            .map(|id| format!(r#"{{"id":"{id}","worker":"w1","epoch":{epoch}{extra}}}"#))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let stale = r#"{"id":"wk-0000","worker":"w2","epoch":1}"#;
    let (ok, out, err) = run_with_input(
        &["drain", "--redis-url", &url, "-"],
        &format!("{stale}\n{}", holder(1, "")),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "drained 150, refused 1 (not-owner 1), rejected 0"
    );
    let (ok, out, err) = run_with_input(
        &["ack", "--redis-url", &url, "-"],
        &holder(1, r#","active":0,"reserved":0"#),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "acknowledged 150, refused 0, rejected 0");
    let (ok, out, err) =
        run_with_input(&["release", "--redis-url", &url, "-"], &holder(1, "")).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "released 150, refused 0, rejected 0");
    let removals: Vec<String> = ids[190..]
        .iter()
        .map(|id| format!(r#"{{"id":"{id}"}}"#))
        .collect();
    let (ok, out, err) =
        run_with_input(&["remove", "--redis-url", &url, "-"], &removals.join("\n")).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "removed 10, refused 0, rejected 0");

    // Released proxies are back; removed ones gone: 190 to extract.
    let mut left = extract_all(&h).await;
    left.sort();
    assert_eq!(left, ids[..190].to_vec());
    // A single operation still needs its options.
    let (ok, _, err) = run(&["drain", "--redis-url", &url, "wk-0000"]).await;
    assert!(!ok);
    assert!(err.contains("--worker is required"), "{err}");
}

/// `serve` with no Redis URL starts its own, loads the demo pool, prints a
/// working curl line, answers extractions and stops cleanly on SIGTERM.
#[tokio::test]
async fn serve_runs_with_its_embedded_default() {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--demo-size", "50"])
        .env_remove("PROXY_POOL_REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = stdout.next_line().await.unwrap().unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap()
        .parse()
        .unwrap();
    let curl = stdout.next_line().await.unwrap().unwrap();
    assert!(curl.starts_with("try: curl"), "{curl}");
    // The printed line carries a working API key for the demo client.
    let key = curl
        .split("X-API-Key: ")
        .nth(1)
        .and_then(|s| s.split('\'').next())
        .unwrap()
        .to_owned();
    assert!(key.starts_with("pp_") && key.len() == 67, "{key}");

    let body = r#"{"count":2,"filters":{"protocols":["http"]}}"#;
    let json_only = [("content-type", "application/json")];
    let (status, h0, _) = http(addr, "POST", "/api/v1/proxies/extract", &json_only, body).await;
    assert_eq!(status, 401);
    assert!(h0["www-authenticate"].starts_with("ApiKey"));
    let headers = [
        ("content-type", "application/json"),
        ("x-api-key", key.as_str()),
        ("idempotency-key", "cli-test-01"),
    ];
    let (status, h1, first) = http(addr, "POST", "/api/v1/proxies/extract", &headers, body).await;
    assert_eq!(status, 200, "{first}");
    let json: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(json["returned"], 2);
    common::assert_valid("ExtractResponse", &json);
    assert!(h1.contains_key("x-request-id"));
    let (_, h2, again) = http(addr, "POST", "/api/v1/proxies/extract", &headers, body).await;
    assert_eq!(again, first);
    assert_eq!(
        h2.get("idempotent-replayed").map(String::as_str),
        Some("true")
    );

    // Bodies past the limit are refused without being read whole.
    let big = format!(r#"{{"count":1,"x":"{}"}}"#, "y".repeat(40_000));
    let (status, _, _) = http(addr, "POST", "/api/v1/proxies/extract", &headers[..2], &big).await;
    assert_eq!(status, 413);
    let (status, _, _) = http(addr, "GET", "/health/ready", &[], "").await;
    assert_eq!(status, 200);

    let pid = child.id().unwrap().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .unwrap();
    assert!(killed.success());
    let status = child.wait().await.unwrap();
    assert!(status.success(), "serve exited with {status}");
    let rest = stdout.next_line().await.unwrap();
    assert_eq!(rest.as_deref(), Some("stop with Ctrl-C"));
    assert_eq!(
        stdout.next_line().await.unwrap().as_deref(),
        Some("proxy-pool serve: stopped")
    );
}

/// Every proxy the pool hands out, 100 a request, until it answers none.
async fn extract_all(h: &Harness) -> Vec<String> {
    let mut all = Vec::new();
    loop {
        let r = h.extract(r#"{"count":100}"#, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        if r.ids().is_empty() {
            return all;
        }
        all.extend(r.ids());
    }
}

/// Runs the binary with `input` on its standard input.
async fn run_with_input(args: &[&str], input: &str) -> (bool, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

async fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `prune` takes the batch its calls use (1-1000) and says what it
/// removed, in how many calls of that batch and how long.
#[tokio::test]
async fn prune_takes_a_batch_and_reports_its_calls() {
    let h = Harness::start().await;
    let url = h.redis.url();
    let (ok, out, err) = run(&["prune", "--redis-url", &url, "--batch", "7"]).await;
    assert!(ok, "{err}");
    let line = out.trim();
    assert!(
        line.starts_with("pruned 0 expired proxies and tombstones, 0 spent index entries and 0 idempotency records in 1 calls of batch 7, "),
        "{line}"
    );
    assert!(line.ends_with(" s"), "{line}");
    for bad in ["0", "1001", "many"] {
        let (ok, _, err) = run(&["prune", "--redis-url", &url, "--batch", bad]).await;
        assert!(!ok && err.contains("--batch"), "{bad}: {err}");
    }
}

/// The contract subcommands as an operator scripts them: claim prints the
/// epoch, a stale holder is refused with a non-zero exit, and stats shows
/// the inventory as a table and as JSON, with the records and the
/// tombstones of the proxies handed out.
#[tokio::test]
async fn contract_subcommands_and_stats() {
    let h = Harness::start().await;
    let url = h.redis.url();
    let (ok, _, stderr) = load(
        &url,
        &[
            line("px_a", 600_000),
            line("px_b", 600_000),
            line("px_c", 500_000),
        ]
        .join("\n"),
    )
    .await;
    assert!(ok, "{stderr}");
    let (ok, out, _) = run(&["claim", "--redis-url", &url, "px_a", "--worker", "w1"]).await;
    assert!(ok);
    assert_eq!(out.trim(), "ok px_a (epoch 1)");
    // px_c expires first: handed out, a tombstone.
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["px_c"]);
    let (ok, _, err) = run(&[
        "drain",
        "--redis-url",
        &url,
        "px_a",
        "--worker",
        "w2",
        "--epoch",
        "1",
    ])
    .await;
    assert!(!ok);
    assert_eq!(err.trim(), "proxy-pool: refused: not-owner (px_a, epoch 1)");
    let (ok, out, _) = run(&["stats", "--redis-url", &url]).await;
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("eligible 1 (maxHealthCheckAge 120 s, minRemainingTTL 30 s)"),
        "{out}"
    );
    assert!(lines[0].contains("held by Workers 1"), "{out}");
    assert!(
        lines[0].contains("records 2, tombstones 1 (handed out, kept until their expiry)"),
        "{out}"
    );
    assert_eq!(
        lines[1],
        "upstream    protocol  region    carrier  eligible  expiring<5m  stale  indexed"
    );
    assert_eq!(
        lines[2],
        "provider-a  http      shanghai  telecom         1            0      0        1"
    );
    let (ok, out, _) = run(&["stats", "--redis-url", &url, "--json"]).await;
    assert!(ok);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (doc["eligible"].as_u64(), doc["heldByWorkers"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (doc["records"].as_u64(), doc["tombstones"].as_u64()),
        (Some(2), Some(1))
    );
    for args in [
        vec![
            "drain",
            "--redis-url",
            &url,
            "px_a",
            "--worker",
            "w1",
            "--epoch",
            "1",
        ],
        vec![
            "ack",
            "--redis-url",
            &url,
            "px_a",
            "--worker",
            "w1",
            "--epoch",
            "1",
            "--active",
            "0",
            "--reserved",
            "0",
        ],
        vec![
            "release",
            "--redis-url",
            &url,
            "px_a",
            "--worker",
            "w1",
            "--epoch",
            "1",
        ],
        vec!["health", "--redis-url", &url, "px_b"],
        vec!["remove", "--redis-url", &url, "px_b"],
        vec!["prune", "--redis-url", &url],
    ] {
        let (ok, out, err) = run(&args).await;
        assert!(ok, "{args:?}: {out} {err}");
    }
    // px_b failed its health check and was removed; px_a is back, epoch 2.
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids(), ["px_a"]);
}

/// `stats` groups and totals the inventory, and its counts are the
/// pool's: eligible is what an extraction then gets, stale entries (health
/// too old, past the safety margin) and those expiring within 5 minutes are
/// told apart; `--top` keeps the largest groups and sums the others.
#[tokio::test]
async fn stats_groups_and_totals_the_inventory() {
    let h = Harness::start().await;
    let url = h.redis.url();
    let now = now_ms();
    let mut proxies = common::proxies("a", 3);
    for id in ["b-soon-1", "b-soon-2"] {
        let mut p = common::proxy(id);
        (p.protocol, p.region, p.upstream) =
            ("socks5".into(), "beijing".into(), "provider-b".into());
        p.expires_at = now + 120_000; // within 5 minutes, beyond the 30 s minimum
        p.usable_until = p.expires_at;
        proxies.push(p);
    }
    h.load(&proxies).await;
    // Indexed when its health check was recent, older than the 120 s
    // allowed now (the loader would not index it).
    let mut stale = common::raw_record("b-stale", now + 600_000, now - 600_000);
    stale["protocol"] = "socks5".into();
    stale["region"] = "beijing".into();
    stale["upstream"] = "provider-b".into();
    common::plant(&h, &stale, common::Planted::ALL).await;
    // Indexed but past its safety margin (the loader would refuse it).
    let mut past_margin = common::raw_record("a-margin", now + 600_000, now);
    past_margin["usableUntil"] = (now - 1000).into();
    common::plant(&h, &past_margin, common::Planted::ALL).await;

    let (ok, out, err) = run(&["stats", "--redis-url", &url, "--by", "upstream"]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with(
            "eligible 5 (maxHealthCheckAge 120 s, minRemainingTTL 30 s), expiring within 5 min 2, stale 2 "
        ),
        "{out}"
    );
    assert!(lines[0].contains("indexed 7 in 2 combinations"), "{out}");
    assert_eq!(
        &lines[1..],
        [
            "upstream    eligible  expiring<5m  stale  indexed  combinations",
            "provider-a         3            0      1        4             1",
            "provider-b         2            2      1        3             1",
        ]
    );
    let (ok, out, _) = run(&[
        "stats",
        "--redis-url",
        &url,
        "--by",
        "protocol,region",
        "--top",
        "1",
    ])
    .await;
    assert!(ok);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[2].starts_with("http      shanghai         3"),
        "{out}"
    );
    assert_eq!(
        lines[3],
        "... and 1 more groups: eligible 2, expiring within 5 min 2, stale 1, indexed 3"
    );
    let (ok, out, _) = run(&["stats", "--redis-url", &url, "--json", "--by", "upstream"]).await;
    assert!(ok);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (
            &doc["eligible"],
            &doc["expiringWithin5Minutes"],
            &doc["stale"],
            &doc["indexed"]
        ),
        (&5.into(), &2.into(), &2.into(), &7.into())
    );
    assert_eq!(doc["buckets"].as_array().unwrap().len(), 2);
    assert_eq!(doc["groups"][1]["key"], serde_json::json!(["provider-b"]));
    assert_eq!(doc["groups"][1]["stale"], 1);
    // The count is the pool's own: an extraction gets exactly the eligible.
    assert_eq!(h.extract(r#"{"count":50}"#, &[]).await.ids().len(), 5);
}

/// Every command whose reader has gone (`proxy-pool stats | head`) stops
/// quietly with status 0: the pipe is closed before the command writes.
#[tokio::test]
async fn a_closed_output_pipe_ends_commands_quietly() {
    let h = Harness::start().await;
    h.load(&common::proxies("p", 5)).await;
    let url = h.redis.url();
    for args in [
        vec!["stats", "--redis-url", &url],
        vec!["stats", "--redis-url", &url, "--by", "upstream"],
        vec!["stats", "--redis-url", &url, "--json"],
        vec!["load-demo", "--redis-url", &url, "--size", "10"],
        vec!["clients", "list", "--redis-url", &url],
        vec!["hash-credential", "--generate"],
        vec!["prune", "--redis-url", &url],
        vec!["--help"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(BIN)
            .args(&args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(out.status.success(), "{args:?}: {} {stderr}", out.status);
        assert_eq!(stderr, "", "{args:?}");
    }
}

/// `hash-credential` prints the registry entry the server will match: for a
/// secret on stdin, a Basic user's password, and a freshly generated key.
#[tokio::test]
async fn hash_credential_entries_match_what_the_server_checks() {
    use proxy_pool::security::credentials::CredentialHash;
    let hash = |args: &[&str], stdin: &str| {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let stdin = stdin.to_owned();
        async move {
            let mut child = Command::new(BIN)
                .arg("hash-credential")
                .args(&args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            {
                use tokio::io::AsyncWriteExt;
                let mut input = child.stdin.take().unwrap();
                input.write_all(stdin.as_bytes()).await.unwrap();
            }
            let out = child.wait_with_output().await.unwrap();
            assert!(out.status.success());
            String::from_utf8(out.stdout).unwrap()
        }
    };
    let out = hash(&[], "pp_my_key_123\n").await;
    assert_eq!(out.trim(), CredentialHash::of(b"pp_my_key_123").encode());
    let out = hash(&["--basic-user", "acme"], "s3cret\n").await;
    assert_eq!(out.trim(), CredentialHash::of(b"acme:s3cret").encode());
    let out = hash(&["--generate"], "").await;
    let mut lines = out.lines();
    let secret = lines.next().unwrap().strip_prefix("secret: ").unwrap();
    assert!(secret.starts_with("pp_") && secret.len() == 67);
    assert_eq!(
        lines.next().unwrap(),
        CredentialHash::of(secret.as_bytes()).encode()
    );
}
