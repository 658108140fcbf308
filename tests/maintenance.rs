//! Pool upkeep against a real Redis: `lua/prune.lua`, `lua/inventory.lua`
//! and the scheduled health check built on them.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Harness, Planted, now_ms, plant, proxies, proxy, raw_record};
use lambda_runtime::{Context, LambdaEvent};
use proxy_pool::lambda::{Function, FunctionError};
use proxy_pool::pool::{Maintenance, PoolError, keys};
use proxy_pool::scheduled;
use serde_json::{Value, json};

const COMBINATION: &str = "http|shanghai|telecom|provider-a";

/// Writes a proxy straight into Redis (see [`common::plant`]), as a damaged
/// or racing pool could hold it, in `region`, last checked a minute before
/// it expires.
async fn plant_in(h: &Harness, id: &str, region: &str, expires: i64, what: Planted) {
    let mut rec = raw_record(id, expires, expires - 60_000);
    rec["region"] = region.into();
    plant(h, &rec, what).await;
}

async fn zrange(h: &Harness, key: &str) -> Vec<(String, f64)> {
    let mut conn = h.redis().await;
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await
        .unwrap()
}

async fn hgetall(h: &Harness, key: &str) -> BTreeMap<String, String> {
    let mut conn = h.redis().await;
    redis::cmd("HGETALL")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Expired records, tombstones and index entries go; live proxies stay;
/// the layout stays consistent and a second run changes nothing.
#[tokio::test]
async fn prune_removes_only_what_has_expired() {
    let h = Harness::start().await;
    let now = now_ms();
    h.load(&proxies("live", 4)).await;
    h.load(&[proxy("refreshed")]).await;
    h.load(&[proxy("refreshed")]).await;
    plant_in(&h, "gone-1", "shanghai", now - 5_000, Planted::ALL).await;
    plant_in(&h, "gone-2", "shanghai", now - 4_000, Planted::ALL).await;
    plant_in(&h, "gone-bj", "beijing", now - 3_000, Planted::ALL).await;
    plant_in(&h, "gone-sz", "shenzhen", now - 2_000, Planted::ALL).await;
    let mut conn = h.redis().await;
    // A tombstone (its `due` member alone, in band 1) whose expiry passed.
    let _: () = redis::cmd("ZADD")
        .arg(keys::DUE)
        .arg(10_000_000_000_000i64 + now - 1_000)
        .arg("tomb")
        .query_async(&mut conn)
        .await
        .unwrap();

    let report = Maintenance::new(&h.pool)
        .prune_expired(500, 5, None)
        .await
        .unwrap();
    assert_eq!(
        report.records, 5,
        "gone-1, gone-2, gone-bj, gone-sz, tomb: {report:?}"
    );
    assert_eq!(report.index_entries, 4, "gone-1, gone-2, gone-bj, gone-sz");
    assert!(report.complete);
    assert_eq!(report.batches, 1);

    let records = hgetall(&h, keys::RECORDS).await;
    let mut ids: Vec<&str> = records.keys().map(String::as_str).collect();
    ids.sort();
    assert_eq!(
        ids,
        [
            "live-0000",
            "live-0001",
            "live-0002",
            "live-0003",
            "refreshed"
        ]
    );
    let due = zrange(&h, keys::DUE).await;
    assert_eq!(due.len(), 5, "{due:?}");
    let state = common::model::pool_state(&h.pool).await.unwrap();
    assert_eq!(state.index.len(), 5, "{:?}", state.index);

    let before = h.snapshot().await;
    let again = Maintenance::new(&h.pool)
        .prune_expired(500, 5, None)
        .await
        .unwrap();
    assert_eq!((again.records, again.index_entries), (0, 0));
    assert_eq!(h.snapshot().await, before);

    let r = h.extract(r#"{"count":100}"#, &[]).await;
    assert_eq!(r.ids().len(), 5, "every live proxy is still eligible");
}

/// A record deleted by hand (not through the contract's `remove`) leaves
/// its `due` entry, index entry and counters behind: the prune takes the
/// `due` entry out (it names no record to read), and extraction passes the
/// index entry without handing anything out, answering from the live
/// proxies around it.
#[tokio::test]
async fn a_record_deleted_by_hand_is_never_handed_out() {
    let h = Harness::start().await;
    let now = now_ms();
    h.load(&proxies("live", 3)).await;
    let ghost = Planted {
        record: false,
        index: true,
        expiry: false,
    };
    plant_in(&h, "ghost-past", "shanghai", now - 2_000, ghost).await;
    plant_in(&h, "ghost-ahead", "shanghai", now + 3_600_000, ghost).await;
    let report = Maintenance::new(&h.pool)
        .prune_expired(500, 5, None)
        .await
        .unwrap();
    assert_eq!((report.records, report.index_entries), (0, 1), "{report:?}");
    let due: Vec<String> = zrange(&h, keys::DUE)
        .await
        .into_iter()
        .map(|(m, _)| m)
        .collect();
    assert!(!due.contains(&"ghost-past".to_owned()), "{due:?}");
    let r = h
        .extract(r#"{"count":100,"filters":{"regions":["shanghai"]}}"#, &[])
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut ids = r.ids();
    ids.sort();
    assert_eq!(ids, ["live-0000", "live-0001", "live-0002"]);
}

/// Records and tombstones past their expiry, out of the index (a few
/// commands each, no index change), go four times as fast as spent index
/// entries: a call ends up to four batches of them, so a steady pool's
/// tombstones are deleted as fast as they expire.
#[tokio::test]
async fn ended_records_go_four_batches_a_call() {
    let h = Harness::start().await;
    let now = now_ms();
    h.load(&proxies("live", 2)).await;
    let ended = Planted {
        record: true,
        index: false,
        expiry: true,
    };
    for i in 0..45 {
        plant_in(
            &h,
            &format!("ended-{i:02}"),
            "shanghai",
            now - 100_000 + i * 1_000,
            ended,
        )
        .await;
    }
    let first = Maintenance::new(&h.pool)
        .prune_expired(10, 1, None)
        .await
        .unwrap();
    assert_eq!(
        (
            first.batches,
            first.records,
            first.index_entries,
            first.complete
        ),
        (1, 40, 0, false)
    );
    let rest = Maintenance::new(&h.pool)
        .prune_expired(10, 10, None)
        .await
        .unwrap();
    assert_eq!((rest.records, rest.complete), (5, true));
    assert_eq!(hgetall(&h, keys::RECORDS).await.len(), 2);
}

/// One run does at most `max_batches` calls of `batch` entries and says when
/// it stopped early; the next run finishes the job.
#[tokio::test]
async fn prune_is_bounded_per_call() {
    let h = Harness::start().await;
    let now = now_ms();
    h.load(&proxies("live", 2)).await;
    for i in 0..25 {
        let expires = now - 100_000 + i * 1_000;
        plant_in(
            &h,
            &format!("old-{i:02}"),
            "shanghai",
            expires,
            Planted::ALL,
        )
        .await;
    }
    let first = Maintenance::new(&h.pool)
        .prune_expired(10, 2, None)
        .await
        .unwrap();
    assert_eq!(
        (first.batches, first.records, first.complete),
        (2, 20, false)
    );
    let rest = Maintenance::new(&h.pool)
        .prune_expired(10, 10, None)
        .await
        .unwrap();
    assert_eq!(rest.records, 5);
    assert!(rest.complete);
    assert_eq!(first.index_entries + rest.index_entries, 25);
    assert_eq!(
        common::model::pool_state(&h.pool)
            .await
            .unwrap()
            .index
            .len(),
        2
    );
}

/// Per combination, inventory counts the index entries whose deadline is
/// ahead: exactly what extraction could take, before and after a prune. A
/// proxy that could never be taken (below the minimum remaining TTL, a stale
/// health check) is never indexed; one whose deadline passes is counted as
/// indexed, not eligible, until the prune removes it.
#[tokio::test]
async fn inventory_counts_what_extraction_could_take() {
    let h = Harness::start().await;
    let now = now_ms();
    let mut batch = proxies("a", 3);
    let mut short = proxy("short");
    short.expires_at = now + 10_000; // below the 30 s minimum remaining TTL
    short.usable_until = short.expires_at;
    let mut stale = proxy("stale");
    stale.health_checked_at = now - 3_600_000;
    let mut soon = proxy("soon");
    soon.usable_until = now + 400; // its safety margin starts in 400 ms
    batch.extend([short, stale, soon.clone()]);
    for i in 0..2 {
        let mut p = proxy(&format!("s{i}"));
        p.protocol = "socks5".into();
        p.region = "beijing".into();
        batch.push(p);
    }
    h.load(&batch).await;

    let counts = |inventory: &proxy_pool::pool::Inventory| -> Vec<(String, u64, u64)> {
        inventory
            .buckets
            .iter()
            .map(|b| {
                let name = format!("{}|{}|{}|{}", b.protocol, b.region, b.carrier, b.upstream);
                (name, b.eligible, b.indexed)
            })
            .collect()
    };
    let inventory = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert!((inventory.at_ms - now).abs() < 60_000);
    assert_eq!(
        counts(&inventory),
        [
            (COMBINATION.to_owned(), 4, 4),
            ("socks5|beijing|telecom|provider-a".to_owned(), 2, 2),
        ]
    );
    // The clock passes `soon`'s deadline: no longer eligible, still indexed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let inventory = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert!(inventory.at_ms > soon.usable_until);
    assert_eq!(
        (inventory.buckets[0].eligible, inventory.buckets[0].indexed),
        (3, 4)
    );
    let pruned = Maintenance::new(&h.pool)
        .prune_expired(500, 5, None)
        .await
        .unwrap();
    assert_eq!((pruned.records, pruned.index_entries), (0, 1));
    let inventory = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert_eq!(
        (inventory.buckets[0].eligible, inventory.buckets[0].indexed),
        (3, 3)
    );

    let r = h
        .extract(r#"{"count":1,"filters":{"protocols":["http"]}}"#, &[])
        .await;
    assert_eq!(r.ids(), ["a-0000"]);
    let after = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert_eq!(
        (after.buckets[0].eligible, after.buckets[0].indexed),
        (2, 2)
    );
}

/// Past 10,000 spent entries the inventory reads none of them: it says it
/// is not exact and counts them as eligible; once the prune has drained
/// them it is exact again.
#[tokio::test]
async fn inventory_past_its_spent_bound_says_it_is_not_exact() {
    let h = Harness::start().await;
    let soon = now_ms() + 4_000;
    let mut ending = proxies("ending", 10_001);
    for p in &mut ending {
        p.usable_until = soon; // the safety margin starts in 4 s
    }
    for chunk in ending.chunks(1_000) {
        h.load(chunk).await;
    }
    h.load(&proxies("fresh", 2)).await;
    let before = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert!(before.exact);
    assert_eq!(before.buckets[0].eligible, 10_003);

    let left = u64::try_from(soon - now_ms()).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(left + 100)).await;
    let stale = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert!(stale.at_ms > soon, "the deadline has passed");
    assert!(!stale.exact);
    assert_eq!(
        (stale.buckets[0].eligible, stale.buckets[0].indexed),
        (10_003, 10_003)
    );

    let pruned = Maintenance::new(&h.pool)
        .prune_expired(1_000, 20, None)
        .await
        .unwrap();
    assert_eq!(pruned.index_entries, 10_001);
    let after = Maintenance::new(&h.pool).inventory().await.unwrap();
    assert!(after.exact);
    assert_eq!(
        (after.buckets[0].eligible, after.buckets[0].indexed),
        (2, 2)
    );
}

/// The scheduled check prunes, then reports the inventory by upstream,
/// protocol and region, and its EMF lines carry the same numbers.
#[tokio::test]
async fn scheduled_check_prunes_and_reports() {
    let h = Harness::start().await;
    let now = now_ms();
    h.load(&proxies("live", 3)).await;
    let mut other = proxy("b-1");
    other.upstream = "provider-b".into();
    h.load(&[other]).await;
    plant_in(&h, "gone", "shanghai", now - 1_000, Planted::ALL).await;

    let report = scheduled::run(&h.pool, None).await.unwrap();
    assert!(report.ready);
    assert_eq!((report.pruned.records, report.pruned.index_entries), (1, 1));
    assert_eq!(report.eligible_total, 4);
    let lines: Vec<(&str, &str, &str, u64)> = report
        .inventory
        .iter()
        .map(|l| {
            (
                l.upstream.as_str(),
                l.protocol.as_str(),
                l.region.as_str(),
                l.eligible,
            )
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("provider-a", "http", "shanghai", 3),
            ("provider-b", "http", "shanghai", 1)
        ]
    );

    let emf: Vec<Value> = scheduled::metric_lines(&report, "fn", now)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(emf.len(), 3);
    assert_eq!(emf[0]["Upstream"], "provider-a");
    assert_eq!(emf[0]["EligibleProxies"], 3);
    assert_eq!(emf[2]["EligibleProxiesTotal"], 4);
    assert_eq!(emf[2]["PrunedProxies"], 1);
    assert_eq!(emf[2]["Ready"], 1);
}

/// Redis down: the check fails as a whole (503-class error), and through the
/// function the scheduled invocation is an error result, not a summary.
#[tokio::test]
async fn scheduled_check_fails_when_redis_is_down() {
    let mut h = Harness::with_config(|c| c.redis_timeout = Duration::from_millis(300)).await;
    h.redis.stop().await;
    let err = scheduled::run(&h.pool, None).await.unwrap_err();
    assert!(matches!(err, PoolError::Unavailable(_)), "{err}");

    let function = Function::new(h.app.clone(), h.pool.clone());
    let event = json!({"source": "aws.events", "detail-type": "Scheduled Event", "detail": {}});
    let err = function
        .invoke(LambdaEvent::new(event, Context::default()))
        .await
        .unwrap_err();
    assert!(matches!(err, FunctionError::HealthCheck(_)), "{err}");
}
