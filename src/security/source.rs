//! The caller's address: the transport peer, or, behind trusted proxies,
//! the first untrusted hop of `X-Forwarded-For` / `Forwarded`.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use lambda_http::http::HeaderMap;
use lambda_http::request::RequestContext;
use lambda_http::{Request, RequestExt};

/// The TCP peer of a request served by `proxy-pool serve` (a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// IPv4-mapped IPv6 addresses become IPv4, so one caller has one id.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The immediate peer: the API Gateway request context's source IP in
/// Lambda, the TCP peer under `serve`.
pub fn peer_ip(request: &Request) -> Option<IpAddr> {
    if let Some(PeerAddr(addr)) = request.extensions().get::<PeerAddr>() {
        return Some(canonical_ip(addr.ip()));
    }
    let raw = match request.request_context_ref()? {
        RequestContext::ApiGatewayV2(ctx) => ctx.http.source_ip.clone(),
        RequestContext::ApiGatewayV1(ctx) => ctx.identity.source_ip.clone(),
        _ => None,
    }?;
    raw.parse().ok().map(canonical_ip)
}

/// Most forwarded hops looked at; a longer chain is cut at its trusted end.
const MAX_HOPS: usize = 32;

/// The caller behind `peer`: forwarded headers are honoured only when `peer`
/// is a trusted proxy, walking right to left past trusted hops. An
/// unparseable hop ends the walk at the last address known good.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let mut hops = forwarded_hops(headers);
    hops.reverse();
    let mut current = peer;
    for hop in hops.into_iter().take(MAX_HOPS) {
        let Some(ip) = hop else { break };
        current = ip;
        if !is_trusted(&ip) {
            break;
        }
    }
    current
}

/// Hops of `X-Forwarded-For` (preferred) or `Forwarded` `for=`, left to right;
/// `None` for a hop that is not an address.
fn forwarded_hops(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let joined = |name: &str| {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap_or("\u{0}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let xff = joined("x-forwarded-for");
    if !xff.is_empty() {
        return xff.split(',').map(parse_hop).collect();
    }
    let forwarded = joined("forwarded");
    forwarded
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|element| {
            element
                .split(';')
                .filter_map(|pair| pair.split_once('='))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
                .and_then(|(_, v)| parse_hop(v))
        })
        .collect()
}

/// `192.0.2.1`, `192.0.2.1:80`, `[2001:db8::1]:80`, `"[2001:db8::1]"`, `2001:db8::1`.
fn parse_hop(raw: &str) -> Option<IpAddr> {
    let s = raw.trim().trim_matches('"');
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical_ip(ip));
    }
    if let Ok(sock) = s.parse::<SocketAddr>() {
        return Some(canonical_ip(sock.ip()));
    }
    let inner = s.strip_prefix('[')?.split(']').next()?;
    inner.parse().ok().map(canonical_ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_http::http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    /// Mapped IPv6 collapses to IPv4; other addresses stay as they are.
    #[test]
    fn canonicalises() {
        assert_eq!(
            canonical_ip(ip("::ffff:192.0.2.1")).to_string(),
            "192.0.2.1"
        );
        assert_eq!(canonical_ip(ip("2001:DB8::1")).to_string(), "2001:db8::1");
    }

    /// An untrusted peer's forwarded headers are ignored (spoofing).
    #[test]
    fn ignores_untrusted_peers() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers("x-forwarded-for", "203.0.113.9");
        assert_eq!(
            client_ip(ip("198.51.100.1"), &h, &trusted),
            ip("198.51.100.1")
        );
    }

    /// Trusted hops are skipped right to left; the first untrusted is the caller.
    #[test]
    fn walks_trusted_hops() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let h = headers("x-forwarded-for", "1.1.1.1, 203.0.113.9, 10.0.0.7");
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("203.0.113.9"));
        let h = headers("x-forwarded-for", "10.0.0.9, 10.0.0.7");
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.9"));
        let h = headers("x-forwarded-for", "203.0.113.9, garbage, 10.0.0.7");
        assert_eq!(client_ip(ip("10.0.0.1"), &h, &trusted), ip("10.0.0.7"));
        let h = headers(
            "forwarded",
            "for=198.51.100.17;proto=https, for=\"[2001:db8:cafe::17]:4711\"",
        );
        assert_eq!(
            client_ip(ip("10.0.0.1"), &h, &trusted),
            ip("2001:db8:cafe::17")
        );
    }
}
