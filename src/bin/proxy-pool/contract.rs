//! The pool-contract commands (`health`, `claim`, `drain`, `ack`,
//! `release`, `remove`): one atomic operation each, its verdict printed; a
//! refusal exits 1, so scripts can test for it.

use std::time::Duration;

use proxy_pool::clock::parse_rfc3339;
use proxy_pool::pool::{ContractOp, Verdict};

use crate::cli::{AckArgs, ClaimArgs, HealthArgs, HolderArgs, TargetArgs};
use crate::output::say;
use crate::{CliResult, operator_pool};

/// `health`.
pub async fn health(args: HealthArgs) -> CliResult {
    let checked_at = match args.checked_at.as_deref() {
        Some(t) => Some(parse_rfc3339(t).map_err(|e| format!("--checked-at: {e}"))?),
        None => None,
    };
    let op = ContractOp::Health {
        id: args.target.id.clone(),
        ok: args.ok,
        checked_at,
    };
    apply(&args.target, op).await
}

/// `claim`.
pub async fn claim(args: ClaimArgs) -> CliResult {
    let op = ContractOp::Claim {
        id: args.target.id.clone(),
        worker: args.worker,
        min_remaining_ttl: Duration::from_secs(args.min_remaining_ttl_seconds),
        max_health_check_age: Duration::from_secs(args.max_health_check_age_seconds),
    };
    apply(&args.target, op).await
}

/// `drain`.
pub async fn drain(args: HolderArgs) -> CliResult {
    let op = ContractOp::Drain {
        id: args.target.id.clone(),
        worker: args.worker,
        epoch: args.epoch,
    };
    apply(&args.target, op).await
}

/// `ack`.
pub async fn ack(args: AckArgs) -> CliResult {
    let holder = args.holder;
    let op = ContractOp::Ack {
        id: holder.target.id.clone(),
        worker: holder.worker,
        epoch: holder.epoch,
        active: args.active,
        reserved: args.reserved,
    };
    apply(&holder.target, op).await
}

/// `release`.
pub async fn release(args: HolderArgs) -> CliResult {
    let op = ContractOp::Release {
        id: args.target.id.clone(),
        worker: args.worker,
        epoch: args.epoch,
    };
    apply(&args.target, op).await
}

/// `remove`.
pub async fn remove(args: TargetArgs) -> CliResult {
    let op = ContractOp::Remove {
        id: args.id.clone(),
    };
    apply(&args, op).await
}

/// Runs one contract operation and prints its verdict.
async fn apply(target: &TargetArgs, op: ContractOp) -> CliResult {
    let (_, pool) = operator_pool(&target.pool)?;
    let reply = pool.apply(&op).await?;
    match reply.verdict {
        Verdict::Ok => {
            say!("ok {} (epoch {})", target.id, reply.epoch);
            Ok(())
        }
        refused => Err(format!(
            "refused: {} ({}, epoch {})",
            refused.as_str(),
            target.id,
            reply.epoch
        )
        .into()),
    }
}
