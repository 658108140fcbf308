//! Proxy Pool Distribution function: hands short-lived proxies out of a Redis
//! TTL pool, each to exactly one client, in one atomic Lua script call.
//!
//! Module map, outside in. Each layer may import only the layers listed
//! after its arrow (`tests/architecture.rs` reads every `crate::` path in
//! `src/` and fails on any other edge, so the graph stays a DAG that points
//! inward). The entrypoints (`src/main.rs`, the CLI in `src/bin/`) wire
//! everything and may use anything.
//!
//! * [`lambda`] → distribution, scheduled, aggregates, pool, config, clock:
//!   the Lambda function: sorts each event into HTTP (to [`distribution`]),
//!   the scheduled health check (and aggregates flush), or an error.
//! * [`server`] → distribution, security: the plain HTTP server behind
//!   `proxy-pool serve`.
//! * [`startup`] → config, secrets, security, pool, aggregates: what the
//!   Lambda function and `serve` do before serving, the same way: the Redis
//!   URL (re-read from its secret when Redis refuses it), the pool (whose
//!   options it builds from the settings: the pool never sees `Config`),
//!   the client registry and the aggregates database.
//! * [`scheduled`] → aggregates, pool, clock: the EventBridge health check:
//!   readiness, prune, inventory as CloudWatch Embedded Metric Format lines,
//!   and the flush of the usage aggregates.
//! * [`aggregates`] → secrets, pool, clock, config: usage aggregates in
//!   PostgreSQL: the flush of closed hourly counters out of Redis, the
//!   schema's migrations, the queries behind `proxy-pool usage`. Never on
//!   the extraction path.
//! * [`secrets`] → security: AWS Secrets Manager: the client registry
//!   document and Redis credentials.
//! * [`distribution`] → extraction, security, httpapi, pool, config: the
//!   thin HTTP adapter shared by Lambda and `serve`: routing, admission,
//!   decoding, health, and the one place a failure becomes a problem.
//! * [`extraction`] → security, pool, httpapi, clock, config: the request
//!   and its validation, the service applying the caller's identity and the
//!   server's policy, the rendered body.
//! * [`security`] → pool, httpapi, config: who is calling and may they:
//!   trusted proxies, source control, authentication, the client registry
//!   (a document in memory, or one entry per client in Redis), rate limits.
//! * [`local`] → pool: a private `redis-server`, synthetic proxies (the demo
//!   pool, the bench's pools) and a fault-injecting TCP relay (the drills,
//!   the replication bench). Only with the `local` cargo feature (on by
//!   default): the CLI, the tests and the benches need it, the Lambda is
//!   built without it.
//! * [`httpapi`]: request ids, RFC 9457 problems, JSON responses.
//! * [`pool`] → clock, config: the Redis pool: key layout, Lua scripts
//!   (`lua/`), the adapter and its connection (one server or a Redis
//!   Cluster, TLS, replica acks), the contract operations, upkeep, the Redis
//!   client registry's keys. From `config` it takes value types only (its
//!   name, a fulfillment), never `Config`.
//! * [`config`]: a leaf: typed settings from `PROXY_POOL_*` variables,
//!   checked whole at start-up, and the value types they are made of
//!   (`PoolName`, `Fulfillment`, `Rate`, `AuthSchemes`, `SourcePolicy`,
//!   `DatabaseUrl`; the layers re-export them). Each layer builds its own
//!   options from a `Config` (`settings()` in distribution, `policy()` in
//!   extraction, `aggregates_options()` in aggregates; `redis_options()` in
//!   startup); no layer reads the environment itself.
//! * [`clock`]: the machine's clock and RFC 3339.
//! * [`telemetry`]: tracing set-up (JSON in Lambda, text locally).

pub mod aggregates;
pub mod clock;
pub mod config;
pub mod distribution;
pub mod extraction;
pub mod httpapi;
pub mod lambda;
#[cfg(feature = "local")]
pub mod local;
pub mod pool;
pub mod scheduled;
pub mod secrets;
pub mod security;
pub mod server;
pub mod startup;
pub mod telemetry;
