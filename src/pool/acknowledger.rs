//! Replica acknowledgement without queueing: each acknowledged extraction
//! runs on a socket of its own, and its `WAIT` travels in the same write as
//! its script.
//!
//! `WAIT n t` answers how many replicas hold every write sent on *its own
//! connection* before it, and blocks that connection meanwhile. So an
//! extraction borrows a lane (a socket to the primary that only it uses
//! until it is answered), sends `EVALSHA` and `WAIT` as one pipeline, and
//! gives the lane back. Concurrent extractions never queue behind another
//! one's `WAIT`, and they still share the replication round trip: Redis
//! sends one `REPLCONF GETACK` per event-loop pass for every `WAIT` that
//! blocked in it, and one replica `ACK` releases every `WAIT` whose writes
//! it covers (group commit, done by the server).
//!
//! The acknowledgement is proven on the socket that carried the write: the
//! two commands are one write on one connection that never reconnects, so
//! a `WAIT` can only count writes made before it on that socket. A socket
//! that failed, timed out or was left mid-call is closed, never lent again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connection::{DirectOpener, PoolConnection};
use super::error::{OutageClass, PoolError};

/// Most sockets one process opens for acknowledged extractions: as many
/// extractions can wait for replicas at once; more wait for a lane.
pub(crate) const LANES: usize = 128;

/// An idle lane unused this long is checked with a `PING` before it is
/// lent (a Lambda sandbox thawed after minutes finds its sockets dead).
const CHECK_IDLE_AFTER: Duration = Duration::from_secs(30);

/// What became of an extraction's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    /// This many replicas acknowledged its write.
    Replicas(u64),
    /// The `WAIT` failed or never answered (timeout, lost connection, a
    /// demoted primary).
    Failed(OutageClass),
}

/// Lends the sockets acknowledged extractions run on.
pub(crate) struct Acknowledger {
    opener: DirectOpener,
    lanes: Arc<Semaphore>,
    /// Sockets given back, the most recently used last.
    idle: Mutex<Vec<(PoolConnection, Instant)>>,
}

impl Acknowledger {
    /// Lanes opened by `opener`, whose script calls carry their `WAIT`.
    pub(crate) fn new(opener: DirectOpener) -> Arc<Self> {
        Arc::new(Self {
            opener,
            lanes: Arc::new(Semaphore::new(LANES)),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// A lane for one extraction: the most recently used idle socket (a
    /// long-idle one checked first), or a new one.
    pub(crate) async fn lane(self: &Arc<Self>) -> Result<Lane, PoolError> {
        let permit = Arc::clone(&self.lanes)
            .acquire_owned()
            .await
            .map_err(|_| PoolError::Internal("the acknowledgement lanes are closed".into()))?;
        let idle = self.idle().pop();
        let conn = match idle {
            Some((conn, used)) if used.elapsed() < CHECK_IDLE_AFTER => conn,
            Some((mut conn, _)) => match redis::cmd("PING").query_async::<()>(&mut conn).await {
                Ok(()) => conn,
                Err(_) => self.opener.open().await?,
            },
            None => self.opener.open().await?,
        };
        Ok(Lane {
            conn: Some(conn),
            acks: Arc::clone(self),
            _permit: permit,
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(PoolConnection, Instant)>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// After a failure that points at the server (a dead socket, a demoted
    /// primary), the idle lanes are most likely in the same state: they are
    /// closed, rather than lent to the next extractions to fail one by one
    /// (after a Redis restart, as many 503s as there were idle lanes).
    fn forget_idle_after(&self, class: Option<OutageClass>) {
        if matches!(
            class,
            Some(OutageClass::Connection | OutageClass::Timeout | OutageClass::Failover)
        ) {
            self.idle().clear();
        }
    }
}

/// A socket lent to one extraction. Dropped without [`Lane::acknowledged`]
/// answering, its socket is closed (it may still hold a `WAIT`).
pub(crate) struct Lane {
    conn: Option<PoolConnection>,
    acks: Arc<Acknowledger>,
    _permit: OwnedSemaphorePermit,
}

impl Lane {
    /// The socket to run the extraction on.
    pub(crate) fn connection(&mut self) -> Result<&mut PoolConnection, PoolError> {
        self.conn
            .as_mut()
            .ok_or_else(|| PoolError::Internal("the lane was given back".into()))
    }

    /// What the `WAIT` behind the extraction's last script call answered.
    /// The socket goes back to the idle lanes if it answered, and is closed
    /// otherwise.
    pub(crate) fn acknowledged(mut self) -> Acked {
        let Some(mut conn) = self.conn.take() else {
            return Acked::Failed(OutageClass::Replication);
        };
        match conn.acknowledgement() {
            Some(Ok(n)) => {
                self.acks.idle().push((conn, Instant::now()));
                Acked::Replicas(n)
            }
            Some(Err(e)) => {
                let class = PoolError::from(e).outage_class();
                self.acks.forget_idle_after(class);
                Acked::Failed(class.unwrap_or(OutageClass::Replication))
            }
            None => Acked::Failed(OutageClass::Replication),
        }
    }

    /// The extraction failed with `failure`; its socket is closed.
    pub(crate) fn failed(self, failure: &PoolError) {
        self.acks.forget_idle_after(failure.outage_class());
    }
}
