//! The filter sets: which filters the requests of a cell carry, and the
//! request body of each. A new set is a variant of [`FilterShape`] with its
//! name and its body here; `--filters` and the table pick it up by name.
//!
//! Besides the everyday shapes (none, one region, ...), the adversarial
//! shapes are the costliest requests the contract allows (at most 64
//! values per filter array, protocols only http, https and socks5), built
//! from what the synthetic pool holds ([`PoolShape`]) plus invented values;
//! `--filters adversarial` names them all ([`FilterShape::ADVERSARIAL`]).

use proxy_pool::local::PoolShape;
use proxy_pool::pool::NewProxy;
use serde::Serialize;

/// Protocols, in the order synthetic pools use them.
const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];
/// Most values one filter array may hold.
const MOST: usize = 64;

/// Not a filter shape (`--filters`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "filters are none, region, region-carrier, protocol-upstream, or adversarial (none, regions64-proto, regions64-car-up, regions16-every, invented-regions, invented-every, restricted-client, seed-example, all-but-one, multi-worst, protocol-only, regions2-carrier), or any of those by name"
)]
pub struct UnknownFilter;

/// Which filters every request of a cell carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilterShape {
    /// No filters: the whole pool matches.
    None,
    /// One region.
    Region,
    /// One region and one carrier.
    RegionCarrier,
    /// One protocol and one upstream (`allowedUpstreams`).
    ProtocolUpstream,
    /// Adversarial a: 64 real regions, every protocol named.
    Regions64Proto,
    /// Adversarial b: 64 real regions x every carrier x every upstream
    /// (up to 64 each).
    Regions64CarUp,
    /// Adversarial c: 16 real regions, every other dimension named with 64
    /// values (every real one up to 64, then invented ones; protocols: the
    /// three).
    Regions16Every,
    /// Adversarial d: 64 invented regions x the three protocols.
    InventedRegions,
    /// Adversarial e: 64 invented values in every dimension (protocols:
    /// the three).
    InventedEvery,
    /// Adversarial f: a restricted client, `allowedUpstreams` one real
    /// upstream, and 64 real regions.
    RestrictedClient,
    /// Adversarial g: the seed's example, protocols `[http]` and one real
    /// region.
    SeedExample,
    /// Adversarial h: every dimension names 63 of its existing values (all
    /// but one where the pool has fewer than 64).
    AllButOne,
    /// Adversarial i: region, carrier and upstream each name a little over
    /// half of what exists (at most 64, a strict subset): the most heads a
    /// walk may skip (9 x 14 x 14 on 16 x 2 x 25 x 25), all protocols.
    MultiWorst,
    /// Adversarial j: one protocol only (one dimension: never skips).
    ProtocolOnly,
    /// Adversarial k: two regions and one carrier.
    Regions2Carrier,
}

/// One or more filter shapes, as `--filters` names them (`adversarial`
/// is every adversarial shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterSet(pub Vec<FilterShape>);

impl FilterSet {
    /// A shape's name, or `adversarial`.
    pub fn parse(s: &str) -> Result<Self, UnknownFilter> {
        if s.trim() == "adversarial" {
            return Ok(Self(FilterShape::ADVERSARIAL.to_vec()));
        }
        FilterShape::parse(s).map(|f| Self(vec![f]))
    }
}

impl FilterShape {
    /// The everyday shapes, in table order (the default matrix).
    pub const ALL: [Self; 4] = [
        Self::None,
        Self::Region,
        Self::RegionCarrier,
        Self::ProtocolUpstream,
    ];

    /// `--filters adversarial`: the unfiltered call first (the shapes'
    /// costs are read against it), then every adversarial shape.
    pub const ADVERSARIAL: [Self; 12] = [
        Self::None,
        Self::Regions64Proto,
        Self::Regions64CarUp,
        Self::Regions16Every,
        Self::InventedRegions,
        Self::InventedEvery,
        Self::RestrictedClient,
        Self::SeedExample,
        Self::AllButOne,
        Self::MultiWorst,
        Self::ProtocolOnly,
        Self::Regions2Carrier,
    ];

    /// A shape by its name ([`FilterShape::name`]).
    pub fn parse(s: &str) -> Result<Self, UnknownFilter> {
        Self::ALL
            .into_iter()
            .chain(Self::ADVERSARIAL)
            .find(|f| f.name() == s.trim())
            .ok_or(UnknownFilter)
    }

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Region => "region",
            Self::RegionCarrier => "region-carrier",
            Self::ProtocolUpstream => "protocol-upstream",
            Self::Regions64Proto => "regions64-proto",
            Self::Regions64CarUp => "regions64-car-up",
            Self::Regions16Every => "regions16-every",
            Self::InventedRegions => "invented-regions",
            Self::InventedEvery => "invented-every",
            Self::RestrictedClient => "restricted-client",
            Self::SeedExample => "seed-example",
            Self::AllButOne => "all-but-one",
            Self::MultiWorst => "multi-worst",
            Self::ProtocolOnly => "protocol-only",
            Self::Regions2Carrier => "regions2-carrier",
        }
    }

    /// The request body of the `seq`th request: the filter values rotate
    /// over what `pool` holds.
    pub(super) fn body(self, count: u32, seq: u64, pool: PoolShape) -> String {
        let filters = self.filters(seq, pool);
        if filters.is_empty() {
            return format!("{{\"count\":{count}}}");
        }
        let filters: Vec<String> = filters
            .iter()
            .map(|(name, values)| {
                format!(
                    "\"{name}\":{}",
                    serde_json::to_string(values).unwrap_or_default()
                )
            })
            .collect();
        format!(
            "{{\"count\":{count},\"filters\":{{{}}}}}",
            filters.join(",")
        )
    }

    /// Whether a proxy passes this shape's filters (of its first request:
    /// shapes that rotate their values over requests are matched at
    /// their first), for the adversarial fill order.
    pub(super) fn matcher(self, pool: PoolShape) -> impl Fn(&NewProxy) -> bool + Send + Sync {
        let filters = self.filters(0, pool);
        move |p: &NewProxy| {
            filters.iter().all(|(name, values)| {
                let value = match *name {
                    "protocols" => &p.protocol,
                    "regions" => &p.region,
                    "carriers" => &p.carrier,
                    _ => &p.upstream,
                };
                values.iter().any(|v| v == value)
            })
        }
    }

    /// The filter arrays of the `seq`th request, in body order.
    fn filters(self, seq: u64, pool: PoolShape) -> Vec<(&'static str, Vec<String>)> {
        let i = seq as usize;
        let real = Real { pool, seq: i };
        let protocols = || PROTOCOLS.iter().map(|p| (*p).to_owned()).collect();
        let invented = |dim: &str| -> Vec<String> {
            (0..MOST)
                .map(|k| format!("no-{dim}-{seq:x}-{k:02}"))
                .collect()
        };
        match self {
            Self::None => vec![],
            Self::Region => vec![("regions", vec![pool.region(i.wrapping_mul(7_919))])],
            Self::RegionCarrier => vec![
                ("regions", vec![pool.region(i.wrapping_mul(7_919))]),
                ("carriers", vec![pool.carrier(i)]),
            ],
            Self::ProtocolUpstream => vec![
                ("protocols", vec![pool.protocol(i).to_owned()]),
                (
                    "allowedUpstreams",
                    vec![pool.upstream(i / pool.protocols.max(1))],
                ),
            ],
            Self::Regions64Proto => {
                vec![("protocols", protocols()), ("regions", real.regions(MOST))]
            }
            Self::Regions64CarUp => vec![
                ("regions", real.regions(MOST)),
                ("carriers", real.carriers(MOST)),
                ("allowedUpstreams", real.upstreams(MOST)),
            ],
            Self::Regions16Every => {
                let pad = |mut real: Vec<String>, dim: &str| {
                    let more = MOST - real.len();
                    real.extend(invented(dim).into_iter().take(more));
                    real
                };
                vec![
                    ("protocols", protocols()),
                    ("regions", real.regions(16)),
                    ("carriers", pad(real.carriers(MOST), "carrier")),
                    ("allowedUpstreams", pad(real.upstreams(MOST), "upstream")),
                ]
            }
            Self::InventedRegions => {
                vec![("protocols", protocols()), ("regions", invented("region"))]
            }
            Self::InventedEvery => vec![
                ("protocols", protocols()),
                ("regions", invented("region")),
                ("carriers", invented("carrier")),
                ("allowedUpstreams", invented("upstream")),
            ],
            Self::RestrictedClient => vec![
                ("regions", real.regions(MOST)),
                ("allowedUpstreams", real.upstreams(1)),
            ],
            Self::SeedExample => vec![
                ("protocols", vec!["http".to_owned()]),
                ("regions", real.regions(1)),
            ],
            Self::AllButOne => {
                let n = |values: usize| (MOST - 1).min(values.saturating_sub(1)).max(1);
                vec![
                    ("protocols", real.protocols(n(pool.protocols))),
                    ("regions", real.regions(n(pool.regions))),
                    ("carriers", real.carriers(n(pool.carriers))),
                    ("allowedUpstreams", real.upstreams(n(pool.upstreams))),
                ]
            }
            Self::MultiWorst => {
                // The same values in every request (the adversarial fill
                // orders the heads against them).
                let real = Real { pool, seq: 0 };
                let n = |values: usize| {
                    (values * 14)
                        .div_ceil(25)
                        .min(values.saturating_sub(1))
                        .clamp(1, MOST)
                };
                vec![
                    ("regions", real.regions(n(pool.regions))),
                    ("carriers", real.carriers(n(pool.carriers))),
                    ("allowedUpstreams", real.upstreams(n(pool.upstreams))),
                ]
            }
            Self::ProtocolOnly => vec![("protocols", vec![pool.protocol(i).to_owned()])],
            Self::Regions2Carrier => vec![
                ("regions", real.regions(2)),
                ("carriers", vec![pool.carrier(i)]),
            ],
        }
    }
}

/// Values the pool holds, `n` of a dimension (at most all of them),
/// starting at an offset that moves from request to request.
struct Real {
    pool: PoolShape,
    seq: usize,
}

impl Real {
    fn pick(&self, n: usize, of: usize, name: impl Fn(usize) -> String) -> Vec<String> {
        let start = self.seq.wrapping_mul(7_919) % of;
        (0..n.min(of)).map(|k| name(start + k)).collect()
    }

    fn protocols(&self, n: usize) -> Vec<String> {
        self.pick(n, self.pool.protocols, |i| self.pool.protocol(i).to_owned())
    }

    fn regions(&self, n: usize) -> Vec<String> {
        self.pick(n, self.pool.regions, |i| self.pool.region(i))
    }

    fn carriers(&self, n: usize) -> Vec<String> {
        self.pick(n, self.pool.carriers, |i| self.pool.carrier(i))
    }

    fn upstreams(&self, n: usize) -> Vec<String> {
        self.pick(n, self.pool.upstreams, |i| self.pool.upstream(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Filter shapes parse by name and name values the pool holds.
    #[test]
    fn filter_shapes() {
        let shape = PoolShape::parse("2700").unwrap();
        for f in FilterShape::ALL.into_iter().chain(FilterShape::ADVERSARIAL) {
            assert_eq!(FilterShape::parse(f.name()), Ok(f));
            assert!(f.name().len() <= 17, "{}", f.name());
            let body: serde_json::Value = serde_json::from_str(&f.body(5, 123, shape)).unwrap();
            assert_eq!(body["count"], 5);
        }
        assert_eq!(
            FilterShape::RegionCarrier.body(1, 4, shape),
            r#"{"count":1,"filters":{"regions":["city-076"],"carriers":["unicom"]}}"#
        );
        assert!(FilterShape::parse("city").is_err());
        assert_eq!(
            FilterSet::parse("adversarial").unwrap().0,
            FilterShape::ADVERSARIAL
        );
        assert_eq!(FilterSet::parse("region").unwrap().0, [FilterShape::Region]);
    }

    /// Every adversarial body is legal: at most 64 distinct values per
    /// array, protocols among the three.
    #[test]
    fn adversarial_bodies_are_legal() {
        for pool in ["18", "3x400x3x5", "2x16x25x25", "3x20x70x70"] {
            let pool = PoolShape::parse(pool).unwrap();
            for f in FilterShape::ADVERSARIAL {
                for seq in [0, 1, 977] {
                    let body: serde_json::Value =
                        serde_json::from_str(&f.body(1, seq, pool)).unwrap();
                    let Some(filters) = body["filters"].as_object() else {
                        continue;
                    };
                    for (name, values) in filters {
                        let values: Vec<&str> = values
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_str().unwrap())
                            .collect();
                        let distinct: std::collections::BTreeSet<_> = values.iter().collect();
                        assert!(!values.is_empty() && values.len() <= 64, "{f:?} {name}");
                        assert_eq!(distinct.len(), values.len(), "{f:?} {name} {pool}");
                        if name == "protocols" {
                            assert!(values.iter().all(|p| PROTOCOLS.contains(p)));
                        }
                    }
                }
            }
        }
    }

    /// The all-but-one and multi-dimension shapes name what the issue asks
    /// of them on the two envelope compositions.
    #[test]
    fn multi_dimension_shapes() {
        let city = PoolShape::parse("3x400x3x5").unwrap();
        let counts = |f: FilterShape, pool| -> Vec<usize> {
            f.filters(7, pool).iter().map(|(_, v)| v.len()).collect()
        };
        assert_eq!(counts(FilterShape::AllButOne, city), [2, 63, 2, 4]);
        assert_eq!(counts(FilterShape::MultiWorst, city), [64, 2, 3]);
        let kinds = PoolShape::parse("2x16x25x25").unwrap();
        assert_eq!(counts(FilterShape::AllButOne, kinds), [1, 15, 24, 24]);
        assert_eq!(counts(FilterShape::MultiWorst, kinds), [9, 14, 14]);
        assert_eq!(counts(FilterShape::Regions16Every, kinds), [3, 16, 64, 64]);
        assert_eq!(counts(FilterShape::RestrictedClient, city), [64, 1]);
    }
}
