//! Every file in `events/` through the real function against a real Redis,
//! checked against the expectation table in `events/README.md`, so a sample
//! event cannot rot and a new one cannot go untested.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{Harness, now_ms};
use lambda_runtime::{Context, LambdaEvent};
use proxy_pool::lambda::{Function, FunctionError};
use proxy_pool::local::demo_proxies;
use proxy_pool::security::{AuthSchemes, ClientRegistry, RegistryHandle};
use serde_json::Value;

/// Size of the demo pool every event starts from.
const DEMO_POOL: usize = 300;

/// What an event file is documented to produce.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// This HTTP status.
    Status(u16),
    /// 200, and a second send is a byte-identical replay.
    Replay,
    /// The health check's summary.
    Summary,
    /// An invocation error.
    Error,
}

fn events_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("events")
}

/// The `| \`file\` | ... | expect |` rows of `events/README.md`.
fn expectations() -> BTreeMap<String, Expect> {
    let readme = std::fs::read_to_string(events_dir().join("README.md")).unwrap();
    let mut out = BTreeMap::new();
    for line in readme.lines().filter(|l| l.trim_start().starts_with('|')) {
        let cells: Vec<&str> = line
            .trim()
            .trim_matches('|')
            .split('|')
            .map(str::trim)
            .collect();
        let Some(file) = cells.first().and_then(|c| c.strip_prefix('`')) else {
            continue;
        };
        let Some(file) = file.strip_suffix('`') else {
            continue;
        };
        let expect = match *cells.last().unwrap() {
            "summary" => Expect::Summary,
            "error" => Expect::Error,
            "200 + replay" => Expect::Replay,
            status => Expect::Status(
                status
                    .parse()
                    .unwrap_or_else(|_| panic!("{file}: unknown expectation {status:?}")),
            ),
        };
        assert!(
            out.insert(file.to_owned(), expect).is_none(),
            "{file} is listed twice in events/README.md"
        );
    }
    out
}

fn event_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(events_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".json"))
        .collect();
    files.sort();
    files
}

/// A harness authenticating with API keys against `events/clients/clients.json`,
/// as a deployment given that document as its clients secret would, and
/// believing an ALB's `X-Forwarded-For` (`PROXY_POOL_TRUST_ALB=true`).
async fn harness() -> Harness {
    let doc = std::fs::read_to_string(events_dir().join("clients/clients.json")).unwrap();
    let registry = RegistryHandle::with(ClientRegistry::parse(&doc).unwrap());
    Harness::with_registry(
        |c| {
            c.auth_schemes = AuthSchemes::parse("apiKey").unwrap();
            c.sources.trust_alb = true;
        },
        registry,
    )
    .await
}

/// Empties Redis and loads the demo pool, so each event starts alike.
async fn reset(h: &Harness) {
    let mut conn = h.redis().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    h.load(&demo_proxies(DEMO_POOL, now_ms())).await;
}

fn invocation(payload: Value) -> LambdaEvent<Value> {
    LambdaEvent::new(payload, Context::default())
}

/// The table and the folder agree: every event file has an expectation and
/// every expectation a file.
#[test]
fn every_event_file_has_an_expectation() {
    let files = event_files();
    let table = expectations();
    let listed: Vec<String> = table.keys().cloned().collect();
    assert!(files.len() >= 12, "events/ lost files: {files:?}");
    assert_eq!(
        files, listed,
        "events/ and the table in events/README.md must name the same files"
    );
}

/// HTTP events parsed with `lambda_http::request::from_str` and answered by
/// the shared handler: the documented status, and a body valid against the
/// OpenAPI contract.
#[tokio::test]
async fn http_events_answer_as_documented_in_process() {
    let h = harness().await;
    for (file, expect) in expectations() {
        let status = match expect {
            Expect::Status(s) => s,
            Expect::Replay => 200,
            Expect::Summary | Expect::Error => continue,
        };
        reset(&h).await;
        let text = std::fs::read_to_string(events_dir().join(&file)).unwrap();
        let send = || async {
            let request = lambda_http::request::from_str(&text)
                .unwrap_or_else(|e| panic!("{file} is not an HTTP event: {e}"));
            let path = request.uri().path().to_owned();
            common::reply(
                &path,
                proxy_pool::distribution::handle(&h.app, request).await,
            )
        };
        let first = send().await;
        assert_eq!(first.status, status, "{file}: {}", first.body);
        if first.status == 200 && file.contains("extract") {
            assert!(!first.ids().is_empty(), "{file} extracted nothing");
        }
        if expect == Expect::Replay {
            let again = send().await;
            assert_eq!(again.status, 200, "{file} (retry)");
            assert_eq!(again.header("idempotent-replayed"), Some("true"));
            assert_eq!(again.body, first.body, "{file}: a replay is byte-identical");
        }
    }
}

/// Every event through [`Function::invoke`], as the Lambda runtime delivers
/// it: HTTP events come back in their origin's response shape (API Gateway
/// v2, ALB) with the documented status, the scheduled event as the
/// health-check summary, the rest as errors.
#[tokio::test]
async fn every_event_through_the_function() {
    let h = harness().await;
    let function = Function::new(h.app.clone(), h.pool.clone());
    for (file, expect) in expectations() {
        reset(&h).await;
        let text = std::fs::read_to_string(events_dir().join(&file)).unwrap();
        let payload: Value = serde_json::from_str(&text).unwrap();
        let result = function.invoke(invocation(payload.clone())).await;
        match expect {
            Expect::Status(_) | Expect::Replay => {
                let response = result.unwrap_or_else(|e| panic!("{file}: {e}"));
                let want = if let Expect::Status(s) = expect {
                    s
                } else {
                    200
                };
                assert_eq!(response["statusCode"], want, "{file}: {response}");
                assert_eq!(response["isBase64Encoded"], false, "{file}");
                let content_type = response["headers"]["content-type"].as_str().unwrap_or("");
                let want_type = if want >= 400 {
                    "application/problem+json"
                } else {
                    "application/json"
                };
                assert_eq!(content_type, want_type, "{file}");
                let body: Value = serde_json::from_str(response["body"].as_str().unwrap())
                    .unwrap_or_else(|e| panic!("{file}: body is not JSON: {e}"));
                if want >= 400 {
                    common::assert_valid("Problem", &body);
                    assert_eq!(body["status"], want, "{file}");
                }
                if expect == Expect::Replay {
                    let again = function.invoke(invocation(payload)).await.unwrap();
                    assert_eq!(again["statusCode"], 200, "{file} (retry)");
                    assert_eq!(again["headers"]["idempotent-replayed"], "true", "{file}");
                    assert_eq!(again["body"], response["body"], "{file}");
                }
            }
            Expect::Summary => {
                let summary = result.unwrap_or_else(|e| panic!("{file}: {e}"));
                assert_eq!(summary["ready"], true, "{file}: {summary}");
                assert_eq!(
                    summary["eligibleTotal"], DEMO_POOL as u64,
                    "{file}: {summary}"
                );
                assert_eq!(summary["pruned"]["complete"], true, "{file}");
                // 2 upstreams x 3 protocols x 3 regions, carriers summed.
                assert_eq!(summary["inventory"].as_array().unwrap().len(), 18, "{file}");
            }
            Expect::Error => {
                let err = result.expect_err(&format!("{file} must be refused"));
                assert!(
                    matches!(err, FunctionError::UnrecognisedEvent(_)),
                    "{file}: {err}"
                );
            }
        }
    }
}
