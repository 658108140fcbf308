-- prelude.lua: the pool's rules, defined once, so every script names the
-- keys, reads the clock, judges records and writes the index the same way.
-- It heads the function library every script is a function of (loaded once
-- with FUNCTION LOAD: its definitions are made once, not on every call),
-- and is joined in front of each pool script run by EVALSHA where Redis
-- Functions are refused (src/pool/scripts.rs). Its top level therefore only
-- defines: the call's keys are bound by bind_keys.
--
-- Every pool script takes the same twenty keys first (KEYS[1..20], below),
-- then its own extra keys, and its first argument is the caller's policy
-- (ARGV[1], see pool_policy). All keys share the hash tag {pp}: one slot.
--
-- A proxy is two values under its id (times in Unix ms):
--   {pp}:proxies  its details, exactly the response's fields:
--                 {id, protocol, host, port, username?, password?, region,
--                 carrier, upstream, expiresAt}; deleted the moment the
--                 proxy is handed out, so no address or credential outlives
--                 its extraction in Redis
--   {pp}:state    the pool's view of it: {usableUntil, healthOk,
--                 healthCheckedAt, status, owner?, epoch, active, reserved}
--                 (status AVAILABLE, CLAIMED, DRAINING, DRAINED), or once
--                 extracted the tombstone {status: "EXTRACTED", expiresAt},
--                 kept until its expiry so the proxy can never come back.
-- Scripts that need both see one merged record (decode_record).
--
-- The pool policy. One pool has one (maxHealthCheckAge A, minRemainingTTL
-- m), recorded in {pp}:policy by the first write and kept as long as the
-- pool holds anything; a caller configured otherwise is refused with an
-- error "POLICY <pool's A>|<pool's m>" before anything is read or written.
-- With it, every record has one deadline, the instant it stops being
-- eligible without any further write:
--   D = min(usableUntil, expiresAt - max(m, 1) + 1, healthCheckedAt + A + 1)
-- so rules 1, 3 and 4 are the one comparison `now < D` at the Redis clock.
--
-- The index holds every live record that is allocatable (AVAILABLE with no
-- owner, or DRAINED with Active = Reserved = 0), whose last health check
-- passed and whose D was still ahead when it was written. An entry whose D
-- has passed since stays in the index (as "spent" until prune takes it out);
-- every count and every walk leaves it out by its deadline. A record's
-- place is its locator
--   "<protocol>|<region>|<carrier>|<upstream>|<expiresAt, 13 digits>|<id>"
-- The index is two kinds of sorted set:
--   live      score D, member the entry's member in the pool family (below):
--             every indexed entry. It is the index: an entry is indexed
--             exactly when it is here, and its score is the D its other
--             members were written with.
--   By deadline (lex, all scores 0), one slice per value of the family's
--   dimensions, sorted by D: exact counts of what is eligible (ZLEXCOUNT
--   from "<slice><now + 1>"), whatever was spent and never pruned.
--     dregion "<r>|<D>|<expiry>|<id>"
--     dkind   "<p>|<c>|<u>|<D>|<expiry>|<id>"
--     datom   "<p>|<r>|<c>|<u>|<D>|<expiry>|<id>"
--     (the whole pool's count is `live`'s ZCOUNT from now)
--   By expiry (lex), the same slices sorted by expiry, then id: the order
--   extraction hands proxies out in (first-expired, first-out).
--     pool    "<expiry>|<id>\t<p>|<r>|<c>|<u>"   every entry, expiry order
--     region  "<r>|<expiry>|<id>\t<p>|<c>|<u>"
--     kind    "<p>|<c>|<u>|<expiry>|<id>\t<r>"
--     atom    "<p>|<r>|<c>|<u>|<expiry>|<id>"    (= the locator)
--   An expiry family may lack an entry that is spent (a walk that passed it
--   took it out of that family only); every eligible entry is in all four.
-- Counts that tell extraction which slices exist (so it never plans from
-- what a request names, and leaves nothing behind for a value no entry has):
--   atoms  HASH "<p>|<r>|<c>|<u>|" (the combination's slice) -> its indexed entries
--   vp, vr, vc, vu  HASH value -> combinations (atoms) with that protocol,
--          region, carrier, upstream
--   kinds  HASH "<p>|<c>|<u>" -> combinations of that kind
--   hint   HASH "<slice>" -> a lower bound of the slice's first
--          "<expiry>|<id>" ("~": none left at the last walk); orders the
--          probes of a many-slice extraction, never decides what it takes.
--          A slice has a hint exactly while it has entries.

-- The pool keys by name (K.proxies, ...), bound to the call's KEYS[1..20]
-- in this order by bind_keys, the first thing every pool script does.
local K = {}
local POOL_KEYS = {
  'proxies',       -- HASH id -> details JSON
  'state',         -- HASH id -> state JSON or tombstone
  'expiry',        -- ZSET id -> expiresAt ms: every proxy and tombstone, for pruning
  'held',          -- HASH id -> Worker id, while CLAIMED or DRAINING
  'pool',          -- ZSET (lex) by expiry
  'region',        -- ZSET (lex) by expiry
  'kind',          -- ZSET (lex) by expiry
  'atom',          -- ZSET (lex) by expiry
  'live',          -- ZSET D -> pool-family member: the index
  'dregion',       -- ZSET (lex) by deadline
  'dkind',         -- ZSET (lex) by deadline
  'datom',         -- ZSET (lex) by deadline
  'hint',          -- HASH slice -> lower bound of its first entry (a slice's
                   --   "|" count names its family: region 1, kind 3, atom 4)
  'atoms',         -- HASH "<p>|<r>|<c>|<u>|" -> indexed entries
  'vp',            -- HASH protocol -> combinations
  'vr',            -- HASH region -> combinations
  'vc',            -- HASH carrier -> combinations
  'vu',            -- HASH upstream -> combinations
  'kinds',         -- HASH "<p>|<c>|<u>" -> combinations
  'policy',        -- STRING "<A ms>|<m ms>"
}
local function bind_keys(keys)
  for i = 1, #POOL_KEYS do K[POOL_KEYS[i]] = keys[i] end
end
local POOL_KEY_COUNT = #POOL_KEYS
local FAMILIES = {'pool', 'region', 'kind', 'atom'}
local DFAMILY = {region = 'dregion', kind = 'dkind', atom = 'datom'}
local DKEYS = {'dregion', 'dkind', 'datom'}   -- (their order in members_of's slices)

-- Largest `count` an extraction may ask for, and the most arguments any one
-- command is sent (Lua's unpack limit is ~8000).
local MAX_COUNT = 1000
local CHUNK = 1000
local MAX_MS = 9999999999999
local MAX_EPOCH = 9007199254740992   -- 2^53
local MAX_U32 = 4294967296

-- The one clock: Redis TIME, in ms, as a number and as its decimal string
-- (built from TIME's own strings: a number-to-string conversion is one of
-- the costlier things a script does).
local function clock()
  local t = redis.call('TIME')
  local ms = string.sub('00000' .. t[2], -6, -4)
  local text = t[1] .. ms
  return tonumber(text), text
end

local function pad13(ms)
  return string.format('%013d', ms)
end

local function absent(v)
  return v == nil or v == cjson.null
end

local function is_int(v, lo, hi)
  return type(v) == 'number' and v == math.floor(v) and v >= lo and v <= hi
end

-- The pool policy (see the header). `arg` is the caller's "<A>|<m>" (ms).
-- Returns A, m and whether the pool has yet to record it (the caller's
-- writes then include it: record_policy); raises "POLICY <pool's>" when
-- the pool recorded another one, before anything is read or written.
local POLICY_A, POLICY_M
local function pool_policy(arg)
  local a, m = string.match(arg or '', '^(%d+)|(%d+)$')
  a, m = tonumber(a), tonumber(m)
  if not (is_int(a, 0, MAX_MS) and is_int(m, 0, MAX_MS)) then
    error({err = 'ERR bad pool policy argument'})
  end
  local recorded = redis.call('GET', K.policy)
  if recorded and recorded ~= arg then
    error({err = 'POLICY ' .. recorded})
  end
  POLICY_A, POLICY_M = a, m
  return a, m, not recorded
end

-- Region, carrier, upstream: no "|" (the locator's separator), no control
-- characters, at most 64 bytes. Region and carrier may be "" (unknown).
local function is_name(v)
  return type(v) == 'string' and #v <= 64 and not string.find(v, '[|%c]')
end

local function is_secret(v)
  return absent(v) or (type(v) == 'string' and #v <= 256 and not string.find(v, '%c'))
end

local PROTOCOL = {http = true, https = true, socks5 = true}
local STATUS = {AVAILABLE = true, CLAIMED = true, DRAINING = true, DRAINED = true}

-- A live record every script may rely on: each field a response or a rule needs.
local function well_formed(rec)
  return type(rec) == 'table'
    and type(rec.id) == 'string' and #rec.id >= 1 and #rec.id <= 128
    and not string.find(rec.id, '[^%w%._:~%-]')
    and PROTOCOL[rec.protocol] == true
    and type(rec.host) == 'string' and #rec.host >= 1 and #rec.host <= 253
    and not string.find(rec.host, '[%s%c/@]')
    and is_int(rec.port, 1, 65535)
    and is_secret(rec.username) and is_secret(rec.password)
    and is_name(rec.region) and is_name(rec.carrier) and is_name(rec.upstream) and #rec.upstream > 0
    and is_int(rec.expiresAt, 1, MAX_MS) and is_int(rec.usableUntil, -MAX_MS, MAX_MS)
    and rec.usableUntil <= rec.expiresAt
    and type(rec.healthOk) == 'boolean' and is_int(rec.healthCheckedAt, -MAX_MS, MAX_MS)
    and STATUS[rec.status] == true and (absent(rec.owner) or type(rec.owner) == 'string')
    and is_int(rec.epoch, 0, MAX_EPOCH) and is_int(rec.active, 0, MAX_U32)
    and is_int(rec.reserved, 0, MAX_U32)
end

-- The fields the details hold.
local DETAIL_FIELDS = {id = true, protocol = true, host = true, port = true, username = true,
                       password = true, region = true, carrier = true, upstream = true,
                       expiresAt = true}

-- The cheap checks extraction makes of a proxy it is about to hand out
-- (upsert.lua validated it in full when it was written): the details are
-- the response's fields, each of the type the response needs, and nothing
-- else; the state has what the rules read.
local function sound_details(d)
  if not (type(d.id) == 'string' and type(d.protocol) == 'string'
          and type(d.host) == 'string' and #d.host > 0
          and type(d.port) == 'number' and d.port % 1 == 0 and d.port >= 1 and d.port <= 65535
          and (d.username == nil or type(d.username) == 'string')
          and (d.password == nil or type(d.password) == 'string')
          and type(d.region) == 'string' and type(d.carrier) == 'string'
          and type(d.upstream) == 'string' and type(d.expiresAt) == 'number') then
    return false
  end
  for field in pairs(d) do
    if not DETAIL_FIELDS[field] then return false end
  end
  return true
end

local function sound_state(st)
  return type(st.usableUntil) == 'number' and type(st.healthCheckedAt) == 'number'
    and type(st.status) == 'string' and (st.owner == nil or type(st.owner) == 'string')
end

local function decode_table(raw)
  if not raw then return nil end
  local ok, value = pcall(cjson.decode, raw)
  if ok and type(value) == 'table' then return value end
  return nil
end

-- One proxy as every script but extraction sees it: its two values merged
-- into one record (well-formed, or nil), or a tombstone {id, status, expiresAt}.
local function decode_record(id, details_raw, state_raw)
  local st = decode_table(state_raw)
  if not st then return nil end
  if st.status == 'EXTRACTED' then
    if is_int(st.expiresAt, 0, MAX_MS) then return {id = id, status = 'EXTRACTED', expiresAt = st.expiresAt} end
    return nil
  end
  local d = decode_table(details_raw)
  if not d then return nil end
  for field, value in pairs(d) do
    if not DETAIL_FIELDS[field] then return nil end
    st[field] = value
  end
  if st.owner == cjson.null then st.owner = nil end
  if st.username == cjson.null then st.username = nil end
  if st.password == cjson.null then st.password = nil end
  if not well_formed(st) or st.id ~= id then return nil end
  return st
end

-- Rule 2: no Worker owner, or drained with nothing active or reserved.
local function allocatable(rec)
  if rec.status == 'AVAILABLE' then return rec.owner == nil end
  if rec.status == 'DRAINED' then return rec.active == 0 and rec.reserved == 0 end
  return false
end

-- The record's deadline under the pool policy (see the header).
local function deadline(rec)
  return math.min(rec.usableUntil, rec.expiresAt - math.max(POLICY_M, 1) + 1,
                  rec.healthCheckedAt + POLICY_A + 1)
end

-- Live, allocatable, last health check passed: what extraction (and a
-- Worker's claim) may take, time rules aside.
local function takeable(rec)
  return rec ~= nil and rec.status ~= 'EXTRACTED' and rec.healthOk == true and allocatable(rec)
end

-- Belongs in the index at `now`: takeable, deadline ahead.
local function indexable(rec, now)
  return takeable(rec) and deadline(rec) > now
end

-- The two values of a live record.
local function details_json(rec)
  return cjson.encode({
    id = rec.id, protocol = rec.protocol, host = rec.host, port = rec.port,
    username = rec.username, password = rec.password, region = rec.region,
    carrier = rec.carrier, upstream = rec.upstream, expiresAt = rec.expiresAt,
  })
end

local function state_json(rec)
  return cjson.encode({
    usableUntil = rec.usableUntil, healthOk = rec.healthOk, healthCheckedAt = rec.healthCheckedAt,
    status = rec.status, owner = rec.owner, epoch = rec.epoch, active = rec.active,
    reserved = rec.reserved,
  })
end

-- `e` the expiry as 13 digits (no leading zero after 2001-09-09).
local function tombstone_json(e)
  if string.byte(e) == 48 then e = tostring(tonumber(e)) end
  return '{"status":"EXTRACTED","expiresAt":' .. e .. '}'
end

-- Locators.
local function locator_of(rec)
  return rec.protocol .. '|' .. rec.region .. '|' .. rec.carrier .. '|' .. rec.upstream
    .. '|' .. pad13(rec.expiresAt) .. '|' .. rec.id
end

local LOCATOR = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(%d%d%d%d%d%d%d%d%d%d%d%d%d)|([^|%c]+)$'
-- p, r, c, u, expiry (13 digits), id; nil when `loc` is not a locator.
local function split_locator(loc)
  return string.match(loc, LOCATOR)
end

-- The slice of `family` an entry of (p, r, c, u) belongs to: the prefix of
-- its members in that family's two sets.
local function slice_of(family, p, r, c, u)
  if family == 'pool' then return '' end
  if family == 'region' then return r .. '|' end
  if family == 'kind' then return p .. '|' .. c .. '|' .. u .. '|' end
  return p .. '|' .. r .. '|' .. c .. '|' .. u .. '|'
end

-- An entry's member in the pool family (and in `live`), for a split locator.
local function pool_member(p, r, c, u, e, id)
  return e .. '|' .. id .. '\t' .. p .. '|' .. r .. '|' .. c .. '|' .. u
end

-- An entry's members in the four expiry families, in FAMILIES order (pool,
-- region, kind, atom), then its kind and atom slices (with "<r>|", the
-- prefixes of its deadline-family members), all built once.
local function members_of(p, r, c, u, e, id)
  local key = e .. '|' .. id
  local kind, atom = slice_of('kind', p, r, c, u), slice_of('atom', p, r, c, u)
  return pool_member(p, r, c, u, e, id), r .. '|' .. key .. '\t' .. p .. '|' .. c .. '|' .. u,
    kind .. key .. '\t' .. r, atom .. key, kind, atom
end

-- The locator a member of expiry family `family` stands for (nil if it is not one).
-- (Each part as the locator has it, the expiry 13 digits: what matches is
-- a locator's parts, so the locator built from them needs no second check.)
local MEMBER = {
  pool = '^(%d%d%d%d%d%d%d%d%d%d%d%d%d)|([^|%c]+)\t([^|]*)|([^|]*)|([^|]*)|([^|]*)$',
  region = '^([^|]*)|(%d%d%d%d%d%d%d%d%d%d%d%d%d)|([^|%c]+)\t([^|]*)|([^|]*)|([^|]*)$',
  kind = '^([^|]*)|([^|]*)|([^|]*)|(%d%d%d%d%d%d%d%d%d%d%d%d%d)|([^|%c]+)\t([^|]*)$',
}
local function locator_from(family, member)
  if family == 'atom' then
    return split_locator(member) and member or nil
  end
  local a, b, c, d, e, f = string.match(member, MEMBER[family])
  if not a then return nil end
  local loc
  if family == 'pool' then loc = c .. '|' .. d .. '|' .. e .. '|' .. f .. '|' .. a .. '|' .. b
  elseif family == 'region' then loc = d .. '|' .. a .. '|' .. e .. '|' .. f .. '|' .. b .. '|' .. c
  else loc = a .. '|' .. f .. '|' .. b .. '|' .. c .. '|' .. d .. '|' .. e end
  return loc
end

-- Writes, collected while reading and applied at the end in chunks, so a
-- script finishes every read and check before its first write. Removals
-- go first, then additions, each key in the order first touched.
local PHASE = {zrem = 1, hdel = 2, zadd = 3, hset = 4}
local COMMAND = {'ZREM', 'HDEL', 'ZADD', 'HSET'}
local STEP = {1, 1, 2, 2}
local TYPE_OF = {'zset', 'hash', 'zset', 'hash'}

-- `atoms`: combination -> net change of its indexed entries (index/unindex).
local function new_writes()
  return {lists = {{}, {}, {}, {}}, keys = {{}, {}, {}, {}}, atoms = {}, atom_order = {}}
end

-- Adds one argument (or a pair: score and member, field and value) of `op` on `key`.
local function push(writes, op, key, a, b)
  local phase = PHASE[op]
  local lists = writes.lists[phase]
  local list = lists[key]
  if not list then
    list = {}
    lists[key] = list
    local keys = writes.keys[phase]
    keys[#keys + 1] = key
  end
  list[#list + 1] = a
  if b ~= nil then list[#list + 1] = b end
end

-- `atom`: the combination's slice "<p>|<r>|<c>|<u>|".
local function count_atom(writes, atom, delta)
  local n = writes.atoms[atom]
  if n == nil then writes.atom_order[#writes.atom_order + 1] = atom end
  writes.atoms[atom] = (n or 0) + delta
end

-- Takes an indexed entry (split locator, its D as 13 digits) out of the
-- index. `skip` names an expiry family whose member the caller removes
-- itself (by a range). Removing an absent member is a no-op.
local function unindex_parts(writes, p, r, c, u, e, id, d13, skip)
  local pool, region, kind, atom, kind_slice, atom_slice = members_of(p, r, c, u, e, id)
  if skip ~= 'pool' then push(writes, 'zrem', K.pool, pool) end
  if skip ~= 'region' then push(writes, 'zrem', K.region, region) end
  if skip ~= 'kind' then push(writes, 'zrem', K.kind, kind) end
  if skip ~= 'atom' then push(writes, 'zrem', K.atom, atom) end
  push(writes, 'zrem', K.live, pool)
  local tail = d13 .. '|' .. e .. '|' .. id
  push(writes, 'zrem', K.dregion, r .. '|' .. tail)
  push(writes, 'zrem', K.dkind, kind_slice .. tail)
  push(writes, 'zrem', K.datom, atom_slice .. tail)
  count_atom(writes, atom_slice, -1)
end

-- Puts a record into the index with deadline `d`; `was` is the D13 of the
-- members its locator `loc` already has (nil if none): those move.
local function index_parts(writes, p, r, c, u, e, id, d, was)
  local pool, region, kind, atom, kind_slice, atom_slice = members_of(p, r, c, u, e, id)
  push(writes, 'zadd', K.pool, '0', pool)
  push(writes, 'zadd', K.region, '0', region)
  push(writes, 'zadd', K.kind, '0', kind)
  push(writes, 'zadd', K.atom, '0', atom)
  local d13 = pad13(d)
  push(writes, 'zadd', K.live, d13, pool)
  local key = '|' .. e .. '|' .. id
  for i, slice in ipairs({r .. '|', kind_slice, atom_slice}) do
    local dkey = K[DKEYS[i]]
    if was and was ~= d13 then push(writes, 'zrem', dkey, slice .. was .. key) end
    push(writes, 'zadd', dkey, '0', slice .. d13 .. key)
  end
  if not was then count_atom(writes, atom_slice, 1) end
end

-- A hint above an entry indexed now comes down to it, so extraction keeps
-- first-expired, first-out; a slice without one gets one (so a many-slice
-- extraction never has to probe a slice blind). `locs`: the locators this
-- call indexes.
local function lower_hints(writes, locs)
  local lowest, fields = {}, {}
  for _, loc in ipairs(locs) do
    local p, r, c, u, e, id = split_locator(loc)
    local key = e .. '|' .. id
    for _, family in ipairs({'region', 'kind', 'atom'}) do
      local field = slice_of(family, p, r, c, u)
      if lowest[field] == nil then fields[#fields + 1] = field end
      if lowest[field] == nil or key < lowest[field] then lowest[field] = key end
    end
  end
  for i = 1, #fields, CHUNK do
    local part = {unpack(fields, i, math.min(i + CHUNK - 1, #fields))}
    local old = redis.call('HMGET', K.hint, unpack(part))
    for j, field in ipairs(part) do
      if not old[j] or lowest[field] < old[j] then push(writes, 'hset', K.hint, field, lowest[field]) end
    end
  end
end

-- The member of `live` for a locator: its member in the pool family.
local function live_member(loc)
  local p, r, c, u, e, id = split_locator(loc)
  return p and pool_member(p, r, c, u, e, id) or ''
end

-- The D (13 digits) the index holds `loc` at, or nil when it is not indexed.
local function indexed_at(loc)
  local score = redis.call('ZSCORE', K.live, live_member(loc))
  if not score then return nil end
  return pad13(tonumber(score))
end

-- The same for each of `locs` (false for none), by ZMSCORE in chunks.
local function indexed_at_each(locs)
  local out = {}
  local asked, at = {}, {}
  for i, loc in ipairs(locs) do
    if loc then asked[#asked + 1] = live_member(loc); at[#asked] = i end
  end
  for i = 1, #asked, CHUNK do
    local scores = redis.call('ZMSCORE', K.live, unpack(asked, i, math.min(i + CHUNK - 1, #asked)))
    for j, score in ipairs(scores) do
      if score then out[at[i + j - 1]] = pad13(tonumber(score)) end
    end
  end
  return out
end

-- Moves a record's index entry from what it was (`old_loc` indexed at
-- `was`, either may be nil) to what `rec` now is at `now`.
local function reindex(writes, old_loc, was, rec, now)
  local new_loc = indexable(rec, now) and locator_of(rec) or nil
  if old_loc and was and old_loc ~= new_loc then
    local p, r, c, u, e, id = split_locator(old_loc)
    if p then unindex_parts(writes, p, r, c, u, e, id, was) end
    was = nil
  end
  if new_loc then
    local p, r, c, u, e, id = split_locator(new_loc)
    index_parts(writes, p, r, c, u, e, id, deadline(rec), was)
  end
  return new_loc
end

-- The combination counts and the value counts under them, after the
-- writes' net changes: reads them (before any write), then plans a HSET or
-- HDEL of each. A combination that appears or empties moves its protocol,
-- region, carrier, upstream and kind counts, and an emptied slice's hints
-- go. Returns nil, or an error reply for a count that is not a number.
local function plan_counts(writes)
  local order = writes.atom_order
  if #order == 0 then return nil end
  local current = redis.call('HMGET', K.atoms, unpack(order))
  local moved = {}     -- value key -> {field -> delta}
  local function move(key, field, delta)
    local m = moved[key]
    if not m then m = {order = {}}; moved[key] = m end
    if m[field] == nil then m.order[#m.order + 1] = field end
    m[field] = (m[field] or 0) + delta
  end
  local gone = {}      -- hint fields to delete
  for i, atom in ipairs(order) do
    local was = tonumber(current[i] or '0')
    if not was then return redis.error_reply('ERR damaged pool: a count is not a number') end
    local now = was + writes.atoms[atom]
    if now ~= was then
      if now > 0 then push(writes, 'hset', K.atoms, atom, tostring(now)) else push(writes, 'hdel', K.atoms, atom) end
      if (was > 0) ~= (now > 0) then
        local delta = now > 0 and 1 or -1
        local p, r, c, u = string.match(atom, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|$')
        move(K.vp, p, delta); move(K.vr, r, delta); move(K.vc, c, delta); move(K.vu, u, delta)
        move(K.kinds, p .. '|' .. c .. '|' .. u, delta)
        if delta < 0 then gone[#gone + 1] = atom end
      end
    end
  end
  for _, key in ipairs({K.vp, K.vr, K.vc, K.vu, K.kinds}) do
    local m = moved[key]
    if m then
      local counts = redis.call('HMGET', key, unpack(m.order))
      for i, field in ipairs(m.order) do
        local was = tonumber(counts[i] or '0')
        if not was then return redis.error_reply('ERR damaged pool: a count is not a number') end
        local now = math.max(0, was + m[field])
        if now > 0 then push(writes, 'hset', key, field, tostring(now)) else push(writes, 'hdel', key, field) end
        if now == 0 and key == K.vr then gone[#gone + 1] = field .. '|' end
        if now == 0 and key == K.kinds then gone[#gone + 1] = field .. '|' end
      end
    end
  end
  if #gone == 0 then return nil end
  local dead = {}
  for _, field in ipairs(gone) do
    dead[field] = true
    push(writes, 'hdel', K.hint, field)
  end
  -- A hint this call would set for a slice it empties is not set.
  local sets = writes.lists[PHASE.hset][K.hint]
  if sets then
    local kept = {}
    for i = 1, #sets, 2 do
      if not dead[sets[i]] then kept[#kept + 1] = sets[i]; kept[#kept + 1] = sets[i + 1] end
    end
    writes.lists[PHASE.hset][K.hint] = kept
  end
  return nil
end

-- Applies the writes. Nothing here can fail once the key types are known
-- (expect_types) and every argument list is chunked.
local function apply(writes)
  for phase = 1, 4 do
    local chunk = CHUNK - CHUNK % STEP[phase]
    for _, key in ipairs(writes.keys[phase]) do
      local args = writes.lists[phase][key]
      for i = 1, #args, chunk do   -- (an emptied list sends nothing)
        redis.call(COMMAND[phase], key, unpack(args, i, math.min(i + chunk - 1, #args)))
      end
    end
  end
end

-- Refuses to write into a key of the wrong type: checked before the first
-- write, since a failed command half way through the writes is what no
-- script may ever do. `known` lists keys a typed read already proved.
local function expect_types(writes, known)
  local want = {}
  for phase = 1, 4 do
    for _, key in ipairs(writes.keys[phase]) do want[key] = TYPE_OF[phase] end
  end
  for key in pairs(known or {}) do want[key] = nil end
  for key, kind in pairs(want) do
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= kind then
      return redis.error_reply('ERR damaged pool: a pool key has the wrong type')
    end
  end
  return nil
end

-- Plans the counts, checks every key's type, applies: the end of every
-- writing script. Returns nil, or the error reply that refused it.
local function commit(writes, known)
  local refused = plan_counts(writes)
  if refused then return refused end
  refused = expect_types(writes, known)
  if refused then return refused end
  apply(writes)
  return nil
end

-- Key lifetimes: no key outlives the latest expiry it describes, nor dies
-- before it. Read before the writes; `raise` is applied after them.
local function lifetimes(keys)
  local at = {}
  for i, key in ipairs(keys) do at[i] = redis.call('PEXPIRETIME', key) end
  return at
end

-- Raises each key's expiry to `latest`. A key that `writes` both removed
-- from and added to may have been emptied and created again by them: Redis
-- deletes an emptied key with its expiry, so the new one would have none
-- (it would outlive its entries, and a later `raise` would bring it down to
-- that call's own `latest`, below the entries it still holds, which would
-- then vanish with it). Such a key gets back the expiry it had, which
-- covered every entry it held.
local function raise(keys, at, latest, writes)
  local removed, refilled = {}, {}
  for phase = 1, 2 do
    for _, key in ipairs(writes.keys[phase]) do removed[key] = true end
  end
  for phase = 3, 4 do
    for _, key in ipairs(writes.keys[phase]) do
      if removed[key] then refilled[key] = true end
    end
  end
  for i, key in ipairs(keys) do
    if at[i] < latest then
      redis.call('PEXPIREAT', key, latest)
    elseif refilled[key] then
      redis.call('PEXPIREAT', key, at[i])
    end
  end
end
