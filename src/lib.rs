//! Proxy Pool Distribution function: hands short-lived proxies out of a Redis
//! TTL pool, each to exactly one client, in one atomic Lua script call.
//!
//! Module map, outside in:
//!
//! * [`lambda`]: the Lambda function: sorts each event into HTTP (to
//!   [`distribution`]), the scheduled health check or an error.
//! * [`scheduled`]: the EventBridge health check: readiness, prune,
//!   inventory as CloudWatch Embedded Metric Format lines.
//! * [`distribution`]: the thin HTTP adapter shared by Lambda and `serve`:
//!   routing, admission, decoding, problem mapping, health.
//! * [`httpapi`]: request ids, RFC 9457 problems, JSON responses.
//! * [`security`]: who is calling and may they: trusted proxies, source
//!   control, authentication, the client registry, rate limits.
//! * [`extraction`]: request/response types and the service applying policy.
//! * [`pool`]: the Redis pool: key layout, Lua scripts (`lua/`), adapter,
//!   and its connection (one server or a Redis Cluster, TLS, replica acks).
//! * [`config`]: typed settings from `PROXY_POOL_*` variables.
//! * [`secrets`]: AWS Secrets Manager: client registry and Redis credentials.
//! * [`server`]: the plain HTTP server behind `proxy-pool serve`.
//! * [`local`]: a private `redis-server` and a demo pool for running locally.
//! * [`telemetry`]: tracing set-up (JSON in Lambda, text locally).

pub mod clock;
pub mod config;
pub mod distribution;
pub mod extraction;
pub mod httpapi;
pub mod lambda;
pub mod local;
pub mod pool;
pub mod scheduled;
pub mod secrets;
pub mod security;
pub mod server;
pub mod startup;
pub mod telemetry;
