//! Writing straight into Redis, bypassing the scripts, as a damaged or
//! racing pool could hold it; and reading the index raw.

use serde_json::Value;

use super::Harness;

/// What [`plant`] writes.
#[derive(Debug, Clone, Copy)]
pub struct Planted {
    /// The record in `{pp}:proxies`.
    pub record: bool,
    /// Its entries in every index set.
    pub index: bool,
    /// Its `{pp}:expiry` entry.
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

/// A live record as the scripts store it (times in Unix ms), healthy,
/// AVAILABLE, http/shanghai/telecom/provider-a, for [`plant`].
pub fn raw_record(id: &str, expires: i64, checked_at: i64) -> Value {
    serde_json::json!({"id": id, "protocol": "http", "host": "192.0.2.99", "port": 1,
        "region": "shanghai", "carrier": "telecom", "upstream": "provider-a",
        "expiresAt": expires, "usableUntil": expires, "healthOk": true,
        "healthCheckedAt": checked_at, "status": "AVAILABLE", "epoch": 0,
        "active": 0, "reserved": 0})
}

/// Writes a record straight into Redis, bypassing the scripts, as a damaged
/// or racing pool could hold it: the record (split into its details and its
/// state, as `lua/prelude.lua` stores them), its entries in every index set
/// (the layout `lua/prelude.lua` describes, computed from the record's own
/// fields) and its expiry entry, each optional.
pub async fn plant(h: &Harness, rec: &Value, what: Planted) {
    use proxy_pool::pool::keys;
    let s = |f: &str| rec[f].as_str().unwrap_or_default().to_owned();
    let (id, p, r, c, u) = (
        s("id"),
        s("protocol"),
        s("region"),
        s("carrier"),
        s("upstream"),
    );
    let expires = rec["expiresAt"].as_i64().unwrap();
    let e = format!("{expires:013}");
    let mut pipe = redis::pipe();
    if what.record {
        let (mut details, mut state) = (serde_json::Map::new(), serde_json::Map::new());
        for (k, v) in rec.as_object().unwrap() {
            let into = if proxy_pool::pool::keys::DETAIL_FIELDS.contains(&k.as_str()) {
                &mut details
            } else {
                &mut state
            };
            into.insert(k.clone(), v.clone());
        }
        pipe.hset(keys::PROXIES, &id, Value::Object(details).to_string())
            .ignore()
            .hset(keys::STATE, &id, Value::Object(state).to_string())
            .ignore();
    }
    if what.index {
        let loc = format!("{p}|{r}|{c}|{u}|{e}|{id}");
        // The deadline under the harness's pool policy (lua/prelude.lua).
        let policy = h.pool.policy();
        let until = rec["usableUntil"].as_i64().unwrap_or(expires);
        let checked = rec["healthCheckedAt"].as_i64().unwrap_or(0);
        let d = until
            .min(expires - (policy.min_remaining_ttl.as_millis() as i64).max(1) + 1)
            .min(checked + policy.max_health_check_age.as_millis() as i64 + 1);
        let tail = format!("{d:013}|{e}|{id}");
        let atom = format!("{p}|{r}|{c}|{u}|");
        pipe.zadd(keys::IX_POOL, format!("{e}|{id}\t{p}|{r}|{c}|{u}"), 0)
            .ignore()
            .zadd(keys::IX_REGION, format!("{r}|{e}|{id}\t{p}|{c}|{u}"), 0)
            .ignore()
            .zadd(keys::IX_KIND, format!("{p}|{c}|{u}|{e}|{id}\t{r}"), 0)
            .ignore()
            .zadd(keys::IX_ATOM, &loc, 0)
            .ignore()
            .zadd(keys::IX_LIVE, format!("{e}|{id}\t{p}|{r}|{c}|{u}"), d)
            .ignore()
            .zadd(keys::IX_DREGION, format!("{r}|{tail}"), 0)
            .ignore()
            .zadd(keys::IX_DKIND, format!("{p}|{c}|{u}|{tail}"), 0)
            .ignore()
            .zadd(keys::IX_DATOM, format!("{atom}{tail}"), 0)
            .ignore()
            .hincr(keys::IX_ATOMS, &atom, 1)
            .ignore();
        let mut conn = h.redis().await;
        let known: bool = redis::cmd("HEXISTS")
            .arg(keys::IX_ATOMS)
            .arg(&atom)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !known {
            for (key, value) in [
                (keys::IX_PROTOCOLS, p.clone()),
                (keys::IX_REGIONS, r.clone()),
                (keys::IX_CARRIERS, c.clone()),
                (keys::IX_UPSTREAMS, u.clone()),
                (keys::IX_KINDS, format!("{p}|{c}|{u}")),
            ] {
                pipe.hincr(key, value, 1).ignore();
            }
        }
    }
    if what.expiry {
        pipe.zadd(keys::EXPIRY, &id, expires).ignore();
    }
    let mut conn = h.redis().await;
    let _: () = pipe.query_async(&mut conn).await.unwrap();
}

/// The locators in the atom family (read raw: works on a damaged pool too).
pub async fn index_locators(h: &Harness) -> Vec<String> {
    let mut conn = h.redis().await;
    redis::cmd("ZRANGE")
        .arg(proxy_pool::pool::keys::IX_ATOM)
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap()
}
