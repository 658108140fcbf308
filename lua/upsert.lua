#!lua
-- upsert.lua: add proxies to the pool or refresh ones it already holds.
--
-- KEYS[1..12]: the pool keys (prelude.lua)
-- ARGV[i]: one proxy per argument, JSON: {id, protocol, host, port, username?,
--          password?, region, carrier, upstream, expiresAt, usableUntil,
--          healthOk, healthCheckedAt} (times in ms)
-- Returns: the Redis clock (ms) the call ran at, then one status per ARGV,
--          in order: "added", "refreshed",
--          "extracted" (refused: a proxy handed to a client never comes back
--          before the expiry it was handed out with) or "expired" (refused:
--          usableUntil already passed).
--
-- A refresh replaces the proxy's details, expiry and health and keeps its
-- ownership state. Index entries follow the record (prelude.lua); the hints
-- of the slices an entry joins come down to it, so extraction keeps
-- first-expired, first-out. Every key's TTL is raised to the latest expiry
-- it holds, so no key outlives the proxies it describes. An argument that is
-- not a valid proxy fails the whole call before anything is written.

local now = clock()

local incoming, ids = {}, {}
for i = 1, #ARGV do
  local ok, new = pcall(cjson.decode, ARGV[i])
  if not ok or type(new) ~= 'table' then return redis.error_reply('ERR upsert: argument ' .. i .. ' is not JSON') end
  new.status, new.epoch, new.active, new.reserved = 'AVAILABLE', 0, 0, 0
  if not well_formed(new) then return redis.error_reply('ERR upsert: argument ' .. i .. ' is not a valid proxy') end
  incoming[i] = new
  ids[i] = new.id
end

-- What the pool holds now; a damaged value counts as nothing (it is replaced).
local stored = {}
for i = 1, #ids, CHUNK do
  local part = {unpack(ids, i, math.min(i + CHUNK - 1, #ids))}
  local details = redis.call('HMGET', K.proxies, unpack(part))
  local states = redis.call('HMGET', K.state, unpack(part))
  for j, id in ipairs(part) do
    if stored[id] == nil then stored[id] = decode_record(id, details[j], states[j]) or false end
  end
end

-- Decide every item in order, as if each were its own call.
local current, first = {}, {}
for id, rec in pairs(stored) do current[id] = rec or nil end
local statuses, latest = {}, 0
for i, new in ipairs(incoming) do
  local old = current[new.id]
  if old and old.status == 'EXTRACTED' and old.expiresAt <= now then
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
      statuses[i] = 'added'
    end
    if first[new.id] == nil then first[new.id] = stored[new.id] or false end
    current[new.id] = new
    latest = math.max(latest, new.expiresAt)
  end
end

-- Plan the writes from each proxy's state before and after this call.
local writes = new_writes()
local lowest = {}   -- hint field -> smallest "<expiry>|<id>" indexed by this call
for id, before in pairs(first) do
  local after = current[id]
  local old_loc = (before and indexed(before)) and locator_of(before) or nil
  if indexed(after) then
    local loc = locator_of(after)
    if old_loc and old_loc ~= loc then unindex(writes, old_loc) end
    if old_loc == loc and after.usableUntil == after.expiresAt then
      push(writes, 'zrem', K.usable, loc)          -- its safety margin is gone
    end
    index(writes, after)
    local p, r, c, u, e = split_locator(loc)
    local key = e .. '|' .. id
    for _, field in ipairs({'region:' .. r .. '|', 'kind:' .. p .. '|' .. c .. '|' .. u .. '|',
                           'atom:' .. p .. '|' .. r .. '|' .. c .. '|' .. u .. '|'}) do
      if lowest[field] == nil or key < lowest[field] then lowest[field] = key end
    end
  elseif old_loc then
    unindex(writes, old_loc)
  end
  push(writes, 'hset', K.proxies, id, details_json(after))
  push(writes, 'hset', K.state, id, state_json(after))
  push(writes, 'zadd', K.expiry, after.expiresAt, id)
end

-- A hint above an entry indexed now must come down to it.
local fields = {}
for field in pairs(lowest) do fields[#fields + 1] = field end
for i = 1, #fields, CHUNK do
  local part = {unpack(fields, i, math.min(i + CHUNK - 1, #fields))}
  local old = redis.call('HMGET', K.hint, unpack(part))
  for j, field in ipairs(part) do
    if old[j] and lowest[field] < old[j] then push(writes, 'hset', K.hint, field, lowest[field]) end
  end
end

local life = lifetimes(KEYS)
local refused = expect_types(writes)
if refused then return refused end
apply(writes)
if latest > 0 then raise(KEYS, life, latest, writes) end
table.insert(statuses, 1, now)
return statuses
