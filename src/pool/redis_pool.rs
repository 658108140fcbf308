//! The Redis adapter: one cached, self-healing connection and the scripts.
//!
//! Over 600 lines on purpose: each script's call, its reply decoding and its
//! outage classification stay next to the connection handling they depend
//! on (reconnect, NOSCRIPT reload, replica acknowledgement), so a fault path
//! is read in one file.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError};

use super::acknowledger::{Acked, Acknowledger};
use super::connection::{PoolConnection, RedisOptions, ScriptConnection};
use super::error::{OutageClass, PoolError, refused_before_running};
use super::keys::{self, PoolKeys};
use super::new_proxy::{NewProxy, UpsertStatus};
use super::policy::PoolPolicy;
use super::query::{CommittedExtraction, ExtractionOutcome, ExtractionQuery};
use super::scripts::{self, Invocation};

/// After this long without traffic (e.g. a thawed Lambda), or after a failed
/// call, the connection is PINGed before a script is sent, so a dead socket
/// is found (and replaced) by a command that is safe to repeat.
const IDLE_PING_AFTER: Duration = Duration::from_secs(30);
/// Most repeats of one script call (within the call's time bound).
const MAX_REPEATS: u32 = 3;
/// Pause before the n-th repeat of a call refused before it ran, times n.
const REPEAT_AFTER: Duration = Duration::from_millis(20);
/// Proxies sent to `lua/upsert.lua` per call: few enough that one call
/// holds Redis for about a millisecond (a proxy costs it 25-60 us at 1M),
/// so extraction, the Gateway and the clients sharing it never wait long
/// behind a fill or a refresh.
const UPSERT_BATCH: usize = 32;
/// Most proxies one [`RedisPool::upsert_batch`] call takes: one atomic
/// call, decided at one clock, for a caller that needs that for a batch.
const MAX_UPSERT_BATCH: usize = 128;
/// The oldest Redis the scripts run on (Valkey reports its Redis level):
/// they use `TIME` before writes, shebang flags, `ZMSCORE` and Functions.
const MIN_REDIS: (u32, u32) = (7, 0);
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

/// Where a fresh Redis URL comes from when Redis refuses the current
/// credentials (e.g. the Secrets Manager secret holding a rotated AUTH
/// token). `None`: nothing new could be read.
pub trait CredentialSource: Send + Sync {
    /// Reads the URL again.
    fn fresh_url(&self) -> Pin<Box<dyn Future<Output = Option<String>> + Send + '_>>;
}

/// The connections in use, replaced together when the URL changes.
#[derive(Clone)]
struct Link {
    conn: PoolConnection,
    /// Present when extractions wait for replicas (`PROXY_POOL_REPLICA_ACKS`).
    acks: Option<Arc<Acknowledger>>,
}

impl Link {
    fn open(url: &str, options: &RedisOptions) -> Result<Self, PoolError> {
        let (conn, direct) = PoolConnection::open(url, options)?;
        let acks = (options.replica_acks > 0)
            .then(|| Acknowledger::new(direct, options.replica_acks, options.replica_ack_timeout));
        Ok(Self { conn, acks })
    }
}

/// Re-reading credentials after an authentication failure: at most one
/// read at a time, and at most one per [`CREDENTIAL_REREAD_EVERY`].
struct Reread {
    source: Arc<dyn CredentialSource>,
    url: Mutex<String>,
    last: Mutex<Option<Instant>>,
    running: AtomicBool,
}

/// Least time between two re-reads of the credentials (the first one after
/// a failure is immediate).
pub const CREDENTIAL_REREAD_EVERY: Duration = Duration::from_secs(10);

/// The pool in Redis. Cheap to clone; clones share one connection.
#[derive(Clone)]
pub struct RedisPool {
    link: Arc<RwLock<Link>>,
    options: Arc<RedisOptions>,
    keys: Arc<PoolKeys>,
    reread: Option<Arc<Reread>>,
    timeout: Duration,
    replica_acks: u32,
    started: Instant,
    last_used_ms: Arc<AtomicU64>,
    suspect: Arc<AtomicBool>,
    version_checked: Arc<AtomicBool>,
    /// Redis refused the function library: scripts run by `EVALSHA`.
    functions_refused: Arc<AtomicBool>,
}

/// One rate limit for [`RedisPool::admit`] (GCRA).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit<'a> {
    /// The Redis key holding its state, e.g. [`PoolKeys::rate_global`].
    pub key: &'a str,
    /// Milliseconds per request at the sustained rate (may be fractional).
    pub interval_ms: f64,
    /// Requests admissible at once from a full bucket.
    pub burst: u32,
}

/// Where one limit stands after a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    /// Requests still admissible right now.
    pub remaining: u64,
    /// Milliseconds until the bucket is full again.
    pub reset_ms: u64,
}

/// The rate limiter's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// Every limit admitted the request (and was charged).
    pub admitted: bool,
    /// When refused: how long until it would be admitted.
    pub retry_after_ms: u64,
    /// Per limit, in the order given.
    pub limits: Vec<LimitState>,
}

impl RedisPool {
    /// A pool over one Redis at `url`. Connects lazily, so a cold start
    /// succeeds while Redis is down; every call is bounded by `timeout`.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, PoolError> {
        Self::with_options(url, &RedisOptions::single(timeout))
    }

    /// A pool over `url` (in cluster mode: comma-separated seed nodes).
    /// Connects lazily; every call is bounded by `options.timeout`.
    pub fn with_options(url: &str, options: &RedisOptions) -> Result<Self, PoolError> {
        Ok(Self {
            link: Arc::new(RwLock::new(Link::open(url, options)?)),
            options: Arc::new(options.clone()),
            keys: Arc::new(PoolKeys::new(&options.pool)),
            reread: None,
            timeout: options.timeout,
            replica_acks: options.replica_acks,
            started: Instant::now(),
            last_used_ms: Arc::new(AtomicU64::new(0)),
            suspect: Arc::new(AtomicBool::new(false)),
            version_checked: Arc::new(AtomicBool::new(false)),
            functions_refused: Arc::new(AtomicBool::new(!options.functions)),
        })
    }

    /// When Redis refuses the credentials of `url` (the URL this pool was
    /// opened with), asks `source` for a fresh URL (bounded: see
    /// [`CREDENTIAL_REREAD_EVERY`]) and reconnects with it if it changed,
    /// so a rotated password needs no redeploy.
    pub fn with_credential_source(mut self, url: &str, source: Arc<dyn CredentialSource>) -> Self {
        self.reread = Some(Arc::new(Reread {
            source,
            url: Mutex::new(url.to_owned()),
            last: Mutex::new(None),
            running: AtomicBool::new(false),
        }));
        self
    }

    /// The names of this pool's keys (its name's hash tag).
    pub fn keys(&self) -> &PoolKeys {
        &self.keys
    }

    fn link(&self) -> Link {
        self.link
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Starts a re-read of the credentials, unless one runs or ran recently.
    fn reread_credentials(&self) {
        let Some(reread) = self.reread.clone() else {
            return;
        };
        {
            let mut last = reread.last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| at.elapsed() < CREDENTIAL_REREAD_EVERY)
                || reread.running.swap(true, Ordering::SeqCst)
            {
                return;
            }
            *last = Some(Instant::now());
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            reread.running.store(false, Ordering::SeqCst);
            return;
        };
        let pool = self.clone();
        runtime.spawn(async move {
            let fresh = reread.source.fresh_url().await;
            let changed = {
                let mut url = reread.url.lock().unwrap_or_else(PoisonError::into_inner);
                match fresh {
                    Some(fresh) if *url != fresh => {
                        *url = fresh.clone();
                        Some(fresh)
                    }
                    _ => None,
                }
            };
            match changed.map(|url| Link::open(&url, &pool.options)) {
                Some(Ok(link)) => {
                    *pool.link.write().unwrap_or_else(PoisonError::into_inner) = link;
                    tracing::warn!(
                        class = OutageClass::Authentication.as_str(),
                        "Redis credentials re-read and changed: reconnecting with them"
                    );
                }
                Some(Err(e)) => tracing::error!(error = %e, "re-read Redis URL unusable"),
                None => tracing::warn!(
                    class = OutageClass::Authentication.as_str(),
                    "Redis credentials re-read: unchanged or unreadable"
                ),
            }
            reread.running.store(false, Ordering::SeqCst);
        });
    }

    /// Readiness, in a few read-only commands: Redis answers (`PING`), the
    /// server holding the pool runs a supported version under an eviction
    /// policy that cannot take the pool's keys (`INFO`), and the pool
    /// records this deployment's layout and policy (`HGET`). Nothing is
    /// loaded or written: the scripts load themselves on first use.
    pub async fn ping(&self) -> Result<(), PoolError> {
        let mut conn = self.link().conn;
        self.bounded(async {
            ping(&mut conn).await?;
            self.check_version(&server_info(&mut conn, "server").await?)?;
            check_eviction(&server_info(&mut conn, "memory").await?)?;
            self.check_policy(&mut conn).await
        })
        .await
    }

    /// Makes sure the server has `scripts`: the function libraries (each
    /// loaded when `FUNCTION LIST` lacks it: the private one, then the
    /// public one, whose failure is only logged), or, once Redis refused
    /// Functions or when the private library could not be loaded, each
    /// script (`SCRIPT LOAD`). A node `FUNCTION LIST` did not ask (in a
    /// Cluster it goes to any node) is covered by the load on `Function
    /// not found` ([`Self::run`]).
    pub(super) async fn load_scripts(
        &self,
        conn: &mut impl ScriptConnection,
        scripts: &[&scripts::LuaScript],
    ) -> Result<(), PoolError> {
        if self.uses_functions() {
            let loaded = match library_listed(conn, &scripts::LIBRARY).await {
                Ok(true) => {
                    load_public_library_if_missing(conn).await;
                    Ok(())
                }
                Ok(false) => load_library(conn).await,
                Err(e) => Err(e),
            };
            match loaded {
                Ok(()) => return Ok(()),
                Err(e) if functions_refused(&e) => self.refuse_functions(&e),
                Err(e) => library_not_loaded(&e),
            }
        }
        for script in scripts {
            script.load_async(conn).await?;
        }
        Ok(())
    }

    /// Loads both function libraries on the server holding the pool
    /// (`FUNCTION LOAD REPLACE`): this build's private one, then the public
    /// contract library ([`scripts::contract_library`]), so that a program
    /// in another language can call the contract before any deployment
    /// has run a script there (`proxy-pool functions`). Unlike the load a
    /// script call makes, a failure of either is an error, a refusal of
    /// Functions included (other programs have no `EVALSHA` twin to fall
    /// back on).
    pub async fn load_function_libraries(&self) -> Result<(), PoolError> {
        let mut conn = self.link().conn;
        self.bounded(async {
            ping(&mut conn).await?;
            for library in [&*scripts::LIBRARY, &*scripts::PUBLIC_LIBRARY] {
                load(&mut conn, library).await.map_err(|e| match e.code() {
                    Some("ERR") if functions_refused(&e) => PoolError::Internal(
                        "this Redis does not run Functions (FUNCTION unknown or renamed away)"
                            .into(),
                    ),
                    _ => PoolError::from(e),
                })?;
            }
            Ok(())
        })
        .await
    }

    /// Refuses a pool that records another layout or policy than this
    /// deployment's (readiness answers 503 naming both, as extraction would).
    async fn check_policy(&self, conn: &mut (impl ConnectionLike + Send)) -> Result<(), PoolError> {
        let recorded: Option<String> = redis::cmd("HGET")
            .arg(self.keys.counts())
            .arg("meta")
            .query_async(conn)
            .await?;
        let Some(recorded) = recorded else {
            return Ok(());
        };
        let (layout, policy) = recorded.split_once('|').unwrap_or((&recorded, ""));
        if layout != keys::LAYOUT {
            return Err(PoolError::unavailable(
                OutageClass::Layout,
                layout.to_owned(),
            ));
        }
        if policy != self.options.policy.script_arg() {
            return Err(PoolError::unavailable(
                OutageClass::Policy,
                PoolPolicy::parse_script_arg(policy)
                    .map_or_else(|| "another one".into(), |p| p.to_string()),
            ));
        }
        Ok(())
    }

    /// The refusal when the pool's policy (described by `pool`) is not ours,
    /// naming both.
    fn policy_mismatch(&self, pool: &str) -> PoolError {
        PoolError::unavailable(
            OutageClass::Policy,
            format!(
                "the pool's policy is {pool}; this deployment's is {}: every deployment on one pool must use the same PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS and PROXY_POOL_MIN_REMAINING_TTL_SECONDS",
                self.options.policy
            ),
        )
    }

    /// The pool policy this deployment runs under.
    pub fn policy(&self) -> PoolPolicy {
        self.options.policy
    }

    /// Refuses a server older than [`MIN_REDIS`] with an error naming its
    /// version, instead of letting a script fail on a missing feature.
    /// Checked on readiness and before the first script; success is kept.
    fn check_version(&self, info: &str) -> Result<(), PoolError> {
        let version = info_field(info, "redis_version").unwrap_or_default();
        let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
        let found = match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor),
            _ => (0, 0),
        };
        if found < MIN_REDIS {
            let shown = if version.is_empty() {
                "older than 7.0"
            } else {
                version
            };
            return Err(PoolError::unavailable(
                OutageClass::Version,
                format!(
                    "unsupported Redis version ({shown}): the pool scripts need Redis 7.0 or later, or Valkey 7.2 or later"
                ),
            ));
        }
        self.version_checked.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Runs `lua/extract.lua`: selection, checks, removal and the
    /// idempotency record in one atomic call (repeated while it answers
    /// "again", at most [`MAX_EXTRACT_ROUNDS`] calls).
    pub async fn extract(&self, q: &ExtractionQuery<'_>) -> Result<ExtractionOutcome, PoolError> {
        let mut inv = scripts::with_pool_keys(&scripts::EXTRACT, &self.keys, &self.options.policy);
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
                .arg(if self.replica_acks > 0 { "1" } else { "0" });
        }
        if let Some(usage) = &q.usage {
            usage.declare(&self.keys, &mut inv);
        }
        // Repeating the script after a dropped connection is only safe when
        // the idempotency record can tell whether the first attempt committed.
        let retry_on_drop = q.idempotency.is_some();
        let link = self.link();
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
            Acked::Replicas(n) if n >= u64::from(self.replica_acks) => Ok(outcome),
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
        let budget = EXTRACT_ROUNDS_BUDGET.min(self.timeout / 2);
        self.bounded(async {
            for round in 1..=MAX_EXTRACT_ROUNDS {
                let reply: Vec<String> = self.call(conn, inv, retry_on_drop).await?;
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
            let reply: Vec<String> = self.call(conn, inv, retry_on_drop).await?;
            if reply.len() == 1 && reply[0] == "again" {
                return Err(PoolError::Internal(
                    "the last extraction round answered again".into(),
                ));
            }
            Ok(reply)
        })
        .await
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
        let mut inv = scripts::with_pool_keys(&scripts::UPSERT, &self.keys, &self.options.policy);
        for p in batch {
            inv.arg(p.to_script_arg()?);
        }
        let reply: Vec<String> = self.invoke(&inv, true).await?;
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

    /// Runs `lua/ratelimit.lua` over `limits`: admitted only if every limit
    /// admits, and only then charged.
    pub async fn admit(&self, limits: &[Limit<'_>]) -> Result<Admission, PoolError> {
        let mut inv = scripts::RATELIMIT.prepare_invoke();
        for limit in limits {
            inv.key(limit.key)
                .arg(limit.interval_ms.to_string())
                .arg(limit.burst);
        }
        // A repeat after a lost reply charges the limit twice at worst.
        let reply: Vec<i64> = self.invoke(&inv, true).await?;
        let [admitted, retry_after, rest @ ..] = reply.as_slice() else {
            return Err(PoolError::Internal("unexpected ratelimit reply".into()));
        };
        if rest.len() != 2 * limits.len() {
            return Err(PoolError::Internal("unexpected ratelimit reply".into()));
        }
        Ok(Admission {
            admitted: *admitted == 1,
            retry_after_ms: (*retry_after).max(0) as u64,
            limits: rest
                .chunks(2)
                .map(|p| LimitState {
                    remaining: p[0].max(0) as u64,
                    reset_ms: p[1].max(0) as u64,
                })
                .collect(),
        })
    }

    /// A clone of the underlying connection, for callers that need raw commands.
    pub fn connection(&self) -> PoolConnection {
        self.link().conn
    }

    /// Runs a script once, bounded by the timeout.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        inv: &Invocation<'_>,
        retry_on_drop: bool,
    ) -> Result<T, PoolError> {
        let mut conn = self.link().conn;
        self.bounded(self.call(&mut conn, inv, retry_on_drop)).await
    }

    /// One script call (unbounded: callers bound it): a PING first after
    /// idleness or a failure, the version check before the first script.
    /// Repeated only when that cannot apply it twice: after a refusal that
    /// proves it did not run (`MOVED`, `TRYAGAIN`, `READONLY`, ...), or
    /// once after a dropped connection when `retry_on_drop` (the caller's
    /// promise that a second run is harmless). The Redis clients themselves
    /// never resend (see `connection.rs`).
    async fn call<T: FromRedisValue>(
        &self,
        conn: &mut impl ScriptConnection,
        inv: &Invocation<'_>,
        retry_on_drop: bool,
    ) -> Result<T, PoolError> {
        if self.needs_ping() {
            ping(conn).await?;
        }
        if !self.version_checked.load(Ordering::Relaxed) {
            self.check_version(&server_info(conn, "server").await?)?;
        }
        let mut repeats = 0;
        loop {
            match self.run(conn, inv).await {
                Ok(value) => return Ok(value),
                Err(e) if repeats < MAX_REPEATS && refused_before_running(&e) => {
                    // Not run (a failover or resharding under way): safe to
                    // repeat, once the client has had a moment to follow it.
                    repeats += 1;
                    tokio::time::sleep(REPEAT_AFTER * repeats).await;
                }
                Err(e) if repeats == 0 && retry_on_drop && e.is_connection_dropped() => {
                    repeats += 1;
                    if self.options.cluster {
                        // Give the cluster client a moment to reconnect.
                        tokio::time::sleep(REPEAT_AFTER).await;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Sends `inv` once: an `FCALL`, or its `EVALSHA` twin once Redis has
    /// refused Functions. A function not found (a new server, a `FUNCTION
    /// FLUSH`, a Cluster node that never saw the library) is handled like
    /// `NOSCRIPT`: the libraries are loaded (the private one, then the
    /// public one) and the call sent again (it did not run). A refused
    /// load turns this adapter to `EVALSHA` for good; a load that failed
    /// otherwise runs this one call by `EVALSHA`.
    async fn run<T: FromRedisValue>(
        &self,
        conn: &mut impl ScriptConnection,
        inv: &Invocation<'_>,
    ) -> Result<T, RedisError> {
        if self.uses_functions() {
            match inv.fcall_cmd().query_async(conn).await {
                Err(e) if function_missing(&e) => {
                    match load_library(conn).await {
                        Ok(()) => return inv.fcall_cmd().query_async(conn).await,
                        Err(e) if functions_refused(&e) => self.refuse_functions(&e),
                        // This call runs by EVALSHA, the next tries again.
                        Err(e) => library_not_loaded(&e),
                    }
                }
                Err(e) if functions_refused(&e) => self.refuse_functions(&e),
                other => return other,
            }
        }
        inv.eval().invoke_async(conn).await
    }

    fn refuse_functions(&self, e: &RedisError) {
        if !self.functions_refused.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                code = e.code().unwrap_or(""),
                library = scripts::LIBRARY.name.as_str(),
                "Redis refused the function library: scripts run by EVALSHA"
            );
        }
    }

    /// Whether scripts run as Redis Functions (`false` once Redis refused
    /// the library and they run by `EVALSHA`).
    pub fn uses_functions(&self) -> bool {
        !self.functions_refused.load(Ordering::Relaxed)
    }

    fn needs_ping(&self) -> bool {
        if self.suspect.load(Ordering::Relaxed) {
            return true;
        }
        let last = self.last_used_ms.load(Ordering::Relaxed);
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(last) > IDLE_PING_AFTER.as_millis() as u64
    }

    /// Bounds `op` by the configured timeout (reconnect back-off included).
    pub(super) async fn bounded<T>(
        &self,
        op: impl Future<Output = Result<T, PoolError>>,
    ) -> Result<T, PoolError> {
        let result = tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| Err(PoolError::unavailable(OutageClass::Timeout, "timed out")))
            .map_err(|e| match e {
                // Scripts and readiness name the pool's policy or layout: add ours.
                PoolError::Unavailable(o) if o.class == OutageClass::Policy => {
                    self.policy_mismatch(&o.detail)
                }
                PoolError::Unavailable(o) if o.class == OutageClass::Layout => {
                    layout_mismatch(&o.detail)
                }
                e => e,
            });
        match &result {
            Ok(_) => {
                self.suspect.store(false, Ordering::Relaxed);
                self.last_used_ms
                    .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
            Err(PoolError::Unavailable(outage)) => {
                self.suspect.store(true, Ordering::Relaxed);
                if outage.class == OutageClass::Authentication {
                    self.reread_credentials();
                }
            }
            Err(PoolError::Internal(_)) => {}
        }
        result
    }
}

/// One `INFO` section of the server holding the pool (in a Cluster, the
/// master owning `{pp}`): read only. (One section per call: Redis before
/// 7.0, refused by name, takes no more.)
async fn server_info(conn: &mut impl ScriptConnection, section: &str) -> Result<String, PoolError> {
    let mut cmd = redis::cmd("INFO");
    cmd.arg(section);
    let reply = conn.send_to_pool_node(&cmd).await?;
    Ok(String::from_redis_value(reply).map_err(RedisError::from)?)
}

/// A field of an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Refuses an `allkeys-*` eviction policy: it may evict any key, the
/// pool's records, index and idempotency records included (none of which
/// carries a TTL, so `noeviction` and every `volatile-*` policy are safe).
fn check_eviction(info: &str) -> Result<(), PoolError> {
    match info_field(info, "maxmemory_policy") {
        Some(policy) if policy.starts_with("allkeys-") => Err(PoolError::unavailable(
            OutageClass::Eviction,
            format!(
                "maxmemory-policy is {policy}: it can evict the pool's keys; use noeviction or a volatile-* policy (docs/deploy.md)"
            ),
        )),
        _ => Ok(()),
    }
}

/// The refusal of a pool of another layout (version `pool`), naming both.
fn layout_mismatch(pool: &str) -> PoolError {
    PoolError::unavailable(
        OutageClass::Layout,
        format!(
            "the pool records layout version {pool}; this deployment reads layout {}: deploy the version that reads it, or move the pool (docs/deploy.md)",
            keys::LAYOUT
        ),
    )
}

/// PING, repeated once when the connection turns out dead: the first attempt
/// makes the manager reconnect, the second waits for the new connection.
async fn ping(conn: &mut (impl ConnectionLike + Send)) -> Result<(), PoolError> {
    let cmd = redis::cmd("PING");
    match cmd.query_async::<String>(conn).await {
        Err(e) if e.is_connection_dropped() || e.is_io_error() => {
            cmd.query_async::<String>(conn).await?;
        }
        other => {
            other?;
        }
    }
    Ok(())
}

/// Loads the function libraries on the server holding the pool: the
/// private one (its failure is the caller's), then the public one, whose
/// failure is logged and goes no further: the public library serves other
/// programs, never this one's calls.
async fn load_library(conn: &mut impl ScriptConnection) -> Result<(), RedisError> {
    load(conn, &scripts::LIBRARY).await?;
    if let Err(e) = load(conn, &scripts::PUBLIC_LIBRARY).await {
        public_library_not_loaded(&e);
    }
    Ok(())
}

/// Loads the public library where `FUNCTION LIST` lacks it; a failure is
/// logged only (see [`load_library`]).
async fn load_public_library_if_missing(conn: &mut impl ScriptConnection) {
    let loaded = match library_listed(conn, &scripts::PUBLIC_LIBRARY).await {
        Ok(true) => Ok(()),
        Ok(false) => load(conn, &scripts::PUBLIC_LIBRARY).await,
        Err(e) => Err(e),
    };
    if let Err(e) = loaded {
        public_library_not_loaded(&e);
    }
}

/// Whether `FUNCTION LIST` shows `library`.
async fn library_listed(
    conn: &mut impl ScriptConnection,
    library: &scripts::Library,
) -> Result<bool, RedisError> {
    let listed: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("LIBRARYNAME")
        .arg(&library.name)
        .query_async(conn)
        .await?;
    Ok(matches!(listed, redis::Value::Array(libraries) if !libraries.is_empty()))
}

/// `FUNCTION LOAD REPLACE` of `library` on the server holding the pool.
async fn load(
    conn: &mut impl ScriptConnection,
    library: &scripts::Library,
) -> Result<(), RedisError> {
    let reply = conn.send_to_pool_node(&library.load_cmd()).await?;
    reply.extract_error().map(drop)
}

/// A library load that failed for another reason than a refusal of
/// Functions: logged; the caller goes on by `EVALSHA`.
fn library_not_loaded(e: &RedisError) {
    tracing::warn!(
        code = e.code().unwrap_or(""),
        kind = ?e.kind(),
        library = scripts::LIBRARY.name.as_str(),
        "the function library could not be loaded: running the script by EVALSHA"
    );
}

/// The public library could not be loaded: logged (the code and kind of
/// the error, never its text, which may quote what was sent), and this
/// deployment goes on with its private library.
fn public_library_not_loaded(e: &RedisError) {
    tracing::warn!(
        code = e.code().unwrap_or(""),
        kind = ?e.kind(),
        library = scripts::PUBLIC_LIBRARY.name.as_str(),
        "the public contract library could not be loaded: other programs cannot call it yet"
    );
}

/// `FCALL` named a function this server does not have.
fn function_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// The server will not run or load functions at all: `FCALL` or `FUNCTION`
/// unknown (renamed away, an older or restricted service) or denied by an
/// ACL. Each of these refusals proves the call did not run.
fn functions_refused(e: &RedisError) -> bool {
    match e.code() {
        Some("NOPERM") => true,
        Some("ERR") => e.detail().is_some_and(|d| {
            d.starts_with("unknown command") || d.starts_with("unknown subcommand")
        }),
        _ => false,
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
