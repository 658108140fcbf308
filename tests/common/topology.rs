//! Redis topologies of several servers, which the deployment test files
//! (`deployments`, `functions`, `replicas`, `drills`) build alike: a
//! 3-master Cluster and a replica joined to it, a replica acknowledging a
//! single server; and how those files reach them, count their commands and
//! wait on them.

use std::time::{Duration, Instant};

use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{PoolContract, RedisPool, keys};
use redis::aio::MultiplexedConnection;

use crate::common::{self, Reply, app_over, proxies, test_config};

/// A multiplexed connection to the Redis at `url`.
pub async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Runs the command `args` (`INFO`, `CONFIG SET`, `CLUSTER MYID`, ...) and
/// returns its answer as text.
pub async fn info(conn: &mut MultiplexedConnection, args: &[&str]) -> String {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn).await.unwrap()
}

/// Bounded polling until `check` holds: only for a state another process
/// reaches in its own time with no event to wait on (cluster gossip, a
/// replica's sync); never after a relay or a fault, which report theirs.
pub async fn until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) {
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: timed out"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The readiness answer of `app`.
pub async fn ready(app: &App) -> Reply {
    common::get(app, "/health/ready").await
}

/// Three masters made into one cluster by `redis-cli --cluster create`;
/// each keeps its node table in its own private working directory.
pub async fn start_cluster() -> Vec<RedisServer> {
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(cluster_node().await);
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

/// The `{pp}` slot's master in a cluster: its port, from `CLUSTER SLOTS`.
pub async fn slot_owner_port(conn: &mut MultiplexedConnection) -> u16 {
    tag_owner_port(conn, keys::HASH_TAG).await
}

/// The master owning the slot of hash tag `tag`: its port, from `CLUSTER SLOTS`.
pub async fn tag_owner_port(conn: &mut MultiplexedConnection, tag: &str) -> u16 {
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
pub async fn every_node_names<'a>(nodes: impl IntoIterator<Item = &'a RedisServer>, port: u16) {
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
pub async fn cluster_pool(
    nodes: &[RedisServer],
    prefix: &str,
    n: usize,
) -> (RedisPool, std::sync::Arc<App>) {
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    let mut config = test_config();
    config.redis_cluster = true;
    loaded_pool(&urls.join(","), &config, prefix, n).await
}

/// A pool over `url` under `config`, its handler, and `n` proxies named
/// `prefix` loaded.
pub async fn loaded_pool(
    url: &str,
    config: &Config,
    prefix: &str,
    n: usize,
) -> (RedisPool, std::sync::Arc<App>) {
    let pool = RedisPool::with_options(url, &config.redis_options()).unwrap();
    let app = app_over(config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies(prefix, n))
        .await
        .unwrap();
    (pool, app)
}

/// Redis's calls per command on the server at `url` (`INFO commandstats`:
/// `fcall`, `evalsha`, `function|load`, ...).
pub async fn calls_on(url: &str) -> std::collections::BTreeMap<String, u64> {
    common::command_calls(&info(&mut connect(url).await, &["INFO", "commandstats"]).await)
}

/// The calls of `command` in `calls`, none if Redis has not listed it.
pub fn calls_of(calls: &std::collections::BTreeMap<String, u64>, command: &str) -> u64 {
    calls.get(command).copied().unwrap_or(0)
}

/// Starts a node for a cluster (its own bus port and node table), `DEBUG`
/// allowed from loopback.
pub async fn cluster_node() -> RedisServer {
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
pub async fn cluster_replica_of(owner: &RedisServer) -> RedisServer {
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

/// A replica of `primary` fed from `port` (the primary's own, or a relay's
/// in front of it), once `primary` counts its acknowledgements.
pub async fn acknowledging_replica(primary: &RedisServer, port: u16) -> RedisServer {
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
