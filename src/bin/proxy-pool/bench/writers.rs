//! The pool's writers at the pool's size: what a proxy added, refreshed or
//! given a health result costs Redis (its script time, `INFO
//! commandstats`), right after the fill, on the pool the cells then use.
//! The health checker's share is what recording every proxy's result
//! within `maxHealthCheckAge` would take of one Redis.

use std::time::Duration;

use proxy_pool::clock::now_ms;
use proxy_pool::local::{synthetic_id, synthetic_proxy};
use proxy_pool::pool::{CONTRACT_BATCH, ContractOp, NewProxy, PoolContract};
use serde::Serialize;

use super::{Bench, BenchError};

/// Proxies refreshed, and health results recorded in batches, per measure.
const SAMPLE: usize = 20_000;
/// Health results recorded one call each.
const SINGLES: usize = 2_000;
/// The maxHealthCheckAge the health checker's share is computed for: the
/// configuration's default (the bench's own pool policy is longer).
pub(super) const HEALTH_AGE: Duration = Duration::from_secs(120);

/// Redis time per proxy of each writer, us.
#[derive(Debug, Clone, Copy, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Writers {
    /// The fill (`lua/upsert.lua` of new proxies, 32 a call).
    pub fill_us: f64,
    /// A refresh (the same ids again, a new expiry).
    pub refresh_us: f64,
    /// A health result in a batch of [`CONTRACT_BATCH`].
    pub health_batched_us: f64,
    /// A health result alone in its call.
    pub health_single_us: f64,
    /// The share of Redis a health checker takes recording every proxy of
    /// the pool within [`HEALTH_AGE`] in batches.
    pub health_share: f64,
}

impl Bench {
    /// Script time (us) Redis spent while `run` ran, per `n`.
    async fn per_item<F: std::future::Future<Output = Result<(), BenchError>>>(
        &self,
        n: usize,
        run: F,
    ) -> Result<f64, BenchError> {
        let before = self.server_stats().await?;
        run.await?;
        let after = self.server_stats().await?;
        Ok((after.script_usec - before.script_usec) as f64 / n.max(1) as f64)
    }

    /// Measures the writers on the pool just filled with `n` proxies whose
    /// fill cost `fill_usec` of script time.
    pub(super) async fn writers(&self, n: usize, fill_usec: u64) -> Result<Writers, BenchError> {
        let sample = SAMPLE.min(n);
        let now = now_ms();
        let shape = self.shape();
        let first = self.next_seq.load(std::sync::atomic::Ordering::Relaxed) as usize - n;
        let refreshed: Vec<NewProxy> = (first..first + sample)
            .map(|seq| {
                let mut p = synthetic_proxy(seq, now, shape);
                p.expires_at += 60_000;
                p.usable_until += 60_000;
                p
            })
            .collect();
        let refresh_us = self
            .per_item(sample, async {
                PoolContract::new(&self.pool).upsert(&refreshed).await?;
                Ok(())
            })
            .await?;
        let health = |seq: usize| ContractOp::Health {
            id: synthetic_id(seq),
            ok: true,
            checked_at: None,
        };
        let results: Vec<ContractOp> = (first..first + sample).map(health).collect();
        let health_batched_us = self
            .per_item(sample, async {
                for batch in results.chunks(CONTRACT_BATCH) {
                    PoolContract::new(&self.pool).apply_batch(batch).await?;
                }
                Ok(())
            })
            .await?;
        let singles = SINGLES.min(n);
        let health_single_us = self
            .per_item(singles, async {
                for seq in first..first + singles {
                    PoolContract::new(&self.pool).apply(&health(seq)).await?;
                }
                Ok(())
            })
            .await?;
        let per_sec = n as f64 / HEALTH_AGE.as_secs_f64();
        Ok(Writers {
            fill_us: fill_usec as f64 / n.max(1) as f64,
            refresh_us,
            health_batched_us,
            health_single_us,
            health_share: health_batched_us * per_sec / 1e6,
        })
    }
}
