//! The thin HTTP adapter (the seeds' `distribution.Handler`): routing,
//! admission, strict decoding, problem mapping and health probes. The same
//! [`handle`] serves API Gateway events in Lambda and plain HTTP under `serve`.
//!
//! * `app.rs`: [`App`], everything a request needs, built once from the
//!   [`Settings`].
//! * `handler.rs`: [`handle`], routing, the access log, the probes and
//!   the extraction endpoint.
//! * `head.rs`: the bounds on a request head ([`RefusedHead`]).
//! * [`readiness`]: what `/health/ready` checks beyond "Redis answers".
//! * `problems.rs`: the one place every failure becomes its problem.

mod app;
mod handler;
mod head;
mod problems;
pub mod readiness;

pub use app::{App, Settings};
pub use handler::{EXTRACT_PATH, LIVE_PATH, READY_PATH, handle, refused_head};
pub use head::{MAX_HEAD_BYTES, MAX_HEADER_BYTES, MAX_HEADER_FIELDS, RefusedHead};
