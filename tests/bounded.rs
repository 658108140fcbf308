//! Every legal request is bounded: what a client names, real or invented,
//! costs the shared Redis a bounded number of commands and leaves nothing
//! behind; a stale backlog is answered at once; plans too costly to search
//! are refused before any write, naming the filters, and charged; and two
//! deployments on one pool with different policies refuse loudly instead
//! of answering from each other's index. Work is counted in Redis's own
//! command counts (`INFO commandstats`: deterministic), never in time.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::pools::{
    CARRIERS, UPSTREAMS, city_pool, command_calls, commands_for, load_all, script_calls, zcard,
};
use common::{Harness, app_over, extract_as, now_ms, proxies, proxy};
use proxy_pool::pool::{OutageClass, PoolPolicy, RedisOptions, RedisPool, keys};
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

async fn used_memory(h: &Harness) -> i64 {
    let mut conn = h.redis().await;
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

async fn dbsize_and_hints(h: &Harness) -> (u64, u64) {
    let mut conn = h.redis().await;
    let size: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    let hints: u64 = redis::cmd("HLEN")
        .arg(keys::IX_HINT)
        .query_async(&mut conn)
        .await
        .unwrap();
    (size, hints)
}

/// 10,000 requests naming invented values (64 regions with every protocol,
/// or invented values in every dimension, mixed with real ones) leave no
/// state behind: no key, no hint, less than 256 KB of `used_memory`.
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
        // no match, and no slice for what does not exist.
        _ => format!(
            r#"{{"count":1,"filters":{{"regions":["city-001",{}],"carriers":["nowhere-{i}"]}}}}"#,
            invented(&i.to_string(), 63).trim_matches(['[', ']'])
        ),
    };
    // Warm: scripts loaded, connections open, allocator settled.
    for i in 0..30 {
        assert_eq!(h.extract(&body(i), &[]).await.status, 200);
    }
    let before = (used_memory(&h).await, dbsize_and_hints(&h).await);
    for i in 30..10_030 {
        let r = h.extract(&body(i), &[]).await;
        assert_eq!((r.status, r.ids().len()), (200, 0), "{}", r.body);
    }
    let after = (used_memory(&h).await, dbsize_and_hints(&h).await);
    eprintln!("used_memory {} -> {} bytes", before.0, after.0);
    assert_eq!(before.1, after.1, "keys and hints");
    assert!(
        after.0 - before.0 < 256 * 1024,
        "used_memory grew by {} bytes",
        after.0 - before.0
    );
}

/// The costliest legal shapes on 10,800 combinations (3 protocols x 400
/// cities x 3 carriers x 3 upstreams): each costs a bounded number of
/// Redis commands, whatever it names; a shape naming more combinations of
/// existing values than one call searches is refused before any write
/// (422, naming the filters at fault); and an unfiltered call stays a few
/// dozen commands.
#[tokio::test]
async fn every_legal_shape_costs_a_bounded_number_of_commands() {
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
    let shapes = [
        ("unfiltered", r#"{"count":1}"#.to_owned()),
        (
            "64 cities, every protocol",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{}}}}}"#,
                cities(0, 64)
            ),
        ),
        (
            "16 cities, 64 values in every other dimension",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{},"carriers":{},"allowedUpstreams":{}}}}}"#,
                cities(100, 16),
                every(&CARRIERS, 61),
                every(&UPSTREAMS, 61)
            ),
        ),
        (
            "64 invented values in every dimension",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{},"carriers":{},"allowedUpstreams":{}}}}}"#,
                invented("r", 64),
                invented("c", 64),
                invented("u", 64)
            ),
        ),
        (
            "one upstream, 28 cities (252 combinations)",
            format!(
                r#"{{"count":1,"filters":{{"regions":{},"allowedUpstreams":["provider-b"]}}}}"#,
                cities(200, 28)
            ),
        ),
        (
            "all but one value in every dimension (refused)",
            format!(
                r#"{{"count":1,"filters":{{"protocols":["http","https"],"regions":{},"carriers":["telecom","unicom"],"allowedUpstreams":["provider-a","provider-b"]}}}}"#,
                cities(300, 63)
            ),
        ),
        (
            "one protocol, one city (the contract's example)",
            r#"{"count":1,"filters":{"protocols":["http"],"regions":["city-007"]}}"#.to_owned(),
        ),
    ];
    let mut costs = Vec::new();
    for (name, body) in &shapes {
        // The first call of a shape and a repeat (hints then set by it).
        for round in 0..2 {
            let (ran, r) = commands_for(&h, body).await;
            // All but one value everywhere: 504 combinations, refused.
            let expected = if name.starts_with("all but one") {
                422
            } else {
                200
            };
            assert_eq!(r.status, expected, "{name}: {}", r.body);
            costs.push((*name, round, ran));
        }
    }
    eprintln!("Redis commands per call (shape, round, commands): {costs:#?}");
    let unfiltered = costs[0].2;
    assert!(unfiltered <= 40, "unfiltered: {unfiltered}");
    for (name, round, ran) in &costs {
        // At most the 256 slices one call may plan, one hint read per chunk,
        // a probe and its deadlines for the slices the walk reaches, and
        // the commit: far from one command per combination named.
        assert!(*ran <= 160, "{name} (call {round}): {ran} commands");
    }

    // More slices than one call searches (32 cities x 9 kinds of one
    // upstream: 288 combinations, over 256): refused, naming each filter,
    // with nothing written.
    let broad = format!(
        r#"{{"count":1,"filters":{{"regions":{},"allowedUpstreams":["provider-b"]}}}}"#,
        cities(0, 32)
    );
    let calls_before = command_calls(&h).await;
    let (ran, r) = commands_for(&h, &broad).await;
    let calls_after = command_calls(&h).await;
    assert_eq!(
        (r.status, r.code()),
        (422, "FILTERS_TOO_BROAD"),
        "{}",
        r.body
    );
    common::assert_valid("Problem", &serde_json::from_str(&r.body).unwrap());
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let fields: Vec<&str> = body["invalidParams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["filters.regions", "filters.allowedUpstreams"]);
    assert!(ran <= 40, "a refusal reads no slice: {ran} commands");
    let written: Vec<&String> = calls_after
        .iter()
        .filter(|(name, n)| calls_before.get(*name) != Some(n))
        .map(|(name, _)| name)
        .filter(|name| {
            ![
                "zrangebylex",
                "zlexcount",
                "hmget",
                "hlen",
                "hkeys",
                "get",
                "time",
                "info",
            ]
            .contains(&name.as_str())
                && !["eval", "fcall"].iter().any(|call| name.starts_with(call))
        })
        .collect();
    assert!(written.is_empty(), "a refusal writes nothing: {written:?}");
}

/// Hints go stale when another family's walk takes a slice's first entry
/// (here: unfiltered calls take the first entries of every city). A request
/// over 64 such cities would probe each one; past 24 stale probes the call
/// writes their true hints and answers `again`, so no call probes more
/// than that, and the third one answers exactly: the soonest-expiring
/// entry of those cities. A repeat is one call again.
#[tokio::test]
async fn stale_hints_cost_bounded_calls() {
    let h = Harness::start().await;
    let pool = city_pool("c", 12_000, 100);
    load_all(&h, &pool).await;
    let mut taken = std::collections::BTreeSet::new();
    // The soonest 1,500 (15 per city on average, none of them by city).
    for _ in 0..15 {
        let r = h.extract(r#"{"count":100}"#, &[]).await;
        assert_eq!(r.status, 200, "{}", r.body);
        taken.extend(r.ids());
    }
    let body = format!(
        r#"{{"count":1,"filters":{{"protocols":["http","https","socks5"],"regions":{}}}}}"#,
        cities(0, 64)
    );
    let named: std::collections::BTreeSet<String> =
        (0..64).map(|i| format!("city-{i:03}")).collect();
    for round in 0..2 {
        let expected = pool
            .iter()
            .filter(|p| named.contains(&p.region) && !taken.contains(&p.id))
            .min_by_key(|p| (p.expires_at, p.id.clone()))
            .map(|p| p.id.clone());
        let before = command_calls(&h).await;
        let (ran, r) = commands_for(&h, &body).await;
        let after = command_calls(&h).await;
        let calls = script_calls(&after) - script_calls(&before);
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.ids().first(), expected.as_ref(), "round {round}");
        taken.extend(r.ids());
        eprintln!("round {round}: {calls} script calls, {ran} commands");
        if round == 0 {
            // Every named city's hint was stale: 24 probes, again, 24
            // more, again, then the last 16 and the answer.
            assert_eq!(calls, 3, "round {round}");
        } else {
            assert_eq!(calls, 1, "round {round}");
        }
        // Each call: the plan, at most 24 stale probes (a page and its
        // deadlines each) and one more, the hints, the commit.
        assert!(
            ran <= 160 * calls,
            "round {round}: {ran} commands in {calls} calls"
        );
    }
}

/// 100,000 entries indexed healthy, then stale all at once (a stalled
/// health checker), ahead of 5 fresh ones: count=1 takes the soonest fresh
/// one in a bounded number of commands, allOrNothing reports exactly 5,
/// and with 3,000 fresh ones behind the stale run every call still answers
/// (each clears at most 2,000 spent entries from the walk). The prune then
/// removes the backlog in bounded calls.
#[tokio::test]
async fn a_stale_backlog_is_answered_at_once() {
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
    assert_eq!(zcard(&h, keys::IX_LIVE).await, 100_000);
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

    let (ran, r) = commands_for(&h, r#"{"count":1}"#).await;
    assert_eq!(r.ids(), ["fresh-0000"], "{}", r.body);
    assert!(ran <= 200, "{ran} commands");
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
    assert!(ran <= 200, "{ran} commands");

    // Many fresh behind the stale run: every call answers; the spent run
    // leaves the walked family 2,000 entries a call.
    h.load(&fresh("more", 3_000)).await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(r.ids(), ["more-0000"], "{}", r.body);
    assert!(zcard(&h, keys::IX_POOL).await < 100_000 + 2_999);

    // The backlog: indexed, not eligible, and pruned in bounded calls.
    let report = h.pool.prune_expired(128, u32::MAX, None).await.unwrap();
    assert_eq!(report.index_entries, 100_000);
    assert!(report.batches as u64 >= 100_000 / 128);
    assert_eq!(zcard(&h, keys::IX_LIVE).await, 2_999);
}

/// Two deployments with different policies on one pool: the one whose
/// policy the pool did not record answers 503 POOL_POLICY_MISMATCH, naming
/// both, to extraction and readiness alike, and its writes are refused;
/// the other goes on answering.
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
    assert!(
        r.body
            .contains("the pool's policy is maxHealthCheckAge 120 s, minRemainingTTL 30 s"),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("this deployment's is maxHealthCheckAge 60 s, minRemainingTTL 30 s"),
        "{}",
        r.body
    );
    common::assert_valid("Problem", &serde_json::from_str(&r.body).unwrap());
    let ready = common::get(&app, "/health/ready").await;
    assert_eq!((ready.status, ready.code()), (503, "POOL_POLICY_MISMATCH"));
    assert_eq!(
        ready.header("readiness-reasons"),
        Some("pool-policy-mismatch")
    );
    let refused = other.upsert(&proxies("q", 1)).await.unwrap_err();
    assert_eq!(refused.outage_class(), Some(OutageClass::Policy));

    // The recorded deployment is untouched by any of it.
    assert_eq!(zcard(&h, keys::IX_LIVE).await, 3);
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

/// A costly plan is charged to the client's rate limit in units of work:
/// one unit per started 512, the first free; a plain call costs its one.
#[tokio::test]
async fn costly_shapes_are_charged_to_the_rate_limit() {
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
    // 252 combinations planned and 20 proxies taken: over 1,024 of work.
    let costly = format!(
        r#"{{"count":20,"filters":{{"regions":{},"allowedUpstreams":["provider-b"]}}}}"#,
        cities(200, 28)
    );
    let cheap = h.extract(r#"{"count":1}"#, &[]).await;
    let first = h.extract(&costly, &[]).await;
    let second = h.extract(r#"{"count":1}"#, &[]).await;
    let third = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    // The admission charged each request one unit; the costly one charged
    // more after it ran, which the next admission sees.
    assert_eq!(remaining(&cheap) - remaining(&first), 1);
    assert!(
        remaining(&first) - remaining(&second) >= 2,
        "{} then {}",
        remaining(&first),
        remaining(&second)
    );
    assert_eq!(remaining(&second) - remaining(&third), 1);
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
