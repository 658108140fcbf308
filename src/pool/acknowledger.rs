//! Replica acknowledgement shared by concurrent extractions (group commit).
//!
//! `WAIT n t` answers how many replicas hold every write sent on *its own
//! connection* before it, and blocks that connection meanwhile. So
//! acknowledged extractions run on lanes: up to [`LANES`] connections of one
//! socket each to the primary, opened on first use and never replaced
//! behind our back (each new socket gets a new epoch). New extractions go to
//! the collecting lane, at most [`LANE_BATCH`] running at once while an
//! idle lane exists, never to a lane whose `WAIT` is in flight while
//! another is open. Once a lane holds committed extractions and nothing is
//! running on it, one `WAIT` on it acknowledges them all; a collecting lane
//! holding commits also hands the role on when `WAIT`s have been spaced by
//! `wait / (LANES / 2)` (the recent `WAIT` time). So `WAIT`s overlap and an
//! extraction waits about one replication round trip, not one per request
//! ahead of it.
//!
//! An acknowledgement counts only for extractions that ran on the very
//! socket the `WAIT` was sent on: if the lane's connection was replaced in
//! between (a drop, a failover), they get [`Acked::Replaced`] and are
//! answered 503, never confirmed by a `WAIT` that covered none of their
//! writes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::connection::{DirectOpener, PoolConnection};
use super::error::{OutageClass, PoolError};

/// Most connections one process opens for acknowledged extractions.
const LANES: usize = 32;

/// Extractions running on the collecting lane before the next one goes to
/// an idle lane. A lane's `WAIT` starts once everything on it has run, and
/// the replicas answer about one replication delay after it starts, so
/// small batches get their `WAIT` out sooner. Measured at C=64 (README,
/// Performance): 2 beat 1, 4 and unbounded batches.
const LANE_BATCH: usize = 2;

/// What became of an extraction's acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acked {
    /// This many replicas acknowledged its write.
    Replicas(u64),
    /// The socket that carried its write was replaced before a `WAIT`.
    Replaced,
    /// The `WAIT` failed (timed out, connection lost).
    Failed(OutageClass),
}

/// One lane's socket, as used by one extraction.
#[derive(Clone)]
pub(crate) struct Lane {
    /// Which lane.
    pub index: usize,
    /// Which socket of that lane (unique in the process).
    pub epoch: u64,
    /// The socket.
    pub conn: PoolConnection,
}

/// Runs `WAIT` for groups of extractions, over lanes of their own.
pub(crate) struct Acknowledger {
    opener: DirectOpener,
    replicas: u32,
    wait_timeout: Duration,
    bound: Duration,
    sockets: Vec<tokio::sync::Mutex<Option<Lane>>>,
    next_epoch: AtomicU64,
    schedule: Mutex<Schedule>,
}

impl Acknowledger {
    /// Acknowledgement by `replicas` replicas within `wait_timeout`; every
    /// Redis call bounded by `bound`.
    pub(crate) fn new(
        opener: DirectOpener,
        replicas: u32,
        wait_timeout: Duration,
        bound: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            opener,
            replicas,
            wait_timeout,
            bound,
            sockets: (0..LANES).map(|_| tokio::sync::Mutex::new(None)).collect(),
            next_epoch: AtomicU64::new(1),
            schedule: Mutex::new(Schedule::new()),
        })
    }

    /// Joins the collecting lane; the ticket's lane runs the extraction.
    pub(crate) fn enter(self: &Arc<Self>) -> Ticket {
        let lane = self.schedule().enter();
        Ticket {
            acks: Arc::clone(self),
            lane,
            done: false,
        }
    }

    /// The lane's socket, opened if it has none.
    pub(crate) async fn connection(&self, lane: usize) -> Result<Lane, PoolError> {
        let mut slot = self.socket(lane).lock().await;
        if let Some(open) = slot.as_ref() {
            return Ok(open.clone());
        }
        let conn = self.opener.open().await?;
        let open = Lane {
            index: lane,
            epoch: self.next_epoch.fetch_add(1, Ordering::Relaxed),
            conn,
        };
        *slot = Some(open.clone());
        Ok(open)
    }

    /// Forgets the lane's socket after `failure` if it may be dead or
    /// talking to a demoted primary; the next use opens a new one.
    pub(crate) async fn discard_after(&self, lane: &Lane, failure: &PoolError) {
        let suspect = matches!(
            failure.outage_class(),
            Some(OutageClass::Connection | OutageClass::Timeout | OutageClass::Failover)
        );
        if suspect {
            self.discard(lane).await;
        }
    }

    async fn discard(&self, lane: &Lane) {
        let mut slot = self.socket(lane.index).lock().await;
        if slot.as_ref().is_some_and(|open| open.epoch == lane.epoch) {
            *slot = None;
        }
    }

    fn socket(&self, lane: usize) -> &tokio::sync::Mutex<Option<Lane>> {
        &self.sockets[lane % LANES]
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn start(self: &Arc<Self>, flushes: Vec<Flush>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        for flush in flushes {
            runtime.spawn(Arc::clone(self).flush(flush));
        }
    }

    /// One `WAIT` on the lane's current socket for the waiters of `flush`.
    async fn flush(self: Arc<Self>, flush: Flush) {
        let started = Instant::now();
        let current = self.socket(flush.lane).lock().await.clone();
        let answer = match &current {
            None => Err(Acked::Replaced),
            Some(lane) => {
                let mut conn = lane.conn.clone();
                let wait = conn.wait_for_replicas(self.replicas, self.wait_timeout);
                match tokio::time::timeout(self.bound, wait).await {
                    Ok(Ok(n)) => Ok((lane.epoch, n)),
                    Ok(Err(e)) => {
                        let e = PoolError::from(e);
                        self.discard_after(lane, &e).await;
                        Err(Acked::Failed(
                            e.outage_class().unwrap_or(OutageClass::Replication),
                        ))
                    }
                    Err(_) => {
                        self.discard(lane).await;
                        Err(Acked::Failed(OutageClass::Timeout))
                    }
                }
            }
        };
        for waiter in flush.waiters {
            let acked = match answer {
                Ok((epoch, n)) if epoch == waiter.epoch => Acked::Replicas(n),
                Ok(_) => Acked::Replaced,
                Err(why) => why,
            };
            let _ = waiter.reply.send(acked);
        }
        let next = self.schedule().finished(flush.lane, started.elapsed());
        self.start(next);
    }
}

/// A place on a lane, held while the extraction runs there.
pub(crate) struct Ticket {
    acks: Arc<Acknowledger>,
    lane: usize,
    done: bool,
}

impl Ticket {
    /// The lane to run on.
    pub(crate) fn lane(&self) -> usize {
        self.lane
    }

    /// The extraction committed on socket `epoch` of this lane: waits for
    /// the `WAIT` that covers it.
    pub(crate) async fn acknowledged(mut self, epoch: u64) -> Acked {
        let (reply, answer) = oneshot::channel();
        self.done = true;
        let flushes = self
            .acks
            .schedule()
            .leave(self.lane, Some(Waiter { epoch, reply }));
        self.acks.start(flushes);
        answer
            .await
            .unwrap_or(Acked::Failed(OutageClass::Replication))
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            let flushes = self.acks.schedule().leave(self.lane, None);
            self.acks.start(flushes);
        }
    }
}

struct Waiter {
    epoch: u64,
    reply: oneshot::Sender<Acked>,
}

struct Flush {
    lane: usize,
    waiters: Vec<Waiter>,
}

#[derive(Default)]
struct LaneState {
    /// Extractions running on the lane.
    running: usize,
    /// A `WAIT` is in flight on it.
    waiting: bool,
    /// Committed extractions no `WAIT` has covered yet.
    pending: Vec<Waiter>,
}

impl LaneState {
    fn idle(&self) -> bool {
        !self.waiting && self.running == 0 && self.pending.is_empty()
    }
}

/// Which lane collects, and when each lane's `WAIT` starts.
struct Schedule {
    collecting: usize,
    lanes: Vec<LaneState>,
    /// Recent `WAIT` time (moving average).
    wait_time: Duration,
    last_flush: Option<Instant>,
}

impl Schedule {
    fn new() -> Self {
        Self {
            collecting: 0,
            lanes: (0..LANES).map(|_| LaneState::default()).collect(),
            wait_time: Duration::ZERO,
            last_flush: None,
        }
    }

    /// The lane a new extraction runs on: the collecting one, unless it
    /// has a `WAIT` in flight (which would hold the script back until it
    /// answers) or a full batch; then an idle lane, or else the open lane
    /// with the fewest running.
    fn enter(&mut self) -> usize {
        let current = &self.lanes[self.collecting];
        if current.waiting || current.running >= LANE_BATCH {
            if let Some(idle) = self.idle_lane() {
                self.collecting = idle;
            } else if current.waiting
                && let Some(open) = (0..LANES)
                    .filter(|&lane| !self.lanes[lane].waiting)
                    .min_by_key(|&lane| self.lanes[lane].running)
            {
                self.collecting = open;
            }
        }
        self.lanes[self.collecting].running += 1;
        self.collecting
    }

    fn leave(&mut self, lane: usize, waiter: Option<Waiter>) -> Vec<Flush> {
        let state = &mut self.lanes[lane % LANES];
        state.running = state.running.saturating_sub(1);
        state.pending.extend(waiter);
        self.plan()
    }

    fn finished(&mut self, lane: usize, took: Duration) -> Vec<Flush> {
        self.lanes[lane % LANES].waiting = false;
        self.wait_time = (self.wait_time * 3 + took) / 4;
        self.plan()
    }

    /// Moves the collecting role off a busy lane holding committed
    /// extractions (when an idle lane exists and `WAIT`s stay spaced), and
    /// starts a `WAIT` on every lane with committed extractions and nothing
    /// running.
    fn plan(&mut self) -> Vec<Flush> {
        let now = Instant::now();
        let spacing = self.wait_time / (LANES as u32 / 2);
        let spaced = self
            .last_flush
            .is_none_or(|last| now.duration_since(last) >= spacing);
        let collecting = &self.lanes[self.collecting];
        if spaced
            && collecting.running > 0
            && !collecting.pending.is_empty()
            && let Some(idle) = self.idle_lane()
        {
            self.collecting = idle;
        }
        let mut flushes = Vec::new();
        for (lane, state) in self.lanes.iter_mut().enumerate() {
            if !state.waiting && state.running == 0 && !state.pending.is_empty() {
                state.waiting = true;
                flushes.push(Flush {
                    lane,
                    waiters: std::mem::take(&mut state.pending),
                });
            }
        }
        if !flushes.is_empty() {
            self.last_flush = Some(now);
        }
        flushes
    }

    fn idle_lane(&self) -> Option<usize> {
        (0..LANES).find(|&lane| lane != self.collecting && self.lanes[lane].idle())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter() -> (Waiter, oneshot::Receiver<Acked>) {
        let (reply, rx) = oneshot::channel();
        (Waiter { epoch: 1, reply }, rx)
    }

    /// Alone, an extraction gets its `WAIT` at once, on the same lane
    /// every time (one connection for a Lambda instance).
    #[test]
    fn a_lone_extraction_waits_at_once_on_one_lane() {
        let mut s = Schedule::new();
        for _ in 0..3 {
            let lane = s.enter();
            assert_eq!(lane, 0);
            let flushes = s.leave(lane, Some(waiter().0));
            assert_eq!(flushes.len(), 1);
            assert_eq!(flushes[0].waiters.len(), 1);
            assert!(s.finished(lane, Duration::from_millis(2)).is_empty());
        }
    }

    /// Concurrent extractions share a `WAIT`: it starts only when nothing
    /// runs on the lane, covering all that committed there; a full batch
    /// sends the next extraction to another lane.
    #[test]
    fn concurrent_extractions_share_one_wait() {
        let mut s = Schedule::new();
        let a = s.enter();
        let b = s.enter();
        assert_eq!((a, b), (0, 0));
        assert_eq!(s.enter(), 1, "lane 0 holds a full batch");
        assert!(s.leave(a, Some(waiter().0)).is_empty());
        let flushes = s.leave(b, Some(waiter().0));
        assert_eq!(flushes.len(), 1);
        assert_eq!((flushes[0].lane, flushes[0].waiters.len()), (0, 2));
    }

    /// With no idle lane, a new extraction goes where no `WAIT` holds the
    /// socket (the fewest running), never behind a `WAIT`.
    #[test]
    fn no_extraction_waits_behind_a_wait_while_a_lane_is_open() {
        let mut s = Schedule::new();
        for lane in &mut s.lanes {
            lane.waiting = true;
        }
        s.lanes[5] = LaneState {
            running: 3,
            ..LaneState::default()
        };
        s.lanes[9] = LaneState {
            running: 2,
            ..LaneState::default()
        };
        assert_eq!(s.enter(), 9);
        assert_eq!(s.lanes[9].running, 3);
    }

    /// A lane whose extraction was abandoned (its ticket dropped) neither
    /// blocks nor waits for nothing.
    #[test]
    fn an_abandoned_extraction_leaves_its_lane() {
        let mut s = Schedule::new();
        let lane = s.enter();
        assert!(s.leave(lane, None).is_empty());
        assert!(s.lanes.iter().all(LaneState::idle));
    }
}
