//! One request: its body read within the body timeout and a size bound,
//! handed to the handler, the answer turned into hyper's.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use lambda_http::Body;
use lambda_http::http::{Request, Response};

use crate::distribution::{App, handle};
use crate::security::PeerAddr;

/// Answers one request; an error (a body not received within
/// `body_read_timeout`) closes the connection without an answer.
pub(super) async fn respond(
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

pub(super) fn body_bytes(body: Body) -> Bytes {
    match body {
        Body::Empty => Bytes::new(),
        Body::Text(s) => Bytes::from(s),
        Body::Binary(b) => Bytes::from(b),
        _ => Bytes::new(),
    }
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
