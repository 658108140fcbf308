//! Running without AWS: a private `redis-server`, and synthetic proxies (the
//! demo pool, and the pools `proxy-pool bench` fills), and a TCP relay for
//! fault drills and the replication bench.
//!
//! Compiled only with the `local` cargo feature: on by default, so the CLI,
//! the tests and the benches have it, and off in the Lambda's build
//! (`[package.metadata.lambda.build]` in `Cargo.toml`), so nothing the Lambda
//! runs can use it and its binary does not carry it.

mod demo;
mod redis_server;
mod relay;

pub use demo::{PoolShape, ShapeError, demo_proxies, synthetic_id, synthetic_proxy};
pub use redis_server::{LocalError, RedisServer, TlsFiles, free_port};
pub use relay::{Armed, Cut, Relay, replicas_acknowledge};
