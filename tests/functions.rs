//! The scripts as Redis Functions: the library loaded once and again when
//! a server lost it (a flush, a promoted Cluster replica, a master down
//! elsewhere), and `EVALSHA` when Functions are turned off or refused.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::Duration;

use common::topology::{
    calls_of, calls_on, cluster_pool, cluster_replica_of, connect, info, ready, slot_owner_port,
    start_cluster, until,
};
use common::{app_over, extract_as, proxies, test_config};
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{ContractOp, Maintenance, PoolContract, RedisPool, Verdict};

/// The scripts run as Redis Functions: the library is loaded once (by the
/// first script call, never by readiness; with it the public contract
/// library, a second load), every later script call is one `FCALL` (none
/// by `EVALSHA`), and after a `FUNCTION FLUSH` the next call finds no
/// function, loads both libraries again and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_function_library_is_loaded_once() {
    let server = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let config = test_config();
    let pool = RedisPool::with_options(&server.url(), &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    assert_eq!(ready(&app).await.status, 200);
    PoolContract::new(&pool)
        .upsert(&proxies("fn", 20))
        .await
        .unwrap();
    let me = "127.0.0.1:1";
    let before = calls_on(&server.url()).await;
    for i in 0..5 {
        let r = extract_as(&app, r#"{"count":2}"#, &[], me).await;
        assert_eq!(
            r.ids(),
            [format!("fn-{:04}", 2 * i), format!("fn-{:04}", 2 * i + 1)]
        );
    }
    let after = calls_on(&server.url()).await;
    let delta = |command| calls_of(&after, command) - calls_of(&before, command);
    assert_eq!(delta("fcall"), 5, "{after:?}");
    assert_eq!(delta("evalsha"), 0, "{after:?}");
    for _ in 0..3 {
        assert_eq!(ready(&app).await.status, 200);
    }
    assert!(pool.uses_functions());
    let calls = calls_on(&server.url()).await;
    assert_eq!(calls_of(&calls, "function|load"), 2, "{calls:?}");
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(proxy_pool::pool::contract_library())
        .query_async(&mut connect(&server.url()).await)
        .await
        .unwrap();
    assert!(
        matches!(&listed, redis::Value::Array(l) if l.len() == 1),
        "{listed:?}"
    );

    info(&mut connect(&server.url()).await, &["FUNCTION", "FLUSH"]).await;
    let r = extract_as(&app, r#"{"count":1}"#, &[], me).await;
    assert_eq!(r.ids(), ["fn-0010"], "{}", r.body);
    let calls = calls_on(&server.url()).await;
    assert_eq!(calls_of(&calls, "function|load"), 4, "{calls:?}");
    assert!(pool.uses_functions());
}

/// `PROXY_POOL_REDIS_FUNCTIONS=false`: every script runs by `EVALSHA`, and
/// no library is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_can_be_turned_off() {
    let server = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let mut config = test_config();
    config.redis_functions = false;
    let pool = RedisPool::with_options(&server.url(), &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    assert_eq!(ready(&app).await.status, 200);
    PoolContract::new(&pool)
        .upsert(&proxies("off", 4))
        .await
        .unwrap();
    let r = extract_as(&app, r#"{"count":2}"#, &[], "127.0.0.1:1").await;
    assert_eq!(r.ids(), ["off-0000", "off-0001"], "{}", r.body);
    assert!(!pool.uses_functions());
    let calls = calls_on(&server.url()).await;
    assert_eq!(calls_of(&calls, "fcall"), 0, "{calls:?}");
    assert_eq!(calls_of(&calls, "function|load"), 0, "{calls:?}");
    assert!(calls_of(&calls, "evalsha") >= 2, "{calls:?}");
}

/// A Redis that will not run Functions (`FUNCTION` or `FCALL` renamed
/// away, as a restricted service may have them): the adapter falls back
/// to `EVALSHA` on its own, after at most one refused `FCALL`, and serves
/// exactly as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_the_scripts_run_by_evalsha() {
    for renamed in ["FUNCTION", "FCALL"] {
        let server = RedisServer::start_with(&["--rename-command", renamed, ""])
            .await
            .expect("redis-server must be installed");
        let config = test_config();
        let pool = RedisPool::with_options(&server.url(), &config.redis_options()).unwrap();
        let app = app_over(&config, pool.clone());
        PoolContract::new(&pool)
            .upsert(&proxies("ev", 10))
            .await
            .unwrap();
        assert!(!pool.uses_functions(), "{renamed}");
        assert_eq!(ready(&app).await.status, 200);
        let me = "127.0.0.1:1";
        let r = extract_as(&app, r#"{"count":3}"#, &[], me).await;
        assert_eq!(
            r.ids(),
            ["ev-0000", "ev-0001", "ev-0002"],
            "{renamed}: {}",
            r.body
        );
        let calls = calls_on(&server.url()).await;
        assert!(calls_of(&calls, "fcall") <= 1, "{renamed}: {calls:?}");
        assert_eq!(calls_of(&calls, "function|load"), 0, "{renamed}: {calls:?}");
        assert!(calls_of(&calls, "evalsha") >= 3, "{renamed}: {calls:?}");
        // The other pool scripts, each by EVALSHA too.
        let claim = ContractOp::Claim {
            id: "ev-0005".into(),
            worker: "w".into(),
            min_remaining_ttl: Duration::ZERO,
            max_health_check_age: Duration::from_secs(60),
        };
        let reply = PoolContract::new(&pool).apply(&claim).await.unwrap();
        assert_eq!(reply.verdict, Verdict::Ok, "{renamed}");
        let maintenance = Maintenance::new(&pool);
        assert_eq!(maintenance.inventory().await.unwrap().held, 1, "{renamed}");
        let pruned = maintenance.prune_expired(1000, 10, None).await.unwrap();
        assert!(pruned.complete, "{renamed}: {pruned:?}");
        assert!(!pool.uses_functions(), "{renamed}");
    }
}

/// Redis Functions on a Cluster: the library loaded on the node owning
/// `{pp}` reaches its replica by replication; once the replica is promoted
/// (`CLUSTER FAILOVER`), extraction goes on by `FCALL` with no new load.
/// A node that has no library (`FUNCTION FLUSH` on the new owner) gets it
/// on `Function not found`, like `NOSCRIPT`, and the call is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_follow_a_cluster_failover() {
    let nodes = start_cluster().await;
    let owner_port = slot_owner_port(&mut connect(&nodes[0].url()).await).await;
    let owner = nodes.iter().find(|n| n.port() == owner_port).unwrap();
    let replica = cluster_replica_of(owner).await;
    let (pool, app) = cluster_pool(&nodes, "fo", 10).await;
    let me = "127.0.0.1:1";
    let r = extract_as(&app, r#"{"count":2}"#, &[], me).await;
    assert_eq!(r.ids(), ["fo-0000", "fo-0001"], "{}", r.body);
    assert!(pool.uses_functions());
    until("the replica holds the library", || {
        let url = replica.url();
        async move {
            let listed: Vec<redis::Value> = redis::cmd("FUNCTION")
                .arg("LIST")
                .query_async(&mut connect(&url).await)
                .await
                .unwrap();
            !listed.is_empty()
        }
    })
    .await;
    let loads_before = calls_of(&calls_on(&replica.url()).await, "function|load");

    info(&mut connect(&replica.url()).await, &["CLUSTER", "FAILOVER"]).await;
    let replica_port = replica.port();
    until("the promoted replica owns {pp}", || {
        let url = nodes[0].url();
        async move { slot_owner_port(&mut connect(&url).await).await == replica_port }
    })
    .await;
    let r = extract_as(&app, r#"{"count":2}"#, &[], me).await;
    assert_eq!(r.ids(), ["fo-0002", "fo-0003"], "{}", r.body);
    let calls = calls_on(&replica.url()).await;
    assert_eq!(calls_of(&calls, "function|load"), loads_before, "{calls:?}");
    assert!(calls_of(&calls, "fcall") >= 1, "{calls:?}");

    info(&mut connect(&replica.url()).await, &["FUNCTION", "FLUSH"]).await;
    let r = extract_as(&app, r#"{"count":2}"#, &[], me).await;
    assert_eq!(r.ids(), ["fo-0004", "fo-0005"], "{}", r.body);
    let calls = calls_on(&replica.url()).await;
    // The private library, then the public one.
    assert_eq!(
        calls_of(&calls, "function|load"),
        loads_before + 2,
        "{calls:?}"
    );
    assert!(pool.uses_functions());
}

/// In a Cluster the library is loaded on the master owning `{pp}` only: with
/// another master down (the cluster still serving the pool's slot), a call
/// that finds no function loads it there, by `FCALL` still, and is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_down_elsewhere_does_not_stop_the_library_load() {
    let mut nodes = start_cluster().await;
    for n in &nodes {
        let mut conn = connect(&n.url()).await;
        info(
            &mut conn,
            &["CONFIG", "SET", "cluster-require-full-coverage", "no"],
        )
        .await;
    }
    let owner_port = slot_owner_port(&mut connect(&nodes[0].url()).await).await;
    let (pool, app) = cluster_pool(&nodes, "md", 4).await;
    let owner_url = format!("redis://127.0.0.1:{owner_port}/");
    info(&mut connect(&owner_url).await, &["FUNCTION", "FLUSH"]).await;
    let loads = calls_of(&calls_on(&owner_url).await, "function|load");
    let other = nodes.iter().position(|n| n.port() != owner_port).unwrap();
    drop(nodes.remove(other));

    let r = extract_as(&app, r#"{"count":2}"#, &[], "127.0.0.1:1").await;
    assert_eq!(r.ids(), ["md-0000", "md-0001"], "{}", r.body);
    let calls = calls_on(&owner_url).await;
    // The private library, then the public one.
    assert_eq!(calls_of(&calls, "function|load"), loads + 2, "{calls:?}");
    assert!(pool.uses_functions());
}
