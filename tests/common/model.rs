//! The in-memory reference model of the pool: every operation of the Lua
//! scripts (`upsert`, `extract`, the contract), written plainly over ordered
//! maps, with the clock passed in. It is not a store anyone serves from (and
//! not part of the library the Lambda links): the differential property test
//! (`tests/model.rs`) runs random operation sequences against it and the
//! real scripts and requires identical results and identical pool state
//! ([`PoolState`], read from Redis by [`pool_state`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use proxy_pool::pool::{
    CommittedExtraction, ContractOp, ContractReply, ExtractionOutcome, ExtractionQuery,
    Fulfillment, NewProxy, PoolError, PooledProxy, RedisPool, UpsertStatus, Verdict, keys,
};

/// Everything the pool holds, in a comparable form.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolState {
    /// Every proxy by id: its details and state merged into one JSON object,
    /// or its tombstone `{"id","status":"EXTRACTED","expiresAt"}`.
    pub records: BTreeMap<String, Value>,
    /// The index: the locators `"<p>|<r>|<c>|<u>|<expiry, 13 digits>|<id>"`
    /// of every indexed proxy (in Redis, read from all six index sets, which
    /// must agree).
    pub index: BTreeSet<String>,
    /// `{pp}:held`.
    pub held: BTreeMap<String, String>,
    /// `{pp}:expiry`.
    pub expiry: BTreeMap<String, i64>,
}

/// Reads the whole pool (O(pool size)), and checks that the index sets
/// describe the same entries: each family member stands for a locator of the
/// atom family, `checked` holds every indexed locator at its record's health
/// time, `usable` those with a safety margin at their `usableUntil` (members
/// of entries no longer indexed may linger in both until they fall due).
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
    let mut sets = Vec::new();
    for key in [keys::IX_POOL, keys::IX_REGION, keys::IX_KIND, keys::IX_ATOM] {
        let members: Vec<String> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await?;
        sets.push(members);
    }
    let mut scored = Vec::new();
    for key in [keys::IX_USABLE, keys::IX_CHECKED] {
        let members: Vec<(String, i64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await?;
        scored.push(members);
    }
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
    let index: BTreeSet<String> = sets[3].iter().cloned().collect();
    let disagree = |what: &str| Err(PoolError::Internal(format!("index sets disagree: {what}")));
    for (family, members) in ["pool", "region", "kind"].iter().zip(&sets) {
        let locators: Option<BTreeSet<String>> =
            members.iter().map(|m| locator_from(family, m)).collect();
        if locators.as_ref() != Some(&index) {
            return disagree(family);
        }
    }
    let field = |loc: &str, name: &str| -> Option<i64> {
        let id = loc.rsplit('|').next()?;
        records.get(id)?.get(name)?.as_i64()
    };
    // Every indexed entry has its members in the time sets, at its
    // record's times; members of entries no longer indexed may linger
    // until they fall due.
    let checked: BTreeMap<&str, i64> = scored[1].iter().map(|(m, s)| (m.as_str(), *s)).collect();
    if index
        .iter()
        .any(|l| checked.get(l.as_str()).copied() != field(l, "healthCheckedAt"))
    {
        return disagree("checked");
    }
    let usable: BTreeMap<&str, i64> = scored[0].iter().map(|(m, s)| (m.as_str(), *s)).collect();
    for loc in &index {
        let until = field(loc, "usableUntil");
        let margin = until != field(loc, "expiresAt");
        if usable.get(loc.as_str()).copied() != until.filter(|_| margin) {
            return disagree("usable");
        }
    }
    // Every key lives until the latest expiry it describes (a key that
    // expired early would take live entries with it), and none lives forever.
    let expires = |loc: &str| -> i64 {
        let mut parts = loc.rsplit('|');
        parts.nth(1).and_then(|e| e.parse().ok()).unwrap_or(0)
    };
    let record_expiry = |id: &str| records.get(id).and_then(|r| r.get("expiresAt")?.as_i64());
    let latest_indexed = index.iter().map(|l| expires(l)).max();
    let latest_in = |members: &[(String, i64)]| members.iter().map(|(l, _)| expires(l)).max();
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
            keys::IX_USABLE => latest_in(&scored[0]),
            keys::IX_CHECKED => latest_in(&scored[1]),
            keys::IX_HINT => None,
            _ => latest_indexed, // the four families and the kinds they were planned from
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

    /// In the allocatable index: healthy and not held.
    fn indexed(&self) -> bool {
        self.health_ok
            && match self.status {
                Status::Available => self.owner.is_none(),
                Status::Drained => self.active == 0 && self.reserved == 0,
                _ => false,
            }
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
    entries: BTreeMap<String, Entry>,
    index: BTreeSet<String>,
    held: BTreeMap<String, String>,
    expiry: BTreeMap<String, i64>,
    /// Idempotency records: key -> (digest, result, expires at).
    idempotency: BTreeMap<String, (String, CommittedExtraction, i64)>,
}

impl MemoryPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
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
            if let Some(o) = old.as_ref().filter(|o| o.indexed()) {
                self.index.remove(&o.member());
            }
            if new.indexed() {
                self.index.insert(new.member());
            }
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
        let from = now + (q.min_remaining_ttl.as_millis() as i64).max(1);
        let health_cutoff = now - q.max_health_check_age.as_millis() as i64;
        // Index entries past their safety margin or health age: due, they
        // leave the index with this extraction, whatever it answers.
        let mut due = Vec::new();
        // Eligible entries in the scripts' order: by "<expiry>|<id>".
        let mut eligible: Vec<(String, Record)> = Vec::new();
        for member in &self.index {
            let id = member.rsplit('|').next().unwrap_or_default();
            let Some(Entry::Live(r)) = self.entries.get(id) else {
                continue;
            };
            let margin_passed = r.usable_until < r.expires_at && r.usable_until <= now;
            if margin_passed || r.health_checked_at < health_cutoff {
                due.push(member.clone());
            } else if r.expires_at >= from && matches(r) {
                eligible.push((format!("{:013}|{}", r.expires_at, r.id), (**r).clone()));
            }
        }
        eligible.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let available = eligible.len().saturating_sub(q.reserve as usize) as u32;
        let take = q.count.min(available) as usize;
        for member in due {
            self.index.remove(&member);
        }
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
        // An entry left indexed is (re)added: it may have left as due.
        if rec.indexed() {
            self.index.insert(rec.member());
        } else {
            self.index.remove(&rec.member());
        }
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
