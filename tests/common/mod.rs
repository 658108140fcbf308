//! Shared test harness: a real `redis-server` on a free loopback port, the
//! real handler, and OpenAPI validation of every response.
#![allow(dead_code)]

pub mod model;
pub mod postgres;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use jsonschema::Validator;
use lambda_http::Body;
use lambda_http::http::{HeaderMap, Request};
use proxy_pool::config::Config;
use proxy_pool::distribution::{App, EXTRACT_PATH, handle};
use proxy_pool::local::RedisServer;
use proxy_pool::pool::{NewProxy, RedisPool, UpsertStatus};
use proxy_pool::security::{
    AuthSchemes, Directory, Guard, PeerAddr, RedisRegistry, RegistryHandle,
};
use serde_json::Value;

pub use proxy_pool::clock::now_ms;

/// A healthy http/shanghai/telecom/provider-a proxy living 10 more minutes.
pub fn proxy(id: &str) -> NewProxy {
    let now = now_ms();
    NewProxy {
        id: id.into(),
        protocol: "http".into(),
        host: "192.0.2.10".into(),
        port: 8080,
        username: Some(format!("user-{id}")),
        password: Some(format!("SECRET-{id}")),
        region: "shanghai".into(),
        carrier: "telecom".into(),
        upstream: "provider-a".into(),
        expires_at: now + 600_000,
        usable_until: now + 600_000,
        health_ok: true,
        health_checked_at: now,
    }
}

/// `n` proxies `prefix-0..n`, expiring one second apart (the first soonest).
pub fn proxies(prefix: &str, n: usize) -> Vec<NewProxy> {
    (0..n)
        .map(|i| {
            let mut p = proxy(&format!("{prefix}-{i:04}"));
            p.expires_at += i as i64 * 1000;
            p.usable_until = p.expires_at;
            p
        })
        .collect()
}

/// One answer of the handler, already checked against the OpenAPI contract.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
    pub json: Value,
}

impl Reply {
    /// The ids of the proxies in a 200 extraction body.
    pub fn ids(&self) -> Vec<String> {
        self.json["proxies"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|p| p["id"].as_str().unwrap().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem `code` of an error body.
    pub fn code(&self) -> &str {
        self.json["code"].as_str().unwrap_or("")
    }
}

/// A real Redis, a pool over it, and the app, configured for one test.
pub struct Harness {
    pub redis: RedisServer,
    pub pool: RedisPool,
    pub app: Arc<App>,
    pub config: Config,
}

impl Harness {
    /// Default settings.
    pub async fn start() -> Self {
        Self::with_config(|_| {}).await
    }

    /// Settings adjusted by `adjust`, starting from anonymous access and no
    /// rate limits.
    pub async fn with_config(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::with_registry(adjust, RegistryHandle::default()).await
    }

    /// Settings adjusted by `adjust`, with a client registry.
    pub async fn with_registry(adjust: impl FnOnce(&mut Config), registry: RegistryHandle) -> Self {
        Self::with_redis_args(&[], adjust, registry).await
    }

    /// Like [`Harness::with_registry`], the `redis-server` started with
    /// extra `--name value` arguments.
    pub async fn with_redis_args(
        args: &[&str],
        adjust: impl FnOnce(&mut Config),
        registry: RegistryHandle,
    ) -> Self {
        Self::build(args, adjust, |_| registry.into()).await
    }

    /// Settings adjusted by `adjust`, clients read from the Redis registry
    /// in the harness's own Redis (`PROXY_POOL_CLIENT_REGISTRY=redis`).
    pub async fn with_redis_registry(adjust: impl FnOnce(&mut Config)) -> Self {
        Self::build(&[], adjust, |pool| RedisRegistry::new(pool.clone()).into()).await
    }

    async fn build(
        args: &[&str],
        adjust: impl FnOnce(&mut Config),
        registry: impl FnOnce(&RedisPool) -> Directory,
    ) -> Self {
        let redis = RedisServer::start_with(args).await.expect(
            "redis-server must be installed for the tests (apt-get install -y redis-server)",
        );
        let mut config = Config {
            redis_url: Some(redis.url()),
            auth_schemes: AuthSchemes::parse("none").unwrap(),
            client_rate: None,
            ..Config::default()
        };
        adjust(&mut config);
        let pool = RedisPool::with_options(&redis.url(), &config.redis_options()).unwrap();
        let guard = Guard::new(config.auth_schemes, config.sources.clone(), registry(&pool));
        let app = Arc::new(App::new(config.settings(), pool.clone(), Arc::new(guard)));
        Self {
            redis,
            pool,
            app,
            config,
        }
    }

    /// Adds proxies through the upsert script.
    pub async fn load(&self, proxies: &[NewProxy]) -> Vec<UpsertStatus> {
        self.pool.upsert(proxies).await.unwrap()
    }

    /// `POST /api/v1/proxies/extract` with a JSON body and extra headers.
    pub async fn extract(&self, body: &str, headers: &[(&str, &str)]) -> Reply {
        self.send(extract_request(body, headers)).await
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Reply {
        self.send(Request::get(path).body(Body::Empty).unwrap())
            .await
    }

    /// Sends a request from 127.0.0.1 unless it carries its own peer.
    pub async fn send(&self, req: lambda_http::Request) -> Reply {
        send(&self.app, req).await
    }

    /// A raw Redis connection, for inspecting and damaging the pool.
    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A raw connection without a response timeout, for commands that
    /// block on purpose (`DEBUG SLEEP`) or are sent while Redis is blocked.
    pub async fn admin(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        redis::Client::open(self.redis.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    /// Asserts that every key carries a TTL ending no later than `limit`
    /// (Unix ms); returns the keys.
    pub async fn assert_keys_expire_by(&self, limit: i64) -> Vec<String> {
        let mut conn = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        for k in &keys {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(k)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert!(at > 0 && at <= limit, "{k} expires at {at}, after {limit}");
        }
        keys
    }

    /// Every key with its contents and expiry, in a canonical order, to
    /// prove that nothing changed (DUMP is not stable for hash tables).
    pub async fn snapshot(&self) -> BTreeMap<String, String> {
        let mut conn = self.redis().await;
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .unwrap();
        let mut out = BTreeMap::new();
        for k in keys {
            let kind: String = redis::cmd("TYPE")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            let contents = match kind.as_str() {
                "hash" => {
                    let m: BTreeMap<String, String> = redis::cmd("HGETALL")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{m:?}")
                }
                "zset" => {
                    let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{v:?}")
                }
                _ => {
                    let dump: Vec<u8> = redis::cmd("DUMP")
                        .arg(&k)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    format!("{dump:?}")
                }
            };
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query_async(&mut conn)
                .await
                .unwrap();
            out.insert(k, format!("{kind} expires {at}: {contents}"));
        }
        out
    }
}

/// The app over `pool` with `config`'s policy, anonymous callers allowed.
pub fn app_over(config: &Config, pool: RedisPool) -> Arc<App> {
    let guard = Guard::new(
        config.auth_schemes,
        config.sources.clone(),
        RegistryHandle::default(),
    );
    Arc::new(App::new(config.settings(), pool, Arc::new(guard)))
}

/// Settings for a test app: anonymous callers, no rate limits.
pub fn test_config() -> Config {
    Config {
        auth_schemes: AuthSchemes::parse("none").unwrap(),
        client_rate: None,
        ..Config::default()
    }
}

/// Sends a request to `app` from 127.0.0.1 unless it carries its own peer.
pub async fn send(app: &App, mut req: lambda_http::Request) -> Reply {
    if req.extensions().get::<PeerAddr>().is_none() {
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        req.extensions_mut().insert(PeerAddr(peer));
    }
    let path = req.uri().path().to_owned();
    let response = handle(app, req).await;
    reply(&path, response)
}

/// `POST /api/v1/proxies/extract` to `app` with a JSON body and extra headers.
pub fn extract_request(body: &str, headers: &[(&str, &str)]) -> lambda_http::Request {
    let mut req = Request::post(EXTRACT_PATH).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}

/// `POST /api/v1/proxies/extract` to `app` from the TCP peer `peer` (`ip:port`).
pub async fn extract_as(app: &App, body: &str, headers: &[(&str, &str)], peer: &str) -> Reply {
    let mut req = extract_request(body, headers);
    req.extensions_mut()
        .insert(PeerAddr(peer.parse().expect("peer is ip:port")));
    send(app, req).await
}

/// Turns a handler response into a [`Reply`], checking the contract:
/// JSON bodies valid against `api/openapi/proxy-pool.yaml`, problems as
/// `application/problem+json` carrying the `X-Request-ID` they answer.
pub fn reply(path: &str, response: lambda_http::Response<Body>) -> Reply {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = match response.body() {
        Body::Text(s) => s.clone(),
        Body::Binary(b) => String::from_utf8(b.clone()).unwrap(),
        _ => String::new(),
    };
    let json: Value = serde_json::from_str(&body).expect("every response body is JSON");
    let content_type = headers["content-type"].to_str().unwrap();
    let request_id = headers["x-request-id"].to_str().unwrap();
    let schema = if status >= 400 {
        assert_eq!(content_type, "application/problem+json");
        assert_eq!(json["requestId"], request_id);
        assert_eq!(json["status"], status);
        assert!(
            json["type"]
                .as_str()
                .unwrap()
                .starts_with("https://proxy-pool.local/problems/")
        );
        "Problem"
    } else if path == EXTRACT_PATH {
        assert_eq!(content_type, "application/json");
        let proxies = json["proxies"].as_array().unwrap();
        assert_eq!(json["returned"].as_u64().unwrap() as usize, proxies.len());
        "ExtractResponse"
    } else {
        assert_eq!(content_type, "application/json");
        "Health"
    };
    assert_valid(schema, &json);
    Reply {
        status,
        headers,
        body,
        json,
    }
}

/// Validates `instance` against `#/components/schemas/<name>` of the contract.
pub fn assert_valid(name: &str, instance: &Value) {
    static VALIDATORS: OnceLock<BTreeMap<String, Validator>> = OnceLock::new();
    let validators = VALIDATORS.get_or_init(|| {
        let yaml = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/api/openapi/proxy-pool.yaml"
        ))
        .unwrap();
        let doc: Value = serde_yaml::from_str(&yaml).unwrap();
        ["ExtractResponse", "Problem", "Health"]
            .into_iter()
            .map(|name| {
                let mut schema = doc.clone();
                schema["$ref"] = Value::String(format!("#/components/schemas/{name}"));
                let validator = jsonschema::options()
                    .with_draft(jsonschema::Draft::Draft202012)
                    .should_validate_formats(true)
                    .build(&schema)
                    .unwrap();
                (name.to_owned(), validator)
            })
            .collect()
    });
    let errors: Vec<String> = validators[name]
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{name} violates the contract: {errors:?}\n{instance}"
    );
}

/// One HTTP/1.1 exchange over a fresh TCP connection (`Connection: close`):
/// status, lower-cased headers and body.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, BTreeMap<String, String>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        request.push_str(&format!("{k}: {v}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .collect();
    (status, headers, body.to_owned())
}

/// What [`plant`] writes.
#[derive(Debug, Clone, Copy)]
pub struct Planted {
    /// The record in `{pp}:proxies`.
    pub record: bool,
    /// Its entries in every index set.
    pub index: bool,
    /// Its `{pp}:expiry` entry.
    pub expiry: bool,
}

impl Planted {
    /// Record, index entries and expiry entry.
    pub const ALL: Self = Self {
        record: true,
        index: true,
        expiry: true,
    };
}

/// A live record as the scripts store it (times in Unix ms), healthy,
/// AVAILABLE, http/shanghai/telecom/provider-a, for [`plant`].
pub fn raw_record(id: &str, expires: i64, checked_at: i64) -> Value {
    serde_json::json!({"id": id, "protocol": "http", "host": "192.0.2.99", "port": 1,
        "region": "shanghai", "carrier": "telecom", "upstream": "provider-a",
        "expiresAt": expires, "usableUntil": expires, "healthOk": true,
        "healthCheckedAt": checked_at, "status": "AVAILABLE", "epoch": 0,
        "active": 0, "reserved": 0})
}

/// Writes a record straight into Redis, bypassing the scripts, as a damaged
/// or racing pool could hold it: the record (split into its details and its
/// state, as `lua/prelude.lua` stores them), its entries in every index set
/// (the layout `lua/prelude.lua` describes, computed from the record's own
/// fields) and its expiry entry, each optional.
pub async fn plant(h: &Harness, rec: &Value, what: Planted) {
    use proxy_pool::pool::keys;
    let s = |f: &str| rec[f].as_str().unwrap_or_default().to_owned();
    let (id, p, r, c, u) = (
        s("id"),
        s("protocol"),
        s("region"),
        s("carrier"),
        s("upstream"),
    );
    let expires = rec["expiresAt"].as_i64().unwrap();
    let e = format!("{expires:013}");
    let mut pipe = redis::pipe();
    if what.record {
        let (mut details, mut state) = (serde_json::Map::new(), serde_json::Map::new());
        for (k, v) in rec.as_object().unwrap() {
            let into = if proxy_pool::pool::keys::DETAIL_FIELDS.contains(&k.as_str()) {
                &mut details
            } else {
                &mut state
            };
            into.insert(k.clone(), v.clone());
        }
        pipe.hset(keys::PROXIES, &id, Value::Object(details).to_string())
            .ignore()
            .hset(keys::STATE, &id, Value::Object(state).to_string())
            .ignore();
    }
    if what.index {
        let loc = format!("{p}|{r}|{c}|{u}|{e}|{id}");
        // The deadline under the harness's pool policy (lua/prelude.lua).
        let policy = h.pool.policy();
        let until = rec["usableUntil"].as_i64().unwrap_or(expires);
        let checked = rec["healthCheckedAt"].as_i64().unwrap_or(0);
        let d = until
            .min(expires - (policy.min_remaining_ttl.as_millis() as i64).max(1) + 1)
            .min(checked + policy.max_health_check_age.as_millis() as i64 + 1);
        let tail = format!("{d:013}|{e}|{id}");
        let atom = format!("{p}|{r}|{c}|{u}");
        pipe.zadd(keys::IX_POOL, format!("{e}|{id}\t{p}|{r}|{c}|{u}"), 0)
            .ignore()
            .zadd(keys::IX_REGION, format!("{r}|{e}|{id}\t{p}|{c}|{u}"), 0)
            .ignore()
            .zadd(keys::IX_KIND, format!("{p}|{c}|{u}|{e}|{id}\t{r}"), 0)
            .ignore()
            .zadd(keys::IX_ATOM, &loc, 0)
            .ignore()
            .zadd(keys::IX_LIVE, &loc, d)
            .ignore()
            .zadd(keys::IX_DREGION, format!("{r}|{tail}"), 0)
            .ignore()
            .zadd(keys::IX_DKIND, format!("{p}|{c}|{u}|{tail}"), 0)
            .ignore()
            .zadd(keys::IX_DATOM, format!("{atom}|{tail}"), 0)
            .ignore()
            .hincr(keys::IX_ATOMS, &atom, 1)
            .ignore();
        let mut conn = h.redis().await;
        let known: bool = redis::cmd("HEXISTS")
            .arg(keys::IX_ATOMS)
            .arg(&atom)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !known {
            for (key, value) in [
                (keys::IX_PROTOCOLS, p.clone()),
                (keys::IX_REGIONS, r.clone()),
                (keys::IX_CARRIERS, c.clone()),
                (keys::IX_UPSTREAMS, u.clone()),
                (keys::IX_KINDS, format!("{p}|{c}|{u}")),
            ] {
                pipe.hincr(key, value, 1).ignore();
            }
        }
    }
    if what.expiry {
        pipe.zadd(keys::EXPIRY, &id, expires).ignore();
    }
    let mut conn = h.redis().await;
    let _: () = pipe.query_async(&mut conn).await.unwrap();
}

/// The locators in the atom family (read raw: works on a damaged pool too).
pub async fn index_locators(h: &Harness) -> Vec<String> {
    let mut conn = h.redis().await;
    redis::cmd("ZRANGE")
        .arg(proxy_pool::pool::keys::IX_ATOM)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// Makes a throw-away CA and a server certificate for 127.0.0.1 with openssl.
pub fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl must be installed for the TLS tests (apt-get install -y openssl)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=proxy-pool test CA",
    ];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.crt"]);
    run(&ca);
    let mut csr = vec!["req", "-new", "-subj", "/CN=127.0.0.1"];
    csr.extend(ec);
    csr.extend(["-keyout", "server.key", "-out", "server.csr"]);
    run(&csr);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    (
        dir.join("server.crt"),
        dir.join("server.key"),
        dir.join("ca.crt"),
    )
}

/// The hours (Unix s) whose counter hashes exist.
pub async fn usage_hours(h: &Harness) -> Vec<i64> {
    let mut conn = h.redis().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("{pp}:usage:[0-9]*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut hours: Vec<i64> = keys
        .iter()
        .map(|k| k.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    hours.sort();
    hours
}

/// Closes the hours being counted into: moves each hash of the last two
/// hours `back` hours into the past (its TTL kept). Returns the new hours.
pub async fn close_hours(h: &Harness, back: i64) -> Vec<i64> {
    let mut conn = h.redis().await;
    let recent = now_ms() / 1000 - 2 * 3600;
    let mut moved = Vec::new();
    for hour in usage_hours(h).await.into_iter().filter(|h| *h > recent) {
        let to = hour - back * 3600;
        let _: () = redis::cmd("RENAME")
            .arg(proxy_pool::pool::keys::usage_hour(hour))
            .arg(proxy_pool::pool::keys::usage_hour(to))
            .query_async(&mut conn)
            .await
            .unwrap();
        moved.push(to);
    }
    assert!(!moved.is_empty(), "nothing was counted");
    moved
}

/// A log sink for `tracing_subscriber` that keeps everything written, so a
/// test can search the logs.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether `n` replicas of the Redis at `url` acknowledge a write made
/// now (see [`proxy_pool::local::replicas_acknowledge`]); an error is a no.
pub async fn replicas_acknowledge(url: &str, key: &str, n: usize) -> bool {
    proxy_pool::local::replicas_acknowledge(url, key, n)
        .await
        .unwrap_or(false)
}

/// Calls per command in the text of `INFO commandstats` (the commands a
/// script runs included), by lower-case command name.
pub fn command_calls(info: &str) -> BTreeMap<String, u64> {
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}
