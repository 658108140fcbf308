//! A primary with a replica (`PROXY_POOL_REPLICA_ACKS`): a 200 only once
//! the replica holds the extraction (`WAIT`), a 503 and a later replay
//! while it is gone, the connection lanes that carry each `WAIT`, and
//! group commit (one `WAIT` for the extractions that arrive together).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::topology::{acknowledging_replica, connect, info, until};
use common::{app_over, extract_as, proxies, test_config};
use proxy_pool::distribution::App;
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{
    ExtractionOutcome, ExtractionQuery, Extractor, Filters, Fulfillment, PoolContract, RedisPool,
    keys,
};
use redis::aio::MultiplexedConnection;

async fn record_status(conn: &mut MultiplexedConnection, id: &str) -> Option<String> {
    common::stored_status(conn, id).await.map(str::to_owned)
}

/// With `PROXY_POOL_REPLICA_ACKS=1` over a primary and one replica: a 200
/// means the replica already holds the extraction. With the replica gone,
/// an extraction commits on the primary but is answered 503 (not handed
/// out); its retry with the same `Idempotency-Key` stays 503 until the
/// replica is back, then gets the committed result replayed. Nothing is
/// handed out twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acknowledgement_before_answering() {
    let primary = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])
        .await
        .expect("redis-server must be installed");
    let mut on_primary = connect(&primary.url()).await;
    let mut on_replica = connect(&replica.url()).await;
    let linked = |want: &'static str| {
        let primary = primary.url();
        let replica = replica.url();
        move || {
            let (primary, replica) = (primary.clone(), replica.clone());
            async move {
                let p = info(&mut connect(&primary).await, &["INFO", "replication"]).await;
                let r = info(&mut connect(&replica).await, &["INFO", "replication"]).await;
                match want {
                    // Linked, and acknowledging: a replica that has just
                    // synced can take a moment before its first ACK, and
                    // until then a WAIT (rightly) times out.
                    "up" => {
                        let acked =
                            common::replicas_acknowledge(&primary, "replication-probe", 1).await;
                        p.contains("connected_slaves:1")
                            && r.contains("master_link_status:up")
                            && acked
                    }
                    _ => p.contains("connected_slaves:0"),
                }
            }
        }
    };
    until("replica linked", linked("up")).await;

    let mut config = test_config();
    config.redis_timeout = Duration::from_millis(1000);
    config.replica_acks = 1;
    config.replica_ack_timeout = Duration::from_millis(200);
    let pool = RedisPool::with_options(&primary.url(), &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies("rep", 6))
        .await
        .unwrap();
    let me = "127.0.0.1:1";

    // Acknowledged: the replica holds the tombstones the moment we answer.
    let r = extract_as(
        &app,
        r#"{"count":2}"#,
        &[("idempotency-key", "rep-key-0001")],
        me,
    )
    .await;
    assert_eq!(r.ids(), ["rep-0000", "rep-0001"], "{}", r.body);
    assert_eq!(
        record_status(&mut on_replica, "rep-0000").await.as_deref(),
        Some("EXTRACTED")
    );

    // The replica leaves: committed on the primary, not answered.
    info(&mut on_replica, &["REPLICAOF", "NO", "ONE"]).await;
    until("replica gone", linked("down")).await;
    let key = [("idempotency-key", "rep-key-0002")];
    let started = Instant::now();
    let r = extract_as(&app, r#"{"count":2}"#, &key, me).await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    assert!(
        r.json["detail"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key")
    );
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(
        record_status(&mut on_primary, "rep-0002").await.as_deref(),
        Some("EXTRACTED")
    );
    let retry = extract_as(&app, r#"{"count":2}"#, &key, me).await;
    assert_eq!(
        retry.status, 503,
        "a replay is not answered unacknowledged either"
    );
    // Without a key the proxies it took are lost to the pool, never doubled.
    let r = extract_as(&app, r#"{"count":1}"#, &[], me).await;
    assert_eq!(r.status, 503);
    assert_eq!(
        record_status(&mut on_primary, "rep-0004").await.as_deref(),
        Some("EXTRACTED")
    );

    // The replica is back: the retry gets the committed result, and the
    // replica holds its record.
    info(&mut on_replica, &["REPLICAOF", "127.0.0.1", &port]).await;
    until("replica relinked", linked("up")).await;
    let retry = extract_as(&app, r#"{"count":2}"#, &key, me).await;
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.ids(), ["rep-0002", "rep-0003"]);
    let record = keys::idempotency("ip:127.0.0.1", "rep-key-0002");
    let replicated: bool = redis::cmd("HEXISTS")
        .arg(keys::IDEMPOTENCY)
        .arg(&record)
        .query_async(&mut on_replica)
        .await
        .unwrap();
    assert!(replicated);
    let rest = extract_as(&app, r#"{"count":10}"#, &[], me).await;
    assert_eq!(rest.ids(), ["rep-0005"]);
}

/// A primary with one replica that acknowledges, and a handler with
/// `PROXY_POOL_REPLICA_ACKS=1` over it, its pool holding `n` proxies.
async fn acknowledged_pool(
    prefix: &str,
    n: usize,
) -> (RedisServer, RedisServer, std::sync::Arc<App>, RedisPool) {
    let primary = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let replica = acknowledging_replica(&primary, primary.port()).await;
    let mut config = test_config();
    config.redis_timeout = Duration::from_millis(1000);
    config.replica_acks = 1;
    config.replica_ack_timeout = Duration::from_millis(500);
    let pool = RedisPool::with_options(&primary.url(), &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies(prefix, n))
        .await
        .unwrap();
    (primary, replica, app, pool)
}

/// With replica acks, the scripts of a batch and its `WAIT` travel in one
/// write; after `FUNCTION FLUSH` the `Function not found` answer inside a
/// batch is followed, as on the shared connection, by a load and a later
/// batch: 200, acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_extraction_survives_script_flush() {
    let (primary, _replica, app, _) = acknowledged_pool("flush", 4).await;
    let me = "127.0.0.1:1";
    let r = extract_as(&app, r#"{"count":1}"#, &[], me).await;
    assert_eq!(r.status, 200, "{}", r.body);
    info(&mut connect(&primary.url()).await, &["FUNCTION", "FLUSH"]).await;
    let r = extract_as(&app, r#"{"count":1}"#, &[], me).await;
    assert_eq!(r.ids(), ["flush-0001"], "{}", r.body);
}

/// Lanes left idle when their connections die (a Redis restart, a
/// failover, `CLIENT KILL`) are not lent out one failure at a time: the
/// first extraction that finds its lane dead gets its 503, and every later
/// one a fresh socket. Eight lanes are opened by eight concurrent
/// extractions, every client connection is then killed, and eight more
/// extractions follow one after another: at most one of them may fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_idle_lanes_cost_one_answer_not_one_each() {
    const LANES: usize = 8;
    let (primary, _replica, app, _) = acknowledged_pool("lanes", 4 * LANES).await;
    let me = "127.0.0.1:1";
    let gate = std::sync::Arc::new(tokio::sync::Barrier::new(LANES));
    let opened: Vec<_> = (0..LANES)
        .map(|_| {
            let (app, gate) = (std::sync::Arc::clone(&app), std::sync::Arc::clone(&gate));
            tokio::spawn(async move {
                gate.wait().await;
                extract_as(&app, r#"{"count":1}"#, &[], me).await.status
            })
        })
        .collect();
    for request in opened {
        assert_eq!(request.await.unwrap(), 200);
    }
    let clients = info(&mut connect(&primary.url()).await, &["CLIENT", "LIST"]).await;
    assert!(
        clients.lines().count() >= 3,
        "the concurrent extractions should have opened lanes of their own:\n{clients}"
    );
    info(
        &mut connect(&primary.url()).await,
        &["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"],
    )
    .await;
    let mut failed = 0;
    for _ in 0..LANES {
        let r = extract_as(&app, r#"{"count":1}"#, &[], me).await;
        match r.status {
            200 => {}
            503 => failed += 1,
            other => panic!("unexpected {other}: {}", r.body),
        }
    }
    assert!(failed <= 1, "{failed} extractions found a dead idle lane");
}

/// One plain extraction of one proxy, as the service would ask for it.
async fn extract_one(pool: &RedisPool, request_id: &str) -> ExtractionOutcome {
    let query = ExtractionQuery {
        count: 1,
        fulfillment: Fulfillment::Partial,
        reserve: 0,
        filters: &Filters::default(),
        permitted_upstreams: None,
        request_id,
        idempotency: None,
        usage: None,
    };
    Extractor::new(pool).extract(&query).await.unwrap()
}

/// How many `WAIT`s the server has run.
async fn waits_run(server: &RedisServer) -> u64 {
    let stats = info(&mut connect(&server.url()).await, &["INFO", "commandstats"]).await;
    common::command_calls(&stats)
        .get("wait")
        .copied()
        .unwrap_or(0)
}

/// Group commit: extractions that reach Redis together go out in one
/// write with one `WAIT` behind them, and that `WAIT` acknowledges each.
/// Ten extractions started in one turn of a current-thread runtime (so all
/// of them join the batch before it is sent) are answered by exactly one
/// `WAIT`, every one committed, acknowledged and with a proxy of its own.
#[tokio::test]
async fn extractions_that_arrive_together_share_one_wait() {
    const TOGETHER: usize = 10;
    let (primary, _replica, _, pool) = acknowledged_pool("batch", TOGETHER + 1).await;
    assert!(matches!(
        extract_one(&pool, "warm-up").await,
        ExtractionOutcome::Committed(_)
    ));
    let before = waits_run(&primary).await;
    let mut together = tokio::task::JoinSet::new();
    for i in 0..TOGETHER {
        let pool = pool.clone();
        together.spawn(async move { extract_one(&pool, &format!("together-{i}")).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    for outcome in together.join_all().await {
        let ExtractionOutcome::Committed(c) = outcome else {
            panic!("not committed and acknowledged: {outcome:?}");
        };
        ids.extend(c.proxies.into_iter().map(|p| p.id));
    }
    assert_eq!(ids.len(), TOGETHER);
    assert_eq!(waits_run(&primary).await - before, 1);
}
