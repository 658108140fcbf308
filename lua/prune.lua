#!lua
-- prune.lua: remove proxies whose TTL life is over, one bounded batch per call.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:proxies  HASH id -> proxy record (JSON) or tombstone
-- KEYS[4]: {pp}:expiry   ZSET id -> expiresAt ms
-- KEYS[5]: {pp}:held     HASH id -> Worker id (an expired proxy is held by no one)
-- ARGV[1]: batch, the most expiry entries and the most index entries examined (1..1000)
-- Returns: {records, index, more}
--   records  expired entries removed from KEYS[4], each with its record or
--            tombstone in KEYS[3] (if it still had one)
--   index    index entries removed from KEYS[1]
--   more     1 when a batch was full, so another call may find more; else 0
--
-- A proxy is expired when its expiresAt <= now (Redis TIME). Two sweeps:
--   1. the oldest `batch` entries of KEYS[4] up to now: each record whose own
--      expiresAt agrees it is over is deleted, with its index entry (computed
--      from the record) and its expiry entry. A record that says it lives
--      longer (refreshed meanwhile) is kept and its expiry entry corrected, so
--      a prune can never remove an eligible proxy.
--   2. per bucket, index entries whose own expiry is before now (members whose
--      record is missing or malformed are found here), at most `batch` in all.
-- Bucket counts stay exact (HINCRBY by what ZREM removed, HDEL at 0).
-- Every read and decision happens before the first write. The cost is
-- O(log N) per bucket plus the entries examined, never the pool's size.

local avail, buckets, proxies, expiry, held = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local batch = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function bucket_of(rec)
  return rec.protocol .. '|' .. rec.region .. '|' .. rec.carrier .. '|' .. rec.upstream
end
local function indexable(rec)
  return type(rec) == 'table' and type(rec.protocol) == 'string' and type(rec.region) == 'string'
    and type(rec.carrier) == 'string' and type(rec.upstream) == 'string'
    and type(rec.id) == 'string' and type(rec.expiresAt) == 'number'
end

local unindex = {}     -- member -> bucket, to ZREM from the index
local delete = {}      -- ids whose record and expiry entry go
local resync = {}      -- {id, expiresAt}: expiry entries behind their record
local more = 0

-- 1. Expired entries of the expiry index, oldest first.
local due = redis.call('ZRANGEBYSCORE', expiry, '-inf', now, 'LIMIT', 0, batch)
if #due == batch then more = 1 end
if #due > 0 then
  local raw = redis.call('HMGET', proxies, unpack(due))
  for i, id in ipairs(due) do
    local ok, rec = false, nil
    if raw[i] then ok, rec = pcall(cjson.decode, raw[i]) end
    if ok and type(rec) == 'table' and type(rec.expiresAt) == 'number' and rec.expiresAt > now then
      resync[#resync + 1] = {id, rec.expiresAt}
    else
      delete[#delete + 1] = id
      if ok and indexable(rec) and rec.id == id then
        local member = bucket_of(rec) .. '|' .. string.format('%013d', rec.expiresAt) .. '|' .. id
        unindex[member] = bucket_of(rec)
      end
    end
  end
end

-- 2. Index entries already past their own expiry, bucket by bucket.
local budget = batch
local bucket_list = redis.call('HGETALL', buckets)
for i = 1, #bucket_list, 2 do
  if budget <= 0 then more = 1 break end
  local bucket = bucket_list[i]
  local prefix = bucket .. '|'
  local stale = redis.call('ZRANGEBYLEX', avail, '[' .. prefix,
    '(' .. prefix .. string.format('%013d', now), 'LIMIT', 0, budget)
  if #stale == budget then more = 1 end
  budget = budget - #stale
  for _, member in ipairs(stale) do unindex[member] = bucket end
end

-- HDEL below must not fail on a damaged key.
local held_type = redis.call('TYPE', held)['ok']
if held_type ~= 'none' and held_type ~= 'hash' then
  return redis.error_reply('ERR damaged pool: wrong key type')
end

-- 3. Writes: nothing below can fail.
local removed, index_removed = {}, 0
for member, bucket in pairs(unindex) do
  local n = redis.call('ZREM', avail, member)
  removed[bucket] = (removed[bucket] or 0) + n
  index_removed = index_removed + n
end
for bucket, n in pairs(removed) do
  if n > 0 and redis.call('HINCRBY', buckets, bucket, -n) <= 0 then
    redis.call('HDEL', buckets, bucket)
  end
end
if #delete > 0 then
  redis.call('HDEL', proxies, unpack(delete))
  redis.call('ZREM', expiry, unpack(delete))
  redis.call('HDEL', held, unpack(delete))
end
for _, r in ipairs(resync) do
  redis.call('ZADD', expiry, r[2], r[1])
end
return {#delete, index_removed, more}
