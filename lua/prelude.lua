-- prelude.lua: the pool's rules, defined once. It is joined in front of
-- every script when the script is loaded (after the script's `#!lua` line),
-- so every script names the keys, reads the clock, judges records and
-- writes the index the same way.
--
-- Every pool script takes the same eleven keys first (KEYS[1..11], below),
-- then its own extra keys. All share the hash tag {pp}: one cluster slot.
--
-- Records, {pp}:proxies id -> JSON:
--   live       {id, protocol, host, port, username?, password?, region,
--               carrier, upstream, expiresAt, usableUntil, healthOk,
--               healthCheckedAt, status, owner?, epoch, active, reserved}
--              (times in Unix ms; status AVAILABLE, CLAIMED, DRAINING, DRAINED)
--   tombstone  {id, status: "EXTRACTED", expiresAt}: handed to a client; it
--              stays until its expiry so the proxy can never come back.
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
-- A slice is a lexicographic range (all members score 0), sorted by expiry
-- then id. Every member carries the whole locator, so any one of them says
-- where the entry sits in all the others. The time rules are not in the
-- index: extraction reads them from ranges (expiry) and from usable/checked,
-- whose due entries it removes before it counts.

local K = {
  proxies = KEYS[1],  -- HASH id -> record JSON or tombstone
  expiry = KEYS[2],   -- ZSET id -> expiresAt ms: every record and tombstone, for pruning
  held = KEYS[3],     -- HASH id -> Worker id, while CLAIMED or DRAINING
  pool = KEYS[4],     -- ZSET (lex)
  region = KEYS[5],   -- ZSET (lex)
  kind = KEYS[6],     -- ZSET (lex)
  atom = KEYS[7],     -- ZSET (lex)
  usable = KEYS[8],   -- ZSET usableUntil -> locator
  checked = KEYS[9],  -- ZSET healthCheckedAt -> locator
  hint = KEYS[10],    -- HASH "<family>:<slice>" -> lower bound "<expiry>|<id>" of the
                      --   slice's first entry ("~": empty); orders the probes of a
                      --   many-slice extraction, never decides what it may take
  kinds = KEYS[11],   -- HASH "<p>|<c>|<u>" -> "1": every kind ever indexed (grows only)
}
local POOL_KEY_COUNT = 11
-- The sorted sets an index entry lives in.
local INDEX_SETS = {K.pool, K.region, K.kind, K.atom, K.usable, K.checked}
local FAMILIES = {'pool', 'region', 'kind', 'atom'}

-- Largest `count` an extraction may ask for, and the most arguments any one
-- command is sent (Lua's unpack limit is ~8000).
local MAX_COUNT = 1000
local CHUNK = 1000
local MAX_MS = 9999999999999

-- The one clock: Redis TIME, in ms.
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
    and is_int(rec.epoch, 0, 2 ^ 53) and is_int(rec.active, 0, 2 ^ 32) and is_int(rec.reserved, 0, 2 ^ 32)
end

local function is_tombstone(rec)
  return type(rec) == 'table' and rec.status == 'EXTRACTED' and is_int(rec.expiresAt, 0, MAX_MS)
end

-- Decodes a stored value: a well-formed live record, a tombstone, or nil.
local function decode_record(raw)
  if not raw then return nil end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok then return nil end
  if is_tombstone(rec) then return rec end
  if well_formed(rec) then
    if rec.owner == cjson.null then rec.owner = nil end
    if rec.username == cjson.null then rec.username = nil end
    if rec.password == cjson.null then rec.password = nil end
    return rec
  end
  return nil
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

-- What a client receives: the response's fields, nothing of the pool's state.
local function public_json(rec)
  return cjson.encode({
    id = rec.id, protocol = rec.protocol, host = rec.host, port = rec.port,
    username = rec.username, password = rec.password, region = rec.region,
    carrier = rec.carrier, upstream = rec.upstream, expiresAt = rec.expiresAt,
  })
end

local function tombstone_json(rec)
  return cjson.encode({id = rec.id, status = 'EXTRACTED', expiresAt = rec.expiresAt})
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
-- script finishes every read and check before its first write.
local function new_writes()
  return {zrem = {}, zadd = {}, hset = {}, hdel = {}, order = {}}
end

local function push(writes, op, key, ...)
  local lists = writes[op]
  local list = lists[key]
  if not list then
    list = {}
    lists[key] = list
    writes.order[#writes.order + 1] = {op, key}
  end
  for i = 1, select('#', ...) do list[#list + 1] = select(i, ...) end
end

-- Takes `loc` out of every index set (removing an absent member is a no-op).
local function unindex(writes, loc)
  local p, r, c, u, e, id = split_locator(loc)
  if not p then return end
  for _, family in ipairs(FAMILIES) do
    push(writes, 'zrem', K[family], (member_in(family, p, r, c, u, e, id)))
  end
  push(writes, 'zrem', K.usable, loc)
  push(writes, 'zrem', K.checked, loc)
end

-- Puts a live, indexed record into every index set.
local function index(writes, rec)
  local loc = locator_of(rec)
  local p, r, c, u, e, id = split_locator(loc)
  for _, family in ipairs(FAMILIES) do
    push(writes, 'zadd', K[family], 0, (member_in(family, p, r, c, u, e, id)))
  end
  if rec.usableUntil < rec.expiresAt then
    push(writes, 'zadd', K.usable, rec.usableUntil, loc)
  end
  push(writes, 'zadd', K.checked, rec.healthCheckedAt, loc)
  push(writes, 'hset', K.kinds, p .. '|' .. c .. '|' .. u, '1')
end

local STEP = {zrem = 1, zadd = 2, hset = 2, hdel = 1}
local COMMAND = {zrem = 'ZREM', zadd = 'ZADD', hset = 'HSET', hdel = 'HDEL'}
local PHASE = {zrem = 1, hdel = 2, zadd = 3, hset = 4}

-- Every removal, then every addition, each key in the order first touched.
-- Nothing here can fail once the key types are known (see expect_types).
local function apply(writes)
  local order = {}
  for i, w in ipairs(writes.order) do order[i] = {PHASE[w[1]], i, w[1], w[2]} end
  table.sort(order, function(a, b) return a[1] < b[1] or (a[1] == b[1] and a[2] < b[2]) end)
  for _, w in ipairs(order) do
    local op, key = w[3], w[4]
    local args = writes[op][key]
    local chunk = CHUNK - CHUNK % STEP[op]
    for i = 1, #args, chunk do
      redis.call(COMMAND[op], key, unpack(args, i, math.min(i + chunk - 1, #args)))
    end
  end
end

local TYPE_OF = {zrem = 'zset', zadd = 'zset', hset = 'hash', hdel = 'hash'}

-- Refuses to write into a key of the wrong type: checked before the first
-- write, since a failed command half way through the writes is what no
-- script may ever do.
local function expect_types(writes, extra)
  local want = {}
  for _, w in ipairs(writes.order) do want[w[2]] = TYPE_OF[w[1]] end
  for key, kind in pairs(extra or {}) do want[key] = kind end
  for key, kind in pairs(want) do
    local actual = redis.call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= kind then
      return redis.error_reply('ERR damaged pool: a pool key has the wrong type')
    end
  end
  return nil
end

-- Key lifetimes: no key outlives the latest expiry it describes. Read
-- before the writes; `raise` is applied after them.
local function lifetimes(keys)
  local at = {}
  for i, key in ipairs(keys) do at[i] = redis.call('PEXPIRETIME', key) end
  return at
end

local function raise(keys, at, latest)
  for i, key in ipairs(keys) do
    if at[i] < latest then redis.call('PEXPIREAT', key, latest) end
  end
end
