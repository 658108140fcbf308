//! `proxy-pool serve` left running: half-open and silent connections,
//! idle keep-alive connections and slow bodies are closed on their
//! deadlines, the connection cap holds, and a normal request is answered
//! meanwhile; request heads hyper's parser refuses are answered with the
//! handler's problems. Every wait is for an event (an answer, an end of
//! stream), bounded by an overall deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::Harness;
use proxy_pool::server::{ServeOptions, serve_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};

/// `serve_with(options)` over a fresh harness, on a free loopback port;
/// dropping the sender stops it.
async fn start(options: ServeOptions) -> (Harness, SocketAddr, oneshot::Sender<()>) {
    let h = Harness::start().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(serve_with(listener, h.app.clone(), options, async move {
        let _ = stopped.await;
    }));
    (h, addr, stop)
}

/// Reads until the server ends the stream (EOF or reset); what it sent.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one HTTP/1.1 response (headers and a Content-Length body); its status.
async fn response(stream: &mut TcpStream) -> u16 {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before a full response");
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .map_or(0, |v| v.trim().parse().unwrap());
            if body.len() >= length {
                return head.split(' ').nth(1).unwrap().parse().unwrap();
            }
        }
    }
}

/// The soft limit on open files (`ulimit -n`), from `/proc/self/limits`.
fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

const LIVE: &[u8] = b"GET /health/live HTTP/1.1\r\nhost: t\r\n\r\n";

/// 2,000 half-open connections (half silent, half stopped inside their
/// headers) are all closed within the header read timeout, while a normal
/// request made meanwhile is answered within 100 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_are_dropped_within_the_header_timeout() {
    // Both ends of 2,000 connections live in this process.
    if let Some(limit) = open_files_limit() {
        assert!(
            limit >= 4_200,
            "ulimit -n is {limit}: this test needs 4,200 open files"
        );
    }
    let header_timeout = Duration::from_secs(1);
    let (_h, addr, _stop) = start(ServeOptions {
        header_read_timeout: header_timeout,
        ..ServeOptions::default()
    })
    .await;
    let started = Instant::now();
    let mut open = Vec::new();
    for i in 0..2000 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 1 {
            stream
                .write_all(b"GET /health/live HTTP/1.1\r\nhost: t\r\n")
                .await
                .unwrap();
        }
        open.push((stream, Instant::now()));
    }
    let opened_in = started.elapsed();

    let asked = Instant::now();
    let (status, _, body) = common::http(addr, "GET", "/health/ready", &[], "").await;
    let answered_in = asked.elapsed();
    assert_eq!(status, 200, "{body}");
    assert!(
        answered_in < Duration::from_millis(100),
        "answered in {answered_in:?} among 2,000 half-open connections"
    );

    let mut closing = JoinSet::new();
    for (mut stream, opened) in open {
        closing.spawn(async move {
            let sent = until_closed(&mut stream).await;
            (opened.elapsed(), sent)
        });
    }
    let mut slowest = Duration::ZERO;
    let mut fastest = Duration::MAX;
    let all = async {
        while let Some(closed) = closing.join_next().await {
            let (after, sent) = closed.unwrap();
            assert!(sent.is_empty(), "a half-open connection got an answer");
            slowest = slowest.max(after);
            fastest = fastest.min(after);
        }
    };
    timeout(header_timeout * 5, all)
        .await
        .expect("every half-open connection closed");
    eprintln!(
        "2000 half-open connections opened in {opened_in:?}; normal request answered in {answered_in:?}; closed {fastest:?} to {slowest:?} after opening (header timeout {header_timeout:?})"
    );
    // Closed by the timeout, not at once, and not much later than it.
    assert!(
        fastest >= header_timeout - Duration::from_millis(50),
        "{fastest:?}"
    );
    assert!(
        slowest <= header_timeout + Duration::from_millis(500),
        "{slowest:?}"
    );
}

/// A keep-alive connection serves several requests, then is closed after
/// the idle timeout (longer than the header timeout: they are separate);
/// a body that stops coming is cut off at the body read timeout, unanswered.
#[tokio::test]
async fn idle_connections_and_slow_bodies_are_closed() {
    let (header, idle, body) = (
        Duration::from_millis(500),
        Duration::from_millis(1500),
        Duration::from_millis(700),
    );
    let (_h, addr, _stop) = start(ServeOptions {
        header_read_timeout: header,
        idle_timeout: idle,
        body_read_timeout: body,
        ..ServeOptions::default()
    })
    .await;
    let mut keep = TcpStream::connect(addr).await.unwrap();
    for _ in 0..2 {
        keep.write_all(LIVE).await.unwrap();
        assert_eq!(response(&mut keep).await, 200);
    }
    let answered = Instant::now();
    let after = timeout(idle * 3, until_closed(&mut keep))
        .await
        .map(|_| answered.elapsed())
        .expect("the idle connection is closed");
    assert!(after >= idle - Duration::from_millis(50), "{after:?}");
    assert!(after <= idle + Duration::from_millis(500), "{after:?}");

    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(
        b"POST /api/v1/proxies/extract HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{\"count\":",
    )
    .await
    .unwrap();
    let sent = Instant::now();
    let got = timeout(body * 5, until_closed(&mut slow))
        .await
        .expect("the slow body's connection is closed");
    let after = sent.elapsed();
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(after >= body - Duration::from_millis(50), "{after:?}");
    assert!(after <= body + Duration::from_millis(500), "{after:?}");
}

/// At the connection cap a new connection waits (in the backlog) and is
/// served as soon as another closes.
#[tokio::test]
async fn the_connection_cap_holds() {
    let (_h, addr, _stop) = start(ServeOptions {
        header_read_timeout: Duration::from_secs(30),
        max_connections: 2,
        ..ServeOptions::default()
    })
    .await;
    let first = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    let mut third = TcpStream::connect(addr).await.unwrap();
    third.write_all(LIVE).await.unwrap();
    let mut byte = [0u8; 1];
    assert!(
        timeout(Duration::from_millis(300), third.read(&mut byte))
            .await
            .is_err(),
        "answered past the cap"
    );
    drop(first);
    let status = timeout(Duration::from_secs(5), response(&mut third))
        .await
        .expect("served once a slot is free");
    assert_eq!(status, 200);
    second.write_all(LIVE).await.unwrap();
    assert_eq!(response(&mut second).await, 200);
}

/// Sends `request` on a fresh connection; the answer, read to the close.
async fn refused(addr: SocketAddr, request: &[u8]) -> (u16, serde_json::Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let raw = timeout(Duration::from_secs(10), until_closed(&mut stream))
        .await
        .expect("answered and closed");
    problem_of(&raw)
}

/// The status and problem body of one answer, checked like every problem
/// of the handler: `application/problem+json`, valid against the
/// contract, its `requestId` the `X-Request-ID` header.
fn problem_of(raw: &[u8]) -> (u16, serde_json::Value) {
    let (status, headers, body) = common::parse_answer(raw);
    assert_eq!(
        headers["content-type"], "application/problem+json",
        "{body}"
    );
    assert_eq!(headers["content-length"], body.len().to_string());
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    common::assert_valid("Problem", &json);
    assert_eq!(json["status"], status);
    assert!(json["requestId"].as_str().unwrap().starts_with("req_"));
    assert_eq!(
        json["requestId"].as_str(),
        Some(headers["x-request-id"].as_str())
    );
    (status, json)
}

/// A request head with 101 header fields or over 64 KiB is a 431 problem, a malformed
/// request line or header line a 400 one, each with a fresh request id
/// (the header's, in a head that could not be read, is not trusted); a
/// head at the limits is served; on a keep-alive connection the refusal
/// of a later head follows the earlier answer untouched.
#[tokio::test]
async fn refused_heads_are_problems() {
    let (_h, addr, _stop) = start(ServeOptions::default()).await;
    let head = |fields: usize| {
        let mut r = String::from("GET /health/live HTTP/1.1\r\nx-request-id: req_mine\r\n");
        for i in 1..fields {
            r.push_str(&format!("x-pad-{i}: v\r\n"));
        }
        r + "\r\n"
    };
    let (status, problem) = refused(addr, head(101).as_bytes()).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (431, Some("HEADERS_TOO_LARGE"))
    );
    assert_ne!(problem["requestId"], "req_mine");
    let long = format!(
        "GET /health/live HTTP/1.1\r\nx-long: {}\r\n\r\n",
        "v".repeat(70_000)
    );
    let (status, problem) = refused(addr, long.as_bytes()).await;
    assert_eq!(
        (status, problem["code"].as_str()),
        (431, Some("HEADERS_TOO_LARGE"))
    );
    let (status, _, _) = common::http(addr, "GET", "/health/live", &[], "").await;
    assert_eq!(status, 200);
    let mut at_limit = TcpStream::connect(addr).await.unwrap();
    at_limit.write_all(head(100).as_bytes()).await.unwrap();
    assert_eq!(response(&mut at_limit).await, 200);

    for malformed in [
        &b"GET /health/live HTTX/1.1\r\nhost: t\r\n\r\n"[..],
        b"GET /health live HTTP/1.1\r\nhost: t\r\n\r\n",
        b"GET /health/live HTTP/1.1\r\nhost t\r\n\r\n",
    ] {
        let (status, problem) = refused(addr, malformed).await;
        assert_eq!(
            (status, problem["code"].as_str()),
            (400, Some("BAD_REQUEST"))
        );
    }

    let mut keep = TcpStream::connect(addr).await.unwrap();
    keep.write_all(LIVE).await.unwrap();
    assert_eq!(response(&mut keep).await, 200);
    keep.write_all(b"BAD\r\n\r\n").await.unwrap();
    let raw = timeout(Duration::from_secs(10), until_closed(&mut keep))
        .await
        .expect("answered and closed");
    let (status, problem) = problem_of(&raw);
    assert_eq!(
        (status, problem["code"].as_str()),
        (400, Some("BAD_REQUEST"))
    );
}

/// A refused head pipelined behind a request (both in one write) is a
/// problem too, after the earlier request's answer, which is untouched.
#[tokio::test]
async fn a_refused_head_behind_a_pipelined_request_is_a_problem() {
    let (_h, addr, _stop) = start(ServeOptions::default()).await;
    for (refused_head, want) in [
        (&b"BAD\r\n\r\n"[..], (400, "BAD_REQUEST")),
        (
            b"GET /health/live HTTP/1.1\r\nhost t\r\n\r\n",
            (400, "BAD_REQUEST"),
        ),
    ] {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(&[LIVE, refused_head].concat())
            .await
            .unwrap();
        let raw = timeout(Duration::from_secs(10), until_closed(&mut stream))
            .await
            .expect("answered and closed");
        let (status, headers, rest) = common::parse_answer(&raw);
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&raw));
        let length: usize = headers["content-length"].parse().unwrap();
        let health: serde_json::Value = serde_json::from_str(&rest[..length]).unwrap();
        common::assert_valid("Health", &health);
        let (status, problem) = problem_of(&rest.as_bytes()[length..]);
        assert_eq!((status, problem["code"].as_str()), (want.0, Some(want.1)));
    }
}
