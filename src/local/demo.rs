//! Synthetic proxies on TEST-NET addresses: the demo pool `serve` starts
//! with, and the pools `proxy-pool bench` fills, from one generator.

use crate::pool::{NewProxy, Protocol};

/// Regions of small shapes; larger ones use `city-000`, `city-001`, ...
const NAMED_REGIONS: [&str; 3] = ["shanghai", "beijing", "guangzhou"];
const CARRIERS: [&str; 3] = ["telecom", "unicom", "mobile"];
const UPSTREAMS: [&str; 3] = ["provider-a", "provider-b", "provider-c"];

/// Most regions, carriers or upstreams a synthetic pool may have.
const MAX_VALUES: usize = 10_000;

/// How a synthetic pool spreads over protocol x region x carrier x upstream
/// combinations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolShape {
    /// Protocols (1..=3: http, then https, then socks5).
    pub protocols: usize,
    /// Regions (named up to 3, else `city-NNN`).
    pub regions: usize,
    /// Carriers (named up to 3, else `carrier-NN`).
    pub carriers: usize,
    /// Upstreams (named up to 3, else `upstream-NN`).
    pub upstreams: usize,
}

impl PoolShape {
    /// The demo pool: 54 combinations (3 protocols x shanghai, beijing,
    /// guangzhou x 3 carriers x 2 upstreams).
    pub const DEMO: Self = Self {
        protocols: 3,
        regions: 3,
        carriers: 3,
        upstreams: 2,
    };

    /// 18 combinations: 3 protocols x 3 regions x 1 carrier x 2 upstreams.
    pub const SMALL: Self = Self {
        protocols: 3,
        regions: 3,
        carriers: 1,
        upstreams: 2,
    };

    /// Protocol x region x carrier x upstream combinations.
    pub fn combinations(&self) -> usize {
        self.protocols * self.regions * self.carriers * self.upstreams
    }

    /// `18`, a multiple of 27 (a city-keyed pool: 3 protocols x n/27
    /// cities x 3 carriers x 3 upstreams, e.g. 2700 or 10800), or each
    /// dimension spelled out as `PxRxCxU` (protocols x regions x carriers x
    /// upstreams, e.g. `3x400x3x5`, or `2x16x25x25`: 16 cities x 1,250
    /// kinds).
    pub fn parse(s: &str) -> Result<Self, ShapeError> {
        let s = s.trim();
        if s.contains('x') {
            let dims: Vec<usize> = s
                .split('x')
                .map(|d| d.trim().parse().map_err(|_| ShapeError))
                .collect::<Result<_, _>>()?;
            let [protocols, regions, carriers, upstreams] = dims[..] else {
                return Err(ShapeError);
            };
            let shape = Self {
                protocols,
                regions,
                carriers,
                upstreams,
            };
            let fits = |n: usize| (1..=MAX_VALUES).contains(&n);
            return if (1..=Protocol::ALL.len()).contains(&protocols)
                && fits(regions)
                && fits(carriers)
                && fits(upstreams)
                && shape.combinations() <= 1_000_000
            {
                Ok(shape)
            } else {
                Err(ShapeError)
            };
        }
        let n: usize = s.parse().map_err(|_| ShapeError)?;
        match n {
            18 => Ok(Self::SMALL),
            n if n >= 27 && n % 27 == 0 && n <= 27 * MAX_VALUES => Ok(Self {
                protocols: 3,
                regions: n / 27,
                carriers: 3,
                upstreams: 3,
            }),
            _ => Err(ShapeError),
        }
    }

    /// The name of protocol `i` (modulo the number of protocols).
    pub fn protocol(&self, i: usize) -> &'static str {
        Protocol::ALL[i % self.protocols].as_str()
    }

    /// The name of region `i` (modulo the number of regions).
    pub fn region(&self, i: usize) -> String {
        value_name(&NAMED_REGIONS, self.regions, i, |i| format!("city-{i:03}"))
    }

    /// The name of carrier `i` (modulo the number of carriers).
    pub fn carrier(&self, i: usize) -> String {
        value_name(&CARRIERS, self.carriers, i, |i| format!("carrier-{i:02}"))
    }

    /// The name of upstream `i` (modulo the number of upstreams).
    pub fn upstream(&self, i: usize) -> String {
        value_name(&UPSTREAMS, self.upstreams, i, |i| {
            format!("upstream-{i:02}")
        })
    }
}

/// Value `i` (modulo `count`) of a dimension with `count` values: from
/// `named` when they are enough, else `numbered`.
fn value_name(named: &[&str], count: usize, i: usize, numbered: fn(usize) -> String) -> String {
    let i = i % count;
    if count <= named.len() {
        named[i].to_owned()
    } else {
        numbered(i)
    }
}

/// `PxRxCxU`, e.g. `3x400x3x5`.
impl std::fmt::Display for PoolShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}x{}x{}x{}",
            self.protocols, self.regions, self.carriers, self.upstreams
        )
    }
}

/// A number of combinations [`PoolShape::parse`] does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "combinations are 18, a multiple of 27 up to 270000 (3 protocols x cities x 3 carriers x 3 upstreams), or PxRxCxU (protocols 1-3 x regions x carriers x upstreams, e.g. 3x400x3x5; each 1-10000, at most 1M in all)"
)]
pub struct ShapeError;

/// The id of the `seq`th synthetic proxy ([`synthetic_proxy`]), so that
/// writers driving a synthetic pool (health results, claims) name it.
pub fn synthetic_id(seq: usize) -> String {
    format!("proxy-{seq:010}")
}

/// The synthetic proxy number `seq` of a pool of `shape`: its combination
/// round-robin (protocol varies fastest, then region, carrier, upstream),
/// a TEST-NET-2 address, healthy as of `now_ms`, expiring 15 to 45 minutes
/// from it in an order unrelated to `seq`, with a 30 s safety margin.
pub fn synthetic_proxy(seq: usize, now_ms: i64, shape: PoolShape) -> NewProxy {
    let combination = seq % shape.combinations();
    let (protocol, rest) = (combination % shape.protocols, combination / shape.protocols);
    let (region, rest) = (rest % shape.regions, rest / shape.regions);
    let (carrier, upstream) = (rest % shape.carriers, rest / shape.carriers);
    let mix = (seq as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 20;
    let expires_at = now_ms + 900_000 + (mix % 1_800_000) as i64;
    NewProxy {
        id: synthetic_id(seq),
        protocol: shape.protocol(protocol).into(),
        host: format!("198.51.100.{}", seq % 254 + 1),
        port: 10_000 + (seq % 50_000) as u16,
        username: Some(format!("u{seq}")),
        password: Some(format!("pw-{:012x}", mix & 0xffff_ffff_ffff)),
        region: shape.region(region),
        carrier: shape.carrier(carrier),
        upstream: shape.upstream(upstream),
        expires_at,
        usable_until: expires_at - 30_000,
        health_ok: true,
        health_checked_at: now_ms,
    }
}

/// `n` proxies of the demo pool ([`PoolShape::DEMO`]), healthy as of `now_ms`.
pub fn demo_proxies(n: usize, now_ms: i64) -> Vec<NewProxy> {
    (0..n)
        .map(|i| synthetic_proxy(i, now_ms, PoolShape::DEMO))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synthetic pool covers every combination of its shape.
    #[test]
    fn spreads_over_every_combination() {
        for shape in [
            PoolShape::DEMO,
            PoolShape::SMALL,
            PoolShape::parse("2700").unwrap(),
            PoolShape::parse("10800").unwrap(),
            PoolShape::parse("2x4x5x6").unwrap(),
        ] {
            let n = shape.combinations();
            let seen: std::collections::BTreeSet<String> = (0..n * 2)
                .map(|i| {
                    let p = synthetic_proxy(i, 0, shape);
                    format!("{}|{}|{}|{}", p.protocol, p.region, p.carrier, p.upstream)
                })
                .collect();
            assert_eq!(seen.len(), n, "{shape:?}");
        }
        assert_eq!(PoolShape::parse("10800").unwrap().combinations(), 10_800);
        let city = PoolShape::parse("2x16x25x25").unwrap();
        assert_eq!(city.combinations(), 20_000);
        assert_eq!(city.to_string(), "2x16x25x25");
        assert_eq!(
            (city.carrier(26), city.upstream(24).as_str()),
            ("carrier-01".to_owned(), "upstream-24")
        );
        assert_eq!(PoolShape::parse("3x3x1x2"), Ok(PoolShape::SMALL));
        for bad in ["4x1x1x1", "3x0x1x1", "3x1x1", "3x1000x1000x1000", "20"] {
            assert!(PoolShape::parse(bad).is_err(), "{bad}");
        }
        assert!(PoolShape::parse("many").is_err());
    }

    /// The demo pool is the shape `events/README.md` was written for.
    #[test]
    fn the_demo_pool_keeps_its_attributes() {
        let p = demo_proxies(60, 1_000_000);
        assert_eq!(
            (
                p[0].protocol.as_str(),
                p[0].region.as_str(),
                p[0].carrier.as_str()
            ),
            ("http", "shanghai", "telecom")
        );
        assert_eq!(
            (
                p[31].region.as_str(),
                p[31].carrier.as_str(),
                p[31].upstream.as_str()
            ),
            ("beijing", "telecom", "provider-b")
        );
        assert_eq!(p[5].id, "proxy-0000000005");
        assert!(p.iter().all(|p| p.usable_until == p.expires_at - 30_000));
    }
}
