//! The Redis TTL activity pool: the key layout (`keys`), the Lua scripts
//! (`scripts`, sources in `lua/`), the connection (single server or Redis
//! Cluster, `connection`), the adapter that runs them (`redis_pool`) and the
//! types of its extraction contract (`query`), the operations the
//! Controller, health checker and Gateway Workers use (`contract`), and the
//! upkeep the scheduled health check runs: pruning and inventory
//! (`maintenance`), and the hourly usage counters extraction writes and a
//! flush moves elsewhere (`usage`). It depends on nothing else in the crate
//! but `clock`.
//!
//! Each proxy is its details (`{pp}:proxies`, deleted once handed out) and
//! its state (`{pp}:state`, a tombstone once extracted); every allocatable,
//! healthy proxy is in the index: four families of lexicographic slices
//! (`{pp}:ix:pool`, `region`, `kind`, `atom`) and two time sets (`usable`,
//! `checked`). `lua/prelude.lua` and the README's data model describe it in
//! full. (The in-memory reference model lives with the tests, in
//! `tests/common/model.rs`.)

mod connection;
mod contract;
mod error;
pub mod keys;
mod maintenance;
mod new_proxy;
mod query;
mod redis_pool;
mod scripts;
mod usage;

pub use connection::{PoolConnection, RedisOptions};
pub use contract::{ContractOp, ContractReply, Verdict};
pub use error::PoolError;
pub use maintenance::{BucketInventory, Inventory, MAX_PRUNE_BATCH, PruneReport};
pub use new_proxy::{LineError, NewProxy, UpsertStatus};
pub use query::{
    CommittedExtraction, ExtractionOutcome, ExtractionQuery, Fulfillment, IdempotencyScope,
    PooledProxy, Protocol, Selection,
};
pub use redis_pool::{Admission, Limit, LimitState, RedisPool};
pub use usage::{
    CallCounter, HourUsage, ProxyCounter, UsageBacklog, UsageOutcome, UsageScope, hour_of,
};
