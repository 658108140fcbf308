#!lua
-- contract.lua: the pool's health and Worker-ownership operations, one
-- atomic operation per call. Extraction (extract.lua) and these operations
-- exclude each other by construction: a proxy is in the allocatable index
-- only while no Worker holds it, a claim takes it out of the index in the
-- same call that checks it, and extraction re-checks the record it takes.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:proxies  HASH id -> proxy record (JSON) or tombstone
-- KEYS[4]: {pp}:held     HASH id -> Worker id, for proxies CLAIMED or DRAINING
-- KEYS[5]: {pp}:expiry   ZSET id -> expiresAt ms
-- KEYS[6]: {pp}:heads    HASH bucket -> lower bound of the bucket's first entry that
--                        may be eligible (see extract.lua): lowered to any entry
--                        this call leaves allocatable, since it may have become
--                        eligible (re-indexed, or healthy again)
-- ARGV[1]: operation, ARGV[2]: proxy id, then per operation:
--   health   ARGV[3] "1" passed / "0" failed, ARGV[4] checkedAt ms ("" = now)
--            Records a health result; one older than the recorded one is "stale".
--   claim    ARGV[3] worker, ARGV[4] minRemainingTTL ms, ARGV[5] maxHealthCheckAge ms
--            Takes an allocatable, eligible proxy out of the index for the Worker:
--            status CLAIMED, owner = worker, epoch + 1 (the fencing token returned).
--   drain    ARGV[3] worker, ARGV[4] epoch
--            The Controller publishes DRAINING for the holder it names.
--   ack      ARGV[3] worker, ARGV[4] epoch, ARGV[5] active, ARGV[6] reserved
--            The Worker reports its use of a DRAINING proxy; at 0 and 0 it is
--            DRAINED, no longer held, and allocatable again (extract.lua rule 2).
--   release  ARGV[3] worker, ARGV[4] epoch
--            Clears the ownership of a DRAINED proxy: AVAILABLE, epoch + 1.
--   remove   Deletes a proxy (not a tombstone: an extracted proxy stays out).
-- Every ownership operation names the holder and epoch it believes in; a stale
-- Worker's (or Controller's) late write is refused as "not-owner", never applied.
-- Returns {verdict, now, epoch}: verdict "ok" or the refusal: "unknown",
--   "extracted", "expired", "stale", "ineligible", "not-owner", "state";
--   now the Redis clock (ms); epoch the record's epoch after the call (0 if none).

local avail, buckets, proxies, held, expiry, heads = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local op, id = ARGV[1], ARGV[2]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function bucket_of(rec)
  return rec.protocol .. '|' .. rec.region .. '|' .. rec.carrier .. '|' .. rec.upstream
end
local function member_of(rec)
  return bucket_of(rec) .. '|' .. string.format('%013d', rec.expiresAt) .. '|' .. rec.id
end
-- In the index: healthy and not held (the time rules are re-checked by extraction).
local function indexed(rec)
  if rec.healthOk ~= true then return false end
  if rec.status == 'AVAILABLE' then return rec.owner == nil end
  if rec.status == 'DRAINED' then return rec.active == 0 and rec.reserved == 0 end
  return false
end

-- Reads and checks.
local raw = redis.call('HGET', proxies, id)
if not raw then return {'unknown', now, 0} end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then return redis.error_reply('ERR damaged pool: unreadable record') end
if rec.owner == cjson.null then rec.owner = nil end
if rec.status == 'EXTRACTED' then return {'extracted', now, 0} end
local was_indexed = indexed(rec)
local epoch = rec.epoch or 0
-- Writes below must not fail: check the types of the keys they touch now.
for _, key in ipairs({avail, held, expiry, heads}) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= ((key == held or key == heads) and 'hash' or 'zset') then
    return redis.error_reply('ERR damaged pool: wrong key type')
  end
end
if not tonumber(redis.call('HGET', buckets, bucket_of(rec)) or '0') then
  return redis.error_reply('ERR damaged pool: a bucket count is not a number')
end

local function refuse(verdict) return {verdict, now, epoch} end
local function holder_matches()
  return rec.owner == ARGV[3] and tostring(epoch) == ARGV[4]
end

if op == 'remove' then
  if was_indexed then
    local n = redis.call('ZREM', avail, member_of(rec))
    if n > 0 and redis.call('HINCRBY', buckets, bucket_of(rec), -n) <= 0 then
      redis.call('HDEL', buckets, bucket_of(rec))
    end
  end
  redis.call('HDEL', proxies, id)
  redis.call('HDEL', held, id)
  redis.call('ZREM', expiry, id)
  return {'ok', now, 0}
end

if rec.expiresAt <= now then return refuse('expired') end

if op == 'health' then
  local at = tonumber(ARGV[4]) or now
  if at < rec.healthCheckedAt then return refuse('stale') end
  rec.healthOk, rec.healthCheckedAt = ARGV[3] == '1', at
elseif op == 'claim' then
  local min_ttl, max_age = tonumber(ARGV[4]), tonumber(ARGV[5])
  if not (was_indexed and rec.usableUntil > now and rec.expiresAt - now >= min_ttl
          and rec.healthCheckedAt >= now - max_age) then
    return refuse('ineligible')
  end
  epoch = epoch + 1
  rec.status, rec.owner, rec.epoch, rec.active, rec.reserved = 'CLAIMED', ARGV[3], epoch, 0, 0
elseif op == 'drain' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'CLAIMED' and rec.status ~= 'DRAINING' then return refuse('state') end
  rec.status = 'DRAINING'
elseif op == 'ack' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'DRAINING' and rec.status ~= 'DRAINED' then return refuse('state') end
  rec.active, rec.reserved = tonumber(ARGV[5]), tonumber(ARGV[6])
  rec.status = (rec.active == 0 and rec.reserved == 0) and 'DRAINED' or 'DRAINING'
elseif op == 'release' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'DRAINED' then return refuse('state') end
  epoch = epoch + 1
  rec.status, rec.owner, rec.epoch, rec.active, rec.reserved = 'AVAILABLE', nil, epoch, 0, 0
else
  return redis.error_reply('ERR unknown operation')
end

local now_indexed = indexed(rec)
local hint = now_indexed and redis.call('HGET', heads, bucket_of(rec))
local key = string.sub(member_of(rec), #bucket_of(rec) + 2)

-- Writes: nothing below can fail.
if hint and key < hint then redis.call('HSET', heads, bucket_of(rec), key) end
if was_indexed ~= now_indexed then
  local bucket = bucket_of(rec)
  local n
  if now_indexed then n = redis.call('ZADD', avail, 0, member_of(rec)) else n = -redis.call('ZREM', avail, member_of(rec)) end
  if n ~= 0 and redis.call('HINCRBY', buckets, bucket, n) <= 0 then redis.call('HDEL', buckets, bucket) end
end
if rec.status == 'CLAIMED' or rec.status == 'DRAINING' then
  redis.call('HSET', held, id, rec.owner)
else
  redis.call('HDEL', held, id)
end
redis.call('HSET', proxies, id, cjson.encode(rec))
-- Keys this call may have created live as long as the pool's records do.
local at = redis.call('PEXPIRETIME', proxies)
if at > 0 then
  for _, key in ipairs({avail, buckets, held}) do
    local key_at = redis.call('PEXPIRETIME', key)
    if key_at ~= -2 and key_at ~= at then redis.call('PEXPIREAT', key, at) end
  end
end
return {'ok', now, epoch}
