//! The relay drills: a relay (`proxy_pool::local::Relay`) in front of a
//! single server or announced by the Cluster's `{pp}` master loses a reply
//! or closes the connection right after one, and the service must neither
//! resend an extraction nor confirm one by a `WAIT` on another socket.
//! Each drill reads the pool only after the relay reports its fault
//! carried out. `bash scripts/drills.sh` runs them many times under load.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::topology::{
    acknowledging_replica, cluster_replica_of, connect, every_node_names, info, ready,
    slot_owner_port, start_cluster, until,
};
use common::{app_over, extract_as, proxies, test_config};
use proxy_pool::local::{Armed, RedisServer, Relay};
use proxy_pool::pool::{PoolContract, RedisPool, keys};
use redis::aio::MultiplexedConnection;

/// Waits for the relay to report `armed` carried out: the event a drill
/// reads the pool after. The bound only turns a hang into a failure.
async fn carried_out(armed: Armed) {
    let done = tokio::time::timeout(Duration::from_secs(30), armed.done()).await;
    assert_eq!(done, Ok(true), "the relay never carried the fault out");
}

/// Proxies still in the pool's index.
async fn pooled(conn: &mut MultiplexedConnection) -> i64 {
    redis::cmd("ZCARD")
        .arg(keys::INDEX)
        .query_async(conn)
        .await
        .unwrap()
}

/// A reply lost after the extraction script ran (a relay forwards the
/// request, then closes the connection before the answer): without an
/// `Idempotency-Key` the answer is 503 and the script ran once (its two
/// proxies are lost with the reply, and nothing more leaves the pool); no
/// client layer resends it. With a key, the repeat is a replay: the same
/// two proxies are answered, and still nothing more leaves the pool. The
/// pool is read only after the relay reports that it forwarded the
/// `FCALL` and received (and dropped) its reply.
async fn lost_reply_drill(relay: &Relay, url: &str, cluster: bool, owner: &str) {
    let mut config = test_config();
    config.redis_cluster = cluster;
    let pool = RedisPool::with_options(url, &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies("lr", 20))
        .await
        .unwrap();
    let me = "127.0.0.1:1";
    assert_eq!(ready(&app).await.status, 200);
    assert_eq!(
        extract_as(&app, r#"{"count":1}"#, &[], me).await.status,
        200
    );
    let mut on_owner = connect(owner).await;
    assert_eq!(pooled(&mut on_owner).await, 19);

    let armed = relay.lose_reply_to(b"FCALL");
    let lost = extract_as(&app, r#"{"count":2}"#, &[], me).await;
    assert_eq!(
        (lost.status, lost.code()),
        (503, "SERVICE_UNAVAILABLE"),
        "{}",
        lost.body
    );
    carried_out(armed).await;
    assert_eq!(pooled(&mut on_owner).await, 17, "the extraction ran twice");

    let armed = relay.lose_reply_to(b"FCALL");
    let key = [("idempotency-key", "lost-reply-0001")];
    // The client retries with its key until a request meets the fault: the
    // cluster client refuses requests without sending them while it
    // reconnects after the first lost reply, and those change nothing.
    let mut first = extract_as(&app, r#"{"count":2}"#, &key, me).await;
    let retrying = Instant::now();
    while !armed.triggered() && retrying.elapsed() < Duration::from_secs(20) {
        assert_eq!(
            first.status, 503,
            "answered without reaching Redis: {}",
            first.body
        );
        first = extract_as(&app, r#"{"count":2}"#, &key, me).await;
    }
    assert!(armed.triggered(), "no request reached the relay");
    carried_out(armed).await;
    // The script has committed: the client's retry with the same key (if
    // the adapter's own repeat did not already replay it) is a replay.
    let answered = if first.status == 503 {
        extract_as(&app, r#"{"count":2}"#, &key, me).await
    } else {
        first
    };
    assert_eq!(answered.status, 200, "{}", answered.body);
    assert_eq!(answered.ids().len(), 2);
    assert_eq!(pooled(&mut on_owner).await, 15);
}

/// Single server: a lost reply is never resent (see [`lost_reply_drill`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_not_resent_by_a_single_server_client() {
    let redis = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let relay = Relay::start(([127, 0, 0, 1], redis.port()).into())
        .await
        .unwrap();
    let url = format!("redis://127.0.0.1:{}/", relay.port());
    lost_reply_drill(&relay, &url, false, &redis.url()).await;
}

/// Redis Cluster: the node owning `{pp}` announces a relay in front of it
/// (`cluster-announce-port`); a lost reply is never resent by the cluster
/// client (see [`lost_reply_drill`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_not_resent_by_the_cluster_client() {
    let nodes = start_cluster().await;
    let owner_port = slot_owner_port(&mut connect(&nodes[0].url()).await).await;
    let owner = nodes.iter().find(|n| n.port() == owner_port).unwrap();
    let relay = Relay::start(([127, 0, 0, 1], owner_port).into())
        .await
        .unwrap();
    let mut on_owner = connect(&owner.url()).await;
    info(
        &mut on_owner,
        &[
            "CONFIG",
            "SET",
            "cluster-announce-port",
            &relay.port().to_string(),
        ],
    )
    .await;
    let relay_port = relay.port();
    every_node_names(&nodes, relay_port).await;
    let url = format!("redis://127.0.0.1:{}/", relay.port());
    lost_reply_drill(&relay, &url, true, &owner.url()).await;
}

/// With replica acks in cluster mode, the `WAIT` that confirms an
/// extraction must be answered on the socket that carried it. The `{pp}`
/// master announces a relay; its replica sleeps (`DEBUG SLEEP`, so it holds
/// nothing new); `fault` breaks the connection around the extraction. The
/// answer must be 503, never a 200 confirmed by a `WAIT` on a new socket
/// (which has no writes, so it would count the sleeping replica at once).
async fn acknowledgement_drill(fault: impl FnOnce(&Relay) -> Armed) {
    let nodes = start_cluster().await;
    let owner_port = slot_owner_port(&mut connect(&nodes[0].url()).await).await;
    let owner = nodes.iter().find(|n| n.port() == owner_port).unwrap();
    let mut on_owner = connect(&owner.url()).await;
    let replica = cluster_replica_of(owner).await;

    let relay = Relay::start(([127, 0, 0, 1], owner_port).into())
        .await
        .unwrap();
    let relay_port = relay.port();
    info(
        &mut on_owner,
        &[
            "CONFIG",
            "SET",
            "cluster-announce-port",
            &relay_port.to_string(),
        ],
    )
    .await;
    every_node_names(nodes.iter().chain([&replica]), relay_port).await;

    let mut config = test_config();
    config.redis_cluster = true;
    config.redis_timeout = Duration::from_millis(1000);
    config.replica_acks = 1;
    config.replica_ack_timeout = Duration::from_millis(300);
    let url = format!("redis://127.0.0.1:{relay_port}/");
    let pool = RedisPool::with_options(&url, &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies("ack", 10))
        .await
        .unwrap();
    let me = "127.0.0.1:1";
    let warm = extract_as(&app, r#"{"count":1}"#, &[], me).await;
    assert_eq!(warm.status, 200, "{}", warm.body);

    // The replica sleeps: a PING to it gets no answer.
    let sleeper = {
        let url = replica.url();
        tokio::spawn(async move {
            let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
            let mut conn = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap();
            let _: Result<(), _> = redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(3)
                .query_async(&mut conn)
                .await;
        })
    };
    until("the replica sleeps", || {
        let url = replica.url();
        async move {
            let config = redis::AsyncConnectionConfig::new()
                .set_response_timeout(Some(Duration::from_millis(100)));
            let Ok(mut conn) = redis::Client::open(url)
                .unwrap()
                .get_multiplexed_async_connection_with_config(&config)
                .await
            else {
                return true;
            };
            redis::cmd("PING")
                .query_async::<String>(&mut conn)
                .await
                .is_err()
        }
    })
    .await;

    let armed = fault(&relay);
    let r = extract_as(
        &app,
        r#"{"count":2}"#,
        &[("idempotency-key", "ack-socket-0001")],
        me,
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (503, "SERVICE_UNAVAILABLE"),
        "{}",
        r.body
    );
    carried_out(armed).await;
    sleeper.await.unwrap();
}

/// Cluster mode: the connection closes right after the extraction's reply,
/// so its `WAIT` finds the socket dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_acknowledgement_needs_the_extractions_socket() {
    acknowledgement_drill(|relay| relay.close_after_reply_to(b"FCALL")).await;
}

/// Cluster mode: the `WAIT` reaches the master but its connection drops
/// before the answer. Sending that `WAIT` again on a new connection would
/// get the sleeping replica counted at once, and a 200 for a write no
/// replica holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wait_cut_short_is_not_sent_again() {
    acknowledgement_drill(|relay| relay.lose_reply_to(b"WAIT")).await;
}

/// A reconnect between an extraction and its `WAIT` must never confirm it
/// (the shared-connection design before the lanes failed this within a few
/// rounds). The replica is linked and online, but a relay holds everything
/// the primary sends it, so no true acknowledgement can come and every
/// answer must be 503. Each round,
/// 16 extractions run at once and the service's connection closes right
/// after one of their replies: the requests still in flight fail, and the
/// client reconnects while the answered ones are about to send their
/// `WAIT`. A `WAIT` sent on the new socket has no writes to wait for, so
/// it would count the held replica at once and the answer would be 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_between_an_extraction_and_its_wait_confirms_nothing() {
    const ROUNDS: usize = 40;
    const CONCURRENT: usize = 16;
    let primary = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let feed = Relay::start(([127, 0, 0, 1], primary.port()).into())
        .await
        .unwrap();
    let replica = acknowledging_replica(&primary, feed.port()).await;
    feed.set_delay(Duration::from_secs(3600));

    let service = Relay::start(([127, 0, 0, 1], primary.port()).into())
        .await
        .unwrap();
    let mut config = test_config();
    config.redis_timeout = Duration::from_millis(1000);
    config.replica_acks = 1;
    config.replica_ack_timeout = Duration::from_millis(50);
    let url = format!("redis://127.0.0.1:{}/", service.port());
    let pool = RedisPool::with_options(&url, &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies("race", ROUNDS * CONCURRENT))
        .await
        .unwrap();
    for round in 0..ROUNDS {
        let armed = service.close_after_reply_to(b"FCALL");
        let requests: Vec<_> = (0..CONCURRENT)
            .map(|i| {
                let app = std::sync::Arc::clone(&app);
                tokio::spawn(async move {
                    let key = format!("race-{round:03}-{i:02}");
                    extract_as(
                        &app,
                        r#"{"count":1}"#,
                        &[("idempotency-key", &key)],
                        "127.0.0.1:1",
                    )
                    .await
                })
            })
            .collect();
        for request in requests {
            let r = request.await.unwrap();
            assert_ne!(
                r.status, 200,
                "round {round}: a 200 confirmed by a WAIT that covered none of its writes"
            );
        }
        // Every round cut a connection after a reply, or it proved nothing.
        carried_out(armed).await;
    }
    drop(replica);
}
