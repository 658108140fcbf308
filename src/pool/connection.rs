//! The connection behind [`super::RedisPool`]: one self-healing connection to
//! a single Redis (a primary endpoint: ElastiCache with cluster mode off,
//! Valkey, a plain `redis-server`), or a Redis Cluster client that routes
//! every command by its first key. All keys of a pool share its hash tag
//! (`{<pool name>}`, `{pp}` by default), so in a cluster every script and
//! its `WAIT` go to the one primary that owns that slot. Either way the rest of the code sees one
//! [`redis::aio::ConnectionLike`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    AsyncConnectionConfig, Cmd, ConnectionAddr, ErrorKind, FromRedisValue, Pipeline, RedisError,
    RedisFuture, RedisResult, ServerErrorKind, TlsCertificates, Value,
};
use tokio::sync::OnceCell;

use super::error::PoolError;
use super::keys::PoolName;
use super::policy::PoolPolicy;

/// How to reach Redis: everything [`super::RedisPool`] needs besides the URL.
#[derive(Debug, Clone, PartialEq)]
pub struct RedisOptions {
    /// Bound on every Redis call, reconnects included.
    pub timeout: Duration,
    /// The URL names Redis Cluster seed nodes (comma-separated) rather than
    /// one server.
    pub cluster: bool,
    /// Run the scripts as Redis Functions (`false`: by `EVALSHA`).
    pub functions: bool,
    /// PEM file of the CA that signs the server's certificate (`rediss://`);
    /// `None` trusts the system's roots (enough for ElastiCache, whose
    /// certificates chain to Amazon's public CA).
    pub ca_file: Option<PathBuf>,
    /// Replicas that must acknowledge an extraction (`WAIT`) before it is
    /// answered; 0 answers as soon as the primary committed.
    pub replica_acks: u32,
    /// How long `WAIT` may wait for them.
    pub replica_ack_timeout: Duration,
    /// The pool policy this deployment runs under; every script checks it
    /// against the one the pool records.
    pub policy: PoolPolicy,
    /// The pool's name: its keys' hash tag, so pools of different names
    /// share one Redis (Cluster) without sharing a key.
    pub pool: PoolName,
}

impl RedisOptions {
    /// A single server, no replica acknowledgement, system roots, the
    /// default pool policy and name.
    pub fn single(timeout: Duration) -> Self {
        Self {
            timeout,
            cluster: false,
            functions: true,
            ca_file: None,
            replica_acks: 0,
            replica_ack_timeout: Duration::ZERO,
            policy: PoolPolicy::default(),
            pool: PoolName::default(),
        }
    }
}

/// A cheap-to-clone handle on the pool's connection (single or cluster).
#[derive(Clone)]
pub struct PoolConnection {
    inner: Inner,
}

#[derive(Clone)]
enum Inner {
    Single(ConnectionManager),
    Cluster(Arc<LazyCluster>),
    /// One socket to the primary that owns the pool's slot, never replaced behind
    /// the caller's back: a lane for a batch and its `WAIT` (see
    /// `acknowledger`).
    Direct(MultiplexedConnection),
}

/// Opens [`PoolConnection`]s of one socket each to the primary that owns
/// the pool's slot (the server itself, or in a cluster the master owning
/// its hash tag).
#[derive(Clone)]
pub(crate) struct DirectOpener {
    /// The server, or in a cluster a seed node whose settings (credentials,
    /// TLS) the owner's connection reuses.
    client: redis::Client,
    /// In a cluster: where to ask who owns the pool's hash tag.
    cluster: Option<Arc<LazyCluster>>,
    timeout: Duration,
}

impl DirectOpener {
    /// A fresh connection of its own.
    pub(crate) async fn open(&self) -> RedisResult<PoolConnection> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let client = match &self.cluster {
            None => self.client.clone(),
            Some(lazy) => {
                let (host, port) = slot_owner(&mut lazy.get().await?, &lazy.hash_tag).await?;
                let info = self.client.get_connection_info().clone();
                let addr = match info.addr().clone() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host,
                        port,
                        insecure,
                        tls_params,
                    },
                    _ => ConnectionAddr::Tcp(host, port),
                };
                redis::Client::open(info.set_addr(addr))?
            }
        };
        let conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        Ok(PoolConnection {
            inner: Inner::Direct(conn),
        })
    }
}

/// The host and port of the master owning the slot of `hash_tag` (the
/// pool's), from `CLUSTER SLOTS`.
async fn slot_owner(conn: &mut ClusterConnection, hash_tag: &str) -> RedisResult<(String, u16)> {
    let slot: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(hash_tag)
        .query_async(conn)
        .await?;
    let ranges: Vec<Vec<Value>> = redis::cmd("CLUSTER").arg("SLOTS").query_async(conn).await?;
    for range in ranges {
        let (Some(start), Some(end), Some(master)) = (range.first(), range.get(1), range.get(2))
        else {
            continue;
        };
        let (start, end) = (
            i64::from_redis_value_ref(start)?,
            i64::from_redis_value_ref(end)?,
        );
        if (start..=end).contains(&slot) {
            let master: Vec<Value> = FromRedisValue::from_redis_value_ref(master)?;
            if let (Some(host), Some(port)) = (master.first(), master.get(1)) {
                return Ok((
                    String::from_redis_value_ref(host)?,
                    u16::from_redis_value_ref(port)?,
                ));
            }
        }
    }
    Err(RedisError::from((
        ErrorKind::Server(ServerErrorKind::ClusterDown),
        "no master owns the pool's slot",
    )))
}

/// A cluster connection made on first use, so a cold start succeeds while
/// the cluster is down; once made, it follows the topology by itself.
struct LazyCluster {
    client: ClusterClient,
    conn: OnceCell<ClusterConnection>,
    /// The pool's hash tag: where a command with no key is sent.
    hash_tag: String,
}

impl LazyCluster {
    async fn get(&self) -> RedisResult<ClusterConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
}

impl PoolConnection {
    /// Opens (lazily) the connection `url` and `options` describe, and the
    /// opener of direct connections to the same primary.
    pub(crate) fn open(
        url: &str,
        options: &RedisOptions,
    ) -> Result<(Self, DirectOpener), PoolError> {
        let certificates = match &options.ca_file {
            None => None,
            Some(path) => Some(TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(path).map_err(|_| {
                    PoolError::Internal("PROXY_POOL_REDIS_CA_FILE cannot be read".into())
                })?),
            }),
        };
        if options.cluster {
            let nodes: Vec<&str> = url
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            let seed = nodes.first().copied().unwrap_or_default();
            let mut builder = ClusterClientBuilder::new(nodes)
                .connection_timeout(options.timeout)
                .response_timeout(options.timeout)
                // No resend inside the client: after a dropped connection
                // it would run an extraction a second time. The adapter
                // repeats only what is safe to repeat (`RedisPool::call`).
                .retries(0);
            if let Some(certs) = certificates.clone() {
                builder = builder.certs(certs);
            }
            let client = builder
                .build()
                .map_err(|_| PoolError::Internal("invalid Redis Cluster URL".into()))?;
            let lazy = Arc::new(LazyCluster {
                client,
                conn: OnceCell::new(),
                hash_tag: options.pool.hash_tag(),
            });
            let opener = DirectOpener {
                client: single_client(seed, certificates)?,
                cluster: Some(Arc::clone(&lazy)),
                timeout: options.timeout,
            };
            return Ok((
                Self {
                    inner: Inner::Cluster(lazy),
                },
                opener,
            ));
        }
        let client = single_client(url, certificates)?;
        let opener = DirectOpener {
            client: client.clone(),
            cluster: None,
            timeout: options.timeout,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.timeout))
            .set_response_timeout(Some(options.timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok((
            Self {
                inner: Inner::Single(conn),
            },
            opener,
        ))
    }

    /// `true` for a Redis Cluster connection.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner, Inner::Cluster(_))
    }
}

/// A connection the scripts run on. It also sends a command with no key
/// (the function library's load) to where the pool's keys live: in a
/// Cluster, the master owning the pool's hash tag only (redis-rs would send it to every
/// master, and fail it while any of them is down).
pub(crate) trait ScriptConnection: ConnectionLike + Send {
    /// Sends `cmd` to the server holding the pool.
    fn send_to_pool_node<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.req_packed_command(cmd)
    }
}

impl ScriptConnection for PoolConnection {
    fn send_to_pool_node<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let Inner::Cluster(lazy) = &self.inner else {
            return self.req_packed_command(cmd);
        };
        let lazy = Arc::clone(lazy);
        Box::pin(async move {
            let route = Route::with_key(lazy.hash_tag.as_bytes(), SlotAddr::Master);
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
            lazy.get().await?.route_command(cmd.clone(), routing).await
        })
    }
}

impl ConnectionLike for PoolConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_command(cmd),
            Inner::Direct(conn) => conn.req_packed_command(cmd),
            Inner::Cluster(lazy) => Box::pin(async move {
                let mut conn = lazy.get().await?;
                conn.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Inner::Direct(conn) => conn.req_packed_commands(pipeline, offset, count),
            Inner::Cluster(lazy) => Box::pin(async move {
                let mut conn = lazy.get().await?;
                conn.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.inner {
            Inner::Single(conn) => conn.get_db(),
            Inner::Direct(conn) => conn.get_db(),
            Inner::Cluster(_) => 0,
        }
    }
}

/// A client for one server, trusting `certificates` when given.
fn single_client(
    url: &str,
    certificates: Option<TlsCertificates>,
) -> Result<redis::Client, PoolError> {
    match certificates {
        Some(certs) => redis::Client::build_with_tls(url, certs),
        None => redis::Client::open(url),
    }
    .map_err(|_| PoolError::Internal("invalid Redis URL".into()))
}
