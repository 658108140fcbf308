//! What a run reports: its cells and fills, the table (or JSON), and the
//! progress shown while it runs.

use std::fmt::Write as _;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use proxy_pool::local::PoolShape;
use serde::Serialize;

use super::filters::FilterShape;
use super::plan::Plan;

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

    pub(super) fn start(&self, len: u64, msg: String) {
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

    pub(super) fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    pub(super) fn note(&self, line: String) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("bench: {line}"),
        }
    }

    pub(super) fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
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

const HEADER: &str = "       N   comb  filter             count    C     ext/s  proxies/s   p50 us   p99 us  trivial/s  ratio  srv us/call  triv srv us  cli us/req";

/// One cell as a line of the table (with the lag and acks columns when
/// the run has replicas).
pub(super) fn row(c: &Cell, replicated: bool) -> String {
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
