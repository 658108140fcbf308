//! The Redis client registry (`PROXY_POOL_CLIENT_REGISTRY=redis`): lookup by
//! digest, changes seen by the next request (revocation under load,
//! rotation, limits), import of a registry document, 100,000 clients, the
//! `clients` CLI, and logs without credentials.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

use common::{Harness, proxies};
use proxy_pool::pool::PutMode;
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, ClientEntry, RedisRegistry};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_proxy-pool");

fn digest(secret: &str) -> String {
    CredentialHash::of(secret.as_bytes()).encode()
}

/// A registry document of clients `from..to`, client `i` holding key `pp_key_<i>`.
fn document(from: usize, to: usize) -> String {
    let clients: Vec<serde_json::Value> = (from..to)
        .map(|i| serde_json::json!({"id": format!("c{i}"), "apiKeys": [digest(&format!("pp_key_{i}"))]}))
        .collect();
    serde_json::json!({ "clients": clients }).to_string()
}

async fn harness() -> Harness {
    let h = Harness::with_redis_registry(|c| {
        c.auth_schemes = AuthSchemes::parse("apiKey,bearer,basic").unwrap();
        c.reserve_for_gateway = 0;
    })
    .await;
    h.load(&proxies("reg", 50)).await;
    h
}

fn registry(h: &Harness) -> RedisRegistry {
    RedisRegistry::new(h.pool.clone())
}

/// An imported registry document is served from Redis: every credential
/// kind finds its client and that client's settings apply; an unknown key
/// is 401; only digests are stored.
#[tokio::test]
async fn imported_clients_are_found_by_digest() {
    let h = harness().await;
    let doc = serde_json::json!({"clients": [
        {"id": "acme", "apiKeys": [digest("pp_acme")], "bearerTokens": [digest("tok-acme")],
         "basic": [digest("acme:pw")], "allowedUpstreams": ["provider-b"], "maxCount": 2},
        {"id": "beta", "apiKeys": [digest("pp_beta")], "allowedSources": ["198.51.100.0/24"]}
    ]});
    let done = registry(&h).import(&doc.to_string()).await.unwrap();
    assert_eq!((done.added, done.replaced), (2, 0));

    // acme may use provider-b only, which holds nothing: 200 with none.
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_acme")])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.ids().is_empty());
    let r = h
        .extract(r#"{"count":3}"#, &[("authorization", "Bearer tok-acme")])
        .await;
    assert_eq!(r.status, 422, "maxCount 2 applies: {}", r.body);
    let r = h
        .extract(r#"{"count":1}"#, &[("authorization", "Basic YWNtZTpwdw==")])
        .await;
    assert_eq!(r.status, 200);
    // beta only from its network.
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_beta")])
        .await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_FORBIDDEN"));
    // Unknown, and a key presented as the wrong kind.
    for headers in [
        [("x-api-key", "pp_nobody")],
        [("authorization", "Bearer pp_acme")],
    ] {
        let r = h.extract(r#"{"count":1}"#, &headers).await;
        assert_eq!(r.status, 401);
        assert!(r.header("www-authenticate").is_some());
    }
    let dump = h.snapshot().await;
    let all = format!("{dump:?}");
    for secret in ["pp_acme", "tok-acme", "acme:pw", "pp_beta"] {
        assert!(!all.contains(secret), "{secret} stored in Redis");
    }
}

/// A revocation during concurrent load is refused at once: no request sent
/// after `revoke` returned is answered 200, on any of 8 concurrent callers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn revoked_key_is_refused_at_once_under_load() {
    let h = Arc::new(harness().await);
    registry(&h).import(&document(0, 2)).await.unwrap();
    let revoked = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicUsize::new(0));
    let warmed = Arc::new(tokio::sync::Notify::new());
    let mut callers = Vec::new();
    for _ in 0..8 {
        let (h, revoked, admitted, warmed) =
            (h.clone(), revoked.clone(), admitted.clone(), warmed.clone());
        callers.push(tokio::spawn(async move {
            let mut refused_after = 0;
            let mut late_200 = 0;
            while refused_after < 20 {
                let after = revoked.load(Ordering::SeqCst);
                let r = h
                    .extract(r#"{"count":1}"#, &[("x-api-key", "pp_key_0")])
                    .await;
                match (after, r.status) {
                    (true, 200) => late_200 += 1,
                    (true, 401) => refused_after += 1,
                    (false, 200) => {
                        if admitted.fetch_add(1, Ordering::SeqCst) + 1 == 40 {
                            warmed.notify_one();
                        }
                    }
                    (_, s) => assert!(s == 401, "unexpected {s}: {}", r.body),
                }
            }
            late_200
        }));
    }
    warmed.notified().await;
    assert_eq!(registry(&h).revoke("c0").await.unwrap(), Some(1));
    revoked.store(true, Ordering::SeqCst);
    let mut late = 0;
    for c in callers {
        late += c.await.unwrap();
    }
    assert_eq!(late, 0, "200s after the revocation completed");
    assert!(admitted.load(Ordering::SeqCst) >= 40);
    // The other client is untouched.
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_key_1")])
        .await;
    assert_eq!(r.status, 200);
}

/// Rotation retires the old key and admits the new one on the next
/// request; a limit changed in Redis applies on the next request too.
#[tokio::test]
async fn rotation_and_limit_changes_apply_on_the_next_request() {
    let h = harness().await;
    let reg = registry(&h);
    reg.import(&document(0, 1)).await.unwrap();
    let old = [("x-api-key", "pp_key_0")];
    assert_eq!(h.extract(r#"{"count":5}"#, &old).await.status, 200);

    let mut entry = reg.entry("c0").await.unwrap().unwrap();
    entry.api_keys = vec![digest("pp_key_0_next")];
    entry.max_count = Some(2);
    reg.store(PutMode::Replace, &[entry]).await.unwrap();
    assert_eq!(h.extract(r#"{"count":1}"#, &old).await.status, 401);
    let new = [("x-api-key", "pp_key_0_next")];
    assert_eq!(h.extract(r#"{"count":2}"#, &new).await.status, 200);
    assert_eq!(h.extract(r#"{"count":3}"#, &new).await.status, 422);
}

/// Changes are all or nothing: a key owned by another client, an id added
/// twice, or a replace of an unknown id is refused and changes nothing.
#[tokio::test]
async fn conflicting_changes_are_refused_whole() {
    let h = harness().await;
    let reg = registry(&h);
    reg.import(&document(0, 2)).await.unwrap();
    let before = h.snapshot().await;
    let thief: ClientEntry =
        serde_json::from_value(serde_json::json!({"id": "thief", "apiKeys": [digest("pp_key_1")]}))
            .unwrap();
    let fresh: ClientEntry = serde_json::from_str(r#"{"id":"fresh"}"#).unwrap();
    let c0 = reg.entry("c0").await.unwrap().unwrap();
    for (mode, batch, reason) in [
        (PutMode::Put, vec![fresh.clone(), thief], "taken"),
        (PutMode::Add, vec![fresh.clone(), c0], "exists"),
        (PutMode::Replace, vec![fresh], "unknown"),
    ] {
        let err = reg.store(mode, &batch).await.unwrap_err();
        assert!(
            matches!(&err, proxy_pool::security::DirectoryError::Refused { reason: r, .. } if r == reason),
            "{err}"
        );
        assert_eq!(h.snapshot().await, before);
    }
}

/// 100,000 clients load in batches of 1,000 (timed, printed) and the first,
/// a middle and the last are still found in one lookup each.
#[tokio::test]
async fn hundred_thousand_clients() {
    let h = harness().await;
    let reg = registry(&h);
    let started = Instant::now();
    let done = reg.import(&document(0, 100_000)).await.unwrap();
    eprintln!("imported 100,000 clients in {:?}", started.elapsed());
    assert_eq!(done.added, 100_000);
    let mut conn = h.redis().await;
    let n: u64 = redis::cmd("HLEN")
        .arg("{pp}:clients")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(n, 100_000);
    for i in [0, 54_321, 99_999] {
        let key = format!("pp_key_{i}");
        let r = h.extract(r#"{"count":1}"#, &[("x-api-key", &key)]).await;
        assert_eq!(r.status, 200, "client {i}");
    }
    assert_eq!(reg.list().await.unwrap().len(), 100_000);
}

/// Requests resolved through the Redis registry (admitted, unknown,
/// revoked) log no credential and no digest, at the most verbose level.
#[tokio::test]
async fn registry_logs_carry_no_credential() {
    let captured = common::Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_env_filter("trace")
        .with_writer(move || sink.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let h = harness().await;
    let reg = registry(&h);
    reg.import(&document(0, 1)).await.unwrap();
    let key = [("x-api-key", "pp_key_0")];
    assert_eq!(h.extract(r#"{"count":1}"#, &key).await.status, 200);
    let wrong = [("x-api-key", "pp_key_wrong")];
    assert_eq!(h.extract(r#"{"count":1}"#, &wrong).await.status, 401);
    reg.revoke("c0").await.unwrap();
    assert_eq!(h.extract(r#"{"count":1}"#, &key).await.status, 401);
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("\"client_id\":\"c0\""), "{logs}");
    let hex = |s: &str| CredentialHash::of(s.as_bytes()).hex();
    for secret in ["pp_key_0", "pp_key_wrong"] {
        assert!(!logs.contains(secret), "{secret} logged");
        assert!(!logs.contains(&hex(secret)), "digest of {secret} logged");
    }
}

async fn cli(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// `clients add|rotate|list|revoke|import` manage the registry the handler
/// reads: the key `add` prints works, `rotate`'s replaces it, `revoke`
/// stops it, `import` reads a document file, `list` shows them.
#[tokio::test]
async fn clients_cli_manages_the_registry() {
    let h = harness().await;
    let url = h.redis.url();
    let secret_of = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("api key (shown once): "))
            .unwrap()
            .to_owned()
    };
    let (ok, out, err) = cli(&[
        "clients",
        "add",
        "acme",
        "--redis-url",
        &url,
        "--max-count",
        "3",
        "--rate",
        "5:10",
    ])
    .await;
    assert!(ok, "{err}");
    let first = secret_of(&out);
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", &first)])
            .await
            .status,
        200
    );
    let (ok, _, err) = cli(&["clients", "add", "acme", "--redis-url", &url]).await;
    assert!(!ok && err.contains("already registered"), "{err}");

    let (ok, out, err) = cli(&["clients", "rotate", "acme", "--redis-url", &url]).await;
    assert!(ok, "{err}");
    let second = secret_of(&out);
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", &first)])
            .await
            .status,
        401
    );
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", &second)])
            .await
            .status,
        200
    );

    let file = std::env::temp_dir().join(format!("pp-clients-{}.json", h.redis.port()));
    std::fs::write(&file, document(0, 3)).unwrap();
    let (ok, out, err) = cli(&[
        "clients",
        "import",
        file.to_str().unwrap(),
        "--redis-url",
        &url,
    ])
    .await;
    let _ = std::fs::remove_file(&file);
    assert!(ok, "{err}");
    assert!(
        out.contains("imported 3 client(s): 3 added, 0 replaced"),
        "{out}"
    );

    let (ok, out, _) = cli(&["clients", "list", "--redis-url", &url]).await;
    assert!(ok);
    assert!(
        out.contains("acme") && out.contains("5:10") && out.contains("4 client(s)"),
        "{out}"
    );
    assert!(!out.contains(&second) && !out.contains("sha256:"), "{out}");
    let (ok, out, _) = cli(&["clients", "list", "--json", "--redis-url", &url]).await;
    assert!(ok);
    let listed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed["clients"].as_array().unwrap().len(), 4);

    let (ok, out, err) = cli(&["clients", "revoke", "acme", "--redis-url", &url]).await;
    assert!(ok && out.contains("1 credential(s) removed"), "{err}");
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", &second)])
            .await
            .status,
        401
    );
    let (ok, _, err) = cli(&["clients", "revoke", "acme", "--redis-url", &url]).await;
    assert!(!ok && err.contains("not registered"), "{err}");
}
