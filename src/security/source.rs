use std::net::{IpAddr, SocketAddr};

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
pub fn source_ip(request: &Request) -> Option<IpAddr> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Mapped IPv6 collapses to IPv4; other addresses stay as they are.
    #[test]
    fn canonicalises() {
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        assert_eq!(canonical_ip(mapped).to_string(), "192.0.2.1");
        let v6: IpAddr = "2001:DB8::1".parse().unwrap();
        assert_eq!(canonical_ip(v6).to_string(), "2001:db8::1");
    }
}
