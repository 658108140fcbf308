//! `bench`'s arguments: every flag and its default, and the plan they
//! describe once they are checked against each other.

use clap::Args;
use proxy_pool::aggregates::DatabaseUrl;
use proxy_pool::local::PoolShape;

use super::filters::FilterSet;
use super::plan::{Plan, ScriptCalls, StallPlan, SteadyPlan, parse_size};
use super::rig::Target;

/// `bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Use this Redis instead of a private one. Its current database is
    /// FLUSHED before and after, so --flush must be given too.
    #[arg(long)]
    pub redis_url: Option<String>,
    /// Allow the bench to FLUSHDB the Redis named by --redis-url.
    #[arg(long)]
    pub flush: bool,
    /// Pool sizes (e.g. 1k,100k,1M; default 1M).
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Pool shapes, as protocol x region x carrier x upstream
    /// combinations: 18, a multiple of 27 for a city-keyed pool, or
    /// PxRxCxU (protocols 1-3 x regions x carriers x upstreams, e.g.
    /// 3x400x3x5 or 2x16x25x25) (default 18,2700,10800).
    #[arg(long, value_delimiter = ',', value_parser = PoolShape::parse)]
    pub combinations: Vec<PoolShape>,
    /// Filter shapes: none, region, region-carrier, protocol-upstream
    /// (default: these four), or adversarial: the costliest legal
    /// requests (none first, then regions64-proto, regions64-car-up,
    /// regions16-every, invented-regions, invented-every,
    /// restricted-client, seed-example, all-but-one, multi-worst,
    /// protocol-only, regions2-carrier); any of them also by name.
    #[arg(long, value_delimiter = ',', value_parser = FilterSet::parse)]
    pub filters: Vec<FilterSet>,
    /// Proxies per request (e.g. 1,10,100).
    #[arg(long, value_delimiter = ',')]
    pub counts: Vec<u32>,
    /// Concurrent tasks (e.g. 1,8,64; default 8).
    #[arg(long, value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Timed extraction seconds per cell (default 1.5; --quick 0.3).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Most timed requests per cell (default 20000; --quick 300).
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Trivial EVALSHA seconds per cell, half before and half after (default 1; --quick 0.2).
    #[arg(long)]
    pub baseline_seconds: Option<f64>,
    /// Send a fresh Idempotency-Key with every request (the script then
    /// also reads and writes the idempotency record).
    #[arg(long)]
    pub idempotency: bool,
    /// Replicas of the private Redis (0-4), each fed through a relay that
    /// delays replication by --replica-lag-ms.
    #[arg(long, default_value_t = 0)]
    pub replicas: usize,
    /// Replication delays to measure, milliseconds (e.g. 2,20).
    #[arg(long, value_delimiter = ',')]
    pub replica_lag_ms: Vec<f64>,
    /// PROXY_POOL_REPLICA_ACKS values to measure (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub replica_acks: Vec<u32>,
    /// Do not count extractions in the hourly usage counters (on by
    /// default, as in a deployment with an aggregates database).
    #[arg(long)]
    pub no_usage_counters: bool,
    /// Run the scripts by EVALSHA instead of as Redis Functions
    /// (PROXY_POOL_REDIS_FUNCTIONS=false), to measure what Functions save
    #[arg(long, conflicts_with = "compare_evalsha")]
    pub evalsha: bool,
    /// Run every cell twice in a row on the same pool: scripts as Redis
    /// Functions, then by EVALSHA (a `calls` column tells the rows apart):
    /// each pair is measured seconds apart, on one pool
    #[arg(long)]
    pub compare_evalsha: bool,
    /// Clients in the Redis client registry (PROXY_POOL_CLIENT_REGISTRY=redis),
    /// loaded after each fill; every request presents one of their API keys,
    /// so identity includes the lookup (default 0: anonymous callers).
    #[arg(long, default_value_t = 0)]
    pub registry_clients: usize,
    /// Send every request over HTTP/1.1 through the server `proxy-pool
    /// serve` runs (on loopback, one keep-alive connection per task)
    /// instead of calling the handler in process.
    #[arg(long)]
    pub http: bool,
    /// Every request asks `allOrNothing` (default: partial).
    #[arg(long)]
    pub all_or_nothing: bool,
    /// Eligible proxies every request leaves for the Gateway
    /// (PROXY_POOL_RESERVE_FOR_GATEWAY, 0-100000; default 0): a request
    /// then first counts what its filters match, exactly.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    pub reserve: u32,
    /// Fill in the adversarial order for the multi-worst filter: every
    /// combination it does not match expires before every one it matches,
    /// so each of their heads comes first and a multi-worst request skips
    /// them all.
    #[arg(long)]
    pub adversarial_heads: bool,
    /// At most this many requests per second per cell, in all (default:
    /// as fast as the C tasks go).
    #[arg(long)]
    pub pace: Option<f64>,
    /// Turn the per-client rate limit on, RATE[:BURST] (e.g. 20:40, the
    /// default of a deployment); the bench's anonymous tasks are one client.
    #[arg(long)]
    pub client_rate: Option<String>,
    /// Another client PINGs Redis every this many ms, on its own connection
    /// and thread, during the timed rounds; its slowest and p99 round trips
    /// are reported (0: off; default 1).
    #[arg(long)]
    pub ping_every_ms: Option<u64>,
    /// Instead of the cells: the stale-backlog timeline. Fill N (the first
    /// --sizes, default 1M) proxies of the first --combinations whose health
    /// checks all go stale at one instant after the fill (or over the
    /// --stall-spread seconds up to it), then per second:
    /// a Controller adding fresh proxies, extraction clients (count=1,
    /// partial and allOrNothing), the scheduled prune.
    #[arg(long)]
    pub stall: bool,
    /// --stall: seconds from the start of the fill to the stall (default:
    /// N / 5000 + 10 + --stall-spread; the fill must end before it).
    #[arg(long)]
    pub stall_after: Option<f64>,
    /// --stall: seconds measured after the stall (default 60).
    #[arg(long)]
    pub stall_seconds: Option<u64>,
    /// --stall: the health checks go stale over this many seconds up to
    /// the stall, each proxy at its own instant (default 0: all at the
    /// stall's instant, so that every deadline ties)
    #[arg(long)]
    pub stall_spread: Option<u64>,
    /// --stall: fresh proxies the Controller adds per second (default 2000).
    #[arg(long)]
    pub fresh_per_sec: Option<u64>,
    /// --stall: seconds between runs of the scheduled prune (batch 128, a
    /// 4 s budget, as the scheduled invocation runs it; default 10; 0: none).
    #[arg(long)]
    pub prune_every: Option<u64>,
    /// Instead of the cells: the steady state. Fill N (the first --sizes,
    /// default 1M) of the first --combinations, measure extraction alone,
    /// then every writer (Controller refreshes, health results, Worker
    /// claim cycles, the scheduled job) and extraction together at each
    /// --steady-rates, with each operation's share of Redis time, p99,
    /// PING, backlog and memory per second, and the headroom.
    #[arg(long, conflicts_with = "stall")]
    pub steady: bool,
    /// --steady: extraction calls per second, one step each (default
    /// 1000,2000,4000,6000,8000). --counts sets the requests' counts,
    /// taken in turn (default: 7 in 10 count=1, the others count=10).
    #[arg(long, value_delimiter = ',')]
    pub steady_rates: Vec<u64>,
    /// --steady: seconds per step (default 30; 600 for a memory run).
    #[arg(long)]
    pub step_seconds: Option<u64>,
    /// --steady: seconds of extraction alone first, the second half
    /// measured (default 20).
    #[arg(long)]
    pub quiet_seconds: Option<u64>,
    /// --steady: refreshes per second (default N / 1800: 30-minute lives).
    #[arg(long)]
    pub refresh_per_sec: Option<u64>,
    /// --steady: health results per second (default N / 120).
    #[arg(long)]
    pub health_per_sec: Option<u64>,
    /// --steady: the share of health results that fail (default 0.05).
    #[arg(long)]
    pub health_fail_share: Option<f64>,
    /// --steady: Worker claim cycles per second (default 20).
    #[arg(long)]
    pub worker_cycles: Option<u64>,
    /// --steady: seconds between runs of the scheduled job (default 60; 0: none).
    #[arg(long)]
    pub job_every: Option<u64>,
    /// --steady: the scheduled job also flushes the usage counters to this
    /// PostgreSQL database (as a deployment with
    /// PROXY_POOL_AGGREGATES_DATABASE_URL does); a run that crosses an
    /// hour's end moves that hour.
    #[arg(long, value_name = "postgres://...", requires = "steady")]
    pub aggregates_url: Option<String>,
    /// --steady: also draw the timeline into this SVG file (each side's
    /// share of Redis, extraction and PING p99, backlog, memory, by second).
    #[arg(long, value_name = "FILE.svg", requires = "steady")]
    pub plot: Option<std::path::PathBuf>,
    /// A smoke run: N=1k, 18 combinations, no filters, counts 1,10, C 1,8,
    /// a few hundred requests per cell.
    #[arg(long)]
    pub quick: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// The plan these arguments describe and where it runs, or why they do
    /// not fit together.
    pub fn into_plan(self) -> Result<(Plan, Target), Box<dyn std::error::Error>> {
        let args = self;
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
        plan.reserve = args.reserve;
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
            stall.spread_seconds = args.stall_spread.unwrap_or(stall.spread_seconds);
            stall.after_seconds = args
                .stall_after
                .unwrap_or(stall.after_seconds + stall.spread_seconds as f64);
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
                    "--stall: --stall-after and --stall-seconds must be > 0, and no --replicas"
                        .into(),
                );
            }
            plan.stall = Some(stall);
        } else if args.stall_after.is_some()
            || args.stall_seconds.is_some()
            || args.stall_spread.is_some()
            || args.fresh_per_sec.is_some()
            || args.prune_every.is_some()
        {
            return Err(
                "--stall-after, --stall-seconds, --stall-spread, --fresh-per-sec and --prune-every go with --stall"
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
            steady.worker_cycles_per_sec =
                args.worker_cycles.unwrap_or(steady.worker_cycles_per_sec);
            steady.job_every = args.job_every.unwrap_or(steady.job_every);
            if let Some(url) = &args.aggregates_url {
                steady.aggregates =
                    Some(DatabaseUrl::parse(url).map_err(|e| format!("--aggregates-url: {e}"))?);
            }
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
        Ok((plan, target))
    }
}
