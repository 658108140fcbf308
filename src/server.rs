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
//!
//! Request heads are bounded too: at most [`MAX_HEADER_FIELDS`] header
//! fields and [`MAX_HEAD_BYTES`]. hyper answers a head over these limits
//! (431) or one it cannot parse (400) itself, with an empty body, before
//! any service runs; the socket wrapper puts the handler's problem in
//! place of that answer ([`refused_head`]), so these are
//! `application/problem+json` with a request id like every other error.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker, ready};
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

use crate::distribution::{
    App, MAX_HEAD_BYTES, MAX_HEADER_FIELDS, RefusedHead, handle, refused_head,
};
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
            .max_headers(MAX_HEADER_FIELDS)
            .max_header_size(MAX_HEAD_BYTES)
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
    /// Answers the service returned that have not been flushed yet.
    answers_due: usize,
}

/// Marks a request as being answered until dropped.
struct Busy(Arc<ConnectionClock>);

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
    fn new(options: ServeOptions) -> Self {
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

    /// Whether what hyper writes now belongs to the service's answer
    /// (an interim `100 Continue` while a request is answered, or the
    /// answer the service returned): anything else is hyper's own.
    fn answer_owed(&self) -> bool {
        self.state
            .lock()
            .map_or(true, |s| s.in_flight > 0 || s.answers_due > 0)
    }

    /// Bytes written since the last flush have been flushed: with no
    /// request in flight, they were the oldest answer due.
    fn flushed(&self) {
        if let Ok(mut s) = self.state.lock()
            && s.in_flight == 0
        {
            s.answers_due = s.answers_due.saturating_sub(1);
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
/// connection's deadline, which makes hyper close the connection; and
/// that writes the handler's problem in place of hyper's own empty
/// answer to a request head it refused.
struct Deadlined {
    stream: TcpStream,
    clock: Arc<ConnectionClock>,
    timer: Pin<Box<Sleep>>,
    armed: Option<Instant>,
    /// Bytes passed to the socket since the last flush.
    wrote: bool,
    /// The problem answered in place of hyper's, still to be written.
    replacement: Vec<u8>,
}

impl Deadlined {
    fn new(stream: TcpStream, clock: Arc<ConnectionClock>) -> Self {
        Self {
            stream,
            clock,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
            armed: None,
            wrote: false,
            replacement: Vec::new(),
        }
    }

    /// Writes what is left of the replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.replacement.is_empty() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.replacement) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => {
                    self.replacement.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return self.check(cx).map(Err),
            }
        }
        Poll::Ready(Ok(()))
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
        if this.replacement.is_empty()
            && !this.clock.answer_owed()
            && let Some(head) = refused_by_parser(buf)
        {
            this.replacement = http1_bytes(refused_head(head));
            return Poll::Ready(Ok(buf.len()));
        }
        ready!(this.poll_replacement(cx))?;
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => {
                this.wrote = true;
                Poll::Ready(Ok(n))
            }
            Poll::Pending => this.check(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Ready(Ok(())) => {
                if std::mem::take(&mut this.wrote) {
                    this.clock.flushed();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => this.check(cx).map(Err),
            ready => ready,
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_replacement(cx))?;
        Pin::new(&mut this.stream).poll_shutdown(cx)
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
    Ok(Response::from_parts(parts, Full::new(body_bytes(body))))
}

fn body_bytes(body: Body) -> Bytes {
    match body {
        Body::Empty => Bytes::new(),
        Body::Text(s) => Bytes::from(s),
        Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    }
}

/// hyper's own answer to a request head it refused: one bodiless
/// `HTTP/1.1 4xx` head, without the `X-Request-ID` every answer of the
/// handler carries. 431 is a head over the limits; any other status (400)
/// one it could not parse.
fn refused_by_parser(buf: &[u8]) -> Option<RefusedHead> {
    let head = buf.strip_suffix(b"\r\n\r\n")?;
    let status = head.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    let lower = head.to_ascii_lowercase();
    if contains(&lower, b"\r\n\r\n") || contains(&lower, b"\r\nx-request-id:") {
        return None;
    }
    match status {
        b"431" => Some(RefusedHead::TooLarge),
        [b'4', _, _] => Some(RefusedHead::Malformed),
        _ => None,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `response` as an HTTP/1.1 answer after which the connection closes.
fn http1_bytes(response: Response<Body>) -> Vec<u8> {
    let (parts, body) = response.into_parts();
    let body = body_bytes(body);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_str(),
        parts.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let date = http_date();
    let tail = format!(
        "date: {date}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    out.extend_from_slice(tail.as_bytes());
    out.extend_from_slice(&body);
    out
}

/// Now as an HTTP date (`Tue, 03 Dec 2026 10:40:26 GMT`).
fn http_date() -> String {
    let layout = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::OffsetDateTime::now_utc()
        .format(&layout)
        .unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper's bodiless answers to refused heads are recognised; the
    /// handler's answers (an `X-Request-ID`), other statuses and more than
    /// one message are not.
    #[test]
    fn recognises_hyper_s_own_answers() {
        let hyper_s = |status: &str| {
            format!(
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\ndate: Tue, 03 Dec 2026 10:40:26 GMT\r\n\r\n"
            )
        };
        let refused = |s: String| refused_by_parser(s.as_bytes());
        assert_eq!(
            refused(hyper_s("431 Request Header Fields Too Large")),
            Some(RefusedHead::TooLarge)
        );
        assert_eq!(
            refused(hyper_s("400 Bad Request")),
            Some(RefusedHead::Malformed)
        );
        assert_eq!(refused(hyper_s("200 OK")), None);
        assert_eq!(
            refused(
                "HTTP/1.1 400 Bad Request\r\nX-Request-ID: r\r\ncontent-length: 0\r\n\r\n".into()
            ),
            None
        );
        assert_eq!(
            refused(format!(
                "{}{}",
                hyper_s("400 Bad Request"),
                hyper_s("400 Bad Request")
            )),
            None
        );
        assert_eq!(refused("HTTP/1.1 400 Bad Request\r\n".into()), None);
    }

    /// The replacement is one complete HTTP/1.1 answer that closes the
    /// connection, its body the problem.
    #[test]
    fn replacement_is_a_closing_problem() {
        let raw = String::from_utf8(http1_bytes(refused_head(RefusedHead::TooLarge))).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        // Every header line, the last included, ends with CRLF.
        let head = format!("{head}\r\n");
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\ncontent-type: application/problem+json\r\n"));
        assert!(head.contains("\r\nconnection: close\r\n"));
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        assert!(head.contains(" GMT\r\n"));
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["code"], "HEADERS_TOO_LARGE");
        let id = problem["requestId"].as_str().unwrap();
        assert!(head.contains(&format!("\r\nx-request-id: {id}\r\n")));
    }
}
