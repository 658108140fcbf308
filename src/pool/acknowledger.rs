//! Replica acknowledgement by group commit: the script calls of concurrent
//! extractions go out together, in one write, with one `WAIT` behind them.
//!
//! `WAIT n t` answers how many replicas hold every write sent on *its own
//! connection* before it, and blocks that connection meanwhile. So
//! acknowledged extractions do not use the shared connection. Each one's
//! script call joins the batch being collected; the batch waits one turn
//! of the scheduler (so that calls arriving together share it), then
//! borrows a lane (a socket to the primary that only this batch uses until
//! it is answered) and sends every call and one `WAIT` as one pipeline.
//! Nothing waits for another batch's `WAIT`, nor for a batch's scripts to
//! reply before its `WAIT` can start.
//!
//! The acknowledgement is proven on the socket that carried the writes: the
//! calls and their `WAIT` are one write on one connection that never
//! reconnects, so that `WAIT` counts exactly the writes made before it on
//! that socket. A lane that failed, timed out or answered with a failover
//! error is closed, never lent again.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::{Semaphore, oneshot};

use super::connection::{DirectOpener, PoolConnection, ScriptConnection};
use super::error::{OutageClass, outage_class};

/// Most sockets one process opens for acknowledged extractions: as many
/// batches can wait for replicas at once; more wait for a lane.
const LANES: usize = 128;

/// Most script calls in one batch.
const MAX_BATCH: usize = 64;

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

/// A call's reply, and what the `WAIT` behind it answered.
type Answer = (RedisResult<Value>, RedisResult<u64>);

/// The calls of one batch, each with where its answer goes.
type Batch = Vec<(Cmd, oneshot::Sender<Answer>)>;

/// Collects script calls into batches and sends each with its `WAIT`.
pub(crate) struct Acknowledger {
    opener: DirectOpener,
    wait: Cmd,
    lanes: Arc<Semaphore>,
    /// Sockets given back, the most recently used last.
    idle: Mutex<Vec<(PoolConnection, Instant)>>,
    /// The batch being collected.
    collecting: Mutex<Option<Batch>>,
}

impl Acknowledger {
    /// Batches sent on lanes opened by `opener`, each followed by
    /// `WAIT replicas wait_timeout`.
    pub(crate) fn new(opener: DirectOpener, replicas: u32, wait_timeout: Duration) -> Arc<Self> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(wait_timeout.as_millis() as u64);
        Arc::new(Self {
            opener,
            wait,
            lanes: Arc::new(Semaphore::new(LANES)),
            idle: Mutex::new(Vec::new()),
            collecting: Mutex::new(None),
        })
    }

    /// A connection for one extraction whose script calls are acknowledged.
    pub(crate) fn connection(self: &Arc<Self>) -> AckedConnection {
        AckedConnection {
            acks: Arc::clone(self),
            acked: None,
        }
    }

    /// Adds `cmd` to the batch being collected (or starts one) and waits
    /// for its answer.
    async fn submit(self: &Arc<Self>, cmd: Cmd) -> Answer {
        let (reply, answer) = oneshot::channel();
        let full = {
            let mut collecting = lock(&self.collecting);
            match collecting.as_mut() {
                Some(batch) if batch.len() < MAX_BATCH => {
                    batch.push((cmd, reply));
                    None
                }
                _ => {
                    let full = collecting.replace(vec![(cmd, reply)]);
                    tokio::spawn(Arc::clone(self).send_after_a_turn());
                    full
                }
            }
        };
        if let Some(full) = full {
            tokio::spawn(Arc::clone(self).send(full));
        }
        answer.await.unwrap_or_else(|_| {
            let lost = || RedisError::from((ErrorKind::Io, "the batch was dropped"));
            (Err(lost()), Err(lost()))
        })
    }

    /// Lets the calls that are ready now join, then sends the batch.
    async fn send_after_a_turn(self: Arc<Self>) {
        tokio::task::yield_now().await;
        let batch = lock(&self.collecting).take();
        if let Some(batch) = batch {
            self.send(batch).await;
        }
    }

    /// Sends `batch` and its `WAIT` on a lane, in one write, and hands out
    /// the answers.
    async fn send(self: Arc<Self>, batch: Batch) {
        let (cmds, replies): (Vec<Cmd>, Vec<_>) = batch.into_iter().unzip();
        let mut pipe = redis::pipe();
        for cmd in cmds {
            pipe.add_command(cmd);
        }
        pipe.add_command(self.wait.clone());
        let calls = replies.len();
        let sent = match self.lane().await {
            Ok(mut lane) => {
                let sent = lane
                    .conn
                    .req_packed_commands(&pipe, 0, calls + 1)
                    .await
                    .and_then(|mut values| match values.pop() {
                        Some(wait) if values.len() == calls => Ok((values, wait)),
                        _ => Err(RedisError::from((
                            ErrorKind::Client,
                            "a batch and its WAIT answered with an unexpected reply count",
                        ))),
                    });
                match &sent {
                    Ok((values, wait)) if values.iter().chain([wait]).all(is_healthy) => {
                        lock(&self.idle).push((lane.conn, Instant::now()));
                    }
                    _ => self.forget_idle_lanes(),
                }
                sent
            }
            Err(e) => Err(e),
        };
        match sent {
            Ok((values, wait)) => {
                let acked = wait
                    .extract_error()
                    .and_then(|v| Ok(redis::from_redis_value::<u64>(v)?));
                for (reply, value) in replies.into_iter().zip(values) {
                    let _ = reply.send((Ok(value), acked.clone()));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send((Err(e.clone()), Err(e.clone())));
                }
            }
        }
    }

    /// A socket for one batch: the most recently used idle one (a
    /// long-idle one checked first), or a new one.
    async fn lane(&self) -> RedisResult<LentLane> {
        let permit = Arc::clone(&self.lanes)
            .acquire_owned()
            .await
            .map_err(|_| RedisError::from((ErrorKind::Client, "the lanes are closed")))?;
        let idle = lock(&self.idle).pop();
        let conn = match idle {
            Some((conn, used)) if used.elapsed() < CHECK_IDLE_AFTER => conn,
            Some((mut conn, _)) => match redis::cmd("PING").query_async::<()>(&mut conn).await {
                Ok(()) => conn,
                Err(_) => self.opener.open().await?,
            },
            None => self.opener.open().await?,
        };
        Ok(LentLane {
            conn,
            _permit: permit,
        })
    }

    /// After a failure that points at the server (a dead socket, a demoted
    /// primary), the idle lanes are most likely in the same state: they are
    /// closed, rather than lent to the next batches to fail one by one
    /// (after a Redis restart, as many failures as there were idle lanes).
    fn forget_idle_lanes(&self) {
        lock(&self.idle).clear();
    }
}

/// A lane's socket while one batch uses it.
struct LentLane {
    conn: PoolConnection,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Whether a reply leaves its socket fit for the next batch: anything but
/// an error saying the socket is dead or talks to a demoted primary.
fn is_healthy(value: &Value) -> bool {
    match value {
        Value::ServerError(e) => !matches!(
            outage_class(&RedisError::from(e.clone())),
            Some(OutageClass::Connection | OutageClass::Timeout | OutageClass::Failover)
        ),
        _ => true,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One extraction's way to Redis when its writes must be acknowledged:
/// each script call joins a batch (see the module), every other command
/// too (a `WAIT` behind a `PING` or `SCRIPT LOAD` returns at once).
pub(crate) struct AckedConnection {
    acks: Arc<Acknowledger>,
    acked: Option<RedisResult<u64>>,
}

impl AckedConnection {
    /// What the `WAIT` behind the last call answered.
    pub(crate) fn acknowledged(&mut self) -> Acked {
        match self.acked.take() {
            Some(Ok(n)) => Acked::Replicas(n),
            Some(Err(e)) => Acked::Failed(outage_class(&e).unwrap_or(OutageClass::Replication)),
            None => Acked::Failed(OutageClass::Replication),
        }
    }
}

/// A lane is one socket to the pool's primary: every command goes there.
impl ScriptConnection for AckedConnection {}

impl ConnectionLike for AckedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (reply, acked) = self.acks.submit(cmd.clone()).await;
            self.acked = Some(acked);
            reply?.extract_error()
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _pipeline: &'a Pipeline,
        _offset: usize,
        _count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async {
            Err(RedisError::from((
                ErrorKind::Client,
                "pipelines are not sent through an acknowledged connection",
            )))
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
