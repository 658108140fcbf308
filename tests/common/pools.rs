//! Pools at the shapes real pools have, for the tests that measure how
//! much work a call does: a city-keyed pool over thousands of combinations,
//! and Redis's own command counts (`INFO commandstats`, deterministic, where
//! time is not).

use std::collections::BTreeMap;

use proxy_pool::pool::NewProxy;

use super::{Harness, Reply, now_ms};

pub const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];
pub const CARRIERS: [&str; 3] = ["telecom", "unicom", "mobile"];
pub const UPSTREAMS: [&str; 3] = ["provider-a", "provider-b", "provider-c"];

/// The combination number `i` of a city-keyed pool with `cities` cities:
/// protocol, city, carrier, upstream.
pub fn combination(i: usize, cities: usize) -> (&'static str, String, &'static str, &'static str) {
    (
        PROTOCOLS[i % 3],
        format!("city-{:03}", i / 3 % cities),
        CARRIERS[i / (3 * cities) % 3],
        UPSTREAMS[i / (9 * cities) % 3],
    )
}

/// `n` healthy proxies spread round-robin over `3 x cities x 3 x 3`
/// combinations, expiring 10 to 40 minutes from now in a scrambled order.
pub fn city_pool(prefix: &str, n: usize, cities: usize) -> Vec<NewProxy> {
    let now = now_ms();
    let combinations = 27 * cities;
    (0..n)
        .map(|i| {
            let (protocol, region, carrier, upstream) = combination(i % combinations, cities);
            let expires_at = now + 600_000 + (i as i64 * 7_919 % 1_800) * 1_000 + i as i64 % 1_000;
            NewProxy {
                id: format!("{prefix}-{i:06}"),
                protocol: protocol.into(),
                host: format!("198.51.100.{}", i % 250 + 1),
                port: 8000 + (i % 1000) as u16,
                username: Some(format!("u{i}")),
                password: Some(format!("p{i}")),
                region,
                carrier: carrier.into(),
                upstream: upstream.into(),
                expires_at,
                usable_until: expires_at - 20_000,
                health_ok: true,
                health_checked_at: now,
            }
        })
        .collect()
}

/// Redis's per-command call counts (`INFO commandstats`), which include the
/// commands a script runs.
pub async fn command_calls(h: &Harness) -> BTreeMap<String, u64> {
    let mut conn = h.redis().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    super::command_calls(&info)
}

/// Script calls in `calls` (from [`command_calls`]): `FCALL`s, and
/// `EVALSHA`s where Functions are refused.
pub fn script_calls(calls: &BTreeMap<String, u64>) -> u64 {
    ["fcall", "evalsha"]
        .iter()
        .filter_map(|name| calls.get(*name))
        .sum()
}

/// Commands Redis ran (scripts' own commands included, the script call
/// itself and the inspection excluded) while `body` was extracted once.
pub async fn commands_for(h: &Harness, body: &str) -> (u64, Reply) {
    let before = command_calls(h).await;
    let r = h.extract(body, &[]).await;
    let after = command_calls(h).await;
    let ran = after
        .iter()
        .filter(|(name, _)| {
            !["fcall", "evalsha", "eval", "info", "script", "ping"].contains(&name.as_str())
                && !name.starts_with("function")
        })
        .map(|(name, n)| n - before.get(name).copied().unwrap_or(0))
        .sum();
    (ran, r)
}

pub async fn load_all(h: &Harness, pool: &[NewProxy]) {
    for chunk in pool.chunks(5_000) {
        h.load(chunk).await;
    }
}

pub async fn zcard(h: &Harness, key: &str) -> u64 {
    let mut conn = h.redis().await;
    redis::cmd("ZCARD")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}
