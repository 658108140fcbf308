//! Redis faults: many clients extracting while Redis is killed and
//! restarted, blocked (`DEBUG SLEEP`), paused (`CLIENT PAUSE`), loses its
//! scripts (`SCRIPT FLUSH`) and hits `maxmemory`; response timeouts; and a
//! reply lost after the script committed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Harness, Reply, extract_request, proxies, send};
use proxy_pool::distribution::App;
use proxy_pool::pool::{PoolContract, RedisPool, keys};
use proxy_pool::security::{PeerAddr, Rate, RegistryHandle};
use redis::aio::MultiplexedConnection;

/// `PROXY_POOL_REDIS_TIMEOUT_MS` for these tests.
const TIMEOUT: Duration = Duration::from_millis(400);
/// Without rate limits a request makes one Redis call (the extraction
/// script, with its PING and NOSCRIPT reload), bounded by [`TIMEOUT`]; the
/// rest is scheduling slack on a busy 2-core machine.
const REQUEST_BOUND: Duration = Duration::from_millis(400 + 800);
/// Attempts of a client with an `Idempotency-Key` (a 503 is retried).
const ATTEMPTS: usize = 12;
/// Concurrent clients in the fault test.
const WORKERS: usize = 16;
/// Proxies per load into the pool.
const LOAD: usize = 2000;

/// Everything the clients saw, for the invariants.
#[derive(Default)]
struct Ledger {
    requests: usize,
    ok: usize,
    unavailable: usize,
    replayed: usize,
    handed_out: usize,
    duplicates: Vec<String>,
    unexpected: Vec<String>,
    slowest: Duration,
    /// Proxy id -> the request (its Idempotency-Key, or a unique id) that got it.
    owner: HashMap<String, String>,
    /// Idempotency-Key -> the proxies of its 200.
    by_key: HashMap<String, Vec<String>>,
}

impl Ledger {
    fn record(&mut self, r: &Reply, key: Option<&str>, uid: &str, elapsed: Duration) {
        self.requests += 1;
        self.slowest = self.slowest.max(elapsed);
        match r.status {
            200 => {
                self.ok += 1;
                let ids = r.ids();
                let replayed = r.header("idempotent-replayed") == Some("true");
                if replayed {
                    self.replayed += 1;
                }
                let owner = key.unwrap_or(uid).to_owned();
                if let Some(k) = key {
                    if let Some(first) = self.by_key.get(k) {
                        if !replayed || *first != ids {
                            self.unexpected.push(format!(
                                "key {k}: a second answer that is not a replay of the first"
                            ));
                        }
                        return;
                    }
                    self.by_key.insert(k.to_owned(), ids.clone());
                }
                for id in ids {
                    self.handed_out += 1;
                    if let Some(other) = self.owner.insert(id.clone(), owner.clone())
                        && other != owner
                    {
                        self.duplicates.push(id);
                    }
                }
            }
            503 if r.code() == "SERVICE_UNAVAILABLE" => self.unavailable += 1,
            status => self
                .unexpected
                .push(format!("status {status} code {}", r.code())),
        }
    }
}

/// One client: extracts 1..4 proxies at a time until told to stop; even
/// clients send an `Idempotency-Key` and retry a 503 with it (bounded).
async fn client(app: Arc<App>, n: usize, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let peer = PeerAddr(format!("127.0.1.{}:5000", n + 1).parse().unwrap());
    let mut seq = 0usize;
    while !stop.load(Ordering::Relaxed) {
        seq += 1;
        let body = format!(r#"{{"count":{}}}"#, 1 + seq % 4);
        let key = n.is_multiple_of(2).then(|| format!("fault-{n}-{seq:06}"));
        let uid = format!("anon-{n}-{seq}");
        for _attempt in 0..ATTEMPTS {
            let headers: Vec<(&str, &str)> = key
                .as_deref()
                .map(|k| vec![("idempotency-key", k)])
                .unwrap_or_default();
            let mut req = extract_request(&body, &headers);
            req.extensions_mut().insert(peer);
            let started = Instant::now();
            let r = tokio::time::timeout(REQUEST_BOUND * 3, send(&app, req))
                .await
                .expect("a request hung far past the Redis timeout");
            let elapsed = started.elapsed();
            ledger
                .lock()
                .unwrap()
                .record(&r, key.as_deref(), &uid, elapsed);
            if r.status != 503 || key.is_none() || stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
        // Pacing, so the pool is not drained in the first second.
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}

/// Waits (bounded) until the app's own pool answers again.
async fn recovered(pool: &RedisPool) -> Duration {
    let started = Instant::now();
    while pool.ping().await.is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the pool did not recover by itself"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// The given proxies are out of the allocatable index and tombstoned: their
/// details (address, credentials) gone from Redis.
async fn assert_removed(conn: &mut MultiplexedConnection, ids: &[String]) {
    let index: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys::INDEX)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await
        .unwrap();
    let indexed: HashSet<&str> = index.iter().filter_map(|m| m.rsplit('|').next()).collect();
    for chunk in ids.chunks(500) {
        let (records, due): (Vec<Option<String>>, Vec<Option<f64>>) = redis::pipe()
            .cmd("HMGET")
            .arg(keys::RECORDS)
            .arg(chunk)
            .cmd("ZMSCORE")
            .arg(keys::DUE)
            .arg(chunk)
            .query_async(conn)
            .await
            .unwrap();
        for ((id, record), score) in chunk.iter().zip(records).zip(due) {
            assert!(
                !indexed.contains(id.as_str()),
                "{id} answered but still allocatable"
            );
            assert!(record.is_none(), "{id} answered but its details remain");
            assert!(
                score.is_some_and(|s| s >= 1e13),
                "{id} answered but not a tombstone (due {score:?})"
            );
        }
    }
}

async fn command(conn: &mut MultiplexedConnection, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(conn).await.unwrap();
}

/// The fault test: 16 clients extract continuously from a pool of a few
/// thousand proxies while Redis is blocked, paused (all and writes),
/// loses its scripts, hits maxmemory, and is killed and restarted. No
/// proxy is handed out twice, every 200's proxies are really gone from the
/// pool, every failure is a 503 problem within the timeout bound, and the
/// service resumes by itself after each fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invariants_hold_under_redis_faults() {
    let mut h = Harness::with_redis_args(
        &["--enable-debug-command", "local"],
        // No rate limits: every fault meets the extraction script itself
        // (the limiter's own timeout is proven below).
        |c| c.redis_timeout = TIMEOUT,
        RegistryHandle::default(),
    )
    .await;
    h.load(&proxies("gen0-a", LOAD)).await;
    let mut admin = h.admin().await;

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let workers: Vec<_> = (0..WORKERS)
        .map(|n| tokio::spawn(client(h.app.clone(), n, stop.clone(), ledger.clone())))
        .collect();
    let run = |d: u64| tokio::time::sleep(Duration::from_millis(d));
    let loads = AtomicUsize::new(0);
    let refill = |h: &Harness| {
        let n = loads.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("load{n}");
        let pool = h.pool.clone();
        async move {
            PoolContract::new(&pool)
                .upsert(&proxies(&prefix, LOAD))
                .await
                .unwrap();
        }
    };
    let mut recovery = Vec::new();

    run(1000).await;
    // Redis blocked for longer than the timeout: requests give up at it.
    command(&mut admin, &["DEBUG", "SLEEP", "1.2"]).await;
    recovery.push(("DEBUG SLEEP", recovered(&h.pool).await));
    refill(&h).await;
    run(500).await;

    // Every client paused, then only writers (as a failover does); each
    // pause lasts its 1.2 s and ends by itself.
    for (mode, name) in [("ALL", "CLIENT PAUSE ALL"), ("WRITE", "CLIENT PAUSE WRITE")] {
        command(&mut admin, &["CLIENT", "PAUSE", "1200", mode]).await;
        run(1200).await;
        recovery.push((name, recovered(&h.pool).await));
        run(500).await;
    }

    // Scripts flushed (as after a restart or failover): reloaded transparently.
    command(&mut admin, &["SCRIPT", "FLUSH"]).await;
    run(500).await;

    // Out of memory: scripts are refused before they run.
    command(&mut admin, &["CONFIG", "SET", "maxmemory", "1"]).await;
    run(800).await;
    command(&mut admin, &["CONFIG", "SET", "maxmemory", "0"]).await;
    recovery.push(("maxmemory", recovered(&h.pool).await));
    refill(&h).await;
    run(500).await;

    // Everything answered so far is really out of the pool, before the
    // restart wipes it.
    let answered: Vec<String> = ledger.lock().unwrap().owner.keys().cloned().collect();
    assert_removed(&mut admin, &answered).await;

    // Killed and restarted empty (no persistence): reloaded with new ids.
    h.redis.stop().await;
    run(700).await;
    h.redis.restart().await.unwrap();
    recovery.push(("kill and restart", recovered(&h.pool).await));
    refill(&h).await;
    run(1500).await;

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }

    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    eprintln!(
        "fault test: {} requests, {} 200s ({} replayed), {} 503s, {} proxies handed out, {} duplicates, slowest {:?}, recovery {:?}",
        ledger.requests,
        ledger.ok,
        ledger.replayed,
        ledger.unavailable,
        ledger.handed_out,
        ledger.duplicates.len(),
        ledger.slowest,
        recovery
    );
    assert!(
        ledger.duplicates.is_empty(),
        "handed out twice: {:?}",
        ledger.duplicates
    );
    assert!(
        ledger.unexpected.is_empty(),
        "unexpected answers: {:?}",
        ledger.unexpected
    );
    assert!(
        ledger.slowest <= REQUEST_BOUND,
        "a request took {:?}",
        ledger.slowest
    );
    assert!(ledger.unavailable > 0, "the faults never bit");
    // Service resumed by itself: a fresh request gets fresh proxies.
    h.load(&proxies("final", 3)).await;
    let last = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(
        (last.status, last.ids()),
        (200, vec!["final-0000".to_owned()])
    );
    assert!(
        ledger.handed_out > LOAD,
        "too little was extracted to mean much"
    );
    // The restarted Redis holds the later loads: everything answered from
    // them is out of its pool too.
    let mut conn = h.redis().await;
    let ids: Vec<String> = ledger.owner.keys().cloned().collect();
    let live: Vec<String> = {
        // Known to it: a record or a tombstone, each a `due` member.
        let present: Vec<Option<f64>> = redis::cmd("ZMSCORE")
            .arg(keys::DUE)
            .arg(&ids)
            .query_async(&mut conn)
            .await
            .unwrap();
        ids.iter()
            .zip(present)
            .filter(|(_, p)| p.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    };
    assert!(!live.is_empty());
    assert_removed(&mut conn, &live).await;
}

/// Every Redis call is bounded by `PROXY_POOL_REDIS_TIMEOUT_MS`: a Redis
/// that accepts connections but never answers gives 503 problems on
/// extraction (rate limiter and script) and readiness, within the bound.
#[tokio::test]
async fn a_silent_redis_is_503_within_the_timeout() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    let timeout = Duration::from_millis(300);
    for limited in [false, true] {
        let mut config = common::test_config();
        config.redis_timeout = timeout;
        if limited {
            config.client_rate = Some(Rate {
                per_second: 10.0,
                burst: 10,
            });
        }
        let pool = RedisPool::new(&format!("redis://{addr}/"), timeout).unwrap();
        let app = common::app_over(&config, pool);
        for req in [
            extract_request(r#"{"count":1}"#, &[("idempotency-key", "silent-0001")]),
            lambda_http::http::Request::get("/health/ready")
                .body(lambda_http::Body::Empty)
                .unwrap(),
        ] {
            let started = Instant::now();
            let r = send(&app, req).await;
            let elapsed = started.elapsed();
            assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
            assert!(
                elapsed < 2 * timeout + Duration::from_millis(500),
                "{elapsed:?}"
            );
        }
    }
    held.abort();
}

/// A reply lost after the script committed: Redis is busy, the client gives
/// up at its timeout (503), then Redis runs the queued script and commits.
/// The retry with the same `Idempotency-Key` gets the committed result,
/// marked replayed, and nothing more leaves the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_recovered_with_the_same_key() {
    let timeout = Duration::from_millis(300);
    let h = Harness::with_redis_args(
        &["--enable-debug-command", "local"],
        |c| c.redis_timeout = timeout,
        RegistryHandle::default(),
    )
    .await;
    h.load(&proxies("lost", 5)).await;
    // Readiness loads the library, so the queued FCALL will find it.
    assert_eq!(h.get("/health/ready").await.status, 200);
    let mut blocker = h.admin().await;
    let mut probe = h.redis().await;
    let mut conn = h.redis().await;
    let sleeping = tokio::spawn(async move {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg("1.5")
            .query_async::<()>(&mut blocker)
            .await
    });
    // Bounded polling until Redis is seen busy (a PING goes unanswered).
    let started = Instant::now();
    loop {
        let pong = tokio::time::timeout(
            Duration::from_millis(100),
            redis::cmd("PING").query_async::<String>(&mut probe),
        )
        .await;
        if pong.is_err() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "DEBUG SLEEP never began"
        );
    }

    let key = [("idempotency-key", "lost-reply-0001")];
    let started = Instant::now();
    let first = h.extract(r#"{"count":2}"#, &key).await;
    assert_eq!((first.status, first.code()), (503, "SERVICE_UNAVAILABLE"));
    assert!(started.elapsed() < timeout + Duration::from_millis(500));

    sleeping.await.unwrap().unwrap();
    // The script was sent and runs once Redis wakes: its record appears.
    let record = keys::idempotency("ip:127.0.0.1", "lost-reply-0001");
    let started = Instant::now();
    while !redis::cmd("HEXISTS")
        .arg(keys::IDEMPOTENCY)
        .arg(&record)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the script never committed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let committed = h.snapshot().await;

    let retry = h.extract(r#"{"count":2}"#, &key).await;
    assert_eq!(retry.status, 200);
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(retry.ids(), ["lost-0000", "lost-0001"]);
    assert_eq!(
        h.snapshot().await,
        committed,
        "the retry extracted nothing more"
    );
    assert_removed(&mut conn, &retry.ids()).await;
}
