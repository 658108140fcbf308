//! A loopback TCP relay for fault drills and the replication bench: put it
//! between a client and Redis (or between a replica and its primary) to
//! delay what the server sends, lose a reply, or switch to another server.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
    fault: Mutex<Option<(Vec<u8>, Fault)>>,
    cuts: watch::Sender<u64>,
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
    /// delay still held is lost, as with a host that dies.
    pub fn cut(&self) {
        self.shared.cuts.send_modify(|n| *n += 1);
    }

    /// The next request containing `needle` reaches the server and runs,
    /// but its connection is closed before the reply: a reply lost after
    /// the command took effect.
    pub fn lose_reply_to(&self, needle: &[u8]) {
        *lock(&self.shared.fault) = Some((needle.to_vec(), Fault::LoseReply));
    }

    /// The next request containing `needle` is answered, then its
    /// connection closes: the client's next command finds it dead.
    pub fn close_after_reply_to(&self, needle: &[u8]) {
        *lock(&self.shared.fault) = Some((needle.to_vec(), Fault::CloseAfterReply));
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// One connection through the relay, until either side closes or a cut.
async fn relay(client: TcpStream, shared: Arc<Shared>) {
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
    let (fault_tx, fault_rx) = watch::channel(None);
    let upstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match client_in.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let fault = {
                let mut armed = lock(&shared.fault);
                match armed.as_ref() {
                    Some((needle, fault)) if contains(&buf[..n], needle) => {
                        let fault = *fault;
                        *armed = None;
                        Some(fault)
                    }
                    _ => None,
                }
            };
            // Armed before the request leaves, so that any reply read
            // after it is known to follow the faulty request.
            if fault.is_some() {
                let _ = fault_tx.send(fault);
            }
            if server_out.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if fault.is_some() {
                std::future::pending::<()>().await;
            }
        }
    };
    let downstream = downstream(server_in, client_out, &shared, fault_rx);
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cuts.changed() => {}
    }
}

/// Server to client, each chunk held for the relay's delay. After a lost
/// reply the client is closed at once, and the server's answer awaited (so
/// the command surely ran), then dropped; after a fault closing after the
/// reply, the reply is delivered, then the connection closed.
async fn downstream(
    mut server_in: tokio::net::tcp::OwnedReadHalf,
    client_out: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    mut fault: watch::Receiver<Option<Fault>>,
) {
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer = Box::pin(write_when_due(rx, client_out));
    let mut buf = vec![0u8; CHUNK];
    let armed = fault.clone();
    let reply_is_lost = loop {
        tokio::select! {
            read = server_in.read(&mut buf) => {
                let n = match read {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let fault = *armed.borrow();
                if fault == Some(Fault::LoseReply) {
                    return;
                }
                let due = Instant::now() + *lock(&shared.delay);
                if tx.send((due, buf[..n].to_vec())).is_err() {
                    return;
                }
                if fault == Some(Fault::CloseAfterReply) {
                    break false;
                }
            },
            Ok(_) = fault.wait_for(|f| *f == Some(Fault::LoseReply)) => break true,
            _ = &mut writer => return,
        }
    };
    if reply_is_lost {
        drop(writer);
        let _ = server_in.read(&mut buf).await;
        return;
    }
    drop(tx);
    writer.await;
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
