//! Extraction in Redis: one `lua/extract.lua` call selects, checks and
//! removes the proxies, writes the idempotency record and counts usage,
//! atomically; repeated (a bounded number of rounds) while it only cleaned
//! spent entries out of the index; with replica acknowledgement, batched
//! with concurrent extractions under one `WAIT`.

use std::time::{Duration, Instant};

use super::acknowledger::Acked;
use super::connection::ScriptConnection;
use super::error::PoolError;
use super::query::{CommittedExtraction, ExtractionOutcome, ExtractionQuery};
use super::redis_pool::RedisPool;
use super::scripts::{self, Invocation};

/// Most calls of `lua/extract.lua` for one extraction: a call that answers
/// "again" has taken spent or damaged entries out of the index (at most
/// 400, ~1-4 ms of Redis time, for good), and the next one
/// starts past them. The rounds also stop after [`EXTRACT_ROUNDS_BUDGET`]
/// (or half the Redis timeout, if shorter); then one last call answers from
/// what it reaches (a stale backlog is an empty 200 or a 409, never a 503).
const MAX_EXTRACT_ROUNDS: u32 = 64;
/// Time one extraction spends clearing a backlog before its last call.
const EXTRACT_ROUNDS_BUDGET: Duration = Duration::from_millis(50);
/// The position of the extraction's argument groups among its arguments
/// (after the policy, count, fulfillment, reserve and request id).
const EXTRACT_GROUPS_ARG: usize = 5;

/// A filter as `lua/extract.lua` takes it: `*` does not restrict; else
/// each value preceded by a newline (no value: nothing matches).
fn filter_arg<'a>(values: Option<impl IntoIterator<Item = &'a String>>) -> String {
    match values {
        None => "*".to_owned(),
        Some(values) => values.into_iter().map(|v| format!("\n{v}")).collect(),
    }
}

fn restricting(list: &[String]) -> Option<&[String]> {
    (!list.is_empty()).then_some(list)
}

/// Runs extractions on the pool. Cheap to clone; clones share the
/// connection.
#[derive(Clone)]
pub struct Extractor {
    pool: RedisPool,
}

impl Extractor {
    /// Extractions on `pool`.
    pub fn new(pool: &RedisPool) -> Self {
        Self { pool: pool.clone() }
    }

    /// Runs `lua/extract.lua`: selection, checks, removal and the
    /// idempotency record in one atomic call (repeated while it answers
    /// "again", at most [`MAX_EXTRACT_ROUNDS`] calls).
    pub async fn extract(&self, q: &ExtractionQuery<'_>) -> Result<ExtractionOutcome, PoolError> {
        let mut inv = self.pool.invocation(&scripts::EXTRACT);
        let f = q.filters;
        let upstreams = f.upstreams(q.permitted_upstreams);
        let filtered = !f.protocols.is_empty()
            || !f.regions.is_empty()
            || !f.carriers.is_empty()
            || upstreams.is_some();
        let groups: String = [
            (filtered, 'f'),
            (q.idempotency.is_some(), 'i'),
            (q.usage.is_some(), 'u'),
        ]
        .iter()
        .filter_map(|&(on, letter)| on.then_some(letter))
        .collect();
        inv.arg(q.count)
            .arg(q.fulfillment.as_str())
            .arg(q.reserve)
            .arg(q.request_id)
            .arg(groups);
        if filtered {
            inv.arg(filter_arg(restricting(&f.protocols)))
                .arg(filter_arg(restricting(&f.regions)))
                .arg(filter_arg(restricting(&f.carriers)))
                .arg(filter_arg(upstreams));
        }
        if let Some(scope) = &q.idempotency {
            // With replica acks, a replay rewrites its record, so the WAIT
            // after it covers the record it replays.
            inv.arg(&scope.key)
                .arg(&scope.digest)
                .arg(scope.ttl.as_millis() as u64)
                .arg(if self.pool.replica_acks() > 0 {
                    "1"
                } else {
                    "0"
                });
        }
        if let Some(usage) = &q.usage {
            usage.declare(self.pool.keys(), &mut inv);
        }
        // Repeating the script after a dropped connection is only safe when
        // the idempotency record can tell whether the first attempt committed.
        let retry_on_drop = q.idempotency.is_some();
        let link = self.pool.link();
        let Some(acks) = &link.acks else {
            let reply = self
                .run_extract(&mut link.conn.clone(), &mut inv, retry_on_drop)
                .await?;
            return parse_extract_reply(&reply);
        };
        // With replica acks: batched with concurrent extractions, in one
        // write with the `WAIT` that confirms them all.
        let mut conn = acks.connection();
        let reply = self.run_extract(&mut conn, &mut inv, retry_on_drop).await?;
        let acked = conn.acknowledged();
        let outcome = parse_extract_reply(&reply)?;
        if !matches!(
            outcome,
            ExtractionOutcome::Committed(_) | ExtractionOutcome::Replayed(_)
        ) {
            return Ok(outcome);
        }
        match acked {
            Acked::Replicas(n) if n >= u64::from(self.pool.replica_acks()) => Ok(outcome),
            Acked::Replicas(acknowledged) => Ok(ExtractionOutcome::NotReplicated { acknowledged }),
            Acked::Failed(class) => {
                tracing::warn!(class = class.as_str(), "replica acknowledgement failed");
                Ok(ExtractionOutcome::NotReplicated { acknowledged: 0 })
            }
        }
    }

    /// The extraction script on `conn`, bounded, repeated while it only
    /// cleaned the index ("again": bounded work per call; the next call
    /// answers exactly). Once the rounds are spent, a last call (its groups
    /// marked `s`) answers from what it reaches.
    async fn run_extract(
        &self,
        conn: &mut impl ScriptConnection,
        inv: &mut Invocation<'_>,
        retry_on_drop: bool,
    ) -> Result<Vec<String>, PoolError> {
        let started = Instant::now();
        let budget = EXTRACT_ROUNDS_BUDGET.min(self.pool.timeout() / 2);
        self.pool
            .bounded(async {
                for round in 1..=MAX_EXTRACT_ROUNDS {
                    let reply: Vec<String> = self.pool.call(conn, inv, retry_on_drop).await?;
                    if reply.len() != 1 || reply[0] != "again" {
                        if round > 1 {
                            tracing::debug!(round, "index cleanup calls before the extraction");
                        }
                        return Ok(reply);
                    }
                    if started.elapsed() > budget {
                        break;
                    }
                }
                tracing::info!("a backlog of spent entries outlasted the extraction's rounds");
                inv.append_to_arg(EXTRACT_GROUPS_ARG, b"s");
                let reply: Vec<String> = self.pool.call(conn, inv, retry_on_drop).await?;
                if reply.len() == 1 && reply[0] == "again" {
                    return Err(PoolError::Internal(
                        "the last extraction round answered again".into(),
                    ));
                }
                Ok(reply)
            })
            .await
    }
}

/// The extraction script's reply as an outcome.
fn parse_extract_reply(reply: &[String]) -> Result<ExtractionOutcome, PoolError> {
    let committed = |result: &str| {
        CommittedExtraction::parse(result)
            .ok_or_else(|| PoolError::Internal("unreadable committed result".into()))
    };
    Ok(match reply {
        [tag, result] if tag == "ok" => ExtractionOutcome::Committed(committed(result)?),
        [tag, result] if tag == "replay" => ExtractionOutcome::Replayed(committed(result)?),
        [tag] if tag == "conflict" => ExtractionOutcome::KeyReused,
        [tag, n, at, rest @ ..] if tag == "insufficient" => ExtractionOutcome::Insufficient {
            available: n.parse().unwrap_or(0),
            at_ms: at.parse().unwrap_or(0),
            behind_backlog: rest.first().is_some_and(|b| b == "backlog"),
        },
        _ => return Err(PoolError::Internal("unexpected extract reply".into())),
    })
}
