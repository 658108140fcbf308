//! The handler's own CPU work per extraction request, Redis taken out.
//!
//! `distribution::handle` cannot run without Redis (the extraction script is
//! the pool), so this measures the pure steps it runs around the one script
//! call, in the handler's order, on a count=10 request: request id, identity
//! (anonymous and API key), `Idempotency-Key`, strict body decoding and the
//! request digest, the script's filter argument, parsing the script's reply,
//! rendering the 200 body, the response, and the JSON access-log line
//! (formatted, then discarded). `pipeline/count10` runs them all in sequence.
//! Not measured: tokio scheduling and redis-rs encoding/decoding (the bench's
//! `cli us/req` column includes those).
//!
//! `cargo bench --bench handler`; `cargo test --all-targets` runs each once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: its fixtures are known good

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use lambda_http::Body;
use lambda_http::http::{Request, StatusCode};
use proxy_pool::config::Config;
use proxy_pool::distribution::{self, App, EXTRACT_PATH};
use proxy_pool::extraction::{ExtractRequest, IdempotencyKey};
use proxy_pool::httpapi::{RequestId, json_response};
use proxy_pool::local::{PoolShape, RedisServer, synthetic_proxy};
use proxy_pool::pool::{CommittedExtraction, Fulfillment, PoolContract, RedisPool};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{
    AuthSchemes, ClientRegistry, Guard, IdentityResolver, PeerAddr, RedisRegistry, RegistryHandle,
    SourcePolicy,
};

const BODY: &str = r#"{"count":10,"fulfillment":"partial","filters":{"protocols":["http","socks5"],"regions":["shanghai"]}}"#;
const API_KEY: &str = "pp_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn request(api_key: bool) -> lambda_http::Request {
    let mut builder = Request::post(EXTRACT_PATH)
        .header("content-type", "application/json")
        .header("idempotency-key", "bench-key-0001")
        .header("user-agent", "curl/8.5.0");
    if api_key {
        builder = builder.header("x-api-key", API_KEY);
    }
    let mut request = builder.body(Body::from(BODY)).expect("a valid request");
    request
        .extensions_mut()
        .insert(PeerAddr(([203, 0, 113, 7], 40_000).into()));
    request
}

fn anonymous_guard() -> Guard {
    let schemes = AuthSchemes {
        none: true,
        ..AuthSchemes::default()
    };
    Guard::new(schemes, SourcePolicy::default(), RegistryHandle::default())
}

fn api_key_schemes() -> AuthSchemes {
    AuthSchemes {
        api_key: true,
        ..AuthSchemes::default()
    }
}

/// A registry document of clients `from..to`; client 7 holds `API_KEY`.
fn clients_document(from: usize, to: usize) -> String {
    let clients: Vec<String> = (from..to)
        .map(|i| {
            let key = if i == 7 {
                API_KEY.to_owned()
            } else {
                format!("pp_other_{i}")
            };
            format!(
                r#"{{"id":"client-{i}","apiKeys":["{}"],"allowedUpstreams":["provider-a","provider-b"]}}"#,
                CredentialHash::of(key.as_bytes()).encode()
            )
        })
        .collect();
    format!(r#"{{"clients":[{}]}}"#, clients.join(","))
}

/// A guard over a registry document of `n` clients: every stored key
/// digest is compared.
fn document_guard(n: usize) -> Guard {
    let registry = ClientRegistry::parse(&clients_document(0, n)).expect("a valid registry");
    Guard::new(
        api_key_schemes(),
        SourcePolicy::default(),
        RegistryHandle::with(registry),
    )
}

/// The value of a future that is ready at once (a document registry's
/// resolution does no I/O).
fn ready<T>(f: impl Future<Output = T>) -> T {
    let mut f = pin!(f);
    match f
        .as_mut()
        .poll(&mut Context::from_waker(std::task::Waker::noop()))
    {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a document registry never waits"),
    }
}

/// The reply `lua/extract.lua` sends for 10 proxies: the response's fields of each.
/// A committed result of 10 proxies as `lua/extract.lua` records it: the
/// request line, then each record from its locator on.
fn script_reply() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let records: Vec<String> = (0..10)
        .map(|i| {
            let arg = synthetic_proxy(i, now, PoolShape::SMALL)
                .to_script_arg()
                .unwrap_or_default();
            // The upsert argument less its health and times.
            arg.get(27..).unwrap_or_default().to_owned()
        })
        .collect();
    format!(
        "req_01JBENCH0000000000000000\n10\n{now}\n{}",
        records.join("\n")
    )
}

fn access_log(id: &str, client: &str, done: &CommittedExtraction) {
    tracing::info!(
        request_id = id,
        method = "POST",
        path = EXTRACT_PATH,
        status = 200u16,
        code = "",
        client_id = client,
        requested = done.requested,
        returned = done.proxies.len(),
        replayed = false,
        filters = "protocols=http|socks5 regions=shanghai",
        upstreams = done.upstreams().into_iter().collect::<Vec<_>>().join(","),
        latency_us = 1234u64,
        "request"
    );
}

fn handler(c: &mut Criterion) {
    // The access log as in Lambda: JSON, one line per request, here discarded.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .json()
        .flatten_event(true)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);

    let anonymous = anonymous_guard();
    let keyed = document_guard(20);
    let anonymous_request = request(false);
    let keyed_request = request(true);
    let reply = script_reply();
    let done = CommittedExtraction::parse(&reply).expect("a valid reply");

    c.bench_function("request_id", |b| {
        b.iter(|| RequestId::from_headers(black_box(anonymous_request.headers())))
    });
    c.bench_function("identity/anonymous", |b| {
        b.iter(|| ready(anonymous.resolve(black_box(&anonymous_request))))
    });
    c.bench_function("identity/api_key_20_clients", |b| {
        b.iter(|| ready(keyed.resolve(black_box(&keyed_request))))
    });
    for n in [10_000, 100_000] {
        let guard = document_guard(n);
        c.bench_function(&format!("identity/document_{n}_clients"), |b| {
            b.iter(|| ready(guard.resolve(black_box(&keyed_request))))
        });
    }
    redis_identity(c, &keyed_request);
    c.bench_function("decode_and_digest", |b| {
        b.iter(|| {
            let key = IdempotencyKey::from_headers(anonymous_request.headers());
            let decoded = ExtractRequest::decode(black_box(BODY.as_bytes()), 100);
            let digest = decoded.ok().map(|d| d.digest(Fulfillment::Partial));
            (key.is_ok(), digest)
        })
    });
    c.bench_function("parse_reply/count10", |b| {
        b.iter(|| CommittedExtraction::parse(black_box(&reply)))
    });
    c.bench_function("render/count10", |b| b.iter(|| black_box(&done).render()));
    c.bench_function("access_log", |b| {
        b.iter(|| access_log("req_01JBENCH0000000000000000", "ip:203.0.113.7", &done))
    });
    c.bench_function("pipeline/count10", |b| {
        b.iter(|| {
            let request = black_box(&keyed_request);
            let id = RequestId::from_headers(request.headers()).unwrap_or_else(|e| e);
            let identity = ready(keyed.resolve(request)).ok()?;
            let key = IdempotencyKey::from_headers(request.headers()).ok()?;
            let Body::Text(body) = request.body() else {
                return None;
            };
            let decoded = ExtractRequest::decode(body.as_bytes(), 100).ok()?;
            let digest = key.map(|_| decoded.digest(Fulfillment::Partial));
            let filters = serde_json::to_string(&decoded.filters).ok()?;
            let done = CommittedExtraction::parse(black_box(&reply))?;
            let response = json_response(StatusCode::OK, done.render().unwrap_or_default(), &id);
            access_log(id.as_str(), &identity.client_id, &done);
            Some((digest, filters, response))
        })
    });
}

/// Identity through the Redis registry (one lookup script call to a local
/// `redis-server`) at 20, 10,000 and 100,000 clients, and a whole count=1
/// extraction through the handler with that lookup, against the same
/// extraction by an anonymous caller.
fn redis_identity(c: &mut Criterion, keyed_request: &Request<Body>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _runtime = rt.enter();
    let server = rt
        .block_on(RedisServer::start())
        .expect("redis-server must be installed for this bench");
    let config = Config {
        client_rate: None,
        global_rate: None,
        max_health_check_age: std::time::Duration::from_secs(3600),
        ..Config::default()
    };
    let pool = RedisPool::with_options(&server.url(), &config.redis_options()).expect("a pool");
    let registry = RedisRegistry::new(pool.clone());
    let guard = Guard::new(api_key_schemes(), SourcePolicy::default(), registry.clone());
    let keyed_app = App::new(
        config.settings(),
        pool.clone(),
        Arc::new(Guard::new(
            api_key_schemes(),
            SourcePolicy::default(),
            registry.clone(),
        )),
    );
    let anonymous_app = App::new(config.settings(), pool.clone(), Arc::new(anonymous_guard()));
    let extract = |app: &App, key: bool| {
        let mut builder = Request::post(EXTRACT_PATH).header("content-type", "application/json");
        if key {
            builder = builder.header("x-api-key", API_KEY);
        }
        let mut request = builder
            .body(Body::from(r#"{"count":1}"#))
            .expect("a valid request");
        request
            .extensions_mut()
            .insert(PeerAddr(([203, 0, 113, 7], 40_000).into()));
        let response = rt.block_on(distribution::handle(app, request));
        assert_eq!(response.status(), StatusCode::OK);
    };
    let mut next_proxy = 0;
    let mut refill = || {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let batch: Vec<_> = (next_proxy..next_proxy + 20_000)
            .map(|i| synthetic_proxy(i, now, PoolShape::SMALL))
            .collect();
        next_proxy += 20_000;
        rt.block_on(PoolContract::new(&pool).upsert(&batch))
            .expect("a pool");
    };
    refill();
    c.bench_function("extract/count1_anonymous", |b| {
        b.iter(|| extract(&anonymous_app, false))
    });
    let mut loaded = 0;
    for n in [20, 10_000, 100_000] {
        rt.block_on(registry.import(&clients_document(loaded, n)))
            .expect("imported");
        loaded = n;
        c.bench_function(&format!("identity/redis_{n}_clients"), |b| {
            b.iter(|| {
                rt.block_on(guard.resolve(black_box(keyed_request)))
                    .expect("client-7")
            })
        });
        refill();
        c.bench_function(&format!("extract/count1_redis_{n}_clients"), |b| {
            b.iter(|| extract(&keyed_app, true))
        });
    }
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = quick();
    targets = handler
}
criterion_main!(benches);
