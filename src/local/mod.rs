//! Running without AWS: a private `redis-server`, and synthetic proxies (the
//! demo pool, and the pools `proxy-pool bench` fills).

mod demo;
mod redis_server;

pub use demo::{PoolShape, ShapeError, demo_proxies, synthetic_proxy};
pub use redis_server::{LocalError, RedisServer, TlsFiles, free_port};
