//! hyper answers a request head it refuses itself, with an empty body;
//! here that answer is recognised, and the handler's problem written as a
//! whole HTTP/1.1 answer in its place.

use lambda_http::Body;
use lambda_http::http::Response;

use super::request::body_bytes;
use crate::distribution::RefusedHead;

/// hyper's own answer to a request head it refused: one bodiless
/// `HTTP/1.1 4xx` head, without the `X-Request-ID` every answer of the
/// handler carries. 431 is a head over the limits; any other status (400)
/// one it could not parse.
pub(super) fn refused_by_parser(buf: &[u8]) -> Option<RefusedHead> {
    let head = buf.strip_suffix(b"\r\n\r\n")?;
    let status = head.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    let lower = head.to_ascii_lowercase();
    if contains(&lower, b"\r\n\r\n") || contains(&lower, b"\r\nx-request-id:") {
        return None;
    }
    match status {
        b"431" => Some(RefusedHead::TooLarge),
        [b'4', _, _] => Some(RefusedHead::Malformed),
        _ => None,
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `response` as an HTTP/1.1 answer after which the connection closes.
pub(super) fn http1_bytes(response: Response<Body>) -> Vec<u8> {
    let (parts, body) = response.into_parts();
    let body = body_bytes(body);
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        parts.status.as_str(),
        parts.status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in &parts.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let date = http_date();
    let tail = format!(
        "date: {date}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    out.extend_from_slice(tail.as_bytes());
    out.extend_from_slice(&body);
    out
}

/// Now as an HTTP date (`Tue, 03 Dec 2026 10:40:26 GMT`).
fn http_date() -> String {
    let layout = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::OffsetDateTime::now_utc()
        .format(&layout)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::distribution::refused_head;

    /// hyper's bodiless answers to refused heads are recognised; the
    /// handler's answers (an `X-Request-ID`), other statuses and more than
    /// one message are not.
    #[test]
    fn recognises_hyper_s_own_answers() {
        let hyper_s = |status: &str| {
            format!(
                "HTTP/1.1 {status}\r\ncontent-length: 0\r\ndate: Tue, 03 Dec 2026 10:40:26 GMT\r\n\r\n"
            )
        };
        let refused = |s: String| refused_by_parser(s.as_bytes());
        assert_eq!(
            refused(hyper_s("431 Request Header Fields Too Large")),
            Some(RefusedHead::TooLarge)
        );
        assert_eq!(
            refused(hyper_s("400 Bad Request")),
            Some(RefusedHead::Malformed)
        );
        assert_eq!(refused(hyper_s("200 OK")), None);
        assert_eq!(
            refused(
                "HTTP/1.1 400 Bad Request\r\nX-Request-ID: r\r\ncontent-length: 0\r\n\r\n".into()
            ),
            None
        );
        assert_eq!(
            refused(format!(
                "{}{}",
                hyper_s("400 Bad Request"),
                hyper_s("400 Bad Request")
            )),
            None
        );
        assert_eq!(refused("HTTP/1.1 400 Bad Request\r\n".into()), None);
    }

    /// The replacement is one complete HTTP/1.1 answer that closes the
    /// connection, its body the problem.
    #[test]
    fn replacement_is_a_closing_problem() {
        let raw = String::from_utf8(http1_bytes(refused_head(RefusedHead::TooLarge))).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        // Every header line, the last included, ends with CRLF.
        let head = format!("{head}\r\n");
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\ncontent-type: application/problem+json\r\n"));
        assert!(head.contains("\r\nconnection: close\r\n"));
        assert!(head.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        assert!(head.contains(" GMT\r\n"));
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["code"], "HEADERS_TOO_LARGE");
        let id = problem["requestId"].as_str().unwrap();
        assert!(head.contains(&format!("\r\nx-request-id: {id}\r\n")));
    }
}
