//! The accept loop: a connection slot, the connection with its deadlines
//! and head bounds, each request to the handler; and the graceful
//! shutdown that drains them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use super::connection::ConnectionClock;
use super::options::ServeOptions;
use super::request::respond;
use super::socket::Deadlined;
use crate::distribution::{App, MAX_HEAD_BYTES, MAX_HEADER_FIELDS};

/// How long in-flight requests may take to finish after shutdown is asked for.
const DRAIN_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors), so the loop
/// does not spin while the condition lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

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
