//! The connection's socket wrapper: it enforces the connection's deadline
//! on every read and write, and writes the handler's problem in place of
//! hyper's own answer to a request head it refused.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::connection::ConnectionClock;
use super::refused::{http1_bytes, refused_by_parser};
use crate::distribution::refused_head;

/// A connection's socket that fails a read or write waiting past the
/// connection's deadline, which makes hyper close the connection; and
/// that writes the handler's problem in place of hyper's own empty
/// answer to a request head it refused.
pub(super) struct Deadlined {
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
    pub(super) fn new(stream: TcpStream, clock: Arc<ConnectionClock>) -> Self {
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
