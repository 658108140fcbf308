//! `proxy-pool serve`: the same [`handle`] behind a plain HTTP/1.1 server
//! that can be left running: every connection is bounded in time and
//! number ([`ServeOptions`]), whatever its client does.
//!
//! Deadlines, the way nginx counts them: a new connection must deliver its
//! first request's headers within the header read timeout; between
//! requests a keep-alive connection may stay silent for the idle timeout,
//! and once the next request's first byte arrives its headers must follow
//! within the header read timeout; a request's body must arrive within the
//! body read timeout. A connection past a deadline is closed. The
//! deadlines live in the connection's socket wrapper ([`Deadlined`]),
//! which the service tells when a request starts and ends.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use lambda_http::Body;
use lambda_http::http::{Request, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

use crate::distribution::{App, handle};
use crate::security::PeerAddr;

/// How long in-flight requests may take to finish after shutdown is asked for.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The bounds that let `serve` run unattended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// A request's headers must arrive within this: counted from the
    /// connection's start for its first request, from the first byte for
    /// later ones (default 10 s).
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request
    /// (default 60 s).
    pub idle_timeout: Duration,
    /// A request's body must arrive within this after its headers
    /// (default 10 s).
    pub body_read_timeout: Duration,
    /// Connections open at once; more wait in the listen backlog until one
    /// closes (default 4096: keep the file descriptor limit above it).
    pub max_connections: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(10),
            max_connections: 4096,
        }
    }
}

/// Serves `app` on `listener` with the default [`ServeOptions`] until
/// `shutdown` completes (see [`serve_with`]).
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_with(listener, app, ServeOptions::default(), shutdown).await
}

/// Serves `app` on `listener` within `options` until `shutdown` completes,
/// then stops accepting, marks the app draining and lets open requests
/// finish.
pub async fn serve_with(
    listener: TcpListener,
    app: Arc<App>,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // A free slot first: at the cap, new connections wait in the backlog.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut shutdown => break,
        };
        let Ok(slot) = slot else { break };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let clock = Arc::new(ConnectionClock::new(options));
        let service = {
            let (app, clock) = (app.clone(), clock.clone());
            hyper::service::service_fn(move |req| {
                let (app, busy) = (app.clone(), clock.begin());
                async move {
                    let response = respond(&app, req, peer, options.body_read_timeout).await;
                    drop(busy);
                    response
                }
            })
        };
        // hyper's own header timer would also run between requests (so cap
        // the idle timeout); the connection's deadlines replace it.
        let conn = http1::Builder::new()
            .header_read_timeout(None)
            .serve_connection(TokioIo::new(Deadlined::new(stream, clock)), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection closed with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    app.start_draining();
    if tokio::time::timeout(DRAIN_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("open connections did not finish in time");
    }
    Ok(())
}

/// Where one connection stands, for its deadlines.
struct ConnectionClock {
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
}

/// Marks a request as being answered until dropped.
struct Busy(Arc<ConnectionClock>);

impl Drop for Busy {
    fn drop(&mut self) {
        let parked = match self.0.state.lock() {
            Ok(mut s) => {
                s.in_flight = s.in_flight.saturating_sub(1);
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
    fn new(options: ServeOptions) -> Self {
        Self {
            options,
            state: Mutex::new(ConnectionState {
                in_flight: 0,
                first: true,
                idle_since: Instant::now(),
                first_byte: None,
                parked: None,
            }),
        }
    }

    fn begin(self: &Arc<Self>) -> Busy {
        if let Ok(mut s) = self.state.lock() {
            s.in_flight += 1;
        }
        Busy(self.clone())
    }

    fn bytes_arrived(&self) {
        if let Ok(mut s) = self.state.lock()
            && s.in_flight == 0
            && s.first_byte.is_none()
        {
            s.first_byte = Some(Instant::now());
        }
    }

    /// When the connection is to be closed if nothing changes; `None`
    /// while a request is being answered (its body has its own timeout),
    /// and then `waker` is woken when it ends.
    fn deadline(&self, waker: &Waker) -> Option<Instant> {
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

/// A connection's socket that fails a read or write waiting past the
/// connection's deadline, which makes hyper close the connection.
struct Deadlined {
    stream: TcpStream,
    clock: Arc<ConnectionClock>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
}

impl Deadlined {
    fn new(stream: TcpStream, clock: Arc<ConnectionClock>) -> Self {
        Self {
            stream,
            clock,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
        }
    }

    /// Called when the socket has nothing to give: `Ready(Err)` once the
    /// deadline has passed, else pending with the timer set to wake us.
    fn check(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Error> {
        let Some(deadline) = self.clock.deadline(cx.waker()) else {
            return Poll::Pending;
        };
        if self.armed != Some(deadline) {
            self.timer.as_mut().reset(deadline);
            self.armed = Some(deadline);
        }
        match self.timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection deadline passed",
            )),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for Deadlined {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    this.clock.bytes_arrived();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => this.check(cx).map(Err),
        }
    }
}

impl AsyncWrite for Deadlined {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Pending => this.check(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Pending => this.check(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Answers one request; an error (a body not received within
/// `body_read_timeout`) closes the connection without an answer.
async fn respond(
    app: &App,
    req: Request<Incoming>,
    peer: SocketAddr,
    body_read_timeout: Duration,
) -> Result<Response<Full<Bytes>>, std::io::Error> {
    let (mut parts, incoming) = req.into_parts();
    parts.extensions.insert(PeerAddr(peer));
    // A declared oversize body is not read at all (the handler answers 413
    // from `Content-Length`); otherwise at most one byte past the limit.
    let declared = parts
        .headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = match declared {
        Some(n) if n > app.max_body_bytes() as u64 => Body::Empty,
        _ => tokio::time::timeout(
            body_read_timeout,
            read_limited(incoming, app.max_body_bytes() + 1),
        )
        .await
        .map_err(|_| {
            tracing::debug!(%peer, "request body not received in time; connection closed");
            std::io::Error::new(std::io::ErrorKind::TimedOut, "request body read timeout")
        })?,
    };
    let response = handle(app, Request::from_parts(parts, body)).await;
    let (parts, body) = response.into_parts();
    let bytes = match body {
        Body::Empty => Bytes::new(),
        Body::Text(s) => Bytes::from(s),
        Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    };
    Ok(Response::from_parts(parts, Full::new(bytes)))
}

async fn read_limited(mut incoming: Incoming, limit: usize) -> Body {
    let mut buf = Vec::new();
    while buf.len() < limit {
        match incoming.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let room = limit - buf.len();
                    buf.extend_from_slice(&data[..data.len().min(room)]);
                }
            }
            Some(Err(_)) | None => break,
        }
    }
    if buf.is_empty() {
        Body::Empty
    } else {
        Body::Binary(buf)
    }
}
