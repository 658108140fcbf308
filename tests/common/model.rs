//! The in-memory reference model of the pool: every operation of the Lua
//! scripts (`upsert`, `extract`, the contract), written plainly over ordered
//! maps, with the clock passed in. It is not a store anyone serves from (and
//! not part of the library the Lambda links): the differential property test
//! (`tests/model.rs`) runs random operation sequences against it and the
//! real scripts and requires identical results and identical pool state
//! ([`PoolState`], read from Redis by [`pool_state`]).
//!
//! Over 600 lines on purpose: it mirrors the scripts operation by operation
//! and the pool state reader that compares the two; split, a change to one
//! script would have to be followed across files.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use proxy_pool::pool::{
    CommittedExtraction, ContractOp, ContractReply, ExtractionOutcome, ExtractionQuery,
    Fulfillment, NewProxy, PoolConnection, PoolError, PoolPolicy, PooledProxy, RedisPool,
    UpsertStatus, Verdict, keys,
};

/// Everything the pool holds, in a comparable form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Every proxy by id: its details and state merged into one JSON object,
    /// or its tombstone `{"id","status":"EXTRACTED","expiresAt"}`.
    pub records: BTreeMap<String, Value>,
    /// The index: the locator `"<p>|<r>|<c>|<u>|<expiry, 13 digits>|<id>"`
    /// of every indexed proxy and its deadline (in Redis, `{pp}:ix:live`,
    /// which the deadline families must agree with exactly, the expiry
    /// families on every entry whose deadline is ahead, and the counts of
    /// what exists on every combination).
    pub index: BTreeMap<String, i64>,
    /// `{pp}:held`.
    pub held: BTreeMap<String, String>,
    /// `{pp}:expiry`.
    pub expiry: BTreeMap<String, i64>,
}

async fn members(conn: &mut PoolConnection, key: &str) -> Result<Vec<String>, PoolError> {
    Ok(redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(conn)
        .await?)
}

async fn hash(conn: &mut PoolConnection, key: &str) -> Result<BTreeMap<String, i64>, PoolError> {
    Ok(redis::cmd("HGETALL").arg(key).query_async(conn).await?)
}

/// Reads the whole pool (O(pool size)), and checks that the index sets
/// describe the same entries: the deadline families hold exactly `live`'s
/// entries at their deadlines; each expiry family holds only indexed
/// entries and every one whose deadline is ahead of the Redis clock (a
/// spent one may have left a family a walk passed it in); the counts are
/// those of the index; hints exist only for slices that hold entries; and
/// every key lives as long as what it describes.
pub async fn pool_state(pool: &RedisPool) -> Result<PoolState, PoolError> {
    let mut conn = pool.connection();
    let details: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys::PROXIES)
        .query_async(&mut conn)
        .await?;
    let states: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys::STATE)
        .query_async(&mut conn)
        .await?;
    let live: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys::IX_LIVE)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    let now: (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now = now.0 * 1000 + now.1 / 1000;
    let held: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys::HELD)
        .query_async(&mut conn)
        .await?;
    let expiry: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(keys::EXPIRY)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    let json = |v: &str| serde_json::from_str(v).unwrap_or(Value::String(v.to_owned()));
    let mut records: BTreeMap<String, Value> = BTreeMap::new();
    for (id, state) in &states {
        let mut record = json(state);
        if let Some(fields) = record.as_object_mut() {
            if fields.get("status").and_then(Value::as_str) == Some("EXTRACTED") {
                fields.insert("id".into(), id.as_str().into());
            } else if let Some(Value::Object(d)) = details.get(id).map(|d| json(d)) {
                fields.extend(d);
            }
        }
        records.insert(id.clone(), record);
    }
    // Details without a state, or left after an extraction, show as such.
    for (id, d) in &details {
        let extracted = records
            .get(id)
            .is_none_or(|r| r.get("status").and_then(Value::as_str) == Some("EXTRACTED"));
        if extracted {
            records.insert(format!("{id} (details left over)"), json(d));
        }
    }
    // `live` holds each entry by its member in the pool family.
    let index: BTreeMap<String, i64> = live
        .into_iter()
        .map(|(m, d)| (locator_from("pool", &m).unwrap_or(m), d))
        .collect();
    let disagree = |what: &str| Err(PoolError::Internal(format!("index sets disagree: {what}")));
    let split = |loc: &str| -> Option<[String; 6]> {
        let parts: Vec<&str> = loc.split('|').collect();
        let [p, r, c, u, e, id] = parts.as_slice() else {
            return None;
        };
        Some([p, r, c, u, e, id].map(|s| (*s).to_owned()))
    };
    // The deadline families: exactly the index.
    for (key, slice) in [
        (
            keys::IX_DREGION,
            (|[_, r, _, _]: [&str; 4]| format!("{r}|")) as fn([&str; 4]) -> String,
        ),
        (keys::IX_DKIND, |[p, _, c, u]| format!("{p}|{c}|{u}|")),
        (keys::IX_DATOM, |[p, r, c, u]| format!("{p}|{r}|{c}|{u}|")),
    ] {
        let want: BTreeSet<String> = index
            .iter()
            .filter_map(|(loc, d)| {
                let [p, r, c, u, e, id] = split(loc)?;
                Some(format!("{}{d:013}|{e}|{id}", slice([&p, &r, &c, &u])))
            })
            .collect();
        let have: BTreeSet<String> = members(&mut conn, key).await?.into_iter().collect();
        if have != want {
            return disagree(key);
        }
    }
    // The expiry families: within the index, and every entry still ahead
    // of its deadline. (A spent entry a walk passed may have left one; each
    // family's key lives as long as the entries it holds.)
    let mut latest_in_family: BTreeMap<&str, Option<i64>> = BTreeMap::new();
    for family in ["pool", "region", "kind", "atom"] {
        let key = match family {
            "pool" => keys::IX_POOL,
            "region" => keys::IX_REGION,
            "kind" => keys::IX_KIND,
            _ => keys::IX_ATOM,
        };
        let have: Option<BTreeSet<String>> = members(&mut conn, key)
            .await?
            .iter()
            .map(|m| locator_from(family, m))
            .collect();
        let Some(have) = have else {
            return disagree(key);
        };
        if have.iter().any(|l| !index.contains_key(l))
            || index.iter().any(|(l, d)| *d > now && !have.contains(l))
        {
            return disagree(key);
        }
        latest_in_family.insert(
            key,
            have.iter()
                .filter_map(|l| split(l)?[4].parse::<i64>().ok())
                .max(),
        );
    }
    // The counts: entries per combination, combinations per value and kind.
    let mut atoms: BTreeMap<String, i64> = BTreeMap::new();
    for loc in index.keys() {
        if let Some([p, r, c, u, _, _]) = split(loc) {
            *atoms.entry(format!("{p}|{r}|{c}|{u}|")).or_default() += 1;
        }
    }
    if hash(&mut conn, keys::IX_ATOMS).await? != atoms {
        return disagree("atoms");
    }
    let mut values: [BTreeMap<String, i64>; 5] = Default::default();
    for atom in atoms.keys() {
        let [p, r, c, u]: [&str; 4] = atom
            .trim_end_matches('|')
            .split('|')
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or(["", "", "", ""]);
        for (i, v) in [p, r, c, u].into_iter().enumerate() {
            *values[i].entry(v.to_owned()).or_default() += 1;
        }
        *values[4].entry(format!("{p}|{c}|{u}")).or_default() += 1;
    }
    for (key, want) in [
        keys::IX_PROTOCOLS,
        keys::IX_REGIONS,
        keys::IX_CARRIERS,
        keys::IX_UPSTREAMS,
        keys::IX_KINDS,
    ]
    .into_iter()
    .zip(&values)
    {
        if &hash(&mut conn, key).await? != want {
            return disagree(key);
        }
    }
    // A hint for every slice that holds entries, and for no other (a
    // slice's "|" count names its family: region 1, kind 3, atom 4).
    let hints: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(keys::IX_HINT)
        .query_async(&mut conn)
        .await?;
    let slices: BTreeSet<String> = values[1]
        .keys()
        .map(|r| format!("{r}|"))
        .chain(values[4].keys().map(|k| format!("{k}|")))
        .chain(atoms.keys().cloned())
        .collect();
    if hints.keys().cloned().collect::<BTreeSet<_>>() != slices {
        return disagree("hints");
    }
    // Every key lives until the latest expiry it describes (a key that
    // expired early would take live entries with it), and none lives forever.
    let record_expiry = |id: &str| records.get(id).and_then(|r| r.get("expiresAt")?.as_i64());
    let latest_indexed = index
        .keys()
        .filter_map(|l| split(l)?[4].parse::<i64>().ok())
        .max();
    for key in keys::POOL {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        let needed = match key {
            keys::PROXIES => details.keys().filter_map(|id| record_expiry(id)).max(),
            keys::STATE => states.keys().filter_map(|id| record_expiry(id)).max(),
            keys::EXPIRY => expiry.iter().map(|(_, e)| *e).max(),
            keys::HELD => held.keys().filter_map(|id| record_expiry(id)).max(),
            keys::IX_HINT | keys::POLICY => None,
            key if latest_in_family.contains_key(key) => latest_in_family[key],
            _ => latest_indexed, // the index sets and the counts of what they hold
        };
        match at {
            -2 => {}
            -1 => return disagree(&format!("{key} has no expiry")),
            at if needed.is_some_and(|n| at < n) => {
                return disagree(&format!("{key} expires at {at}, before {needed:?}"));
            }
            _ => {}
        }
    }
    Ok(PoolState {
        records,
        index,
        held,
        expiry: expiry.into_iter().collect(),
    })
}

/// The locator a member of an index family stands for (see `lua/prelude.lua`).
fn locator_from(family: &str, member: &str) -> Option<String> {
    if family == "atom" {
        return Some(member.to_owned());
    }
    let (head, tail) = member.split_once('\t')?;
    let head: Vec<&str> = head.split('|').collect();
    let tail: Vec<&str> = tail.split('|').collect();
    let [p, r, c, u, e, id] = match (family, head.as_slice(), tail.as_slice()) {
        ("pool", [e, id], [p, r, c, u]) => [p, r, c, u, e, id],
        ("region", [r, e, id], [p, c, u]) => [p, r, c, u, e, id],
        ("kind", [p, c, u, e, id], [r]) => [p, r, c, u, e, id],
        _ => return None,
    };
    Some(format!("{p}|{r}|{c}|{u}|{e}|{id}"))
}

/// A live proxy record, field for field as the scripts store it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    id: String,
    protocol: String,
    host: String,
    port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    username: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    password: Option<String>,
    region: String,
    carrier: String,
    upstream: String,
    expires_at: i64,
    usable_until: i64,
    health_ok: bool,
    health_checked_at: i64,
    status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    epoch: u64,
    active: u32,
    reserved: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum Status {
    Available,
    Claimed,
    Draining,
    Drained,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Live(Box<Record>),
    /// Handed to a client: only its id and expiry remain.
    Extracted {
        expires_at: i64,
    },
}

impl Record {
    fn bucket(&self) -> String {
        format!(
            "{}|{}|{}|{}",
            self.protocol, self.region, self.carrier, self.upstream
        )
    }

    fn member(&self) -> String {
        format!("{}|{:013}|{}", self.bucket(), self.expires_at, self.id)
    }

    /// Takeable: healthy and not held (the time rules aside).
    fn indexed(&self) -> bool {
        self.health_ok
            && match self.status {
                Status::Available => self.owner.is_none(),
                Status::Drained => self.active == 0 && self.reserved == 0,
                _ => false,
            }
    }

    /// The instant it stops being eligible under `policy`
    /// (`lua/prelude.lua`).
    fn deadline(&self, policy: &PoolPolicy) -> i64 {
        let age = policy.max_health_check_age.as_millis() as i64;
        let ttl = (policy.min_remaining_ttl.as_millis() as i64).max(1);
        self.usable_until
            .min(self.expires_at - ttl + 1)
            .min(self.health_checked_at + age + 1)
    }

    fn pooled(&self) -> PooledProxy {
        PooledProxy {
            id: self.id.clone(),
            protocol: self.protocol.clone(),
            host: self.host.clone(),
            port: self.port,
            username: self.username.clone(),
            password: self.password.clone(),
            region: self.region.clone(),
            carrier: self.carrier.clone(),
            upstream: self.upstream.clone(),
            expires_at: self.expires_at,
        }
    }
}

/// The reference model. Every operation takes the clock (Unix ms) the real
/// script decided at.
#[derive(Debug, Clone, Default)]
pub struct MemoryPool {
    policy: PoolPolicy,
    entries: BTreeMap<String, Entry>,
    /// Locator -> deadline.
    index: BTreeMap<String, i64>,
    held: BTreeMap<String, String>,
    expiry: BTreeMap<String, i64>,
    /// Idempotency records: key -> (digest, result, expires at).
    idempotency: BTreeMap<String, (String, CommittedExtraction, i64)>,
}

impl MemoryPool {
    /// An empty pool under `policy`.
    pub fn new(policy: PoolPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Moves a record's index entry from what `old` had to what `new` is at
    /// `now`: indexed when takeable with its deadline ahead.
    fn reindex(&mut self, old: Option<&Record>, new: Option<&Record>, now: i64) {
        if let Some(o) = old {
            self.index.remove(&o.member());
        }
        if let Some(n) = new {
            let d = n.deadline(&self.policy);
            if n.indexed() && d > now {
                self.index.insert(n.member(), d);
            }
        }
    }

    /// The pool's state, as [`pool_state`] reads the real one.
    pub fn state(&self) -> PoolState {
        PoolState {
            records: self
                .entries
                .iter()
                .map(|(id, e)| {
                    let v = match e {
                        Entry::Live(r) => serde_json::to_value(r).unwrap_or(Value::Null),
                        Entry::Extracted { expires_at } => serde_json::json!({
                            "id": id, "status": "EXTRACTED", "expiresAt": expires_at
                        }),
                    };
                    (id.clone(), v)
                })
                .collect(),
            index: self.index.clone(),
            held: self.held.clone(),
            expiry: self.expiry.clone(),
        }
    }

    /// `lua/upsert.lua`.
    pub fn upsert(&mut self, proxies: &[NewProxy], now: i64) -> Vec<UpsertStatus> {
        let mut statuses = Vec::with_capacity(proxies.len());
        for p in proxies {
            let old = match self.entries.get(&p.id) {
                Some(Entry::Extracted { expires_at }) if *expires_at > now => {
                    statuses.push(UpsertStatus::Extracted);
                    continue;
                }
                Some(Entry::Live(r)) => Some((**r).clone()),
                _ => None,
            };
            if p.usable_until <= now || p.expires_at <= now {
                statuses.push(UpsertStatus::Expired);
                continue;
            }
            let mut new = Record {
                id: p.id.clone(),
                protocol: p.protocol.clone(),
                host: p.host.clone(),
                port: p.port,
                username: p.username.clone(),
                password: p.password.clone(),
                region: p.region.clone(),
                carrier: p.carrier.clone(),
                upstream: p.upstream.clone(),
                expires_at: p.expires_at,
                usable_until: p.usable_until,
                health_ok: p.health_ok,
                health_checked_at: p.health_checked_at,
                status: Status::Available,
                owner: None,
                epoch: 0,
                active: 0,
                reserved: 0,
            };
            statuses.push(match &old {
                Some(o) => {
                    new.status = o.status;
                    new.owner = o.owner.clone();
                    new.epoch = o.epoch;
                    new.active = o.active;
                    new.reserved = o.reserved;
                    UpsertStatus::Refreshed
                }
                None => UpsertStatus::Added,
            });
            self.reindex(old.as_ref(), Some(&new), now);
            self.expiry.insert(new.id.clone(), new.expires_at);
            self.entries
                .insert(new.id.clone(), Entry::Live(Box::new(new)));
        }
        statuses
    }

    /// `lua/extract.lua`.
    pub fn extract(&mut self, q: &ExtractionQuery<'_>, now: i64) -> ExtractionOutcome {
        if let Some(scope) = &q.idempotency
            && let Some((digest, result, expires_at)) = self.idempotency.get(&scope.key)
            && *expires_at > now
        {
            return if *digest == scope.digest {
                ExtractionOutcome::Replayed(result.clone())
            } else {
                ExtractionOutcome::KeyReused
            };
        }
        let wanted = |list: &[String], v: &str| list.is_empty() || list.iter().any(|w| w == v);
        let s = &q.selection;
        let matches = |r: &Record| {
            wanted(s.protocols, &r.protocol)
                && wanted(s.regions, &r.region)
                && wanted(s.carriers, &r.carrier)
                && s.upstreams.is_none_or(|u| u.contains(&r.upstream))
        };
        // Eligible: indexed, deadline ahead, matching; in the scripts'
        // order, by "<expiry>|<id>". Spent entries stay indexed (prune
        // removes them), whatever the extraction answers.
        let mut eligible: Vec<(String, Record)> = Vec::new();
        for (member, d) in &self.index {
            let id = member.rsplit('|').next().unwrap_or_default();
            let Some(Entry::Live(r)) = self.entries.get(id) else {
                continue;
            };
            if *d > now && matches(r) {
                eligible.push((format!("{:013}|{}", r.expires_at, r.id), (**r).clone()));
            }
        }
        eligible.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let available = eligible.len().saturating_sub(q.reserve as usize) as u32;
        let take = q.count.min(available) as usize;
        if q.fulfillment == Fulfillment::AllOrNothing && take < q.count as usize {
            return ExtractionOutcome::Insufficient {
                available: u64::from(available),
                at_ms: now,
            };
        }
        let mut proxies = Vec::with_capacity(take);
        for (_, record) in eligible.into_iter().take(take) {
            self.index.remove(&record.member());
            proxies.push(record.pooled());
            self.entries.insert(
                record.id.clone(),
                Entry::Extracted {
                    expires_at: record.expires_at,
                },
            );
        }
        let result = CommittedExtraction {
            request_id: q.request_id.to_owned(),
            requested: q.count,
            extracted_at: now,
            proxies,
        };
        if let Some(scope) = &q.idempotency {
            self.idempotency.insert(
                scope.key.clone(),
                (
                    scope.digest.clone(),
                    result.clone(),
                    now + scope.ttl.as_millis() as i64,
                ),
            );
        }
        ExtractionOutcome::Committed(result)
    }

    /// `lua/contract.lua`.
    pub fn apply(&mut self, op: &ContractOp, now: i64) -> ContractReply {
        let reply = |verdict, epoch| ContractReply {
            verdict,
            at_ms: now,
            epoch,
        };
        let id = op.id().to_owned();
        let mut rec = match self.entries.get(&id) {
            None => return reply(Verdict::Unknown, 0),
            Some(Entry::Extracted { .. }) => return reply(Verdict::Extracted, 0),
            Some(Entry::Live(r)) => (**r).clone(),
        };
        let was_indexed = rec.indexed();
        let before = rec.clone();
        let epoch = rec.epoch;
        if let ContractOp::Remove { .. } = op {
            self.index.remove(&rec.member());
            self.entries.remove(&id);
            self.held.remove(&id);
            self.expiry.remove(&id);
            return reply(Verdict::Ok, 0);
        }
        if rec.expires_at <= now {
            return reply(Verdict::Expired, epoch);
        }
        let holds = |rec: &Record, worker: &str, e: u64| {
            rec.owner.as_deref() == Some(worker) && rec.epoch == e
        };
        match op {
            ContractOp::Health { ok, checked_at, .. } => {
                let at = checked_at.unwrap_or(now);
                if at < rec.health_checked_at {
                    return reply(Verdict::Stale, epoch);
                }
                rec.health_ok = *ok;
                rec.health_checked_at = at;
            }
            ContractOp::Claim {
                worker,
                min_remaining_ttl,
                max_health_check_age,
                ..
            } => {
                let eligible = was_indexed
                    && rec.usable_until > now
                    && rec.expires_at - now >= min_remaining_ttl.as_millis() as i64
                    && rec.health_checked_at >= now - max_health_check_age.as_millis() as i64;
                if !eligible {
                    return reply(Verdict::Ineligible, epoch);
                }
                rec.epoch += 1;
                rec.status = Status::Claimed;
                rec.owner = Some(worker.clone());
                rec.active = 0;
                rec.reserved = 0;
            }
            ContractOp::Drain {
                worker, epoch: e, ..
            } => {
                if !holds(&rec, worker, *e) {
                    return reply(Verdict::NotOwner, epoch);
                }
                if !matches!(rec.status, Status::Claimed | Status::Draining) {
                    return reply(Verdict::State, epoch);
                }
                rec.status = Status::Draining;
            }
            ContractOp::Ack {
                worker,
                epoch: e,
                active,
                reserved,
                ..
            } => {
                if !holds(&rec, worker, *e) {
                    return reply(Verdict::NotOwner, epoch);
                }
                if !matches!(rec.status, Status::Draining | Status::Drained) {
                    return reply(Verdict::State, epoch);
                }
                rec.active = *active;
                rec.reserved = *reserved;
                rec.status = if *active == 0 && *reserved == 0 {
                    Status::Drained
                } else {
                    Status::Draining
                };
            }
            ContractOp::Release {
                worker, epoch: e, ..
            } => {
                if !holds(&rec, worker, *e) {
                    return reply(Verdict::NotOwner, epoch);
                }
                if rec.status != Status::Drained {
                    return reply(Verdict::State, epoch);
                }
                rec.epoch += 1;
                rec.status = Status::Available;
                rec.owner = None;
                rec.active = 0;
                rec.reserved = 0;
            }
            ContractOp::Remove { .. } => unreachable!("handled above"),
        }
        // The entry follows the record: (re)indexed at its new deadline, or out.
        self.reindex(Some(&before), Some(&rec), now);
        match (rec.status, &rec.owner) {
            (Status::Claimed | Status::Draining, Some(owner)) => {
                self.held.insert(id.clone(), owner.clone());
            }
            _ => {
                self.held.remove(&id);
            }
        }
        let epoch = rec.epoch;
        self.entries.insert(id, Entry::Live(Box::new(rec)));
        reply(Verdict::Ok, epoch)
    }
}
