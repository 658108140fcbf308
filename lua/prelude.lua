-- prelude.lua: the pool's rules, defined once. It is joined in front of
-- every script when the script is loaded (after the script's `#!lua` line),
-- so every script names the keys, reads the clock, judges records and
-- writes the index the same way.
--
-- Every pool script takes the same twelve keys first (KEYS[1..12], below),
-- then its own extra keys. All share the hash tag {pp}: one cluster slot.
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
-- The index holds every live record that is allocatable (AVAILABLE with no
-- owner, or DRAINED with Active = Reserved = 0) and whose last health check
-- passed. A record's place in it is its locator
--   "<protocol>|<region>|<carrier>|<upstream>|<expiresAt, 13 digits>|<id>"
-- and it appears once in each of six sorted sets:
--   pool    "<expiry>|<id>\t<p>|<r>|<c>|<u>"      every entry, expiry order
--   region  "<r>|<expiry>|<id>\t<p>|<c>|<u>"      one slice per region
--   kind    "<p>|<c>|<u>|<expiry>|<id>\t<r>"      one slice per (protocol, carrier, upstream)
--   atom    "<p>|<r>|<c>|<u>|<expiry>|<id>"       one slice per combination (= the locator)
--   usable  score usableUntil, member locator     only records with a safety margin
--   checked score healthCheckedAt, member locator
-- (The time sets may also hold members of entries no longer indexed: they
-- are left behind by removals and dropped when they fall due.)
-- A slice is a lexicographic range (all members score 0), sorted by expiry
-- then id. Every member carries the whole locator, so any one of them says
-- where the entry sits in all the others. The time rules are not in the
-- index: extraction reads them from ranges (expiry) and from usable/checked,
-- whose due entries it removes before it counts.

local K = {
  proxies = KEYS[1],  -- HASH id -> details JSON
  state = KEYS[2],    -- HASH id -> state JSON or tombstone
  expiry = KEYS[3],   -- ZSET id -> expiresAt ms: every proxy and tombstone, for pruning
  held = KEYS[4],     -- HASH id -> Worker id, while CLAIMED or DRAINING
  pool = KEYS[5],     -- ZSET (lex)
  region = KEYS[6],   -- ZSET (lex)
  kind = KEYS[7],     -- ZSET (lex)
  atom = KEYS[8],     -- ZSET (lex)
  usable = KEYS[9],   -- ZSET usableUntil -> locator
  checked = KEYS[10], -- ZSET healthCheckedAt -> locator
  hint = KEYS[11],    -- HASH "<family>:<slice>" -> lower bound "<expiry>|<id>" of the
                      --   slice's first entry ("~": empty); orders the probes of a
                      --   many-slice extraction, never decides what it may take
  kinds = KEYS[12],   -- HASH "<p>|<c>|<u>" -> "1": every kind ever indexed (grows only)
}
local POOL_KEY_COUNT = 12
local FAMILIES = {'pool', 'region', 'kind', 'atom'}

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

-- In the index: live, allocatable, last health check passed. (The time
-- rules are checked against the clock by whoever reads the index.)
local function indexed(rec)
  return rec ~= nil and rec.status ~= 'EXTRACTED' and rec.healthOk == true and allocatable(rec)
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

-- The member of `family` for a split locator, and the slice it belongs to.
local function member_in(family, p, r, c, u, e, id)
  local key = e .. '|' .. id
  if family == 'pool' then return key .. '\t' .. p .. '|' .. r .. '|' .. c .. '|' .. u, '' end
  if family == 'region' then return r .. '|' .. key .. '\t' .. p .. '|' .. c .. '|' .. u, r .. '|' end
  if family == 'kind' then
    local slice = p .. '|' .. c .. '|' .. u .. '|'
    return slice .. key .. '\t' .. r, slice
  end
  local slice = p .. '|' .. r .. '|' .. c .. '|' .. u .. '|'
  return slice .. key, slice
end

-- The locator a member of `family` stands for (nil if it is not one).
local MEMBER = {
  pool = '^(%d+)|([^|%c]+)\t([^|]*)|([^|]*)|([^|]*)|([^|]*)$',
  region = '^([^|]*)|(%d+)|([^|%c]+)\t([^|]*)|([^|]*)|([^|]*)$',
  kind = '^([^|]*)|([^|]*)|([^|]*)|(%d+)|([^|%c]+)\t([^|]*)$',
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
  return split_locator(loc) and loc or nil
end

-- Writes, collected while reading and applied at the end in chunks, so a
-- script finishes every read and check before its first write. Removals
-- go first, then additions, each key in the order first touched.
local PHASE = {zrem = 1, hdel = 2, zadd = 3, hset = 4}
local COMMAND = {'ZREM', 'HDEL', 'ZADD', 'HSET'}
local STEP = {1, 1, 2, 2}
local TYPE_OF = {'zset', 'hash', 'zset', 'hash'}

local function new_writes()
  return {lists = {{}, {}, {}, {}}, keys = {{}, {}, {}, {}}}
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

-- Takes an entry out of the four families (removing an absent member is a
-- no-op). `skip` names a family whose member the caller removes itself.
-- Its members in `usable` and `checked` are left behind: they are dropped
-- when they fall due, and a due member counts only while its locator is
-- still in the atom family (so a stale one never unindexes anything).
local function unindex_parts(writes, p, r, c, u, e, id, skip)
  for _, family in ipairs(FAMILIES) do
    if family ~= skip then push(writes, 'zrem', K[family], (member_in(family, p, r, c, u, e, id))) end
  end
end

local function unindex(writes, loc, skip)
  local p, r, c, u, e, id = split_locator(loc)
  if p then unindex_parts(writes, p, r, c, u, e, id, skip) end
end

-- Puts a live, indexed record into every index set, and rewrites its
-- members in the time sets (one may be left from an earlier indexing).
local function index(writes, rec)
  local loc = locator_of(rec)
  local p, r, c, u, e, id = split_locator(loc)
  for _, family in ipairs(FAMILIES) do
    push(writes, 'zadd', K[family], '0', (member_in(family, p, r, c, u, e, id)))
  end
  if rec.usableUntil < rec.expiresAt then
    push(writes, 'zadd', K.usable, rec.usableUntil, loc)
  else
    push(writes, 'zrem', K.usable, loc)
  end
  push(writes, 'zadd', K.checked, rec.healthCheckedAt, loc)
  push(writes, 'hset', K.kinds, p .. '|' .. c .. '|' .. u, '1')
end

-- Reads the members of `set` due by `bound` (a ZRANGEBYSCORE max), at most
-- `limit`. Returns the due entries still indexed (split locators, each
-- `{p, r, c, u, e, id, loc = ...}`), how many members were read (the caller
-- passes `{set, n}` to `apply`, which removes them), and whether more are due.
local function due_members(set, bound, limit)
  local list = redis.call('ZRANGEBYSCORE', set, '-inf', bound, 'LIMIT', 0, limit + 1)
  local more = #list > limit
  if more then list[#list] = nil end
  local live = {}
  for _, loc in ipairs(list) do
    local p, r, c, u, e, id = split_locator(loc)
    if p and redis.call('ZSCORE', K.atom, loc) then
      live[#live + 1] = {p, r, c, u, e, id, loc = loc}
    end
  end
  return live, #list, more
end

-- Applies the writes, then removes the first `n` members of each `{set, n}`
-- in `trims` (the due members `due_members` read). Nothing here can fail
-- once the key types are known (expect_types) and every argument list is
-- chunked.
local function apply(writes, trims)
  for phase = 1, 4 do
    local chunk = CHUNK - CHUNK % STEP[phase]
    for _, key in ipairs(writes.keys[phase]) do
      local args = writes.lists[phase][key]
      for i = 1, #args, chunk do
        redis.call(COMMAND[phase], key, unpack(args, i, math.min(i + chunk - 1, #args)))
      end
    end
  end
  for _, t in ipairs(trims or {}) do
    if t[2] > 0 then redis.call('ZREMRANGEBYRANK', t[1], 0, t[2] - 1) end
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
