use lambda_http::http::{HeaderMap, HeaderName, HeaderValue};

/// The request identifier: the caller's `X-Request-ID` when valid, else generated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(String);

/// Longest `X-Request-ID` accepted.
const MAX_LEN: usize = 128;

impl RequestId {
    /// The header carrying the request id, both ways.
    pub const HEADER: HeaderName = HeaderName::from_static("x-request-id");

    /// A fresh server-generated id (`req_` + ULID).
    pub fn generate() -> Self {
        Self(format!("req_{}", ulid::Ulid::generate()))
    }

    /// Takes the caller's id from `headers`; `Err` carries a generated id to
    /// answer the 400 with when the header is present but invalid. An empty
    /// value counts as absent (the contract only bounds its length).
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, Self> {
        let mut values = headers.get_all(Self::HEADER).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return if headers.contains_key(Self::HEADER) {
                Err(Self::generate())
            } else {
                Ok(Self::generate())
            };
        };
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return Ok(Self::generate());
        }
        let valid = bytes.len() <= MAX_LEN && bytes.iter().all(|b| (0x20..=0x7e).contains(b));
        match (valid, value.to_str()) {
            (true, Ok(id)) => Ok(Self(id.to_owned())),
            _ => Err(Self::generate()),
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as a header value (always valid: visible ASCII only).
    pub fn header_value(&self) -> HeaderValue {
        HeaderValue::from_str(&self.0).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(value: &[u8]) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(RequestId::HEADER, HeaderValue::from_bytes(value).unwrap());
        h
    }

    /// A valid caller id is kept; none present means a generated `req_` id.
    #[test]
    fn keeps_or_generates() {
        assert_eq!(
            RequestId::from_headers(&headers(b"req_01J4EXAMPLE"))
                .unwrap()
                .as_str(),
            "req_01J4EXAMPLE"
        );
        let generated = RequestId::from_headers(&HeaderMap::new()).unwrap();
        assert!(generated.as_str().starts_with("req_"));
        assert_eq!(generated.as_str().len(), 30);
    }

    /// Too long, control or non-ASCII ids are refused; spaces are fine; an
    /// empty one is replaced by a generated id.
    #[test]
    fn refuses_bad_ids() {
        for bad in [vec![b'a'; 129], b"a\tb".to_vec(), "é".as_bytes().to_vec()] {
            let err = RequestId::from_headers(&headers(&bad)).unwrap_err();
            assert!(err.as_str().starts_with("req_"));
        }
        assert!(RequestId::from_headers(&headers(&[b'a'; 128])).is_ok());
        assert!(RequestId::from_headers(&headers(b"req 1")).is_ok());
        let empty = RequestId::from_headers(&headers(b"")).unwrap();
        assert!(empty.as_str().starts_with("req_"));
    }
}
