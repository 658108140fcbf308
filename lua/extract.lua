#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1]: {pp}:avail    ZSET, score 0, members "<bucket>|<expiresAt ms, 13 digits>|<id>"
-- KEYS[2]: {pp}:buckets  HASH bucket -> number of members of KEYS[1] in that bucket
-- KEYS[3]: {pp}:proxies  HASH id -> proxy record (JSON)
-- KEYS[4]: {pp}:heads    HASH bucket -> "<expiresAt ms, 13 digits>|<id>": a lower bound
--                        of the bucket's first entry that may still be eligible
--                        ("~": none), so a merge probes only the buckets that can
--                        hold the next candidates; written here and lowered by
--                        every script that adds to KEYS[1]
-- KEYS[5]: (optional) {pp}:idem:<sha256(client id, Idempotency-Key)>  STRING
-- ARGV[1]: count (1..1000)
-- ARGV[2]: fulfillment, "partial" or "allOrNothing"
-- ARGV[3]: reserveForGateway
-- ARGV[4]: minRemainingTTL, ms
-- ARGV[5]: maxHealthCheckAge, ms
-- ARGV[6]: filters, JSON object; an absent dimension is unrestricted:
--          {"protocols":[..],"regions":[..],"carriers":[..],"upstreams":[..]}
-- ARGV[7]: request id (copied into the committed result)
-- ARGV[8]: request digest, 64 hex chars (only with KEYS[5])
-- ARGV[9]: idempotency record lifetime, ms (only with KEYS[5])
-- ARGV[10]: "1" to rewrite a replayed record's expiry to the same instant
--          (only with KEYS[5]): a write, so a WAIT after this call also
--          covers the record it replays (used when replica acks are on)
-- Returns one of:
--   {"ok", result}            committed; result is the JSON recorded for replay:
--                             {"requestId","requested","extractedAt"(ms),"proxies":[records]}
--   {"replay", result}        KEYS[5] held the same digest: nothing was extracted
--   {"conflict"}              KEYS[5] held another digest: nothing was extracted
--   {"insufficient", M, now} allOrNothing could not be met; M = eligible - reserve,
--                             now the Redis clock it was decided at (ms)
--
-- Every read and check happens before the first write, so an error can never
-- leave a partial removal. The cost is O(log N) per bucket probed plus the
-- entries examined, which is bounded by SCAN_BUDGET, never the pool's size;
-- when the budget runs out the eligible count found so far is used, which can
-- only under-count (the Gateway's reserve is never touched).
--
-- KEYS[4] only decides which buckets to probe, and in which order: a probe
-- always starts at now + minRemainingTTL, so a wrong hint can never hide a
-- proxy, only hand it out later than first-expired, first-out would. A hint
-- stays a lower bound because entries only leave a bucket's eligible range
-- as time passes (expiry, health age), and the scripts that add to it lower it.

local avail, buckets, proxies, heads, idem = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
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

local restricted = want[1] or want[2] or want[3] or want[4]
local matching = {}
local bucket_list = redis.call('HGETALL', buckets)
for i = 1, #bucket_list, 2 do
  local bucket = bucket_list[i]
  if not tonumber(bucket_list[i + 1]) then
    -- Its count is decremented after the writes begin, where nothing may fail.
    return redis.error_reply('ERR damaged pool: a bucket count is not a number')
  end
  if restricted then
    local p, r, c, u = string.match(bucket, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if p and not ((want[1] and not want[1][p]) or (want[2] and not want[2][r])
                  or (want[3] and not want[3][c]) or (want[4] and not want[4][u])) then
      matching[#matching + 1] = bucket
    end
  else
    matching[#matching + 1] = bucket   -- its name is checked if it is ever probed
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

local eligible = {}   -- {member=, bucket=, id=, expiry=, record=, key=}, in expiry order
local prune = {}      -- {member=, bucket=}: index entries that can never be eligible

local function well_formed(rec)
  return type(rec) == 'table' and type(rec.protocol) == 'string' and type(rec.region) == 'string'
    and type(rec.carrier) == 'string' and type(rec.upstream) == 'string'
    and type(rec.expiresAt) == 'number' and type(rec.usableUntil) == 'number'
    and type(rec.healthCheckedAt) == 'number'
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
          and rec.protocol == cur.parts[1] and rec.region == cur.parts[2]
          and rec.carrier == cur.parts[3] and rec.upstream == cur.parts[4]) then
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
  if #page == 0 then cur.done = true; return false end
  cur.from = '(' .. page[#page]
  return true
end

local function key_of(cur)
  return string.sub(cur.members[cur.pos], #cur.prefix + 1)   -- "<expiry>|<id>": sorts by expiry, then id
end

local first_page = math.min(need, math.ceil(need / math.max(#matching, 1))) + 1
local hint = {}
local hint_list = redis.call('HGETALL', heads)
for i = 1, #hint_list, 2 do hint[hint_list[i]] = hint_list[i + 1] end

-- The merge keeps probed buckets as cursors in a binary min-heap keyed by
-- their current entry; a bucket not probed yet stands for its hint ("" when
-- it has none: probe it first). While the smallest hint is below the heap's
-- top, that bucket may hold the next candidate and is probed; otherwise the
-- top is the next entry in global expiry order. Buckets never probed cost
-- one string comparison per probe.
local heap = {}
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

-- Buckets not probed yet, smallest hint first: a linear scan for the first
-- two probes (most requests need one or two), then one sort of the rest.
local waiting, probed_flag, order, order_at, probes = {}, {}, nil, 1, 0
for i, bucket in ipairs(matching) do waiting[i] = hint[bucket] or '' end
local function next_waiting()
  if order == nil and probes >= 2 then
    order = {}
    for i = 1, #matching do
      if not probed_flag[i] then order[#order + 1] = i end
    end
    table.sort(order, function(a, b) return waiting[a] < waiting[b] end)
  end
  if order then return order[order_at] end
  local best
  for i = 1, #matching do
    if not probed_flag[i] and (best == nil or waiting[i] < waiting[best]) then best = i end
  end
  return best
end
local next_probe = next_waiting()

local probed = {}   -- cursors probed, to write their buckets' new hints
while #eligible < need and examined < SCAN_BUDGET do
  local cur = heap[1]
  if next_probe and (cur == nil or waiting[next_probe] <= cur.key) then
    local bucket = matching[next_probe]
    probed_flag[next_probe] = true
    probes = probes + 1
    if order then order_at = order_at + 1 end
    next_probe = next_waiting()
    -- A bucket name of other than four parts was never written by upsert.lua;
    -- its range could overlap real buckets, so it is never walked.
    local p, r, c, u = string.match(bucket, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if p then
      local prefix = bucket .. '|'
      local new = {bucket = bucket, parts = {p, r, c, u}, prefix = prefix,
                   from = '[' .. prefix .. min_expiry, page = first_page}
      probed[#probed + 1] = new
      if fill(new) then
        new.key = key_of(new)
        heap[#heap + 1] = new
        sift_up(#heap)
      end
    end
  elseif cur == nil then
    break
  else
    if not cur.records then
      cur.ids = {}
      for i, member in ipairs(cur.members) do cur.ids[i] = string.sub(member, #cur.prefix + 15) end
      cur.records = redis.call('HMGET', proxies, unpack(cur.ids))
    end
    local member, raw = cur.members[cur.pos], cur.records[cur.pos]
    local verdict, expiry = judge(cur, member, raw)
    examined = examined + 1
    if verdict == 'eligible' then
      eligible[#eligible + 1] = {member = member, bucket = cur.bucket, id = cur.ids[cur.pos],
                                 expiry = expiry, record = raw, key = cur.key}
    elseif verdict == 'prune' then
      prune[#prune + 1] = {member = member, bucket = cur.bucket}
    end
    cur.pos = cur.pos + 1
    if cur.pos > #cur.members and not fill(cur) then
      heap[1] = heap[#heap]; heap[#heap] = nil
      if #heap > 0 then sift_down(1) end
    else
      cur.key = key_of(cur)
      sift_down(1)
    end
  end
end

-- 4. Reserve and fulfillment.
local available = math.max(0, #eligible - reserve)
local take = math.min(count, available)
if all_or_nothing and take < count then
  return {'insufficient', tostring(available), tostring(now)}
end

-- 5. Writes: nothing below can fail. Every member removed was read from
--    the index by this call, so each removal counts once for its bucket.
local function batched(command, key, args)
  for i = 1, #args, 1000 do
    redis.call(command, key, unpack(args, i, math.min(i + 999, #args)))
  end
end
local removed, unindex, tombstones, records = {}, {}, {}, {}
for i = 1, take do
  local e = eligible[i]
  unindex[#unindex + 1] = e.member
  removed[e.bucket] = (removed[e.bucket] or 0) + 1
  tombstones[#tombstones + 1] = e.id
  tombstones[#tombstones + 1] = cjson.encode({id = e.id, status = 'EXTRACTED', expiresAt = e.expiry})
  records[i] = e.record
end
for _, p in ipairs(prune) do
  unindex[#unindex + 1] = p.member
  removed[p.bucket] = (removed[p.bucket] or 0) + 1
end
batched('ZREM', avail, unindex)
batched('HSET', proxies, tombstones)
local emptied = {}
for bucket, n in pairs(removed) do
  if redis.call('HINCRBY', buckets, bucket, -n) <= 0 then
    redis.call('HDEL', buckets, bucket)
    emptied[bucket] = true
  end
end

-- New hints: where each probed bucket's walk stopped, or its first eligible
-- entry left behind (reserve), or "~" when it ran dry.
local kept = {}
for i = take + 1, #eligible do
  local e = eligible[i]
  if not kept[e.bucket] then kept[e.bucket] = e.key end
end
local hints, dropped = {}, {}
for _, cur in ipairs(probed) do
  local h
  if cur.done then h = '~' else h = key_of(cur) end
  if kept[cur.bucket] and kept[cur.bucket] < h then h = kept[cur.bucket] end
  if emptied[cur.bucket] then
    if hint[cur.bucket] then dropped[#dropped + 1] = cur.bucket end
  elseif h ~= hint[cur.bucket] then
    hints[#hints + 1] = cur.bucket
    hints[#hints + 1] = h
  end
end
if #dropped > 0 then redis.call('HDEL', heads, unpack(dropped)) end
if #hints > 0 then
  -- A new hints hash lives no longer than the index it describes.
  local at = #hint_list == 0 and redis.call('PEXPIRETIME', avail) or nil
  if at == nil or at > 0 then
    redis.call('HSET', heads, unpack(hints))
    if at then redis.call('PEXPIREAT', heads, at) end
  end
end

local result = '{"requestId":' .. cjson.encode(request_id) .. ',"requested":' .. count ..
  ',"extractedAt":' .. now .. ',"proxies":[' .. table.concat(records, ',') .. ']}'
if idem then
  redis.call('SET', idem, digest .. result, 'PX', idem_ttl)
end
return {'ok', result}
