#!lua
-- upsert.lua: add proxies to the pool or refresh ones it already holds.
--
-- KEYS[1..20]: the pool keys (prelude.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2..]: one proxy per argument, JSON: {id, protocol, host, port,
--          username?, password?, region, carrier, upstream, expiresAt,
--          usableUntil, healthOk, healthCheckedAt} (times in ms)
-- Returns: the Redis clock (ms) the call ran at, then one status per proxy,
--          in order: "added", "refreshed",
--          "extracted" (refused: a proxy handed to a client never comes back
--          before the expiry it was handed out with) or "expired" (refused:
--          usableUntil already passed).
-- Errors: "POLICY <pool's policy>" when the pool records another policy.
--
-- A refresh replaces the proxy's details, expiry and health and keeps its
-- ownership state. Index entries follow the record (prelude.lua); the hints
-- of the slices an entry joins come down to it, so extraction keeps
-- first-expired, first-out. Every key's TTL is raised to the latest expiry
-- it holds, so no key outlives the proxies it describes. An argument that is
-- not a valid proxy fails the whole call before anything is written.

local _, _, adopt = pool_policy(ARGV[1])
local now = clock()

local incoming, ids = {}, {}
for i = 2, #ARGV do
  local ok, new = pcall(cjson.decode, ARGV[i])
  if not ok or type(new) ~= 'table' then return redis.error_reply('ERR upsert: argument ' .. i .. ' is not JSON') end
  new.status, new.epoch, new.active, new.reserved = 'AVAILABLE', 0, 0, 0
  if not well_formed(new) then return redis.error_reply('ERR upsert: argument ' .. i .. ' is not a valid proxy') end
  incoming[#incoming + 1] = new
  ids[#ids + 1] = new.id
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

-- Plan the writes from each proxy's state before and after this call: the
-- index entry it has now (read from the index itself), the one it gets.
local changed, old_locs = {}, {}
for id, before in pairs(first) do
  changed[#changed + 1] = id
  old_locs[#changed] = (before and before.status ~= 'EXTRACTED') and locator_of(before) or false
end
local was = indexed_at_each(old_locs)
local writes = new_writes()
local joined = {}   -- locators indexed by this call
for i, id in ipairs(changed) do
  local after = current[id]
  local loc = reindex(writes, old_locs[i] or nil, was[i], after, now)
  if loc then joined[#joined + 1] = loc end
  push(writes, 'hset', K.proxies, id, details_json(after))
  push(writes, 'hset', K.state, id, state_json(after))
  push(writes, 'zadd', K.expiry, after.expiresAt, id)
end
lower_hints(writes, joined)

local life = lifetimes(KEYS)
local refused = commit(writes)
if refused then return refused end
if adopt and latest > 0 then redis.call('SET', K.policy, ARGV[1]) end
if latest > 0 then raise(KEYS, life, latest, writes) end
table.insert(statuses, 1, now)
return statuses
