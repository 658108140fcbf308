//! The script runner: the connection to the server holding the pool (one
//! cached, self-healing connection, re-opened with fresh credentials when
//! Redis refuses them), and every script call through it: `FCALL` with its
//! `EVALSHA` twin, bounded in time, repeated only when that cannot apply it
//! twice. One type per use runs its scripts through it: [`super::Extractor`],
//! [`super::PoolContract`], [`super::Maintenance`], [`super::RateLimits`],
//! [`super::ClientStore`] and [`super::UsageStore`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisError};

use super::acknowledger::Acknowledger;
use super::connection::{PoolConnection, RedisOptions, ScriptConnection};
use super::credentials::{CREDENTIAL_REREAD_EVERY, CredentialSource, Reread};
use super::error::{OutageClass, PoolError, refused_before_running};
use super::functions::{
    function_missing, functions_refused, library_listed, library_not_loaded, load, load_library,
    load_public_library_if_missing,
};
use super::keys::{self, PoolKeys};
use super::policy::PoolPolicy;
use super::scripts::{self, Invocation};
use super::server_checks::{self, check_eviction, layout_mismatch, ping, server_info};

/// After this long without traffic (e.g. a thawed Lambda), or after a failed
/// call, the connection is PINGed before a script is sent, so a dead socket
/// is found (and replaced) by a command that is safe to repeat.
const IDLE_PING_AFTER: Duration = Duration::from_secs(30);
/// Most repeats of one script call (within the call's time bound).
const MAX_REPEATS: u32 = 3;
/// Pause before the n-th repeat of a call refused before it ran, times n.
const REPEAT_AFTER: Duration = Duration::from_millis(20);

/// The connections in use, replaced together when the URL changes.
#[derive(Clone)]
pub(super) struct Link {
    /// The connection scripts run on.
    pub(super) conn: PoolConnection,
    /// Present when extractions wait for replicas (`PROXY_POOL_REPLICA_ACKS`).
    pub(super) acks: Option<Arc<Acknowledger>>,
}

impl Link {
    fn open(url: &str, options: &RedisOptions) -> Result<Self, PoolError> {
        let (conn, direct) = PoolConnection::open(url, options)?;
        let acks = (options.replica_acks > 0)
            .then(|| Acknowledger::new(direct, options.replica_acks, options.replica_ack_timeout));
        Ok(Self { conn, acks })
    }
}

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

    /// The connections in use now.
    pub(super) fn link(&self) -> Link {
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
            return Err(layout_mismatch(layout));
        }
        if policy != self.options.policy.script_arg() {
            return Err(self.policy_mismatch(&PoolPolicy::describe_recorded(policy)));
        }
        Ok(())
    }

    /// A script's refusal of the pool's policy or layout (which names only
    /// the pool's side) as the refusal naming both sides.
    fn name_both(&self, e: PoolError) -> PoolError {
        match e {
            PoolError::Unavailable(o) if o.class == OutageClass::Policy => {
                self.policy_mismatch(&o.detail)
            }
            PoolError::Unavailable(o) if o.class == OutageClass::Layout => {
                layout_mismatch(&o.detail)
            }
            e => e,
        }
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

    /// A call of `script` with the pool's keys and policy declared.
    pub(super) fn invocation<'s>(&self, script: &'s scripts::LuaScript) -> Invocation<'s> {
        let mut inv = script.prepare_invoke();
        for key in self.keys.pool() {
            inv.key(key);
        }
        inv.arg(self.options.policy.script_arg());
        inv
    }

    /// Replicas each extraction waits for (0: none).
    pub(super) fn replica_acks(&self) -> u32 {
        self.replica_acks
    }

    /// The bound of every call.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Refuses a server older than the scripts need (see
    /// [`server_checks::check_version`]); success is kept.
    fn check_version(&self, info: &str) -> Result<(), PoolError> {
        server_checks::check_version(info)?;
        self.version_checked.store(true, Ordering::Relaxed);
        Ok(())
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
    pub(super) async fn call<T: FromRedisValue>(
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
                Err(e) => return Err(self.name_both(e.into())),
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
            .unwrap_or_else(|_| Err(PoolError::unavailable(OutageClass::Timeout, "timed out")));
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
