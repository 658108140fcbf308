//! Identity and admission: every auth scheme, anonymous mode, trusted
//! proxies, source CIDRs, upstream permissions and shared rate limits.
//!
//! Over 600 lines on purpose: every test here drives the same harness
//! through one surface (who may extract, and how often); split by scheme
//! they would repeat its set-up.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

mod common;

use std::sync::Arc;

use base64::Engine;
use common::{Harness, proxies, proxy};
use lambda_http::Body;
use lambda_http::http::Request;
use proxy_pool::distribution::{App, EXTRACT_PATH};
use proxy_pool::pool::RedisPool;
use proxy_pool::security::credentials::CredentialHash;
use proxy_pool::security::{
    AuthSchemes, ClientRegistry, Guard, PeerAddr, Rate, RegistryHandle, SourcePolicy,
};
use serde_json::json;

const KEY: &str = "pp_acme_api_key_0123456789";
const TOKEN: &str = "tok.acme-0123456789";
const BASIC_PW: &str = "basic-secret-pw";

fn registry() -> RegistryHandle {
    let h = |s: &str| CredentialHash::of(s.as_bytes()).encode();
    let doc = serde_json::json!({"clients": [
        {"id": "acme", "apiKeys": [h(KEY)], "bearerTokens": [h(TOKEN)],
         "basic": [h(&format!("acme:{BASIC_PW}"))]},
        {"id": "narrow", "apiKeys": [h("pp_narrow_key_0000")],
         "allowedUpstreams": ["provider-a"], "maxCount": 2},
        {"id": "office", "apiKeys": [h("pp_office_key_0000")],
         "allowedSources": ["198.51.100.0/24"]},
        {"id": "slow", "apiKeys": [h("pp_slow_key_00000")], "rateLimit": "1:2"}
    ]});
    RegistryHandle::with(ClientRegistry::parse(&doc.to_string()).unwrap())
}

async fn harness(schemes: &str) -> Harness {
    let schemes = AuthSchemes::parse(schemes).unwrap();
    let h = Harness::with_registry(|c| c.auth_schemes = schemes, registry()).await;
    let mut batch = proxies("a", 10);
    for p in batch.iter_mut().skip(5) {
        p.upstream = "provider-b".into();
    }
    h.load(&batch).await;
    h
}

fn basic(user: &str, pw: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pw}"))
    )
}

/// Each scheme: accepted, wrong secret, missing, malformed, not enabled.
#[tokio::test]
async fn every_scheme() {
    let h = harness("apiKey,basic,bearer").await;
    let ok = |r: &common::Reply| assert_eq!(r.status, 200, "{}", r.body);
    let denied = |r: &common::Reply| {
        assert_eq!((r.status, r.code()), (401, "UNAUTHORIZED"), "{}", r.body);
        let challenges: Vec<_> = r.headers.get_all("www-authenticate").iter().collect();
        assert_eq!(challenges.len(), 3);
    };
    let body = r#"{"count":1}"#;
    ok(&h.extract(body, &[("x-api-key", KEY)]).await);
    ok(&h
        .extract(body, &[("authorization", &format!("Bearer {TOKEN}"))])
        .await);
    ok(&h
        .extract(body, &[("authorization", &basic("acme", BASIC_PW))])
        .await);
    // Wrong secrets, and an unknown one: same answer.
    denied(
        &h.extract(body, &[("x-api-key", "pp_acme_api_key_0123456780")])
            .await,
    );
    denied(&h.extract(body, &[("x-api-key", "never-issued")]).await);
    denied(
        &h.extract(body, &[("authorization", "Bearer tok.acme-0123456780")])
            .await,
    );
    denied(
        &h.extract(body, &[("authorization", &basic("acme", "wrong"))])
            .await,
    );
    denied(
        &h.extract(body, &[("authorization", &basic("other", BASIC_PW))])
            .await,
    );
    // Missing.
    denied(&h.extract(body, &[]).await);
    // Malformed.
    for bad in [
        "Basic !!!",
        "Basic",
        "Bearer",
        "Bearer a b",
        "Digest x=1",
        "Token abc",
    ] {
        denied(&h.extract(body, &[("authorization", bad)]).await);
    }
    let no_colon = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("acme")
    );
    denied(&h.extract(body, &[("authorization", &no_colon)]).await);
    denied(
        &h.extract(
            body,
            &[
                ("x-api-key", KEY),
                ("authorization", &format!("Bearer {TOKEN}")),
            ],
        )
        .await,
    );
    denied(&h.extract(body, &[("x-api-key", &"k".repeat(2000))]).await);

    // Scheme not enabled.
    let h = harness("apiKey").await;
    let r = h
        .extract(body, &[("authorization", &format!("Bearer {TOKEN}"))])
        .await;
    assert_eq!(r.status, 401);
    let challenges: Vec<_> = r.headers.get_all("www-authenticate").iter().collect();
    assert_eq!(challenges.len(), 1);
    assert!(challenges[0].to_str().unwrap().starts_with("ApiKey"));
    ok(&h.extract(body, &[("x-api-key", KEY)]).await);
}

/// Problems never echo the credential that was refused.
#[tokio::test]
async fn refusals_do_not_echo_credentials() {
    let h = harness("apiKey,bearer").await;
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_leaky_secret")])
        .await;
    assert!(!r.body.contains("pp_leaky_secret"));
}

/// With `none` enabled beside a scheme, no credentials means anonymous, but
/// wrong credentials are still refused.
#[tokio::test]
async fn anonymous_beside_keys() {
    let h = harness("apiKey,none").await;
    assert_eq!(h.extract(r#"{"count":1}"#, &[]).await.status, 200);
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", "wrong")])
            .await
            .status,
        401
    );
}

/// Every 401, under every combination of schemes, carries at least one
/// `WWW-Authenticate` challenge (RFC 9110 15.5.2). With only `none` enabled
/// nothing can be checked or challenged, so no request is 401: credential
/// headers, good, wrong or malformed, are not read, and the caller is the
/// anonymous client of its address (its idempotency key replays without them).
#[tokio::test]
async fn every_401_carries_a_challenge() {
    let h = harness("none").await;
    h.load(&proxies("n", 120)).await;
    let presented: [&[(&str, &str)]; 7] = [
        &[],
        &[("x-api-key", KEY)],
        &[("x-api-key", "never-issued")],
        &[("authorization", "Bearer tok.acme-0123456780")],
        &[("authorization", "Basic !!!")],
        &[("authorization", "Digest x=1")],
        &[("x-api-key", KEY), ("authorization", "Bearer x")],
    ];
    let body = r#"{"count":1}"#;
    for bits in 1..16u8 {
        let schemes = AuthSchemes {
            api_key: bits & 1 != 0,
            basic: bits & 2 != 0,
            bearer: bits & 4 != 0,
            none: bits & 8 != 0,
        };
        let app = app_with(&h, schemes, SourcePolicy::default());
        for headers in presented {
            let r = common::send(&app, common::extract_request(body, headers)).await;
            let challenges = r.headers.get_all("www-authenticate").iter().count();
            if r.status == 401 {
                assert!(
                    challenges >= 1,
                    "{schemes:?} {headers:?}: 401 without a challenge"
                );
            }
            if !schemes.need_registry() {
                assert_eq!(r.status, 200, "{schemes:?} {headers:?}: {}", r.body);
            }
        }
    }
    let key = ("idempotency-key", "none-only-0001");
    let first = h.extract(body, &[("x-api-key", KEY), key]).await;
    let again = h.extract(body, &[key]).await;
    assert_eq!((first.status, again.status), (200, 200));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
}

/// Anonymous IPv6 callers share one per-client limit per /64 (the default
/// `PROXY_POOL_ANONYMOUS_IPV6_PREFIX`): rotating addresses inside it gains
/// nothing, the next /64 has its own, and idempotency keys stay scoped to
/// the one address. With the prefix set to 128 each address is on its own.
#[tokio::test]
async fn anonymous_ipv6_callers_are_limited_by_prefix() {
    let h = Harness::with_config(|c| {
        c.client_rate = Some(Rate {
            per_second: 0.01,
            burst: 2,
        })
    })
    .await;
    h.load(&proxies("v6", 10)).await;
    let key = ("idempotency-key", "ipv6-scope-0001");
    let first = h.send(from("[2001:db8:1:2::1]", &[key])).await;
    let neighbour = h.send(from("[2001:db8:1:2::2]", &[key])).await;
    assert_eq!((first.status, neighbour.status), (200, 200));
    assert_eq!(neighbour.header("idempotent-replayed"), None);
    assert_ne!(first.ids(), neighbour.ids());
    let r = h.send(from("[2001:db8:1:2:ffff::9]", &[])).await;
    assert_eq!((r.status, r.code()), (429, "RATE_LIMITED"), "{}", r.body);
    assert_eq!(h.send(from("[2001:db8:1:3::1]", &[])).await.status, 200);

    let per_address = SourcePolicy {
        anonymous_ipv6_prefix: 128,
        ..SourcePolicy::default()
    };
    let app = app_with(&h, h.config.auth_schemes, per_address);
    for peer in ["[2001:db8:9::1]", "[2001:db8:9::2]", "[2001:db8:9::3]"] {
        assert_eq!(common::send(&app, from(peer, &[])).await.status, 200);
    }
}

/// A forwarded chain from a trusted proxy whose hops, walked from the right,
/// reach one that is not an address is refused (403 `SOURCE_UNKNOWN`): the
/// proxy on its right never becomes the client, so a denied caller cannot
/// pass the source rules as the proxy.
#[tokio::test]
async fn a_bad_forwarded_hop_never_makes_the_proxy_the_client() {
    let h = Harness::with_config(|c| {
        c.sources.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        c.sources.denied = vec!["203.0.113.0/24".parse().unwrap()];
    })
    .await;
    h.load(&proxies("f", 5)).await;
    for chain in [
        "unknown",
        "203.0.113.9, garbage, 10.0.0.7",
        "203.0.113.9, , 10.0.0.7",
    ] {
        let r = h
            .send(from("10.1.2.3", &[("x-forwarded-for", chain)]))
            .await;
        assert_eq!((r.status, r.code()), (403, "SOURCE_UNKNOWN"), "{chain}");
    }
    let r = h
        .send(from("10.1.2.3", &[("forwarded", "for=_hidden")]))
        .await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_UNKNOWN"));
    // Garbage left of the first untrusted hop was never trusted: not read.
    let r = h
        .send(from(
            "10.1.2.3",
            &[("x-forwarded-for", "garbage, 192.0.2.1, 10.0.0.7")],
        ))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
}

/// An ALB event as lambda_http delivers it (no source address in its
/// request context), with `headers` from the load balancer.
fn alb_event(headers: serde_json::Value) -> lambda_http::Request {
    let mut all = json!({"content-type": "application/json"});
    for (k, v) in headers.as_object().unwrap() {
        all[k] = v.clone();
    }
    let event = json!({
        "requestContext": {"elb": {"targetGroupArn":
            "arn:aws:elasticloadbalancing:eu-west-1:123456789012:targetgroup/proxy-pool/6d0ecf831eec9f09"}},
        "httpMethod": "POST",
        "path": EXTRACT_PATH,
        "queryStringParameters": {},
        "headers": all,
        "isBase64Encoded": false,
        "body": r#"{"count":1}"#
    });
    lambda_http::request::from_str(&event.to_string()).unwrap()
}

/// Sends an event as the Lambda function does: no TCP peer.
async fn deliver(app: &App, event: lambda_http::Request) -> common::Reply {
    common::reply(
        EXTRACT_PATH,
        proxy_pool::distribution::handle(app, event).await,
    )
}

/// ALB events: with `PROXY_POOL_TRUST_ALB` the caller is the rightmost
/// untrusted hop of the `X-Forwarded-For` the ALB appended to (a spoofed
/// hop to its left is ignored; no header at all is 403); without it every
/// ALB event is a 403 `SOURCE_UNKNOWN` that says why.
#[tokio::test]
async fn alb_events_resolve_through_x_forwarded_for_when_trusted() {
    let h = Harness::with_config(|c| {
        c.sources.trust_alb = true;
        c.sources.denied = vec!["203.0.113.0/24".parse().unwrap()];
    })
    .await;
    h.load(&proxies("alb", 5)).await;
    let via = |xff: &str| alb_event(json!({"x-forwarded-for": xff}));
    let r = deliver(&h.app, via("192.0.2.1")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = deliver(&h.app, via("192.0.2.1, 203.0.113.9")).await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_FORBIDDEN"));
    let r = deliver(&h.app, via("203.0.113.9, 192.0.2.1")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = deliver(&h.app, alb_event(json!({}))).await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_UNKNOWN"));
    // The caller behind the ALB is the same client as when it calls directly.
    let key = ("idempotency-key", "alb-scope-0001");
    let direct = h.send(from("192.0.2.77", &[key])).await;
    let through = deliver(
        &h.app,
        alb_event(json!({"x-forwarded-for": "192.0.2.77", "idempotency-key": key.1})),
    )
    .await;
    assert_eq!(through.header("idempotent-replayed"), Some("true"));
    assert_eq!(through.body, direct.body);

    let untrusted = app_with(&h, h.config.auth_schemes, SourcePolicy::default());
    let r = deliver(&untrusted, via("192.0.2.1")).await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_UNKNOWN"));
    assert!(
        r.json["detail"].as_str().unwrap().contains("load balancer"),
        "{}",
        r.body
    );
}

/// The registry not loaded yet: extraction 503, health still up.
#[tokio::test]
async fn registry_missing_is_503() {
    let schemes = AuthSchemes::parse("apiKey").unwrap();
    let h = Harness::with_registry(|c| c.auth_schemes = schemes, RegistryHandle::default()).await;
    let r = h.extract(r#"{"count":1}"#, &[("x-api-key", KEY)]).await;
    assert_eq!((r.status, r.code()), (503, "SERVICE_UNAVAILABLE"));
    assert_eq!(h.get("/health/live").await.status, 200);
}

fn from(peer: &str, headers: &[(&str, &str)]) -> lambda_http::Request {
    let mut req = Request::post(EXTRACT_PATH).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut req = req.body(Body::from(r#"{"count":1}"#)).unwrap();
    req.extensions_mut()
        .insert(PeerAddr(format!("{peer}:5000").parse().unwrap()));
    req
}

/// Forwarded headers count only from trusted proxies; a spoofed header
/// from anyone else is ignored.
#[tokio::test]
async fn trusted_proxies_and_spoofing() {
    let h = Harness::with_config(|c| {
        c.sources.trusted_proxies = vec!["10.0.0.0/8".parse().unwrap()];
        c.sources.denied = vec!["203.0.113.0/24".parse().unwrap()];
    })
    .await;
    h.load(&proxies("t", 5)).await;
    // Through the trusted proxy, the real (denied) caller is seen.
    let r = h
        .send(from("10.1.2.3", &[("x-forwarded-for", "203.0.113.9")]))
        .await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_FORBIDDEN"));
    let r = h
        .send(from(
            "10.1.2.3",
            &[("forwarded", "for=\"203.0.113.9:1234\"")],
        ))
        .await;
    assert_eq!(r.status, 403);
    // A denied caller cannot hide behind a spoofed header...
    let r = h
        .send(from("203.0.113.9", &[("x-forwarded-for", "192.0.2.1")]))
        .await;
    assert_eq!(r.status, 403);
    // ...and an allowed one cannot borrow another identity: idempotency
    // keys are scoped by the peer, not the header.
    let key = ("idempotency-key", "spoof-test-1");
    let first = h.send(from("192.0.2.50", &[key])).await;
    let spoof = h
        .send(from(
            "198.51.100.7",
            &[key, ("x-forwarded-for", "192.0.2.50")],
        ))
        .await;
    assert_eq!((first.status, spoof.status), (200, 200));
    assert_eq!(spoof.header("idempotent-replayed"), None);
    assert_ne!(first.ids(), spoof.ids());
    // Through the trusted proxy the same key is the same client: replay.
    let via = h
        .send(from("10.0.0.1", &[key, ("x-forwarded-for", "192.0.2.50")]))
        .await;
    assert_eq!(via.header("idempotent-replayed"), Some("true"));
    assert_eq!(via.ids(), first.ids());
}

/// Global allow list and per-client source networks.
#[tokio::test]
async fn source_cidrs() {
    let schemes = AuthSchemes::parse("apiKey").unwrap();
    let h = Harness::with_registry(
        |c| {
            c.auth_schemes = schemes;
            c.sources.allowed = vec![
                "198.51.100.0/24".parse().unwrap(),
                "192.0.2.0/24".parse().unwrap(),
            ];
        },
        registry(),
    )
    .await;
    h.load(&proxies("s", 5)).await;
    let office = ("x-api-key", "pp_office_key_0000");
    assert_eq!(h.send(from("198.51.100.9", &[office])).await.status, 200);
    let r = h.send(from("192.0.2.9", &[office])).await;
    assert_eq!((r.status, r.code()), (403, "SOURCE_FORBIDDEN"));
    assert_eq!(
        h.send(from("192.0.2.9", &[("x-api-key", KEY)]))
            .await
            .status,
        200
    );
    let r = h.send(from("203.0.113.1", &[("x-api-key", KEY)])).await;
    assert_eq!(r.status, 403);
}

/// `allowedUpstreams` narrows a client's upstreams and cannot widen them.
#[tokio::test]
async fn upstream_permissions() {
    let h = harness("apiKey").await;
    let narrow = [("x-api-key", "pp_narrow_key_0000")];
    let r = h
        .extract(
            r#"{"count":2,"filters":{"allowedUpstreams":["provider-b"]}}"#,
            &narrow,
        )
        .await;
    assert_eq!((r.status, r.code()), (403, "UPSTREAM_FORBIDDEN"));
    let r = h
        .extract(
            r#"{"count":2,"filters":{"allowedUpstreams":["provider-a","provider-b"]}}"#,
            &narrow,
        )
        .await;
    assert_eq!(r.status, 403);
    // Without a filter only its own upstream; maxCount 2 caps count.
    assert_eq!(h.extract(r#"{"count":3}"#, &narrow).await.status, 422);
    for _ in 0..3 {
        let r = h.extract(r#"{"count":2}"#, &narrow).await;
        assert!(
            r.json["proxies"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["upstream"] == "provider-a")
        );
    }
    // provider-a (5 proxies) is exhausted for it; provider-b is untouched.
    assert_eq!(h.extract(r#"{"count":2}"#, &narrow).await.ids().len(), 0);
    let r = h
        .extract(
            r#"{"count":10,"filters":{"allowedUpstreams":["provider-b"]}}"#,
            &[("x-api-key", KEY)],
        )
        .await;
    assert_eq!(r.ids().len(), 5);
}

fn second_app(h: &Harness) -> Arc<App> {
    app_with(h, h.config.auth_schemes, h.config.sources.clone())
}

/// Another handler instance on `h`'s Redis, with its own schemes and sources.
fn app_with(h: &Harness, schemes: AuthSchemes, sources: SourcePolicy) -> Arc<App> {
    let pool = RedisPool::new(&h.redis.url(), h.config.redis_timeout).unwrap();
    let guard = Guard::new(schemes, sources, registry());
    Arc::new(App::new(h.config.settings(), pool, Arc::new(guard)))
}

/// The per-client limit (here the registry's 1/s, burst 2) is shared by two
/// handler instances on one Redis; the third request is 429 with
/// `Retry-After`, and never reaches the pool.
#[tokio::test]
async fn client_rate_limit_shared_across_instances() {
    let h = harness("apiKey").await;
    let other = second_app(&h);
    let slow = [("x-api-key", "pp_slow_key_00000")];
    let r1 = h.extract(r#"{"count":1}"#, &slow).await;
    assert_eq!(r1.status, 200);
    assert!(
        r1.header("ratelimit-policy")
            .unwrap()
            .contains("\"client\";q=2;w=2")
    );
    assert!(
        r1.header("ratelimit")
            .unwrap()
            .starts_with("\"client\";r=1;")
    );
    let mut req = Request::post(EXTRACT_PATH)
        .header("content-type", "application/json")
        .header("x-api-key", "pp_slow_key_00000")
        .body(Body::from(r#"{"count":1}"#))
        .unwrap();
    req.extensions_mut()
        .insert(PeerAddr("127.0.0.1:1".parse().unwrap()));
    let r2 = common::reply(
        EXTRACT_PATH,
        proxy_pool::distribution::handle(&other, req).await,
    );
    assert_eq!(r2.status, 200);
    let before = h.snapshot().await;
    let r3 = h.extract(r#"{"count":1}"#, &slow).await;
    assert_eq!((r3.status, r3.code()), (429, "RATE_LIMITED"));
    assert_eq!(r3.header("retry-after"), Some("1"));
    assert!(
        r3.header("ratelimit")
            .unwrap()
            .starts_with("\"client\";r=0;")
    );
    assert_eq!(
        h.snapshot().await,
        before,
        "a refused request changes nothing"
    );
    // Other clients are not affected.
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", KEY)])
            .await
            .status,
        200
    );
}

/// The global limit covers every client together, across instances.
#[tokio::test]
async fn global_rate_limit() {
    let schemes = AuthSchemes::parse("apiKey").unwrap();
    let h = Harness::with_registry(
        |c| {
            c.auth_schemes = schemes;
            c.global_rate = Some(Rate {
                per_second: 0.5,
                burst: 2,
            });
        },
        registry(),
    )
    .await;
    h.load(&[proxy("g1"), proxy("g2"), proxy("g3")]).await;
    assert_eq!(
        h.extract(r#"{"count":1}"#, &[("x-api-key", KEY)])
            .await
            .status,
        200
    );
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_narrow_key_0000")])
        .await;
    assert_eq!(r.status, 200);
    let r = h
        .extract(r#"{"count":1}"#, &[("x-api-key", "pp_slow_key_00000")])
        .await;
    assert_eq!((r.status, r.code()), (429, "RATE_LIMITED"));
    // 0.5/s: the next slot is up to 2 s away.
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    assert!(
        r.header("ratelimit-policy")
            .unwrap()
            .contains("\"global\";q=2;w=4")
    );
}

/// The rate limiter runs before the body is read: a limited client gets 429
/// even for a body that would be 400.
#[tokio::test]
async fn limits_come_before_the_body() {
    let h = harness("apiKey").await;
    let slow = [("x-api-key", "pp_slow_key_00000")];
    assert_eq!(h.extract("{bad", &slow).await.status, 400);
    assert_eq!(h.extract("{bad", &slow).await.status, 400);
    assert_eq!(h.extract("{bad", &slow).await.status, 429);
}
