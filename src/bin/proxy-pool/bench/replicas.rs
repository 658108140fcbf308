//! Replicas of the private Redis, each fed through a relay whose delay is
//! the replication lag, and the rig's replication setting.

use std::net::SocketAddr;
use std::sync::PoisonError;
use std::time::{Duration, Instant};

use proxy_pool::local::{RedisServer, Relay, replicas_acknowledge};

use super::caller::Front;
use super::{Bench, BenchError, Variant};

/// The thread the replication relays run on: a runtime of their own, so
/// that the simulated replication lag is the relay's delay, not that delay
/// plus the wait for a turn behind the handler's and the clients' tasks
/// (in a deployment the replicas' network is not the service's runtime).
pub(super) struct RelayThread(Option<tokio::runtime::Runtime>);

impl RelayThread {
    /// Starts the thread.
    pub(super) fn start() -> Result<Self, BenchError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("bench-relays")
            .enable_all()
            .build()
            .map_err(|e| BenchError::Failed(format!("relay runtime: {e}")))?;
        Ok(Self(Some(runtime)))
    }

    /// A relay to `target`, served by this thread.
    async fn relay(&self, target: SocketAddr) -> Result<Relay, BenchError> {
        let failed = |e: String| BenchError::Failed(format!("relay: {e}"));
        let runtime = self.0.as_ref().ok_or_else(|| failed("stopped".into()))?;
        runtime
            .spawn(Relay::start(target))
            .await
            .map_err(|e| failed(e.to_string()))?
            .map_err(|e| failed(e.to_string()))
    }
}

impl Drop for RelayThread {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

/// Starts `n` replicas of `primary`, each behind a relay on `thread` (the
/// replication delay), and waits until they acknowledge writes.
pub(super) async fn start_replicas(
    primary: &RedisServer,
    n: usize,
    thread: &RelayThread,
) -> Result<Vec<(RedisServer, Relay)>, BenchError> {
    let mut replicas = Vec::new();
    for _ in 0..n {
        let relay = thread
            .relay(([127, 0, 0, 1], primary.port()).into())
            .await?;
        let port = relay.port().to_string();
        let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).await?;
        replicas.push((replica, relay));
    }
    let started = Instant::now();
    loop {
        if replicas_acknowledge(&primary.url(), "bench-replication-probe", n).await? {
            return Ok(replicas);
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(BenchError::Failed(
                "the replicas did not sync in 30 s".into(),
            ));
        }
    }
}

impl Bench {
    /// The replication setting of the current cells.
    pub(super) fn variant(&self) -> Variant {
        *self.variant.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs the next cells with `variant`'s handler and replication delay.
    pub(super) fn set_variant(&self, variant: Variant) {
        for relay in &self.relays {
            relay.set_delay(Duration::from_secs_f64(variant.lag_ms / 1000.0));
        }
        *self.variant.lock().unwrap_or_else(PoisonError::into_inner) = variant;
    }

    /// The handler of the current cells.
    pub(super) fn front(&self) -> Front {
        self.fronts[self.variant().app].clone()
    }
}
