//! `proxy-pool bench`: extraction throughput and latency through the real
//! handler, measured against the ceiling of the same Redis in the same run.
//!
//! For each pool size N and pool shape ([`PoolShape`]: how many protocol x
//! region x carrier x upstream combinations, 18 to a city-keyed 10,800, or
//! any composition spelled `PxRxCxU`, e.g. 3x400x3x5 or 2x16x25x25) the
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
//!    upstream, or the adversarial shapes: the costliest legal requests;
//!    the values rotate from request to request over the pool's own),
//!    anonymous (`AuthSchemes` `none`; with `--registry-clients N`,
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
//! extraction script (`INFO commandstats` `usec` / `calls` of `fcall` and `evalsha`, and
//! `INFO cpu` per call) over exactly the timed rounds, the trivial script's
//! the same way over its own windows, and the bench's own CPU time per
//! request (handler + redis-rs + tokio, from `/proc/self/task/*/schedstat`).
//! It also reads `SLOWLOG` (set to keep calls of 1 ms or more) for the
//! longest extraction call, and has another client `PING` Redis every
//! millisecond ([`pinger`]) for the longest any bystander waited. Each
//! cell's cost is also read against the unfiltered count=1 cell of the same
//! run, and its answers are counted by HTTP status.
//!
//! `--stall` runs something else: the stale-backlog timeline ([`stall`]).
//!
//! The parts, one concern each: [`plan`] (what to measure: the matrix and
//! its arguments), [`filters`] (the filter sets a cell's requests carry:
//! the one place a new set is added), [`fill`] (the pool generator:
//! filling, top-ups, the registry's clients), [`caller`] (a request in
//! process or over HTTP), [`replicas`] (replicas behind relays that delay
//! replication), [`cell`] (the cell runner: rounds, the trivial-script
//! baseline, Redis's counters), [`pinger`] (the bystander's `PING`),
//! [`report`] (cells, fills, the table, progress) and [`stall`] (the
//! stale-backlog timeline).

mod caller;
mod cell;
mod fill;
mod filters;
mod pinger;
mod plan;
mod replicas;
mod report;
mod stall;
mod steady;
mod writers;

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use proxy_pool::config::Config;
use proxy_pool::distribution::App;
use proxy_pool::local::{LocalError, PoolShape, RedisServer, Relay};
use proxy_pool::pool::{PoolConnection, PoolError, RedisOptions, RedisPool};
use proxy_pool::security::{
    AuthSchemes, Directory, Guard, RedisRegistry, RegistryHandle, SourcePolicy,
};
use proxy_pool::server;
use redis::Script;
use tokio::task::JoinSet;

use crate::CliResult;
use crate::cli::BenchArgs;
use crate::output::say;
use caller::Front;
use cell::info_field;
pub use filters::FilterSet;
use pinger::Pinger;
pub use plan::parse_size;
use plan::{Plan, ScriptCalls, StallPlan, SteadyPlan};
use replicas::{RelayThread, Variant, start_replicas};
use report::{Fill, Progress, Report, human, peak_rss_kib, relate, row};

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
        // Sets may share shapes (each starts with `none`): each runs once.
        plan.filters.clear();
        for shape in args.filters.into_iter().flat_map(|set| set.0) {
            if !plan.filters.contains(&shape) {
                plan.filters.push(shape);
            }
        }
    }
    let args_counts = args.counts.clone();
    if !args.counts.is_empty() {
        plan.counts = args.counts;
    }
    let args_concurrency = args.concurrency.clone();
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
    plan.script_calls = if args.compare_evalsha {
        vec![ScriptCalls::Fcall, ScriptCalls::Evalsha]
    } else if args.evalsha {
        vec![ScriptCalls::Evalsha]
    } else {
        vec![ScriptCalls::Fcall]
    };
    plan.all_or_nothing = args.all_or_nothing;
    plan.adversarial_heads = args.adversarial_heads;
    plan.pace = args.pace;
    plan.ping_every_ms = args.ping_every_ms.unwrap_or(plan.ping_every_ms);
    if let Some(rate) = &args.client_rate {
        proxy_pool::security::Rate::parse(rate).map_err(|e| format!("--client-rate: {e}"))?;
        plan.client_rate = Some(rate.clone());
    }
    if plan.pace.is_some_and(|p| p.is_nan() || p <= 0.0) {
        return Err("--pace must be > 0".into());
    }
    if args.stall {
        let n = plan.sizes.first().copied().unwrap_or(1_000_000);
        let mut stall = StallPlan::for_pool(n);
        stall.after_seconds = args.stall_after.unwrap_or(stall.after_seconds);
        stall.lead_seconds = stall.lead_seconds.min((stall.after_seconds / 3.0) as u64);
        stall.seconds = args.stall_seconds.unwrap_or(stall.seconds);
        stall.fresh_per_sec = args.fresh_per_sec.unwrap_or(stall.fresh_per_sec);
        stall.prune_every = args.prune_every.unwrap_or(stall.prune_every);
        stall.clients = plan.concurrency.first().copied().unwrap_or(stall.clients);
        if stall.after_seconds.is_nan()
            || stall.after_seconds <= 0.0
            || stall.seconds == 0
            || plan.replicas > 0
        {
            return Err(
                "--stall: --stall-after and --stall-seconds must be > 0, and no --replicas".into(),
            );
        }
        plan.stall = Some(stall);
    } else if args.stall_after.is_some()
        || args.stall_seconds.is_some()
        || args.fresh_per_sec.is_some()
        || args.prune_every.is_some()
    {
        return Err(
            "--stall-after, --stall-seconds, --fresh-per-sec and --prune-every go with --stall"
                .into(),
        );
    }
    if args.steady {
        let n = plan.sizes.first().copied().unwrap_or(1_000_000);
        let mut steady = SteadyPlan::for_pool(n);
        if !args.steady_rates.is_empty() {
            steady.rates = args.steady_rates;
        }
        steady.step_seconds = args.step_seconds.unwrap_or(steady.step_seconds);
        steady.quiet_seconds = args.quiet_seconds.unwrap_or(steady.quiet_seconds);
        steady.refresh_per_sec = args.refresh_per_sec.unwrap_or(steady.refresh_per_sec);
        steady.health_per_sec = args.health_per_sec.unwrap_or(steady.health_per_sec);
        steady.health_fail_share = args.health_fail_share.unwrap_or(steady.health_fail_share);
        steady.worker_cycles_per_sec = args.worker_cycles.unwrap_or(steady.worker_cycles_per_sec);
        steady.job_every = args.job_every.unwrap_or(steady.job_every);
        if let Some(&c) = args_concurrency.first() {
            steady.clients = c;
        }
        if !args_counts.is_empty() {
            steady.counts = args_counts;
        }
        if steady.rates.contains(&0)
            || steady.step_seconds < 2
            || steady.quiet_seconds < 2
            || !(0.0..=1.0).contains(&steady.health_fail_share)
            || plan.replicas > 0
        {
            return Err(
                "--steady: rates > 0, --step-seconds and --quiet-seconds >= 2, --health-fail-share 0..=1, and no --replicas"
                    .into(),
            );
        }
        plan.steady = Some(steady);
    } else if !args.steady_rates.is_empty()
        || args.step_seconds.is_some()
        || args.quiet_seconds.is_some()
        || args.refresh_per_sec.is_some()
        || args.health_per_sec.is_some()
        || args.health_fail_share.is_some()
        || args.worker_cycles.is_some()
        || args.job_every.is_some()
    {
        return Err("--steady-rates, --step-seconds, --quiet-seconds, --refresh-per-sec, --health-per-sec, --health-fail-share, --worker-cycles and --job-every go with --steady".into());
    }
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
    if plan.steady.is_some() {
        let report = steady::run(plan, target, progress).await?;
        if args.json {
            say!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            say!("{}", report.table().trim_end());
        }
        return Ok(());
    }
    if plan.stall.is_some() {
        let timeline = stall::run(plan, target, progress).await?;
        if args.json {
            say!("{}", serde_json::to_string_pretty(&timeline)?);
        } else {
            say!("{}", timeline.table().trim_end());
        }
        return Ok(());
    }
    let report = run(plan, target, progress).await?;
    if args.json {
        say!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        say!("{}", report.table().trim_end());
    }
    Ok(())
}

/// What a timeline (`--stall`, `--steady`) runs on: the bench on its
/// Redis (a private `redis-server` unless `--redis-url`, alive as long as
/// `private`), with a bystander's `PING` read second by second, emptied
/// and set to the plan's first pool size and shape.
struct Stage {
    bench: Bench,
    url: String,
    redis_version: String,
    n: usize,
    shape: PoolShape,
    private: Option<RedisServer>,
}

async fn stage(plan: &Plan, target: Target, progress: Progress) -> Result<Stage, BenchError> {
    let mut private = None;
    let url = match target {
        Target::Private => {
            let server = RedisServer::start().await?;
            let url = server.url();
            private = Some(server);
            url
        }
        Target::Url(url) => url,
    };
    let pinging = Plan {
        ping_every_ms: plan.ping_every_ms.max(1),
        ..plan.clone()
    };
    let (bench, redis_version) = Bench::new(&pinging, &url, Vec::new(), progress).await?;
    let n = plan.sizes.first().copied().unwrap_or(1_000_000);
    let shape = plan
        .combinations
        .first()
        .copied()
        .unwrap_or(PoolShape::SMALL);
    bench.flush().await?;
    bench.set_shape(shape);
    Ok(Stage {
        bench,
        url,
        redis_version,
        n,
        shape,
        private,
    })
}

/// Sleeps until the wall clock reads `ms` (Unix ms).
async fn sleep_until_ms(ms: i64) {
    let wait = ms - proxy_pool::clock::now_ms();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait as u64)).await;
    }
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

/// Where the pool lives during the run.
pub enum Target {
    /// A private `redis-server` started for the run.
    Private,
    /// An existing Redis whose current database the bench may flush.
    Url(String),
}

/// Everything a run shares.
struct Bench {
    /// Handlers, one per (`replica_acks`, `script_calls`) pair of the plan.
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
    adversarial_heads: bool,
    shape: std::sync::Mutex<PoolShape>,
    /// Another client's `PING` (with `ping_every_ms`).
    pinger: Option<Pinger>,
}

impl Bench {
    /// The handlers `plan` asks for (one per `replica_acks` value and way
    /// of calling the scripts, in process or behind `serve`'s server) on
    /// the Redis at `url`, and
    /// Redis's version.
    async fn new(
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
    let (replica_servers, relays): (Vec<_>, Vec<_>) = replicas.into_iter().unzip();
    let (mut bench, redis_version) = Bench::new(&plan, &url, relays, progress).await?;
    let slowlog = SlowlogConfig::set(&bench.conn).await;
    let mut fills = Vec::new();
    let mut cells = Vec::new();
    for &n in &plan.sizes {
        for &shape in &plan.combinations {
            bench.flush().await?;
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
            let before = bench.server_stats().await?;
            bench.add(n, true, None).await?;
            let seconds = started.elapsed().as_secs_f64();
            let fill_usec = bench.server_stats().await?.script_usec - before.script_usec;
            bench.progress.note(format!(
                "filled {} proxies over {} combinations in {seconds:.1} s ({:.0}/s)",
                human(n),
                shape.combinations(),
                n as f64 / seconds
            ));
            // The fill's own calls fill SLOWLOG (~36 MB at 1M): forgotten
            // first, so the figure is the pool's.
            bench.forget_slow_calls().await;
            let memory: String = redis::cmd("INFO")
                .arg("memory")
                .query_async(&mut bench.conn.clone())
                .await?;
            let used = info_field(&memory, "used_memory").and_then(|v| v.parse::<f64>().ok());
            let writers = bench.writers(n, fill_usec).await?;
            bench.progress.note(format!(
                "writers, Redis time a proxy: fill {:.1} us, refresh {:.1} us, health result {:.1} us in batches ({:.1} us alone): recording {} proxies within {} s takes {:.1}% of Redis",
                writers.fill_us,
                writers.refresh_us,
                writers.health_batched_us,
                writers.health_single_us,
                human(n),
                writers::HEALTH_AGE.as_secs(),
                100.0 * writers.health_share
            ));
            fills.push(Fill {
                pool: n,
                combinations: shape,
                seconds,
                per_sec: n as f64 / seconds,
                redis_bytes_per_proxy: used.map(|b| b / n as f64),
                writers,
            });
            bench.register_clients().await?;
            let total = plan.filters.len()
                * plan.counts.len()
                * plan.concurrency.len()
                * plan.replica_lags_ms.len()
                * plan.replica_acks.len()
                * plan.script_calls.len();
            bench.progress.start(
                total as u64,
                format!("N={}, {} combinations", human(n), shape.combinations()),
            );
            for &lag_ms in &plan.replica_lags_ms {
                for (a, &acks) in plan.replica_acks.iter().enumerate() {
                    for &filter in &plan.filters {
                        for &count in &plan.counts {
                            for &c in &plan.concurrency {
                                // The ways of calling the scripts back to back.
                                for (s, &calls) in plan.script_calls.iter().enumerate() {
                                    let app = a * plan.script_calls.len() + s;
                                    bench.set_variant(Variant {
                                        lag_ms,
                                        acks,
                                        calls,
                                        app,
                                    });
                                    let cell = bench.cell(&plan, n, filter, count, c).await?;
                                    bench.progress.note(row(&cell, &plan));
                                    bench.progress.inc(1);
                                    cells.push(cell);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    bench.progress.finish();
    relate(&mut cells);
    slowlog.restore(&bench.conn).await;
    bench.flush().await?;
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

/// The configuration the bench's handlers run with: anonymous callers (or
/// API keys of the registry's clients), rate limits off unless
/// `--client-rate`, and a health-check age that outlasts the run.
fn bench_config(plan: &Plan, url: &str) -> Result<Config, BenchError> {
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
        // The pool is filled once per N and the run lasts minutes: its health
        // checks must stay fresh for the whole run (and with --stall, the
        // fill's go stale together, see stall.rs).
        max_health_check_age: Duration::from_secs(3600),
        // The fill's and the bench's own calls; each handler has its own.
        redis_functions: plan.script_calls.first() != Some(&ScriptCalls::Evalsha),
        ..Config::default()
    })
}

/// `SLOWLOG` set to keep every call of 1 ms or more (up to 32,768 between
/// two reads), and what it was before, put back at the end of a run.
pub(super) struct SlowlogConfig {
    before: Vec<(String, String)>,
}

impl SlowlogConfig {
    const SETTINGS: [(&'static str, &'static str); 2] = [
        ("slowlog-log-slower-than", "1000"),
        ("slowlog-max-len", "32768"),
    ];

    /// Sets it (a Redis that refuses `CONFIG` is left as it is: the slowest
    /// calls are then reported from what it keeps, if anything).
    pub(super) async fn set(conn: &PoolConnection) -> Self {
        let mut before = Vec::new();
        for (name, value) in Self::SETTINGS {
            let mut conn = conn.clone();
            let old: Result<Vec<String>, _> = redis::cmd("CONFIG")
                .arg("GET")
                .arg(name)
                .query_async(&mut conn)
                .await;
            let set: Result<(), _> = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut conn)
                .await;
            if let (Ok(old), Ok(())) = (old, set)
                && let Some(old) = old.get(1)
            {
                before.push((name.to_owned(), old.clone()));
            }
        }
        Self { before }
    }

    pub(super) async fn restore(self, conn: &PoolConnection) {
        for (name, value) in self.before {
            let _: Result<(), _> = redis::cmd("CONFIG")
                .arg("SET")
                .arg(name)
                .arg(value)
                .query_async(&mut conn.clone())
                .await;
        }
    }
}
