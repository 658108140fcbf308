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
    /// Every proxy by id: its record as JSON (the model's [`Record`]
    /// fields), or its tombstone `{"id","status":"EXTRACTED","expiresAt"}`.
    pub records: BTreeMap<String, Value>,
    /// The index: the locator `"<p>|<r>|<c>|<u>|<expiry, 13 digits>|<id>"`
    /// of every indexed proxy and its deadline (in Redis, `{pp}:v4:ax`, with
    /// the deadline from `{pp}:v4:due`).
    pub index: BTreeMap<String, i64>,
    /// Proxies held by Workers (CLAIMED or DRAINING): id -> owner.
    pub held: BTreeMap<String, String>,
    /// Every record's expiry, tombstones too.
    pub expiry: BTreeMap<String, i64>,
    /// The Redis clock the state was read at (ms; 0 for the model's).
    pub read_at: i64,
}

impl PoolState {
    /// The index entries still ahead of their deadline at `now`: what an
    /// extraction could take. (A spent entry is out of the real index once
    /// a walk passed it or a drain took it; the model keeps it until an
    /// operation touches its record. Neither is ever handed out.)
    pub fn live_index(&self, now: i64) -> BTreeMap<String, i64> {
        self.index
            .iter()
            .filter(|(_, d)| **d > now)
            .map(|(l, d)| (l.clone(), *d))
            .collect()
    }
}

/// Entries a page of the reads below takes: each command stays far from
/// the pool's response timeout, however large the pool and busy the
/// machine (the state is read while nothing writes, so pages agree).
const PAGE: usize = 5_000;

/// A whole sorted set in index order (with its scores when `T` takes
/// them, `WITHSCORES`), read in pages.
async fn zrange_all<T: redis::FromRedisValue>(
    conn: &mut PoolConnection,
    key: &str,
    with_scores: bool,
) -> Result<Vec<T>, PoolError> {
    let mut out = Vec::new();
    loop {
        let mut cmd = redis::cmd("ZRANGE");
        cmd.arg(key).arg(out.len()).arg(out.len() + PAGE - 1);
        if with_scores {
            cmd.arg("WITHSCORES");
        }
        let page: Vec<T> = cmd.query_async(conn).await?;
        let last = page.len() < PAGE;
        out.extend(page);
        if last {
            return Ok(out);
        }
    }
}

async fn members(conn: &mut PoolConnection, key: &str) -> Result<Vec<String>, PoolError> {
    zrange_all(conn, key, false).await
}

async fn scored(conn: &mut PoolConnection, key: &str) -> Result<Vec<(String, f64)>, PoolError> {
    zrange_all(conn, key, true).await
}

/// A whole hash, read by `HSCAN` in pages.
async fn hash(conn: &mut PoolConnection, key: &str) -> Result<BTreeMap<String, String>, PoolError> {
    let mut out = BTreeMap::new();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
            .arg(key)
            .arg(cursor)
            .arg("COUNT")
            .arg(PAGE)
            .query_async(conn)
            .await?;
        out.extend(page);
        if next == 0 {
            return Ok(out);
        }
        cursor = next;
    }
}

/// One record as `lua/prelude/record.lua` writes it, as JSON, with its
/// locator, deadline and owner; `None` when it is not one.
fn decode_record(id: &str, raw: &str) -> Option<(Value, String, i64, Option<String>)> {
    let status = match raw.get(0..1)? {
        "A" => "AVAILABLE",
        "C" => "CLAIMED",
        "G" => "DRAINING",
        "R" => "DRAINED",
        _ => return None,
    };
    let health_ok = match raw.get(1..2)? {
        "1" => true,
        "0" => false,
        _ => return None,
    };
    let number = |range: std::ops::Range<usize>| raw.get(range)?.parse::<i64>().ok();
    let (d, usable, checked) = (number(2..15)?, number(15..28)?, number(28..41)?);
    let fields: Vec<&str> = raw.get(41..)?.split('\t').collect();
    let [loc, host, port, user, pass, epoch, active, reserved, owner] = fields.as_slice() else {
        return None;
    };
    let parts: Vec<&str> = loc.split('|').collect();
    let [p, r, c, u, e, locator_id] = parts.as_slice() else {
        return None;
    };
    if *locator_id != id || e.len() != 13 {
        return None;
    }
    let mut json = serde_json::json!({
        "id": id, "protocol": p, "host": host, "port": port.parse::<u16>().ok()?,
        "region": r, "carrier": c, "upstream": u, "expiresAt": e.parse::<i64>().ok()?,
        "usableUntil": usable, "healthOk": health_ok, "healthCheckedAt": checked,
        "status": status, "epoch": epoch.parse::<u64>().ok()?,
        "active": active.parse::<u32>().ok()?, "reserved": reserved.parse::<u32>().ok()?,
    });
    let fields = json.as_object_mut()?;
    for (name, value) in [("username", user), ("password", pass), ("owner", owner)] {
        if !value.is_empty() {
            fields.insert(name.into(), (*value).into());
        }
    }
    let owner = (!owner.is_empty()).then(|| (*owner).to_owned());
    Some((json, (*loc).to_owned(), d, owner))
}

/// Reads the whole pool (O(pool size)) and checks that every part of the
/// layout (`lua/prelude/index.lua`) describes the same records: `due` holds
/// each record's id once, in band 0 (its deadline) exactly when it is
/// in `ax`; every indexed record is allocatable and healthy; each
/// combination's counter and head are those of its slice of `ax`; `hd`
/// holds exactly the five heads of each combination with entries; the
/// grouping counters are the sums; `held` counts the records Workers hold;
/// every idempotency record has its due entry; and no pool key has a TTL.
pub async fn pool_state(pool: &RedisPool) -> Result<PoolState, PoolError> {
    let mut conn = pool.connection();
    let raw = hash(&mut conn, keys::RECORDS).await?;
    let due = scored(&mut conn, keys::DUE).await?;
    let ax = members(&mut conn, keys::INDEX).await?;
    let hd: BTreeSet<String> = members(&mut conn, keys::HEADS).await?.into_iter().collect();
    let counts = hash(&mut conn, keys::COUNTS).await?;
    let now: (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let read_at = now.0 * 1000 + now.1 / 1000;
    let disagree = |what: String| {
        Err(PoolError::Internal(format!(
            "pool layout disagrees: {what}"
        )))
    };

    let mut state = PoolState {
        read_at,
        ..PoolState::default()
    };
    let mut records: BTreeMap<String, (String, i64, bool, i64)> = BTreeMap::new(); // id -> (loc, D, allocatable+healthy, expiry)
    for (id, value) in &raw {
        let Some((json, loc, d, owner)) = decode_record(id, value) else {
            return disagree(format!("record {id} is not one"));
        };
        let status = json["status"].as_str().unwrap_or_default().to_owned();
        if let Some(e) = json["expiresAt"].as_i64() {
            state.expiry.insert(id.clone(), e);
        }
        if let (Some(owner), "CLAIMED" | "DRAINING") = (owner, status.as_str()) {
            state.held.insert(id.clone(), owner);
        }
        let takeable =
            matches!(status.as_str(), "AVAILABLE" | "DRAINED") && json["healthOk"] == true;
        let expiry = json["expiresAt"].as_i64().unwrap_or(-1);
        records.insert(id.clone(), (loc, d, takeable, expiry));
        state.records.insert(id.clone(), json);
    }
    // due: each record's id once; band 0 (counted) at its deadline for
    // what is indexed: every entry in ax, and spent ones a walk passed.
    let ax_set: BTreeSet<&String> = ax.iter().collect();
    let mut tombstones = 0;
    for (id, score) in &due {
        let Some((loc, d, takeable, expiry)) = records.get(id) else {
            // A tombstone: its member alone, in band 1 (1e13 + its expiry).
            if *score < 1e13 {
                return disagree(format!("due entry {id} is counted but has no record"));
            }
            let expires = *score as i64 - 10_000_000_000_000;
            let json = serde_json::json!({"id": id, "status": "EXTRACTED", "expiresAt": expires});
            state.records.insert(id.clone(), json);
            state.expiry.insert(id.clone(), expires);
            tombstones += 1;
            continue;
        };
        if *score < 1e13 {
            if *score as i64 != *d || !takeable {
                return disagree(format!("counted {loc}: due {score}, deadline {d}"));
            }
            if !ax_set.contains(loc) && *d > read_at {
                return disagree(format!("{loc} is eligible but not in ax"));
            }
            state.index.insert(loc.clone(), *d);
        } else if *score as i64 != 10_000_000_000_000 + *expiry {
            return disagree(format!("{id} is not indexed, yet due scores it {score}"));
        }
    }
    if due.len() != records.len() + tombstones {
        return disagree(format!(
            "due has {} entries for {} records and {tombstones} tombstones",
            due.len(),
            records.len()
        ));
    }
    if ax.iter().any(|l| !state.index.contains_key(l)) {
        return disagree("ax holds a locator that is not counted".into());
    }
    // Per combination: its count (band 0) and head (ax); the five heads; the
    // grouping sums "<entries>|<combinations with a head>".
    let split_atom = |loc: &str| -> (String, String) {
        let parts: Vec<&str> = loc.split('|').collect();
        (parts[..4].join("|"), format!("{}|{}", parts[4], parts[5]))
    };
    let mut atoms: BTreeMap<String, (u64, Option<String>)> = BTreeMap::new();
    for loc in state.index.keys() {
        atoms.entry(split_atom(loc).0).or_insert((0, None)).0 += 1;
    }
    for loc in &ax {
        let (atom, key) = split_atom(loc);
        let head = &mut atoms.entry(atom).or_insert((0, None)).1;
        if head.is_none() {
            *head = Some(key);
        }
    }
    let mut want_counts: BTreeMap<String, String> = BTreeMap::new();
    let mut want_heads: BTreeSet<String> = BTreeSet::new();
    let mut groupings: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (atom, (n, head)) in &atoms {
        let [p, r, c, u]: [&str; 4] = atom
            .split('|')
            .collect::<Vec<_>>()
            .try_into()
            .unwrap_or(["", "", "", ""]);
        want_counts.insert(
            atom.clone(),
            format!("{}\t{n}", head.as_deref().unwrap_or("")),
        );
        for g in [
            format!("P|{p}"),
            format!("R|{p}|{r}"),
            format!("C|{p}|{c}"),
            format!("U|{p}|{u}"),
        ] {
            let sum = groupings.entry(g).or_default();
            sum.0 += n;
            sum.1 += u64::from(head.is_some());
        }
        if let Some(head) = head {
            let tail = format!("{head}|{atom}");
            for prefix in [
                "G|".to_owned(),
                format!("P|{p}|"),
                format!("R|{p}|{r}|"),
                format!("C|{p}|{c}|"),
                format!("U|{p}|{u}|"),
            ] {
                want_heads.insert(format!("{prefix}{tail}"));
            }
        }
    }
    // Each dimension's values per protocol: exactly those with a counter.
    let mut want_values: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for g in groupings.keys() {
        let mut parts = g.splitn(3, '|');
        if let (Some(letter @ ("R" | "C" | "U")), Some(p), Some(v)) =
            (parts.next(), parts.next(), parts.next())
        {
            want_values
                .entry(format!("V|{letter}|{p}"))
                .or_default()
                .insert(v.to_owned());
        }
    }
    for (g, (n, a)) in groupings {
        want_counts.insert(g, format!("{n}|{a}"));
    }
    if !state.held.is_empty() {
        want_counts.insert("held".into(), state.held.len().to_string());
    }
    let mut have_counts = counts.clone();
    let meta = have_counts.remove("meta");
    // Written with the meta, so that cnt is a hash table from the start.
    let encoding_note = have_counts.remove("enc");
    let have_values: BTreeMap<String, BTreeSet<String>> = counts
        .iter()
        .filter(|(k, _)| k.starts_with("V|"))
        .map(|(k, v)| {
            have_counts.remove(k);
            (
                k.clone(),
                v.split('\n').skip(1).map(str::to_owned).collect(),
            )
        })
        .collect();
    if have_values != want_values {
        return disagree(format!(
            "value lists: want {want_values:?}, have {have_values:?}"
        ));
    }
    if !raw.is_empty()
        && meta.as_deref() != Some(&format!("{}|{}", keys::LAYOUT, pool.policy().script_arg()))
    {
        return disagree(format!("meta is {meta:?}"));
    }
    if meta.is_some() && encoding_note.as_ref().is_none_or(|note| note.len() <= 64) {
        return disagree(format!(
            "meta without a note over 64 bytes: {encoding_note:?}"
        ));
    }
    if have_counts != want_counts {
        let diff: Vec<_> = want_counts
            .iter()
            .filter(|(k, v)| have_counts.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: want {v}, have {:?}", have_counts.get(k)))
            .chain(
                have_counts
                    .iter()
                    .filter(|(k, _)| !want_counts.contains_key(*k))
                    .map(|(k, v)| format!("{k}: want none, have {v}")),
            )
            .take(6)
            .collect();
        return disagree(format!("counts: {}", diff.join("; ")));
    }
    if hd != want_heads {
        let extra: Vec<_> = hd.difference(&want_heads).take(3).collect();
        let missing: Vec<_> = want_heads.difference(&hd).take(3).collect();
        return disagree(format!("heads: extra {extra:?}, missing {missing:?}"));
    }
    // Idempotency records and their due entries.
    let idem: Vec<String> = redis::cmd("HKEYS")
        .arg(keys::IDEMPOTENCY)
        .query_async(&mut conn)
        .await?;
    let idem_due: BTreeSet<String> = members(&mut conn, keys::IDEMPOTENCY_DUE)
        .await?
        .into_iter()
        .collect();
    if idem.iter().cloned().collect::<BTreeSet<_>>() != idem_due {
        return disagree("idempotency records and their due entries".into());
    }
    // No pool key carries a TTL: an eviction policy could take it.
    for key in keys::POOL {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await?;
        if at >= 0 {
            return disagree(format!("{key} has a TTL"));
        }
    }
    Ok(state)
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
    /// (`lua/prelude/record.lua`).
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
            read_at: 0,
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
        let f = q.filters;
        let upstreams = f.upstreams(q.permitted_upstreams);
        let matches = |r: &Record| {
            wanted(&f.protocols, &r.protocol)
                && wanted(&f.regions, &r.region)
                && wanted(&f.carriers, &r.carrier)
                && (upstreams.as_ref()).is_none_or(|u| u.contains(&&r.upstream))
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
                behind_backlog: false,
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
