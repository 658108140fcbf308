//! A loopback TCP relay for fault drills and the replication bench: put it
//! between a client and Redis (or between a replica and its primary) to
//! delay what the server sends, lose a reply, or switch to another server.
//! An armed fault reports when it has been carried out ([`Armed::done`]),
//! so a drill reads what the fault left behind only after it happened.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

mod framer;
use framer::Framer;

/// Bytes read per chunk.
const CHUNK: usize = 64 * 1024;

/// A relay on a loopback port to a target server. Dropping it closes every
/// connection through it.
pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

struct Shared {
    target: Mutex<SocketAddr>,
    delay: Mutex<Duration>,
    fault: Mutex<Option<Pending>>,
    cuts: watch::Sender<u64>,
    /// Every open connection holds a receiver of the current sender; a cut
    /// puts a new one in place and waits for the old one's receivers.
    open: Mutex<watch::Sender<()>>,
}

/// A fault waiting for the request that triggers it.
struct Pending {
    needle: Vec<u8>,
    fault: Fault,
    done: Arc<watch::Sender<Progress>>,
}

/// How far an armed fault has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Progress {
    /// Waiting for a request containing its needle.
    Armed,
    /// Such a request has reached the relay and is on its way.
    Triggered,
    /// Carried out.
    Done,
}

/// A fault armed by [`Relay::lose_reply_to`] or
/// [`Relay::close_after_reply_to`]; tells when the relay has carried it out.
#[must_use = "wait for the fault before reading what it left behind"]
pub struct Armed(watch::Receiver<Progress>);

impl Armed {
    /// Whether a request has triggered the fault: from then on it will be
    /// carried out (see [`Armed::done`]), and later requests pass untouched.
    /// A client that saw its connection fail can tell by this whether its
    /// request met the fault or never left (a client that refuses requests
    /// while it reconnects).
    pub fn triggered(&self) -> bool {
        *self.0.borrow() >= Progress::Triggered
    }

    /// Waits until the fault has been carried out, and says whether it was:
    /// for a lost reply, the request reached the server and the server's
    /// answer came back and was dropped (so the command ran); for a close
    /// after the reply, the reply reached the client and the connection
    /// closed. `false`: it never will be (the relay was dropped or cut
    /// first, or another fault was armed before a request triggered it).
    pub async fn done(mut self) -> bool {
        self.0.wait_for(|p| *p == Progress::Done).await.is_ok()
    }
}

/// A cut made by [`Relay::cut`].
#[must_use = "wait for the cut before reading what it left behind"]
pub struct Cut(watch::Sender<()>);

impl Cut {
    /// Waits until every connection that was open at the cut has closed.
    pub async fn done(self) {
        self.0.closed().await;
    }
}

/// Where a connection's faulty request is.
#[derive(Clone)]
enum Stage {
    /// No fault on this connection.
    Clean,
    /// The request that triggers the fault is on its way to the server.
    Forwarding(Fault),
    /// It has reached the server: what the server sends next answers it.
    Forwarded(Fault, Arc<watch::Sender<Progress>>),
}

impl Stage {
    fn fault(&self) -> Option<Fault> {
        match self {
            Self::Clean => None,
            Self::Forwarding(fault) | Self::Forwarded(fault, _) => Some(*fault),
        }
    }
}

/// What happens to the connection of the next request containing a needle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Closed after forwarding the request, before the reply.
    LoseReply,
    /// Closed right after the reply reached the client.
    CloseAfterReply,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Relay {
    /// Starts relaying from a free loopback port to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            delay: Mutex::new(Duration::ZERO),
            fault: Mutex::new(None),
            cuts: watch::channel(0).0,
            open: Mutex::new(watch::channel(()).0),
        });
        let accepting = Arc::clone(&shared);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, Arc::clone(&accepting)));
            }
        });
        Ok(Self {
            port,
            shared,
            accept,
        })
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// New connections go to `target` from now on (existing ones stay: see
    /// [`Relay::cut`]).
    pub fn set_target(&self, target: SocketAddr) {
        *lock(&self.shared.target) = target;
    }

    /// Holds what the server sends for `delay` before passing it on (new
    /// and open connections): simulated network or replication lag.
    pub fn set_delay(&self, delay: Duration) {
        *lock(&self.shared.delay) = delay;
    }

    /// Closes every open connection now. What the server sent that the
    /// delay still held is lost, as with a host that dies. The answer
    /// reports when every connection open at the cut has closed, so nothing
    /// more reaches either side through them.
    pub fn cut(&self) -> Cut {
        let before = std::mem::replace(&mut *lock(&self.shared.open), watch::channel(()).0);
        self.shared.cuts.send_modify(|n| *n += 1);
        Cut(before)
    }

    /// The next request containing `needle` reaches the server and runs,
    /// but its connection is closed before the reply: a reply lost after
    /// the command took effect.
    pub fn lose_reply_to(&self, needle: &[u8]) -> Armed {
        self.arm(needle, Fault::LoseReply)
    }

    /// The next request containing `needle` is answered, then its
    /// connection closes: the client's next command finds it dead.
    pub fn close_after_reply_to(&self, needle: &[u8]) -> Armed {
        self.arm(needle, Fault::CloseAfterReply)
    }

    /// Arms `fault` for the next request containing `needle`, in place of
    /// any fault armed before and not yet triggered.
    fn arm(&self, needle: &[u8], fault: Fault) -> Armed {
        let (done, report) = watch::channel(Progress::Armed);
        *lock(&self.shared.fault) = Some(Pending {
            needle: needle.to_vec(),
            fault,
            done: Arc::new(done),
        });
        Armed(report)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        drop(self.cut());
    }
}

/// One connection through the relay, until either side closes or a cut.
async fn relay(client: TcpStream, shared: Arc<Shared>) {
    let _open = lock(&shared.open).subscribe();
    let mut cuts = shared.cuts.subscribe();
    cuts.borrow_and_update();
    let target = *lock(&shared.target);
    let Ok(server) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_in, client_out) = client.into_split();
    let (server_in, mut server_out) = server.into_split();
    let (stage_tx, stage_rx) = watch::channel(Stage::Clean);
    let upstream = async {
        let mut buf = vec![0u8; CHUNK];
        let mut framer = Framer::default();
        loop {
            let n = match client_in.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            // Whole commands only: a request split across reads is forwarded
            // whole, and a fault applies from the end of its command.
            let mut at = 0;
            while let Some(end) = framer.feed(&buf[at..n]).map(|e| at + e) {
                at = end;
                let triggered = {
                    let mut armed = lock(&shared.fault);
                    match armed.as_ref() {
                        Some(pending) if contains(framer.command(), &pending.needle) => {
                            armed.take()
                        }
                        _ => None,
                    }
                };
                let Some(pending) = triggered else { continue };
                pending.done.send_replace(Progress::Triggered);
                // Set before the command's last bytes leave, so that any
                // reply read after them is known to follow the faulty command.
                stage_tx.send_replace(Stage::Forwarding(pending.fault));
                if server_out.write_all(&buf[..end]).await.is_err() {
                    return;
                }
                stage_tx.send_replace(Stage::Forwarded(pending.fault, pending.done));
                std::future::pending::<()>().await;
            }
            if server_out.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    let downstream = downstream(server_in, client_out, &shared, stage_rx);
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cuts.changed() => {}
    }
}

/// How a connection's server-to-client direction ends, past its fault.
enum End {
    /// The reply is lost: the client is closed, the answer still awaited.
    LoseReply,
    /// The faulty request's answer was read and dropped.
    ReplyDropped(Arc<watch::Sender<Progress>>),
    /// The reply is on its way to the client; the connection closes after.
    CloseAfterReply(Arc<watch::Sender<Progress>>),
}

/// Server to client, each chunk held for the relay's delay. After a lost
/// reply the client is closed at once, and the server's answer to the
/// faulty request awaited (so the command surely ran), then dropped; after
/// a fault closing after the reply, the reply is delivered, then the
/// connection closed. Either way the fault is then reported done.
async fn downstream(
    mut server_in: tokio::net::tcp::OwnedReadHalf,
    client_out: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    mut stage: watch::Receiver<Stage>,
) {
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer = Box::pin(write_when_due(rx, client_out));
    let mut buf = vec![0u8; CHUNK];
    let current = stage.clone();
    let end = loop {
        tokio::select! {
            read = server_in.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let now = current.borrow().clone();
                match now {
                    Stage::Forwarded(Fault::LoseReply, done) => break End::ReplyDropped(done),
                    Stage::Forwarding(Fault::LoseReply) => break End::LoseReply,
                    _ => {}
                }
                let due = Instant::now() + *lock(&shared.delay);
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    return;
                }
                if let Stage::Forwarded(Fault::CloseAfterReply, done) = now {
                    break End::CloseAfterReply(done);
                }
            },
            Ok(_) = stage.wait_for(|s| s.fault() == Some(Fault::LoseReply)) => break End::LoseReply,
            _ = &mut writer => return,
        }
    };
    match end {
        End::ReplyDropped(done) => {
            drop(writer);
            done.send_replace(Progress::Done);
        }
        End::LoseReply => {
            // The client sees its connection close before any reply.
            drop(writer);
            loop {
                match server_in.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if let Stage::Forwarded(_, done) = &*current.borrow() {
                    done.send_replace(Progress::Done);
                    return;
                }
            }
        }
        End::CloseAfterReply(done) => {
            drop(tx);
            writer.await;
            done.send_replace(Progress::Done);
        }
    }
}

/// Writes each chunk to the client when it is due.
async fn write_when_due(
    mut rx: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    mut client_out: tokio::net::tcp::OwnedWriteHalf,
) {
    while let Some((due, bytes)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if client_out.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// Whether `n` replicas of the Redis at `url` acknowledge a write made now:
/// `SET key` expiring in a second (`WAIT` counts only its own connection's
/// writes), then `WAIT n 100`. A replica that has just synced can take a
/// moment before its first acknowledgement; poll this until it holds.
pub async fn replicas_acknowledge(url: &str, key: &str, n: usize) -> redis::RedisResult<bool> {
    let mut probe = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    redis::cmd("SET")
        .arg(key)
        .arg(1)
        .arg("PX")
        .arg(1000)
        .query_async::<()>(&mut probe)
        .await?;
    let acks: usize = redis::cmd("WAIT")
        .arg(n)
        .arg(100)
        .query_async(&mut probe)
        .await?;
    Ok(acks >= n)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
