//! Extraction at the shapes real pools have (a city-keyed pool: thousands of
//! protocol x region x carrier x upstream combinations, big reserves, runs
//! of ineligible entries), against a real Redis. Each test is a row of the
//! table that showed the old bucket-scanning script failing, and asserts the
//! exact answer, that a failure changes nothing, and how much work a call
//! does (Redis's own command counts, not time).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::HashSet;

use common::pools::{city_pool, command_calls, commands_for, load_all, script_calls, zcard};
use common::{Harness, Planted, now_ms, plant, raw_record};
use proxy_pool::pool::{Maintenance, NewProxy, keys};

/// Proxies in the pools of [`thousands_of_combinations_cost_what_eighteen_do`]:
/// 60,000, or `PROXY_POOL_SHAPES_POOL`. At least five per combination of
/// the larger pool, so that no call of the comparison empties one: a
/// combination that empties costs a few more commands (its value counts
/// and hints move), and the test would compare that, not the shapes.
fn combinations_pool_size() -> usize {
    let n = std::env::var("PROXY_POOL_SHAPES_POOL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60_000);
    assert!(
        n >= 5 * 10_800,
        "PROXY_POOL_SHAPES_POOL must cover 10,800 combinations five times"
    );
    n
}

/// 60,000 proxies (see [`combinations_pool_size`]) over 2,700 combinations,
/// then over 10,800: a request touches the same few keys whatever the number
/// of combinations, for no filter, one city, city + carrier and protocol +
/// upstream; every answer is the soonest-expiring match.
#[tokio::test]
async fn thousands_of_combinations_cost_what_eighteen_do() {
    let shapes = [
        r#"{"count":1}"#,
        r#"{"count":1,"filters":{"regions":["city-007"]}}"#,
        r#"{"count":1,"filters":{"regions":["city-007"],"carriers":["unicom"]}}"#,
        r#"{"count":1,"filters":{"protocols":["https"],"allowedUpstreams":["provider-b"]}}"#,
    ];
    let mut work = Vec::new();
    for cities in [100, 400] {
        let h = Harness::start().await;
        let pool = city_pool("c", combinations_pool_size(), cities);
        load_all(&h, &pool).await;
        let mut row = Vec::new();
        let mut taken = HashSet::new();
        for body in shapes {
            let filters: serde_json::Value = serde_json::from_str(body).unwrap();
            let f = &filters["filters"];
            let matches = |p: &NewProxy| {
                let has = |field: &str, v: &str| {
                    f[field].as_array().is_none_or(|a| a.iter().any(|x| x == v))
                };
                has("protocols", &p.protocol)
                    && has("regions", &p.region)
                    && has("carriers", &p.carrier)
                    && has("allowedUpstreams", &p.upstream)
            };
            // Twice: the first call of a shape may meet hints not yet set.
            for _ in 0..2 {
                let (ran, r) = commands_for(&h, body).await;
                assert_eq!(r.status, 200, "{body}: {}", r.body);
                // First-expired, first-out: the soonest match not yet taken
                // (the scripts order by expiry, then id).
                let soonest = pool
                    .iter()
                    .filter(|p| matches(p) && !taken.contains(&p.id))
                    .min_by_key(|p| format!("{:013}|{}", p.expires_at, p.id))
                    .unwrap();
                assert_eq!(r.ids(), std::slice::from_ref(&soonest.id), "{body}");
                taken.insert(soonest.id.clone());
                row.push(ran);
            }
        }
        work.push((27 * cities, row));
    }
    // The same shapes cost the same number of Redis commands at 2,700 and at
    // 10,800 combinations (a few dozen, never one per combination: the most
    // is the first city + carrier call, which probes each of its 9
    // combinations once before they have hints).
    eprintln!("Redis commands per extraction (combinations, per shape, twice each): {work:?}");
    let (small, large) = (&work[0].1, &work[1].1);
    for (i, (a, b)) in small.iter().zip(large).enumerate() {
        assert!(*b <= 64, "shape {i}: {b} commands at 10,800 combinations");
        assert!(b.abs_diff(*a) <= 6, "shape {i}: {a} vs {b} commands");
    }
}

/// 6,000 combinations holding one proxy each: a count of 2 takes exactly
/// two, and nothing else leaves the pool (the old script removed them, then
/// failed on a long argument list, on every retry).
#[tokio::test]
async fn one_proxy_per_combination() {
    let h = Harness::start().await;
    // 3 x 223 x 3 x 3 = 6,021 combinations; 6,000 proxies, one in each.
    let pool = city_pool("one", 6_000, 223);
    load_all(&h, &pool).await;
    assert_eq!(zcard(&h, keys::INDEX).await, 6_000);
    for round in 0..3 {
        let r = h
            .extract(
                r#"{"count":2}"#,
                &[("idempotency-key", &format!("one-per-combination-{round}"))],
            )
            .await;
        assert_eq!((r.status, r.ids().len()), (200, 2), "{}", r.body);
        assert_eq!(zcard(&h, keys::INDEX).await, 6_000 - 2 * (round + 1));
    }
    // Every region at once: 223 slices of the region family.
    let regions: Vec<String> = (0..223).map(|c| format!("\"city-{c:03}\"")).collect();
    let body = format!(
        r#"{{"count":100,"filters":{{"regions":[{}]}}}}"#,
        regions[..64].join(",")
    );
    let r = h.extract(&body, &[]).await;
    assert_eq!((r.status, r.ids().len()), (200, 100), "{}", r.body);
    common::model::pool_state(&h.pool).await.unwrap();
}

/// A reserve of 9,000 in a combination of 10,000: partial hands out exactly
/// the 1,000 above the reserve (in one request of 1,000), allOrNothing
/// refuses one more with the exact figure, and the pool keeps its 9,000.
#[tokio::test]
async fn a_reserve_of_thousands_is_exact() {
    let h = Harness::with_config(|c| {
        c.reserve_for_gateway = 9_000;
        c.max_count_per_request = 1_000;
    })
    .await;
    let pool = city_pool("r", 10_000, 1)
        .into_iter()
        .map(|mut p| {
            (p.protocol, p.region, p.carrier, p.upstream) = (
                "http".into(),
                "city-000".into(),
                "telecom".into(),
                "provider-a".into(),
            );
            p
        })
        .collect::<Vec<_>>();
    load_all(&h, &pool).await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!((r.status, r.ids().len()), (200, 1), "{}", r.body);
    let r = h
        .extract(r#"{"count":1000,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(r.status, 409);
    assert_eq!(
        r.json["detail"],
        "requested 1000 proxies but only 999 are currently eligible"
    );
    let r = h
        .extract(r#"{"count":999,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!((r.status, r.ids().len()), (200, 999));
    // The reserve is per filter: the same 9,000 seen through a city filter.
    let r = h
        .extract(r#"{"count":5,"filters":{"regions":["city-000"]}}"#, &[])
        .await;
    assert_eq!((r.status, r.ids().len()), (200, 0));
    assert_eq!(zcard(&h, keys::INDEX).await, 9_000);
    // The 1,000 handed out were the soonest-expiring.
    let state = common::model::pool_state(&h.pool).await.unwrap();
    let mut expiries: Vec<i64> = pool.iter().map(|p| p.expires_at).collect();
    expiries.sort_unstable();
    let kept_min = state
        .index
        .keys()
        .map(|l| l.split('|').nth(4).unwrap().parse::<i64>().unwrap())
        .min()
        .unwrap();
    assert_eq!(kept_min, expiries[1_000]);
}

/// 3,000 proxies indexed, then stale (their health check ages past the
/// limit), expire before 5 fresh ones: both modes find the 5 in one call
/// (the walk passes 1,000 of the stale run, then reads the few eligible
/// entries whole), and the prune drains the stale run from the index in
/// bounded calls, records kept.
#[tokio::test]
async fn a_long_run_of_stale_entries_hides_nothing() {
    let h = Harness::start().await;
    let now = now_ms();
    let max_age = h.config.max_health_check_age.as_millis() as i64;
    let mut pool = city_pool("stale", 3_000, 1);
    for (i, p) in pool.iter_mut().enumerate() {
        p.expires_at = now + 300_000 + i as i64;
        p.usable_until = p.expires_at;
        p.health_checked_at = now - max_age + 1_500;
        (p.protocol, p.region, p.carrier, p.upstream) = (
            "http".into(),
            "city-000".into(),
            "telecom".into(),
            "provider-a".into(),
        );
    }
    let mut fresh = city_pool("fresh", 5, 1);
    for p in &mut fresh {
        (p.protocol, p.region, p.carrier, p.upstream) = (
            "http".into(),
            "city-000".into(),
            "telecom".into(),
            "provider-a".into(),
        );
    }
    load_all(&h, &pool).await;
    assert_eq!(zcard(&h, keys::INDEX).await, 3_000);
    while now_ms() < now + 1_600 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    h.load(&fresh).await;
    let before = command_calls(&h).await;
    let r = h
        .extract(r#"{"count":5,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(
        script_calls(&command_calls(&h).await) - script_calls(&before),
        1
    );
    assert_eq!((r.status, r.ids().len()), (200, 5), "{}", r.body);
    let mut ids = r.ids();
    ids.sort();
    assert!(ids.iter().all(|id| id.starts_with("fresh-")), "{ids:?}");
    let report = Maintenance::new(&h.pool)
        .prune_expired(500, 100, None)
        .await
        .unwrap();
    assert_eq!(report.index_entries, 3_000);
    assert_eq!(
        zcard(&h, keys::INDEX).await,
        0,
        "the stale run left the index"
    );
    assert_eq!(
        common::model::pool_state(&h.pool)
            .await
            .unwrap()
            .records
            .len(),
        3_005
    );
}

/// Damaged stored values the scripts meet on the way (a record that is not
/// one, one with a non-numeric expiry, one whose port is text, a head that
/// names no entry, a counter that is not a number) are never handed out nor
/// fail a call half way: the entries leave the index, the good proxies are
/// answered, and a call that cannot write safely changes nothing.
#[tokio::test]
async fn damaged_values_never_cause_a_partial_removal() {
    let h = Harness::start().await;
    let now = now_ms();
    let good = city_pool("good", 4, 1);
    h.load(&good).await;
    let mut not_a_record = raw_record("not-a-record", now + 300_000, now);
    let mut text_expiry = raw_record("text-expiry", now + 300_001, now);
    let mut text_port = raw_record("text-port", now + 300_002, now);
    for rec in [&mut not_a_record, &mut text_expiry, &mut text_port] {
        rec["region"] = "city-000".into();
        plant(&h, rec, Planted::ALL).await;
    }
    let (record, ..) = common::encode_record(&h, &text_expiry);
    let mut conn = h.redis().await;
    let _: () = redis::pipe()
        .hset(keys::RECORDS, "not-a-record", "{\"id\":")
        .ignore()
        .hset(
            keys::RECORDS,
            "text-expiry",
            record.replacen(&format!("{:013}", now + 300_001), "3.0", 1),
        )
        .ignore()
        .hset(
            keys::RECORDS,
            "text-port",
            common::encode_record(&h, &text_port)
                .0
                .replace("\t1\t", "\tone\t"),
        )
        .ignore()
        .zadd(
            keys::HEADS,
            "R|http|city-000|3.0|nothing|http|city-000|x|y",
            0,
        )
        .ignore()
        .hset(keys::COUNTS, "R|http|nowhere", "many|ones")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let r = h
        .extract(
            r#"{"count":10,"filters":{"regions":["city-000","city-001"]}}"#,
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let mut ids = r.ids();
    ids.sort();
    assert_eq!(ids.len(), 4, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("good-")));
    assert!(
        !r.body.contains("192.0.2.99"),
        "no damaged record is handed out"
    );
    assert_eq!(zcard(&h, keys::INDEX).await, 0);

    // The heads of the wrong type: the call is refused before any write.
    h.load(&city_pool("again", 3, 1)).await;
    let _: () = redis::pipe()
        .del(keys::HEADS)
        .ignore()
        .set(keys::HEADS, "damaged")
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = h.snapshot().await;
    let r = h
        .extract(
            r#"{"count":2,"filters":{"regions":["city-000","city-001"]}}"#,
            &[],
        )
        .await;
    assert_eq!((r.status, r.code()), (500, "INTERNAL_ERROR"));
    assert_eq!(h.snapshot().await, before);
}

/// The idempotency record keeps what the replay needs (the response's
/// fields), none of the pool's state: no owner, epoch, health or usableUntil.
#[tokio::test]
async fn the_replay_record_holds_only_the_response() {
    let h = Harness::start().await;
    h.load(&city_pool("min", 3, 1)).await;
    let r = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "minimal-0001")])
        .await;
    assert_eq!(r.ids().len(), 2);
    let mut conn = h.redis().await;
    let record: String = redis::cmd("HGET")
        .arg(keys::IDEMPOTENCY)
        .arg(keys::idempotency("ip:127.0.0.1", "minimal-0001"))
        .query_async(&mut conn)
        .await
        .unwrap();
    // Digest, in force until, then the result: its request line and one
    // line per proxy of exactly the response's fields.
    let lines: Vec<&str> = record[77..].split('\n').collect();
    assert_eq!(lines.len(), 3 + 2, "{lines:?}");
    for proxy in &lines[3..] {
        let fields: Vec<&str> = proxy.split('\t').collect();
        assert_eq!(
            fields.len(),
            5,
            "locator, host, port, user, password: {proxy}"
        );
        assert_eq!(fields[0].split('|').count(), 6, "{proxy}");
    }
    let replay = h
        .extract(r#"{"count":2}"#, &[("idempotency-key", "minimal-0001")])
        .await;
    assert_eq!(replay.body, r.body);
}
