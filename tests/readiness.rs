//! `/health/ready` tells what the instance serves with: `ok`, `degraded`
//! (200) with its reasons in the `readiness-reasons` header, or a 503
//! problem; `configVersion` names the settings. Every answer is checked
//! against the contract (`common::reply`).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::time::{Duration, Instant};

use common::{Harness, Reply};
use proxy_pool::aggregates::DatabaseUrl;
use proxy_pool::distribution::readiness::{REASONS_HEADER, REFRESH_ALLOWANCE};
use proxy_pool::pool::{RedisPool, UsageStore};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, ClientRegistry, RegistryHandle};

fn registry() -> ClientRegistry {
    let doc = format!(
        r#"{{"clients":[{{"id":"acme","apiKeys":["{}"]}}]}}"#,
        CredentialHash::of(b"pp_readiness_key_1").encode()
    );
    ClientRegistry::parse(&doc).unwrap()
}

async fn ready(h: &Harness) -> Reply {
    h.get("/health/ready").await
}

fn reasons(r: &Reply) -> Option<&str> {
    r.header(REASONS_HEADER)
}

/// A healthy instance is `ok`, without reasons; both probes name the
/// configuration in force, the same for the same settings.
#[tokio::test]
async fn ok_names_the_configuration() {
    let h = Harness::start().await;
    let r = ready(&h).await;
    assert_eq!(
        (r.status, &r.json["status"]),
        (200, &"ok".into()),
        "{}",
        r.body
    );
    assert_eq!(reasons(&r), None);
    let version = h.config.version();
    assert_eq!(r.json["configVersion"], version.as_str());
    let live = h.get("/health/live").await;
    assert_eq!(live.json["configVersion"], version.as_str());
    // A rotated Redis password is the same configuration.
    let mut same = h.config.clone();
    same.redis_url = Some("redis://:a-password@127.0.0.1:1/".into());
    let mut other = same.clone();
    other.redis_url = Some("redis://:another-password@127.0.0.1:1/".into());
    assert_eq!(same.version(), other.version());
}

/// A registry copy older than its refresh period (plus one reload's time)
/// is `degraded`, with its reason; a fresh copy is `ok` again.
#[tokio::test]
async fn a_stale_registry_copy_is_degraded() {
    let refresh = Duration::from_secs(60);
    let handle = RegistryHandle::refreshed_every(refresh);
    let read_at = Instant::now()
        .checked_sub(refresh + REFRESH_ALLOWANCE + Duration::from_secs(1))
        .unwrap();
    handle.replace_read_at(registry(), read_at);
    let h = Harness::with_registry(
        |c| c.auth_schemes = AuthSchemes::parse("apiKey").unwrap(),
        handle.clone(),
    )
    .await;
    let r = ready(&h).await;
    assert_eq!(
        (r.status, r.json["status"].as_str(), reasons(&r)),
        (200, Some("degraded"), Some("client-registry-stale")),
        "{}",
        r.body
    );
    assert_eq!(r.json["configVersion"], h.config.version().as_str());
    // It still serves on that copy.
    let served = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_readiness_key_1")])
        .await;
    assert_eq!(served.status, 200, "{}", served.body);
    handle.replace(registry());
    let r = ready(&h).await;
    assert_eq!((r.json["status"].as_str(), reasons(&r)), (Some("ok"), None));
}

/// A registry never loaded stops authenticated callers: 503 with its
/// reason; `degraded` when anonymous callers are still served.
#[tokio::test]
async fn a_missing_registry_is_unavailable() {
    let h = Harness::with_registry(
        |c| c.auth_schemes = AuthSchemes::parse("apiKey").unwrap(),
        RegistryHandle::refreshed_every(Duration::from_secs(60)),
    )
    .await;
    let r = ready(&h).await;
    assert_eq!(
        (r.status, r.code(), reasons(&r)),
        (503, "SERVICE_UNAVAILABLE", Some("client-registry-missing"))
    );
    let h = Harness::with_registry(
        |c| c.auth_schemes = AuthSchemes::parse("apiKey,none").unwrap(),
        RegistryHandle::refreshed_every(Duration::from_secs(60)),
    )
    .await;
    let r = ready(&h).await;
    assert_eq!(
        (r.status, r.json["status"].as_str(), reasons(&r)),
        (200, Some("degraded"), Some("client-registry-missing"))
    );
}

/// With aggregates on, closed hours of usage that waited past the flush
/// allowance make readiness `degraded`; once they are gone, `ok`.
#[tokio::test]
async fn unflushed_usage_is_degraded() {
    let url = DatabaseUrl::parse("postgres://app:unused@127.0.0.1:1/usage").unwrap();
    let h = Harness::with_config(move |c| c.aggregates_database_url = Some(url)).await;
    h.load(&common::proxies("u", 3)).await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.status, 200);
    // The hour being counted is open: nothing to flush yet.
    let r = ready(&h).await;
    assert_eq!((r.json["status"].as_str(), reasons(&r)), (Some("ok"), None));
    let hours = common::close_hours(&h, 2).await;
    let r = ready(&h).await;
    assert_eq!(
        (r.status, r.json["status"].as_str(), reasons(&r)),
        (200, Some("degraded"), Some("usage-unflushed")),
        "{}",
        r.body
    );
    for hour in hours {
        UsageStore::new(&h.pool).forget(hour).await.unwrap();
    }
    let r = ready(&h).await;
    assert_eq!((r.json["status"].as_str(), reasons(&r)), (Some("ok"), None));
}

/// Redis unavailable and draining are 503 problems naming their reason.
#[tokio::test]
async fn unavailable_redis_and_draining_are_503() {
    let config = common::test_config();
    let pool = RedisPool::new("redis://127.0.0.1:1/", Duration::from_millis(200)).unwrap();
    let app = common::app_over(&config, pool);
    let r = common::get(&app, "/health/ready").await;
    assert_eq!(
        (r.status, r.code(), reasons(&r)),
        (503, "SERVICE_UNAVAILABLE", Some("redis-unavailable"))
    );
    let h = Harness::start().await;
    h.app.start_draining();
    let r = ready(&h).await;
    assert_eq!((r.status, reasons(&r)), (503, Some("draining")));
}
