//! The handler: one request in, always one answer out. Routing, the
//! access log, the health probes and the extraction endpoint's admission
//! and decoding; every failure is a value until [`handle`] answers it as
//! its problem.

use std::time::Instant;

use lambda_http::http::{HeaderMap, HeaderName, HeaderValue, Method, Response, StatusCode, header};
use lambda_http::{Body, Request};
use serde::Serialize;

use super::app::App;
use super::head::{MAX_HEADER_BYTES, RefusedHead};
use super::problems::HandlerError;
use super::readiness::{self, Reason, Severity};
use crate::extraction::{ExtractRequest, IdempotencyKey};
use crate::httpapi::{Problem, RequestId, json_response, to_json};
use crate::pool::{ExtractionOutcome, Filters, OutageClass};
use crate::security::Identity;

/// The extraction endpoint.
pub const EXTRACT_PATH: &str = "/api/v1/proxies/extract";
/// Liveness probe.
pub const LIVE_PATH: &str = "/health/live";
/// Readiness probe.
pub const READY_PATH: &str = "/health/ready";

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
        Ok(id) if oversized => (id, Err(HandlerError::HeadersTooLarge.into())),
        Err(generated) => (generated, Err(HandlerError::RequestId.into())),
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
    let problem: Problem = head.into();
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
        EXTRACT_PATH => Err(HandlerError::MethodNotAllowed { allow: "POST" }.into()),
        LIVE_PATH if method == Method::GET => health(app, "ok", request_id),
        READY_PATH if method == Method::GET => ready(app, request_id).await,
        LIVE_PATH | READY_PATH => Err(HandlerError::MethodNotAllowed { allow: "GET" }.into()),
        _ => Err(HandlerError::NotFound.into()),
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
    let findings = match readiness::findings(app).await {
        Ok(findings) => findings,
        Err(error) => {
            let reason = match error.outage_class() {
                Some(OutageClass::Policy) => Reason::PoolPolicyMismatch,
                Some(OutageClass::Layout) => Reason::PoolLayoutMismatch,
                Some(OutageClass::Eviction) => Reason::EvictionPolicy,
                _ => Reason::RedisUnavailable,
            };
            let reasons = readiness::header_value(&[reason]);
            return Err(HandlerError::PoolNotReady { error, reasons }.into());
        }
    };
    let reasons: Vec<Reason> = findings.iter().map(|f| f.reason).collect();
    let value = readiness::header_value(&reasons).filter(|_| !reasons.is_empty());
    if let Some(down) = findings
        .into_iter()
        .find(|f| f.severity == Severity::Unavailable)
    {
        return Err(HandlerError::NotReady {
            detail: down.detail,
            reasons: value,
        }
        .into());
    }
    let status = if reasons.is_empty() { "ok" } else { "degraded" };
    let mut response = health(app, status, request_id)?;
    if let Some(value) = value {
        let reasons_header = HeaderName::from_static(readiness::REASONS_HEADER);
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
        return Err(HandlerError::Draining.into());
    }
    let identity = app.identity.resolve(&request).await?;
    log.client_id = Some(identity.client_id.clone());
    let limits = app.limiter.admit(&identity).await?;
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
    let too_large = HandlerError::PayloadTooLarge {
        limit: app.max_body_bytes,
    };
    if declared_length(request.headers()).is_some_and(|n| n > app.max_body_bytes) {
        return Err(too_large.into());
    }
    let key = IdempotencyKey::from_headers(request.headers())?;
    let body = request.body().as_ref();
    if body.len() > app.max_body_bytes {
        return Err(too_large.into());
    }
    let decoded = ExtractRequest::decode(body, app.service.max_count(identity))?;
    log.requested = Some(decoded.count);
    log.filters = Some(summarize(&decoded.filters));

    let outcome = app
        .service
        .extract(identity, &decoded, key.as_ref(), request_id.as_str())
        .await?;
    match outcome {
        ExtractionOutcome::Committed(done) => {
            log.returned = Some(done.proxies.len());
            log.upstreams = Some(done.upstreams().into_iter().collect::<Vec<_>>().join(","));
            let body = done.render().map_err(HandlerError::Render)?;
            Ok(json_response(StatusCode::OK, body, request_id))
        }
        ExtractionOutcome::Replayed(done) => {
            log.replayed = true;
            log.returned = Some(done.proxies.len());
            let body = done.render().map_err(HandlerError::Render)?;
            let mut response = json_response(StatusCode::OK, body, request_id);
            response
                .headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        ExtractionOutcome::NotReplicated { acknowledged } => {
            // Committed on the primary but not yet safe from a failover: not
            // handed out. Its idempotency record answers the retry.
            tracing::warn!(acknowledged, "extraction not acknowledged by replicas");
            Err(HandlerError::NotReplicated.into())
        }
        ExtractionOutcome::KeyReused => Err(HandlerError::KeyReused.into()),
        ExtractionOutcome::Insufficient {
            available,
            behind_backlog,
            ..
        } => {
            log.returned = Some(0);
            let requested = decoded.count;
            Err(if behind_backlog {
                HandlerError::InsufficientBehindBacklog {
                    requested,
                    reached: available,
                }
            } else {
                HandlerError::Insufficient {
                    requested,
                    available,
                }
            }
            .into())
        }
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), HandlerError> {
    let media_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim);
    match media_type {
        Some(t) if t.eq_ignore_ascii_case("application/json") => Ok(()),
        _ => Err(HandlerError::UnsupportedMediaType),
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
