//! The public contract library (`proxy_pool_v3`) as programs in other
//! languages call it: a Python health checker, Controller and Worker
//! (`tests/python/contract_client.py`, redis-py's `fcall` and nothing
//! else) works on a pool the Rust side loaded, and the Rust side sees the
//! same pool; `proxy-pool functions` prepares a fresh Redis; the scheduled
//! job loads a missing public library; a public library that cannot be
//! loaded leaves this deployment's own path alone.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;

use common::{Captured, Harness, now_ms};
use proxy_pool::clock::rfc3339;
use proxy_pool::local::{RedisServer, demo_proxies};
use proxy_pool::pool::{
    ContractOp, Maintenance, PoolContract, UpsertStatus, Verdict, contract_functions,
    contract_library, keys,
};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-pool");

/// The repository's virtualenv interpreter, which has redis-py.
fn python() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/deps.sh quick` (installs redis-py into .venv)",
        path.display()
    );
    path
}

/// Runs `tests/python/contract_client.py` against `url` with `input` on
/// its standard input; its JSON summary.
async fn run_client(url: &str, input: &Value) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/contract_client.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(url)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the venv's python runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON summary ({e}): {stderr}"))
}

fn strings(v: &Value) -> BTreeSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

/// Libraries whose name is `name` on the Redis at `url` (0 or 1).
async fn listed(url: &str, name: &str) -> usize {
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let libraries: Vec<redis::Value> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(name)
        .query_async(&mut conn)
        .await
        .unwrap();
    libraries.len()
}

/// A Python client records 600 health results in batches (every sixth
/// failed), refreshes three proxies an hour later, adds one without
/// credentials, and claims, drains, acks (0, 0) and releases one, checking
/// every verdict; the Rust side then hands out exactly the proxies that
/// passed and the added one (none that failed), shows the refreshed
/// expiries and the added proxy's details, counts the same inventory, and
/// holds the released proxy AVAILABLE at the epoch Python saw.
#[tokio::test]
async fn a_python_client_drives_the_contract_the_rust_side_sees() {
    let h = Harness::start().await;
    let loaded = demo_proxies(600, now_ms());
    let statuses = h.load(&loaded).await;
    assert_eq!(statuses, [UpsertStatus::Added; 600]);
    // The adapter's first script call loaded both libraries.
    assert_eq!(listed(&h.redis.url(), contract_library()).await, 1);

    let input = serde_json::json!({
        "policy": h.pool.policy().script_arg(),
        "proxies": loaded,
    });
    let summary = run_client(&h.redis.url(), &input).await;
    assert_eq!(summary["library"], contract_library());

    let ids: BTreeSet<String> = loaded.iter().map(|p| p.id.clone()).collect();
    let failed = strings(&summary["failed"]);
    let passed = strings(&summary["passed"]);
    assert!(!failed.is_empty() && !passed.is_empty(), "{summary}");
    assert!(failed.is_disjoint(&passed));
    assert_eq!(&failed | &passed, ids, "every proxy got one health result");

    // The released proxy: AVAILABLE, no owner, the epoch Python saw; a late
    // write with the claim's epoch is fenced off at that epoch.
    let claimed = &summary["claimed"];
    let target = claimed["id"].as_str().unwrap();
    let epoch = claimed["epoch"].as_u64().unwrap();
    assert_eq!(epoch, claimed["claimEpoch"].as_u64().unwrap() + 1);
    let mut conn = h.redis().await;
    let raw: String = redis::cmd("HGET")
        .arg(keys::RECORDS)
        .arg(target)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(common::status_of(&raw), "AVAILABLE", "{target}");
    let fields: Vec<&str> = raw.split('\t').collect();
    assert_eq!(fields[5], epoch.to_string(), "the record's epoch");
    assert_eq!(fields[8], "", "no owner");
    let late = PoolContract::new(&h.pool)
        .apply(&ContractOp::Release {
            id: target.into(),
            worker: claimed["worker"].as_str().unwrap().into(),
            epoch: claimed["claimEpoch"].as_u64().unwrap(),
        })
        .await
        .unwrap();
    assert_eq!((late.verdict, late.epoch), (Verdict::NotOwner, epoch));

    // The inventory Python counted is the Rust side's.
    let inventory = Maintenance::new(&h.pool).inventory().await.unwrap();
    let eligible: u64 = inventory.buckets.iter().map(|b| b.eligible).sum();
    assert_eq!(eligible, summary["eligible"].as_u64().unwrap());
    assert_eq!(eligible as usize, passed.len() + 1);
    assert_eq!(inventory.held, 0);

    // Everything extractable, drawn out: the passed proxies and the added
    // one, none that failed, none refused whole.
    let mut extracted: BTreeMap<String, Value> = BTreeMap::new();
    for _ in 0..20 {
        let r = h.extract(r#"{"count":100}"#, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let proxies = r.json["proxies"].as_array().unwrap().clone();
        if proxies.is_empty() {
            break;
        }
        for p in proxies {
            let id = p["id"].as_str().unwrap().to_owned();
            assert!(extracted.insert(id.clone(), p).is_none(), "{id} twice");
        }
    }
    let added = &summary["added"];
    let added_id = added["id"].as_str().unwrap();
    let mut expected = passed.clone();
    expected.insert(added_id.to_owned());
    let got: BTreeSet<String> = extracted.keys().cloned().collect();
    let failed_out: Vec<_> = failed.intersection(&got).collect();
    assert!(
        failed_out.is_empty(),
        "failed proxies handed out: {failed_out:?}"
    );
    assert_eq!(got, expected);
    assert!(!got.contains(summary["neverAdded"].as_str().unwrap()));

    // The refreshed expiries, an hour after the loaded ones.
    let refreshed = summary["refreshed"].as_object().unwrap();
    assert_eq!(refreshed.len(), 3);
    for (id, expires) in refreshed {
        let expires = expires.as_i64().unwrap();
        let before = loaded.iter().find(|p| &p.id == id).unwrap().expires_at;
        assert_eq!(expires, before + 3_600_000);
        assert_eq!(extracted[id]["expiresAt"], rfc3339(expires), "{id}");
    }

    // The added proxy, as Python wrote it: no credentials, region or carrier.
    let p = &extracted[added_id];
    assert_eq!(p["protocol"], "socks5");
    assert_eq!(p["url"], "socks5://203.0.113.7:1080");
    assert_eq!(p["upstream"], "provider-py");
    assert_eq!(
        p["expiresAt"],
        rfc3339(added["expiresAt"].as_i64().unwrap())
    );
    for absent in ["username", "password", "region", "carrier"] {
        assert!(p.get(absent).is_none(), "{absent}: {p}");
    }
}

/// `proxy-pool functions` loads both libraries into a fresh Redis and
/// prints the public library's name and functions, one a line (again, the
/// same, on a second run); a function of it then answers an `FCALL` with
/// the pool keys.
#[tokio::test]
async fn the_functions_command_prepares_a_fresh_redis() {
    let server = RedisServer::start()
        .await
        .expect("redis-server must be installed for the tests");
    assert_eq!(listed(&server.url(), "proxy_pool_*").await, 0);
    let mut expected = vec![contract_library().to_owned()];
    expected.extend(contract_functions().iter().cloned());
    assert_eq!(expected.len(), 5);
    for _ in 0..2 {
        let out = Command::new(BIN)
            .args(["functions", "--redis-url", &server.url()])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(stdout.lines().collect::<Vec<_>>(), expected);
    }
    assert_eq!(listed(&server.url(), contract_library()).await, 1);
    assert_eq!(listed(&server.url(), "proxy_pool_*").await, 2);

    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    type Page = (i64, Vec<redis::Value>, u64, String, u8, u64, u64);
    let (_, rows, held, cursor, exact, records, tombstones): Page = redis::cmd("FCALL")
        .arg(format!("{}_inventory", contract_library()))
        .arg(keys::POOL.len())
        .arg(&keys::POOL)
        .arg("120000|30000")
        .arg("0")
        .arg(100)
        .arg(300_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((rows.len(), held, cursor.as_str(), exact), (0, 0, "0", 1));
    assert_eq!((records, tombstones), (0, 0));
}

/// The scheduled job's load (`load_maintenance_scripts`) finds the private
/// library present and the public one missing, and loads the public one.
#[tokio::test]
async fn the_scheduled_job_loads_a_missing_public_library() {
    let h = Harness::start().await;
    Maintenance::new(&h.pool).load_scripts().await.unwrap();
    assert_eq!(listed(&h.redis.url(), contract_library()).await, 1);
    let mut conn = h.redis().await;
    let _: () = redis::cmd("FUNCTION")
        .arg("DELETE")
        .arg(contract_library())
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(listed(&h.redis.url(), contract_library()).await, 0);
    assert_eq!(listed(&h.redis.url(), "proxy_pool_*").await, 1);
    Maintenance::new(&h.pool).load_scripts().await.unwrap();
    assert_eq!(listed(&h.redis.url(), contract_library()).await, 1);
}

/// A public library Redis will not load (another library already registers
/// one of its function names) costs this deployment nothing: its own
/// library loads, its scripts run as Functions, a warning names the public
/// library; `proxy-pool functions` reports the failure and exits 1.
#[tokio::test]
async fn a_public_library_that_cannot_load_leaves_the_private_path_alone() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let h = Harness::start().await;
    let squatter = format!(
        "#!lua name=squatter\nredis.register_function('{}_upsert', function() return 1 end)",
        contract_library()
    );
    let mut conn = h.redis().await;
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(&squatter)
        .query_async(&mut conn)
        .await
        .unwrap();

    h.load(&common::proxies("sq", 3)).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["sq-0000"]);
    assert!(h.pool.uses_functions());
    assert_eq!(listed(&h.redis.url(), contract_library()).await, 0);
    assert_eq!(listed(&h.redis.url(), "proxy_pool_*").await, 1);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let warning = logs
        .lines()
        .find(|l| l.contains("public contract library could not be loaded"))
        .unwrap_or_else(|| panic!("no warning in {logs}"));
    assert!(warning.contains(contract_library()), "{warning}");
    assert!(warning.contains("\"WARN\""), "{warning}");
    assert!(!warning.contains(&h.redis.url()), "{warning}");

    let out = Command::new(BIN)
        .args(["functions", "--redis-url", &h.redis.url()])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the function libraries could not be loaded"),
        "{stderr}"
    );
}
