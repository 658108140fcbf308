//! Strict decoding of the `POST /api/v1/proxies/extract` body.

use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::httpapi::InvalidParam;
use crate::pool::{Filters, Fulfillment, Protocol};

/// Most values one filter dimension may list.
const MAX_FILTER_VALUES: usize = 64;
/// Longest region, carrier or upstream name accepted in a filter.
const MAX_FILTER_VALUE_LEN: usize = 64;

/// A decoded, validated extraction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractRequest {
    /// How many proxies, 1..=maxCountPerRequest.
    pub count: u32,
    /// The caller's choice; `None` means the server default.
    pub fulfillment: Option<Fulfillment>,
    /// The filters, validated and normalised (sorted) here, once: the
    /// pool takes them as they are.
    pub filters: Filters,
}

/// Why a request was refused before the service saw it. `Display` is the
/// problem's `detail`; the lists name each field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// The body is not JSON (400).
    #[error("the body is not valid JSON (line {line}, column {column})")]
    NotJson {
        /// Where the parser stopped.
        line: usize,
        /// Where the parser stopped.
        column: usize,
    },
    /// The body is JSON but not an object (400).
    #[error("the body must be a JSON object")]
    NotAnObject,
    /// Missing, mistyped or unknown fields (400).
    #[error("the request body does not match the schema")]
    Schema(Vec<InvalidParam>),
    /// Well-typed values against the business rules (422).
    #[error("the request violates a business constraint")]
    Rules(Vec<InvalidParam>),
    /// An `Idempotency-Key` header that is not one key of 8 to 128 visible
    /// ASCII characters (400).
    #[error("invalid Idempotency-Key header")]
    IdempotencyKey(InvalidParam),
}

/// Collects what is wrong, split into 400 (shape) and 422 (rules) classes.
#[derive(Default)]
struct Faults {
    shape: Vec<InvalidParam>,
    rules: Vec<InvalidParam>,
}

impl ExtractRequest {
    /// Decodes `body`; `max_count` is the effective `maxCountPerRequest`.
    /// Malformed JSON, wrong types, missing or unknown fields are 400;
    /// well-typed values against the rules are 422.
    pub fn decode(body: &[u8], max_count: u32) -> Result<Self, RequestError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| RequestError::NotJson {
            line: e.line(),
            column: e.column(),
        })?;
        let Value::Object(object) = value else {
            return Err(RequestError::NotAnObject);
        };
        let mut faults = Faults::default();
        reject_unknown(
            &object,
            &["count", "fulfillment", "filters"],
            "",
            &mut faults,
        );

        let count = match object.get("count") {
            None => {
                faults.shape.push(InvalidParam::new("count", "is required"));
                0
            }
            Some(v) => decode_count(v, max_count, &mut faults),
        };
        let fulfillment = match object.get("fulfillment") {
            None => None,
            Some(Value::String(s)) => Fulfillment::parse(s).or_else(|| {
                faults.rules.push(InvalidParam::new(
                    "fulfillment",
                    "must be `partial` or `allOrNothing`",
                ));
                None
            }),
            Some(_) => {
                faults
                    .shape
                    .push(InvalidParam::new("fulfillment", "must be a string"));
                None
            }
        };
        let filters = match object.get("filters") {
            None => Filters::default(),
            Some(Value::Object(f)) => decode_filters(f, &mut faults),
            Some(_) => {
                faults
                    .shape
                    .push(InvalidParam::new("filters", "must be an object"));
                Filters::default()
            }
        };
        if !faults.shape.is_empty() {
            return Err(RequestError::Schema(faults.shape));
        }
        if !faults.rules.is_empty() {
            return Err(RequestError::Rules(faults.rules));
        }
        Ok(Self {
            count,
            fulfillment,
            filters,
        })
    }

    /// SHA-256 (hex) of the canonical request: count, effective fulfillment,
    /// filters sorted with empty lists dropped. Equal requests, equal digests.
    /// Idempotency records keep it, so its bytes never change (a test pins
    /// them).
    pub fn digest(&self, effective: Fulfillment) -> Result<String, serde_json::Error> {
        #[derive(Serialize)]
        struct Canonical<'a> {
            count: u32,
            fulfillment: Fulfillment,
            filters: &'a Filters,
        }
        let canonical = Canonical {
            count: self.count,
            fulfillment: effective,
            filters: &self.filters,
        };
        Ok(hex::encode(Sha256::digest(serde_json::to_string(
            &canonical,
        )?)))
    }
}

fn reject_unknown(object: &Map<String, Value>, known: &[&str], prefix: &str, faults: &mut Faults) {
    for key in object.keys() {
        if !known.contains(&key.as_str()) {
            let name: String = key.chars().take(64).collect();
            faults.shape.push(InvalidParam::new(
                format!("{prefix}{name}"),
                "is not a known field",
            ));
        }
    }
}

fn decode_count(value: &Value, max_count: u32, faults: &mut Faults) -> u32 {
    let Value::Number(n) = value else {
        faults
            .shape
            .push(InvalidParam::new("count", "must be an integer"));
        return 0;
    };
    // JSON Schema integers are values, so 5.0 is 5 and 1e20 is out of range.
    let whole = n
        .as_i64()
        .map(|c| c as f64)
        .or_else(|| n.as_f64().filter(|f| f.is_finite() && f.fract() == 0.0));
    match whole {
        Some(c) if c >= 1.0 && c <= f64::from(max_count) => c as u32,
        Some(_) => {
            faults.rules.push(InvalidParam::new(
                "count",
                format!("must be between 1 and {max_count}"),
            ));
            0
        }
        None => {
            faults
                .shape
                .push(InvalidParam::new("count", "must be an integer"));
            0
        }
    }
}

fn decode_filters(object: &Map<String, Value>, faults: &mut Faults) -> Filters {
    reject_unknown(
        object,
        &["protocols", "regions", "carriers", "allowedUpstreams"],
        "filters.",
        faults,
    );
    let mut list = |name: &str, allowed: Option<&[&str]>, unknown_allowed: bool| -> Vec<String> {
        let field = format!("filters.{name}");
        let values = match object.get(name) {
            None => return Vec::new(),
            Some(Value::Array(values)) => values,
            Some(_) => {
                faults
                    .shape
                    .push(InvalidParam::new(field, "must be an array of strings"));
                return Vec::new();
            }
        };
        if values.len() > MAX_FILTER_VALUES {
            faults.rules.push(InvalidParam::new(
                field,
                format!("must not list more than {MAX_FILTER_VALUES} values"),
            ));
            return Vec::new();
        }
        let mut out: Vec<String> = Vec::with_capacity(values.len());
        for (i, v) in values.iter().enumerate() {
            let item = format!("{field}[{i}]");
            let Value::String(s) = v else {
                faults
                    .shape
                    .push(InvalidParam::new(item, "must be a string"));
                continue;
            };
            if let Some(allowed) = allowed {
                if !allowed.contains(&s.as_str()) {
                    faults.rules.push(InvalidParam::new(
                        item,
                        format!("must be one of {}", allowed.join(", ")),
                    ));
                    continue;
                }
            } else if (s.is_empty() && !unknown_allowed)
                || s.len() > MAX_FILTER_VALUE_LEN
                || s.chars().any(char::is_control)
            {
                let least = if unknown_allowed { 0 } else { 1 };
                faults.rules.push(InvalidParam::new(
                    item,
                    format!(
                        "must be {least} to {MAX_FILTER_VALUE_LEN} characters without control characters"
                    ),
                ));
                continue;
            }
            if out.contains(s) {
                faults
                    .rules
                    .push(InvalidParam::new(item, "duplicates an earlier value"));
                continue;
            }
            out.push(s.clone());
        }
        out.sort();
        out
    };
    // "" is the region or carrier the pool records as unknown, so it is a
    // value a request may ask for; every upstream has a name.
    Filters {
        protocols: list(
            "protocols",
            Some(&Protocol::ALL.map(Protocol::as_str)),
            false,
        ),
        regions: list("regions", None, true),
        carriers: list("carriers", None, true),
        allowed_upstreams: list("allowedUpstreams", None, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(json: &str) -> Result<ExtractRequest, RequestError> {
        ExtractRequest::decode(json.as_bytes(), 100)
    }

    /// The status the request would be answered with (the HTTP layer maps
    /// `Rules` to 422, every other refusal of the body to 400).
    fn status(json: &str) -> u16 {
        match decode(json) {
            Ok(_) => 200,
            Err(RequestError::Rules(_)) => 422,
            Err(_) => 400,
        }
    }

    /// The seed's example decodes to sorted filters.
    #[test]
    fn decodes_the_seed_example() {
        let r = decode(r#"{"count":5,"fulfillment":"partial","filters":{"protocols":["socks5","http"],"regions":["shanghai"]}}"#).unwrap();
        assert_eq!(r.count, 5);
        assert_eq!(r.fulfillment, Some(Fulfillment::Partial));
        assert_eq!(r.filters.protocols, ["http", "socks5"]);
        assert_eq!(r.filters.regions, ["shanghai"]);
    }

    /// Shape errors are 400, rule violations 422.
    #[test]
    fn classifies_errors() {
        for (json, want) in [
            ("{", 400),
            ("[]", 400),
            ("null", 400),
            (r#"{}"#, 400),
            (r#"{"count":"5"}"#, 400),
            (r#"{"count":1.5}"#, 400),
            (r#"{"count":1,"extra":true}"#, 400),
            (r#"{"count":1,"filters":{"zones":[]}}"#, 400),
            (r#"{"count":1,"filters":[]}"#, 400),
            (r#"{"count":1,"filters":{"regions":"x"}}"#, 400),
            (r#"{"count":1,"filters":{"regions":[1]}}"#, 400),
            (r#"{"count":1,"fulfillment":1}"#, 400),
            (r#"{"count":0}"#, 422),
            (r#"{"count":-3}"#, 422),
            (r#"{"count":101}"#, 422),
            (r#"{"count":99999999999999999999}"#, 422),
            (r#"{"count":5.0}"#, 200),
            (r#"{"count":1,"fulfillment":"most"}"#, 422),
            (r#"{"count":1,"filters":{"protocols":["ftp"]}}"#, 422),
            (r#"{"count":1,"filters":{"regions":["a","a"]}}"#, 422),
            (r#"{"count":1,"filters":{"allowedUpstreams":[""]}}"#, 422),
            // The pool's "unknown" region and carrier.
            (
                r#"{"count":1,"filters":{"regions":[""],"carriers":[""]}}"#,
                200,
            ),
            (
                r#"{"count":100,"filters":{"regions":[],"carriers":[]}}"#,
                200,
            ),
        ] {
            assert_eq!(status(json), want, "{json}");
        }
    }

    /// More than 64 values in one dimension is 422; 64 is fine.
    #[test]
    fn bounds_filter_arrays() {
        let list = |n: usize| {
            (0..n)
                .map(|i| format!("\"r{i}\""))
                .collect::<Vec<_>>()
                .join(",")
        };
        assert_eq!(
            status(&format!(
                r#"{{"count":1,"filters":{{"regions":[{}]}}}}"#,
                list(64)
            )),
            200
        );
        assert_eq!(
            status(&format!(
                r#"{{"count":1,"filters":{{"regions":[{}]}}}}"#,
                list(65)
            )),
            422
        );
    }

    /// The digest ignores order and empty lists, and sees the effective mode.
    #[test]
    fn digest_is_canonical() {
        let a = decode(r#"{"count":2,"filters":{"regions":["b","a"],"carriers":[]}}"#).unwrap();
        let b = decode(r#"{"filters":{"regions":["a","b"]},"count":2}"#).unwrap();
        let c = decode(r#"{"count":3,"filters":{"regions":["a","b"]}}"#).unwrap();
        assert_eq!(
            a.digest(Fulfillment::Partial).unwrap(),
            b.digest(Fulfillment::Partial).unwrap()
        );
        assert_ne!(
            a.digest(Fulfillment::Partial).unwrap(),
            b.digest(Fulfillment::AllOrNothing).unwrap()
        );
        assert_ne!(
            a.digest(Fulfillment::Partial).unwrap(),
            c.digest(Fulfillment::Partial).unwrap()
        );
    }

    /// The digest's bytes are those idempotency records already hold: the
    /// canonical JSON of count, effective fulfillment and the non-empty
    /// filter lists, in this order.
    #[test]
    fn digest_bytes_are_stable() {
        let r = decode(
            r#"{"count":2,"filters":{"regions":["b",""],"carriers":[],"allowedUpstreams":["u"],"protocols":["http"]}}"#,
        )
        .unwrap();
        assert_eq!(
            r.digest(Fulfillment::AllOrNothing).unwrap(),
            "15ca0f1a4d04ace47d3e5cbfa434d119e07f8c595797c13961f316adfa61e4fd"
        );
    }
}
