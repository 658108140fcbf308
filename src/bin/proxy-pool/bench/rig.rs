//! The rig a run shares ([`Bench`]): the handlers under test, the pool and
//! the connections that fill and read it, the replication setting and
//! handler the current cells run under ([`Variant`]); where the pool lives
//! ([`Target`]), and the configuration the handlers run with.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::local::{PoolShape, Relay};
use proxy_pool::pool::{PoolConnection, RedisOptions, RedisPool};
use proxy_pool::security::{
    AuthSchemes, Directory, Guard, RedisRegistry, RegistryHandle, SourcePolicy,
};
use proxy_pool::server;
use redis::Script;
use tokio::task::JoinSet;

use super::caller::Front;
use super::error::BenchError;
use super::figures::info_field;
use super::pinger::Pinger;
use super::plan::{Plan, ScriptCalls};
use super::progress::Progress;

/// The replication setting and handler the current cells run under.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Variant {
    /// Replication delay of every relay, ms.
    pub(super) lag_ms: f64,
    /// `PROXY_POOL_REPLICA_ACKS` of the handler used.
    pub(super) acks: u32,
    /// How that handler calls the scripts.
    pub(super) calls: ScriptCalls,
    /// Index of that handler in [`Bench`]'s fronts.
    pub(super) app: usize,
}

/// Where the pool lives during the run.
pub enum Target {
    /// A private `redis-server` started for the run.
    Private,
    /// An existing Redis whose current database the bench may flush.
    Url(String),
}

/// Everything a run shares.
pub(super) struct Bench {
    /// Handlers, one per (`replica_acks`, `script_calls`) pair of the plan.
    pub(super) fronts: Vec<Front>,
    /// The HTTP servers of `--http` (stopped when the bench ends).
    pub(super) servers: JoinSet<std::io::Result<()>>,
    /// The replicas' relays (their delay is the replication lag).
    pub(super) relays: Vec<Relay>,
    pub(super) variant: std::sync::Mutex<Variant>,
    pub(super) pool: RedisPool,
    pub(super) conn: PoolConnection,
    pub(super) trivial: Arc<Script>,
    pub(super) next_seq: AtomicU64,
    pub(super) next_key: AtomicU64,
    pub(super) next_request: AtomicU64,
    pub(super) progress: Progress,
    pub(super) idempotency: bool,
    pub(super) registry_clients: usize,
    pub(super) adversarial_heads: bool,
    pub(super) shape: std::sync::Mutex<PoolShape>,
    /// Another client's `PING` (with `ping_every_ms`).
    pub(super) pinger: Option<Pinger>,
}

impl Bench {
    /// The handlers `plan` asks for (one per `replica_acks` value and way
    /// of calling the scripts, in process or behind `serve`'s server) on
    /// the Redis at `url`, and
    /// Redis's version.
    pub(super) async fn new(
        plan: &Plan,
        url: &str,
        relays: Vec<Relay>,
        progress: Progress,
    ) -> Result<(Self, String), BenchError> {
        let url = url.to_owned();
        let config = bench_config(plan, &url)?;
        let pool = RedisPool::with_options(&url, &config.redis_options())?;
        let mut settings = config.settings();
        if plan.usage_counters {
            // As with an aggregates database configured (the bench flushes nothing).
            settings.policy.usage_retention = Some(config.aggregates_retention);
        }
        let mut fronts = Vec::new();
        let mut servers = JoinSet::new();
        let variants = plan
            .replica_acks
            .iter()
            .flat_map(|&acks| plan.script_calls.iter().map(move |&calls| (acks, calls)));
        for (acks, calls) in variants {
            let options = RedisOptions {
                replica_acks: acks,
                replica_ack_timeout: config.replica_ack_timeout,
                functions: calls == ScriptCalls::Fcall,
                ..config.redis_options()
            };
            let pool = RedisPool::with_options(&url, &options)?;
            let registry: Directory = if plan.registry_clients > 0 {
                RedisRegistry::new(pool.clone()).into()
            } else {
                RegistryHandle::default().into()
            };
            let guard = Guard::new(config.auth_schemes, SourcePolicy::default(), registry);
            let app = Arc::new(App::new(settings.clone(), pool, Arc::new(guard)));
            fronts.push(if plan.http {
                let unbound = |e: std::io::Error| BenchError::Failed(format!("listener: {e}"));
                let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
                    .await
                    .map_err(unbound)?;
                let addr = listener.local_addr().map_err(unbound)?;
                servers.spawn(server::serve(listener, app, std::future::pending()));
                Front::Http(addr)
            } else {
                Front::InProcess(app)
            });
        }
        let mut conn = pool.connection();
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await?;
        let redis_version = info_field(&info, "redis_version").unwrap_or_default();
        let bench = Bench {
            fronts,
            servers,
            relays,
            variant: std::sync::Mutex::new(Variant::default()),
            conn,
            pool,
            trivial: Arc::new(Script::new("return 1")),
            next_seq: AtomicU64::new(0),
            next_key: AtomicU64::new(0),
            next_request: AtomicU64::new(0),
            progress,
            idempotency: plan.idempotency,
            registry_clients: plan.registry_clients,
            adversarial_heads: plan.adversarial_heads,
            shape: std::sync::Mutex::new(PoolShape::SMALL),
            pinger: match plan.ping_every_ms {
                0 => None,
                ms => Some(Pinger::start(&url, Duration::from_millis(ms))?),
            },
        };
        Ok((bench, redis_version))
    }
}

/// The configuration the bench's handlers run with: anonymous callers (or
/// API keys of the registry's clients), rate limits off unless
/// `--client-rate`, and a health-check age that outlasts the run.
pub(super) fn bench_config(plan: &Plan, url: &str) -> Result<Config, BenchError> {
    let max_count = plan.counts.iter().copied().max().unwrap_or(1).max(100);
    let client_rate = match &plan.client_rate {
        Some(r) => proxy_pool::security::Rate::parse(r)
            .map_err(|e| BenchError::Failed(format!("--client-rate: {e}")))?,
        None => None,
    };
    Ok(Config {
        redis_url: Some(url.to_owned()),
        auth_schemes: AuthSchemes {
            none: plan.registry_clients == 0,
            api_key: plan.registry_clients > 0,
            ..AuthSchemes::default()
        },
        client_rate,
        global_rate: None,
        max_count_per_request: max_count,
        reserve_for_gateway: plan.reserve,
        // The pool is filled once per N and the run lasts minutes: its health
        // checks must stay fresh for the whole run (and with --stall, the
        // fill's go stale together, see stall/mod.rs).
        max_health_check_age: Duration::from_secs(3600),
        // The fill's and the bench's own calls; each handler has its own.
        redis_functions: plan.script_calls.first() != Some(&ScriptCalls::Evalsha),
        ..Config::default()
    })
}
