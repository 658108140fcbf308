//! What a run reports: its cells and fills, and the table (or JSON).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use proxy_pool::local::PoolShape;
use serde::Serialize;

use super::filters::FilterShape;
use super::plan::{Plan, ScriptCalls};

/// Serialises a pool shape as its number of combinations.
fn shape_as_combinations<S: serde::Serializer>(shape: &PoolShape, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(shape.combinations() as u64)
}

/// One (N, shape, filter, count, C) cell.
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
    /// How the handler called the scripts.
    pub script_calls: ScriptCalls,
    /// Share of the timed rounds' script calls Redis counted as `FCALL`
    /// (the rest as `EVALSHA`): 1 as Functions, 0 by `EVALSHA`.
    pub fcall_share: Option<f64>,
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
    /// Answers by HTTP status (0: no answer).
    pub statuses: BTreeMap<u16, usize>,
    /// `server_us_per_call` over that of the unfiltered count=1 cell of
    /// the same run, pool and C (when the run has one).
    pub vs_unfiltered: Option<f64>,
    /// The longest extraction call `SLOWLOG` kept (calls of 1 ms or more),
    /// microseconds: 0 when none took 1 ms; absent without `SLOWLOG`.
    pub slowest_call_us: Option<u64>,
    /// Extraction calls of 1 ms or more.
    pub calls_over_1ms: Option<u64>,
    /// Extraction calls over 5 ms.
    pub calls_over_5ms: Option<u64>,
    /// The slowest `PING` of another client during the timed rounds, us.
    pub ping_max_us: Option<u64>,
    /// Their 99th percentile.
    pub ping_p99_us: Option<u64>,
    /// Pings sent during the timed rounds.
    pub pings: usize,
    /// Share of the timed rounds' wall time Redis spent running scripts
    /// (`fcall` and `evalsha` usec of `INFO commandstats`: the extractions, and with
    /// `--client-rate` the rate limit's script; the commands a script runs
    /// are inside its time).
    pub redis_busy: f64,
}

/// Fills in each cell's cost against the unfiltered count=1 cell of the
/// same pool, C, replication variant and way of calling the scripts.
pub(super) fn relate(cells: &mut [Cell]) {
    let same = |a: &Cell, b: &Cell| {
        (
            a.pool,
            a.combinations,
            a.concurrency,
            a.replica_acks,
            a.script_calls,
        ) == (
            b.pool,
            b.combinations,
            b.concurrency,
            b.replica_acks,
            b.script_calls,
        ) && a.replica_lag_ms == b.replica_lag_ms
    };
    let bases: Vec<Cell> = cells
        .iter()
        .filter(|c| c.filter == FilterShape::None && c.count == 1)
        .cloned()
        .collect();
    for c in cells.iter_mut() {
        c.vs_unfiltered = bases
            .iter()
            .find(|b| same(b, c))
            .and_then(|b| Some(c.server_us_per_call? / b.server_us_per_call?.max(1e-9)));
    }
}

/// `200:123 422:45`.
pub(super) fn status_mix(statuses: &BTreeMap<u16, usize>) -> String {
    statuses
        .iter()
        .map(|(s, n)| format!("{s}:{n}"))
        .collect::<Vec<_>>()
        .join(" ")
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
    /// What each writer costs Redis a proxy, measured on this pool.
    pub writers: super::writers::Writers,
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

const HEADER: &str = "       N   comb  filter             count    C     ext/s  proxies/s   p50 us   p99 us  trivial/s  ratio  srv us/call  triv srv us  cli us/req  x none  slowest us  >5ms  ping max us  ping p99 us  busy  statuses";

/// One cell as a line of the table (with the lag and acks columns when
/// the run has replicas, and how the scripts were called when it compares).
pub(super) fn row(c: &Cell, plan: &Plan) -> String {
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
    let int = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let _ = write!(
        line,
        " {:>7} {:>11} {:>5} {:>12} {:>12} {:>4.0}%  {}",
        c.vs_unfiltered
            .map_or("-".to_owned(), |v| format!("{v:.2}")),
        int(c.slowest_call_us),
        int(c.calls_over_5ms),
        int(c.ping_max_us),
        int(c.ping_p99_us),
        c.redis_busy * 100.0,
        status_mix(&c.statuses),
    );
    if plan.replicas > 0 {
        let _ = write!(line, " {:>7.1} {:>4}", c.replica_lag_ms, c.replica_acks);
    }
    if plan.script_calls.len() > 1 {
        let _ = write!(line, " {:>7}", c.script_calls.name());
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
            "proxy-pool bench: redis {} on {} CPUs, {}, {}, {}, {}, {}, {}",
            self.redis_version,
            self.cpus,
            match self.plan.script_calls[..] {
                [ScriptCalls::Evalsha] => "scripts by EVALSHA",
                [ScriptCalls::Fcall] => "scripts as Functions",
                _ => "each cell with the scripts as Functions, then by EVALSHA",
            },
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
            match &self.plan.client_rate {
                Some(r) => format!("client rate limit {r}"),
                None => "rate limits off".to_owned(),
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
            let w = &f.writers;
            let _ = writeln!(
                out,
                "fill N={} over {} combinations ({}): {:.1} s ({:.0} proxies/s), Redis memory {} bytes per proxy; Redis time a proxy: fill {:.1} us ({:.0}/s), refresh {:.1} us, health result {:.1} us batched / {:.1} us alone (every proxy within 120 s: {:.1}% of Redis)",
                human(f.pool),
                f.combinations.combinations(),
                f.combinations,
                f.seconds,
                f.per_sec,
                f.redis_bytes_per_proxy
                    .map_or("-".to_owned(), |b| format!("{b:.0}")),
                w.fill_us,
                1e6 / w.fill_us.max(1e-9),
                w.refresh_us,
                w.health_batched_us,
                w.health_single_us,
                100.0 * w.health_share
            );
        }
        let replicated = self.plan.replicas > 0;
        let _ = writeln!(
            out,
            "{HEADER}{}{}",
            if replicated { "  lag ms acks" } else { "" },
            if self.plan.script_calls.len() > 1 {
                "    calls"
            } else {
                ""
            }
        );
        for c in &self.cells {
            let _ = writeln!(out, "{}", row(c, &self.plan));
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
        let _ = writeln!(
            out,
            "x none = srv us/call over that of the unfiltered count=1 cell of the same pool and C; slowest us = the longest extraction call SLOWLOG kept (calls of 1 ms or more; 0: none), >5ms = how many took over 5 ms; ping = another client's PING round trip{} during the timed rounds; busy = share of the rounds' wall time Redis spent running scripts (FCALL and EVALSHA usec: extractions, and with a client rate limit its script); statuses = HTTP status: answers (200 includes short ones).",
            match self.plan.ping_every_ms {
                0 => " (not measured: --ping-every-ms 0)".to_owned(),
                ms => format!(" every {ms} ms on its own connection and thread"),
            }
        );
        if self.plan.all_or_nothing
            || self.plan.pace.is_some()
            || self.plan.client_rate.is_some()
            || self.plan.reserve > 0
        {
            let _ = writeln!(
                out,
                "requests: {}{}{}{}.",
                if self.plan.all_or_nothing {
                    "allOrNothing"
                } else {
                    "partial"
                },
                match self.plan.reserve {
                    0 => String::new(),
                    n => format!(", {n} eligible proxies left for the Gateway (reserveForGateway)"),
                },
                self.plan.pace.map_or(String::new(), |p| format!(
                    ", paced at {p} per second in all"
                )),
                self.plan
                    .client_rate
                    .as_ref()
                    .map_or(String::new(), |r| format!(
                        ", one anonymous client limited to {r} (requests/s:burst)"
                    )),
            );
        }
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
