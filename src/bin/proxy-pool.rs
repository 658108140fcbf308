//! `proxy-pool`: run the Distribution function locally and operate the pool.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use proxy_pool::bench::{Plan, Progress, Target as BenchRedis};
use proxy_pool::config::Config;
use proxy_pool::distribution::{App, EXTRACT_PATH};
use proxy_pool::local::{RedisServer, demo_proxies};
use proxy_pool::pool::{ContractOp, MAX_PRUNE_BATCH, NewProxy, RedisPool, UpsertStatus, Verdict};
use proxy_pool::secrets::{RegistrySource, SecretStore, start_registry};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{ClientRegistry, Guard, RegistryHandle};

#[derive(Parser)]
#[command(version, about = "Proxy Pool Distribution function, outside Lambda")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the Distribution API over plain HTTP. Without a Redis URL it
    /// starts a private redis-server with a demo pool.
    Serve {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8081")]
        listen: SocketAddr,
        /// Redis holding the pool (default: PROXY_POOL_REDIS_URL, else a private one).
        #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
        redis_url: Option<String>,
        /// Demo proxies loaded into the private Redis.
        #[arg(long, default_value_t = 300)]
        demo_size: usize,
        /// Client registry document (JSON, see README). Default with the
        /// private Redis: one demo client with a fresh API key, printed.
        #[arg(long)]
        clients: Option<std::path::PathBuf>,
    },
    /// Print the pool's inventory: per bucket, the proxies extraction could
    /// draw from, and the number held by Gateway Workers.
    Stats {
        /// Redis holding the pool.
        #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
        redis_url: String,
        /// Minimum remaining TTL counted as eligible (default: PROXY_POOL_MIN_REMAINING_TTL_SECONDS).
        #[arg(long)]
        min_remaining_ttl_seconds: Option<u64>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove proxies whose TTL life is over, and index entries past their
    /// safety margin or PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS, in bounded batches.
    Prune {
        /// Redis holding the pool.
        #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
        redis_url: String,
    },
    /// Record a health check result (the health checker).
    Health {
        #[command(flatten)]
        target: Target,
        /// The check passed (else failed).
        #[arg(long)]
        ok: bool,
        /// When it ran, RFC 3339 (default: the Redis clock now).
        #[arg(long)]
        checked_at: Option<String>,
    },
    /// A Gateway Worker claims an allocatable, eligible proxy; prints the epoch.
    Claim {
        #[command(flatten)]
        target: Target,
        /// The Worker.
        #[arg(long)]
        worker: String,
        /// The Gateway's minimum remaining TTL.
        #[arg(long, default_value_t = 30)]
        min_remaining_ttl_seconds: u64,
        /// The Gateway's oldest acceptable health check.
        #[arg(long, default_value_t = 120)]
        max_health_check_age_seconds: u64,
    },
    /// The Controller publishes DRAINING for a Worker's proxy.
    Drain {
        #[command(flatten)]
        holder: Holder,
    },
    /// A Worker reports its Active/Reserved use of a DRAINING proxy (0 and 0: DRAINED).
    Ack {
        #[command(flatten)]
        holder: Holder,
        /// Connections in use.
        #[arg(long)]
        active: u32,
        /// Connections reserved.
        #[arg(long)]
        reserved: u32,
    },
    /// Clear the ownership of a DRAINED proxy (it becomes AVAILABLE).
    Release {
        #[command(flatten)]
        holder: Holder,
    },
    /// Delete a proxy from the pool.
    Remove {
        #[command(flatten)]
        target: Target,
    },
    /// Print the registry entry (`sha256:...`) for an API key, bearer token
    /// or Basic password read from standard input, or for a new one.
    HashCredential {
        /// Make a new random secret, print it and its hash.
        #[arg(long)]
        generate: bool,
        /// Hash a Basic password for this user (as `user:password`).
        #[arg(long)]
        basic_user: Option<String>,
    },
    /// Add or refresh proxies from JSON Lines (one proxy a line; `-` = stdin).
    Load {
        /// Redis holding the pool.
        #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
        redis_url: String,
        /// The JSON Lines file, or `-` for standard input.
        file: String,
    },
    /// Add (or refresh) the demo pool `serve` starts with: synthetic proxies on
    /// TEST-NET addresses, the pool `events/README.md` documents outcomes for.
    LoadDemo {
        /// Redis holding the pool.
        #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
        redis_url: String,
        /// Demo proxies to load.
        #[arg(long, default_value_t = 300)]
        size: usize,
    },
    /// Measure extraction throughput and latency through the real handler
    /// against a trivial EVALSHA on the same Redis (see README, Performance).
    /// Build with --release.
    Bench {
        /// Use this Redis instead of a private one. Its current database is
        /// FLUSHED before and after, so --flush must be given too.
        #[arg(long)]
        redis_url: Option<String>,
        /// Allow the bench to FLUSHDB the Redis named by --redis-url.
        #[arg(long)]
        flush: bool,
        /// Pool sizes (e.g. 1k,100k,1M; default 1M).
        #[arg(long, value_delimiter = ',', value_parser = proxy_pool::bench::parse_size)]
        sizes: Vec<usize>,
        /// Pool shapes, as protocol x region x carrier x upstream
        /// combinations: 18, or a multiple of 27 for a city-keyed pool
        /// (default 18,2700,10800).
        #[arg(long, value_delimiter = ',', value_parser = proxy_pool::bench::PoolShape::parse)]
        combinations: Vec<proxy_pool::bench::PoolShape>,
        /// Filter shapes: none, region, region-carrier, protocol-upstream (default all).
        #[arg(long, value_delimiter = ',', value_parser = proxy_pool::bench::FilterShape::parse)]
        filters: Vec<proxy_pool::bench::FilterShape>,
        /// Proxies per request (e.g. 1,10,100).
        #[arg(long, value_delimiter = ',')]
        counts: Vec<u32>,
        /// Concurrent tasks (e.g. 1,8,64; default 8).
        #[arg(long, value_delimiter = ',')]
        concurrency: Vec<usize>,
        /// Timed extraction seconds per cell (default 1.5; --quick 0.3).
        #[arg(long)]
        seconds: Option<f64>,
        /// Most timed requests per cell (default 20000; --quick 300).
        #[arg(long)]
        max_requests: Option<usize>,
        /// Trivial EVALSHA seconds per cell, half before and half after (default 1; --quick 0.2).
        #[arg(long)]
        baseline_seconds: Option<f64>,
        /// Send a fresh Idempotency-Key with every request (the script then
        /// also reads and writes the idempotency record).
        #[arg(long)]
        idempotency: bool,
        /// A smoke run: N=1k, 18 combinations, no filters, counts 1,10, C 1,8,
        /// a few hundred requests per cell.
        #[arg(long)]
        quick: bool,
        /// Print the report as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// The pool and the proxy a contract operation is about.
#[derive(clap::Args)]
struct Target {
    /// Redis holding the pool.
    #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
    redis_url: String,
    /// The proxy id.
    id: String,
}

/// A proxy and the holder an ownership operation names (fencing).
#[derive(clap::Args)]
struct Holder {
    #[command(flatten)]
    target: Target,
    /// The Worker believed to hold it.
    #[arg(long)]
    worker: String,
    /// The epoch its claim returned.
    #[arg(long)]
    epoch: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Bench { .. }) {
        proxy_pool::telemetry::init_discarding();
    } else {
        proxy_pool::telemetry::init(false);
    }
    let result = match cli.command {
        Command::Serve {
            listen,
            redis_url,
            demo_size,
            clients,
        } => serve(listen, redis_url, demo_size, clients).await,
        Command::HashCredential {
            generate,
            basic_user,
        } => hash_credential(generate, basic_user),
        Command::Load { redis_url, file } => load(&redis_url, &file).await,
        Command::LoadDemo { redis_url, size } => load_demo(&redis_url, size).await,
        Command::Stats {
            redis_url,
            min_remaining_ttl_seconds,
            json,
        } => stats(&redis_url, min_remaining_ttl_seconds, json).await,
        Command::Prune { redis_url } => prune(&redis_url).await,
        Command::Health {
            target,
            ok,
            checked_at,
        } => match checked_at.as_deref().map(parse_time).transpose() {
            Ok(checked_at) => {
                let op = ContractOp::Health {
                    id: target.id.clone(),
                    ok,
                    checked_at,
                };
                contract(&target, op).await
            }
            Err(e) => Err(e),
        },
        Command::Claim {
            target,
            worker,
            min_remaining_ttl_seconds,
            max_health_check_age_seconds,
        } => {
            let op = ContractOp::Claim {
                id: target.id.clone(),
                worker,
                min_remaining_ttl: Duration::from_secs(min_remaining_ttl_seconds),
                max_health_check_age: Duration::from_secs(max_health_check_age_seconds),
            };
            contract(&target, op).await
        }
        Command::Drain { holder } => {
            let op = ContractOp::Drain {
                id: holder.target.id.clone(),
                worker: holder.worker,
                epoch: holder.epoch,
            };
            contract(&holder.target, op).await
        }
        Command::Ack {
            holder,
            active,
            reserved,
        } => {
            let op = ContractOp::Ack {
                id: holder.target.id.clone(),
                worker: holder.worker,
                epoch: holder.epoch,
                active,
                reserved,
            };
            contract(&holder.target, op).await
        }
        Command::Release { holder } => {
            let op = ContractOp::Release {
                id: holder.target.id.clone(),
                worker: holder.worker,
                epoch: holder.epoch,
            };
            contract(&holder.target, op).await
        }
        Command::Remove { target } => {
            let op = ContractOp::Remove {
                id: target.id.clone(),
            };
            contract(&target, op).await
        }
        Command::Bench {
            redis_url,
            flush,
            sizes,
            combinations,
            filters,
            counts,
            concurrency,
            seconds,
            max_requests,
            baseline_seconds,
            idempotency,
            quick,
            json,
        } => {
            let mut plan = if quick { Plan::quick() } else { Plan::full() };
            if !sizes.is_empty() {
                plan.sizes = sizes;
            }
            if !combinations.is_empty() {
                plan.combinations = combinations;
            }
            if !filters.is_empty() {
                plan.filters = filters;
            }
            if !counts.is_empty() {
                plan.counts = counts;
            }
            if !concurrency.is_empty() {
                plan.concurrency = concurrency;
            }
            plan.seconds = seconds.unwrap_or(plan.seconds);
            plan.max_requests = max_requests.unwrap_or(plan.max_requests);
            plan.baseline_seconds = baseline_seconds.unwrap_or(plan.baseline_seconds);
            plan.idempotency = idempotency;
            bench(plan, redis_url, flush, json).await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("proxy-pool: {e}");
            ExitCode::FAILURE
        }
    }
}

type CliResult = Result<(), Box<dyn std::error::Error>>;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

async fn serve(
    listen: SocketAddr,
    redis_url: Option<String>,
    demo_size: usize,
    clients: Option<std::path::PathBuf>,
) -> CliResult {
    let mut config = Config::from_env()?;
    // The private Redis lives as long as this function: dropped, it is killed.
    let mut private = None;
    let (url, origin) = match redis_url {
        Some(url) => (url, "your Redis".to_owned()),
        None => {
            let server = RedisServer::start().await?;
            let url = server.url();
            // The private Redis is one server without replicas.
            config.redis_cluster = false;
            config.replica_acks = 0;
            let origin = format!(
                "a private redis-server on 127.0.0.1:{} with {demo_size} demo proxies (TEST-NET addresses)",
                server.port()
            );
            private = Some(server);
            (url, origin)
        }
    };
    config.redis_url = Some(url.clone());
    let pool = RedisPool::with_options(&url, &config.redis_options())?;
    if private.is_some() {
        pool.upsert(&demo_proxies(demo_size, now_ms())).await?;
        tokio::spawn(refresh_demo(pool.clone(), demo_size));
    }
    let mut demo_key = None;
    let registry = if !config.auth_schemes.need_registry() {
        RegistryHandle::default()
    } else if let Some(path) = clients {
        let source = RegistrySource::File(path);
        // Locally a bad file is an error now, not a 503 later.
        let first = source.load().await?;
        let handle = start_registry(source, config.clients_refresh).await;
        handle.replace(first);
        handle
    } else if let Some(id) = config.clients_secret_id.clone() {
        let store = SecretStore::from_env().await;
        start_registry(RegistrySource::Secret { store, id }, config.clients_refresh).await
    } else if private.is_some() {
        let (key, registry) = demo_registry()?;
        demo_key = Some(key);
        RegistryHandle::with(registry)
    } else {
        return Err("serve needs --clients FILE or PROXY_POOL_CLIENTS_SECRET_ID (or PROXY_POOL_AUTH_SCHEMES=none)".into());
    };
    let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry);
    let app = Arc::new(App::new(config.settings(), pool, Arc::new(guard)));
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let addr = listener.local_addr()?;
    println!("proxy-pool serve: listening on http://{addr}, pool in {origin}");
    let key_header = match &demo_key {
        Some(key) => format!(" -H 'X-API-Key: {key}'"),
        None => String::new(),
    };
    println!(
        "try: curl -s -X POST http://{addr}{EXTRACT_PATH}{key_header} -H 'Content-Type: application/json' -H 'Idempotency-Key: demo-0001' -d '{{\"count\":2,\"filters\":{{\"protocols\":[\"http\"]}}}}'"
    );
    println!("stop with Ctrl-C");
    let _ = std::io::stdout().flush();
    proxy_pool::server::serve(listener, app, shutdown_signal()).await?;
    drop(private);
    println!("proxy-pool serve: stopped");
    Ok(())
}

fn parse_time(s: &str) -> Result<i64, Box<dyn std::error::Error>> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|_| "--checked-at must be an RFC 3339 timestamp")?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// The settings and a pool over `redis_url`, connected as every command
/// connects (cluster mode, CA file, timeouts from the environment).
fn operator_pool(redis_url: &str) -> Result<(Config, RedisPool), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let pool = RedisPool::with_options(redis_url, &config.redis_options())?;
    Ok((config, pool))
}

/// Runs one contract operation and prints its verdict; a refusal is an error
/// (exit status 1), so scripts can test for it.
async fn contract(target: &Target, op: ContractOp) -> CliResult {
    let (_, pool) = operator_pool(&target.redis_url)?;
    let reply = pool.apply(&op).await?;
    match reply.verdict {
        Verdict::Ok => {
            println!("ok {} (epoch {})", target.id, reply.epoch);
            Ok(())
        }
        refused => Err(format!(
            "refused: {} ({}, epoch {})",
            refused.as_str(),
            target.id,
            reply.epoch
        )
        .into()),
    }
}

async fn prune(redis_url: &str) -> CliResult {
    let (config, pool) = operator_pool(redis_url)?;
    let report = pool
        .prune_expired(MAX_PRUNE_BATCH, u32::MAX, config.max_health_check_age)
        .await?;
    println!(
        "pruned {} expired proxies and {} index entries in {} calls",
        report.records, report.index_entries, report.batches
    );
    Ok(())
}

async fn stats(redis_url: &str, min_ttl: Option<u64>, json: bool) -> CliResult {
    let (config, pool) = operator_pool(redis_url)?;
    let min_ttl = min_ttl.map_or(config.min_remaining_ttl, Duration::from_secs);
    let inventory = pool.inventory(min_ttl).await?;
    let eligible: u64 = inventory.buckets.iter().map(|b| b.eligible).sum();
    let indexed: u64 = inventory.buckets.iter().map(|b| b.indexed).sum();
    if json {
        let doc = serde_json::json!({
            "at": proxy_pool::clock::rfc3339(inventory.at_ms),
            "minRemainingTtlSeconds": min_ttl.as_secs(),
            "eligible": eligible,
            "indexed": indexed,
            "heldByWorkers": inventory.held,
            "buckets": inventory.buckets,
        });
        println!("{doc:#}");
        return Ok(());
    }
    let rows: Vec<[String; 6]> = inventory
        .buckets
        .iter()
        .map(|b| {
            [
                b.upstream.clone(),
                b.protocol.clone(),
                b.region.clone(),
                b.carrier.clone(),
                b.eligible.to_string(),
                b.indexed.to_string(),
            ]
        })
        .collect();
    let header = [
        "upstream", "protocol", "region", "carrier", "eligible", "indexed",
    ]
    .map(String::from);
    let mut widths = header.clone().map(|h| h.len());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i >= 4 {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        println!("{}", cells.join("  ").trim_end());
    }
    println!(
        "eligible {eligible} of {indexed} allocatable (at least {}s left), held by Workers {}, at {}",
        min_ttl.as_secs(),
        inventory.held,
        proxy_pool::clock::rfc3339(inventory.at_ms)
    );
    Ok(())
}

/// A fresh random secret, `pp_` + 64 hex characters.
fn new_secret() -> Result<String, Box<dyn std::error::Error>> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    Ok(format!("pp_{}", hex::encode(bytes)))
}

/// One `demo` client holding a fresh API key (returned, to be printed).
fn demo_registry() -> Result<(String, ClientRegistry), Box<dyn std::error::Error>> {
    let key = new_secret()?;
    let doc = format!(
        r#"{{"clients":[{{"id":"demo","apiKeys":["{}"]}}]}}"#,
        CredentialHash::of(key.as_bytes()).encode()
    );
    Ok((key, ClientRegistry::parse(&doc)?))
}

fn hash_credential(generate: bool, basic_user: Option<String>) -> CliResult {
    let secret = if generate {
        let secret = new_secret()?;
        println!("secret: {secret}");
        secret
    } else {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        let secret = line.trim_end_matches(['\r', '\n']).to_owned();
        if secret.is_empty() {
            return Err("no secret on standard input".into());
        }
        secret
    };
    let material = match basic_user {
        Some(user) if user.contains(':') => {
            return Err("a Basic user name cannot contain ':'".into());
        }
        Some(user) => format!("{user}:{secret}"),
        None => secret,
    };
    println!("{}", CredentialHash::of(material.as_bytes()).encode());
    Ok(())
}

/// Plays the health checker for the demo pool: refreshes health and expiry
/// every minute, so the demo stays eligible for as long as serve runs.
async fn refresh_demo(pool: RedisPool, demo_size: usize) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = pool.upsert(&demo_proxies(demo_size, now_ms())).await {
            tracing::warn!(error = %e, "demo refresh failed");
        }
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("proxy-pool serve: shutting down, finishing open requests");
}

async fn load_demo(redis_url: &str, size: usize) -> CliResult {
    let (_, pool) = operator_pool(redis_url)?;
    let statuses = pool.upsert(&demo_proxies(size, now_ms())).await?;
    let count = |want: UpsertStatus| statuses.iter().filter(|s| **s == want).count();
    let added = count(UpsertStatus::Added);
    let refreshed = count(UpsertStatus::Refreshed);
    println!(
        "demo pool: added {added}, refreshed {refreshed}, refused {} (extracted in their current TTL life)",
        statuses.len() - added - refreshed
    );
    Ok(())
}

async fn bench(plan: Plan, redis_url: Option<String>, flush: bool, json: bool) -> CliResult {
    if plan.counts.iter().any(|c| !(1..=1000).contains(c))
        || plan.concurrency.iter().any(|c| !(1..=1024).contains(c))
        || !(plan.seconds > 0.0 && plan.baseline_seconds > 0.0)
        || plan.max_requests == 0
    {
        return Err(
            "counts must be 1..=1000, concurrency 1..=1024, seconds and requests > 0".into(),
        );
    }
    let target = match redis_url {
        Some(_) if !flush => {
            return Err(
                "--redis-url: the bench flushes that Redis database; add --flush to allow it"
                    .into(),
            );
        }
        Some(url) => BenchRedis::Url(url),
        None => BenchRedis::Private,
    };
    if cfg!(debug_assertions) {
        eprintln!("proxy-pool bench: this is a debug build; measure with --release");
    }
    let progress = Progress::new(std::io::stderr().is_terminal());
    let report = proxy_pool::bench::run(plan, target, progress).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// Lines parsed per upsert round trip.
const LOAD_BATCH: usize = 500;

async fn load(redis_url: &str, file: &str) -> CliResult {
    let (_, pool) = operator_pool(redis_url)?;
    let reader: Box<dyn BufRead> = if file == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(file).map_err(|e| format!("{file}: {e}"))?,
        ))
    };
    let progress = std::io::stderr().is_terminal();
    let mut tally = Tally::default();
    let mut batch: Vec<(usize, NewProxy)> = Vec::with_capacity(LOAD_BATCH);
    for (i, line) in reader.lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| format!("line {number}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        match NewProxy::from_json_line(&line, now_ms()) {
            Ok(p) => batch.push((number, p)),
            Err(why) => tally.reject(number, &why),
        }
        if batch.len() == LOAD_BATCH {
            tally.apply(&pool, &mut batch).await?;
            if progress {
                eprint!("\r{} lines read", number);
            }
        }
    }
    tally.apply(&pool, &mut batch).await?;
    if progress {
        eprintln!();
    }
    println!(
        "loaded {}, refreshed {}, rejected {}",
        tally.added, tally.refreshed, tally.rejected
    );
    Ok(())
}

#[derive(Default)]
struct Tally {
    added: usize,
    refreshed: usize,
    rejected: usize,
}

impl Tally {
    fn reject(&mut self, line: usize, why: &str) {
        self.rejected += 1;
        eprintln!("line {line}: skipped: {why}");
    }

    async fn apply(
        &mut self,
        pool: &RedisPool,
        batch: &mut Vec<(usize, NewProxy)>,
    ) -> Result<(), proxy_pool::pool::PoolError> {
        let proxies: Vec<NewProxy> = batch.iter().map(|(_, p)| p.clone()).collect();
        let statuses = pool.upsert(&proxies).await?;
        for ((line, _), status) in batch.iter().zip(statuses) {
            match status {
                UpsertStatus::Added => self.added += 1,
                UpsertStatus::Refreshed => self.refreshed += 1,
                UpsertStatus::Extracted => {
                    self.reject(*line, "already extracted in its current TTL life")
                }
                UpsertStatus::Expired => {
                    self.reject(*line, "already expired (or past its safety margin)")
                }
            }
        }
        batch.clear();
        Ok(())
    }
}
