//! Data minimisation: everything logged during successful extractions and
//! every error class carries no proxy address, credential or API secret.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use base64::Engine;
use common::{Harness, proxies};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, ClientRegistry, Rate, RegistryHandle};

const KEY: &str = "pp_log_test_api_key_1";
const TOKEN: &str = "tok.log-test-bearer-1";
const BASIC_PW: &str = "log-test-basic-pw";

/// One run through every outcome, logs captured at the most verbose level
/// in the Lambda (JSON) format, searched for secrets.
#[tokio::test]
async fn logs_carry_no_secrets() {
    let captured = common::Captured::default();
    let sink = captured.clone();
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_env_filter("trace")
        .with_writer(move || sink.clone())
        .init();

    let h = |s: &str| CredentialHash::of(s.as_bytes()).encode();
    let doc = serde_json::json!({"clients": [
        {"id": "logs", "apiKeys": [h(KEY)], "bearerTokens": [h(TOKEN)],
         "basic": [h(&format!("logs:{BASIC_PW}"))], "allowedUpstreams": ["provider-a"]},
        {"id": "limited", "apiKeys": [h("pp_limited_key_1")], "rateLimit": "1:1"}
    ]});
    let registry = RegistryHandle::with(ClientRegistry::parse(&doc.to_string()).unwrap());
    let mut h = Harness::with_registry(
        |c| {
            c.auth_schemes = AuthSchemes::parse("apiKey,basic,bearer").unwrap();
            c.max_body_bytes = 512;
            c.reserve_for_gateway = 0;
            c.client_rate = Some(Rate {
                per_second: 1000.0,
                burst: 1000,
            });
        },
        registry,
    )
    .await;
    h.load(&proxies("log", 20)).await;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("logs:{BASIC_PW}"))
    );
    let bearer = format!("Bearer {TOKEN}");
    let key = ("x-api-key", KEY);
    let mut statuses = Vec::new();
    let mut bodies = String::new();
    let mut run = |r: common::Reply| {
        statuses.push(r.status);
        bodies.push_str(&r.body);
    };
    run(h.extract(r#"{"count":2}"#, &[key]).await);
    run(h
        .extract(r#"{"count":2}"#, &[("authorization", &bearer)])
        .await);
    run(h
        .extract(
            r#"{"count":2}"#,
            &[
                ("authorization", &basic),
                ("idempotency-key", "log-key-0001"),
            ],
        )
        .await);
    run(h
        .extract(
            r#"{"count":2}"#,
            &[
                ("authorization", &basic),
                ("idempotency-key", "log-key-0001"),
            ],
        )
        .await);
    run(h
        .extract(
            r#"{"count":3}"#,
            &[key, ("idempotency-key", "log-key-0001")],
        )
        .await);
    run(h
        .extract(
            r#"{"count":2}"#,
            &[
                ("authorization", &basic),
                ("idempotency-key", "log-key-0001"),
            ],
        )
        .await);
    run(h
        .extract(
            r#"{"count":3}"#,
            &[
                ("authorization", &basic),
                ("idempotency-key", "log-key-0001"),
            ],
        )
        .await);
    run(h
        .extract(r#"{"count":99,"fulfillment":"allOrNothing"}"#, &[key])
        .await);
    run(h.extract("{bad json", &[key]).await);
    run(h.extract(r#"{"count":0}"#, &[key]).await);
    run(h
        .extract(
            &format!(r#"{{"count":1,"x":"{}"}}"#, "y".repeat(600)),
            &[key],
        )
        .await);
    run(h
        .extract(
            r#"{"count":1,"filters":{"allowedUpstreams":["provider-b"]}}"#,
            &[key],
        )
        .await);
    run(h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_log_test_api_key_2")])
        .await);
    run(h
        .extract(
            r#"{"count":1}"#,
            &[("authorization", "Bearer tok.log-test-bearer-2")],
        )
        .await);
    run(h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_limited_key_1")])
        .await);
    run(h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_limited_key_1")])
        .await);
    run(h.get("/nowhere").await);
    run(h.get("/api/v1/proxies/extract").await);
    let plain = lambda_http::http::Request::post("/api/v1/proxies/extract")
        .header("x-api-key", KEY)
        .header("content-type", "text/plain")
        .body(lambda_http::Body::from("count=1"))
        .unwrap();
    run(h.send(plain).await);
    // The idempotency records' key damaged (of the wrong type): a 500.
    let mut conn = h.redis().await;
    let _: () = redis::cmd("SET")
        .arg(proxy_pool::pool::keys::IDEMPOTENCY)
        .arg("damaged")
        .query_async(&mut conn)
        .await
        .unwrap();
    run(h
        .extract(
            r#"{"count":1}"#,
            &[key, ("idempotency-key", "log-key-0500")],
        )
        .await);
    // Redis refuses the password: 503, logged by class, never the password.
    let guarded = proxy_pool::local::RedisServer::start_with(&["--requirepass", "log-right-pw"])
        .await
        .unwrap();
    let url = format!("redis://:log-wrong-pw@127.0.0.1:{}/", guarded.port());
    let refused =
        proxy_pool::pool::RedisPool::with_options(&url, &h.config.redis_options()).unwrap();
    let app = common::app_over(&common::test_config(), refused);
    run(common::extract_as(&app, r#"{"count":1}"#, &[], "127.0.0.1:1").await);
    // Redis gone: 503s from extraction and readiness.
    h.redis.stop().await;
    run(h.extract(r#"{"count":1}"#, &[key]).await);
    run(h.get("/health/ready").await);

    let mut seen: Vec<u16> = statuses.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            200, 400, 401, 403, 404, 405, 409, 413, 415, 422, 429, 500, 503
        ],
        "every class was exercised"
    );
    assert!(
        bodies.contains("SECRET-log-"),
        "the 200 bodies did carry credentials"
    );

    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.lines().count() >= statuses.len(),
        "one access line per request at least"
    );
    assert!(logs.contains("\"client_id\":\"logs\""));
    assert!(
        logs.contains("\"class\":\"authentication\""),
        "a refused password is logged by its class"
    );
    assert!(logs.contains("\"upstreams\":\"provider-a\""));
    for secret in [
        "192.0.2.",
        "SECRET-log-",
        "user-log-",
        "http://user",
        ":8080",
        KEY,
        "pp_log_test_api_key_2",
        TOKEN,
        "tok.log-test-bearer-2",
        BASIC_PW,
        &basic[6..],
        "wrong kind of value",
        "log-wrong-pw",
        "log-right-pw",
    ] {
        assert!(!logs.contains(secret), "logs contain {secret:?}");
    }
}
