//! Differential test of the pool contract: random sequences of loads,
//! health results, Worker claims, drains, acknowledgements, releases,
//! removals, extractions (both modes, random filters and counts, idempotent
//! retries) and clock advances run against the Lua scripts on a real Redis
//! and against the in-memory reference model, which must agree on every
//! result and on the whole pool state after every step.
//!
//! Over 500 lines on purpose: one property test, whose operation generator
//! and the step that runs each operation on both sides are one unit (the
//! model itself is `common/model.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use common::model::{MemoryPool, pool_state};

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use proxy_pool::extraction::ExtractRequest;
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{
    ContractOp, ExtractionOutcome, ExtractionQuery, Extractor, Filters, Fulfillment,
    IdempotencyScope, NewProxy, PoolContract, PoolPolicy, RedisOptions, RedisPool,
};

const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];
const CARRIERS: [&str; 3] = ["telecom", "unicom", "mobile"];
const UPSTREAMS: [&str; 3] = ["provider-a", "provider-b", "provider-c"];
const MIN_TTL: Duration = Duration::from_millis(1000);
const MAX_HEALTH_AGE: Duration = Duration::from_millis(1500);
/// The pool policy of every run (and the Workers' claims use the same rules).
const POLICY: PoolPolicy = PoolPolicy {
    max_health_check_age: MAX_HEALTH_AGE,
    min_remaining_ttl: MIN_TTL,
};

/// The pool shape a run draws from: how many ids, regions, carriers and
/// upstreams, how large a load, a request and a reserve can be.
#[derive(Debug, Clone, Copy)]
struct Shape {
    ids: u16,
    regions: usize,
    carriers: usize,
    upstreams: usize,
    max_batch: usize,
    max_count: u32,
    max_reserve: u32,
}

/// Ten proxies in 24 combinations: every state change is likely to meet
/// every other.
const SMALL: Shape = Shape {
    ids: 10,
    regions: 2,
    carriers: 2,
    upstreams: 2,
    max_batch: 6,
    max_count: 6,
    max_reserve: 3,
};

/// Hundreds of proxies over 40 regions (1,080 combinations, 120 kinds of
/// slice): many-slice merges, reserves larger than what is eligible, and
/// runs of stale entries ahead of fresh ones.
const WIDE: Shape = Shape {
    ids: 400,
    regions: 40,
    carriers: 3,
    upstreams: 3,
    max_batch: 64,
    max_count: 40,
    max_reserve: 120,
};

fn region(i: usize) -> String {
    format!("city-{i:03}")
}

#[derive(Debug, Clone)]
struct Spec {
    id: u16,
    protocol: usize,
    region: usize,
    carrier: usize,
    upstream: usize,
    expires_in: i64,
    margin: i64,
    health_ok: bool,
    checked_ago: i64,
}

#[derive(Debug, Clone)]
enum Op {
    Load(Vec<Spec>),
    Health {
        id: u16,
        ok: bool,
        checked_ago: Option<i64>,
    },
    Claim {
        id: u16,
        worker: u8,
    },
    Drain {
        id: u16,
        who: u8,
        stale: bool,
    },
    Ack {
        id: u16,
        who: u8,
        stale: bool,
        active: u32,
        reserved: u32,
    },
    Release {
        id: u16,
        who: u8,
        stale: bool,
    },
    Remove {
        id: u16,
    },
    Extract {
        count: u32,
        all_or_nothing: bool,
        protocols: Vec<usize>,
        regions: Vec<usize>,
        carriers: Vec<usize>,
        upstreams: Option<Vec<usize>>,
        key: Option<u8>,
        reserve: u32,
    },
    Advance(u64),
}

fn subset(n: usize, most: usize) -> impl Strategy<Value = Vec<usize>> {
    proptest::sample::subsequence((0..n).collect::<Vec<_>>(), 0..=n.min(most))
}

fn spec(shape: Shape) -> impl Strategy<Value = Spec> {
    (
        (
            0..shape.ids,
            0..3usize,
            0..shape.regions,
            0..shape.carriers,
            0..shape.upstreams,
        ),
        -200i64..4000,
        0i64..3000,
        prop::bool::weighted(0.85),
        0i64..2500,
    )
        .prop_map(
            |(
                (id, protocol, region, carrier, upstream),
                expires_in,
                margin,
                health_ok,
                checked_ago,
            )| {
                Spec {
                    id,
                    protocol,
                    region,
                    carrier,
                    upstream,
                    expires_in,
                    margin,
                    health_ok,
                    checked_ago,
                }
            },
        )
}

/// A load of fresh proxies behind a run of ones expiring sooner whose
/// health checks go stale 100 ms after the load, in one region: what a
/// stalled health checker leaves (indexed, then spent).
fn stale_run(shape: Shape) -> impl Strategy<Value = Vec<Spec>> {
    (
        0..shape.regions,
        1..shape.max_batch.saturating_sub(5).max(2),
        1..6usize,
        0..shape.ids,
    )
        .prop_map(move |(region, stale, fresh, first)| {
            (0..stale + fresh)
                .map(|i| Spec {
                    id: ((usize::from(first) + i) % usize::from(shape.ids)) as u16,
                    protocol: i % 3,
                    region,
                    carrier: i % shape.carriers,
                    upstream: i % shape.upstreams,
                    expires_in: 1500 + i as i64 * 10,
                    margin: 0,
                    health_ok: true,
                    checked_ago: if i < stale { 1400 } else { 0 },
                })
                .collect()
        })
}

/// A load that gives each proxy its own combination (derived from its id)
/// with a new expiry and health check: once an id is there, what the
/// Controller sends most, a refresh that moves the entry within its
/// combination's slice (the scripts' in-place path when the head stays).
fn same_place(shape: Shape) -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec(
        (
            0..shape.ids,
            200i64..4000,
            prop::bool::weighted(0.9),
            0i64..1500,
        ),
        1..shape.max_batch,
    )
    .prop_map(move |items| {
        items
            .into_iter()
            .map(|(id, expires_in, health_ok, checked_ago)| {
                let n = usize::from(id);
                Spec {
                    id,
                    protocol: n % 3,
                    region: n % shape.regions,
                    carrier: n % shape.carriers,
                    upstream: n % shape.upstreams,
                    expires_in,
                    margin: 0,
                    health_ok,
                    checked_ago,
                }
            })
            .collect()
    })
}

fn op(shape: Shape) -> impl Strategy<Value = Op> {
    let ids = shape.ids;
    prop_oneof![
        3 => prop::collection::vec(spec(shape), 1..shape.max_batch).prop_map(Op::Load),
        1 => stale_run(shape).prop_map(Op::Load),
        2 => same_place(shape).prop_map(Op::Load),
        2 => (0..ids, any::<bool>(), prop::option::of(0i64..2500))
            .prop_map(|(id, ok, checked_ago)| Op::Health { id, ok, checked_ago }),
        3 => (0..ids, 0..3u8).prop_map(|(id, worker)| Op::Claim { id, worker }),
        2 => (0..ids, 0..3u8, prop::bool::weighted(0.2))
            .prop_map(|(id, who, stale)| Op::Drain { id, who, stale }),
        2 => (0..ids, 0..3u8, prop::bool::weighted(0.2), 0..2u32, 0..2u32)
            .prop_map(|(id, who, stale, active, reserved)| Op::Ack { id, who, stale, active, reserved }),
        2 => (0..ids, 0..3u8, prop::bool::weighted(0.2))
            .prop_map(|(id, who, stale)| Op::Release { id, who, stale }),
        1 => (0..ids).prop_map(|id| Op::Remove { id }),
        5 => (
            (1..=shape.max_count, any::<bool>()),
            (subset(3, 3), subset(shape.regions, 4), subset(shape.carriers, 2)),
            prop::option::of(subset(shape.upstreams, 3)),
            prop::option::of(0..3u8),
            prop_oneof![Just(0u32), 0..=shape.max_reserve],
        )
            .prop_map(|((count, all_or_nothing), (protocols, regions, carriers), upstreams, key, reserve)| {
                Op::Extract { count, all_or_nothing, protocols, regions, carriers, upstreams, key, reserve }
            }),
        1 => (1..40u64).prop_map(Op::Advance),
    ]
}

async fn redis_now(pool: &RedisPool) -> i64 {
    let mut conn = pool.connection();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    secs * 1000 + micros / 1000
}

fn id(n: u16) -> String {
    format!("px-{n}")
}

/// The holder and epoch an ownership operation names: the current ones,
/// or (`who` 1 and 2) some Worker, and with `stale` the epoch before.
fn holder(model: &MemoryPool, n: u16, who: u8, stale: bool) -> (String, u64) {
    let state = model.state();
    let record = state.records.get(&id(n));
    let owner = record.and_then(|r| r["owner"].as_str()).map(str::to_owned);
    let epoch = record.and_then(|r| r["epoch"].as_u64()).unwrap_or(0);
    let worker = match (who, owner) {
        (0, Some(owner)) => owner,
        (w, _) => format!("w{w}"),
    };
    (
        worker,
        if stale {
            epoch.saturating_sub(1)
        } else {
            epoch
        },
    )
}

async fn step(
    pool: &RedisPool,
    model: &mut MemoryPool,
    op: &Op,
    n: usize,
) -> Result<(), TestCaseError> {
    match op {
        Op::Load(specs) => {
            let base = redis_now(pool).await;
            let batch: Vec<NewProxy> = specs
                .iter()
                .map(|s| {
                    let expires_at = base + s.expires_in;
                    NewProxy {
                        id: id(s.id),
                        protocol: PROTOCOLS[s.protocol].into(),
                        host: format!("192.0.2.{}", s.id % 250 + 1),
                        port: 8000 + s.id,
                        username: (s.id % 2 == 0).then(|| format!("u{}", s.id)),
                        password: (s.id % 2 == 0).then(|| format!("p{}", s.id)),
                        region: region(s.region),
                        carrier: CARRIERS[s.carrier].into(),
                        upstream: UPSTREAMS[s.upstream].into(),
                        expires_at,
                        usable_until: expires_at - s.margin,
                        health_ok: s.health_ok,
                        health_checked_at: base - s.checked_ago,
                    }
                })
                .collect();
            let (statuses, now) = PoolContract::new(pool).upsert_batch(&batch).await.unwrap();
            prop_assert_eq!(statuses, model.upsert(&batch, now), "step {}: {:?}", n, op);
        }
        Op::Extract {
            count,
            all_or_nothing,
            protocols,
            regions,
            carriers,
            upstreams,
            key,
            reserve,
        } => {
            let mut filters = Filters {
                protocols: protocols.iter().map(|i| PROTOCOLS[*i].to_owned()).collect(),
                regions: regions.iter().map(|i| region(*i)).collect(),
                carriers: carriers.iter().map(|i| CARRIERS[*i].to_owned()).collect(),
                ..Filters::default()
            };
            let upstream_set: Option<BTreeSet<String>> = upstreams
                .as_ref()
                .map(|u| u.iter().map(|i| UPSTREAMS[*i].to_owned()).collect());
            filters.allowed_upstreams = upstream_set.iter().flatten().cloned().collect();
            let fulfillment = if *all_or_nothing {
                Fulfillment::AllOrNothing
            } else {
                Fulfillment::Partial
            };
            let request = ExtractRequest {
                count: *count,
                fulfillment: Some(fulfillment),
                filters: filters.clone(),
            };
            let query = ExtractionQuery {
                count: *count,
                fulfillment,
                reserve: *reserve,
                filters: &filters,
                permitted_upstreams: upstream_set.as_ref(),
                request_id: &format!("req-{n}"),
                idempotency: key.map(|k| IdempotencyScope {
                    key: proxy_pool::pool::keys::idempotency("model", &format!("key-{k}")),
                    digest: request.digest(fulfillment).unwrap(),
                    ttl: Duration::from_secs(600),
                }),
                usage: None,
            };
            let real = Extractor::new(pool).extract(&query).await.unwrap();
            let now = match &real {
                ExtractionOutcome::Committed(c) => c.extracted_at,
                ExtractionOutcome::Insufficient { at_ms, .. } => *at_ms,
                ExtractionOutcome::Replayed(_)
                | ExtractionOutcome::KeyReused
                | ExtractionOutcome::NotReplicated { .. } => 0,
            };
            prop_assert_eq!(real, model.extract(&query, now), "step {}: {:?}", n, op);
        }
        Op::Advance(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        contract => {
            let op = match contract {
                Op::Health {
                    id: n,
                    ok,
                    checked_ago,
                } => ContractOp::Health {
                    id: id(*n),
                    ok: *ok,
                    checked_at: match checked_ago {
                        Some(ago) => Some(redis_now(pool).await - ago),
                        None => None,
                    },
                },
                Op::Claim { id: n, worker } => ContractOp::Claim {
                    id: id(*n),
                    worker: format!("w{worker}"),
                    min_remaining_ttl: MIN_TTL,
                    max_health_check_age: MAX_HEALTH_AGE,
                },
                Op::Drain { id: n, who, stale } => {
                    let (worker, epoch) = holder(model, *n, *who, *stale);
                    ContractOp::Drain {
                        id: id(*n),
                        worker,
                        epoch,
                    }
                }
                Op::Ack {
                    id: n,
                    who,
                    stale,
                    active,
                    reserved,
                } => {
                    let (worker, epoch) = holder(model, *n, *who, *stale);
                    ContractOp::Ack {
                        id: id(*n),
                        worker,
                        epoch,
                        active: *active,
                        reserved: *reserved,
                    }
                }
                Op::Release { id: n, who, stale } => {
                    let (worker, epoch) = holder(model, *n, *who, *stale);
                    ContractOp::Release {
                        id: id(*n),
                        worker,
                        epoch,
                    }
                }
                Op::Remove { id: n } => ContractOp::Remove { id: id(*n) },
                _ => unreachable!(),
            };
            let real = PoolContract::new(pool).apply(&op).await.unwrap();
            prop_assert_eq!(real, model.apply(&op, real.at_ms), "step {}: {:?}", n, op);
        }
    }
    let expected = model.state();
    let state = pool_state(pool)
        .await
        .map_err(|e| TestCaseError::fail(format!("after step {n}: {op:?}: {e}")))?;
    // Nothing in the pool expires by a Redis TTL: every part is compared,
    // the index on what is still ahead of its deadline (a spent entry is
    // out of the real index once a walk passed it; never handed out).
    prop_assert_eq!(
        &state.records,
        &expected.records,
        "records after step {}: {:?}",
        n,
        op
    );
    prop_assert_eq!(
        &state.expiry,
        &expected.expiry,
        "expiry after step {}: {:?}",
        n,
        op
    );
    prop_assert_eq!(
        state.live_index(state.read_at),
        expected.live_index(state.read_at),
        "index after step {}: {:?}",
        n,
        op
    );
    prop_assert_eq!(
        &state.held,
        &expected.held,
        "held after step {}: {:?}",
        n,
        op
    );
    Ok(())
}

/// Runs `cases` random operation sequences of `shape` (each on an emptied
/// Redis) and returns how many operations ran; panics on a divergence.
fn check(shape: Shape, cases: u32, ops: std::ops::Range<usize>) -> usize {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let redis = rt
        .block_on(RedisServer::start())
        .expect("redis-server must be installed");
    // The connection manager spawns onto the runtime it is created in.
    let options = RedisOptions {
        policy: POLICY,
        ..RedisOptions::single(Duration::from_secs(5))
    };
    let pool = rt
        .block_on(async { RedisPool::with_options(&redis.url(), &options) })
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    let total_ops = std::cell::Cell::new(0usize);
    let result = runner.run(&prop::collection::vec(op(shape), ops), |ops| {
        total_ops.set(total_ops.get() + ops.len());
        rt.block_on(async {
            let mut conn = pool.connection();
            let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
            let mut model = MemoryPool::new(POLICY);
            for (n, op) in ops.iter().enumerate() {
                step(&pool, &mut model, op, n).await?;
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    total_ops.get()
}

fn cases(default: u32) -> u32 {
    std::env::var("MODEL_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Thousands of random operations per run on a small pool; the scripts and
/// the model never diverge in a result or in the pool's state.
#[test]
fn scripts_agree_with_the_model() {
    let cases = cases(48);
    let total_ops = check(SMALL, cases, 40..120);
    eprintln!("model check (small pools): {cases} cases, {total_ops} operations");
    assert!(total_ops >= 2000, "too few operations: {total_ops}");
}

/// The same on wide pools: 1,080 combinations, loads of up to 64 proxies,
/// counts up to 40, reserves up to 120 (often more than is eligible), runs
/// of stale entries ahead of fresh ones, filters naming several regions.
#[test]
fn scripts_agree_with_the_model_on_wide_pools() {
    let cases = cases(16);
    let total_ops = check(WIDE, cases, 30..80);
    eprintln!("model check (wide pools): {cases} cases, {total_ops} operations");
    assert!(total_ops >= 400, "too few operations: {total_ops}");
}
