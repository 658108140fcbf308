//! Shared test harness: a real `redis-server` on a free loopback port, the
//! real handler (the [`Harness`] that puts them together is in
//! `harness.rs`), and OpenAPI validation of every response.
#![allow(dead_code)]

mod harness;
pub mod model;
pub mod pools;
pub mod postgres;
mod raw;
mod tls;
pub mod topology;

// Each test crate uses some of these; the others are not unused code.
#[allow(unused_imports)]
pub use harness::Harness;
#[allow(unused_imports)]
pub use raw::{
    Planted, encode_record, index_locators, plant, raw_record, status_of, stored_status,
};
#[allow(unused_imports)]
pub use tls::certificates;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use jsonschema::Validator;
use lambda_http::Body;
use lambda_http::http::{HeaderMap, Request};
use proxy_pool::config::Config;
use proxy_pool::distribution::{App, EXTRACT_PATH, handle};
use proxy_pool::pool::{NewProxy, RedisPool};
use proxy_pool::security::{AuthSchemes, Guard, PeerAddr, RegistryHandle};
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

/// A `GET` of `path` to `app`, from 127.0.0.1.
pub async fn get(app: &App, path: &str) -> Reply {
    send(app, Request::get(path).body(Body::Empty).unwrap()).await
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
    parse_answer(&raw)
}

/// One complete HTTP/1.1 answer in `raw`: status, lower-cased headers, body.
pub fn parse_answer(raw: &[u8]) -> (u16, BTreeMap<String, String>, String) {
    let raw = String::from_utf8(raw.to_vec()).unwrap();
    let (head, body) = raw
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no complete answer: {raw:?}"));
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
