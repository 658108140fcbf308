//! A primary lost with the last moments of its replication: what
//! `PROXY_POOL_REPLICA_ACKS` promises. Loopback only, bounded in time.
//!
//! A primary with two replicas, each fed through a relay that holds
//! replication for [`LAG`] (and loses what it holds when the primary dies,
//! as with a host loss); the service reaches the primary through a relay
//! that is switched to the promoted replica (the most advanced one, as
//! Sentinel and ElastiCache choose). Sixteen clients extract continuously,
//! each retrying a 503 with the same `Idempotency-Key`; every 200 is kept.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{app_over, extract_as, proxies, test_config};
use proxy_pool::distribution::App;
use proxy_pool::local::{RedisServer, Relay};
use proxy_pool::pool::{PoolContract, RedisPool};
use redis::aio::MultiplexedConnection;
use tokio::sync::watch;

/// Replication delay between the primary and each replica.
const LAG: Duration = Duration::from_millis(100);
/// Concurrent clients.
const CLIENTS: usize = 16;
/// Answers collected before the primary is killed, and again after.
const ANSWERS_PER_PHASE: usize = 150;
/// How long a client keeps retrying one request after 503s.
const RETRY_FOR: Duration = Duration::from_secs(8);

/// Proxies in the pool: 4,000, or `PROXY_POOL_DRILL_POOL` to time the
/// outage at a production-sized pool (docs/guarantees.md, the failover
/// drill; run it with `--release -- --nocapture`).
fn pool_size() -> usize {
    std::env::var("PROXY_POOL_DRILL_POOL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000)
}

/// A field of the server's `INFO` text.
fn info_field<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or("?")
        .trim()
}

async fn connect(port: u16) -> MultiplexedConnection {
    redis::Client::open(format!("redis://127.0.0.1:{port}/"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn command(port: u16, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: redis::Value = cmd.query_async(&mut connect(port).await).await.unwrap();
    match value {
        redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => format!("{other:?}"),
    }
}

/// Bounded polling until `check` holds: only for what the Redis servers
/// reach in their own time with no event to wait on (a replica's sync).
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: timed out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every 200: the request (its key) and the proxies it got.
struct Ledger {
    answers: Vec<(String, Vec<String>)>,
    refused: usize,
    /// How many answers there are, for [`answers_reach`].
    count: watch::Sender<usize>,
}

impl Ledger {
    fn new() -> Self {
        Self {
            answers: Vec::new(),
            refused: 0,
            count: watch::channel(0).0,
        }
    }

    fn answer(&mut self, key: String, ids: Vec<String>) {
        self.answers.push((key, ids));
        self.count.send_replace(self.answers.len());
    }
}

/// Waits for the clients' `n`th answer: woken by the answer itself. The
/// bound only turns a hang into a failure.
async fn answers_reach(count: &mut watch::Receiver<usize>, n: usize, what: &str) {
    let reached = tokio::time::timeout(Duration::from_secs(30), count.wait_for(|a| *a >= n)).await;
    assert!(matches!(reached, Ok(Ok(_))), "{what}: timed out");
}

/// One client: keyed requests of 1..3 proxies until told to stop, each
/// retried with its key while the answer is 503 (bounded).
async fn client(app: Arc<App>, n: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let mut seq = 0;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let key = format!("failover-{n:02}-{seq:06}");
        let body = format!(r#"{{"count":{}}}"#, 1 + (n + seq) % 3);
        let started = Instant::now();
        loop {
            let r = extract_as(&app, &body, &[("idempotency-key", &key)], "127.0.0.1:1").await;
            match r.status {
                200 => {
                    ledger.lock().unwrap().answer(key.clone(), r.ids());
                    break;
                }
                503 | 409 if started.elapsed() < RETRY_FOR => {
                    // The client's own back-off before it retries.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                503 | 409 => {
                    ledger.lock().unwrap().refused += 1;
                    break;
                }
                other => panic!("unexpected {other}: {}", r.body),
            }
        }
    }
}

/// Proxies handed to more than one request.
fn duplicates(ledger: &Ledger) -> usize {
    let mut holders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (key, ids) in &ledger.answers {
        for id in ids {
            holders.entry(id).or_default().insert(key);
        }
    }
    holders.values().filter(|keys| keys.len() > 1).count()
}

/// Runs the drill with `acks` replica acknowledgements; returns the
/// duplicates found and the answers collected (and prints how long after
/// the promotion the first 200 came).
async fn drill(acks: u32) -> (usize, usize) {
    let mut primary = RedisServer::start()
        .await
        .expect("redis-server must be installed for the tests");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let lag = Relay::start(([127, 0, 0, 1], primary.port()).into())
            .await
            .unwrap();
        lag.set_delay(LAG);
        let port = lag.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])
            .await
            .unwrap();
        replicas.push((replica, lag));
    }
    let primary_port = primary.port();
    let primary_url = primary.url();
    until("both replicas acknowledge", || {
        common::replicas_acknowledge(&primary_url, "replication-probe", 2)
    })
    .await;

    let service = Relay::start(([127, 0, 0, 1], primary_port).into())
        .await
        .unwrap();
    let mut config = test_config();
    config.redis_timeout = Duration::from_millis(1000);
    config.replica_acks = acks;
    config.replica_ack_timeout = Duration::from_millis(500);
    let url = format!("redis://127.0.0.1:{}/", service.port());
    let pool = RedisPool::with_options(&url, &config.redis_options()).unwrap();
    let app = app_over(&config, pool);
    // The pool is loaded straight into the primary, with a set-up's
    // patience: under load, a big upsert can outlast the 1 s the service's
    // own calls are bounded by, and that bound is not what the drill tests.
    PoolContract::new(&RedisPool::new(&primary_url, Duration::from_secs(60)).unwrap())
        .upsert(&proxies("fo", pool_size()))
        .await
        .unwrap();
    // Steady state before the clients start: both replicas hold the pool
    // (with a large pool, its replication takes a while through the lag).
    until("both replicas hold the pool", || {
        common::replicas_acknowledge(&primary_url, "replication-probe", 2)
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::new()));
    let mut count = ledger.lock().unwrap().count.subscribe();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(app.clone(), n, stop.clone(), ledger.clone())))
        .collect();
    answers_reach(&mut count, ANSWERS_PER_PHASE, "answers before the failover").await;

    // The primary's host is lost: whatever replication the relays still
    // held is gone, and the process dies. The links are cut first: reaping
    // a primary with a large pool takes a while (its memory is freed
    // first), and meanwhile the relays would deliver what they held. Each
    // relay now leads nowhere (a replica reconnecting during the reaping
    // would resync from the dying primary), and the offsets are read only
    // once every link through the relays has closed.
    for (_, lag) in &replicas {
        lag.set_target(([127, 0, 0, 1], 1).into());
        lag.cut().done().await;
    }
    primary.stop().await;
    let mut offsets = Vec::new();
    for (replica, _) in &replicas {
        let text = command(replica.port(), &["INFO", "replication"]).await;
        let offset: i64 = info_field(&text, "slave_repl_offset").parse().unwrap_or(0);
        offsets.push(offset);
    }
    let (promoted, other) = if offsets[0] >= offsets[1] {
        (0, 1)
    } else {
        (1, 0)
    };
    let new_primary = replicas[promoted].0.port();
    command(new_primary, &["REPLICAOF", "NO", "ONE"]).await;
    let new_primary_text = new_primary.to_string();
    command(
        replicas[other].0.port(),
        &["REPLICAOF", "127.0.0.1", &new_primary_text],
    )
    .await;
    service.set_target(([127, 0, 0, 1], new_primary).into());
    service.cut().done().await;
    let before = *count.borrow_and_update();
    let failed_over = Instant::now();
    answers_reach(&mut count, before + 1, "a first answer after the failover").await;
    let outage = failed_over.elapsed();
    answers_reach(
        &mut count,
        before + ANSWERS_PER_PHASE,
        "answers after the failover",
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let stats = command(new_primary, &["INFO", "stats"]).await;
    let ledger = ledger.lock().unwrap();
    eprintln!(
        "acks={acks}, {} proxies: first 200 {} ms after the promotion (replica resyncs: {} full, \
         {} partial); {} answers, {} requests given up",
        pool_size(),
        outage.as_millis(),
        info_field(&stats, "sync_full"),
        info_field(&stats, "sync_partial_ok"),
        ledger.answers.len(),
        ledger.refused
    );
    (duplicates(&ledger), ledger.answers.len())
}

/// Without replica acks, the failover hands out again proxies whose
/// extraction was answered but never reached a replica: the drill can see
/// the failure it guards against.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_acks_a_failover_hands_proxies_out_twice() {
    let (duplicated, answers) = drill(0).await;
    eprintln!("without acks: {duplicated} proxies in two 200s, of {answers} answers");
    assert!(
        duplicated > 0,
        "no duplicate in {answers} answers: the drill lost nothing"
    );
}

/// With `PROXY_POOL_REPLICA_ACKS=1`, two replicas, and the most advanced
/// one promoted: no proxy is ever in two 200s, across the failover and the
/// clients' retries with their keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_acks_a_failover_never_hands_a_proxy_out_twice() {
    let (duplicated, answers) = drill(1).await;
    assert_eq!(duplicated, 0, "duplicates in {answers} answers");
}
