//! `proxy-pool bench`: extraction throughput and latency through the real
//! handler, measured against the ceiling of the same Redis in the same run.
//!
//! For each pool size N and pool shape ([`PoolShape`]: how many protocol x
//! region x carrier x upstream combinations, 18 to a city-keyed 10,800) the
//! database is flushed and filled with N synthetic proxies
//! ([`synthetic_proxy`], TEST-NET addresses). Then every (filter shape,
//! count, C) cell:
//!
//! 1. runs a trivial `EVALSHA` (`return 1`) from C tasks over the same kind of
//!    connection the handler uses (the pool's `PoolConnection`), for half
//!    the baseline time, before and again after the extraction, so slow
//!    neighbours on a shared machine hit both sides of the ratio alike;
//! 2. drives [`distribution::handle`] from C tasks with
//!    `POST /api/v1/proxies/extract` `{"count":K}` and the cell's filters
//!    ([`FilterShape`]: none, one region, region + carrier, protocol +
//!    upstream; the values rotate from request to request over the pool's
//!    own), anonymous (`AuthSchemes` `none`; with `--registry-clients N`,
//!    an API key of one of N clients in the Redis registry), rate limits
//!    off, no `Idempotency-Key` unless asked, the usage counters on (as with
//!    an aggregates database) unless `--no-usage-counters`, and the access
//!    log formatted as in Lambda (JSON) but discarded. With `--http` the
//!    requests go over HTTP/1.1 through the server `proxy-pool serve` runs
//!    (loopback, one keep-alive connection per task).
//!
//! Extraction consumes the pool, so a cell runs in rounds: before each round
//! the pool is topped up to its target size and a round takes at most half of
//! it. The target is N, except where C concurrent requests of `count` would
//! not fit in half of N; there it is `2 * C * count` (marked `*` in the table).
//! Only the rounds are timed; top-ups are not. Every request must return 200
//! with `count` proxies; anything else is counted as short or failed.
//!
//! Besides the client-side figures, each cell reads Redis's own cost of the
//! extraction script (`INFO commandstats` `usec` / `calls` of `evalsha`, and
//! `INFO cpu` per call) over exactly the timed rounds, the trivial script's
//! the same way over its own windows, and the bench's own CPU time per
//! request (handler + redis-rs + tokio, `getrusage`).

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lambda_http::Body;
use lambda_http::http::{Request, StatusCode};
use proxy_pool::config::Config;
use proxy_pool::distribution::{self, App, EXTRACT_PATH};
use proxy_pool::local::{
    LocalError, PoolShape, RedisServer, Relay, replicas_acknowledge, synthetic_proxy,
};
use proxy_pool::pool::{
    NewProxy, PoolConnection, PoolError, RedisOptions, RedisPool, UpsertStatus, keys,
};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{
    AuthSchemes, Directory, Guard, PeerAddr, RedisRegistry, RegistryHandle, SourcePolicy,
};
use proxy_pool::server;

use crate::CliResult;
use crate::cli::BenchArgs;
use redis::Script;
use serde::Serialize;
use tokio::task::JoinSet;

/// The API key of the bench's registry client `i`.
fn client_key(i: usize) -> String {
    format!("pp_bench_client_{i:08}")
}

/// Protocols, in the order synthetic pools use them.
const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];

fn shape_as_combinations<S: serde::Serializer>(shape: &PoolShape, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(shape.combinations() as u64)
}

fn shapes_as_combinations<S: serde::Serializer>(
    shapes: &[PoolShape],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(shapes.iter().map(|shape| shape.combinations()))
}

/// Which filters every request of a cell carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilterShape {
    /// No filters: the whole pool matches.
    None,
    /// One region.
    Region,
    /// One region and one carrier.
    RegionCarrier,
    /// One protocol and one upstream (`allowedUpstreams`).
    ProtocolUpstream,
}

impl FilterShape {
    /// Every shape, in table order.
    pub const ALL: [Self; 4] = [
        Self::None,
        Self::Region,
        Self::RegionCarrier,
        Self::ProtocolUpstream,
    ];

    /// `none`, `region`, `region-carrier` or `protocol-upstream`.
    pub fn parse(s: &str) -> Result<Self, ArgError> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or(ArgError::Filter)
    }

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Region => "region",
            Self::RegionCarrier => "region-carrier",
            Self::ProtocolUpstream => "protocol-upstream",
        }
    }

    /// The request body of the `seq`th request: the filter values rotate
    /// over what `pool` holds.
    fn body(self, count: u32, seq: u64, pool: PoolShape) -> String {
        let i = seq as usize;
        let filters = match self {
            Self::None => return format!("{{\"count\":{count}}}"),
            Self::Region => format!("\"regions\":[\"{}\"]", pool.region(i.wrapping_mul(7_919))),
            Self::RegionCarrier => format!(
                "\"regions\":[\"{}\"],\"carriers\":[\"{}\"]",
                pool.region(i.wrapping_mul(7_919)),
                pool.carrier(i)
            ),
            Self::ProtocolUpstream => format!(
                "\"protocols\":[\"{}\"],\"allowedUpstreams\":[\"{}\"]",
                PROTOCOLS[i % 3],
                pool.upstream(i / 3)
            ),
        };
        format!("{{\"count\":{count},\"filters\":{{{filters}}}}}")
    }
}
/// Proxies per `upsert` call while filling, and calls in flight.
const FILL_CHUNK: usize = 2000;
const FILL_IN_FLIGHT: usize = 4;

/// What to measure.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Pool sizes N.
    pub sizes: Vec<usize>,
    /// Pool shapes (serialised as their numbers of combinations).
    #[serde(serialize_with = "shapes_as_combinations")]
    pub combinations: Vec<PoolShape>,
    /// Filter shapes.
    pub filters: Vec<FilterShape>,
    /// Proxies per request.
    pub counts: Vec<u32>,
    /// Concurrent tasks C.
    pub concurrency: Vec<usize>,
    /// Timed extraction per cell (rounds only, top-ups excluded).
    pub seconds: f64,
    /// Most requests per cell.
    pub max_requests: usize,
    /// Trivial `EVALSHA` time per cell (half before, half after).
    pub baseline_seconds: f64,
    /// Send a fresh `Idempotency-Key` with every request.
    pub idempotency: bool,
    /// Replicas of the private Redis, each behind a relay that delays
    /// replication (0: none).
    pub replicas: usize,
    /// Replication delays to measure, milliseconds (with `replicas`).
    pub replica_lags_ms: Vec<f64>,
    /// `PROXY_POOL_REPLICA_ACKS` values to measure (0: answer at once).
    pub replica_acks: Vec<u32>,
    /// Count each extraction in the hourly usage counters.
    pub usage_counters: bool,
    /// Clients in the Redis client registry; requests present their API
    /// keys (0: anonymous callers, no registry).
    pub registry_clients: usize,
    /// Requests over HTTP through `serve`'s server, not in process.
    pub http: bool,
}

impl Plan {
    /// The shapes matrix: N = 1M; 18, 2,700 and 10,800 combinations; every
    /// filter shape; count in {1, 10, 100}; C = 8.
    pub fn full() -> Self {
        Self {
            sizes: vec![1_000_000],
            combinations: vec![
                PoolShape::SMALL,
                PoolShape {
                    regions: 100,
                    carriers: 3,
                    upstreams: 3,
                },
                PoolShape {
                    regions: 400,
                    carriers: 3,
                    upstreams: 3,
                },
            ],
            filters: FilterShape::ALL.to_vec(),
            counts: vec![1, 10, 100],
            concurrency: vec![8],
            seconds: 1.5,
            max_requests: 20_000,
            baseline_seconds: 1.0,
            idempotency: false,
            replicas: 0,
            replica_lags_ms: vec![0.0],
            replica_acks: vec![0],
            usage_counters: true,
            registry_clients: 0,
            http: false,
        }
    }

    /// A smoke run for CI: N = 1k, a few hundred requests per cell.
    pub fn quick() -> Self {
        Self {
            sizes: vec![1_000],
            combinations: vec![PoolShape::SMALL],
            filters: vec![FilterShape::None],
            counts: vec![1, 10],
            concurrency: vec![1, 8],
            seconds: 0.3,
            max_requests: 300,
            baseline_seconds: 0.2,
            ..Self::full()
        }
    }
}

/// `bench`: checks the arguments, runs the plan they describe, prints the
/// report (a table, or JSON).
pub async fn command(args: BenchArgs) -> CliResult {
    let mut plan = if args.quick {
        Plan::quick()
    } else {
        Plan::full()
    };
    if !args.sizes.is_empty() {
        plan.sizes = args.sizes;
    }
    if !args.combinations.is_empty() {
        plan.combinations = args.combinations;
    }
    if !args.filters.is_empty() {
        plan.filters = args.filters;
    }
    if !args.counts.is_empty() {
        plan.counts = args.counts;
    }
    if !args.concurrency.is_empty() {
        plan.concurrency = args.concurrency;
    }
    plan.seconds = args.seconds.unwrap_or(plan.seconds);
    plan.max_requests = args.max_requests.unwrap_or(plan.max_requests);
    plan.baseline_seconds = args.baseline_seconds.unwrap_or(plan.baseline_seconds);
    plan.idempotency = args.idempotency;
    plan.registry_clients = args.registry_clients;
    plan.http = args.http;
    plan.replicas = args.replicas;
    if !args.replica_lag_ms.is_empty() {
        plan.replica_lags_ms = args.replica_lag_ms;
    }
    if !args.replica_acks.is_empty() {
        plan.replica_acks = args.replica_acks;
    }
    if plan
        .replica_acks
        .iter()
        .any(|&a| a as usize > plan.replicas)
        || plan
            .replica_lags_ms
            .iter()
            .any(|l| !(0.0..=1000.0).contains(l))
        || plan.replicas > 4
    {
        return Err(
            "--replicas must be 0..=4, --replica-acks at most --replicas, --replica-lag-ms 0..=1000"
                .into(),
        );
    }
    if plan.replicas > 0 && args.redis_url.is_some() {
        return Err("--replicas needs the bench's private Redis (no --redis-url)".into());
    }
    plan.usage_counters = !args.no_usage_counters;
    if plan.counts.iter().any(|c| !(1..=1000).contains(c))
        || plan.concurrency.iter().any(|c| !(1..=1024).contains(c))
        || !(plan.seconds > 0.0 && plan.baseline_seconds > 0.0)
        || plan.max_requests == 0
    {
        return Err(
            "counts must be 1..=1000, concurrency 1..=1024, seconds and requests > 0".into(),
        );
    }
    let target = match args.redis_url {
        Some(_) if !args.flush => {
            return Err(
                "--redis-url: the bench flushes that Redis database; add --flush to allow it"
                    .into(),
            );
        }
        Some(url) => Target::Url(url),
        None => Target::Private,
    };
    if cfg!(debug_assertions) {
        eprintln!("proxy-pool bench: this is a debug build; measure with --release");
    }
    let progress = Progress::new(std::io::stderr().is_terminal());
    let report = run(plan, target, progress).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// Why the bench could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The private Redis did not start.
    #[error(transparent)]
    Local(#[from] LocalError),
    /// The pool failed (kind and code only).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A raw Redis command failed (kind and code only).
    #[error("redis: {0}")]
    Redis(String),
    /// The run cannot go on (e.g. the fill was refused).
    #[error("{0}")]
    Failed(String),
}

impl From<redis::RedisError> for BenchError {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(format!("{:?} {}", e.kind(), e.code().unwrap_or("")))
    }
}

/// One (N, count, C) cell.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Cell {
    /// Pool size N.
    pub pool: usize,
    /// Its shape (serialised as its number of combinations).
    #[serde(serialize_with = "shape_as_combinations")]
    pub combinations: PoolShape,
    /// The requests' filters.
    pub filter: FilterShape,
    /// Pool size at the start of each round (N, or `2 * C * count` if larger).
    pub pool_at_round_start: usize,
    /// Proxies per request.
    pub count: u32,
    /// Concurrent tasks.
    pub concurrency: usize,
    /// Replication delay of the replicas, ms (with `--replicas`).
    pub replica_lag_ms: f64,
    /// Replicas each extraction waited for.
    pub replica_acks: u32,
    /// Timed requests.
    pub requests: usize,
    /// Proxies handed out by them.
    pub proxies: u64,
    /// Timed seconds (sum of the rounds).
    pub seconds: f64,
    /// Requests per second.
    pub extractions_per_sec: f64,
    /// Proxies per second.
    pub proxies_per_sec: f64,
    /// Latency percentiles of `handle`, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest request.
    pub max_us: u64,
    /// Trivial `EVALSHA` per second at the same concurrency.
    pub trivial_evalsha_per_sec: f64,
    /// `extractions_per_sec / trivial_evalsha_per_sec`.
    pub ratio: f64,
    /// Redis's `usec_per_call` of the trivial script, in its own windows.
    pub trivial_server_us_per_call: Option<f64>,
    /// Redis's `usec_per_call` of `evalsha` while extracting.
    pub server_us_per_call: Option<f64>,
    /// Redis process CPU (`INFO cpu`) per extraction, microseconds.
    pub redis_cpu_us_per_call: Option<f64>,
    /// Bench process CPU per request (handler, redis-rs, tokio), microseconds.
    pub client_cpu_us_per_request: Option<f64>,
    /// Requests answered 200 with fewer than `count` proxies.
    pub short: usize,
    /// Requests answered with another status.
    pub failed: usize,
}

/// How long one fill took.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fill {
    /// Pool size N.
    pub pool: usize,
    /// Its shape (serialised as its number of combinations).
    #[serde(serialize_with = "shape_as_combinations")]
    pub combinations: PoolShape,
    /// Seconds to add N proxies.
    pub seconds: f64,
    /// Proxies added per second.
    pub per_sec: f64,
    /// Redis `used_memory` after the fill divided by N (records, index, all keys).
    pub redis_bytes_per_proxy: Option<f64>,
}

/// The outcome of a run.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// What was asked for.
    pub plan: Plan,
    /// `redis_version` from `INFO server`.
    pub redis_version: String,
    /// Online CPUs of this machine.
    pub cpus: usize,
    /// Fill times.
    pub fills: Vec<Fill>,
    /// The cells, in run order.
    pub cells: Vec<Cell>,
    /// Peak resident memory of the bench process (handler + load), KiB.
    pub peak_rss_kib: Option<u64>,
}

/// Where the pool lives during the run.
pub enum Target {
    /// A private `redis-server` started for the run.
    Private,
    /// An existing Redis whose current database the bench may flush.
    Url(String),
}

/// Progress on stderr: a bar on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar when `terminal`, else plain lines.
    pub fn new(terminal: bool) -> Self {
        let bar = terminal.then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Self { bar }
    }

    fn start(&self, len: u64, msg: String) {
        match &self.bar {
            Some(bar) => {
                bar.reset();
                bar.set_length(len);
                bar.set_position(0);
                bar.set_message(msg);
            }
            None => eprintln!("bench: {msg}"),
        }
    }

    fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    fn note(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("bench: {line}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Everything a run shares.
struct Bench {
    /// Handlers, one per `replica_acks` value of the plan.
    fronts: Vec<Front>,
    /// The HTTP servers of `--http` (stopped when the bench ends).
    servers: JoinSet<std::io::Result<()>>,
    /// The replicas' relays (their delay is the replication lag).
    relays: Vec<Relay>,
    variant: std::sync::Mutex<Variant>,
    pool: RedisPool,
    conn: PoolConnection,
    trivial: Arc<Script>,
    next_seq: AtomicU64,
    next_key: AtomicU64,
    next_request: AtomicU64,
    progress: Progress,
    idempotency: bool,
    registry_clients: usize,
    shape: std::sync::Mutex<PoolShape>,
}

/// The replication setting the current cells run under.
#[derive(Debug, Clone, Copy, Default)]
struct Variant {
    lag_ms: f64,
    acks: u32,
    app: usize,
}

/// Where requests go: one handler per `replica_acks` value of the plan.
#[derive(Clone)]
enum Front {
    /// Called in process, as the Lambda runtime calls it.
    InProcess(Arc<App>),
    /// `serve`'s HTTP/1.1 server on this loopback address.
    Http(SocketAddr),
}

/// One task's way to the handler.
enum Caller {
    InProcess(Arc<App>, PeerAddr),
    /// One keep-alive connection.
    Http(SendRequest<Full<Bytes>>),
}

impl Caller {
    async fn connect(front: Front, peer: PeerAddr) -> Option<Self> {
        match front {
            Front::InProcess(app) => Some(Self::InProcess(app, peer)),
            Front::Http(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
                stream.set_nodelay(true).ok()?;
                let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
                tokio::spawn(conn);
                Some(Self::Http(sender))
            }
        }
    }

    /// Sends one request; its status and body, `None` if it failed on
    /// the way.
    async fn call(
        &mut self,
        request: lambda_http::http::request::Builder,
        body: String,
    ) -> Option<(StatusCode, String)> {
        match self {
            Self::InProcess(app, peer) => {
                let mut request = request.body(Body::from(body)).ok()?;
                request.extensions_mut().insert(*peer);
                let response = distribution::handle(app, request).await;
                let status = response.status();
                let text = match response.into_body() {
                    Body::Text(s) => s,
                    Body::Binary(b) => String::from_utf8(b).ok()?,
                    _ => String::new(),
                };
                Some((status, text))
            }
            Self::Http(sender) => {
                let request = request
                    .header("host", "127.0.0.1")
                    .body(Full::new(Bytes::from(body)))
                    .ok()?;
                sender.ready().await.ok()?;
                let response = sender.send_request(request).await.ok()?;
                let status = response.status();
                let bytes = response.into_body().collect().await.ok()?.to_bytes();
                Some((status, String::from_utf8(bytes.to_vec()).ok()?))
            }
        }
    }
}

/// The thread the replication relays run on: a runtime of their own, so
/// that the simulated replication lag is the relay's delay, not that delay
/// plus the wait for a turn behind the handler's and the clients' tasks
/// (in a deployment the replicas' network is not the service's runtime).
struct RelayThread(Option<tokio::runtime::Runtime>);

impl RelayThread {
    fn start() -> Result<Self, BenchError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-relays")
            .enable_all()
            .build()
            .map_err(|e| BenchError::Failed(format!("relay runtime: {e}")))?;
        Ok(Self(Some(runtime)))
    }

    /// A relay to `target`, served by this thread.
    async fn relay(&self, target: SocketAddr) -> Result<Relay, BenchError> {
        let failed = |e: String| BenchError::Failed(format!("relay: {e}"));
        let runtime = self.0.as_ref().ok_or_else(|| failed("stopped".into()))?;
        runtime
            .spawn(Relay::start(target))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(e.to_string()))
    }
}

impl Drop for RelayThread {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts `n` replicas of `primary`, each behind a relay on `thread` (the
/// replication delay), and waits until they acknowledge writes.
async fn start_replicas(
    primary: &RedisServer,
    n: usize,
    thread: &RelayThread,
) -> Result<Vec<(RedisServer, Relay)>, BenchError> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        let relay = thread
            .relay(([127, 0, 0, 1], primary.port()).into())
            .await?;
        let port = relay.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).await?;
        replicas.push((replica, relay));
    }
    let started = Instant::now();
    loop {
        if replicas_acknowledge(&primary.url(), "bench-replication-probe", n).await? {
            return Ok(replicas);
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(BenchError::Failed(
                "the replicas did not sync in 30 s".into(),
            ));
        }
    }
}

/// Runs `plan` against `target`.
pub async fn run(plan: Plan, target: Target, progress: Progress) -> Result<Report, BenchError> {
    // The private Redis lives as long as this function.
    let mut private = None;
    let mut replicas = Vec::new();
    let relay_thread = RelayThread::start()?;
    let url = match target {
        Target::Private => {
            let server = RedisServer::start().await?;
            let url = server.url();
            replicas = start_replicas(&server, plan.replicas, &relay_thread).await?;
            private = Some(server);
            url
        }
        Target::Url(url) => url,
    };
    let max_count = plan.counts.iter().copied().max().unwrap_or(1).max(100);
    let config = Config {
        redis_url: Some(url.clone()),
        auth_schemes: AuthSchemes {
            none: plan.registry_clients == 0,
            api_key: plan.registry_clients > 0,
            ..AuthSchemes::default()
        },
        client_rate: None,
        global_rate: None,
        max_count_per_request: max_count,
        // The pool is filled once per N and the run lasts minutes: its health
        // checks must stay fresh for the whole run.
        max_health_check_age: Duration::from_secs(3600),
        ..Config::default()
    };
    let pool = RedisPool::with_options(&url, &config.redis_options())?;
    let mut settings = config.settings();
    if plan.usage_counters {
        // As with an aggregates database configured (the bench flushes nothing).
        settings.policy.usage_retention = Some(config.aggregates_retention);
    }
    let mut fronts = Vec::new();
    let mut servers = JoinSet::new();
    for &acks in &plan.replica_acks {
        let options = RedisOptions {
            replica_acks: acks,
            replica_ack_timeout: config.replica_ack_timeout,
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
    let (replica_servers, relays): (Vec<_>, Vec<_>) = replicas.into_iter().unzip();
    let mut conn = pool.connection();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let redis_version = info_field(&info, "redis_version").unwrap_or_default();
    let mut bench = Bench {
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
        shape: std::sync::Mutex::new(PoolShape::SMALL),
    };
    let mut fills = Vec::new();
    let mut cells = Vec::new();
    for &n in &plan.sizes {
        for &shape in &plan.combinations {
            redis::cmd("FLUSHDB")
                .arg("ASYNC")
                .query_async::<()>(&mut bench.conn.clone())
                .await?;
            bench.set_shape(shape);
            bench.progress.start(
                n as u64,
                format!(
                    "filling a pool of {} over {} combinations",
                    human(n),
                    shape.combinations()
                ),
            );
            let started = Instant::now();
            bench.add(n, true).await?;
            let seconds = started.elapsed().as_secs_f64();
            bench.progress.note(format!(
                "filled {} proxies over {} combinations in {seconds:.1} s ({:.0}/s)",
                human(n),
                shape.combinations(),
                n as f64 / seconds
            ));
            let memory: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut bench.conn.clone())
                .await?;
            let used = info_field(&memory, "used_memory").and_then(|v| v.parse::<f64>().ok());
            fills.push(Fill {
                pool: n,
                combinations: shape,
                seconds,
                per_sec: n as f64 / seconds,
                redis_bytes_per_proxy: used.map(|b| b / n as f64),
            });
            bench.register_clients().await?;
            let total = plan.filters.len()
                * plan.counts.len()
                * plan.concurrency.len()
                * plan.replica_lags_ms.len()
                * plan.replica_acks.len();
            bench.progress.start(
                total as u64,
                format!("N={}, {} combinations", human(n), shape.combinations()),
            );
            for &lag_ms in &plan.replica_lags_ms {
                for (app, &acks) in plan.replica_acks.iter().enumerate() {
                    bench.set_variant(Variant { lag_ms, acks, app });
                    for &filter in &plan.filters {
                        for &count in &plan.counts {
                            for &c in &plan.concurrency {
                                let cell = bench.cell(&plan, n, filter, count, c).await?;
                                bench.progress.note(row(&cell, plan.replicas > 0));
                                bench.progress.inc(1);
                                cells.push(cell);
                            }
                        }
                    }
                }
            }
        }
    }
    bench.progress.finish();
    redis::cmd("FLUSHDB")
        .arg("ASYNC")
        .query_async::<()>(&mut bench.conn.clone())
        .await?;
    bench.servers.shutdown().await;
    drop(bench);
    drop(replica_servers);
    drop(private);
    Ok(Report {
        plan,
        redis_version,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        fills,
        cells,
        peak_rss_kib: peak_rss_kib(),
    })
}

/// What the C tasks of one round observed.
#[derive(Default)]
struct Round {
    latencies_us: Vec<u64>,
    proxies: u64,
    short: usize,
    failed: usize,
}

/// Redis counters read around a timed window.
#[derive(Clone, Copy, Default)]
struct ServerStats {
    evalsha_calls: u64,
    evalsha_usec: u64,
    cpu_seconds: f64,
}

impl Bench {
    fn set_shape(&self, shape: PoolShape) {
        if let Ok(mut s) = self.shape.lock() {
            *s = shape;
        }
    }

    fn shape(&self) -> PoolShape {
        self.shape.lock().map_or(PoolShape::SMALL, |s| *s)
    }

    /// Adds `n` fresh synthetic proxies, several upsert calls in flight.
    /// Loads the registry's clients (after a fill: the fill flushes Redis).
    async fn register_clients(&self) -> Result<(), BenchError> {
        if self.registry_clients == 0 {
            return Ok(());
        }
        let clients: Vec<serde_json::Value> = (0..self.registry_clients)
            .map(|i| {
                serde_json::json!({
                    "id": format!("bench-{i}"),
                    "apiKeys": [CredentialHash::of(client_key(i).as_bytes()).encode()],
                })
            })
            .collect();
        let started = Instant::now();
        RedisRegistry::new(self.pool.clone())
            .import(&serde_json::json!({ "clients": clients }).to_string())
            .await
            .map_err(|e| BenchError::Failed(e.to_string()))?;
        self.progress.note(format!(
            "registered {} clients in {:.1} s",
            human(self.registry_clients),
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    }

    async fn add(&self, n: usize, show: bool) -> Result<(), BenchError> {
        let first = self.next_seq.fetch_add(n as u64, Ordering::Relaxed);
        let now = proxy_pool::clock::now_ms();
        let shape = self.shape();
        let mut tasks = JoinSet::new();
        let mut start = 0;
        while start < n || !tasks.is_empty() {
            while start < n && tasks.len() < FILL_IN_FLIGHT {
                let len = FILL_CHUNK.min(n - start);
                let pool = self.pool.clone();
                let from = first + start as u64;
                tasks.spawn(async move {
                    let batch: Vec<NewProxy> = (from..from + len as u64)
                        .map(|seq| synthetic_proxy(seq as usize, now, shape))
                        .collect();
                    let statuses = pool.upsert(&batch).await?;
                    let added = statuses
                        .iter()
                        .filter(|s| **s == UpsertStatus::Added)
                        .count();
                    Ok::<_, PoolError>((len, added))
                });
                start += len;
            }
            if let Some(joined) = tasks.join_next().await {
                let (len, added) = joined.map_err(|e| BenchError::Failed(e.to_string()))??;
                if added != len {
                    return Err(BenchError::Failed(format!(
                        "the pool refused {} of {len} synthetic proxies",
                        len - added
                    )));
                }
                if show {
                    self.progress.inc(len as u64);
                }
            }
        }
        Ok(())
    }

    /// Tops the index up to `target` entries.
    async fn top_up(&self, target: usize) -> Result<(), BenchError> {
        let have: usize = redis::cmd("ZCARD")
            .arg(keys::IX_POOL)
            .query_async(&mut self.conn.clone())
            .await?;
        if have < target {
            self.add(target - have, false).await?;
        }
        Ok(())
    }

    async fn server_stats(&self) -> Result<ServerStats, BenchError> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut self.conn.clone())
            .await?;
        let mut stats = ServerStats::default();
        if let Some(line) = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")) {
            for part in line["cmdstat_evalsha:".len()..].split(',') {
                match part.split_once('=') {
                    Some(("calls", v)) => stats.evalsha_calls = v.parse().unwrap_or(0),
                    Some(("usec", v)) => stats.evalsha_usec = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let cpu = |name| info_field(&info, name).and_then(|v| v.parse::<f64>().ok());
        stats.cpu_seconds =
            cpu("used_cpu_user").unwrap_or(0.0) + cpu("used_cpu_sys").unwrap_or(0.0);
        Ok(stats)
    }

    /// One (N, shape, filter, count, C) cell.
    fn variant(&self) -> Variant {
        *self.variant.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the next cells with `variant`'s handler and replication delay.
    fn set_variant(&self, variant: Variant) {
        for relay in &self.relays {
            relay.set_delay(Duration::from_secs_f64(variant.lag_ms / 1000.0));
        }
        *self.variant.lock().unwrap_or_else(PoisonError::into_inner) = variant;
    }

    fn front(&self) -> Front {
        self.fronts[self.variant().app].clone()
    }

    async fn cell(
        &self,
        plan: &Plan,
        n: usize,
        filter: FilterShape,
        count: u32,
        c: usize,
    ) -> Result<Cell, BenchError> {
        let target = n.max(2 * c * count as usize);
        let per_round = (target / 2 / count as usize).max(c);
        let baseline = Duration::from_secs_f64(plan.baseline_seconds / 2.0);
        let timed = Duration::from_secs_f64(plan.seconds);

        // Warm-up: connections, script cache, allocator.
        self.top_up(target).await?;
        self.round(filter, count, c, c, Duration::from_secs(5))
            .await;

        let mut trivial = self.trivial(c, baseline).await?;
        let mut all = Round::default();
        let mut elapsed = Duration::ZERO;
        let (mut calls, mut usec, mut redis_cpu, mut client_cpu) = (0u64, 0u64, 0.0f64, 0.0f64);
        let mut cpu_known = true;
        while elapsed < timed && all.latencies_us.len() < plan.max_requests {
            self.top_up(target).await?;
            let budget = per_round.min(plan.max_requests - all.latencies_us.len());
            let before = self.server_stats().await?;
            let cpu_before = process_cpu_seconds();
            let started = Instant::now();
            let round = self.round(filter, count, c, budget, timed - elapsed).await;
            elapsed += started.elapsed();
            let cpu_after = process_cpu_seconds();
            let after = self.server_stats().await?;
            calls += after.evalsha_calls.saturating_sub(before.evalsha_calls);
            usec += after.evalsha_usec.saturating_sub(before.evalsha_usec);
            redis_cpu += after.cpu_seconds - before.cpu_seconds;
            match (cpu_before, cpu_after) {
                (Some(a), Some(b)) => client_cpu += b - a,
                _ => cpu_known = false,
            }
            all.latencies_us.extend(round.latencies_us);
            all.proxies += round.proxies;
            all.short += round.short;
            all.failed += round.failed;
        }
        let after = self.trivial(c, baseline).await?;
        trivial.calls += after.calls;
        trivial.seconds += after.seconds;
        trivial.server_calls += after.server_calls;
        trivial.server_usec += after.server_usec;

        let requests = all.latencies_us.len();
        let seconds = elapsed.as_secs_f64();
        all.latencies_us.sort_unstable();
        let pct = |q: f64| percentile(&all.latencies_us, q);
        let rate = requests as f64 / seconds.max(1e-9);
        let trivial_rate = trivial.calls as f64 / trivial.seconds.max(1e-9);
        let per_call = |total: f64| (calls > 0).then(|| total / calls as f64);
        Ok(Cell {
            pool: n,
            combinations: self.shape(),
            filter,
            pool_at_round_start: target,
            count,
            concurrency: c,
            replica_lag_ms: self.variant().lag_ms,
            replica_acks: self.variant().acks,
            requests,
            proxies: all.proxies,
            seconds,
            extractions_per_sec: rate,
            proxies_per_sec: all.proxies as f64 / seconds.max(1e-9),
            p50_us: pct(0.50),
            p99_us: pct(0.99),
            p999_us: pct(0.999),
            max_us: all.latencies_us.last().copied().unwrap_or(0),
            trivial_evalsha_per_sec: trivial_rate,
            ratio: rate / trivial_rate.max(1e-9),
            trivial_server_us_per_call: (trivial.server_calls > 0)
                .then(|| trivial.server_usec as f64 / trivial.server_calls as f64),
            server_us_per_call: per_call(usec as f64),
            redis_cpu_us_per_call: per_call(redis_cpu * 1e6),
            client_cpu_us_per_request: (cpu_known && requests > 0)
                .then(|| client_cpu * 1e6 / requests as f64),
            short: all.short,
            failed: all.failed,
        })
    }

    /// `budget` requests through the handler from `c` tasks, or until `limit`.
    async fn round(
        &self,
        filter: FilterShape,
        count: u32,
        c: usize,
        budget: usize,
        limit: Duration,
    ) -> Round {
        let remaining = Arc::new(AtomicUsize::new(budget));
        let deadline = Instant::now() + limit;
        let shape = self.shape();
        let mut tasks = JoinSet::new();
        let front = self.front();
        for task in 0..c {
            let front = front.clone();
            let remaining = remaining.clone();
            let first = self.next_request.fetch_add(1 << 32, Ordering::Relaxed);
            let keys = self
                .idempotency
                .then(|| self.next_key.fetch_add(1, Ordering::Relaxed));
            let clients = self.registry_clients;
            tasks.spawn(async move {
                let mut round = Round::default();
                let peer = PeerAddr(([127, 0, 0, 1], 40_000 + task as u16).into());
                let Some(mut caller) = Caller::connect(front, peer).await else {
                    round.failed += 1;
                    return round;
                };
                let mut i = 0u64;
                while remaining
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| r.checked_sub(1))
                    .is_ok()
                    && Instant::now() < deadline
                {
                    let mut request =
                        Request::post(EXTRACT_PATH).header("content-type", "application/json");
                    if let Some(base) = keys {
                        request = request.header("idempotency-key", format!("bench-{base:x}-{i}"));
                    }
                    if clients > 0 {
                        let client = (task * 7919 + i as usize) % clients;
                        request = request.header("x-api-key", client_key(client));
                    }
                    let body = filter.body(count, first + i, shape);
                    i += 1;
                    let started = Instant::now();
                    let answer = caller.call(request, body).await;
                    round
                        .latencies_us
                        .push(started.elapsed().as_micros() as u64);
                    let Some((StatusCode::OK, text)) = answer else {
                        round.failed += 1;
                        continue;
                    };
                    let returned = returned(&text).unwrap_or(0);
                    round.proxies += returned;
                    if returned < u64::from(count) {
                        round.short += 1;
                    }
                }
                round
            });
        }
        let mut all = Round::default();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(r) = joined {
                all.latencies_us.extend(r.latencies_us);
                all.proxies += r.proxies;
                all.short += r.short;
                all.failed += r.failed;
            }
        }
        all
    }

    /// Trivial `EVALSHA` calls from `c` tasks for `limit`, with Redis's own
    /// count and time of them.
    async fn trivial(&self, c: usize, limit: Duration) -> Result<Trivial, BenchError> {
        self.trivial
            .invoke_async::<_, i64>(&mut self.conn.clone())
            .await?;
        let before = self.server_stats().await?;
        let done = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + limit;
        let mut tasks = JoinSet::new();
        for _ in 0..c {
            let mut conn = self.conn.clone();
            let script = self.trivial.clone();
            let done = done.clone();
            tasks.spawn(async move {
                while Instant::now() < deadline {
                    script.invoke_async::<_, i64>(&mut conn).await?;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<_, redis::RedisError>(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.map_err(|e| BenchError::Failed(e.to_string()))??;
        }
        let seconds = started.elapsed().as_secs_f64();
        let after = self.server_stats().await?;
        Ok(Trivial {
            calls: done.load(Ordering::Relaxed),
            seconds,
            server_calls: after.evalsha_calls.saturating_sub(before.evalsha_calls),
            server_usec: after.evalsha_usec.saturating_sub(before.evalsha_usec),
        })
    }
}

/// What a trivial-`EVALSHA` window measured.
struct Trivial {
    calls: u64,
    seconds: f64,
    server_calls: u64,
    server_usec: u64,
}

/// `returned` of a 200 extraction body, read without parsing the whole body.
fn returned(body: &str) -> Option<u64> {
    let at = body.find("\"returned\":")? + "\"returned\":".len();
    let digits: String = body[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The `q` quantile of sorted `values` (nearest rank).
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
}

/// CPU time this process's threads have run, seconds: the sum over
/// `/proc/self/task/*/schedstat` (nanoseconds on a CPU, first field).
/// `/proc/self/schedstat` alone is the main thread's, which the Tokio
/// workers doing the requests are not; the runtime's worker threads live
/// as long as the bench, so no thread's time is lost between two reads.
fn process_cpu_seconds() -> Option<f64> {
    let mut ns = 0f64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        // A thread that ended since the listing has no file left: skip it.
        let Ok(stat) = std::fs::read_to_string(task.ok()?.path().join("schedstat")) else {
            continue;
        };
        ns += stat.split_whitespace().next()?.parse::<f64>().ok()?;
    }
    Some(ns / 1e9)
}

/// `VmHWM` of this process (Linux), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// `1k`, `100k`, `1M` for round sizes, the number otherwise.
pub fn human(n: usize) -> String {
    match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// Parses `1000`, `1k`, `100k`, `1M`.
/// A bench argument that cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// Not a filter shape.
    #[error("filters are none, region, region-carrier, protocol-upstream")]
    Filter,
    /// Not a pool size.
    #[error("a pool size is a number like 1000, 100k or 1M, at most 50M")]
    Size,
}

/// A pool size: a number, optionally with a `k` or `M` suffix.
pub fn parse_size(s: &str) -> Result<usize, ArgError> {
    let s = s.trim();
    let (digits, factor) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1_000),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1_000_000),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .map(|d| d * factor)
        .filter(|n| (1..=50_000_000).contains(n))
        .ok_or(ArgError::Size)
}

const HEADER: &str = "       N   comb  filter             count    C     ext/s  proxies/s   p50 us   p99 us  trivial/s  ratio  srv us/call  triv srv us  cli us/req";

fn row(c: &Cell, replicated: bool) -> String {
    let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
    let mark = if c.pool_at_round_start > c.pool {
        "*"
    } else {
        " "
    };
    let mut line = format!(
        "{:>7}{mark} {:>6}  {:<17} {:>5} {:>4} {:>9.0} {:>10.0} {:>8} {:>8} {:>10.0} {:>6.2} {:>12} {:>12} {:>11}",
        human(c.pool),
        c.combinations.combinations(),
        c.filter.name(),
        c.count,
        c.concurrency,
        c.extractions_per_sec,
        c.proxies_per_sec,
        c.p50_us,
        c.p99_us,
        c.trivial_evalsha_per_sec,
        c.ratio,
        opt(c.server_us_per_call),
        opt(c.trivial_server_us_per_call),
        opt(c.client_cpu_us_per_request),
    );
    if replicated {
        let _ = write!(line, " {:>7.1} {:>4}", c.replica_lag_ms, c.replica_acks);
    }
    if c.short + c.failed > 0 {
        let _ = write!(line, "  ({} short, {} failed)", c.short, c.failed);
    }
    line
}

impl Report {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "proxy-pool bench: redis {} on {} CPUs, {}, {}, {}, rate limits off, {}",
            self.redis_version,
            self.cpus,
            if self.plan.http {
                "over HTTP through serve's server"
            } else {
                "handler in process"
            },
            if self.plan.idempotency {
                "with Idempotency-Key"
            } else {
                "no Idempotency-Key"
            },
            if self.plan.usage_counters {
                "usage counters on"
            } else {
                "usage counters off"
            },
            if self.plan.registry_clients == 0 {
                "anonymous".to_owned()
            } else {
                format!(
                    "API keys of {} clients in the Redis registry",
                    human(self.plan.registry_clients)
                )
            }
        );
        for f in &self.fills {
            let _ = writeln!(
                out,
                "fill N={} over {} combinations: {:.1} s ({:.0} proxies/s), Redis memory {} bytes per proxy",
                human(f.pool),
                f.combinations.combinations(),
                f.seconds,
                f.per_sec,
                f.redis_bytes_per_proxy
                    .map_or("-".to_owned(), |b| format!("{b:.0}"))
            );
        }
        let replicated = self.plan.replicas > 0;
        let _ = writeln!(
            out,
            "{HEADER}{}",
            if replicated { "  lag ms acks" } else { "" }
        );
        for c in &self.cells {
            let _ = writeln!(out, "{}", row(c, replicated));
        }
        if replicated {
            let _ = writeln!(
                out,
                "lag ms = replication delay of each of the {} replicas (a relay holds what the primary sends); acks = PROXY_POOL_REPLICA_ACKS.",
                self.plan.replicas
            );
        }
        let _ = writeln!(
            out,
            "ratio = ext/s / trivial EVALSHA (return 1)/s, same Redis, same connection type, same C, measured around each cell."
        );
        let _ = writeln!(
            out,
            "srv us/call = Redis usec_per_call of the extraction script; triv srv us = the same of the trivial script; cli us/req = bench CPU per request (handler + redis-rs + tokio, and with HTTP its server and client).\ncomb = protocol x region x carrier x upstream combinations in the pool; filter values rotate over the pool's own regions, carriers, protocols and upstreams."
        );
        if self.cells.iter().any(|c| c.pool_at_round_start > c.pool) {
            let _ = writeln!(
                out,
                "* C x count does not fit in half of N: the pool starts each round at 2 x C x count instead."
            );
        }
        if let Some(kib) = self.peak_rss_kib {
            let _ = writeln!(
                out,
                "peak RSS of the bench process (handler + load generator): {:.1} MiB",
                kib as f64 / 1024.0
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes parse with suffixes and print back the same way.
    #[test]
    fn sizes_round_trip() {
        for s in ["1k", "100k", "1M", "1500"] {
            assert_eq!(human(parse_size(s).unwrap()), s);
        }
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
    }

    /// Nearest-rank percentiles.
    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&[7], 0.999), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    /// Filter shapes parse by name and name values the pool holds.
    #[test]
    fn filter_shapes() {
        let shape = PoolShape::parse("2700").unwrap();
        for f in FilterShape::ALL {
            assert_eq!(FilterShape::parse(f.name()), Ok(f));
            let body: serde_json::Value = serde_json::from_str(&f.body(5, 123, shape)).unwrap();
            assert_eq!(body["count"], 5);
        }
        assert_eq!(
            FilterShape::RegionCarrier.body(1, 4, shape),
            r#"{"count":1,"filters":{"regions":["city-076"],"carriers":["unicom"]}}"#
        );
        assert!(FilterShape::parse("city").is_err());
    }

    /// The returned count is read from the rendered body.
    #[test]
    fn reads_returned() {
        assert_eq!(
            returned(r#"{"requestId":"req_1","requested":5,"returned":3,"proxies":[]}"#),
            Some(3)
        );
        assert_eq!(returned("{}"), None);
    }
}
