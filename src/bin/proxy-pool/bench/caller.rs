//! How a cell's task reaches the handler: in process, as the Lambda
//! runtime calls it, or over HTTP/1.1 through `serve`'s server.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use lambda_http::Body;
use lambda_http::http::StatusCode;
use proxy_pool::distribution::{self, App};
use proxy_pool::security::PeerAddr;

/// Where requests go: one handler per (`replica_acks`, `script_calls`)
/// pair of the plan.
#[derive(Clone)]
pub(super) enum Front {
    /// Called in process, as the Lambda runtime calls it.
    InProcess(Arc<App>),
    /// `serve`'s HTTP/1.1 server on this loopback address.
    Http(SocketAddr),
}

/// One task's way to the handler.
pub(super) enum Caller {
    InProcess(Arc<App>, PeerAddr),
    /// One keep-alive connection.
    Http(SendRequest<Full<Bytes>>),
}

impl Caller {
    /// A caller for one task: its own connection with `--http`.
    pub(super) async fn connect(front: Front, peer: PeerAddr) -> Option<Self> {
        match front {
            Front::InProcess(app) => Some(Self::InProcess(app, peer)),
            Front::Http(addr) => {
                let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
                stream.set_nodelay(true).ok()?;
                let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
                tokio::spawn(conn);
                Some(Self::Http(sender))
            }
        }
    }

    /// Sends one request; its status and body, `None` if it failed on
    /// the way.
    pub(super) async fn call(
        &mut self,
        request: lambda_http::http::request::Builder,
        body: String,
    ) -> Option<(StatusCode, String)> {
        match self {
            Self::InProcess(app, peer) => {
                let mut request = request.body(Body::from(body)).ok()?;
                request.extensions_mut().insert(*peer);
                let response = distribution::handle(app, request).await;
                let status = response.status();
                let text = match response.into_body() {
                    Body::Text(s) => s,
                    Body::Binary(b) => String::from_utf8(b).ok()?,
                    _ => String::new(),
                };
                Some((status, text))
            }
            Self::Http(sender) => {
                let request = request
                    .header("host", "127.0.0.1")
                    .body(Full::new(Bytes::from(body)))
                    .ok()?;
                sender.ready().await.ok()?;
                let response = sender.send_request(request).await.ok()?;
                let status = response.status();
                let bytes = response.into_body().collect().await.ok()?.to_bytes();
                Some((status, String::from_utf8(bytes.to_vec()).ok()?))
            }
        }
    }
}
