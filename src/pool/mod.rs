//! The Redis TTL activity pool: the key layout (`keys`), the Lua scripts
//! (`scripts`, sources in `lua/`; the writer-facing ones also registered
//! as the public library `proxy_pool_v<CONTRACT_VERSION>` that programs in
//! other languages call), the connection (single server or Redis
//! Cluster, `connection`; with replica acknowledgement, the group commit of
//! scripts and their `WAIT`, `acknowledger`), and the script runner
//! [`RedisPool`] (`redis_pool`, with the function libraries in
//! `functions`, the server checks in `server_checks` and the credential
//! re-read in `credentials`). One small type per use runs its scripts
//! through the runner: [`Extractor`] (extraction; its types in `query`),
//! [`PoolContract`] (adds, refreshes, health results and Worker ownership:
//! what the Controller, health checker and Gateway Workers call),
//! [`Maintenance`] (the scheduled job's prune and inventory),
//! [`RateLimits`], [`ClientStore`] (the Redis client registry) and
//! [`UsageStore`] (the hourly usage counters extraction writes and a flush
//! moves elsewhere). It depends on nothing else in the crate but `clock`.
//!
//! Each proxy is one record (once extracted, a tombstone: its `due` entry
//! alone), and an index over the records answers extraction; no pool key
//! carries a TTL.
//! docs/data-model.md describes every key (`keys` only names them) and
//! the index. (The in-memory reference model lives with the tests, in
//! `tests/common/model.rs`.)

mod acknowledger;
mod clients;
mod connection;
mod contract;
mod credentials;
mod error;
mod extractor;
mod functions;
pub mod keys;
mod maintenance;
mod new_proxy;
mod policy;
mod query;
mod rate_limits;
mod redis_pool;
mod scripts;
mod server_checks;
mod usage;

pub use clients::{
    ClientStore, MAX_CLIENT_BATCH, MAX_CLIENT_CREDENTIALS, PutMode, PutOutcome, StoredClient,
};
pub use connection::{PoolConnection, RedisOptions};
pub use contract::{
    CONTRACT_BATCH, ContractOp, ContractReply, MAX_CONTRACT_BATCH, PoolContract, Verdict,
};
pub use credentials::{CREDENTIAL_REREAD_EVERY, CredentialSource};
pub use error::{Outage, OutageClass, PoolError};
pub use extractor::Extractor;
pub use keys::{InvalidPoolName, PoolKeys, PoolName};
pub use maintenance::{
    BucketInventory, EXPIRING_WITHIN, Inventory, MAX_PRUNE_BATCH, Maintenance, PruneReport,
};
pub use new_proxy::{LineError, NewProxy, UpsertStatus};
pub use policy::PoolPolicy;
pub use query::{
    CommittedExtraction, ExtractionOutcome, ExtractionQuery, Filters, Fulfillment,
    IdempotencyScope, PooledProxy, Protocol, UsageScope, hour_of,
};
pub use rate_limits::{Admission, Limit, LimitState, RateLimits};
pub use redis_pool::RedisPool;
pub use scripts::{CONTRACT_VERSION, contract_functions, contract_library, extract_names};
pub use usage::{CallCounter, HourUsage, ProxyCounter, UsageBacklog, UsageOutcome, UsageStore};
