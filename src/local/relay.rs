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
    lose_reply_to: Mutex<Option<Vec<u8>>>,
    cuts: watch::Sender<u64>,
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
            lose_reply_to: Mutex::new(None),
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
        *lock(&self.shared.lose_reply_to) = Some(needle.to_vec());
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
    let (lost_tx, lost_rx) = watch::channel(false);
    let upstream = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match client_in.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let lose = {
                let mut armed = lock(&shared.lose_reply_to);
                let hit = armed
                    .as_deref()
                    .is_some_and(|needle| contains(&buf[..n], needle));
                if hit {
                    *armed = None;
                }
                hit
            };
            if server_out.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if lose {
                let _ = lost_tx.send(true);
                std::future::pending::<()>().await;
            }
        }
    };
    let downstream = downstream(server_in, client_out, &shared, lost_rx);
    tokio::select! {
        _ = upstream => {}
        _ = downstream => {}
        _ = cuts.changed() => {}
    }
}

/// Server to client, each chunk held for the relay's delay. After a lost
/// reply the client is closed at once, and the server's answer awaited (so
/// the command surely ran), then dropped.
async fn downstream(
    mut server_in: tokio::net::tcp::OwnedReadHalf,
    client_out: tokio::net::tcp::OwnedWriteHalf,
    shared: &Shared,
    mut lost: watch::Receiver<bool>,
) {
    let (tx, rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut writer = Box::pin(write_when_due(rx, client_out));
    let mut buf = vec![0u8; CHUNK];
    loop {
        tokio::select! {
            read = server_in.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = Instant::now() + *lock(&shared.delay);
                    if tx.send((due, buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            },
            _ = lost.wait_for(|lost| *lost) => break,
            _ = &mut writer => return,
        }
    }
    drop(writer);
    let _ = server_in.read(&mut buf).await;
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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
