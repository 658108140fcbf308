//! The thin HTTP adapter (the seeds' `distribution.Handler`): routing,
//! admission, strict decoding, problem mapping and health probes. The same
//! [`handle`] serves API Gateway events in Lambda and plain HTTP under `serve`.
//! Readiness has its own file, [`readiness`].

pub mod readiness;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lambda_http::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use lambda_http::{Body, Request};
use serde::Serialize;

use crate::extraction::{ExtractRequest, ExtractionService, IdempotencyKey, Policy, ServiceError};
use crate::httpapi::{InvalidParam, Problem, RequestId, json_response, to_json};
use crate::pool::{ExtractionOutcome, Filters, OutageClass, PoolError, RedisPool};
use crate::security::{Identity, IdentityResolver, Rate, RateLimiter, Refusal, Unresolved};
use readiness::{Reason, Severity};

/// The extraction endpoint.
pub const EXTRACT_PATH: &str = "/api/v1/proxies/extract";
/// Liveness probe.
pub const LIVE_PATH: &str = "/health/live";
/// Readiness probe.
pub const READY_PATH: &str = "/health/ready";

/// Largest total size of request header names and values.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Most header fields `serve` reads in one request head.
pub const MAX_HEADER_FIELDS: usize = 100;
/// Largest request head (request line and header lines) `serve` reads:
/// below the longest URI its HTTP/1.1 parser takes (65,534 bytes), so a
/// head too long is always this 431, never a 414.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Why `serve`'s HTTP/1.1 parser refused a request head, before any
/// handler ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedHead {
    /// More than [`MAX_HEADER_FIELDS`] header fields, or more than
    /// [`MAX_HEAD_BYTES`].
    TooLarge,
    /// A request line or header line that is not HTTP/1.1.
    Malformed,
}

/// What the handler takes from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The health probes' `configVersion` (`Config::version`: a digest of
    /// the settings, secrets left out).
    pub config_version: String,
    /// The rules every extraction runs under.
    pub policy: Policy,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// The limit for all callers together; `None`: off.
    pub global_rate: Option<Rate>,
    /// The limit per client unless its registry entry sets one; `None`: off.
    pub client_rate: Option<Rate>,
}

/// Everything a request needs, built once per process and shared.
pub struct App {
    service: ExtractionService,
    pool: RedisPool,
    identity: Arc<dyn IdentityResolver>,
    limiter: RateLimiter,
    max_body_bytes: usize,
    config_version: String,
    /// Set when extractions are counted for the aggregates (readiness
    /// then watches their flush).
    usage_retention: Option<Duration>,
    draining: AtomicBool,
}

impl App {
    /// Wires the handler's dependencies.
    pub fn new(settings: Settings, pool: RedisPool, identity: Arc<dyn IdentityResolver>) -> Self {
        Self {
            usage_retention: settings.policy.usage_retention,
            service: ExtractionService::new(settings.policy, pool.clone()),
            limiter: RateLimiter::new(pool.clone(), settings.global_rate, settings.client_rate),
            pool,
            identity,
            max_body_bytes: settings.max_body_bytes,
            config_version: settings.config_version,
            draining: AtomicBool::new(false),
        }
    }

    /// From now on readiness and extraction answer 503 (graceful shutdown).
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// Largest request body accepted.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }
}

/// Fields of the one access-log line written per request.
#[derive(Default)]
struct AccessLog {
    code: &'static str,
    client_id: Option<String>,
    requested: Option<u32>,
    returned: Option<usize>,
    filters: Option<String>,
    upstreams: Option<String>,
    replayed: bool,
}

/// Handles one HTTP request. Always answers: every failure is a problem response.
pub async fn handle(app: &App, request: Request) -> Response<Body> {
    let started = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let mut log = AccessLog::default();
    let oversized = header_bytes(request.headers()) > MAX_HEADER_BYTES;
    let (request_id, result) = match RequestId::from_headers(request.headers()) {
        Ok(id) if oversized => (
            id,
            Err(Problem::bad_request(
                format!("request headers exceed {MAX_HEADER_BYTES} bytes"),
                Vec::new(),
            )),
        ),
        Err(generated) => (
            generated,
            Err(Problem::bad_request(
                "invalid X-Request-ID header",
                vec![InvalidParam::new(
                    "X-Request-ID",
                    "must be one header of at most 128 printable ASCII characters",
                )],
            )),
        ),
        Ok(id) => {
            let result = route(app, request, &id, &mut log).await;
            (id, result)
        }
    };
    let response = match result {
        Ok(response) => response,
        Err(problem) => {
            log.code = problem.code();
            problem.into_response(&request_id)
        }
    };
    tracing::info!(
        request_id = request_id.as_str(),
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        code = log.code,
        client_id = log.client_id.as_deref(),
        requested = log.requested,
        returned = log.returned,
        replayed = log.replayed,
        filters = log.filters.as_deref(),
        upstreams = log.upstreams.as_deref(),
        latency_us = started.elapsed().as_micros() as u64,
        "request"
    );
    response
}

/// The answer to a request head `serve` refused: a problem like every
/// other (a fresh request id, since the head's cannot be trusted), logged
/// like every answer.
pub fn refused_head(head: RefusedHead) -> Response<Body> {
    let request_id = RequestId::generate();
    let problem = match head {
        RefusedHead::TooLarge => Problem::headers_too_large(format!(
            "a request head may hold at most {MAX_HEADER_FIELDS} header fields and {MAX_HEAD_BYTES} bytes"
        )),
        RefusedHead::Malformed => {
            Problem::bad_request("the request line or a header line is malformed", Vec::new())
        }
    };
    tracing::info!(
        request_id = request_id.as_str(),
        status = problem.status().as_u16(),
        code = problem.code(),
        "request"
    );
    problem.into_response(&request_id)
}

async fn route(
    app: &App,
    request: Request,
    request_id: &RequestId,
    log: &mut AccessLog,
) -> Result<Response<Body>, Problem> {
    let path = request.uri().path();
    let method = request.method();
    match path {
        EXTRACT_PATH if method == Method::POST => extract(app, request, request_id, log).await,
        EXTRACT_PATH => Err(Problem::method_not_allowed("POST")),
        LIVE_PATH if method == Method::GET => health(app, "ok", request_id),
        READY_PATH if method == Method::GET => ready(app, request_id).await,
        LIVE_PATH | READY_PATH => Err(Problem::method_not_allowed("GET")),
        _ => Err(Problem::not_found()),
    }
}

/// The contract's `Health` body.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Health<'a> {
    status: &'static str,
    version: &'static str,
    config_version: &'a str,
}

fn health(
    app: &App,
    status: &'static str,
    request_id: &RequestId,
) -> Result<Response<Body>, Problem> {
    let body = Health {
        status,
        version: env!("CARGO_PKG_VERSION"),
        config_version: &app.config_version,
    };
    Ok(json_response(StatusCode::OK, to_json(&body)?, request_id))
}

/// `ok`, `degraded` (200) or a 503 problem, the reasons in the
/// [`readiness::REASONS_HEADER`] header ([`readiness`]).
async fn ready(app: &App, request_id: &RequestId) -> Result<Response<Body>, Problem> {
    let reasons_header = HeaderName::from_static(readiness::REASONS_HEADER);
    let findings = match readiness::findings(app).await {
        Ok(findings) => findings,
        Err(e) => {
            let reason = match e.outage_class() {
                Some(OutageClass::Policy) => Reason::PoolPolicyMismatch,
                Some(OutageClass::Layout) => Reason::PoolLayoutMismatch,
                Some(OutageClass::Eviction) => Reason::EvictionPolicy,
                _ => Reason::RedisUnavailable,
            };
            let problem = pool_problem(e);
            return Err(match readiness::header_value(&[reason]) {
                Some(value) => problem.with_header(reasons_header, value),
                None => problem,
            });
        }
    };
    let reasons: Vec<Reason> = findings.iter().map(|f| f.reason).collect();
    let value = readiness::header_value(&reasons).filter(|_| !reasons.is_empty());
    if let Some(down) = findings
        .into_iter()
        .find(|f| f.severity == Severity::Unavailable)
    {
        let problem = Problem::unavailable(down.detail);
        return Err(match value {
            Some(value) => problem.with_header(reasons_header, value),
            None => problem,
        });
    }
    let status = if reasons.is_empty() { "ok" } else { "degraded" };
    let mut response = health(app, status, request_id)?;
    if let Some(value) = value {
        response.headers_mut().insert(reasons_header, value);
    }
    Ok(response)
}

async fn extract(
    app: &App,
    request: Request,
    request_id: &RequestId,
    log: &mut AccessLog,
) -> Result<Response<Body>, Problem> {
    if app.is_draining() {
        return Err(Problem::unavailable("the service is draining"));
    }
    let identity = app
        .identity
        .resolve(&request)
        .await
        .map_err(|unresolved| match unresolved {
            Unresolved::Refused(problem) => problem,
            Unresolved::Pool(e) => pool_problem(e),
        })?;
    log.client_id = Some(identity.client_id.clone());
    let limits = app
        .limiter
        .admit(&identity)
        .await
        .map_err(|refusal| match refusal {
            Refusal::Limited(problem) => problem,
            Refusal::Pool(e) => pool_problem(e),
        })?;
    // Admitted: every answer from here on tells the client how to pace itself.
    let mut response = match admitted(app, &request, &identity, request_id, log).await {
        Ok(response) => response,
        Err(problem) => {
            log.code = problem.code();
            problem.into_response(request_id)
        }
    };
    for (name, value) in limits {
        response.headers_mut().insert(name, value);
    }
    Ok(response)
}

async fn admitted(
    app: &App,
    request: &Request,
    identity: &Identity,
    request_id: &RequestId,
    log: &mut AccessLog,
) -> Result<Response<Body>, Problem> {
    check_content_type(request.headers())?;
    if declared_length(request.headers()).is_some_and(|n| n > app.max_body_bytes) {
        return Err(Problem::payload_too_large(app.max_body_bytes));
    }
    let key = IdempotencyKey::from_headers(request.headers())?;
    let body = request.body().as_ref();
    if body.len() > app.max_body_bytes {
        return Err(Problem::payload_too_large(app.max_body_bytes));
    }
    let decoded = ExtractRequest::decode(body, app.service.max_count(identity))?;
    log.requested = Some(decoded.count);
    log.filters = Some(summarize(&decoded.filters));

    let outcome = app
        .service
        .extract(identity, &decoded, key.as_ref(), request_id.as_str())
        .await
        .map_err(|e| match e {
            ServiceError::Rejected(problem) => problem,
            ServiceError::Pool(e) => pool_problem(e),
        })?;
    match outcome {
        ExtractionOutcome::Committed(done) => {
            log.returned = Some(done.proxies.len());
            log.upstreams = Some(done.upstreams().into_iter().collect::<Vec<_>>().join(","));
            Ok(json_response(StatusCode::OK, done.render()?, request_id))
        }
        ExtractionOutcome::Replayed(done) => {
            log.replayed = true;
            log.returned = Some(done.proxies.len());
            let mut response = json_response(StatusCode::OK, done.render()?, request_id);
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        ExtractionOutcome::NotReplicated { acknowledged } => {
            // Committed on the primary but not yet safe from a failover: not
            // handed out. Its idempotency record answers the retry.
            tracing::warn!(acknowledged, "extraction not acknowledged by replicas");
            Err(Problem::unavailable(
                "the extraction was not confirmed by the pool's replicas in time; retry with the same Idempotency-Key",
            ))
        }
        ExtractionOutcome::KeyReused => Err(Problem::idempotency_key_reused()),
        ExtractionOutcome::Insufficient {
            available,
            behind_backlog,
            ..
        } => {
            log.returned = Some(0);
            Err(if behind_backlog {
                Problem::insufficient_behind_backlog(decoded.count, available)
            } else {
                Problem::insufficient_proxies(decoded.count, available)
            })
        }
    }
}

/// The one place a pool failure becomes an answer: a 503 (retry later) or a
/// cause-free 500. The cause (Redis error kinds and codes, never their text)
/// is logged here.
fn pool_problem(e: PoolError) -> Problem {
    match e {
        PoolError::Unavailable(outage) if outage.class == OutageClass::Policy => {
            tracing::error!(class = outage.class.as_str(), error = %outage, "pool policy mismatch");
            Problem::pool_policy_mismatch()
        }
        PoolError::Unavailable(outage) if outage.class == OutageClass::Layout => {
            tracing::error!(class = outage.class.as_str(), error = %outage, "pool layout mismatch");
            Problem::pool_layout_mismatch(outage.detail)
        }
        PoolError::Unavailable(outage) => {
            tracing::warn!(class = outage.class.as_str(), error = %outage, "pool unavailable");
            Problem::unavailable("the proxy pool is unavailable, retry later")
        }
        PoolError::Internal(_) => {
            tracing::error!(error = %e, "pool failure");
            Problem::internal()
        }
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), Problem> {
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    match media_type {
        Some(t) if t.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(Problem::unsupported_media_type()),
    }
}

fn header_bytes(headers: &HeaderMap) -> usize {
    headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum()
}

fn declared_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Filters for the access log: dimension names and values, never proxy data.
fn summarize(f: &Filters) -> String {
    let dims = [
        ("protocols", &f.protocols),
        ("regions", &f.regions),
        ("carriers", &f.carriers),
        ("upstreams", &f.allowed_upstreams),
    ];
    let parts: Vec<String> = dims
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(name, v)| format!("{name}={}", v.join("|")))
        .collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(" ")
    }
}
