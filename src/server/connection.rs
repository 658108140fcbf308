//! Where one connection stands: requests in flight, answers owed, and
//! from these its deadline (the way nginx counts them; see the
//! documentation of `server`).

use std::sync::{Arc, Mutex};
use std::task::Waker;

use tokio::time::Instant;

use super::options::ServeOptions;

/// Where one connection stands, for its deadlines.
pub(super) struct ConnectionClock {
    options: ServeOptions,
    state: Mutex<ConnectionState>,
}

struct ConnectionState {
    /// Requests being answered.
    in_flight: usize,
    /// No request answered yet.
    first: bool,
    /// When the connection opened, or its last request was answered.
    idle_since: Instant,
    /// The first byte read since then.
    first_byte: Option<Instant>,
    /// The connection's task, parked on the socket while a request was
    /// answered (no deadline then): woken when the request ends, so its
    /// idle deadline is set.
    parked: Option<Waker>,
    /// Answers the service returned that have not been flushed yet.
    answers_due: usize,
}

/// Marks a request as being answered until dropped.
pub(super) struct Busy(Arc<ConnectionClock>);

impl Drop for Busy {
    fn drop(&mut self) {
        let parked = match self.0.state.lock() {
            Ok(mut s) => {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.answers_due += 1;
                if s.in_flight == 0 {
                    s.first = false;
                    s.idle_since = Instant::now();
                    s.first_byte = None;
                    s.parked.take()
                } else {
                    None
                }
            }
            Err(_) => None,
        };
        if let Some(waker) = parked {
            waker.wake();
        }
    }
}

impl ConnectionClock {
    pub(super) fn new(options: ServeOptions) -> Self {
        Self {
            options,
            state: Mutex::new(ConnectionState {
                in_flight: 0,
                first: true,
                idle_since: Instant::now(),
                first_byte: None,
                parked: None,
                answers_due: 0,
            }),
        }
    }

    pub(super) fn begin(self: &Arc<Self>) -> Busy {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight += 1;
        }
        Busy(self.clone())
    }

    pub(super) fn bytes_arrived(&self) {
        if let Ok(mut s) = self.state.lock()
            && s.in_flight == 0
            && s.first_byte.is_none()
        {
            s.first_byte = Some(Instant::now());
        }
    }

    /// Whether what hyper writes now belongs to the service's answer
    /// (an interim `100 Continue` while a request is answered, or the
    /// answer the service returned): anything else is hyper's own.
    pub(super) fn answer_owed(&self) -> bool {
        self.state
            .lock()
            .map_or(true, |s| s.in_flight > 0 || s.answers_due > 0)
    }

    /// Bytes written since the last flush have been flushed: with no
    /// request in flight, they were the oldest answer due.
    pub(super) fn flushed(&self) {
        if let Ok(mut s) = self.state.lock()
            && s.in_flight == 0
        {
            s.answers_due = s.answers_due.saturating_sub(1);
        }
    }

    /// When the connection is to be closed if nothing changes; `None`
    /// while a request is being answered (its body has its own timeout),
    /// and then `waker` is woken when it ends.
    pub(super) fn deadline(&self, waker: &Waker) -> Option<Instant> {
        let mut s = self.state.lock().ok()?;
        let o = &self.options;
        match (s.in_flight, s.first, s.first_byte) {
            (1.., _, _) => {
                s.parked = Some(waker.clone());
                None
            }
            (0, true, _) => Some(s.idle_since + o.header_read_timeout),
            (0, false, Some(at)) => Some(at + o.header_read_timeout),
            (0, false, None) => Some(s.idle_since + o.idle_timeout),
        }
    }
}
