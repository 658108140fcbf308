//! The pool generator: fills the pool with synthetic proxies, tops it up
//! between rounds, and registers the clients of `--registry-clients`.

use std::sync::atomic::Ordering;
use std::time::Instant;

use proxy_pool::local::{PoolShape, synthetic_proxy};
use proxy_pool::pool::{NewProxy, PoolContract, PoolError, UpsertStatus};
use proxy_pool::security::RedisRegistry;
use proxy_pool::security::credentials::CredentialHash;
use tokio::task::JoinSet;

use super::filters::FilterShape;
use super::report::human;
use super::{Bench, BenchError};

/// The API key of the bench's registry client `i`.
pub(super) fn client_key(i: usize) -> String {
    format!("pp_bench_client_{i:08}")
}

/// Proxies per `upsert` call while filling, and calls in flight.
const FILL_CHUNK: usize = 2000;
const FILL_IN_FLIGHT: usize = 4;

impl Bench {
    /// Empties the bench's Redis database (`FLUSHDB ASYNC`).
    pub(super) async fn flush(&self) -> Result<(), BenchError> {
        redis::cmd("FLUSHDB")
            .arg("ASYNC")
            .query_async::<()>(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// The shape the next fills and requests use.
    pub(super) fn set_shape(&self, shape: PoolShape) {
        if let Ok(mut s) = self.shape.lock() {
            *s = shape;
        }
    }

    /// The current pool shape.
    pub(super) fn shape(&self) -> PoolShape {
        self.shape.lock().map_or(PoolShape::SMALL, |s| *s)
    }

    /// Loads the registry's clients (after a fill: the fill flushes Redis).
    pub(super) async fn register_clients(&self) -> Result<(), BenchError> {
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

    /// Adds `n` fresh synthetic proxies, several upsert calls in flight;
    /// their last health check at `checks` (default: now).
    pub(super) async fn add(
        &self,
        n: usize,
        show: bool,
        checks: Option<Checks>,
    ) -> Result<(), BenchError> {
        let first = self.next_seq.fetch_add(n as u64, Ordering::Relaxed);
        let now = proxy_pool::clock::now_ms();
        let shape = self.shape();
        // The adversarial order: what the multi-worst filter matches
        // expires after everything it does not.
        let matched = self
            .adversarial_heads
            .then(|| std::sync::Arc::new(FilterShape::MultiWorst.matcher(shape)));
        let mut tasks = JoinSet::new();
        let mut start = 0;
        while start < n || !tasks.is_empty() {
            while start < n && tasks.len() < FILL_IN_FLIGHT {
                let len = FILL_CHUNK.min(n - start);
                let pool = self.pool.clone();
                let matched = matched.clone();
                let from = first + start as u64;
                tasks.spawn(async move {
                    let batch: Vec<NewProxy> = (from..from + len as u64)
                        .map(|seq| {
                            let mut p = synthetic_proxy(seq as usize, now, shape);
                            p.health_checked_at = checks.map_or(now, |c| c.of(seq));
                            if matched.as_ref().is_some_and(|m| m(&p)) {
                                p.expires_at += 1_800_000;
                                p.usable_until += 1_800_000;
                            }
                            p
                        })
                        .collect();
                    let statuses = PoolContract::new(&pool).upsert(&batch).await?;
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
    pub(super) async fn top_up(&self, target: usize) -> Result<(), BenchError> {
        let have: usize = redis::cmd("ZCARD")
            .arg(self.pool.keys().index())
            .query_async(&mut self.conn.clone())
            .await?;
        if have < target {
            self.add(target - have, false, None).await?;
        }
        Ok(())
    }
}

/// When the synthetic proxies of one [`Bench::add`] were last checked.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checks {
    /// The latest check, Unix ms.
    pub last_ms: i64,
    /// The checks spread over this many ms up to `last_ms` (0: all at it),
    /// by a hash of the proxy's sequence number.
    pub spread_ms: i64,
}

impl Checks {
    /// The check time of the proxy numbered `seq`.
    fn of(self, seq: u64) -> i64 {
        if self.spread_ms <= 0 {
            return self.last_ms;
        }
        let mix = seq.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 24;
        self.last_ms - (mix % (self.spread_ms as u64 + 1)) as i64
    }
}
