//! Hostile input, property-based: arbitrary bodies and arbitrary values of
//! the headers the service reads, through the real handler over a real
//! Redis (so valid requests really extract). Never a panic; every answer
//! honours the contract; every refusal is a 4xx problem (a 5xx would mean
//! Redis is down, and it is not). Bounded case counts keep CI fast;
//! `PROXY_POOL_FUZZ_CASES` raises them for a longer run.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::Instant;

use base64::Engine;
use common::{Harness, proxies};
use lambda_http::Body;
use lambda_http::http::{HeaderValue, Request};
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use proxy_pool::distribution::EXTRACT_PATH;
use proxy_pool::extraction::ExtractRequest;
use proxy_pool::httpapi::Problem;
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, ClientRegistry, PeerAddr, Rate, RegistryHandle};

const KEY: &str = "pp_fuzz_api_key_0123456789";
const TOKEN: &str = "tok.fuzz-0123456789";

fn cases(default: u32) -> u32 {
    std::env::var("PROXY_POOL_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn runner(cases: u32) -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..RunnerConfig::default()
    })
}

/// Any JSON value, a few levels deep.
fn json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map("\\PC{0,12}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Bodies shaped like an extraction request, right and wrong in every field.
fn extract_like() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let count = prop_oneof![
        (0i64..=1002).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        json(),
    ];
    let fulfillment = prop_oneof![
        Just(json!("partial")),
        Just(json!("allOrNothing")),
        Just(json!("PARTIAL")),
        json(),
    ];
    let value = prop_oneof![
        prop::sample::select(vec![
            "http",
            "https",
            "socks5",
            "shanghai",
            "telecom",
            "provider-a",
            "provider-b",
            "",
        ])
        .prop_map(Value::from),
        "\\PC{0,80}".prop_map(Value::from),
        json(),
    ];
    let list = prop_oneof![
        proptest::collection::vec(value, 0..70).prop_map(Value::Array),
        json(),
    ];
    let dimension = prop::sample::select(vec![
        "protocols",
        "regions",
        "carriers",
        "allowedUpstreams",
        "upstreams",
    ]);
    let filters = prop_oneof![
        proptest::collection::btree_map(dimension, list, 0..5)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.into(), v)).collect())),
        json(),
    ];
    (
        proptest::option::of(count),
        proptest::option::of(fulfillment),
        proptest::option::of(filters),
        proptest::option::of(("\\PC{1,12}", json())),
    )
        .prop_map(|(count, fulfillment, filters, extra)| {
            let mut m = serde_json::Map::new();
            for (k, v) in [
                ("count", count),
                ("fulfillment", fulfillment),
                ("filters", filters),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
            if let Some((k, v)) = extra {
                m.insert(k, v);
            }
            Value::Object(m)
        })
}

/// Well-formed requests, so that hostile headers meet bodies that would succeed.
fn valid() -> impl Strategy<Value = serde_json::Value> {
    let subset = |values: &[&'static str]| {
        proptest::option::of(proptest::sample::subsequence(
            values.to_vec(),
            0..=values.len(),
        ))
    };
    (
        1u32..=60,
        proptest::option::of(prop::sample::select(vec!["partial", "allOrNothing"])),
        subset(&["http", "https", "socks5"]),
        subset(&["shanghai", "beijing"]),
        subset(&["provider-a", "provider-b"]),
    )
        .prop_map(|(count, fulfillment, protocols, regions, upstreams)| {
            let mut filters = serde_json::Map::new();
            for (k, v) in [
                ("protocols", protocols),
                ("regions", regions),
                ("allowedUpstreams", upstreams),
            ] {
                if let Some(v) = v {
                    filters.insert(k.into(), v.into());
                }
            }
            let mut body = serde_json::json!({"count": count, "filters": filters});
            if let Some(f) = fulfillment {
                body["fulfillment"] = f.into();
            }
            body
        })
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => valid().prop_map(|v| v.to_string().into_bytes()),
        3 => extract_like().prop_map(|v| v.to_string().into_bytes()),
        1 => json().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
        1 => "\\PC{0,300}".prop_map(String::into_bytes),
    ]
}

/// A header's value: absent, a plausible one, printable noise or raw bytes
/// (values `http` refuses to carry are dropped, as a server would never see them).
fn header(absent: u32, plausible: Vec<String>) -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        absent => Just(None),
        4 => prop::sample::select(plausible).prop_map(|s| Some(s.into_bytes())),
        1 => "[ -~]{0,200}".prop_map(|s| Some(s.into_bytes())),
        1 => proptest::collection::vec(any::<u8>(), 0..160).prop_map(Some),
    ]
}

#[derive(Debug, Clone)]
struct Hostile {
    body: Vec<u8>,
    content_type: Option<Vec<u8>>,
    request_id: Option<Vec<u8>>,
    idempotency_key: Option<Vec<u8>>,
    api_key: Option<Vec<u8>>,
    authorization: Option<Vec<u8>>,
    method_post: bool,
}

fn hostile() -> impl Strategy<Value = Hostile> {
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("fuzz:wrong")
    );
    (
        body(),
        header(
            1,
            vec![
                "application/json".into(),
                "application/json".into(),
                "application/json; charset=utf-8".into(),
                "Application/JSON".into(),
                "text/plain".into(),
                "application/json-patch+json".into(),
            ],
        ),
        header(
            8,
            vec!["req-fuzz-1".into(), "x".repeat(128), "x".repeat(129)],
        ),
        header(
            6,
            vec![
                "fuzz-key-0001".into(),
                "fuzz-key-0002".into(),
                "short".into(),
                "k".repeat(128),
            ],
        ),
        header(16, vec![KEY.into(), KEY.into(), "pp_wrong".into()]),
        header(
            16,
            vec![
                format!("Bearer {TOKEN}"),
                "Bearer ".into(),
                basic,
                "Basic !!!".into(),
                "Digest x".into(),
            ],
        ),
        prop::bool::weighted(0.95),
    )
        .prop_map(
            |(body, content_type, request_id, idempotency_key, api_key, authorization, post)| {
                Hostile {
                    body,
                    content_type,
                    request_id,
                    idempotency_key,
                    api_key,
                    authorization,
                    method_post: post,
                }
            },
        )
}

fn request(input: &Hostile, case: u64) -> lambda_http::Request {
    let mut builder = if input.method_post {
        Request::post(EXTRACT_PATH)
    } else {
        Request::put(EXTRACT_PATH)
    };
    for (name, value) in [
        ("content-type", &input.content_type),
        ("x-request-id", &input.request_id),
        ("idempotency-key", &input.idempotency_key),
        ("x-api-key", &input.api_key),
        ("authorization", &input.authorization),
    ] {
        if let Some(v) = value
            .as_deref()
            .and_then(|v| HeaderValue::from_bytes(v).ok())
        {
            builder = builder.header(name, v);
        }
    }
    let mut req = builder.body(Body::from(input.body.clone())).unwrap();
    // Many callers, so the anonymous clients' idempotency scopes differ.
    let peer = format!("127.0.{}.{}:1", (case / 250) % 250, case % 250 + 1);
    req.extensions_mut().insert(PeerAddr(peer.parse().unwrap()));
    req
}

/// Arbitrary requests through the handler: the contract holds for every
/// answer (checked by `common::reply`), 200s are extractions, everything
/// else is a 4xx problem, and nothing panics.
#[test]
fn hostile_requests_get_contract_answers() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = rt.block_on(async {
        let digest = |s: &str| CredentialHash::of(s.as_bytes()).encode();
        let doc = serde_json::json!({"clients": [
            {"id": "fuzz", "apiKeys": [digest(KEY)], "bearerTokens": [digest(TOKEN)], "maxCount": 50}
        ]});
        let registry = RegistryHandle::with(ClientRegistry::parse(&doc.to_string()).unwrap());
        let h = Harness::with_registry(
            |c| {
                c.auth_schemes = AuthSchemes::parse("apiKey,bearer,basic,none").unwrap();
                c.global_rate = Some(Rate {
                    per_second: 1_000_000.0,
                    burst: 1_000_000,
                });
            },
            registry,
        )
        .await;
        h.load(&proxies("fz", 3000)).await;
        h
    });
    let total = cases(3000);
    let started = Instant::now();
    let case = std::cell::Cell::new(0u64);
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    let mut runner = runner(total);
    let result = runner.run(&hostile(), |input| {
        case.set(case.get() + 1);
        let response = rt.block_on(proxy_pool::distribution::handle(
            &h.app,
            request(&input, case.get()),
        ));
        let r = common::reply(EXTRACT_PATH, response);
        *statuses.borrow_mut().entry(r.status).or_default() += 1;
        prop_assert!(
            r.status == 200 || (400..500).contains(&r.status),
            "status {} for {:?}: {}",
            r.status,
            input,
            r.body
        );
        Ok(())
    });
    let statuses = statuses.into_inner();
    eprintln!(
        "fuzz (handler): {} cases in {:?}, statuses {statuses:?}",
        case.get(),
        started.elapsed()
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // The generators reach every class, success included.
    for status in [200, 400, 401, 405, 415, 422] {
        assert!(
            statuses.contains_key(&status),
            "no {status} in {statuses:?}"
        );
    }
}

/// The body decoder alone, many more cases: never panics, and refuses
/// only with 400 or 422 problems.
#[test]
fn decoder_never_panics() {
    let total = cases(10_000);
    let started = Instant::now();
    let mut runner = runner(total);
    let result = runner.run(&(body(), 1u32..=1000), |(bytes, max)| {
        if let Err(refused) = ExtractRequest::decode(&bytes, max) {
            let status = Problem::from(refused).status().as_u16();
            prop_assert!(status == 400 || status == 422, "status {status}");
        }
        Ok(())
    });
    eprintln!("fuzz (decoder): {total} cases in {:?}", started.elapsed());
    if let Err(e) = result {
        panic!("{e}");
    }
}
