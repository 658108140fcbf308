#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:proxies  HASH id -> proxy record (JSON)
-- KEYS[4]: (optional) {pp}:idem:<sha256(client id, Idempotency-Key)>  STRING
-- ARGV[1]: count (1..1000)
-- ARGV[2]: fulfillment, "partial" or "allOrNothing"
-- ARGV[3]: reserveForGateway
-- ARGV[4]: minRemainingTTL, ms
-- ARGV[5]: maxHealthCheckAge, ms
-- ARGV[6]: filters, JSON object; an absent dimension is unrestricted:
--          {"protocols":[..],"regions":[..],"carriers":[..],"upstreams":[..]}
-- ARGV[7]: request id (copied into the committed result)
-- ARGV[8]: request digest, 64 hex chars (only with KEYS[4])
-- ARGV[9]: idempotency record lifetime, ms (only with KEYS[4])
-- ARGV[10]: "1" to rewrite a replayed record's expiry to the same instant
--          (only with KEYS[4]): a write, so a WAIT after this call also
--          covers the record it replays (used when replica acks are on)
-- Returns one of:
--   {"ok", result}            committed; result is the JSON recorded for replay:
--                             {"requestId","requested","extractedAt"(ms),"proxies":[records]}
--   {"replay", result}        KEYS[4] held the same digest: nothing was extracted
--   {"conflict"}              KEYS[4] held another digest: nothing was extracted
--   {"insufficient", M, now} allOrNothing could not be met; M = eligible - reserve,
--                             now the Redis clock it was decided at (ms)
--
-- Every read and check happens before the first write, so an error can never
-- leave a partial removal. The cost is O(log N) per bucket visited plus the
-- entries examined, which is bounded by SCAN_BUDGET, never the pool's size;
-- when the budget runs out the eligible count found so far is used, which can
-- only under-count (the Gateway's reserve is never touched).

local avail, buckets, proxies, idem = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local count = tonumber(ARGV[1])
local all_or_nothing = ARGV[2] == 'allOrNothing'
local reserve = tonumber(ARGV[3])
local min_ttl, max_health_age = tonumber(ARGV[4]), tonumber(ARGV[5])
local filters = cjson.decode(ARGV[6])
local request_id, digest, idem_ttl, touch_on_replay = ARGV[7], ARGV[8], ARGV[9], ARGV[10]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- 1. Idempotency: a recorded result is replayed, never re-executed.
if idem then
  local prev = redis.call('GET', idem)
  if prev then
    if string.sub(prev, 1, 64) == digest then
      if touch_on_replay == '1' then
        local at = redis.call('PEXPIRETIME', idem)
        if at > 0 then redis.call('PEXPIREAT', idem, at) end
      end
      return {'replay', string.sub(prev, 65)}
    end
    return {'conflict'}
  end
end

-- 2. Buckets matching the filters (OR inside a dimension, AND across them).
local function as_set(list)
  if list == nil then return nil end
  local set = {}
  for _, v in ipairs(list) do set[v] = true end
  return set
end
local want = {
  as_set(filters.protocols), as_set(filters.regions),
  as_set(filters.carriers), as_set(filters.upstreams),
}

local function split_bucket(bucket)
  local parts = {}
  for part in string.gmatch(bucket .. '|', '([^|]*)|') do parts[#parts + 1] = part end
  return parts
end

local matching = {}
local bucket_list = redis.call('HGETALL', buckets)
for i = 1, #bucket_list, 2 do
  local parts = split_bucket(bucket_list[i])
  if not tonumber(bucket_list[i + 1]) then
    -- Its count is decremented after the writes begin, where nothing may fail.
    return redis.error_reply('ERR damaged pool: a bucket count is not a number')
  end
  if #parts == 4 then
    local ok = true
    for d = 1, 4 do
      if want[d] and not want[d][parts[d]] then ok = false break end
    end
    if ok then matching[#matching + 1] = bucket_list[i] end
  end
end

-- 3. Merge the matching buckets in expiry order (first-expired, first-out),
--    re-checking every candidate against its record, until count + reserve
--    eligible entries are found, the buckets run dry or the budget is spent.
local need = count + reserve
local SCAN_BUDGET = 1024 + 4 * need
local examined = 0
local min_expiry = string.format('%013d', now + min_ttl)
local health_cutoff = now - max_health_age

local eligible = {}   -- {member=, bucket=, id=, expiry=, record=}, in expiry order
local prune = {}      -- {member=, bucket=}: index entries that can never be eligible

local function well_formed(rec)
  return type(rec) == 'table' and type(rec.protocol) == 'string' and type(rec.region) == 'string'
    and type(rec.carrier) == 'string' and type(rec.upstream) == 'string'
    and type(rec.expiresAt) == 'number' and type(rec.usableUntil) == 'number'
    and type(rec.healthCheckedAt) == 'number'
end

local function bucket_of(rec)
  return rec.protocol .. '|' .. rec.region .. '|' .. rec.carrier .. '|' .. rec.upstream
end

local function allocatable(rec)
  if rec.healthOk ~= true then return false end
  if rec.status == 'AVAILABLE' then return rec.owner == nil or rec.owner == cjson.null end
  if rec.status == 'DRAINED' then return rec.active == 0 and rec.reserved == 0 end
  return false
end

-- What one index entry is worth, judged against its record.
local function judge(cur, member, raw)
  local expiry = tonumber(string.sub(member, #cur.prefix + 1, #cur.prefix + 13))
  local ok, rec = false, nil
  if raw then ok, rec = pcall(cjson.decode, raw) end
  if not (ok and well_formed(rec) and rec.expiresAt == expiry and allocatable(rec)
          and bucket_of(rec) == cur.bucket) then
    return 'prune', expiry                     -- dangling, malformed or stale index entry
  end
  if rec.usableUntil <= now then return 'prune', expiry end   -- past its safety margin for good
  if rec.healthCheckedAt < health_cutoff then return 'skip', expiry end -- a fresh check revives it
  return 'eligible', expiry
end

-- A cursor walks one bucket's slice of the index in pages of members; the
-- records of a page are fetched when its first member is examined, and a
-- record is decoded only when its entry is examined, in global expiry order.
local function fill(cur)
  local page = redis.call('ZRANGEBYLEX', avail, cur.from, '[' .. cur.prefix .. '\255', 'LIMIT', 0, cur.page)
  cur.page = math.min(cur.page * 2, 512)
  cur.members, cur.records, cur.pos = page, nil, 1
  if #page == 0 then return false end
  cur.from = '(' .. page[#page]
  return true
end

local function key_of(cur)
  return string.sub(cur.members[cur.pos], #cur.prefix + 1)   -- "<expiry>|<id>": sorts by expiry, then id
end

local first_page = math.min(need, math.ceil(need / math.max(#matching, 1))) + 1
local heap = {}   -- binary min-heap of cursors, keyed by their current entry
local function sift_up(i)
  while i > 1 do
    local p = math.floor(i / 2)
    if heap[i].key < heap[p].key then heap[i], heap[p] = heap[p], heap[i]; i = p else break end
  end
end
local function sift_down(i)
  local n = #heap
  while true do
    local l, r, m = 2 * i, 2 * i + 1, i
    if l <= n and heap[l].key < heap[m].key then m = l end
    if r <= n and heap[r].key < heap[m].key then m = r end
    if m == i then return end
    heap[i], heap[m] = heap[m], heap[i]; i = m
  end
end
for _, bucket in ipairs(matching) do
  local prefix = bucket .. '|'
  local cur = {bucket = bucket, prefix = prefix, from = '[' .. prefix .. min_expiry, page = first_page}
  if fill(cur) then
    cur.key = key_of(cur)
    heap[#heap + 1] = cur
    sift_up(#heap)
  end
end

while #heap > 0 and #eligible < need and examined < SCAN_BUDGET do
  local cur = heap[1]
  if not cur.records then
    local ids = {}
    for i, member in ipairs(cur.members) do ids[i] = string.sub(member, #cur.prefix + 15) end
    cur.records = redis.call('HMGET', proxies, unpack(ids))
  end
  local member, raw = cur.members[cur.pos], cur.records[cur.pos]
  local verdict, expiry = judge(cur, member, raw)
  examined = examined + 1
  if verdict == 'eligible' then
    eligible[#eligible + 1] = {member = member, bucket = cur.bucket, id = string.sub(member, #cur.prefix + 15),
                               expiry = expiry, record = raw}
  elseif verdict == 'prune' then
    prune[#prune + 1] = {member = member, bucket = cur.bucket}
  end
  cur.pos = cur.pos + 1
  if cur.pos > #cur.members and not fill(cur) then
    heap[1] = heap[#heap]; heap[#heap] = nil
  else
    cur.key = key_of(cur)
  end
  if #heap > 0 then sift_down(1) end
end

-- 4. Reserve and fulfillment.
local available = math.max(0, #eligible - reserve)
local take = math.min(count, available)
if all_or_nothing and take < count then
  return {'insufficient', tostring(available), tostring(now)}
end

-- 5. Writes: nothing below can fail.
local removed = {}  -- bucket -> members removed from the index
local function unindex(member, bucket)
  removed[bucket] = (removed[bucket] or 0) + redis.call('ZREM', avail, member)
end
local records = {}
for i = 1, take do
  local e = eligible[i]
  unindex(e.member, e.bucket)
  redis.call('HSET', proxies, e.id, cjson.encode({id = e.id, status = 'EXTRACTED', expiresAt = e.expiry}))
  records[i] = e.record
end
for _, p in ipairs(prune) do unindex(p.member, p.bucket) end
for bucket, n in pairs(removed) do
  if n > 0 and redis.call('HINCRBY', buckets, bucket, -n) <= 0 then
    redis.call('HDEL', buckets, bucket)
  end
end

local result = '{"requestId":' .. cjson.encode(request_id) .. ',"requested":' .. count ..
  ',"extractedAt":' .. now .. ',"proxies":[' .. table.concat(records, ',') .. ']}'
if idem then
  redis.call('SET', idem, digest .. result, 'PX', idem_ttl)
end
return {'ok', result}
