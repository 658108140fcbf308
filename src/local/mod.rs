//! Running without AWS: a private `redis-server`, and synthetic proxies (the
//! demo pool, and the pools `proxy-pool bench` fills), and a TCP relay for
//! fault drills and the replication bench.

mod demo;
mod redis_server;
mod relay;

pub use demo::{PoolShape, ShapeError, demo_proxies, synthetic_id, synthetic_proxy};
pub use redis_server::{LocalError, RedisServer, TlsFiles, free_port};
pub use relay::{Armed, Cut, Relay, replicas_acknowledge};
