//! The pool contract the Controller, health checker and Gateway Workers use
//! (`lua/contract.lua`): health results and Worker ownership with fencing
//! epochs. Operations go in batches: one atomic script call applies many,
//! each as if it were a call of its own.

use std::time::Duration;

use super::error::PoolError;
use super::new_proxy::{NewProxy, UpsertStatus};
use super::redis_pool::RedisPool;
use super::scripts;

/// One operation on one proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContractOp {
    /// Record a health check result; `checked_at` defaults to the Redis clock.
    Health {
        /// Proxy id.
        id: String,
        /// Whether the check passed.
        ok: bool,
        /// When it ran, Unix ms.
        checked_at: Option<i64>,
    },
    /// A Worker takes an allocatable, eligible proxy out of the pool.
    Claim {
        /// Proxy id.
        id: String,
        /// Worker id.
        worker: String,
        /// The Gateway's minimum remaining TTL.
        min_remaining_ttl: Duration,
        /// The Gateway's oldest acceptable health check.
        max_health_check_age: Duration,
    },
    /// The Controller publishes DRAINING for the holder it names.
    Drain {
        /// Proxy id.
        id: String,
        /// The holder, as the caller believes.
        worker: String,
        /// The holder's epoch, as the caller believes.
        epoch: u64,
    },
    /// The Worker reports its Active and Reserved use of a DRAINING proxy.
    Ack {
        /// Proxy id.
        id: String,
        /// The Worker.
        worker: String,
        /// Its epoch.
        epoch: u64,
        /// Connections in use.
        active: u32,
        /// Connections reserved.
        reserved: u32,
    },
    /// Clear the ownership of a DRAINED proxy.
    Release {
        /// Proxy id.
        id: String,
        /// The holder.
        worker: String,
        /// Its epoch.
        epoch: u64,
    },
    /// Delete a proxy from the pool (an extracted one stays a tombstone).
    Remove {
        /// Proxy id.
        id: String,
    },
}

/// Outcome of an operation: applied, or why it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Applied.
    Ok,
    /// No such proxy.
    Unknown,
    /// Already handed to a client.
    Extracted,
    /// Its TTL life is over.
    Expired,
    /// A health result older than the one recorded.
    Stale,
    /// Not allocatable and eligible right now (claim).
    Ineligible,
    /// The named holder or epoch is not the current one (a stale writer).
    NotOwner,
    /// The proxy is not in a state this operation applies to.
    State,
}

/// The script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContractReply {
    /// What happened.
    pub verdict: Verdict,
    /// The Redis clock the decision was taken at, Unix ms.
    pub at_ms: i64,
    /// The proxy's epoch afterwards (the fencing token after a claim).
    pub epoch: u64,
}

impl Verdict {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Self::Ok,
            "unknown" => Self::Unknown,
            "extracted" => Self::Extracted,
            "expired" => Self::Expired,
            "stale" => Self::Stale,
            "ineligible" => Self::Ineligible,
            "not-owner" => Self::NotOwner,
            "state" => Self::State,
            _ => return None,
        })
    }

    /// The word used on the wire and by the CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Unknown => "unknown",
            Self::Extracted => "extracted",
            Self::Expired => "expired",
            Self::Stale => "stale",
            Self::Ineligible => "ineligible",
            Self::NotOwner => "not-owner",
            Self::State => "state",
        }
    }
}

impl ContractOp {
    /// The proxy the operation is about.
    pub fn id(&self) -> &str {
        match self {
            Self::Health { id, .. }
            | Self::Claim { id, .. }
            | Self::Drain { id, .. }
            | Self::Ack { id, .. }
            | Self::Release { id, .. }
            | Self::Remove { id } => id,
        }
    }

    /// Its six arguments to `lua/contract.lua` (unused ones empty).
    fn args(&self) -> [String; 6] {
        let ms = |d: &Duration| d.as_millis().to_string();
        let mut args: Vec<String> = match self {
            Self::Health { id, ok, checked_at } => vec![
                "health".into(),
                id.clone(),
                if *ok { "1" } else { "0" }.into(),
                checked_at.map(|t| t.to_string()).unwrap_or_default(),
            ],
            Self::Claim {
                id,
                worker,
                min_remaining_ttl,
                max_health_check_age,
            } => vec![
                "claim".into(),
                id.clone(),
                worker.clone(),
                ms(min_remaining_ttl),
                ms(max_health_check_age),
            ],
            Self::Drain { id, worker, epoch } => {
                vec![
                    "drain".into(),
                    id.clone(),
                    worker.clone(),
                    epoch.to_string(),
                ]
            }
            Self::Ack {
                id,
                worker,
                epoch,
                active,
                reserved,
            } => vec![
                "ack".into(),
                id.clone(),
                worker.clone(),
                epoch.to_string(),
                active.to_string(),
                reserved.to_string(),
            ],
            Self::Release { id, worker, epoch } => {
                vec![
                    "release".into(),
                    id.clone(),
                    worker.clone(),
                    epoch.to_string(),
                ]
            }
            Self::Remove { id } => vec!["remove".into(), id.clone()],
        };
        args.resize(6, String::new());
        let mut out: [String; 6] = Default::default();
        for (slot, arg) in out.iter_mut().zip(args) {
            *slot = arg;
        }
        out
    }
}

/// Most operations one `lua/contract.lua` call applies. At 1M proxies an
/// operation costs Redis 10-20 us, so a call of 500 holds it 5-10 ms:
/// batch writers send [`CONTRACT_BATCH`].
pub const MAX_CONTRACT_BATCH: usize = 500;

/// Proxies sent to `lua/upsert.lua` per call: few enough that one call
/// holds Redis for about a millisecond (a proxy costs it 25-60 us at 1M),
/// so extraction, the Gateway and the clients sharing it never wait long
/// behind a fill or a refresh.
const UPSERT_BATCH: usize = 32;
/// Most proxies one [`PoolContract::upsert_batch`] call takes: one atomic
/// call, decided at one clock, for a caller that needs that for a batch.
const MAX_UPSERT_BATCH: usize = 128;
/// Operations a batch writer sends per call (`proxy-pool health -`, the
/// bench's health checker): about a millisecond of Redis at 1M proxies,
/// so extraction and other clients sharing it never wait long behind one,
/// for a per-call overhead of well under a microsecond an operation.
pub const CONTRACT_BATCH: usize = 64;

/// The writers' side of the pool: adds and refreshes (`lua/upsert.lua`),
/// health results and Worker ownership (`lua/contract.lua`). Cheap to
/// clone; clones share the connection.
#[derive(Clone)]
pub struct PoolContract {
    pool: RedisPool,
}

impl PoolContract {
    /// The contract operations on `pool`.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// Applies one contract operation atomically.
    pub async fn apply(&self, op: &ContractOp) -> Result<ContractReply, PoolError> {
        let replies = self.apply_batch(std::slice::from_ref(op)).await?;
        replies
            .into_iter()
            .next()
            .ok_or_else(|| PoolError::Internal("unexpected contract reply".into()))
    }

    /// Applies operations in one atomic call (at most
    /// [`MAX_CONTRACT_BATCH`]), each as if it were a call of its own, in
    /// order; one reply per operation.
    pub async fn apply_batch(&self, ops: &[ContractOp]) -> Result<Vec<ContractReply>, PoolError> {
        if ops.is_empty() || ops.len() > MAX_CONTRACT_BATCH {
            return Err(PoolError::Internal(
                "contract batch size out of range".into(),
            ));
        }
        let mut inv = self.pool.invocation(&scripts::CONTRACT);
        for op in ops {
            for arg in op.args() {
                inv.arg(arg);
            }
        }
        // Not repeated after a lost reply: a claim is not idempotent.
        let reply: Vec<redis::Value> = self.pool.invoke(&inv, false).await?;
        let bad = || PoolError::Internal("unexpected contract reply".into());
        let (now, rest) = reply.split_first().ok_or_else(bad)?;
        let at_ms: i64 = redis::from_redis_value_ref(now).map_err(|_| bad())?;
        if rest.len() != 2 * ops.len() {
            return Err(bad());
        }
        rest.chunks(2)
            .map(|pair| {
                let verdict: String = redis::from_redis_value_ref(&pair[0]).map_err(|_| bad())?;
                let epoch: i64 = redis::from_redis_value_ref(&pair[1]).map_err(|_| bad())?;
                Ok(ContractReply {
                    verdict: Verdict::parse(&verdict).ok_or_else(bad)?,
                    at_ms,
                    epoch: epoch.max(0) as u64,
                })
            })
            .collect()
    }
    /// Adds or refreshes proxies through `lua/upsert.lua`, in batches, two
    /// calls in flight (Redis runs one while the other's request and reply
    /// travel; sent in order on one connection, they are applied in
    /// order); one status per proxy, in order.
    pub async fn upsert(&self, proxies: &[NewProxy]) -> Result<Vec<UpsertStatus>, PoolError> {
        let mut statuses = Vec::with_capacity(proxies.len());
        for pair in proxies.chunks(2 * UPSERT_BATCH) {
            let (first, second) = pair.split_at(pair.len().min(UPSERT_BATCH));
            if second.is_empty() {
                statuses.extend(self.upsert_batch(first).await?.0);
            } else {
                let (a, b) = tokio::join!(self.upsert_batch(first), self.upsert_batch(second));
                statuses.extend(a?.0);
                statuses.extend(b?.0);
            }
        }
        Ok(statuses)
    }

    /// One `lua/upsert.lua` call (at most [`MAX_UPSERT_BATCH`] proxies): the
    /// statuses and the Redis clock they were decided at, Unix ms.
    pub async fn upsert_batch(
        &self,
        batch: &[NewProxy],
    ) -> Result<(Vec<UpsertStatus>, i64), PoolError> {
        if batch.is_empty() || batch.len() > MAX_UPSERT_BATCH {
            return Err(PoolError::Internal("upsert batch size out of range".into()));
        }
        let mut inv = self.pool.invocation(&scripts::UPSERT);
        for p in batch {
            inv.arg(p.to_script_arg()?);
        }
        let reply: Vec<String> = self.pool.invoke(&inv, true).await?;
        let bad = || PoolError::Internal("unexpected upsert reply".into());
        let (now, words) = reply.split_first().ok_or_else(bad)?;
        if words.len() != batch.len() {
            return Err(bad());
        }
        let statuses = words
            .iter()
            .map(|w| UpsertStatus::parse(w).ok_or_else(bad))
            .collect::<Result<_, _>>()?;
        Ok((statuses, now.parse().map_err(|_| bad())?))
    }
}
