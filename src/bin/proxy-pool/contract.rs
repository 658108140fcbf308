//! The pool-contract commands (`health`, `claim`, `drain`, `ack`,
//! `release`, `remove`): one atomic operation each, its verdict printed; a
//! refusal exits 1, so scripts can test for it. `health -` reads many
//! results as JSON lines from standard input and records them in batches.
//! `functions` loads the function libraries, so that programs in other
//! languages can call the public one.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal};
use std::time::Duration;

use proxy_pool::clock::parse_rfc3339;
use proxy_pool::pool::{
    CONTRACT_BATCH, ContractOp, RedisPool, Verdict, contract_functions, contract_library,
};
use serde::Deserialize;

use crate::cli::{AckArgs, ClaimArgs, HealthArgs, HolderArgs, PoolArgs, TargetArgs};
use crate::output::say;
use crate::{CliResult, operator_pool};

/// `health`: one result, or with the id `-` many, as JSON lines.
pub async fn health(args: HealthArgs) -> CliResult {
    if args.target.id == "-" {
        return health_lines(args).await;
    }
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

/// `functions`: both libraries loaded, then the public library's name and
/// its functions, one a line.
pub async fn functions(args: PoolArgs) -> CliResult {
    let (_, pool) = operator_pool(&args)?;
    pool.load_function_libraries()
        .await
        .map_err(|e| format!("the function libraries could not be loaded: {e}"))?;
    say!("{}", contract_library());
    for function in contract_functions() {
        say!("{function}");
    }
    Ok(())
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

/// One health result as a JSON line of `health -`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HealthLine {
    id: String,
    ok: bool,
    #[serde(default)]
    checked_at: Option<String>,
}

/// `health -`: one result per line (`{"id":…,"ok":…,"checkedAt":…}`,
/// `checkedAt` RFC 3339, default the Redis clock), recorded
/// [`CONTRACT_BATCH`] per call; a progress line on a terminal; then
/// how many were recorded and how many refused, by reason. A line that is
/// not a result is reported by number, never by contents.
async fn health_lines(args: HealthArgs) -> CliResult {
    let (_, pool) = operator_pool(&args.target.pool)?;
    let progress = std::io::stderr().is_terminal();
    let mut tally = Verdicts::default();
    let mut batch = Vec::with_capacity(CONTRACT_BATCH);
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| format!("line {number}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<HealthLine>(&line)
            .map_err(|e| format!("not a health result (column {})", e.column()))
            .and_then(|l| {
                let checked_at = match l.checked_at.as_deref() {
                    Some(t) => Some(parse_rfc3339(t).map_err(|e| format!("checkedAt: {e}"))?),
                    None => None,
                };
                Ok(ContractOp::Health {
                    id: l.id,
                    ok: l.ok,
                    checked_at,
                })
            });
        match parsed {
            Ok(op) => batch.push(op),
            Err(why) => {
                eprintln!("line {number}: skipped: {why}");
                tally.rejected += 1;
            }
        }
        if batch.len() == CONTRACT_BATCH {
            tally.record(&pool, &mut batch).await?;
            if progress {
                eprint!("\r{number} lines read");
            }
        }
    }
    tally.record(&pool, &mut batch).await?;
    if progress {
        eprintln!();
    }
    let refused: Vec<String> = tally
        .refused
        .iter()
        .map(|(why, n)| format!("{why} {n}"))
        .collect();
    say!(
        "recorded {}, refused {}{}, rejected {}",
        tally.recorded,
        tally.refused.values().sum::<usize>(),
        if refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", refused.join(", "))
        },
        tally.rejected
    );
    Ok(())
}

/// What `health -` did with its lines.
#[derive(Default)]
struct Verdicts {
    recorded: usize,
    refused: BTreeMap<&'static str, usize>,
    rejected: usize,
}

impl Verdicts {
    async fn record(&mut self, pool: &RedisPool, batch: &mut Vec<ContractOp>) -> CliResult {
        if batch.is_empty() {
            return Ok(());
        }
        for reply in pool.apply_batch(batch).await? {
            match reply.verdict {
                Verdict::Ok => self.recorded += 1,
                refused => *self.refused.entry(refused.as_str()).or_default() += 1,
            }
        }
        batch.clear();
        Ok(())
    }
}
