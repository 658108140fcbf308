//! The filter sets: which filters the requests of a cell carry, and the
//! request body of each. A new set is a variant of [`FilterShape`] with its
//! name and its body here; `--filters` and the table pick it up by name.

use proxy_pool::local::PoolShape;
use serde::Serialize;

use super::plan::ArgError;

/// Protocols, in the order synthetic pools use them.
const PROTOCOLS: [&str; 3] = ["http", "https", "socks5"];

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
}

impl FilterShape {
    /// Every shape, in table order.
    pub const ALL: [Self; 4] = [
        Self::None,
        Self::Region,
        Self::RegionCarrier,
        Self::ProtocolUpstream,
    ];

    /// `none`, `region`, `region-carrier` or `protocol-upstream`.
    pub fn parse(s: &str) -> Result<Self, ArgError> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or(ArgError::Filter)
    }

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Region => "region",
            Self::RegionCarrier => "region-carrier",
            Self::ProtocolUpstream => "protocol-upstream",
        }
    }

    /// The request body of the `seq`th request: the filter values rotate
    /// over what `pool` holds.
    pub(super) fn body(self, count: u32, seq: u64, pool: PoolShape) -> String {
        let i = seq as usize;
        let filters = match self {
            Self::None => return format!("{{\"count\":{count}}}"),
            Self::Region => format!("\"regions\":[\"{}\"]", pool.region(i.wrapping_mul(7_919))),
            Self::RegionCarrier => format!(
                "\"regions\":[\"{}\"],\"carriers\":[\"{}\"]",
                pool.region(i.wrapping_mul(7_919)),
                pool.carrier(i)
            ),
            Self::ProtocolUpstream => format!(
                "\"protocols\":[\"{}\"],\"allowedUpstreams\":[\"{}\"]",
                PROTOCOLS[i % 3],
                pool.upstream(i / 3)
            ),
        };
        format!("{{\"count\":{count},\"filters\":{{{filters}}}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Filter shapes parse by name and name values the pool holds.
    #[test]
    fn filter_shapes() {
        let shape = PoolShape::parse("2700").unwrap();
        for f in FilterShape::ALL {
            assert_eq!(FilterShape::parse(f.name()), Ok(f));
            let body: serde_json::Value = serde_json::from_str(&f.body(5, 123, shape)).unwrap();
            assert_eq!(body["count"], 5);
        }
        assert_eq!(
            FilterShape::RegionCarrier.body(1, 4, shape),
            r#"{"count":1,"filters":{"regions":["city-076"],"carriers":["unicom"]}}"#
        );
        assert!(FilterShape::parse("city").is_err());
    }
}
