//! The command line: every command and its arguments, what a command
//! returns, and the pool it works on.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use proxy_pool::config::Config;
use proxy_pool::local::PoolShape;
use proxy_pool::pool::{MAX_PRUNE_BATCH, PoolName, RedisPool};

use crate::bench::args::BenchArgs;
use crate::bench::plan::parse_size;
use crate::inventory::Dimension;

/// What every command returns: an error is printed and exits 1.
pub type CliResult = Result<(), Box<dyn std::error::Error>>;

/// `proxy-pool`.
#[derive(Parser)]
#[command(version, about = "Proxy Pool Distribution function, outside Lambda")]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands, grouped as the files that run them.
#[derive(Subcommand)]
pub enum Command {
    /// Serve the Distribution API over plain HTTP. Without a Redis URL it
    /// starts a private redis-server with a demo pool.
    Serve(ServeArgs),
    /// Print the pool's inventory: a summary line (eligible, expiring within
    /// 5 minutes, stale, held by Gateway Workers), then per combination
    /// (protocol, region, carrier, upstream) or per group (--by) the
    /// proxies extraction could draw from.
    Stats(StatsArgs),
    /// Remove proxies whose TTL life is over, and index entries past their
    /// safety margin or PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS, in bounded batches.
    Prune(PruneArgs),
    /// Record a health check result (the health checker); the id `-`:
    /// many, as JSON lines from standard input.
    Health(HealthArgs),
    /// A Gateway Worker claims an allocatable, eligible proxy; prints the
    /// epoch; the id `-`: many, as JSON lines.
    Claim(ClaimArgs),
    /// The Controller publishes DRAINING for a Worker's proxy; the id `-`:
    /// many, as JSON lines.
    Drain(HolderArgs),
    /// A Worker reports its Active/Reserved use of a DRAINING proxy (0 and
    /// 0: DRAINED); the id `-`: many, as JSON lines.
    Ack(AckArgs),
    /// Clear the ownership of a DRAINED proxy (it becomes AVAILABLE); the
    /// id `-`: many, as JSON lines.
    Release(HolderArgs),
    /// Delete a proxy from the pool; the id `-`: many, as JSON lines.
    Remove(TargetArgs),
    /// Load the function libraries into Redis (this build's and the public
    /// contract library) and print the public library's name, then its
    /// functions, one a line: prepares a Redis for a health checker or
    /// Controller in another language (docs/pool-contract.md).
    Functions(PoolArgs),
    /// Print the registry entry (`sha256:...`) for an API key, bearer token
    /// or Basic password read from standard input, or for a new one.
    HashCredential(HashCredentialArgs),
    /// Manage the Redis client registry (PROXY_POOL_CLIENT_REGISTRY=redis):
    /// add, rotate, revoke, list, import.
    #[command(subcommand)]
    Clients(ClientsCommand),
    /// Add or refresh proxies from JSON Lines (one proxy a line; `-` = stdin).
    Load(LoadArgs),
    /// Add (or refresh) the demo pool `serve` starts with: synthetic proxies on
    /// TEST-NET addresses, the pool `events/README.md` documents outcomes for.
    LoadDemo(LoadDemoArgs),
    /// Usage aggregates in PostgreSQL (see docs/operations.md, Usage aggregates).
    #[command(subcommand)]
    Aggregates(AggregatesCommand),
    /// Print the usage aggregates from PostgreSQL as a table: calls,
    /// requested, returned, 409 shortages and replays per client, hour or
    /// day; proxies handed out per upstream, protocol or region.
    Usage(UsageArgs),
    /// Measure extraction throughput and latency through the real handler
    /// against a trivial EVALSHA on the same Redis (see docs/performance.md).
    /// Build with --release.
    Bench(Box<BenchArgs>),
}

/// `aggregates …`.
#[derive(Subcommand)]
pub enum AggregatesCommand {
    /// Move closed hours of usage counters from Redis to PostgreSQL (what
    /// the scheduled invocation does in Lambda); safe to run again or
    /// concurrently: an hour is never counted twice.
    Flush(FlushArgs),
}

/// The aggregates database a command uses.
#[derive(Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (postgres://user:password@host/db?sslmode=require).
    /// Prefer the variable: a password on the command line is visible to
    /// other users. Without either, PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID.
    #[arg(
        long,
        env = "PROXY_POOL_AGGREGATES_DATABASE_URL",
        hide_env_values = true
    )]
    pub database_url: Option<String>,
}

/// `aggregates flush`.
#[derive(Args)]
pub struct FlushArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `usage`.
#[derive(Args)]
pub struct UsageArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Only this client (`anonymous` for anonymous callers).
    #[arg(long)]
    pub client: Option<String>,
    /// From this instant: RFC 3339, or a span back from now (`36h`, `30d`).
    #[arg(long)]
    pub since: Option<String>,
    /// Up to this instant (excluded), in the same forms.
    #[arg(long)]
    pub until: Option<String>,
    /// Group by any of hour, day, client, outcome, upstream, protocol,
    /// region, comma-separated (upstream, protocol and region count
    /// proxies; the others count calls). Default: client.
    #[arg(long, value_delimiter = ',', default_value = "client")]
    pub by: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `clients ...`.
#[derive(Subcommand)]
pub enum ClientsCommand {
    /// Register a client with a new API key (printed once; only its digest is stored).
    Add(ClientAddArgs),
    /// Give a client a new API key (printed once); its other API keys stop
    /// working at once unless --keep-old.
    Rotate(ClientRotateArgs),
    /// Remove a client and every credential it holds, at once.
    Revoke(ClientIdArgs),
    /// Print every client (digests counted, never shown; --json: a registry document).
    List(ClientListArgs),
    /// Add or replace every client of a registry document (FILE or `-` for stdin).
    Import(ClientImportArgs),
}

/// `clients add`.
#[derive(Args)]
pub struct ClientAddArgs {
    #[command(flatten)]
    pub target: ClientIdArgs,
    /// Upstreams it may use, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    pub upstreams: Option<Vec<String>>,
    /// Source CIDRs it may call from, comma-separated (default: any).
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<String>,
    /// Its rate limit, RATE[:BURST] or `off` (default: PROXY_POOL_CLIENT_RATE).
    #[arg(long)]
    pub rate: Option<String>,
    /// Its cap on `count`.
    #[arg(long)]
    pub max_count: Option<u32>,
}

/// `clients rotate`.
#[derive(Args)]
pub struct ClientRotateArgs {
    #[command(flatten)]
    pub target: ClientIdArgs,
    /// Keep its current API keys too (retire them later with another rotate).
    #[arg(long)]
    pub keep_old: bool,
}

/// The registry and the client a command is about.
#[derive(Args)]
pub struct ClientIdArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// The client id.
    pub id: String,
}

/// `clients list`.
#[derive(Args)]
pub struct ClientListArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Print the registry document (JSON) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `clients import`.
#[derive(Args)]
pub struct ClientImportArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// The registry document (`-`: standard input).
    pub file: PathBuf,
}

/// `serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,
    /// Redis holding the pool (default: PROXY_POOL_REDIS_URL, else a private one).
    #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
    pub redis_url: Option<String>,
    /// The pool's name: its keys' hash tag (1-32 of A-Z a-z 0-9 _ -).
    #[arg(long, env = "PROXY_POOL_NAME", default_value = PoolName::DEFAULT)]
    pub pool_name: PoolName,
    /// Demo proxies loaded into the private Redis.
    #[arg(long, default_value_t = 300)]
    pub demo_size: usize,
    /// Client registry document (JSON, see docs/operations.md, The client
    /// registry). Default with the private Redis: one demo client with a
    /// fresh API key, printed.
    #[arg(long)]
    pub clients: Option<PathBuf>,
    /// Seconds a request's headers may take to arrive (from the connection's
    /// start for its first request, from the first byte for later ones).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout: u64,
    /// Seconds a keep-alive connection may wait for its next request.
    #[arg(long, value_name = "SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout: u64,
    /// Seconds a request's body may take to arrive after its headers.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_read_timeout: u64,
    /// Connections open at once; more wait in the listen backlog (keep the
    /// file descriptor limit, ulimit -n, above it).
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
}

/// The pool a command works on.
#[derive(Args)]
pub struct PoolArgs {
    /// Redis holding the pool.
    #[arg(long, env = "PROXY_POOL_REDIS_URL", hide_env_values = true)]
    pub redis_url: String,
    /// The pool's name: its keys' hash tag (1-32 of A-Z a-z 0-9 _ -).
    #[arg(long, env = "PROXY_POOL_NAME", default_value = PoolName::DEFAULT)]
    pub pool_name: PoolName,
}

/// The settings and a pool over the given Redis, connected as every
/// command connects (cluster mode, CA file, timeouts from the environment).
pub fn operator_pool(args: &PoolArgs) -> Result<(Config, RedisPool), Box<dyn std::error::Error>> {
    let mut config = Config::from_env()?;
    config.pool_name = args.pool_name.clone();
    let pool = RedisPool::with_options(&args.redis_url, &config.redis_options())?;
    Ok((config, pool))
}

/// `prune`.
#[derive(Args)]
pub struct PruneArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Entries each script call examines per sweep, 1-1000 (the scheduled
    /// job uses 128: shorter calls, more of them).
    #[arg(
        long,
        default_value_t = MAX_PRUNE_BATCH,
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PRUNE_BATCH))
    )]
    pub batch: u32,
}

/// `stats`.
#[derive(Args)]
pub struct StatsArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Group and total by these dimensions, comma-separated (e.g.
    /// upstream or region,carrier), instead of one row per combination.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub by: Vec<Dimension>,
    /// Only the N rows (groups, or combinations) with the most eligible
    /// proxies, then one line summing the others.
    #[arg(long, value_name = "N")]
    pub top: Option<usize>,
    /// Print JSON instead of a table: every combination, the totals, and
    /// the groups with --by.
    #[arg(long)]
    pub json: bool,
}

/// The pool and the proxy a contract operation is about.
#[derive(Args)]
pub struct TargetArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// The proxy id, or `-`: operations as JSON lines from standard
    /// input, applied in batches, with a summary of refusals by reason.
    pub id: String,
}

/// `health` (the id `-`: results as JSON lines from standard input,
/// `{"id":…,"ok":true,"checkedAt":"<RFC 3339>"}`, recorded in batches).
#[derive(Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The check passed (else failed).
    #[arg(long)]
    pub ok: bool,
    /// When it ran, RFC 3339 (default: the Redis clock now).
    #[arg(long)]
    pub checked_at: Option<String>,
}

/// `claim` (the id `-`: claims as JSON lines from standard input,
/// `{"id":…,"worker":…}`, each claim's epoch printed).
#[derive(Args)]
pub struct ClaimArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The Worker (required unless the id is `-`: JSON lines then).
    #[arg(long)]
    pub worker: Option<String>,
    /// The Gateway's minimum remaining TTL.
    #[arg(long, default_value_t = 30)]
    pub min_remaining_ttl_seconds: u64,
    /// The Gateway's oldest acceptable health check.
    #[arg(long, default_value_t = 120)]
    pub max_health_check_age_seconds: u64,
}

/// A proxy and the holder an ownership operation names (fencing).
#[derive(Args)]
pub struct HolderArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The Worker believed to hold it (required unless the id is `-`).
    #[arg(long)]
    pub worker: Option<String>,
    /// The epoch its claim returned (required unless the id is `-`).
    #[arg(long)]
    pub epoch: Option<u64>,
}

/// `ack`.
#[derive(Args)]
pub struct AckArgs {
    #[command(flatten)]
    pub holder: HolderArgs,
    /// Connections in use (required unless the id is `-`).
    #[arg(long)]
    pub active: Option<u32>,
    /// Connections reserved (required unless the id is `-`).
    #[arg(long)]
    pub reserved: Option<u32>,
}

/// `hash-credential`.
#[derive(Args)]
pub struct HashCredentialArgs {
    /// Make a new random secret, print it and its hash.
    #[arg(long)]
    pub generate: bool,
    /// Hash a Basic password for this user (as `user:password`).
    #[arg(long)]
    pub basic_user: Option<String>,
}

/// `load`.
#[derive(Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// The JSON Lines file, or `-` for standard input.
    pub file: String,
}

/// `load-demo`.
#[derive(Args)]
pub struct LoadDemoArgs {
    #[command(flatten)]
    pub pool: PoolArgs,
    /// Demo proxies to load (e.g. 300, 100k, 1M).
    #[arg(long, default_value = "300", value_parser = parse_size)]
    pub size: usize,
    /// Spread them over this many protocol x region x carrier x upstream
    /// combinations: 18, a multiple of 27 for a city-keyed pool (e.g.
    /// 19980), or PxRxCxU (e.g. 3x400x3x5, 2x16x25x25); default: the demo
    /// pool's 54, which events/README.md describes.
    #[arg(long, value_parser = PoolShape::parse)]
    pub combinations: Option<PoolShape>,
}
