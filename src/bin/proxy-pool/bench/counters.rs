//! Redis's own counters around a timed window: script calls and their
//! time (`INFO commandstats`), Redis's CPU (`INFO cpu`), and the calls
//! `SLOWLOG` keeps, set for the run and put back after it.

use proxy_pool::pool::PoolConnection;

use super::error::BenchError;
use super::figures::info_field;
use super::rig::Bench;

/// Redis counters read around a timed window.
#[derive(Clone, Copy, Default)]
pub(super) struct ServerStats {
    /// Script calls (`FCALL` and `EVALSHA`).
    pub script_calls: u64,
    /// Of which by `FCALL`.
    pub fcall_calls: u64,
    /// Redis time in them, us.
    pub script_usec: u64,
    /// Of which in `FCALL`.
    pub fcall_usec: u64,
    pub cpu_seconds: f64,
}

/// The script calls `SLOWLOG` kept (those of 1 ms or more).
#[derive(Clone, Copy, Default)]
pub(super) struct SlowCalls {
    /// The longest extraction call, us.
    pub slowest_us: u64,
    /// Extraction calls of 1 ms or more.
    pub over_1ms: u64,
    /// Extraction calls over 5 ms.
    pub over_5ms: u64,
    /// The longest call of another script (upserts, prune), us.
    pub other_slowest_us: u64,
}

impl SlowCalls {
    /// What `self` and `other` kept, together.
    pub(super) fn and(self, other: Self) -> Self {
        Self {
            slowest_us: self.slowest_us.max(other.slowest_us),
            over_1ms: self.over_1ms + other.over_1ms,
            over_5ms: self.over_5ms + other.over_5ms,
            other_slowest_us: self.other_slowest_us.max(other.other_slowest_us),
        }
    }
}

impl Bench {
    /// Redis's script counters now (`INFO cpu commandstats`).
    pub(super) async fn server_stats(&self) -> Result<ServerStats, BenchError> {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut self.conn.clone())
            .await?;
        let mut stats = ServerStats::default();
        // Script calls: `EVALSHA`, and `FCALL` (the extraction as a function).
        for line in info.lines() {
            let Some((fcall, fields)) = [("cmdstat_evalsha:", false), ("cmdstat_fcall:", true)]
                .iter()
                .find_map(|&(prefix, fcall)| Some((fcall, line.strip_prefix(prefix)?)))
            else {
                continue;
            };
            for part in fields.split(',') {
                match part.split_once('=') {
                    Some(("calls", v)) => {
                        let calls = v.parse().unwrap_or(0);
                        stats.script_calls += calls;
                        if fcall {
                            stats.fcall_calls += calls;
                        }
                    }
                    Some(("usec", v)) => {
                        let usec = v.parse().unwrap_or(0);
                        stats.script_usec += usec;
                        if fcall {
                            stats.fcall_usec += usec;
                        }
                    }
                    _ => {}
                }
            }
        }
        let cpu = |name| info_field(&info, name).and_then(|v| v.parse::<f64>().ok());
        stats.cpu_seconds =
            cpu("used_cpu_user").unwrap_or(0.0) + cpu("used_cpu_sys").unwrap_or(0.0);
        Ok(stats)
    }

    /// Empties `SLOWLOG` (a Redis without it is left as it is).
    pub(super) async fn forget_slow_calls(&self) {
        let _: Result<(), _> = redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async(&mut self.conn.clone())
            .await;
    }

    /// The script calls `SLOWLOG` kept since the last read, which it
    /// forgets (none when `SLOWLOG` is not available: `None`).
    pub(super) async fn slow_calls(&self) -> Option<SlowCalls> {
        let mut conn = self.conn.clone();
        let entries: redis::Value = redis::cmd("SLOWLOG")
            .arg("GET")
            .arg(-1)
            .query_async(&mut conn)
            .await
            .ok()?;
        redis::cmd("SLOWLOG")
            .arg("RESET")
            .query_async::<()>(&mut conn)
            .await
            .ok()?;
        let names = proxy_pool::pool::extract_names();
        let mut slow = SlowCalls::default();
        let redis::Value::Array(entries) = entries else {
            return Some(slow);
        };
        for entry in entries {
            let redis::Value::Array(fields) = entry else {
                continue;
            };
            let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
                (fields.get(2), fields.get(3))
            else {
                continue;
            };
            let us = *us as u64;
            let is_extract = matches!(args.get(1), Some(redis::Value::BulkString(b))
                if names.iter().any(|name| b == name.as_bytes()));
            if !is_extract {
                slow.other_slowest_us = slow.other_slowest_us.max(us);
                continue;
            }
            slow.slowest_us = slow.slowest_us.max(us);
            slow.over_1ms += 1;
            if us > 5_000 {
                slow.over_5ms += 1;
            }
        }
        Some(slow)
    }
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
