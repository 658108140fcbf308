use crate::pool::NewProxy;

const REGIONS: [&str; 3] = ["shanghai", "beijing", "guangzhou"];
const CARRIERS: [&str; 3] = ["telecom", "unicom", "mobile"];
const UPSTREAMS: [&str; 2] = ["provider-a", "provider-b"];
const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];
/// The three documentation ranges (RFC 5737): never real hosts.
const TEST_NETS: [&str; 3] = ["192.0.2", "198.51.100", "203.0.113"];

/// `n` synthetic proxies on TEST-NET addresses, healthy as of `now_ms`,
/// expiring 10 to 60 minutes from it, spread over every filter dimension.
pub fn demo_proxies(n: usize, now_ms: i64) -> Vec<NewProxy> {
    (0..n)
        .map(|i| {
            let expires_at = now_ms + 600_000 + (i as i64 * 7_919 % 3_000) * 1_000;
            NewProxy {
                id: format!("px_demo_{i:05}"),
                protocol: PROTOCOLS[i % 3].into(),
                host: format!("{}.{}", TEST_NETS[i / 250 % 3], i % 250 + 1),
                port: 8000 + (i % 1000) as u16,
                username: Some(format!("user{i}")),
                password: Some(format!(
                    "demo-pass-{:08x}",
                    (i as u64).wrapping_mul(0x9e37_79b9) as u32
                )),
                region: REGIONS[i / 3 % 3].into(),
                carrier: CARRIERS[i / 9 % 3].into(),
                upstream: UPSTREAMS[i / 27 % 2].into(),
                expires_at,
                usable_until: expires_at - 30_000,
                health_ok: true,
                health_checked_at: now_ms,
            }
        })
        .collect()
}
