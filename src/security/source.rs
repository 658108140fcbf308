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

/// Who delivered a request, before any forwarded header is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// A known address: the TCP peer under `serve`, API Gateway's `sourceIp`.
    Address(IpAddr),
    /// An Application Load Balancer: its events carry no address at all,
    /// only the `X-Forwarded-For` it appends the address of its own peer to.
    LoadBalancer,
}

/// The immediate peer: the TCP peer under `serve`, the API Gateway request
/// context's source IP, or an ALB (whose event names no address).
fn peer(request: &Request) -> Option<Peer> {
    if let Some(PeerAddr(addr)) = request.extensions().get::<PeerAddr>() {
        return Some(Peer::Address(canonical_ip(addr.ip())));
    }
    let raw = match request.request_context_ref()? {
        RequestContext::ApiGatewayV2(ctx) => ctx.http.source_ip.clone(),
        RequestContext::ApiGatewayV1(ctx) => ctx.identity.source_ip.clone(),
        RequestContext::Alb(_) => return Some(Peer::LoadBalancer),
        _ => None,
    }?;
    raw.parse().ok().map(|ip| Peer::Address(canonical_ip(ip)))
}

/// Why a request's client address is not known (each a 403
/// `SOURCE_UNKNOWN`; `Display` is its `detail`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UnknownSource {
    /// The event names no source address.
    #[error("the request's source address is unknown")]
    NoPeer,
    /// An ALB event, and ALB `X-Forwarded-For` is not trusted.
    #[error(
        "the request came through a load balancer whose X-Forwarded-For is not trusted, so its source address is unknown"
    )]
    UntrustedLoadBalancer,
    /// A trusted peer's forwarded chain does not name the caller: a hop that
    /// is not an address, more than [`MAX_HOPS`] trusted hops, or (from an
    /// ALB) no hop at all.
    #[error("the forwarded chain from a trusted proxy does not name the client's address")]
    Chain,
}

/// Most forwarded hops looked at.
const MAX_HOPS: usize = 32;

/// The caller's address. A peer outside `trusted` is the caller, whatever
/// its headers say. From a trusted peer (or, with `trust_load_balancer`, an
/// ALB) the forwarded hops are walked right to left: the first hop outside
/// `trusted` is the caller, or the leftmost when every hop is trusted. A
/// hop that is not an address ends the walk without a caller: everything
/// to its left was written by someone unknown, and the trusted proxy on its
/// right is not the caller either.
pub fn client_ip(
    request: &Request,
    trusted: &[IpNet],
    trust_load_balancer: bool,
) -> Result<IpAddr, UnknownSource> {
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(ip));
    let mut current = match peer(request) {
        None => return Err(UnknownSource::NoPeer),
        Some(Peer::Address(ip)) if !is_trusted(&ip) => return Ok(ip),
        Some(Peer::Address(ip)) => Some(ip),
        Some(Peer::LoadBalancer) if trust_load_balancer => None,
        Some(Peer::LoadBalancer) => return Err(UnknownSource::UntrustedLoadBalancer),
    };
    let hops = forwarded_hops(request.headers());
    for (walked, hop) in hops.into_iter().rev().enumerate() {
        if walked == MAX_HOPS {
            return Err(UnknownSource::Chain);
        }
        let ip = hop.ok_or(UnknownSource::Chain)?;
        current = Some(ip);
        if !is_trusted(&ip) {
            break;
        }
    }
    current.ok_or(UnknownSource::Chain)
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
    use lambda_http::Body;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn trusted() -> Vec<IpNet> {
        vec!["10.0.0.0/8".parse().unwrap()]
    }

    /// A request from the TCP peer `peer` with one header.
    fn from(peer: &str, name: &str, value: &str) -> Request {
        let mut req = lambda_http::http::Request::builder()
            .header(name, value)
            .body(Body::Empty)
            .unwrap();
        let addr = SocketAddr::new(ip(peer), 5000);
        req.extensions_mut().insert(PeerAddr(addr));
        req
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
        let req = from("198.51.100.1", "x-forwarded-for", "203.0.113.9");
        assert_eq!(client_ip(&req, &trusted(), false), Ok(ip("198.51.100.1")));
        let req = from("198.51.100.1", "x-forwarded-for", "garbage");
        assert_eq!(client_ip(&req, &trusted(), false), Ok(ip("198.51.100.1")));
    }

    /// Trusted hops are skipped right to left; the first untrusted is the
    /// caller; a hop that is not an address leaves no caller.
    #[test]
    fn walks_trusted_hops() {
        let xff = |value: &str| {
            client_ip(
                &from("10.0.0.1", "x-forwarded-for", value),
                &trusted(),
                false,
            )
        };
        assert_eq!(xff("1.1.1.1, 203.0.113.9, 10.0.0.7"), Ok(ip("203.0.113.9")));
        assert_eq!(xff("10.0.0.9, 10.0.0.7"), Ok(ip("10.0.0.9")));
        assert_eq!(xff("garbage, 203.0.113.9, 10.0.0.7"), Ok(ip("203.0.113.9")));
        assert_eq!(
            xff("203.0.113.9, garbage, 10.0.0.7"),
            Err(UnknownSource::Chain)
        );
        assert_eq!(xff("unknown"), Err(UnknownSource::Chain));
        assert_eq!(xff("203.0.113.9,"), Err(UnknownSource::Chain));
        let long = vec!["10.0.0.5"; MAX_HOPS + 1].join(",");
        assert_eq!(xff(&long), Err(UnknownSource::Chain));
        let req = from(
            "10.0.0.1",
            "forwarded",
            "for=198.51.100.17;proto=https, for=\"[2001:db8:cafe::17]:4711\"",
        );
        assert_eq!(
            client_ip(&req, &trusted(), false),
            Ok(ip("2001:db8:cafe::17"))
        );
        let req = from("10.0.0.1", "forwarded", "for=unknown");
        assert_eq!(
            client_ip(&req, &trusted(), false),
            Err(UnknownSource::Chain)
        );
    }
}
