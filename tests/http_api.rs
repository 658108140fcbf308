//! The HTTP surface: request validation, problem responses, request ids and
//! health probes, each checked against the OpenAPI contract by the harness.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use common::{Harness, proxies};
use lambda_http::Body;
use lambda_http::http::Request;
use proxy_pool::distribution::EXTRACT_PATH;

/// Only `application/json` bodies are accepted (parameters allowed).
#[tokio::test]
async fn content_type_must_be_json() {
    let h = Harness::start().await;
    for ct in [None, Some("text/plain"), Some("application/jsonx")] {
        let mut req = Request::post(EXTRACT_PATH);
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = h
            .send(req.body(Body::from(r#"{"count":1}"#)).unwrap())
            .await;
        assert_eq!(
            (r.status, r.code()),
            (415, "UNSUPPORTED_MEDIA_TYPE"),
            "{ct:?}"
        );
    }
    let req = Request::post(EXTRACT_PATH)
        .header("content-type", "Application/JSON; charset=utf-8")
        .body(Body::from(r#"{"count":1}"#))
        .unwrap();
    assert_eq!(h.send(req).await.status, 200);
}

/// Bodies over the limit are 413, whether declared or actual.
#[tokio::test]
async fn oversized_bodies_are_413() {
    let h = Harness::with_config(|c| c.max_body_bytes = 1024).await;
    let big = format!(r#"{{"count":1,"pad":"{}"}}"#, "x".repeat(1100));
    let r = h.extract(&big, &[]).await;
    assert_eq!((r.status, r.code()), (413, "PAYLOAD_TOO_LARGE"));
    let r = h
        .extract(r#"{"count":1}"#, &[("content-length", "5000")])
        .await;
    assert_eq!(r.status, 413);
}

/// Malformed bodies are 400 with the fields at fault; rule violations 422.
#[tokio::test]
async fn bad_bodies_name_the_field() {
    let h = Harness::start().await;
    let r = h.extract("{not json", &[]).await;
    assert_eq!((r.status, r.code()), (400, "BAD_REQUEST"));
    let r = h
        .extract(
            r#"{"count":1,"filters":{"zones":["a"]},"colour":"red"}"#,
            &[],
        )
        .await;
    assert_eq!(r.status, 400);
    let names: Vec<&str> = r.json["invalidParams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["colour", "filters.zones"]);
    let r = h
        .extract(r#"{"count":101,"filters":{"protocols":["ftp"]}}"#, &[])
        .await;
    assert_eq!((r.status, r.code()), (422, "VALIDATION_FAILED"));
    let names: Vec<&str> = r.json["invalidParams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["count", "filters.protocols[0]"]);
}

/// maxCountPerRequest is configurable and enforced.
#[tokio::test]
async fn max_count_is_configurable() {
    let h = Harness::with_config(|c| c.max_count_per_request = 3).await;
    h.load(&proxies("c", 5)).await;
    assert_eq!(h.extract(r#"{"count":4}"#, &[]).await.status, 422);
    assert_eq!(h.extract(r#"{"count":3}"#, &[]).await.ids().len(), 3);
}

/// The default fulfillment comes from configuration.
#[tokio::test]
async fn default_fulfillment_is_configurable() {
    let h = Harness::with_config(|c| {
        c.default_fulfillment = proxy_pool::pool::Fulfillment::AllOrNothing
    })
    .await;
    h.load(&proxies("d", 2)).await;
    assert_eq!(h.extract(r#"{"count":3}"#, &[]).await.status, 409);
    let r = h
        .extract(r#"{"count":3,"fulfillment":"partial"}"#, &[])
        .await;
    assert_eq!(r.ids().len(), 2);
}

/// A valid X-Request-ID is echoed in header and body; an invalid one is a
/// 400 answered with a generated id; an empty one is as good as none
/// (the contract bounds only its length).
#[tokio::test]
async fn request_ids() {
    let h = Harness::start().await;
    let r = h
        .extract(r#"{"count":1}"#, &[("x-request-id", "req_01J4EXAMPLE")])
        .await;
    assert_eq!(r.header("x-request-id"), Some("req_01J4EXAMPLE"));
    assert_eq!(r.json["requestId"], "req_01J4EXAMPLE");
    let long = "r".repeat(129);
    for bad in [long.as_str(), "bad\tid"] {
        let r = h.extract(r#"{"count":1}"#, &[("x-request-id", bad)]).await;
        assert_eq!(r.status, 400);
        assert!(r.header("x-request-id").unwrap().starts_with("req_"));
        assert_eq!(r.json["invalidParams"][0]["name"], "X-Request-ID");
    }
    let r = h.extract(r#"{"count":1}"#, &[("x-request-id", "")]).await;
    assert_eq!(r.status, 200);
    assert!(r.header("x-request-id").unwrap().starts_with("req_"));
    let r = h.get("/health/live").await;
    assert!(r.header("x-request-id").unwrap().starts_with("req_"));
}

/// Health endpoints are public and answer the Health schema.
#[tokio::test]
async fn health_probes() {
    let h = Harness::start().await;
    let live = h.get("/health/live").await;
    assert_eq!(
        (live.status, live.json["status"].as_str()),
        (200, Some("ok"))
    );
    assert_eq!(live.json["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(h.get("/health/ready").await.status, 200);
    h.app.start_draining();
    let r = h.get("/health/ready").await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.status, 503);
    assert_eq!(h.get("/health/live").await.status, 200);
}

/// Unknown paths are 404 and wrong methods 405 with `Allow`, as problems.
#[tokio::test]
async fn unknown_routes() {
    let h = Harness::start().await;
    assert_eq!(h.get("/api/v1/proxies").await.status, 404);
    let r = h.get(EXTRACT_PATH).await;
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    let r = h
        .send(Request::post("/health/live").body(Body::Empty).unwrap())
        .await;
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
}

/// Successful extractions are not cacheable: they carry live credentials.
#[tokio::test]
async fn responses_are_not_cached() {
    let h = Harness::start().await;
    h.load(&proxies("n", 1)).await;
    let r = h.extract(r#"{"count":1}"#, &[]).await;
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let p = &r.json["proxies"][0];
    assert_eq!(p["url"], "http://user-n-0000:SECRET-n-0000@192.0.2.10:8080");
    assert!(p["remainingTtlSeconds"].as_i64().unwrap() >= 599);
}

/// Oversized header sections are refused before anything else.
#[tokio::test]
async fn oversized_headers_are_400() {
    let h = Harness::start().await;
    let big = "v".repeat(9000);
    let r = h
        .extract(r#"{"count":1}"#, &[("x-pad-1", &big), ("x-pad-2", &big)])
        .await;
    assert_eq!((r.status, r.code()), (400, "BAD_REQUEST"));
    let r = h.extract(r#"{"count":1}"#, &[("x-pad-1", &big)]).await;
    assert_eq!(r.status, 200);
}
