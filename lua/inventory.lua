#!lua flags=no-writes
-- inventory.lua: how many proxies each bucket of the index could hand out now.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:held     HASH id -> Worker id, for proxies CLAIMED or DRAINING
-- ARGV[1]: minRemainingTTL, ms
-- Returns: {now, {{bucket, eligible, indexed}, ...}, held}, one row per bucket of KEYS[2]
--   now       the Redis clock (TIME), ms
--   bucket    "<protocol>|<region>|<carrier>|<upstream>"
--   eligible  index entries of the bucket expiring at or after now + minRemainingTTL:
--             the same range `extract.lua` starts its walk from, so this is
--             what extraction could take before re-checking each record
--             (health age, safety margin, ownership). It is an upper bound:
--             an entry that fails those re-checks is still counted here.
--   indexed   all index entries of the bucket (KEYS[2]'s count)
--   held      proxies Workers hold (CLAIMED or DRAINING), HLEN of KEYS[3]
--
-- Read only (flags=no-writes: it runs at maxmemory and on replicas). The cost
-- is O(log N) per bucket (ZLEXCOUNT), never the pool's size.

local avail, buckets = KEYS[1], KEYS[2]
local min_ttl = tonumber(ARGV[1])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local min_expiry = string.format('%013d', now + min_ttl)

local rows = {}
local bucket_list = redis.call('HGETALL', buckets)
for i = 1, #bucket_list, 2 do
  local bucket = bucket_list[i]
  local prefix = bucket .. '|'
  local eligible = redis.call('ZLEXCOUNT', avail, '[' .. prefix .. min_expiry, '[' .. prefix .. '\255')
  rows[#rows + 1] = {bucket, eligible, tonumber(bucket_list[i + 1]) or 0}
end
return {now, rows, redis.call('HLEN', KEYS[3])}
