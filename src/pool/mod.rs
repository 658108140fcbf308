//! The Redis TTL activity pool: key layout, Lua scripts, the connection
//! (single server or Redis Cluster, `connection`) and the adapter that runs
//! them (`redis_pool`), the contract the Controller, health checker and
//! Gateway Workers use (`contract`), the upkeep the scheduled health check
//! runs: pruning and inventory (`maintenance`), and the in-memory reference
//! model of all of it (`model`), checked against the scripts by a
//! differential property test.
//!
//! | key | type | contents | TTL |
//! |---|---|---|---|
//! | `{pp}:avail` | ZSET | allocatable index, lex members `bucket|expiry|id` | latest expiry it holds |
//! | `{pp}:buckets` | HASH | bucket -> members in the index | latest expiry |
//! | `{pp}:proxies` | HASH | id -> record JSON / tombstone | latest expiry |
//! | `{pp}:heads` | HASH | bucket -> lower bound of its first eligible entry (probe hint) | latest expiry |
//! | `{pp}:expiry` | ZSET | id -> expiresAt ms | latest expiry |
//! | `{pp}:held` | HASH | id -> Worker id while CLAIMED or DRAINING | as `{pp}:proxies` |
//! | `{pp}:idem:<sha256>` | STRING | digest + committed result | idempotency window |
//! | `{pp}:rl:global`, `{pp}:rl:client:<sha256>` | STRING | GCRA arrival time | until the bucket is full |

mod connection;
mod contract;
pub mod keys;
mod maintenance;
mod model;
mod new_proxy;
mod redis_pool;
mod scripts;

pub use connection::{PoolConnection, RedisOptions};
pub use contract::{ContractOp, ContractReply, Verdict};
pub use maintenance::{BucketInventory, Inventory, MAX_PRUNE_BATCH, PruneReport};
pub use model::{MemoryPool, PoolState};
pub use new_proxy::{NewProxy, UpsertStatus};
pub use redis_pool::{
    Admission, ExtractionOutcome, ExtractionQuery, IdempotencyScope, PoolError, RedisPool,
    UPSERT_BATCH,
};
