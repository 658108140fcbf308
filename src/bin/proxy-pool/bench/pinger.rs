//! The bystander: another Redis client's `PING`, on its own connection and
//! its own OS thread (so the bench's tokio tasks cannot delay it), every
//! few milliseconds. A script blocks every other client while it runs, so
//! the worst `PING` of a window is the longest the pool's other users
//! (the Gateway's Workers among them) waited behind the extractions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::BenchError;

/// A thread pinging Redis; samples are kept only while recording.
pub(super) struct Pinger {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    recording: AtomicBool,
    stop: AtomicBool,
    /// Round trips of the pings sent while recording, microseconds (a
    /// ping that failed counts as `u64::MAX`: the bench reports it).
    samples: Mutex<Vec<u64>>,
}

/// The pings of a window.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Pings {
    pub count: usize,
    pub max_us: u64,
    pub p99_us: u64,
}

impl Pinger {
    /// Connects to `url` and pings every `every` (plus the round trip).
    pub(super) fn start(url: &str, every: Duration) -> Result<Self, BenchError> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_connection()?;
        redis::cmd("PING").query::<String>(&mut conn)?;
        let shared = Arc::new(Shared::default());
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("bench-pinger".into())
                .spawn(move || {
                    while !shared.stop.load(Ordering::Relaxed) {
                        let recording = shared.recording.load(Ordering::Relaxed);
                        let started = Instant::now();
                        let ok = redis::cmd("PING").query::<String>(&mut conn).is_ok();
                        let us = started.elapsed().as_micros() as u64;
                        if recording
                            && shared.recording.load(Ordering::Relaxed)
                            && let Ok(mut s) = shared.samples.lock()
                        {
                            s.push(if ok { us } else { u64::MAX });
                        }
                        if !ok {
                            // Reconnect on the next round.
                            match client.get_connection() {
                                Ok(c) => conn = c,
                                Err(_) => std::thread::sleep(Duration::from_millis(50)),
                            }
                        }
                        std::thread::sleep(every);
                    }
                })
                .map_err(|e| BenchError::Failed(format!("pinger thread: {e}")))?
        };
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// Keep (or stop keeping) the pings from now on.
    pub(super) fn record(&self, on: bool) {
        self.shared.recording.store(on, Ordering::Relaxed);
    }

    /// The pings kept since the last take, and forgets them.
    pub(super) fn take(&self) -> Pings {
        let mut samples = self
            .shared
            .samples
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default();
        samples.sort_unstable();
        Pings {
            count: samples.len(),
            max_us: samples.last().copied().unwrap_or(0),
            p99_us: super::figures::percentile(&samples, 0.99),
        }
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
