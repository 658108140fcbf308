//! The pool-contract commands (`health`, `claim`, `drain`, `ack`,
//! `release`, `remove`): one atomic operation each, its verdict printed; a
//! refusal exits 1, so scripts can test for it. With the id `-` each reads
//! many operations as JSON lines from standard input and applies them in
//! batches (a claim's epoch printed for each).
//! `functions` loads the function libraries, so that programs in other
//! languages can call the public one.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal};
use std::time::Duration;

use proxy_pool::clock::parse_rfc3339;
use proxy_pool::pool::{
    CONTRACT_BATCH, ContractOp, PoolContract, RedisPool, Verdict, contract_functions,
    contract_library,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::cli::{AckArgs, ClaimArgs, HealthArgs, HolderArgs, PoolArgs, TargetArgs};
use crate::cli::{CliResult, operator_pool};
use crate::output::say;
use crate::skipped::Skipped;

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

/// `claim`: one, or with the id `-` many, as JSON lines
/// (`{"id":…,"worker":…}`, optionally `minRemainingTtlSeconds` and
/// `maxHealthCheckAgeSeconds`, else the options'), each claim's epoch
/// printed.
pub async fn claim(args: ClaimArgs) -> CliResult {
    let (min_ttl, max_age) = (
        args.min_remaining_ttl_seconds,
        args.max_health_check_age_seconds,
    );
    let to_op = move |l: ClaimLine| ContractOp::Claim {
        id: l.id,
        worker: l.worker,
        min_remaining_ttl: Duration::from_secs(l.min_remaining_ttl_seconds.unwrap_or(min_ttl)),
        max_health_check_age: Duration::from_secs(
            l.max_health_check_age_seconds.unwrap_or(max_age),
        ),
    };
    if args.target.id == "-" {
        return apply_lines(&args.target.pool, Lines::CLAIM, |l| Ok(to_op(l))).await;
    }
    let worker = required(args.worker, "--worker")?;
    let op = to_op(ClaimLine {
        id: args.target.id.clone(),
        worker,
        min_remaining_ttl_seconds: None,
        max_health_check_age_seconds: None,
    });
    apply(&args.target, op).await
}

/// `drain`: one, or with the id `-` many (`{"id":…,"worker":…,"epoch":…}`).
pub async fn drain(args: HolderArgs) -> CliResult {
    let to_op = |l: HolderLine| ContractOp::Drain {
        id: l.id,
        worker: l.worker,
        epoch: l.epoch,
    };
    if args.target.id == "-" {
        return apply_lines(&args.target.pool, Lines::DRAIN, |l| Ok(to_op(l))).await;
    }
    let op = to_op(holder_line(&args)?);
    apply(&args.target, op).await
}

/// `ack`: one, or with the id `-` many (`{"id":…,"worker":…,"epoch":…,
/// "active":…,"reserved":…}`).
pub async fn ack(args: AckArgs) -> CliResult {
    let to_op = |l: AckLine| ContractOp::Ack {
        id: l.id,
        worker: l.worker,
        epoch: l.epoch,
        active: l.active,
        reserved: l.reserved,
    };
    if args.holder.target.id == "-" {
        return apply_lines(&args.holder.target.pool, Lines::ACK, |l| Ok(to_op(l))).await;
    }
    let holder = holder_line(&args.holder)?;
    let op = to_op(AckLine {
        id: holder.id,
        worker: holder.worker,
        epoch: holder.epoch,
        active: required(args.active, "--active")?,
        reserved: required(args.reserved, "--reserved")?,
    });
    apply(&args.holder.target, op).await
}

/// `release`: one, or with the id `-` many (`{"id":…,"worker":…,"epoch":…}`).
pub async fn release(args: HolderArgs) -> CliResult {
    let to_op = |l: HolderLine| ContractOp::Release {
        id: l.id,
        worker: l.worker,
        epoch: l.epoch,
    };
    if args.target.id == "-" {
        return apply_lines(&args.target.pool, Lines::RELEASE, |l| Ok(to_op(l))).await;
    }
    let op = to_op(holder_line(&args)?);
    apply(&args.target, op).await
}

/// `remove`: one, or with the id `-` many (`{"id":…}`).
pub async fn remove(args: TargetArgs) -> CliResult {
    let to_op = |l: RemoveLine| ContractOp::Remove { id: l.id };
    if args.id == "-" {
        return apply_lines(&args.pool, Lines::REMOVE, |l| Ok(to_op(l))).await;
    }
    apply(
        &args,
        to_op(RemoveLine {
            id: args.id.clone(),
        }),
    )
    .await
}

/// An option a single operation needs (with the id `-`, each line has it).
fn required<T>(value: Option<T>, option: &str) -> Result<T, String> {
    value.ok_or_else(|| {
        format!("{option} is required (or give the id - and JSON lines on standard input)")
    })
}

/// The holder a single drain, ack or release names.
fn holder_line(args: &HolderArgs) -> Result<HolderLine, String> {
    Ok(HolderLine {
        id: args.target.id.clone(),
        worker: required(args.worker.clone(), "--worker")?,
        epoch: required(args.epoch, "--epoch")?,
    })
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
    let reply = PoolContract::new(&pool).apply(&op).await?;
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

/// One claim as a JSON line of `claim -`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClaimLine {
    id: String,
    worker: String,
    #[serde(default)]
    min_remaining_ttl_seconds: Option<u64>,
    #[serde(default)]
    max_health_check_age_seconds: Option<u64>,
}

/// One drain or release as a JSON line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HolderLine {
    id: String,
    worker: String,
    epoch: u64,
}

/// One ack as a JSON line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AckLine {
    id: String,
    worker: String,
    epoch: u64,
    active: u32,
    reserved: u32,
}

/// One removal as a JSON line.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RemoveLine {
    id: String,
}

/// How a command's JSON lines are named in its messages.
struct Lines {
    /// What one line is ("a health result").
    what: &'static str,
    /// What the summary calls an applied operation ("recorded").
    done: &'static str,
    /// Each applied operation's id and epoch are printed (claims: the
    /// epoch is the Worker's fencing token).
    print_each: bool,
}

impl Lines {
    const HEALTH: Self = Self {
        what: "a health result",
        done: "recorded",
        print_each: false,
    };
    const CLAIM: Self = Self {
        what: "a claim",
        done: "claimed",
        print_each: true,
    };
    const DRAIN: Self = Self {
        what: "a drain",
        done: "drained",
        print_each: false,
    };
    const ACK: Self = Self {
        what: "an ack",
        done: "acknowledged",
        print_each: false,
    };
    const RELEASE: Self = Self {
        what: "a release",
        done: "released",
        print_each: false,
    };
    const REMOVE: Self = Self {
        what: "a removal",
        done: "removed",
        print_each: false,
    };
}

/// `health -`: one result per line (`{"id":…,"ok":…,"checkedAt":…}`,
/// `checkedAt` RFC 3339, default the Redis clock).
async fn health_lines(args: HealthArgs) -> CliResult {
    apply_lines(&args.target.pool, Lines::HEALTH, |l: HealthLine| {
        let checked_at = match l.checked_at.as_deref() {
            Some(t) => Some(parse_rfc3339(t).map_err(|e| format!("checkedAt: {e}"))?),
            None => None,
        };
        Ok(ContractOp::Health {
            id: l.id,
            ok: l.ok,
            checked_at,
        })
    })
    .await
}

/// The id `-`: operations as JSON lines from standard input, applied
/// [`CONTRACT_BATCH`] per call, in order; a progress line on a terminal;
/// then how many were applied and how many refused, by reason. A line
/// that is not an operation is reported by number, never by contents.
async fn apply_lines<L: DeserializeOwned>(
    pool: &PoolArgs,
    lines: Lines,
    to_op: impl Fn(L) -> Result<ContractOp, String>,
) -> CliResult {
    let (_, pool) = operator_pool(pool)?;
    let progress = std::io::stderr().is_terminal();
    let mut tally = Verdicts::default();
    let mut batch = Vec::with_capacity(CONTRACT_BATCH);
    for (i, line) in std::io::stdin().lock().lines().enumerate() {
        let number = i + 1;
        let line = line.map_err(|e| format!("line {number}: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<L>(&line)
            .map_err(|e| format!("not {} (column {})", lines.what, e.column()))
            .and_then(&to_op);
        match parsed {
            Ok(op) => batch.push(op),
            Err(why) => tally.rejected.skip(number, &why),
        }
        if batch.len() == CONTRACT_BATCH {
            tally.record(&pool, &mut batch, lines.print_each).await?;
            if progress {
                eprint!("\r{number} lines read");
            }
        }
    }
    tally.record(&pool, &mut batch, lines.print_each).await?;
    if progress {
        eprintln!();
    }
    let refused: Vec<String> = tally
        .refused
        .iter()
        .map(|(why, n)| format!("{why} {n}"))
        .collect();
    say!(
        "{} {}, refused {}{}, rejected {}",
        lines.done,
        tally.applied,
        tally.refused.values().sum::<usize>(),
        if refused.is_empty() {
            String::new()
        } else {
            format!(" ({})", refused.join(", "))
        },
        tally.rejected.summary()
    );
    Ok(())
}

/// What a `-` command did with its lines.
#[derive(Default)]
struct Verdicts {
    applied: usize,
    refused: BTreeMap<&'static str, usize>,
    rejected: Skipped,
}

impl Verdicts {
    async fn record(
        &mut self,
        pool: &RedisPool,
        batch: &mut Vec<ContractOp>,
        print_each: bool,
    ) -> CliResult {
        if batch.is_empty() {
            return Ok(());
        }
        for (op, reply) in batch
            .iter()
            .zip(PoolContract::new(pool).apply_batch(batch).await?)
        {
            match reply.verdict {
                Verdict::Ok => {
                    self.applied += 1;
                    if print_each {
                        say!("ok {} (epoch {})", op.id(), reply.epoch);
                    }
                }
                refused => *self.refused.entry(refused.as_str()).or_default() += 1,
            }
        }
        batch.clear();
        Ok(())
    }
}
