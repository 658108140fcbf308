//! Running without AWS: a private `redis-server` and a demo pool.

mod demo;
mod redis_server;

pub use demo::demo_proxies;
pub use redis_server::{LocalError, RedisServer, TlsFiles};
