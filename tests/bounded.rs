//! Every legal request is answered and bounded: what a client names, real
//! or invented, is answered (never refused for its breadth), costs the
//! shared Redis a bounded number of commands and leaves nothing behind;
//! upkeep one request defers never lands on another; a stale backlog is
//! answered at once, and every round of a long one makes progress that
//! persists; a request is charged once, whatever it costs; and two
//! deployments on one pool with different policies (or a pool of another
//! layout) refuse loudly instead of misreading it. Work is counted in
//! Redis's own command counts (`INFO commandstats`: deterministic), never
//! in time.
//!
//! Over 600 lines on purpose: one property (bounded work per legal request)
//! measured one way (Redis's own command counts), whose tests share the pool
//! shapes and counters at the top.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::pools::{
    CARRIERS, UPSTREAMS, city_pool, command_calls, commands_for, load_all, script_calls, zcard,
};
use common::{Harness, app_over, extract_as, now_ms, proxies, proxy};
use proxy_pool::pool::{
    Maintenance, NewProxy, OutageClass, PoolContract, PoolPolicy, RedisOptions, RedisPool, keys,
};
use proxy_pool::security::Rate;

/// A list of JSON strings.
fn list(values: impl IntoIterator<Item = String>) -> String {
    let quoted: Vec<String> = values.into_iter().map(|v| format!("\"{v}\"")).collect();
    format!("[{}]", quoted.join(","))
}

/// `n` city names of the city pool, from `first`.
fn cities(first: usize, n: usize) -> String {
    list((first..first + n).map(|i| format!("city-{i:03}")))
}

/// `n` names no proxy has, unique to `tag`.
fn invented(tag: &str, n: usize) -> String {
    list((0..n).map(|i| format!("nowhere-{tag}-{i}")))
}

async fn dbsize_and_counters(h: &Harness) -> (u64, u64) {
    let mut conn = h.redis().await;
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    let counters: u64 = redis::cmd("HLEN")
        .arg(keys::COUNTS)
        .query_async(&mut conn)
        .await
        .unwrap();
    (size, counters)
}

/// The soonest-expiring proxy of `pool` matching `wanted` and not `taken`.
fn soonest(
    pool: &[NewProxy],
    taken: &BTreeSet<String>,
    wanted: impl Fn(&NewProxy) -> bool,
) -> Option<String> {
    pool.iter()
        .filter(|p| wanted(p) && !taken.contains(&p.id))
        .min_by_key(|p| (p.expires_at, p.id.clone()))
        .map(|p| p.id.clone())
}

/// `"filters"` naming http and https, the first two carriers and upstreams,
/// and `regions` (a JSON list).
fn two_of_each_but_regions(regions: &str) -> String {
    format!(
        r#""filters":{{"protocols":["http","https"],"regions":{regions},"carriers":["{}","{}"],"allowedUpstreams":["{}","{}"]}}"#,
        CARRIERS[0], CARRIERS[1], UPSTREAMS[0], UPSTREAMS[1]
    )
}

/// A reserve is counted exactly for a filter naming all but one value of
/// every dimension over 1,728 combinations (counted by inclusion and
/// exclusion: the pool's counters less the complement's), stale entries
/// left out: `allOrNothing` is told the exact number left above the
/// reserve, `partial` gets exactly those, the soonest-expiring first.
#[tokio::test]
async fn a_reserve_under_a_broad_filter_is_counted_exactly() {
    let stale = now_ms() - 3_600_000;
    let mut pool = city_pool("ie", 12_000, 64);
    let wanted = |p: &NewProxy| {
        p.protocol != "socks5"
            && p.region != "city-000"
            && p.carrier != CARRIERS[2]
            && p.upstream != UPSTREAMS[2]
    };
    // Some matching proxies with a health check long past: never eligible.
    for p in pool.iter_mut().filter(|p| wanted(p)).step_by(40) {
        p.health_checked_at = stale;
    }
    let eligible: Vec<&NewProxy> = pool
        .iter()
        .filter(|p| wanted(p) && p.health_checked_at != stale)
        .collect();
    let reserve = eligible.len() as u32 - 3;
    let h = Harness::with_config(|c| c.reserve_for_gateway = reserve).await;
    load_all(&h, &pool).await;
    let filters = two_of_each_but_regions(&cities(1, 63));
    let r = h
        .extract(
            &format!(r#"{{"count":5,"fulfillment":"allOrNothing",{filters}}}"#),
            &[],
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(
        r.json["detail"],
        "requested 5 proxies but only 3 are currently eligible"
    );
    let r = h.extract(&format!(r#"{{"count":5,{filters}}}"#), &[]).await;
    let mut soonest: Vec<&&NewProxy> = eligible.iter().collect();
    soonest.sort_by_key(|p| (p.expires_at, p.id.clone()));
    let expected: Vec<String> = soonest[..3].iter().map(|p| p.id.clone()).collect();
    assert_eq!((r.status, r.ids()), (200, expected), "{}", r.body);
    let r = h.extract(&format!(r#"{{"count":5,{filters}}}"#), &[]).await;
    assert_eq!((r.status, r.ids().len()), (200, 0), "{}", r.body);
}

/// A reserve under a filter whose combinations are enumerated (8 cities x
/// 2 carriers x 2 upstreams x 2 protocols), stale entries among them: the
/// count stops once the reserve and the count are covered, so it is exact
/// at the edge: with `reserve + count` eligible the call takes `count`, with
/// one fewer `allOrNothing` is told exactly how many are left.
#[tokio::test]
async fn an_enumerated_reserve_is_exact_at_its_edge() {
    let stale = now_ms() - 3_600_000;
    let mut pool = city_pool("en", 12_000, 64);
    let named: Vec<String> = (1..=8).map(|i| format!("city-{i:03}")).collect();
    let wanted = |p: &NewProxy| {
        p.protocol != "socks5"
            && named.contains(&p.region)
            && p.carrier != CARRIERS[2]
            && p.upstream != UPSTREAMS[2]
    };
    for p in pool.iter_mut().filter(|p| wanted(p)).step_by(5) {
        p.health_checked_at = stale;
    }
    let mut eligible: Vec<&NewProxy> = pool
        .iter()
        .filter(|p| wanted(p) && p.health_checked_at != stale)
        .collect();
    eligible.sort_by_key(|p| (p.expires_at, p.id.clone()));
    let filters = two_of_each_but_regions(&cities(1, 8));
    let all = format!(r#"{{"count":5,"fulfillment":"allOrNothing",{filters}}}"#);
    let reserve = eligible.len() as u32 - 5;

    let h = Harness::with_config(|c| c.reserve_for_gateway = reserve).await;
    load_all(&h, &pool).await;
    let r = h.extract(&all, &[]).await;
    let expected: Vec<String> = eligible[..5].iter().map(|p| p.id.clone()).collect();
    assert_eq!((r.status, r.ids()), (200, expected), "{}", r.body);

    let h = Harness::with_config(|c| c.reserve_for_gateway = reserve + 1).await;
    load_all(&h, &pool).await;
    let r = h.extract(&all, &[]).await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(
        r.json["detail"],
        "requested 5 proxies but only 4 are currently eligible"
    );
}

/// 10,000 requests naming invented values (64 regions with every protocol,
/// or invented values in every dimension, mixed with real ones) leave no
/// state behind: no key, no counter, less than 256 KB of `used_memory`.
#[tokio::test]
async fn invented_values_leave_nothing_behind() {
    let h = Harness::start().await;
    load_all(&h, &city_pool("c", 3_000, 100)).await;
    let body = |i: usize| match i % 3 {
        0 => format!(
            r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{}}}}}"#,
            invented(&i.to_string(), 64)
        ),
        1 => format!(
            r#"{{"count":1,"filters":{{"regions":{},"carriers":{},"allowedUpstreams":{}}}}}"#,
            invented(&format!("r{i}"), 64),
            invented(&format!("c{i}"), 64),
            invented(&format!("u{i}"), 64)
        ),
        // One real city among 63 invented ones, an invented carrier: still
        // no match, and nothing read for what does not exist.
        _ => format!(
            r#"{{"count":1,"filters":{{"regions":["city-001",{}],"carriers":["nowhere-{i}"]}}}}"#,
            invented(&i.to_string(), 63).trim_matches(['[', ']'])
        ),
    };
    // Warm: scripts loaded, connections open, allocator settled.
    for i in 0..30 {
        assert_eq!(h.extract(&body(i), &[]).await.status, 200);
    }
    let before = (h.used_memory().await, dbsize_and_counters(&h).await);
    for i in 30..10_030 {
        let r = h.extract(&body(i), &[]).await;
        assert_eq!((r.status, r.ids().len()), (200, 0), "{}", r.body);
    }
    let after = (h.used_memory().await, dbsize_and_counters(&h).await);
    eprintln!("used_memory {} -> {} bytes", before.0, after.0);
    assert_eq!(before.1, after.1, "keys and counters");
    assert!(
        after.0 - before.0 < 256 * 1024,
        "used_memory grew by {} bytes",
        after.0 - before.0
    );
}

/// The costliest legal shapes on 10,800 combinations (3 protocols x 400
/// cities x 3 carriers x 3 upstreams), every one answered with the
/// soonest-expiring match, whatever it names, in a bounded number of Redis
/// commands (the widest: one probe per (protocol, city) named); an
/// unfiltered call is a dozen.
#[tokio::test]
async fn every_legal_shape_is_answered_in_bounded_commands() {
    let h = Harness::start().await;
    let pool = city_pool("c", 12_000, 400);
    load_all(&h, &pool).await;
    let every = |values: &[&str], invented_too: usize| {
        list(
            values
                .iter()
                .map(|v| (*v).to_owned())
                .chain((0..invented_too).map(|i| format!("nowhere-{i}"))),
        )
    };
    let city = |p: &NewProxy, from: usize, n: usize| {
        p.region[5..]
            .parse::<usize>()
            .is_ok_and(|c| (from..from + n).contains(&c))
    };
    type Wanted = Box<dyn Fn(&NewProxy) -> bool>;
    let shapes: Vec<(&str, String, Wanted)> = vec![
        (
            "unfiltered",
            r#"{"count":1}"#.to_owned(),
            Box::new(|_| true),
        ),
        (
            "64 cities, every protocol",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{}}}}}"#,
                cities(0, 64)
            ),
            Box::new(move |p| city(p, 0, 64)),
        ),
        (
            "16 cities, 64 values in every other dimension",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{},"carriers":{},"allowedUpstreams":{}}}}}"#,
                cities(100, 16),
                every(&CARRIERS, 61),
                every(&UPSTREAMS, 61)
            ),
            Box::new(move |p| city(p, 100, 16)),
        ),
        (
            "64 invented values in every dimension",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{},"carriers":{},"allowedUpstreams":{}}}}}"#,
                invented("r", 64),
                invented("c", 64),
                invented("u", 64)
            ),
            Box::new(|_| false),
        ),
        (
            "one upstream, 28 cities",
            format!(
                r#"{{"count":1,"filters":{{"regions":{},"allowedUpstreams":["provider-b"]}}}}"#,
                cities(200, 28)
            ),
            Box::new(move |p| city(p, 200, 28) && p.upstream == "provider-b"),
        ),
        (
            "all but one value in every dimension",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https"],"regions":{},"carriers":["telecom","unicom"],"allowedUpstreams":["provider-a","provider-b"]}}}}"#,
                cities(300, 63)
            ),
            Box::new(move |p| {
                city(p, 300, 63)
                    && p.protocol != "socks5"
                    && p.carrier != "mobile"
                    && p.upstream != "provider-c"
            }),
        ),
        (
            "64 cities x 2 carriers x 2 upstreams, one protocol",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["https"],"regions":{},"carriers":["unicom","mobile"],"allowedUpstreams":["provider-a","provider-c"]}}}}"#,
                cities(10, 64)
            ),
            Box::new(move |p| {
                city(p, 10, 64)
                    && p.protocol == "https"
                    && p.carrier != "telecom"
                    && p.upstream != "provider-b"
            }),
        ),
        (
            "one protocol, one city (the contract's example)",
            r#"{"count":1,"filters":{"protocols":["http"],"regions":["city-007"]}}"#.to_owned(),
            Box::new(|p| p.protocol == "http" && p.region == "city-007"),
        ),
        (
            "one protocol only",
            r#"{"count":1,"filters":{"protocols":["socks5"]}}"#.to_owned(),
            Box::new(|p| p.protocol == "socks5"),
        ),
    ];
    let mut taken = BTreeSet::new();
    let mut costs = Vec::new();
    for (name, body, wanted) in &shapes {
        for round in 0..2 {
            let expected = soonest(&pool, &taken, wanted);
            let (ran, r) = commands_for(&h, body).await;
            assert_eq!(r.status, 200, "{name}: {}", r.body);
            assert_eq!(r.ids().first(), expected.as_ref(), "{name}, round {round}");
            taken.extend(r.ids());
            costs.push((*name, round, ran));
        }
    }
    eprintln!("Redis commands per call (shape, round, commands): {costs:#?}");
    let unfiltered = costs[0].2;
    assert!(unfiltered <= 16, "unfiltered: {unfiltered}");
    for (name, round, ran) in &costs {
        // The plan's counters, one probe per range that holds anything (at
        // most 3 x 64), pages of heads, the entry, the commit.
        assert!(*ran <= 220, "{name} (call {round}): {ran} commands");
    }
}

/// Upkeep is never deferred onto another request: heads are rewritten by
/// the call that moves them, so after 2,000 single-city extractions an
/// unfiltered count=1 costs what it cost before them, and after 2,000
/// unfiltered ones a single-city request costs what it did.
#[tokio::test]
async fn deferred_upkeep_never_lands_on_one_caller() {
    let h = Harness::start().await;
    let pool = city_pool("c", 20_000, 400);
    load_all(&h, &pool).await;
    let one_city = |i: usize| {
        format!(
            r#"{{"count":1,"filters":{{"regions":["city-{:03}"]}}}}"#,
            i * 7 % 400
        )
    };
    let (quiet_unfiltered, _) = commands_for(&h, r#"{"count":1}"#).await;
    let (quiet_city, _) = commands_for(&h, &one_city(1)).await;
    for i in 0..2_000 {
        let r = h.extract(&one_city(i), &[]).await;
        assert_eq!(r.ids().len(), 1, "{}", r.body);
    }
    let before = command_calls(&h).await;
    let (after_cities, r) = commands_for(&h, r#"{"count":1}"#).await;
    let calls = script_calls(&command_calls(&h).await) - script_calls(&before);
    assert_eq!(r.ids().len(), 1);
    for _ in 0..2_000 {
        assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids().len(), 1);
    }
    let (after_unfiltered, r) = commands_for(&h, &one_city(3)).await;
    assert_eq!(r.ids().len(), 1);
    eprintln!(
        "unfiltered count=1: {quiet_unfiltered} commands quiet, {after_cities} after 2,000 by city; \
         by city: {quiet_city} quiet, {after_unfiltered} after 2,000 unfiltered"
    );
    assert!(calls <= 2, "{calls} script calls");
    assert!(
        after_cities <= 2 * quiet_unfiltered,
        "{after_cities} vs {quiet_unfiltered}"
    );
    assert!(
        after_unfiltered <= 2 * quiet_city,
        "{after_unfiltered} vs {quiet_city}"
    );
}

/// 100,000 entries indexed healthy, then stale all at once (a stalled
/// health checker), ahead of 5 fresh ones: count=1 takes the soonest fresh
/// one in one call of a bounded number of commands, allOrNothing reports
/// exactly 4. With 3,000 fresh ones behind the stale run (more than one
/// call reads whole), every round of a request passes at most 400 spent
/// entries and takes them out of the walk for good (a round that changed
/// nothing would repeat forever), and the request is answered. The prune
/// then drains the backlog in bounded calls.
#[tokio::test]
async fn a_stale_backlog_is_answered_and_every_round_progresses() {
    let h = Harness::start().await;
    let max_age = h.config.max_health_check_age.as_millis() as i64;
    let now = now_ms();
    let mut stale = proxies("stale", 100_000);
    for (i, p) in stale.iter_mut().enumerate() {
        p.expires_at = now + 600_000 + i as i64;
        p.usable_until = p.expires_at;
    }
    // Each chunk is indexed with a health check that has 3 s left: the
    // checker then stalls, and every check goes stale within 3 s.
    for chunk in stale.chunks(1_000) {
        let mut chunk = chunk.to_vec();
        let checked = now_ms() - max_age + 3_000;
        for p in &mut chunk {
            p.health_checked_at = checked;
        }
        h.load(&chunk).await;
    }
    assert_eq!(zcard(&h, keys::INDEX).await, 100_000);
    tokio::time::sleep(Duration::from_millis(3_100)).await;
    let fresh = |prefix: &str, n: usize| {
        let mut batch = proxies(prefix, n);
        for (i, p) in batch.iter_mut().enumerate() {
            p.expires_at = now + 900_000 + i as i64;
            p.usable_until = p.expires_at;
            p.health_checked_at = now_ms();
        }
        batch
    };
    h.load(&fresh("fresh", 5)).await;

    let before = command_calls(&h).await;
    let (ran, r) = commands_for(&h, r#"{"count":1}"#).await;
    let calls = script_calls(&command_calls(&h).await) - script_calls(&before);
    assert_eq!(r.ids(), ["fresh-0000"], "{}", r.body);
    assert_eq!(calls, 1);
    assert!(ran <= 60, "{ran} commands");
    let r = h
        .extract(r#"{"count":10,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(r.status, 409);
    assert!(
        r.body.contains("only 4 are currently eligible"),
        "{}",
        r.body
    );
    let (ran, r) = commands_for(&h, r#"{"count":10}"#).await;
    assert_eq!(r.ids().len(), 4);
    assert!(ran <= 60, "{ran} commands");

    // Many fresh behind the stale run: more eligible entries than a call
    // reads from `due`, so the walk must pass the stale run first. One
    // request's rounds (at most 64 of 400 entries, and ~50 ms) cannot pass
    // ~98,000: its last call answers from what it reached (a 409 naming the
    // backlog, an empty 200), never a 503, and every round's passing stays.
    h.load(&fresh("more", 3_000)).await;
    let walkable = zcard(&h, keys::INDEX).await;
    let r = h
        .extract(r#"{"count":1,"fulfillment":"allOrNothing"}"#, &[])
        .await;
    assert_eq!(r.status, 409, "{}", r.body);
    assert!(
        r.body
            .contains("only 0 could be reached past a backlog of expired or stale entries"),
        "{}",
        r.body
    );
    let mut left = zcard(&h, keys::INDEX).await;
    assert!(walkable - left >= 400, "{walkable} -> {left}");
    let mut requests = 0;
    let ids = loop {
        requests += 1;
        let before = command_calls(&h).await;
        let (ran, r) = commands_for(&h, r#"{"count":1}"#).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let calls = script_calls(&command_calls(&h).await) - script_calls(&before);
        let now_left = zcard(&h, keys::INDEX).await;
        let passed = left - now_left - r.ids().len() as u64;
        left = now_left;
        eprintln!("{calls} calls, {ran} commands, {passed} spent entries passed");
        // Every round passed its 400 and took them out (the one that
        // answers may pass fewer).
        assert!(passed >= 400 * (calls - 1), "{passed} in {calls} calls");
        assert!(ran <= 40 * calls, "{ran} commands in {calls} calls");
        if !r.ids().is_empty() {
            break r.ids();
        }
        assert!(requests < 300, "the backlog is not shrinking: {left} left");
    };
    assert!(requests >= 2, "one request passed the whole backlog");
    assert_eq!(ids, ["more-0000"]);
    // The next request starts past them: one call.
    let before = command_calls(&h).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["more-0001"]);
    assert_eq!(
        script_calls(&command_calls(&h).await) - script_calls(&before),
        1
    );

    // The backlog: counted, not eligible, and drained in bounded calls.
    let report = Maintenance::new(&h.pool)
        .prune_expired(128, u32::MAX, None)
        .await
        .unwrap();
    assert_eq!(report.index_entries, 100_000);
    assert!(report.batches as u64 >= 100_000 / 128);
    assert_eq!(zcard(&h, keys::INDEX).await, 2_998);
    common::model::pool_state(&h.pool).await.unwrap();
}

/// Loads `proxies` indexed and healthy with checks that pass the harness's
/// `maxHealthCheckAge` 3 s later, and waits those 3 s: a stalled checker's
/// entries, spent in the index.
async fn load_going_stale(h: &Harness, proxies: &mut [NewProxy]) {
    let max_age = h.config.max_health_check_age.as_millis() as i64;
    let checked = now_ms() - max_age + 3_000;
    for p in proxies.iter_mut() {
        p.health_checked_at = checked;
    }
    h.load(proxies).await;
    tokio::time::sleep(Duration::from_millis(3_100)).await;
}

/// A stalled checker's backlog spread over many combinations, their
/// entries interleaved by expiry (400 combinations x 5 stale entries, the
/// j-th of each before every (j+1)-th), ahead of more fresh entries than a
/// call reads from `due`: a walk in expiry order would pass one entry a
/// combination and stop at 48 combinations (48 entries a round). Once a
/// combination has passed one, its run of spent entries goes with it: a
/// round passes 5 in each of its 48 combinations, and the request's ninth
/// round passes the last and answers the soonest fresh proxy.
#[tokio::test]
async fn a_backlog_over_many_combinations_is_passed_a_run_at_a_time() {
    let h = Harness::start().await;
    let now = now_ms();
    let mut stale = Vec::new();
    for j in 0..5_i64 {
        for r in 0..400_i64 {
            let mut p = proxy(&format!("stale-{r:03}-{j}"));
            p.region = format!("city-{r:03}");
            p.expires_at = now + 600_000 + j * 1_000 + r;
            p.usable_until = p.expires_at;
            stale.push(p);
        }
    }
    load_going_stale(&h, &mut stale).await;
    let mut fresh = proxies("fresh", 2_100);
    for (i, p) in fresh.iter_mut().enumerate() {
        p.expires_at = now + 900_000 + i as i64;
        p.usable_until = p.expires_at;
        p.health_checked_at = now_ms();
    }
    h.load(&fresh).await;

    let walkable = zcard(&h, keys::INDEX).await;
    let before = command_calls(&h).await;
    let (ran, r) = commands_for(&h, r#"{"count":1}"#).await;
    let calls = script_calls(&command_calls(&h).await) - script_calls(&before);
    let passed = walkable - zcard(&h, keys::INDEX).await - 1;
    eprintln!("{calls} calls, {ran} commands, {passed} spent entries passed");
    assert_eq!(r.ids(), ["fresh-0000"], "{}", r.body);
    assert_eq!(passed, 2_000);
    assert!(calls <= 9, "{calls} rounds for 2,000 spent entries");
    // A round touches 48 combinations: a page, its records, and the
    // rewrite of each one's counter and heads, some 6 commands each.
    assert!(ran <= 6 * 48 * calls, "{ran} commands in {calls} calls");
    common::model::pool_state(&h.pool).await.unwrap();
}

/// An enumerated walk takes its combinations' heads a batch at a time (the
/// least `count + 16`), so a walk that opens more combinations than a batch
/// holds loads the next before it passes the batch's last head: 64
/// combinations named (2 protocols x 8 cities x 2 carriers x 2 upstreams),
/// each with a stale entry first and two fresh ones later, their expiries
/// scrambled across combinations. The answer is the 5 soonest fresh ones,
/// exactly, through the rounds that pass the stale heads.
#[tokio::test]
async fn an_enumerated_walk_past_its_first_batch_keeps_expiry_order() {
    let h = Harness::start().await;
    let now = now_ms();
    let combination = |k: usize, p: &mut NewProxy| {
        p.protocol = ["http", "https"][k % 2].into();
        p.region = format!("city-{:03}", 1 + k / 2 % 8);
        p.carrier = CARRIERS[k / 16 % 2].into();
        p.upstream = UPSTREAMS[k / 32 % 2].into();
    };
    let mut stale: Vec<NewProxy> = (0..64)
        .map(|k| {
            let mut p = proxy(&format!("stale-{k:02}"));
            combination(k, &mut p);
            p.expires_at = now + 600_000 + k as i64;
            p.usable_until = p.expires_at;
            p
        })
        .collect();
    load_going_stale(&h, &mut stale).await;
    let fresh: Vec<NewProxy> = (0..128)
        .map(|j| {
            let mut p = proxy(&format!("fresh-{j:03}"));
            combination(j % 64, &mut p);
            p.expires_at = now + 700_000 + (j as i64 * 7_919 % 128) * 1_000;
            p.usable_until = p.expires_at;
            p.health_checked_at = now_ms();
            p
        })
        .collect();
    h.load(&fresh).await;
    // Values the filter does not name (so it restricts every dimension),
    // expiring before every fresh entry it matches.
    let mut others = Vec::new();
    for (i, (region, carrier, upstream)) in [
        ("city-009", CARRIERS[0], UPSTREAMS[0]),
        ("city-001", CARRIERS[2], UPSTREAMS[0]),
        ("city-001", CARRIERS[0], UPSTREAMS[2]),
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = proxy(&format!("other-{i}"));
        (p.region, p.carrier, p.upstream) = (region.into(), carrier.into(), upstream.into());
        p.expires_at = now + 650_000 + i as i64;
        p.usable_until = p.expires_at;
        others.push(p);
    }
    h.load(&others).await;
    let mut soonest: Vec<&NewProxy> = fresh.iter().collect();
    soonest.sort_by_key(|p| (p.expires_at, p.id.clone()));
    let expected: Vec<String> = soonest[..5].iter().map(|p| p.id.clone()).collect();

    let body = format!(
        r#"{{"count":5,{}}}"#,
        two_of_each_but_regions(&cities(1, 8))
    );
    let r = h.extract(&body, &[]).await;
    assert_eq!((r.status, r.ids()), (200, expected), "{}", r.body);
    common::model::pool_state(&h.pool).await.unwrap();
}

/// Two deployments with different policies on one pool: the one whose
/// policy the pool did not record answers 503 POOL_POLICY_MISMATCH to
/// extraction and readiness alike (its error, logged, names both), and its
/// writes are refused; the other goes on answering.
#[tokio::test]
async fn a_deployment_with_another_policy_refuses_loudly() {
    let h = Harness::start().await;
    h.load(&proxies("p", 3)).await;
    let mut config = h.config.clone();
    config.max_health_check_age = Duration::from_secs(60);
    let other = RedisPool::with_options(&h.redis.url(), &config.redis_options()).unwrap();
    let app = app_over(&config, other.clone());

    let r = extract_as(&app, r#"{"count":1}"#, &[], "127.0.0.1:40000").await;
    assert_eq!(
        (r.status, r.code()),
        (503, "POOL_POLICY_MISMATCH"),
        "{}",
        r.body
    );
    // The public body says what, not the values (they go to the log).
    assert!(
        !r.body.contains("120") && !r.body.contains("60 s"),
        "{}",
        r.body
    );
    let refused = other.ping().await.unwrap_err().to_string();
    assert!(
        refused.contains("the pool's policy is maxHealthCheckAge 120 s, minRemainingTTL 30 s")
            && refused
                .contains("this deployment's is maxHealthCheckAge 60 s, minRemainingTTL 30 s"),
        "{refused}"
    );
    common::assert_valid("Problem", &serde_json::from_str(&r.body).unwrap());
    let ready = common::get(&app, "/health/ready").await;
    assert_eq!((ready.status, ready.code()), (503, "POOL_POLICY_MISMATCH"));
    assert_eq!(
        ready.header("readiness-reasons"),
        Some("pool-policy-mismatch")
    );
    let refused = PoolContract::new(&other)
        .upsert(&proxies("q", 1))
        .await
        .unwrap_err();
    assert_eq!(refused.outage_class(), Some(OutageClass::Policy));

    // The recorded deployment is untouched by any of it.
    assert_eq!(zcard(&h, keys::INDEX).await, 3);
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.ids(), ["p-0000"]);
    assert_eq!(h.get("/health/ready").await.status, 200);

    // A policy applies exactly: the same pool through a pool object with
    // the recorded policy works, whatever its other settings.
    let same = RedisOptions {
        policy: PoolPolicy::default(),
        ..RedisOptions::single(Duration::from_secs(2))
    };
    let again = RedisPool::with_options(&h.redis.url(), &same).unwrap();
    assert!(again.ping().await.is_ok());
}

/// A pool that records another layout version is never read as this one:
/// extraction, readiness and writes refuse it with 503
/// POOL_LAYOUT_MISMATCH naming both versions, and nothing is written.
#[tokio::test]
async fn a_pool_of_another_layout_is_refused_loudly() {
    let h = Harness::start().await;
    h.load(&proxies("p", 3)).await;
    let mut conn = h.redis().await;
    // A later layout's pool (this build's version plus one).
    let later = keys::LAYOUT.parse::<u32>().unwrap() + 1;
    let _: () = redis::cmd("HSET")
        .arg(keys::COUNTS)
        .arg("meta")
        .arg(format!("{later}|120000|30000"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let before = h.snapshot().await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(
        (r.status, r.code()),
        (503, "POOL_LAYOUT_MISMATCH"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains(&format!("layout version {later}"))
            && r.body.contains(&format!("layout {}", keys::LAYOUT)),
        "{}",
        r.body
    );
    common::assert_valid("Problem", &serde_json::from_str(&r.body).unwrap());
    let ready = h.get("/health/ready").await;
    assert_eq!((ready.status, ready.code()), (503, "POOL_LAYOUT_MISMATCH"));
    assert_eq!(
        ready.header("readiness-reasons"),
        Some("pool-layout-mismatch")
    );
    let refused = PoolContract::new(&h.pool)
        .upsert(&proxies("q", 1))
        .await
        .unwrap_err();
    assert_eq!(refused.outage_class(), Some(OutageClass::Layout));
    assert_eq!(h.snapshot().await, before);
}

/// A request is charged once, whatever it costs: the client's limit counts
/// requests (README, docs/admission.md), so a count=100 call over many
/// cities moves the next response's `RateLimit` by one, like any other.
#[tokio::test]
async fn a_request_is_charged_once_whatever_it_costs() {
    let h = Harness::with_config(|c| c.client_rate = Rate::parse("1:1000").unwrap()).await;
    load_all(&h, &city_pool("c", 12_000, 400)).await;
    let remaining = |r: &common::Reply| -> i64 {
        let header = r.header("ratelimit").unwrap();
        header
            .split(';')
            .find_map(|p| p.strip_prefix("r="))
            .unwrap()
            .parse()
            .unwrap()
    };
    let costly = format!(
        r#"{{"count":100,"filters":{{"regions":{},"allowedUpstreams":["provider-b","provider-c"]}}}}"#,
        cities(200, 64)
    );
    let cheap = h.extract(r#"{"count":1}"#, &[]).await;
    let first = h.extract(&costly, &[]).await;
    let second = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.ids().len(), 100);
    assert_eq!(remaining(&cheap) - remaining(&first), 1);
    assert_eq!(remaining(&first) - remaining(&second), 1);
}

/// "" is the region and carrier the pool records as unknown: a request may
/// ask for exactly those.
#[tokio::test]
async fn the_unknown_region_can_be_asked_for() {
    let h = Harness::start().await;
    let mut unknown = proxy("nowhere");
    unknown.region = String::new();
    unknown.carrier = String::new();
    h.load(&[proxy("known"), unknown]).await;
    let r = h
        .extract(
            r#"{"count":5,"filters":{"regions":[""],"carriers":[""]}}"#,
            &[],
        )
        .await;
    assert_eq!(r.ids(), ["nowhere"], "{}", r.body);
}
