//! `proxy-pool serve`: the same [`handle`] behind a plain HTTP/1.1 server.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use lambda_http::Body;
use lambda_http::http::{Request, Response};
use tokio::net::TcpListener;

use crate::distribution::{App, handle};
use crate::security::PeerAddr;

/// How long in-flight requests may take to finish after shutdown is asked for.
const DRAIN_GRACE: Duration = Duration::from_secs(10);

/// Serves `app` on `listener` until `shutdown` completes, then stops
/// accepting, marks the app draining and lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    app: Arc<App>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        continue;
                    }
                };
                let app = app.clone();
                let service = hyper::service::service_fn(move |req| {
                    let app = app.clone();
                    async move { Ok::<_, Infallible>(respond(&app, req, peer).await) }
                });
                let conn = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection closed with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
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

async fn respond(app: &App, req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
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
        _ => read_limited(incoming, app.max_body_bytes() + 1).await,
    };
    let response = handle(app, Request::from_parts(parts, body)).await;
    let (parts, body) = response.into_parts();
    let bytes = match body {
        Body::Empty => Bytes::new(),
        Body::Text(s) => Bytes::from(s),
        Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    };
    Response::from_parts(parts, Full::new(bytes))
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
