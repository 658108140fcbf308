//! The pool contract against a real Redis: Worker ownership with fencing
//! epochs, drain, health results, removal, the exclusion of Worker claims
//! and client extractions under concurrency, and key lifetimes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{Harness, now_ms, proxies, proxy};
use proxy_pool::pool::{ContractOp, Maintenance, PoolContract, RedisPool, Verdict};

fn claim(id: &str, worker: &str) -> ContractOp {
    ContractOp::Claim {
        id: id.into(),
        worker: worker.into(),
        min_remaining_ttl: Duration::from_secs(30),
        max_health_check_age: Duration::from_secs(120),
    }
}

async fn verdict(pool: &RedisPool, op: ContractOp) -> (Verdict, u64) {
    let r = PoolContract::new(pool).apply(&op).await.unwrap();
    (r.verdict, r.epoch)
}

/// Claim, drain, acknowledge, release; a held proxy is never extracted, and
/// a stale holder's late writes are refused.
#[tokio::test]
async fn ownership_lifecycle_with_fencing() {
    let h = Harness::start().await;
    h.load(&[proxy("p1")]).await;
    let pool = &h.pool;
    assert_eq!(verdict(pool, claim("p1", "w1")).await, (Verdict::Ok, 1));
    assert_eq!(
        verdict(pool, claim("p1", "w2")).await.0,
        Verdict::Ineligible
    );
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 0);

    let drain = |worker: &str, epoch| ContractOp::Drain {
        id: "p1".into(),
        worker: worker.into(),
        epoch,
    };
    let ack = |worker: &str, epoch, active, reserved| ContractOp::Ack {
        id: "p1".into(),
        worker: worker.into(),
        epoch,
        active,
        reserved,
    };
    let release = |worker: &str, epoch| ContractOp::Release {
        id: "p1".into(),
        worker: worker.into(),
        epoch,
    };
    // Releasing before the drain completed is refused.
    assert_eq!(verdict(pool, release("w1", 1)).await.0, Verdict::State);
    assert_eq!(verdict(pool, ack("w1", 1, 0, 0)).await.0, Verdict::State);
    assert_eq!(verdict(pool, drain("w2", 1)).await.0, Verdict::NotOwner);
    assert_eq!(verdict(pool, drain("w1", 0)).await.0, Verdict::NotOwner);
    assert_eq!(verdict(pool, drain("w1", 1)).await.0, Verdict::Ok);
    assert_eq!(verdict(pool, ack("w1", 1, 1, 0)).await.0, Verdict::Ok);
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[]).await.ids().len(),
        0,
        "still active"
    );
    assert_eq!(verdict(pool, ack("w1", 1, 0, 0)).await.0, Verdict::Ok);
    // Drained with Active = Reserved = 0: allocatable again (rule 2)...
    let inventory = Maintenance::new(pool).inventory().await.unwrap();
    assert_eq!(inventory.held, 0);
    // ...and once ownership is cleared, the old holder is fenced off.
    assert_eq!(verdict(pool, release("w1", 1)).await, (Verdict::Ok, 2));
    assert_eq!(verdict(pool, ack("w1", 1, 0, 0)).await.0, Verdict::NotOwner);
    assert_eq!(verdict(pool, release("w1", 1)).await.0, Verdict::NotOwner);
    assert_eq!(verdict(pool, claim("p1", "w2")).await, (Verdict::Ok, 3));
    assert_eq!(verdict(pool, drain("w1", 2)).await.0, Verdict::NotOwner);
    assert_eq!(Maintenance::new(pool).inventory().await.unwrap().held, 1);
}

/// A DRAINED proxy (Active = Reserved = 0) can be extracted; once extracted,
/// no Worker can claim it back or write to it.
#[tokio::test]
async fn drained_proxies_are_extractable_and_then_gone() {
    let h = Harness::start().await;
    h.load(&[proxy("p1")]).await;
    let pool = &h.pool;
    assert_eq!(verdict(pool, claim("p1", "w1")).await.0, Verdict::Ok);
    let drain = ContractOp::Drain {
        id: "p1".into(),
        worker: "w1".into(),
        epoch: 1,
    };
    assert_eq!(verdict(pool, drain).await.0, Verdict::Ok);
    let ack = ContractOp::Ack {
        id: "p1".into(),
        worker: "w1".into(),
        epoch: 1,
        active: 0,
        reserved: 0,
    };
    assert_eq!(verdict(pool, ack).await.0, Verdict::Ok);
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["p1"]);
    assert_eq!(verdict(pool, claim("p1", "w1")).await.0, Verdict::Extracted);
    let release = ContractOp::Release {
        id: "p1".into(),
        worker: "w1".into(),
        epoch: 1,
    };
    assert_eq!(verdict(pool, release).await.0, Verdict::Extracted);
    assert_eq!(
        verdict(pool, ContractOp::Remove { id: "p1".into() })
            .await
            .0,
        Verdict::Extracted
    );
}

/// Health results move a proxy out of and back into the allocatable pool;
/// a result older than the recorded one is ignored.
#[tokio::test]
async fn health_results() {
    let h = Harness::start().await;
    h.load(&proxies("h", 2)).await;
    let pool = &h.pool;
    let health = |id: &str, ok, at| ContractOp::Health {
        id: id.into(),
        ok,
        checked_at: at,
    };
    assert_eq!(
        verdict(pool, health("h-0000", false, None)).await.0,
        Verdict::Ok
    );
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids(), ["h-0001"]);
    let stale = Some(now_ms() - 60_000);
    assert_eq!(
        verdict(pool, health("h-0000", true, stale)).await.0,
        Verdict::Stale
    );
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids().len(), 0);
    assert_eq!(
        verdict(pool, health("h-0000", true, None)).await.0,
        Verdict::Ok
    );
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids(), ["h-0000"]);
    assert_eq!(
        verdict(pool, health("nope", true, None)).await.0,
        Verdict::Unknown
    );
}

/// Removal takes a proxy out entirely.
#[tokio::test]
async fn remove() {
    let h = Harness::start().await;
    h.load(&proxies("r", 2)).await;
    assert_eq!(
        verdict(
            &h.pool,
            ContractOp::Remove {
                id: "r-0000".into()
            }
        )
        .await
        .0,
        Verdict::Ok
    );
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids(), ["r-0001"]);
    let state = common::model::pool_state(&h.pool).await.unwrap();
    assert!(!state.records.contains_key("r-0000") && !state.expiry.contains_key("r-0000"));
}

/// Workers claiming and clients extracting from one pool at the same time:
/// no proxy is both claimed and extracted, and none is extracted twice.
/// Two Workers race for each proxy too (pairs share a parity).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_and_extractions_never_overlap() {
    let h = Harness::start().await;
    let n = 300;
    h.load(&proxies("c", n)).await;
    let mut tasks = Vec::new();
    for w in 0..4 {
        let pool = h.pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut claimed = Vec::new();
            // From the latest-expiring end, while clients take the soonest:
            // both sides get some, and they meet in the middle.
            for i in (0..n).rev().skip(w % 2).step_by(2) {
                let id = format!("c-{i:04}");
                let r = PoolContract::new(&pool)
                    .apply(&claim(&id, &format!("w{w}")))
                    .await
                    .unwrap();
                if r.verdict == Verdict::Ok {
                    claimed.push(id);
                }
            }
            (claimed, Vec::new())
        }));
    }
    for c in 0..8 {
        let app = h.app.clone();
        tasks.push(tokio::spawn(async move {
            let mut extracted = Vec::new();
            for _ in 0..10 {
                let peer = format!("127.0.1.{c}:1");
                let r = common::extract_as(&app, r#"{"count":3}"#, &[], &peer).await;
                assert_eq!(r.status, 200);
                extracted.extend(r.ids());
            }
            (Vec::new(), extracted)
        }));
    }
    let (mut claimed, mut extracted) = (HashSet::new(), HashSet::new());
    for t in tasks {
        let (c, e) = t.await.unwrap();
        for id in c {
            assert!(claimed.insert(id.clone()), "{id} claimed twice");
        }
        for id in e {
            assert!(extracted.insert(id.clone()), "{id} extracted twice");
        }
    }
    assert!(claimed.is_disjoint(&extracted));
    assert!(!claimed.is_empty() && !extracted.is_empty());
    assert!(claimed.len() + extracted.len() <= n);
    let held = Maintenance::new(&h.pool).inventory().await.unwrap().held;
    assert_eq!(held as usize, claimed.len());
}

/// No pool key carries a TTL, and a pool left alone past every expiry is
/// emptied by the scheduled prune: no pool key is left (claims, drains and
/// releases on the way create and empty the index keys again).
#[tokio::test]
async fn a_pool_left_alone_is_emptied_by_the_prune() {
    let h = Harness::with_config(|c| {
        c.min_remaining_ttl = Duration::ZERO;
        c.idempotency_ttl = Duration::from_secs(1);
        c.client_rate = None;
    })
    .await;
    let mut batch = proxies("t", 6);
    let latest = now_ms() + 1_500;
    for (i, p) in batch.iter_mut().enumerate() {
        p.expires_at = latest - i as i64 * 100;
        p.usable_until = p.expires_at;
    }
    h.load(&batch).await;
    h.extract(r#"{"count":2}"#, &[("idempotency-key", "ttl-key-0001")])
        .await;
    let pool = &h.pool;
    let ids: Vec<String> = batch.iter().map(|p| p.id.clone()).collect();
    for id in &ids[1..] {
        verdict(pool, ContractOp::Remove { id: id.clone() }).await;
    }
    // t-0000 alone is left: its claim empties the index and its release
    // fills it again.
    let id = batch[0].id.clone();
    let c = ContractOp::Claim {
        id: id.clone(),
        worker: "w".into(),
        min_remaining_ttl: Duration::ZERO,
        max_health_check_age: Duration::from_secs(60),
    };
    assert_eq!(verdict(pool, c).await.0, Verdict::Ok);
    for op in [
        ContractOp::Drain {
            id: id.clone(),
            worker: "w".into(),
            epoch: 1,
        },
        ContractOp::Ack {
            id: id.clone(),
            worker: "w".into(),
            epoch: 1,
            active: 0,
            reserved: 0,
        },
        ContractOp::Release {
            id,
            worker: "w".into(),
            epoch: 1,
        },
    ] {
        assert_eq!(verdict(pool, op).await.0, Verdict::Ok);
    }
    let keys = h.assert_pool_keys_carry_no_ttl().await;
    assert!(keys.len() >= 5, "{keys:?}");
    common::model::pool_state(pool).await.unwrap();
    // Past every expiry and the idempotency window, the prune leaves no
    // pool key behind.
    let until = latest.max(now_ms() + 1_000);
    while now_ms() <= until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = Maintenance::new(pool)
        .prune_expired(1000, 10, None)
        .await
        .unwrap();
    assert!(report.complete && report.records > 0, "{report:?}");
    let mut conn = h.redis().await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("{pp}:v4:*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(left, ["{pp}:v4:cnt"], "only cnt is left (its meta and enc)");
    let mut fields: Vec<String> = redis::cmd("HKEYS")
        .arg("{pp}:v4:cnt")
        .query_async(&mut conn)
        .await
        .unwrap();
    fields.sort();
    assert_eq!(fields, ["enc", "meta"]);
}

/// A refresh that moves a proxy's only index entry (a new expiry) empties
/// the index keys and fills them again in one call; a short-lived proxy
/// added after it and expired leaves the long one where it was.
#[tokio::test]
async fn an_index_emptied_and_filled_again_holds_its_entry() {
    let h = Harness::with_config(|c| c.min_remaining_ttl = Duration::ZERO).await;
    let mut long = proxy("long");
    long.expires_at = now_ms() + 60_000;
    long.usable_until = long.expires_at - 1_000;
    h.load(std::slice::from_ref(&long)).await;
    long.expires_at -= 10_000;
    long.usable_until = long.expires_at - 1_000;
    h.load(std::slice::from_ref(&long)).await;
    let state = common::model::pool_state(&h.pool).await.unwrap();
    assert_eq!(state.index.len(), 1);
    let mut short = proxy("short");
    short.region = "beijing".into();
    short.expires_at = now_ms() + 300;
    short.usable_until = short.expires_at;
    h.load(&[short]).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(reply.ids(), ["long"]);
}
