#!lua
-- prune.lua: remove what can never be handed out again, one bounded batch per call.
--
-- KEYS[1..20]: the pool keys (prelude.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: batch, the most entries each sweep below examines (1..1000)
-- Returns: {records, index, more}
--   records  expired records and tombstones deleted (with their expiry entries)
--   index    spent index entries removed (past their deadline: expired, past
--            their margin or minRemainingTTL, or with a stale health check)
--   more     1 when a sweep was full, so another call may find more; else 0
-- Errors: "POLICY <pool's policy>" when the pool records another policy.
--
-- Sweeps, each over the oldest `batch` entries of one sorted set:
--   1. expiry: records and tombstones whose expiresAt <= now (Redis TIME) are
--      deleted with their holder. A record that says it lives longer
--      (refreshed meanwhile) is kept and its expiry entry corrected, so a
--      prune never removes an eligible proxy. Its index entry, if any, is
--      spent (its deadline is at most its expiry), so sweep 2 removes it.
--   2. live: index entries whose deadline has passed leave every index set.
--      Nothing counts or hands them out meanwhile (both read from the
--      deadline on), so this is memory and walking time, never exactness.
-- The cost is O(log N + batch) per sweep, never the pool's size. Every read
-- and decision happens before the first write.

pool_policy(ARGV[1])
local batch = tonumber(ARGV[2])
if not is_int(batch, 1, 1000) then
  return redis.error_reply('ERR bad prune arguments')
end
local now = clock()
local writes = new_writes()
local more = 0
local records, index_removed = 0, 0

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
      push(writes, 'hdel', K.proxies, id)
      push(writes, 'hdel', K.state, id)
      push(writes, 'hdel', K.held, id)
      push(writes, 'zrem', K.expiry, id)
      records = records + 1
    end
  end
end

-- 2. Spent index entries, by deadline.
local spent = redis.call('ZRANGEBYSCORE', K.live, '-inf', now, 'WITHSCORES', 'LIMIT', 0, batch)
if #spent == 2 * batch then more = 1 end
for i = 1, #spent, 2 do
  local loc = locator_from('pool', spent[i])
  local p, r, c, u, e, id
  if loc then p, r, c, u, e, id = split_locator(loc) end
  if p then
    unindex_parts(writes, p, r, c, u, e, id, pad13(tonumber(spent[i + 1])))
  else
    push(writes, 'zrem', K.live, spent[i])     -- not a member this index writes
  end
  index_removed = index_removed + 1
end

local refused = commit(writes)
if refused then return refused end
return {records, index_removed, more}
