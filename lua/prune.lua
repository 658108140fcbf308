#!lua
-- prune.lua: remove what can never be handed out again, one bounded batch per call.
--
-- KEYS[1..12]: the pool keys (prelude.lua)
-- ARGV[1]: batch, the most entries each sweep below examines (1..1000)
-- ARGV[2]: maxHealthCheckAge, ms: index entries whose last health check is
--          older are due (they come back with a fresh result)
-- Returns: {records, index, more}
--   records  expired records and tombstones deleted (with their expiry entries)
--   index    index entries removed: expired, past their safety margin, or
--            with a stale health check
--   more     1 when a sweep was full, so another call may find more; else 0
--
-- Sweeps, each over the oldest `batch` entries of one sorted set:
--   1. expiry: records and tombstones whose expiresAt <= now (Redis TIME) are
--      deleted with their index entries and holder. A record that says it
--      lives longer (refreshed meanwhile) is kept and its expiry entry
--      corrected, so a prune never removes an eligible proxy.
--   2. pool: index entries whose own expiry has passed (this also finds
--      entries left behind by a record deleted some other way).
--   3. usable and checked: index entries past their safety margin, or whose
--      health check is older than maxHealthCheckAge; members left in those
--      sets by entries no longer indexed are dropped as they fall due.
-- The cost is O(log N + batch) per sweep, never the pool's size. Every read
-- and decision happens before the first write.

local batch, max_age = tonumber(ARGV[1]), tonumber(ARGV[2])
if not (is_int(batch, 1, 1000) and is_int(max_age, 0, MAX_MS)) then
  return redis.error_reply('ERR bad prune arguments')
end
local now = clock()
local writes = new_writes()
local gone = {}      -- locators removed from the index by this call
local more = 0
local records, index_removed = 0, 0

local function drop(loc)
  if not gone[loc] then
    gone[loc] = true
    index_removed = index_removed + 1
    unindex(writes, loc)
  end
end

-- 1. Expired records and tombstones, oldest first.
local due = redis.call('ZRANGEBYSCORE', K.expiry, '-inf', now, 'LIMIT', 0, batch)
if #due == batch then more = 1 end
if #due > 0 then
  local details = redis.call('HMGET', K.proxies, unpack(due))
  local states = redis.call('HMGET', K.state, unpack(due))
  for i, id in ipairs(due) do
    local rec = decode_record(id, details[i], states[i])
    if rec and rec.expiresAt > now then
      push(writes, 'zadd', K.expiry, rec.expiresAt, id)
    else
      if rec and rec.status ~= 'EXTRACTED' and indexed(rec) then drop(locator_of(rec)) end
      push(writes, 'hdel', K.proxies, id)
      push(writes, 'hdel', K.state, id)
      push(writes, 'hdel', K.held, id)
      push(writes, 'zrem', K.expiry, id)
      records = records + 1
    end
  end
end

-- 2. Index entries already past their own expiry.
local stale = redis.call('ZRANGEBYLEX', K.pool, '-', '(' .. pad13(now + 1), 'LIMIT', 0, batch)
if #stale == batch then more = 1 end
for _, member in ipairs(stale) do
  local loc = locator_from('pool', member)
  if loc then drop(loc) else push(writes, 'zrem', K.pool, member) end
end

-- 3. Index entries past their safety margin, or with a stale health check
--    (members left behind by entries no longer indexed go too).
local read = {}
for _, spec in ipairs({{K.usable, now}, {K.checked, '(' .. (now - max_age)}}) do
  local live, n, full = due_members(spec[1], spec[2], batch)
  if full then more = 1 end
  read[#read + 1] = {spec[1], n}
  for _, d in ipairs(live) do drop(d.loc) end
end

local refused = expect_types(writes)
if refused then return refused end
apply(writes, read)
return {records, index_removed, more}
