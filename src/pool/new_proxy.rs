//! A proxy to add to (or refresh in) the pool, as read from one JSON line.

use std::net::IpAddr;

use serde::Serialize;
use serde_json::{Map, Value};

use super::error::PoolError;
use super::query::Protocol;
use crate::clock::{TimeError, parse_rfc3339};

/// Longest proxy id.
const MAX_ID_LEN: usize = 128;
/// Longest region, carrier or upstream name (also the bucket separator `|` is refused).
const MAX_NAME_LEN: usize = 64;
/// Longest username or password.
const MAX_SECRET_LEN: usize = 256;
/// Largest safety margin, one day.
const MAX_SAFETY_MARGIN_SECONDS: i64 = 86_400;

/// A validated proxy, in the shape `lua/upsert.lua` takes (times in Unix ms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NewProxy {
    /// Stable id.
    pub id: String,
    /// `http`, `https` or `socks5`.
    pub protocol: String,
    /// IP address or host name.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Proxy user.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Proxy password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Region, "" when unknown.
    pub region: String,
    /// Carrier, "" when unknown.
    pub carrier: String,
    /// Upstream provider.
    pub upstream: String,
    /// Hard expiry.
    pub expires_at: i64,
    /// `expiresAt` minus the upstream's safety margin: last moment it may be handed out.
    pub usable_until: i64,
    /// Outcome of the last health check.
    pub health_ok: bool,
    /// When the last health check ran.
    pub health_checked_at: i64,
}

/// What the pool did with one proxy of an upsert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertStatus {
    /// New to the pool.
    Added,
    /// Already there; details, expiry and health replaced.
    Refreshed,
    /// Refused: already handed to a client in this TTL life.
    Extracted,
    /// Refused: its usable life is already over.
    Expired,
}

impl UpsertStatus {
    /// Parses the status word `lua/upsert.lua` returns.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "added" => Some(Self::Added),
            "refreshed" => Some(Self::Refreshed),
            "extracted" => Some(Self::Extracted),
            "expired" => Some(Self::Expired),
            _ => None,
        }
    }
}

/// The fields of a proxy line.
const FIELDS: [&str; 13] = [
    "id",
    "protocol",
    "host",
    "port",
    "username",
    "password",
    "region",
    "carrier",
    "upstream",
    "expiresAt",
    "safetyMarginSeconds",
    "healthCheckedAt",
    "healthOk",
];
/// Fields of an extraction response line that a loader may carry along and that are ignored.
const IGNORED: [&str; 3] = ["url", "remainingTtlSeconds", "extractedAt"];
/// The largest time a record holds: 13 digits of Unix ms.
const MAX_MS: i64 = 9_999_999_999_999;

/// Why a JSON line is not a proxy. Says what is wrong, never echoes a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    /// Not JSON at all.
    #[error("not valid JSON (column {0})")]
    Json(usize),
    /// JSON, but not an object.
    #[error("not a JSON object")]
    NotAnObject,
    /// A field no proxy has (its name, cut to 64 characters).
    #[error("unknown field `{0}`")]
    UnknownField(String),
    /// A required field is missing.
    #[error("`{0}` is required")]
    Missing(&'static str),
    /// A field's value breaks its rule.
    #[error("`{field}` must be {rule}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// What it must be.
        rule: String,
    },
}

fn invalid(field: &'static str, rule: impl Into<String>) -> LineError {
    LineError::Invalid {
        field,
        rule: rule.into(),
    }
}

impl NewProxy {
    /// Parses one JSON line; `now_ms` is the default `healthCheckedAt`.
    pub fn from_json_line(line: &str, now_ms: i64) -> Result<Self, LineError> {
        let value: Value = serde_json::from_str(line).map_err(|e| LineError::Json(e.column()))?;
        let Value::Object(o) = value else {
            return Err(LineError::NotAnObject);
        };
        if let Some(k) = o.keys().find(|k| {
            let k = k.as_str();
            !FIELDS.contains(&k) && !IGNORED.contains(&k)
        }) {
            return Err(LineError::UnknownField(k.chars().take(64).collect()));
        }
        let id = string(&o, "id")?.ok_or(LineError::Missing("id"))?;
        if id.is_empty()
            || id.len() > MAX_ID_LEN
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:~-".contains(&b))
        {
            return Err(invalid(
                "id",
                format!("1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : ~ -"),
            ));
        }
        let protocol = string(&o, "protocol")?.ok_or(LineError::Missing("protocol"))?;
        if Protocol::parse(&protocol).is_none() {
            return Err(invalid("protocol", format!("one of {}", Protocol::names())));
        }
        let host = string(&o, "host")?.ok_or(LineError::Missing("host"))?;
        if !valid_host(&host) {
            return Err(invalid("host", "an IP address or a host name"));
        }
        let port = match o.get("port") {
            Some(Value::Number(n)) => n
                .as_u64()
                .filter(|p| (1..=65535).contains(p))
                .map(|p| p as u16),
            None => return Err(LineError::Missing("port")),
            Some(_) => None,
        }
        .ok_or_else(|| invalid("port", "an integer from 1 to 65535"))?;
        let username = secret(&o, "username")?;
        let password = secret(&o, "password")?;
        let region = name(&o, "region")?.unwrap_or_default();
        let carrier = name(&o, "carrier")?.unwrap_or_default();
        let upstream = name(&o, "upstream")?.ok_or(LineError::Missing("upstream"))?;
        let expires_at = timestamp(&o, "expiresAt")?.ok_or(LineError::Missing("expiresAt"))?;
        let margin = match o.get("safetyMarginSeconds") {
            None => 0,
            Some(Value::Number(n)) => n
                .as_i64()
                .filter(|m| (0..=MAX_SAFETY_MARGIN_SECONDS).contains(m))
                .ok_or_else(|| {
                    invalid(
                        "safetyMarginSeconds",
                        format!("an integer from 0 to {MAX_SAFETY_MARGIN_SECONDS}"),
                    )
                })?,
            Some(_) => return Err(invalid("safetyMarginSeconds", "an integer")),
        };
        let health_checked_at = timestamp(&o, "healthCheckedAt")?.unwrap_or(now_ms);
        let health_ok = match o.get("healthOk") {
            None => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(invalid("healthOk", "true or false")),
        };
        Ok(Self {
            id,
            protocol,
            host,
            port,
            username,
            password,
            region,
            carrier,
            upstream,
            expires_at,
            usable_until: expires_at - margin * 1000,
            health_ok,
            health_checked_at,
        })
    }

    /// The argument `lua/upsert.lua` takes: `<H><U><C><locator>\t<host>\t
    /// <port>\t<user>\t<pass>` (`lua/prelude/record.lua`), times in 13
    /// digits of Unix ms (a usableUntil before 1970 is 0: already over).
    pub fn to_script_arg(&self) -> Result<String, PoolError> {
        let in_range = |t: i64| (0..=MAX_MS).contains(&t);
        if !in_range(self.expires_at) || !in_range(self.health_checked_at) {
            return Err(PoolError::Internal(
                "a proxy's time is outside 1970..2286".into(),
            ));
        }
        Ok(format!(
            "{}{:013}{:013}{}|{}|{}|{}|{:013}|{}\t{}\t{}\t{}\t{}",
            if self.health_ok { '1' } else { '0' },
            self.usable_until.clamp(0, MAX_MS),
            self.health_checked_at,
            self.protocol,
            self.region,
            self.carrier,
            self.upstream,
            self.expires_at,
            self.id,
            self.host,
            self.port,
            self.username.as_deref().unwrap_or(""),
            self.password.as_deref().unwrap_or(""),
        ))
    }
}

fn string(o: &Map<String, Value>, field: &'static str) -> Result<Option<String>, LineError> {
    match o.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(invalid(field, "a string")),
    }
}

fn name(o: &Map<String, Value>, field: &'static str) -> Result<Option<String>, LineError> {
    let value = string(o, field)?;
    if let Some(v) = &value
        && (v.is_empty()
            || v.len() > MAX_NAME_LEN
            || v.contains('|')
            || v.chars().any(char::is_control))
    {
        return Err(invalid(
            field,
            format!("1 to {MAX_NAME_LEN} characters without `|` or control characters"),
        ));
    }
    Ok(value)
}

fn secret(o: &Map<String, Value>, field: &'static str) -> Result<Option<String>, LineError> {
    let value = string(o, field)?;
    if let Some(v) = &value
        && (v.len() > MAX_SECRET_LEN || v.chars().any(char::is_control))
    {
        return Err(invalid(
            field,
            format!("at most {MAX_SECRET_LEN} bytes without control characters"),
        ));
    }
    Ok(value.filter(|v| !v.is_empty()))
}

/// An RFC 3339 field, in 13 digits of milliseconds (the index sorts expiries
/// as fixed-width text).
fn timestamp(o: &Map<String, Value>, field: &'static str) -> Result<Option<i64>, LineError> {
    let Some(s) = string(o, field)? else {
        return Ok(None);
    };
    match parse_rfc3339(&s) {
        Ok(ms) => Ok(Some(ms)),
        Err(TimeError::Format) => Err(invalid(field, "an RFC 3339 timestamp")),
        Err(TimeError::Range) => Err(invalid(field, "between 1970 and 2286")),
    }
}

fn valid_host(host: &str) -> bool {
    if host.parse::<IpAddr>().is_ok() {
        return true;
    }
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = r#"{"id":"px_1","protocol":"http","host":"192.0.2.10","port":8080,"username":"u","password":"SECRETPW","region":"shanghai","carrier":"telecom","upstream":"provider-a","expiresAt":"2026-07-28T10:30:00Z","safetyMarginSeconds":20}"#;

    /// A full line parses, margin applied, health defaulting to now.
    #[test]
    fn parses_a_line() {
        let p = NewProxy::from_json_line(LINE, 42).unwrap();
        assert_eq!(p.expires_at, 1_785_234_600_000);
        assert_eq!(p.usable_until, 1_785_234_580_000);
        assert_eq!(p.health_checked_at, 42);
        assert!(p.health_ok);
        assert_eq!(p.password.as_deref(), Some("SECRETPW"));
    }

    /// Bad lines are refused with a reason that never echoes a value.
    #[test]
    fn refuses_bad_lines() {
        for (from, to) in [
            (r#""port":8080"#, r#""port":0"#),
            (r#""port":8080"#, r#""port":"8080""#),
            (r#""protocol":"http""#, r#""protocol":"ftp""#),
            (r#""host":"192.0.2.10""#, r#""host":"a b""#),
            (r#""region":"shanghai""#, r#""region":"a|b""#),
            (
                r#""expiresAt":"2026-07-28T10:30:00Z""#,
                r#""expiresAt":"tomorrow""#,
            ),
            (r#""id":"px_1""#, r#""id":"px 1""#),
            (r#""password":"SECRETPW""#, r#""password":7"#),
            (r#""carrier""#, r#""carrierz""#),
            (r#""safetyMarginSeconds":20"#, r#""safetyMarginSeconds":-1"#),
        ] {
            let line = LINE.replace(from, to);
            let err = NewProxy::from_json_line(&line, 0).unwrap_err().to_string();
            assert!(
                !err.contains("SECRETPW") && !err.contains("192.0.2"),
                "{err}"
            );
        }
        assert!(NewProxy::from_json_line("{", 0).is_err());
        assert!(NewProxy::from_json_line("[]", 0).is_err());
    }
}
