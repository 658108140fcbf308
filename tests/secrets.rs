//! The client registry and Redis credentials from AWS Secrets Manager,
//! through a local emulator (moto's server) and the real SDK.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::process::Stdio;
use std::time::Duration;

use aws_sdk_secretsmanager::config::{BehaviorVersion, Credentials, Region};
use common::{Harness, proxies};
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{OutageClass, PoolContract, RedisPool};
use proxy_pool::secrets::{
    RegistrySource, SecretStore, redis_url_from_secret, refresh, start_registry,
};
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{AuthSchemes, RegistryHandle};
use proxy_pool::startup;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A moto server on a free loopback port, killed on drop.
struct Moto {
    _child: Child,
    client: aws_sdk_secretsmanager::Client,
}

impl Moto {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("moto_server must be installed for the tests (pip install 'moto[server]')");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        // moto says when it listens; no polling.
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("moto_server exited");
            if line.contains("Running on") {
                break;
            }
        }
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let config = aws_sdk_secretsmanager::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .endpoint_url(format!("http://127.0.0.1:{port}"))
            .build();
        Self {
            _child: child,
            client: aws_sdk_secretsmanager::Client::from_conf(config),
        }
    }

    async fn create(&self, id: &str, value: &str) {
        self.client
            .create_secret()
            .name(id)
            .secret_string(value)
            .send()
            .await
            .unwrap();
    }

    async fn put(&self, id: &str, value: &str) {
        self.client
            .put_secret_value()
            .secret_id(id)
            .secret_string(value)
            .send()
            .await
            .unwrap();
    }
}

fn doc(key: &str) -> String {
    format!(
        r#"{{"clients":[{{"id":"acme","apiKeys":["{}"]}}]}}"#,
        CredentialHash::of(key.as_bytes()).encode()
    )
}

async fn harness_with(registry: RegistryHandle) -> Harness {
    let schemes = AuthSchemes::parse("apiKey").unwrap();
    let h = Harness::with_registry(|c| c.auth_schemes = schemes, registry).await;
    h.load(&proxies("m", 10)).await;
    h
}

/// Initial load from the secret, a rotation picked up by a refresh, and a
/// failed refresh that keeps the last good copy.
#[tokio::test]
async fn registry_load_rotate_and_keep_on_failure() {
    let moto = Moto::start().await;
    moto.create("proxy-pool/clients", &doc("pp_key_one_000"))
        .await;
    let source = RegistrySource::Secret {
        store: SecretStore::new(moto.client.clone()),
        id: "proxy-pool/clients".into(),
    };
    let handle = start_registry(source.clone(), Duration::from_secs(3600)).await;
    let h = harness_with(handle.clone()).await;
    let body = r#"{"count":1}"#;
    assert_eq!(
        h.extract(body, &[("x-api-key", "pp_key_one_000")])
            .await
            .status,
        200
    );

    // Rotation: the new key works after a refresh, the old one no longer does.
    moto.put("proxy-pool/clients", &doc("pp_key_two_000")).await;
    assert!(refresh(&source, &handle).await);
    assert_eq!(
        h.extract(body, &[("x-api-key", "pp_key_two_000")])
            .await
            .status,
        200
    );
    assert_eq!(
        h.extract(body, &[("x-api-key", "pp_key_one_000")])
            .await
            .status,
        401
    );

    // A broken document, then a vanished secret: the last good copy stays.
    moto.put("proxy-pool/clients", "{ not json").await;
    assert!(!refresh(&source, &handle).await);
    moto.client
        .delete_secret()
        .secret_id("proxy-pool/clients")
        .force_delete_without_recovery(true)
        .send()
        .await
        .unwrap();
    assert!(!refresh(&source, &handle).await);
    assert_eq!(
        h.extract(body, &[("x-api-key", "pp_key_two_000")])
            .await
            .status,
        200
    );
}

/// A failed first load leaves extraction at 503 (health stays up) until a
/// later refresh succeeds.
#[tokio::test]
async fn failed_first_load_is_503_until_a_refresh() {
    let moto = Moto::start().await;
    let source = RegistrySource::Secret {
        store: SecretStore::new(moto.client.clone()),
        id: "missing".into(),
    };
    let handle = start_registry(source.clone(), Duration::from_secs(3600)).await;
    assert!(handle.current().is_none());
    let h = harness_with(handle.clone()).await;
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_key_one_000")])
        .await;
    assert_eq!(r.status, 503);
    assert_eq!(h.get("/health/live").await.status, 200);
    moto.create("missing", &doc("pp_key_one_000")).await;
    assert!(refresh(&source, &handle).await);
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_key_one_000")])
        .await;
    assert_eq!(r.status, 200);
}

/// The Redis URL can come from a secret, as the Lambda entrypoint reads it.
#[tokio::test]
async fn redis_url_from_a_secret() {
    let moto = Moto::start().await;
    let h = Harness::start().await;
    let port = h.redis.port();
    moto.create(
        "proxy-pool/redis",
        &format!(r#"{{"url":"redis://127.0.0.1:{port}/"}}"#),
    )
    .await;
    let store = SecretStore::new(moto.client.clone());
    let secret = store.fetch("proxy-pool/redis").await.unwrap();
    let url = redis_url_from_secret(&secret, None).unwrap();
    let pool = proxy_pool::pool::RedisPool::new(&url, Duration::from_secs(2)).unwrap();
    pool.ping().await.unwrap();
    let err = store.fetch("nope").await.unwrap_err().to_string();
    assert!(err.starts_with("secret nope:"), "{err}");
}

/// Extraction from 127.0.0.1:1, checked against the contract.
async fn extract_once(app: &proxy_pool::distribution::App) -> common::Reply {
    common::extract_as(app, r#"{"count":1}"#, &[], "127.0.0.1:1").await
}

/// Redis refusing the password is a 503 for extraction and readiness
/// alike (never a 500): the service is unavailable, not broken.
#[tokio::test]
async fn a_refused_password_is_503() {
    let redis = RedisServer::start_with(&["--requirepass", "right-pw"])
        .await
        .expect("redis-server must be installed");
    let config = common::test_config();
    let url = format!("redis://:wrong-pw@127.0.0.1:{}/", redis.port());
    let pool = RedisPool::with_options(&url, &config.redis_options()).unwrap();
    let app = common::app_over(&config, pool.clone());
    let r = extract_once(&app).await;
    assert_eq!(
        (r.status, r.code()),
        (503, "SERVICE_UNAVAILABLE"),
        "{}",
        r.body
    );
    let ready = common::get(&app, "/health/ready").await;
    assert_eq!(ready.status, 503, "{}", ready.body);
    let err = pool.ping().await.unwrap_err();
    assert_eq!(err.outage_class(), Some(OutageClass::Authentication));
    assert!(!err.to_string().contains("wrong-pw"), "{err}");
}

/// A rotated Redis password reaches the running service without a
/// redeploy. The secret (moto) and then Redis (`requirepass`) change while
/// it runs, and Redis closes every connection: answers are 503 (never 500)
/// until Redis refuses the old password, which makes the service read the
/// secret again and reconnect with the new one; then 200 again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_redis_password_is_picked_up_without_a_redeploy() {
    let moto = Moto::start().await;
    let redis = RedisServer::start_with(&["--requirepass", "old-rotating-pw"])
        .await
        .expect("redis-server must be installed");
    moto.create("proxy-pool/redis", r#"{"password":"old-rotating-pw"}"#)
        .await;
    let store = SecretStore::new(moto.client.clone());
    let mut config = common::test_config();
    config.redis_secret_id = Some("proxy-pool/redis".into());
    config.redis_url = Some(format!("redis://127.0.0.1:{}/", redis.port()));
    let url = startup::redis_url(&config, Some(&store))
        .await
        .unwrap()
        .unwrap();
    let pool = startup::redis_pool(&config, Some(&store), &url).unwrap();
    let app = common::app_over(&config, pool.clone());
    PoolContract::new(&pool)
        .upsert(&proxies("rot", 50))
        .await
        .unwrap();
    assert_eq!(extract_once(&app).await.status, 200);

    moto.put("proxy-pool/redis", r#"{"password":"new-rotating-pw"}"#)
        .await;
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("new-rotating-pw")
        .query_async::<()>(&mut admin)
        .await
        .unwrap();
    let _: Result<(), _> = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .query_async(&mut admin)
        .await;

    let started = std::time::Instant::now();
    let mut refused = 0;
    loop {
        let r = extract_once(&app).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(
            (r.status, r.code()),
            (503, "SERVICE_UNAVAILABLE"),
            "{}",
            r.body
        );
        refused += 1;
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "still refused after {refused} requests"
        );
        // The client's own back-off before it retries.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused >= 1, "the old connection was never refused");
}

/// The aggregates database from a Secrets Manager secret
/// (`PROXY_POOL_AGGREGATES_DATABASE_SECRET_ID`, through `startup`): it is
/// read at every flush, so a wrong password fails a flush (counters kept,
/// no password in the report) and its rotation is picked up by the next
/// flush without a restart.
#[tokio::test]
async fn aggregates_database_from_a_secret() {
    let moto = Moto::start().await;
    let pg = common::postgres::Postgres::start().await;
    let wrong = pg
        .url()
        .replace(common::postgres::PASSWORD, "not-the-password");
    moto.create(
        "proxy-pool/aggregates",
        &serde_json::json!({"url": wrong}).to_string(),
    )
    .await;
    let h = Harness::with_config(|c| {
        c.aggregates_database_secret_id = Some("proxy-pool/aggregates".into());
    })
    .await;
    h.load(&proxies("agg", 4)).await;
    assert_eq!(h.extract(r#"{"count":2}"#, &[]).await.ids().len(), 2);
    common::close_hours(&h, 2).await;
    let store = SecretStore::new(moto.client.clone());
    let aggregates = proxy_pool::startup::aggregates(&h.config, Some(&store)).unwrap();

    let refused = aggregates.flush(&h.pool).await;
    assert_eq!(
        refused.error.as_deref(),
        Some("postgres refused: SQLSTATE 28P01")
    );
    assert_eq!(refused.hours_pending, 1);

    moto.put("proxy-pool/aggregates", &pg.url()).await;
    let report = aggregates.flush(&h.pool).await;
    assert_eq!(report.error, None);
    assert_eq!((report.hours_flushed, report.proxies_flushed), (1, 2));
}
