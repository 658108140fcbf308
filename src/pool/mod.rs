//! The Redis TTL activity pool: key layout, Lua scripts and the adapter
//! that runs them (`redis_pool`), plus the upkeep the scheduled health check
//! runs: pruning and inventory (`maintenance`).
//!
//! | key | type | contents | TTL |
//! |---|---|---|---|
//! | `{pp}:avail` | ZSET | allocatable index, lex members `bucket|expiry|id` | latest expiry it holds |
//! | `{pp}:buckets` | HASH | bucket -> members in the index | latest expiry |
//! | `{pp}:proxies` | HASH | id -> record JSON / tombstone | latest expiry |
//! | `{pp}:heads` | HASH | bucket -> lower bound of its first eligible entry (probe hint) | latest expiry |
//! | `{pp}:expiry` | ZSET | id -> expiresAt ms | latest expiry |
//! | `{pp}:idem:<sha256>` | STRING | digest + committed result | idempotency window |
//! | `{pp}:rl:global`, `{pp}:rl:client:<sha256>` | STRING | GCRA arrival time | until the bucket is full |

pub mod keys;
mod maintenance;
mod new_proxy;
mod redis_pool;

pub use maintenance::{BucketInventory, Inventory, MAX_PRUNE_BATCH, PruneReport};
pub use new_proxy::{NewProxy, UpsertStatus};
pub use redis_pool::{
    Admission, ExtractionOutcome, ExtractionQuery, IdempotencyScope, PoolError, RedisPool,
};
