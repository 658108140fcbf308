//! `proxy-pool serve`: the same [`handle`](crate::distribution::handle)
//! behind a plain HTTP/1.1 server that can be left running: every
//! connection is bounded in time and number ([`ServeOptions`]), whatever
//! its client does.
//!
//! Deadlines, the way nginx counts them: a new connection must deliver its
//! first request's headers within the header read timeout; between
//! requests a keep-alive connection may stay silent for the idle timeout,
//! and once the next request's first byte arrives its headers must follow
//! within the header read timeout; a request's body must arrive within the
//! body read timeout. A connection past a deadline is closed. The
//! deadlines live in the connection's socket wrapper, which the service
//! tells when a request starts and ends.
//!
//! Request heads are bounded too: at most
//! [`MAX_HEADER_FIELDS`](crate::distribution::MAX_HEADER_FIELDS) header
//! fields and [`MAX_HEAD_BYTES`](crate::distribution::MAX_HEAD_BYTES).
//! hyper answers a head over these limits (431) or one it cannot parse
//! (400) itself, with an empty body, before any service runs; the socket
//! wrapper puts the handler's problem in place of that answer
//! ([`refused_head`](crate::distribution::refused_head)), so these are
//! `application/problem+json` with a request id like every other error.
//!
//! * `options.rs`: the bounds ([`ServeOptions`]).
//! * `serve.rs`: the accept loop and graceful shutdown ([`serve_with`]).
//! * `connection.rs`: where one connection stands, and its deadline.
//! * `socket.rs`: the socket wrapper that enforces it (`Deadlined`).
//! * `request.rs`: one request's body, the handler, the answer.
//! * `refused.rs`: hyper's answer to a refused head, and its replacement.

mod connection;
mod options;
mod refused;
mod request;
mod serve;
mod socket;

pub use options::ServeOptions;
pub use serve::{serve, serve_with};
