#!lua
-- upsert.lua: add proxies to the pool or refresh ones it already holds.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:proxies  HASH id -> proxy record (JSON)
-- KEYS[4]: {pp}:expiry   ZSET id -> expiresAt ms (drives pruning)
-- KEYS[5]: {pp}:heads    HASH bucket -> lower bound of the bucket's first eligible
--                        entry (see extract.lua); lowered here for every entry added
-- ARGV[i]: one proxy per argument, JSON: {id, protocol, host, port, username,
--          password, region, carrier, upstream, expiresAt, usableUntil,
--          healthOk, healthCheckedAt} (times in ms, already validated)
-- Returns: the Redis clock (ms) the call ran at, then one status per ARGV,
--          in order: "added", "refreshed",
--          "extracted" (refused: a proxy handed to a client never comes back
--          before the expiry it was handed out with) or "expired" (refused:
--          usableUntil already passed).
--
-- A refresh replaces the proxy's details, expiry and health and keeps its
-- ownership state. Every key's TTL is raised to the latest expiry it holds,
-- so no key outlives the proxies it describes.

local avail, buckets, proxies, expiry, heads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local incoming, ids = {}, {}
for i = 1, #ARGV do
  incoming[i] = cjson.decode(ARGV[i])
  ids[i] = incoming[i].id
end

local current = {}
local raw = redis.call('HMGET', proxies, unpack(ids))
for i, id in ipairs(ids) do
  if raw[i] and current[id] == nil then
    local ok, rec = pcall(cjson.decode, raw[i])
    if ok and type(rec) == 'table' then current[id] = rec end
  end
end

local function bucket_of(rec)
  return rec.protocol .. '|' .. rec.region .. '|' .. rec.carrier .. '|' .. rec.upstream
end
local function member_of(rec)
  return bucket_of(rec) .. '|' .. string.format('%013d', rec.expiresAt) .. '|' .. rec.id
end
local function indexed(rec)
  if rec == nil or rec.healthOk ~= true or type(rec.expiresAt) ~= 'number' then return false end
  if rec.status == 'AVAILABLE' then return rec.owner == nil or rec.owner == cjson.null end
  if rec.status == 'DRAINED' then return rec.active == 0 and rec.reserved == 0 end
  return false
end

-- Plan every change first; nothing is written until all items are checked.
local statuses, writes = {}, {}
local latest = 0
for i, new in ipairs(incoming) do
  local old = current[new.id]
  if old and old.status == 'EXTRACTED' and not (type(old.expiresAt) == 'number' and old.expiresAt > now) then
    old = nil                                  -- that TTL life is over: a new one may begin
  end
  if old and old.status == 'EXTRACTED' then
    statuses[i] = 'extracted'
  elseif new.usableUntil <= now or new.expiresAt <= now then
    statuses[i] = 'expired'
  else
    if old then
      new.status, new.owner, new.epoch = old.status, old.owner, old.epoch
      new.active, new.reserved = old.active, old.reserved
      statuses[i] = 'refreshed'
    else
      new.status, new.epoch, new.active, new.reserved = 'AVAILABLE', 0, 0, 0
      statuses[i] = 'added'
    end
    writes[#writes + 1] = {old = old, new = new}
    current[new.id] = new
    latest = math.max(latest, new.expiresAt)
  end
end

-- Extraction probes a bucket only when its hint says the next candidate may
-- be there (see extract.lua): a hint above an entry added now must come down
-- to it. Read before the first write, like everything else.
local lowest = {}   -- bucket -> smallest "<expiry>|<id>" indexed by this call
for _, w in ipairs(writes) do
  if indexed(w.new) then
    local b = bucket_of(w.new)
    local key = string.sub(member_of(w.new), #b + 2)
    if lowest[b] == nil or key < lowest[b] then lowest[b] = key end
  end
end
local touched, lower = {}, {}
for b in pairs(lowest) do touched[#touched + 1] = b end
if #touched > 0 then
  local old = redis.call('HMGET', heads, unpack(touched))
  for i, b in ipairs(touched) do
    if old[i] and lowest[b] < old[i] then
      lower[#lower + 1] = b
      lower[#lower + 1] = lowest[b]
    end
  end
end

local delta = {}
for _, w in ipairs(writes) do
  if indexed(w.old) then
    local b = bucket_of(w.old)
    delta[b] = (delta[b] or 0) - redis.call('ZREM', avail, member_of(w.old))
  end
  if indexed(w.new) then
    local b = bucket_of(w.new)
    delta[b] = (delta[b] or 0) + redis.call('ZADD', avail, 0, member_of(w.new))
  end
  redis.call('HSET', proxies, w.new.id, cjson.encode(w.new))
  redis.call('ZADD', expiry, w.new.expiresAt, w.new.id)
end
for b, n in pairs(delta) do
  if n ~= 0 and redis.call('HINCRBY', buckets, b, n) <= 0 then redis.call('HDEL', buckets, b) end
end
if #lower > 0 then redis.call('HSET', heads, unpack(lower)) end
if latest > 0 then
  for _, key in ipairs(KEYS) do
    local at = redis.call('PEXPIRETIME', key)
    if at ~= -2 and at < latest then redis.call('PEXPIREAT', key, latest) end
  end
end
table.insert(statuses, 1, now)
return statuses
