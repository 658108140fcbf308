//! The Redis TTL activity pool: the key layout (`keys`), the Lua scripts
//! (`scripts`, sources in `lua/`; the writer-facing ones also registered
//! as the public library `proxy_pool_v<CONTRACT_VERSION>` that programs in
//! other languages call), the connection (single server or Redis
//! Cluster, `connection`; with replica acknowledgement, the group commit of
//! scripts and their `WAIT`, `acknowledger`), the adapter that runs them
//! (`redis_pool`) and the
//! types of its extraction contract (`query`), the operations the
//! Controller, health checker and Gateway Workers use (`contract`), and the
//! upkeep the scheduled health check runs: pruning and inventory
//! (`maintenance`), the hourly usage counters extraction writes and a flush
//! moves elsewhere (`usage`), and the storage of the Redis client registry
//! (`clients`). It depends on nothing else in the crate but `clock`.
//!
//! Each proxy is one record (`{pp}:v2:rec`, a tombstone once extracted);
//! every allocatable, healthy proxy whose deadline was ahead when it was
//! written is indexed: its locator in `{pp}:v2:ax` (one expiry-ordered
//! slice per combination) and in band 0 of `{pp}:v2:due` (by its
//! deadline), counted in `{pp}:v2:cnt`, its combination's head in
//! `{pp}:v2:hd`. No pool key carries a TTL. `lua/prelude/` and
//! docs/data-model.md describe it in full. (The in-memory reference model
//! lives with the tests, in `tests/common/model.rs`.)

mod acknowledger;
mod clients;
mod connection;
mod contract;
mod error;
pub mod keys;
mod maintenance;
mod new_proxy;
mod policy;
mod query;
mod redis_pool;
mod scripts;
mod usage;

pub use clients::{MAX_CLIENT_BATCH, MAX_CLIENT_CREDENTIALS, PutMode, PutOutcome, StoredClient};
pub use connection::{PoolConnection, RedisOptions};
pub use contract::{CONTRACT_BATCH, ContractOp, ContractReply, MAX_CONTRACT_BATCH, Verdict};
pub use error::{Outage, OutageClass, PoolError};
pub use keys::{InvalidPoolName, PoolKeys, PoolName};
pub use maintenance::{BucketInventory, EXPIRING_WITHIN, Inventory, MAX_PRUNE_BATCH, PruneReport};
pub use new_proxy::{LineError, NewProxy, UpsertStatus};
pub use policy::PoolPolicy;
pub use query::{
    CommittedExtraction, ExtractionOutcome, ExtractionQuery, Filters, Fulfillment,
    IdempotencyScope, PooledProxy, Protocol, UsageScope, hour_of,
};
pub use redis_pool::{
    Admission, CREDENTIAL_REREAD_EVERY, CredentialSource, Limit, LimitState, RedisPool,
};
pub use scripts::{CONTRACT_VERSION, contract_functions, contract_library, extract_names};
pub use usage::{CallCounter, HourUsage, ProxyCounter, UsageBacklog, UsageOutcome};
