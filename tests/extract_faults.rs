//! The extraction endpoint when Redis fails it, one request at a time: Redis
//! down and back, a script error, `maxmemory` under each eviction policy
//! (readiness refusing `allkeys-*`), `SCRIPT FLUSH`, and a pool key of the
//! wrong type: a 500 or 503 problem, nothing changed and nothing lost, and
//! no pool key carrying a TTL for an eviction to take. Faults under load,
//! with 16 concurrent clients, are in `tests/faults.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::{Harness, proxies};
use proxy_pool::pool::{OutageClass, PoolContract, keys};
use proxy_pool::security::RegistryHandle;

/// Redis down: extract and ready answer 503 problems; when it is back,
/// service resumes by itself.
#[tokio::test]
async fn redis_outage_is_503_and_recovers() {
    let mut h = Harness::with_config(|c| c.redis_timeout = Duration::from_millis(500)).await;
    h.load(&proxies("o", 3)).await;
    assert_eq!(h.get("/health/ready").await.status, 200);
    h.redis.stop().await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    let r = h.get("/health/ready").await;
    assert_eq!(r.status, 503);
    assert_eq!(h.get("/health/live").await.status, 200);

    h.redis.restart().await.unwrap();
    assert_eq!(h.get("/health/ready").await.status, 200);
    h.load(&proxies("o", 3)).await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!((r.status, r.ids().len()), (200, 1));
}

/// A script that fails (here: the idempotency records' key of the wrong
/// type) answers a cause-free 500 and leaves the pool exactly as it was.
#[tokio::test]
async fn script_error_leaves_the_pool_untouched() {
    let h = Harness::start().await;
    h.load(&proxies("e", 4)).await;
    let mut conn = h.redis().await;
    let _: () = redis::cmd("SET")
        .arg(keys::IDEMPOTENCY)
        .arg("damaged")
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = h.snapshot().await;
    let r = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "broken-0001")])
        .await;
    assert_eq!((r.status, r.code()), (500, "INTERNAL_ERROR"));
    assert!(!r.body.contains("WRONGTYPE"));
    assert_eq!(h.snapshot().await, before);
}

/// At maxmemory the script is refused before it runs: 503, nothing changed.
#[tokio::test]
async fn out_of_memory_is_503_and_changes_nothing() {
    let h = Harness::start().await;
    h.load(&proxies("m", 4)).await;
    let before = h.snapshot().await;
    h.config_set("maxmemory", 1).await;
    let r = h.extract(r#"{"count":2}"#, &[]).await;
    assert_eq!(r.status, 503);
    h.config_set("maxmemory", 0).await;
    assert_eq!(h.snapshot().await, before);
    assert_eq!(h.extract(r#"{"count":2}"#, &[]).await.ids().len(), 2);
}

/// Under `volatile-lru` (ElastiCache's default) and under `noeviction`, a
/// Redis filled past its `maxmemory` answers writes 503 and loses nothing:
/// no pool key carries a TTL, so no eviction can take a proxy, an index
/// entry or an idempotency record in force. Rate-limit keys (with their
/// TTL) may go. Once memory is freed, a retried request replays and every
/// proxy is still there.
#[tokio::test]
async fn a_full_redis_loses_nothing_under_volatile_or_no_eviction() {
    for policy in ["volatile-lru", "noeviction"] {
        let h = Harness::with_redis_args(
            &["--maxmemory-policy", policy],
            |c| c.client_rate = None,
            RegistryHandle::default(),
        )
        .await;
        h.load(&proxies("keep", 50)).await;
        let key = [("idempotency-key", "full-redis-0001")];
        let first = h.extract(r#"{"count":2}"#, &key).await;
        assert_eq!(first.ids().len(), 2);
        let mut conn = h.redis().await;
        let used = h.used_memory().await;
        h.config_set("maxmemory", used + 256 * 1024).await;
        // Volatile keys to evict (as rate-limit state would be), then a fill
        // until Redis refuses.
        for i in 0..64 {
            let _: () = redis::cmd("SET")
                .arg(format!("{{pp}}:rl:filler:{i}"))
                .arg("x".repeat(1024))
                .arg("EX")
                .arg(3600)
                .query_async(&mut conn)
                .await
                .unwrap_or(());
        }
        let before = common::model::pool_state(&h.pool).await.unwrap();
        let mut refused = None;
        for round in 0..200 {
            let batch = proxies(&format!("fill{round}"), 100);
            if let Err(e) = PoolContract::new(&h.pool).upsert(&batch).await {
                refused = Some(e);
                break;
            }
        }
        let refused = refused.expect("the fill reached maxmemory");
        assert_eq!(
            refused.outage_class(),
            Some(OutageClass::Capacity),
            "{policy}"
        );
        // The refused call's own buffers are freed after it: the limit is
        // set below what Redis holds, so it stays full (a fill of small
        // calls can stop right at the limit).
        let full = h.used_memory().await;
        h.config_set("maxmemory", full.saturating_sub(64 * 1024))
            .await;
        let r = h.extract(r#"{"count":1}"#, &[]).await;
        assert_eq!(
            (r.status, r.code()),
            (503, "SERVICE_UNAVAILABLE"),
            "{policy}"
        );
        // Nothing the pool holds was evicted: its records, index and the
        // idempotency record (the fill may have added some proxies first).
        let during = common::model::pool_state(&h.pool).await.unwrap();
        for (id, record) in &before.records {
            assert_eq!(during.records.get(id), Some(record), "{policy}: {id}");
        }
        for (loc, d) in &before.index {
            assert_eq!(during.index.get(loc), Some(d), "{policy}: {loc}");
        }
        h.config_set("maxmemory", 0).await;
        let retry = h.extract(r#"{"count":2}"#, &key).await;
        assert_eq!(
            retry.header("idempotent-replayed"),
            Some("true"),
            "{policy}"
        );
        assert_eq!(retry.body, first.body);
    }
}

/// Readiness under an `allkeys-*` eviction policy, which may evict the
/// pool's keys: 503, reason `eviction-policy`; `volatile-lru` is ready.
#[tokio::test]
async fn readiness_refuses_an_allkeys_eviction_policy() {
    let h = Harness::with_redis_args(
        &["--maxmemory-policy", "allkeys-lru"],
        |_| {},
        RegistryHandle::default(),
    )
    .await;
    let r = h.get("/health/ready").await;
    assert_eq!(
        (r.status, r.code()),
        (503, "SERVICE_UNAVAILABLE"),
        "{}",
        r.body
    );
    assert_eq!(r.header("readiness-reasons"), Some("eviction-policy"));
    assert!(!r.body.contains("allkeys"), "{}", r.body);
    h.config_set("maxmemory-policy", "volatile-lru").await;
    assert_eq!(h.get("/health/ready").await.status, 200);
}

/// After SCRIPT FLUSH (restart, failover) the script is reloaded transparently.
#[tokio::test]
async fn script_flush_is_survived() {
    let h = Harness::start().await;
    h.load(&proxies("f", 2)).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
    let mut conn = h.redis().await;
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["f-0001"]);
}

/// No pool key carries a TTL, an idempotency record included: under a
/// `volatile-*` eviction policy Redis evicts only keys that have one.
#[tokio::test]
async fn pool_keys_carry_no_ttl() {
    let h = Harness::start().await;
    h.load(&proxies("t", 3)).await;
    h.extract(r#"{"count":1}"#, &[("idempotency-key", "ttl-check-1")])
        .await;
    let keys = h.assert_pool_keys_carry_no_ttl().await;
    for key in [keys::RECORDS, keys::DUE, keys::INDEX, keys::IDEMPOTENCY] {
        assert!(keys.iter().any(|k| k == key), "{key}: {keys:?}");
    }
}

/// A pool key of the wrong type (a write into it would fail after the
/// first write) is refused before anything is written: `due`, which an
/// extraction writes without reading, and the heads, which it reads.
#[tokio::test]
async fn damaged_pool_key_fails_before_writing() {
    for key in [keys::DUE, keys::HEADS] {
        let h = Harness::start().await;
        h.load(&proxies("b", 3)).await;
        let mut conn = h.redis().await;
        let _: () = redis::pipe()
            .del(key)
            .ignore()
            .set(key, "not a sorted set")
            .ignore()
            .query_async(&mut conn)
            .await
            .unwrap();
        let before = h.snapshot().await;
        let r = h.extract(r#"{"count":2}"#, &[]).await;
        assert_eq!((r.status, r.code()), (500, "INTERNAL_ERROR"), "{key}");
        assert_eq!(h.snapshot().await, before, "{key}");
    }
}
