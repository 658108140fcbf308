//! Writing straight into Redis, bypassing the scripts, as a damaged or
//! racing pool could hold it; and reading the index raw.

use serde_json::Value;

use super::Harness;

/// What [`plant`] writes.
#[derive(Debug, Clone, Copy)]
pub struct Planted {
    /// The record in `{pp}:v4:rec`.
    pub record: bool,
    /// Its index entry: `ax`, `due` at its deadline, its combination's
    /// counter and head, its grouping counters and `hd` heads.
    pub index: bool,
    /// Its `due` entry when it is not indexed (1e13 + its expiry).
    pub expiry: bool,
}

impl Planted {
    /// Record, index entries and expiry entry.
    pub const ALL: Self = Self {
        record: true,
        index: true,
        expiry: true,
    };
}

/// A live record as JSON (times in Unix ms), healthy, AVAILABLE,
/// http/shanghai/telecom/provider-a, for [`plant`].
pub fn raw_record(id: &str, expires: i64, checked_at: i64) -> Value {
    serde_json::json!({"id": id, "protocol": "http", "host": "192.0.2.99", "port": 1,
        "region": "shanghai", "carrier": "telecom", "upstream": "provider-a",
        "expiresAt": expires, "usableUntil": expires, "healthOk": true,
        "healthCheckedAt": checked_at, "status": "AVAILABLE", "epoch": 0,
        "active": 0, "reserved": 0})
}

/// A JSON field as the record's text: a string's contents, a number's digits
/// (a value of another type as its JSON: a damaged record).
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// The record string `lua/prelude/record.lua` stores for `rec` (as
/// [`raw_record`] shapes it), its locator and deadline under `h`'s policy.
pub fn encode_record(h: &Harness, rec: &Value) -> (String, String, i64) {
    let s = |f: &str| text(&rec[f]);
    let n = |f: &str| rec[f].as_i64().unwrap_or(0);
    let expires = n("expiresAt");
    let policy = h.pool.policy();
    let d = n("usableUntil")
        .min(expires - (policy.min_remaining_ttl.as_millis() as i64).max(1) + 1)
        .min(n("healthCheckedAt") + policy.max_health_check_age.as_millis() as i64 + 1)
        .max(0);
    let loc = format!(
        "{}|{}|{}|{}|{:013}|{}",
        s("protocol"),
        s("region"),
        s("carrier"),
        s("upstream"),
        expires,
        s("id")
    );
    let status = match s("status").as_str() {
        "AVAILABLE" => "A",
        "CLAIMED" => "C",
        "DRAINING" => "G",
        "DRAINED" => "R",
        _ => "?",
    };
    let record = format!(
        "{status}{}{d:013}{:013}{:013}{loc}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
        if rec["healthOk"] == true { '1' } else { '0' },
        n("usableUntil").max(0),
        n("healthCheckedAt"),
        s("host"),
        s("port"),
        s("username"),
        s("password"),
        s("epoch"),
        s("active"),
        s("reserved"),
        s("owner"),
    );
    (record, loc, d)
}

/// Writes a record straight into Redis, bypassing the scripts, as a damaged
/// or racing pool could hold it: the record, its index entry (with the
/// counters and heads the scripts would keep for it) and its `due` entry,
/// each optional.
pub async fn plant(h: &Harness, rec: &Value, what: Planted) {
    use proxy_pool::pool::keys;
    let (record, loc, d) = encode_record(h, rec);
    let id = text(&rec["id"]);
    let mut conn = h.redis().await;
    let mut pipe = redis::pipe();
    if what.record {
        pipe.hset(keys::RECORDS, &id, &record).ignore();
    }
    if what.index {
        let parts: Vec<&str> = loc.split('|').collect();
        let atom = parts[..4].join("|");
        let key = format!("{}|{}", parts[4], parts[5]);
        let (p, r, c, u) = (parts[0], parts[1], parts[2], parts[3]);
        let old: Option<String> = redis::cmd("HGET")
            .arg(keys::COUNTS)
            .arg(&atom)
            .query_async(&mut conn)
            .await
            .unwrap();
        let (n, head) = match old.as_deref().and_then(|o| o.split_once('\t')) {
            Some((head, n)) => (
                n.parse::<u64>().unwrap_or(0),
                (!head.is_empty()).then(|| head.to_owned()),
            ),
            None => (0, None),
        };
        let heads = |k: &str| {
            let tail = format!("{k}|{atom}");
            [
                format!("G|{tail}"),
                format!("P|{p}|{tail}"),
                format!("R|{p}|{r}|{tail}"),
                format!("C|{p}|{c}|{tail}"),
                format!("U|{p}|{u}|{tail}"),
            ]
        };
        let new_head = match &head {
            Some(h) if h.as_str() < key.as_str() => h.clone(),
            _ => key.clone(),
        };
        if head.as_deref() != Some(new_head.as_str()) {
            if let Some(old) = &head {
                for m in heads(old) {
                    pipe.zrem(keys::HEADS, m).ignore();
                }
            }
            for m in heads(&new_head) {
                pipe.zadd(keys::HEADS, m, 0).ignore();
            }
        }
        pipe.zadd(keys::INDEX, &loc, 0)
            .ignore()
            .zadd(keys::DUE, &id, d)
            .ignore()
            .hset(keys::COUNTS, &atom, format!("{new_head}\t{}", n + 1))
            .ignore();
        // Grouping counters "<entries>|<combinations with a head>".
        for g in [
            format!("P|{p}"),
            format!("R|{p}|{r}"),
            format!("C|{p}|{c}"),
            format!("U|{p}|{u}"),
        ] {
            let old: Option<String> = redis::cmd("HGET")
                .arg(keys::COUNTS)
                .arg(&g)
                .query_async(&mut conn)
                .await
                .unwrap();
            let (n, a) = old
                .as_deref()
                .and_then(|o| o.split_once('|'))
                .map_or((0, 0), |(n, a)| {
                    (n.parse::<u64>().unwrap_or(0), a.parse::<u64>().unwrap_or(0))
                });
            let a = a + u64::from(head.is_none());
            if old.is_none()
                && let Some((letter @ ("R" | "C" | "U"), rest)) = g.split_once('|')
                && let Some((p, v)) = rest.split_once('|')
            {
                // A value new to the pool joins its dimension's list.
                let list = format!("V|{letter}|{p}");
                let values: Option<String> = redis::cmd("HGET")
                    .arg(keys::COUNTS)
                    .arg(&list)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                pipe.hset(
                    keys::COUNTS,
                    list,
                    format!("{}\n{v}", values.unwrap_or_default()),
                )
                .ignore();
            }
            pipe.hset(keys::COUNTS, &g, format!("{}|{a}", n + 1))
                .ignore();
        }
    } else if what.expiry {
        let expires = rec["expiresAt"].as_i64().unwrap_or(0);
        pipe.zadd(keys::DUE, &id, 10_000_000_000_000i64 + expires)
            .ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
}

/// The locators in the index (read raw: works on a damaged pool too).
pub async fn index_locators(h: &Harness) -> Vec<String> {
    let mut conn = h.redis().await;
    redis::cmd("ZRANGE")
        .arg(proxy_pool::pool::keys::INDEX)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap()
}

/// The status a stored record says (`lua/prelude/record.lua`): `AVAILABLE`,
/// `CLAIMED`, `DRAINING`, `DRAINED` or `?`.
pub fn status_of(raw: &str) -> &'static str {
    match raw.get(0..1) {
        Some("A") => "AVAILABLE",
        Some("C") => "CLAIMED",
        Some("G") => "DRAINING",
        Some("R") => "DRAINED",
        _ => "?",
    }
}

/// The status Redis holds for proxy `id`: its record's ([`status_of`]), or
/// `EXTRACTED` when it has no record and its `due` member is in band 1 (a
/// tombstone); `None` when Redis holds neither.
pub async fn stored_status(
    conn: &mut (impl redis::aio::ConnectionLike + Send),
    id: &str,
) -> Option<&'static str> {
    let (raw, due): (Option<String>, Option<f64>) = redis::pipe()
        .hget(proxy_pool::pool::keys::RECORDS, id)
        .zscore(proxy_pool::pool::keys::DUE, id)
        .query_async(conn)
        .await
        .unwrap();
    match (raw, due) {
        (Some(raw), _) => Some(status_of(&raw)),
        (None, Some(score)) if score >= 1e13 => Some("EXTRACTED"),
        _ => None,
    }
}
