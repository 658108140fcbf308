//! What to measure: the matrix of pool sizes, shapes, filter sets, counts,
//! concurrency and replication settings, and how a pool size is written.

use proxy_pool::aggregates::DatabaseUrl;
use proxy_pool::local::PoolShape;
use serde::Serialize;

use super::filters::FilterShape;

fn shapes_as_combinations<S: serde::Serializer>(
    shapes: &[PoolShape],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(shapes.iter().map(|shape| shape.combinations()))
}

/// How a handler calls the scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScriptCalls {
    /// As functions of the loaded library (`PROXY_POOL_REDIS_FUNCTIONS=true`).
    #[default]
    Fcall,
    /// By `EVALSHA` (`PROXY_POOL_REDIS_FUNCTIONS=false`).
    Evalsha,
}

impl ScriptCalls {
    /// `fcall` or `evalsha`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fcall => "fcall",
            Self::Evalsha => "evalsha",
        }
    }
}

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
    /// How the handlers call the scripts: each cell runs once per entry,
    /// back to back on the same pool (default: as Functions only).
    pub script_calls: Vec<ScriptCalls>,
    /// Clients in the Redis client registry; requests present their API
    /// keys (0: anonymous callers, no registry).
    pub registry_clients: usize,
    /// Requests over HTTP through `serve`'s server, not in process.
    pub http: bool,
    /// Every request asks `allOrNothing` (else partial, the default).
    pub all_or_nothing: bool,
    /// `reserveForGateway` of every request (0: none).
    pub reserve: u32,
    /// Fill so that the multi-worst filter's non-matching combinations
    /// expire first (their heads ahead of every matching one).
    pub adversarial_heads: bool,
    /// Requests per second of a cell, in all (none: as fast as they go).
    pub pace: Option<f64>,
    /// The per-client rate limit, `RATE[:BURST]` (none: rate limits off).
    /// Anonymous callers from one address are one client.
    pub client_rate: Option<String>,
    /// Another client's `PING` every this many ms during the timed rounds
    /// (0: none).
    pub ping_every_ms: u64,
    /// The stale-backlog timeline instead of the cells.
    pub stall: Option<StallPlan>,
    /// The steady state instead of the cells.
    pub steady: Option<SteadyPlan>,
}

/// The stale-backlog timeline (`--stall`): a pool of N whose health
/// checks all go stale by one instant (at it, or spread over the seconds
/// before it), then a Controller, extraction clients and the scheduled
/// prune, second by second.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StallPlan {
    /// Seconds from the start of the fill to the stall (it must end first).
    pub after_seconds: f64,
    /// Seconds measured from the stall on.
    pub seconds: u64,
    /// Seconds measured before it (5, or a third of `after_seconds` if
    /// less).
    pub lead_seconds: u64,
    /// The health checks go stale over this many seconds up to the stall
    /// (0: all at its instant, so that their deadlines tie).
    pub spread_seconds: u64,
    /// Fresh proxies the Controller adds per second.
    pub fresh_per_sec: u64,
    /// Extraction clients (count=1; every other request allOrNothing).
    pub clients: usize,
    /// Seconds between two runs of the scheduled prune (0: none).
    pub prune_every: u64,
}

impl StallPlan {
    /// The default stall of a pool of `n`: the fill is given 1 s per 5,000
    /// proxies (this machine fills about 10,000/s) plus 10 s.
    pub fn for_pool(n: usize) -> Self {
        Self {
            after_seconds: n as f64 / 5_000.0 + 10.0,
            seconds: 60,
            lead_seconds: 5,
            spread_seconds: 0,
            fresh_per_sec: 2_000,
            clients: 8,
            prune_every: 10,
        }
    }
}

/// The steady state (`--steady`): every writer and extraction together
/// on a pool of N, extraction rate step by step.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SteadyPlan {
    /// Extraction calls per second, one step each (the first also paces
    /// the quiet phase).
    pub rates: Vec<u64>,
    /// Seconds each step lasts.
    pub step_seconds: u64,
    /// Seconds of extraction alone first (the quiet value).
    pub quiet_seconds: u64,
    /// Proxies the Controller refreshes per second.
    pub refresh_per_sec: u64,
    /// Health results per second.
    pub health_per_sec: u64,
    /// The share of health results that fail.
    pub health_fail_share: f64,
    /// Worker claim cycles (claim, drain, ack, release) per second.
    pub worker_cycles_per_sec: u64,
    /// Seconds between runs of the scheduled job (0: none).
    pub job_every: u64,
    /// Extraction clients.
    pub clients: usize,
    /// Proxies per request, request k asking `counts[k % len]`.
    pub counts: Vec<u32>,
    /// The aggregates database the scheduled job flushes usage to (none:
    /// no flush). Never serialised: it may carry a password.
    #[serde(skip)]
    pub aggregates: Option<DatabaseUrl>,
}

impl SteadyPlan {
    /// The defaults for a pool of `n`: 30-minute lives refreshed (n /
    /// 1,800 a second), every proxy's health within 120 s (n / 120), 5% of
    /// results failed, 20 Worker cycles a second, the job every 60 s;
    /// 20 s of extraction alone (the second half measured: the first lets
    /// the pool settle after its fill), then 30 s at each of 1,000 to
    /// 8,000 extractions a second, 16 clients, 7 in 10 requests count=1,
    /// the others count=10.
    pub fn for_pool(n: usize) -> Self {
        Self {
            rates: vec![1_000, 2_000, 4_000, 6_000, 8_000],
            step_seconds: 30,
            quiet_seconds: 20,
            refresh_per_sec: (n as u64 / 1_800).max(1),
            health_per_sec: (n as u64 / 120).max(1),
            health_fail_share: 0.05,
            worker_cycles_per_sec: 20,
            job_every: 60,
            clients: 16,
            counts: vec![1, 1, 1, 1, 1, 1, 1, 10, 10, 10],
            aggregates: None,
        }
    }
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
                    protocols: 3,
                    regions: 100,
                    carriers: 3,
                    upstreams: 3,
                },
                PoolShape {
                    protocols: 3,
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
            script_calls: vec![ScriptCalls::Fcall],
            registry_clients: 0,
            http: false,
            all_or_nothing: false,
            reserve: 0,
            adversarial_heads: false,
            pace: None,
            client_rate: None,
            ping_every_ms: 1,
            stall: None,
            steady: None,
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

/// Not a pool size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a pool size is a number like 1000, 100k or 1M, at most 50M")]
pub struct BadSize;

/// A pool size: a number, optionally with a `k` or `M` suffix.
pub fn parse_size(s: &str) -> Result<usize, BadSize> {
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
        .ok_or(BadSize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::human;

    /// Sizes parse with suffixes and print back the same way.
    #[test]
    fn sizes_round_trip() {
        for s in ["1k", "100k", "1M", "1500"] {
            assert_eq!(human(parse_size(s).unwrap()), s);
        }
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
    }
}
