//! The extraction endpoint against a real Redis: eligibility, reserve,
//! fulfillment, order, idempotency and concurrency. What it does when Redis
//! fails it (down, full, flushed, a damaged key) is in
//! `tests/extract_faults.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use common::{Harness, Planted, index_locators, now_ms, plant, proxies, proxy, raw_record};
use proxy_pool::clock::parse_rfc3339;
use proxy_pool::pool::{ContractOp, PoolContract, UpsertStatus, Verdict, keys};

/// 64 concurrent extractions over 40 proxies: no proxy twice, never more
/// than were eligible, and the pool ends empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_extractions_never_share_a_proxy() {
    let h = Harness::start().await;
    h.load(&proxies("px", 40)).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let app = h.app.clone();
        let count = 1 + i % 3;
        tasks.push(tokio::spawn(async move {
            let body = format!(r#"{{"count":{count}}}"#);
            let peer = format!("127.0.0.{}:1000", i + 1);
            common::extract_as(&app, &body, &[], &peer).await
        }));
    }
    let mut seen = HashSet::new();
    let mut total = 0;
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r.status, 200);
        for id in r.ids() {
            total += 1;
            assert!(seen.insert(id.clone()), "{id} handed out twice");
        }
    }
    assert!(total <= 40);
    // 64 requests asking for 1..3 each ask for 127 > 40: everything went out.
    assert_eq!(total, 40);
    let r = h.extract(r#"{"count":5}"#, &[]).await;
    assert_eq!(r.ids().len(), 0);
}

/// Expired, below minRemainingTTL, past the safety margin, unhealthy,
/// stale-health, Worker-owned and filtered-out proxies are never returned.
#[tokio::test]
async fn ineligible_proxies_are_never_returned() {
    let h = Harness::start().await;
    let now = now_ms();
    let mut batch = proxies("ok", 3);
    let mut short = proxy("short-ttl");
    short.expires_at = now + 10_000; // below the 30 s minimum remaining TTL
    short.usable_until = short.expires_at;
    let mut unhealthy = proxy("unhealthy");
    unhealthy.health_ok = false;
    let mut stale = proxy("stale-health");
    stale.health_checked_at = now - 121_000;
    let mut socks = proxy("socks");
    socks.protocol = "socks5".into();
    let mut beijing = proxy("beijing");
    beijing.region = "beijing".into();
    let mut unicom = proxy("unicom");
    unicom.carrier = "unicom".into();
    let mut other = proxy("provider-b");
    other.upstream = "provider-b".into();
    batch.extend([short, unhealthy, stale, socks, beijing, unicom, other]);
    assert!(
        h.load(&batch)
            .await
            .iter()
            .all(|s| *s == UpsertStatus::Added)
    );

    // States the upsert script refuses to create are planted directly, as a
    // damaged or racing pool could hold them: the script re-checks records.
    let mut expired = raw_record("expired", now - 1_000, now);
    expired["usableUntil"] = (now - 1_000).into();
    let mut margin = raw_record("past-margin", now + 600_000, now);
    margin["usableUntil"] = (now - 1).into();
    let mut owned = raw_record("owned", now + 600_000, now);
    owned["owner"] = "worker-1".into();
    owned["status"] = "CLAIMED".into();
    let mut draining = raw_record("draining", now + 600_000, now);
    draining["owner"] = "worker-2".into();
    draining["status"] = "DRAINED".into();
    draining["active"] = 1.into();
    let mut no_host = raw_record("no-host", now + 600_000, now);
    no_host.as_object_mut().unwrap().remove("host");
    for record in [&expired, &margin, &owned, &draining, &no_host] {
        plant(&h, record, Planted::ALL).await;
    }

    let r = h
        .extract(
            r#"{"count":100,"filters":{"protocols":["http"],"regions":["shanghai"],"carriers":["telecom"],"allowedUpstreams":["provider-a"]}}"#,
            &[],
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.ids(), ["ok-0000", "ok-0001", "ok-0002"]);
    // Entries that cannot be handed out now left the index; the expired one
    // waits for the prune, outside every range extraction reads.
    let index = index_locators(&h).await;
    for gone in [
        "past-margin",
        "owned",
        "draining",
        "no-host",
        "stale-health",
    ] {
        assert!(
            !index.iter().any(|l| l.ends_with(&format!("|{gone}"))),
            "{gone}: {index:?}"
        );
    }
    // Without filters the filtered-out ones are eligible and the rest still are not.
    let r = h.extract(r#"{"count":100}"#, &[]).await;
    let got: BTreeSet<String> = r.ids().into_iter().collect();
    let want: BTreeSet<String> = ["socks", "beijing", "unicom", "provider-b"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(got, want);
    // A fresh health result brings the stale one back.
    let reply = PoolContract::new(&h.pool)
        .apply(&ContractOp::Health {
            id: "stale-health".into(),
            ok: true,
            checked_at: None,
        })
        .await
        .unwrap();
    assert_eq!(reply.verdict, Verdict::Ok);
    assert_eq!(
        h.extract(r#"{"count":100}"#, &[]).await.ids(),
        ["stale-health"]
    );
}

/// Filters combine as OR within a dimension and AND across dimensions.
#[tokio::test]
async fn filters_or_within_and_across() {
    let h = Harness::start().await;
    let mut batch = Vec::new();
    for (i, (protocol, region)) in [
        ("http", "shanghai"),
        ("https", "shanghai"),
        ("socks5", "shanghai"),
        ("http", "beijing"),
        ("https", "guangzhou"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = proxy(&format!("p{i}"));
        p.protocol = protocol.into();
        p.region = region.into();
        batch.push(p);
    }
    h.load(&batch).await;
    let r = h
        .extract(
            r#"{"count":10,"filters":{"protocols":["http","https"],"regions":["shanghai","beijing"]}}"#,
            &[],
        )
        .await;
    let got: BTreeSet<String> = r.ids().into_iter().collect();
    assert_eq!(
        got,
        ["p0", "p1", "p3"].into_iter().map(String::from).collect()
    );
}

/// The seed's examples: partial returns what there is; allOrNothing is all
/// or 409, and the reserve is left for the Gateway in both modes.
#[tokio::test]
async fn reserve_and_fulfillment_arithmetic() {
    // requested=10, eligible=6, reserve=0 -> returned=6
    let h = Harness::start().await;
    h.load(&proxies("a", 6)).await;
    let r = h
        .extract(r#"{"count":10,"fulfillment":"partial"}"#, &[])
        .await;
    assert_eq!((r.status, r.json["returned"].as_u64()), (200, Some(6)));
    assert_eq!(r.json["requested"], 10);

    let h = Harness::with_config(|c| c.reserve_for_gateway = 2).await;
    h.load(&proxies("b", 6)).await;
    let before = h.snapshot().await;
    let r = h
        .extract(r#"{"count":5,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(r.code(), "INSUFFICIENT_PROXIES");
    assert_eq!(
        r.json["detail"],
        "requested 5 proxies but only 4 are currently eligible"
    );
    assert_eq!(
        h.snapshot().await,
        before,
        "a 409 must leave the pool untouched"
    );

    let r = h
        .extract(r#"{"count":4,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(r.ids(), ["b-0000", "b-0001", "b-0002", "b-0003"]);
    // Two left, both reserved: partial answers 200 with none.
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!((r.status, r.ids().len()), (200, 0));
    let r = h
        .extract(r#"{"count":1,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(
        r.json["detail"],
        "requested 1 proxies but only 0 are currently eligible"
    );
}

/// The reserve is counted within the request's filters, not the whole pool.
#[tokio::test]
async fn reserve_is_per_filter() {
    let h = Harness::with_config(|c| c.reserve_for_gateway = 1).await;
    let mut batch = proxies("h", 3);
    for i in 0..5 {
        let mut p = proxy(&format!("s{i}"));
        p.protocol = "socks5".into();
        batch.push(p);
    }
    h.load(&batch).await;
    let r = h
        .extract(r#"{"count":10,"filters":{"protocols":["http"]}}"#, &[])
        .await;
    assert_eq!(r.ids().len(), 2);
}

/// First-expired, first-out: the soonest-expiring eligible proxies go first,
/// across buckets.
#[tokio::test]
async fn soonest_expiring_first() {
    let h = Harness::start().await;
    let mut batch = proxies("x", 6);
    for (i, p) in batch.iter_mut().enumerate() {
        p.protocol = ["http", "https", "socks5"][i % 3].into();
        p.upstream = ["provider-a", "provider-b"][i % 2].into();
    }
    batch.reverse();
    h.load(&batch).await;
    let r = h.extract(r#"{"count":4}"#, &[]).await;
    assert_eq!(r.ids(), ["x-0000", "x-0001", "x-0002", "x-0003"]);
    let exp: Vec<&str> = r.json["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["expiresAt"].as_str().unwrap())
        .collect();
    assert!(exp.windows(2).all(|w| w[0] <= w[1]));
}

/// Same key and body: the first body again, byte for byte, marked replayed,
/// nothing extracted. Same key, other body: 409. Keys are per client.
#[tokio::test]
async fn idempotent_replay_and_key_reuse() {
    let h = Harness::start().await;
    h.load(&proxies("i", 5)).await;
    let key = [("idempotency-key", "extract-0001")];
    let first = h
        .extract(r#"{"count":2,"filters":{"regions":["shanghai"]}}"#, &key)
        .await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("idempotent-replayed"), None);
    let before = h.snapshot().await;

    // The same canonical request: field order and explicit default differ.
    let again = h
        .extract(
            r#"{"filters":{"regions":["shanghai"],"carriers":[]},"fulfillment":"partial","count":2}"#,
            &[("idempotency-key", "extract-0001"), ("x-request-id", "req_retry")],
        )
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.header("x-request-id"), Some("req_retry"));
    assert_eq!(h.snapshot().await, before, "a replay extracts nothing");

    let other = h.extract(r#"{"count":3}"#, &key).await;
    assert_eq!(
        (other.status, other.code()),
        (409, "IDEMPOTENCY_KEY_REUSED")
    );
    assert_eq!(h.snapshot().await, before);

    // Another client (another source address) has its own key space.
    let theirs = common::extract_as(
        &h.app,
        r#"{"count":3}"#,
        &[("idempotency-key", "extract-0001")],
        "127.0.0.2:1",
    )
    .await;
    assert_eq!(theirs.ids(), ["i-0002", "i-0003", "i-0004"]);

    for bad in ["short", "has space in it", &"k".repeat(129)] {
        let r = h
            .extract(r#"{"count":1}"#, &[("idempotency-key", bad)])
            .await;
        assert_eq!(r.status, 400, "{bad:?}");
    }
}

/// The idempotency record is in force for its window (recorded in
/// `{pp}:v4:idemx`, no Redis TTL); after it the key is new.
#[tokio::test]
async fn idempotency_record_lives_for_its_window() {
    let h = Harness::with_config(|c| c.idempotency_ttl = Duration::from_secs(1)).await;
    h.load(&proxies("w", 3)).await;
    let first = h
        .extract(r#"{"count":1}"#, &[("idempotency-key", "window-0001")])
        .await;
    let started = now_ms();
    let mut conn = h.redis().await;
    let field = keys::idempotency("ip:127.0.0.1", "window-0001");
    let until: f64 = redis::cmd("ZSCORE")
        .arg(keys::IDEMPOTENCY_DUE)
        .arg(&field)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        (until as i64 - started).abs() <= 1_000,
        "{until} vs {started}"
    );
    // In force: another body with the key is a conflict.
    let other = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "window-0001")])
        .await;
    assert_eq!(other.status, 409);
    while now_ms() <= until as i64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Out of force: the key is new.
    let again = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "window-0001")])
        .await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.ids(), ["w-0001", "w-0002"]);
    assert_ne!(first.body, again.body);
}

/// A refresh never resurrects an extracted proxy; other proxies refresh.
/// The proxy handed out is a tombstone: no record (its details gone from
/// Redis), its `due` member alone, scored 1e13 + the expiry it was handed
/// out with.
#[tokio::test]
async fn refresh_never_resurrects_an_extracted_proxy() {
    let h = Harness::start().await;
    let loaded = proxies("r", 2);
    h.load(&loaded).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["r-0000"]);
    let mut conn = h.redis().await;
    let (record, due): (Option<String>, Option<f64>) = redis::pipe()
        .hget(keys::RECORDS, "r-0000")
        .zscore(keys::DUE, "r-0000")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(record, None, "a tombstone keeps no record");
    assert_eq!(
        due.map(|d| d as i64),
        Some(10_000_000_000_000 + loaded[0].expires_at)
    );
    let statuses = h.load(&loaded).await;
    assert_eq!(statuses, [UpsertStatus::Extracted, UpsertStatus::Refreshed]);
    assert_eq!(h.extract(r#"{"count":5}"#, &[]).await.ids(), ["r-0001"]);
}

/// The heads (`{pp}:v4:hd`) keep first-expired, first-out across the
/// ranges of a many-range request when proxies expiring sooner arrive
/// later; a head moved behind the index's back only delays its entries,
/// and the walk that meets it sets it right.
#[tokio::test]
async fn heads_keep_fifo_and_hide_nothing() {
    const TWO_REGIONS: &str = r#"{"count":1,"filters":{"regions":["shanghai","beijing"]}}"#;
    let h = Harness::start().await;
    let mut batch = proxies("h", 7);
    for p in batch.iter_mut().skip(3) {
        p.region = "beijing".into();
    }
    batch[6].region = "guangzhou".into();
    h.load(&batch).await;
    assert_eq!(h.extract(TWO_REGIONS, &[]).await.ids(), ["h-0000"]);

    // Sooner than everything left, in the range whose head is furthest out.
    let mut early = proxy("h-early");
    early.region = "beijing".into();
    early.expires_at = batch[0].expires_at - 60_000;
    early.usable_until = early.expires_at;
    h.load(&[early.clone()]).await;
    assert_eq!(h.extract(TWO_REGIONS, &[]).await.ids(), ["h-early"]);

    // Added, then its range's head moved out behind its back.
    let mut planted = proxy("h-planted");
    planted.region = "beijing".into();
    planted.expires_at = early.expires_at;
    planted.usable_until = planted.expires_at;
    h.load(&[planted.clone()]).await;
    let mut conn = h.redis().await;
    let atom = "http|beijing|telecom|provider-a";
    let head = format!("R|http|beijing|{:013}|h-planted|{atom}", planted.expires_at);
    let _: () = redis::pipe()
        .zrem(keys::HEADS, &head)
        .ignore()
        .zadd(
            keys::HEADS,
            format!("R|http|beijing|9999999999999|h-planted|{atom}"),
            0,
        )
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    // The wrong head only delays it: the other range goes first.
    let two = TWO_REGIONS.replace(r#""count":1"#, r#""count":2"#);
    assert_eq!(h.extract(&two, &[]).await.ids(), ["h-0001", "h-0002"]);
    let rest = TWO_REGIONS.replace(r#""count":1"#, r#""count":10"#);
    assert_eq!(
        h.extract(&rest, &[]).await.ids(),
        ["h-planted", "h-0003", "h-0004", "h-0005"]
    );
    // And the heads are right again.
    common::model::pool_state(&h.pool).await.unwrap();
}

/// `remainingTtlSeconds` is `expiresAt - extractedAt` exactly as the body
/// shows them (each floored to the second), for expiries on, just after and
/// just before whole seconds, including one whose millisecond is below the
/// extraction's (where flooring the millisecond difference answered one
/// less); counted from `extractedAt` it never passes the true expiry.
#[tokio::test]
async fn remaining_ttl_is_the_rendered_difference() {
    let h = Harness::start().await;
    let mut conn = h.redis().await;
    let seconds = |v: &serde_json::Value| parse_rfc3339(v.as_str().unwrap()).unwrap() / 1000;
    let mut crossed = false;
    // An extraction at exactly .000 ms cannot show the difference (one in a
    // thousand): then another round, at another millisecond.
    for round in 0..5 {
        let second = (now_ms() / 1000 + 600) * 1000;
        let batch: Vec<_> = [0, 1, 499, 500, 998, 999, 1000, 1001]
            .into_iter()
            .map(|offset| {
                let mut p = proxy(&format!("b{round}-{offset:04}"));
                p.expires_at = second + offset;
                p.usable_until = p.expires_at;
                p
            })
            .collect();
        h.load(&batch).await;
        let key = format!("ttl-boundary-{round}");
        let r = h
            .extract(r#"{"count":8}"#, &[("idempotency-key", &key)])
            .await;
        assert_eq!(r.ids().len(), 8, "{}", r.body);
        // The extraction's own millisecond, from its idempotency record
        // (64 hex digits of digest, 13 of its window, then the result).
        let record: String = redis::cmd("HGET")
            .arg(keys::IDEMPOTENCY)
            .arg(keys::idempotency("ip:127.0.0.1", &key))
            .query_async(&mut conn)
            .await
            .unwrap();
        let committed = proxy_pool::pool::CommittedExtraction::parse(&record[77..]).unwrap();
        let extracted_ms = committed.extracted_at;
        for p in r.json["proxies"].as_array().unwrap() {
            let (expires, extracted) = (seconds(&p["expiresAt"]), seconds(&p["extractedAt"]));
            let remaining = p["remainingTtlSeconds"].as_i64().unwrap();
            assert_eq!(remaining, expires - extracted, "{p}");
            let truth = batch.iter().find(|b| b.id == p["id"]).unwrap().expires_at;
            assert!((extracted + remaining) * 1000 <= truth, "{p}");
            crossed |= truth.rem_euclid(1000) < extracted_ms.rem_euclid(1000);
        }
        if crossed {
            break;
        }
    }
    assert!(
        crossed,
        "no round put an expiry's millisecond below the extraction's"
    );
}
