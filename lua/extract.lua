#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1..12]: the pool keys (prelude.lua)
-- KEYS[13]: (optional) {pp}:idem:<sha256(client id, Idempotency-Key)>  STRING
-- ARGV[1]: count (1..1000)
-- ARGV[2]: fulfillment, "partial" or "allOrNothing"
-- ARGV[3]: reserveForGateway (0..)
-- ARGV[4]: minRemainingTTL, ms
-- ARGV[5]: maxHealthCheckAge, ms
-- ARGV[6]: filters, JSON object; an absent dimension is unrestricted, a
--          present one (even empty) restricts to its values:
--          {"protocols":[..],"regions":[..],"carriers":[..],"upstreams":[..]}
-- ARGV[7]: request id (copied into the committed result)
-- ARGV[8]: request digest, 64 hex chars (only with KEYS[13])
-- ARGV[9]: idempotency record lifetime, ms (only with KEYS[13])
-- ARGV[10]: "1" to rewrite a replayed record's expiry to the same instant
--          (only with KEYS[13]): a write, so a WAIT after this call also
--          covers the record it replays (used when replica acks are on)
-- Usage counters, optional: two more keys (so #KEYS is 14 without an
-- idempotency key, 15 with one) and four more arguments, last:
-- KEYS[#KEYS - 1], KEYS[#KEYS]: {pp}:usage:<hour A>, {pp}:usage:<hour B>  HASH:
--          the hourly counters of the two hours the caller's clock may be in
--          (its time minus and plus ten minutes; usually the same key twice)
-- ARGV[#ARGV - 3]: the client's usage label (no "|", no control characters)
-- ARGV[#ARGV - 2], ARGV[#ARGV - 1]: hour A, hour B: Unix s of the hour's start
-- ARGV[#ARGV]: how long an hour's hash lives after its hour ends, seconds
-- Returns one of:
--   {"ok", result}            committed; result is the JSON recorded for replay:
--                             {"requestId","requested","extractedAt"(ms),"proxies":[..]},
--                             each proxy its details (the response's fields only)
--   {"replay", result}        KEYS[13] held the same digest: nothing was extracted
--   {"conflict"}              KEYS[13] held another digest: nothing was extracted
--   {"insufficient", M, now}  allOrNothing could not be met; M = eligible - reserve,
--                             now the Redis clock it was decided at (ms); no proxy
--                             left the pool (due entries did leave the index)
--   {"again"}                 nothing was extracted: this call only removed index
--                             entries that can no longer be handed out (more were
--                             due than one call removes, or a damaged entry was
--                             found); call again for an exact answer
--
-- How it answers (see prelude.lua for the index):
--   1. Plan: the smallest family whose slices are exactly the filters' match:
--      no filter -> pool (one slice); regions only -> one region slice each;
--      no region -> the kinds matching protocol, carrier and upstream; regions
--      and others -> one atom slice per (region, matching kind).
--   2. Due entries: members of `usable` past their safety margin and of
--      `checked` with a health check older than maxHealthCheckAge, at most
--      PURGE_BATCH of each. Those still indexed (in the atom family) are
--      skipped, and taken out of the index at the end whatever the answer
--      (replays aside): they can never be handed out, and they come back with
--      a fresh health result or a refresh. Every member read leaves its set.
--   3. Count, only with a reserve: ZLEXCOUNT of each slice from
--      now + minRemainingTTL, minus the due entries among them. Exact, and
--      O(log N) per slice, whatever the reserve.
--   4. Walk the slices in expiry order (a k-way merge; with several slices the
--      hints order the probes, so a small request probes about one slice),
--      re-checking every candidate's record, until enough are found.
--   5. Fulfillment, then the writes: removals from every index set, the
--      details deleted and the state made a tombstone, hints, the idempotency
--      record. Nothing before them writes; nothing among them can fail.
--   6. Usage counters (when asked for), after every other write, in the hash
--      of the hour the Redis clock is in. A commit that got all `count`
--      proxies from one (upstream, protocol, region) (every count=1 commit)
--      is one HINCRBY of "f|<client>|<requested>|<upstream>|<protocol>|<region>";
--      any other call one of "c|<client>|<outcome>|<requested>" (outcome ok,
--      short or replay) and, for a commit, one of
--      "p|<client>|<upstream>|<protocol>|<region>" per tuple among the
--      proxies taken (by how many). A hash gets its expiry (EXPIREAT hour
--      end + its lifetime) when a call creates a field.
--      Each is a redis.pcall: a counter hash damaged from outside loses that
--      count, and can never fail a call whose pool writes are already made.
--      Counted: commits (ok, also of zero proxies), allOrNothing refusals
--      for lack of inventory (short) and replays; not key conflicts nor
--      "again" answers (the caller calls again).
-- The cost is O(log N) per slice probed or counted plus the entries examined
-- (count, plus due entries, which each leave the index once): it does not
-- grow with the pool's size, nor with how many regions it holds.

local extra_keys = #KEYS - POOL_KEY_COUNT
local idem = (extra_keys == 1 or extra_keys == 3) and KEYS[POOL_KEY_COUNT + 1] or nil
local usage_client, usage_hour_a, usage_hour_b, usage_life
if extra_keys >= 2 then
  usage_client, usage_hour_a, usage_hour_b, usage_life = ARGV[#ARGV - 3], ARGV[#ARGV - 2], ARGV[#ARGV - 1], ARGV[#ARGV]
end
local PURGE_BATCH = 256

local count = tonumber(ARGV[1])
local reserve = tonumber(ARGV[3])
local min_ttl, max_age = tonumber(ARGV[4]), tonumber(ARGV[5])
if not (is_int(count, 1, MAX_COUNT) and string.find(ARGV[1], '^[1-9]%d*$')
        and is_int(reserve, 0, MAX_U32) and is_int(min_ttl, 0, MAX_MS) and is_int(max_age, 0, MAX_MS)) then
  return redis.error_reply('ERR bad extraction arguments')
end
local all_or_nothing = ARGV[2] == 'allOrNothing'
local decoded, filters = pcall(cjson.decode, ARGV[6])
if not decoded or type(filters) ~= 'table' then
  return redis.error_reply('ERR bad extraction filters')
end
local request_id, digest, idem_ttl, touch_on_replay = ARGV[7], ARGV[8], ARGV[9], ARGV[10]
if usage_client and not (#ARGV >= (idem and 14 or 11) and #usage_client >= 1 and #usage_client <= 128
                         and not string.find(usage_client, '[|%c]') and string.find(usage_hour_a, '^%d+$')
                         and string.find(usage_hour_b, '^%d+$') and string.find(usage_life, '^%d+$')) then
  return redis.error_reply('ERR bad usage arguments')
end

local now, now_text = clock()

-- Usage counters (step 6 above): called once per counted answer, after its writes.
--    `taken` (a committed extraction): the entries handed out, `n` of them.
local function count_usage(outcome, taken, n)
  if not usage_client then return end
  local sec = math.floor(now / 1000)
  local hour = sec - sec % 3600
  local key
  if tonumber(usage_hour_a) == hour then key = KEYS[#KEYS - 1]
  elseif tonumber(usage_hour_b) == hour then key = KEYS[#KEYS]
  else
    redis.log(redis.LOG_WARNING, 'proxy-pool: usage not counted: the caller clock is over 10 minutes off the Redis clock')
    return
  end
  local first = taken and n == count and taken[1].rec
  for i = 2, first and n or 0 do
    local d = taken[i].rec
    if d.upstream ~= first.upstream or d.protocol ~= first.protocol or d.region ~= first.region then
      first = nil
      break
    end
  end
  local created
  if first then
    created = redis.pcall('HINCRBY', key, 'f|' .. usage_client .. '|' .. ARGV[1] .. '|' .. first.upstream
                          .. '|' .. first.protocol .. '|' .. first.region, 1) == 1
  else
    created = redis.pcall('HINCRBY', key, 'c|' .. usage_client .. '|' .. outcome .. '|' .. ARGV[1], 1) == 1
    local by, order = {}, {}
    for i = 1, taken and n or 0 do
      local d = taken[i].rec
      local field = 'p|' .. usage_client .. '|' .. d.upstream .. '|' .. d.protocol .. '|' .. d.region
      local k = by[field]
      if not k then order[#order + 1] = field end
      by[field] = (k or 0) + 1
    end
    for _, field in ipairs(order) do
      if redis.pcall('HINCRBY', key, field, by[field]) == by[field] then created = true end
    end
  end
  if created then redis.pcall('EXPIREAT', key, hour + 3600 + tonumber(usage_life)) end
end

-- 1. Idempotency: a recorded result is replayed, never re-executed.
if idem then
  local prev = redis.call('GET', idem)
  if prev then
    if string.sub(prev, 1, 64) == digest then
      if touch_on_replay == '1' then
        local at = redis.call('PEXPIRETIME', idem)
        if at > 0 then redis.call('PEXPIREAT', idem, at) end
      end
      count_usage('replay')
      return {'replay', string.sub(prev, 65)}
    end
    return {'conflict'}
  end
end

-- 2. The plan: which family, which slices.
-- A restricted dimension: the set of its values and their list (a value that
-- can be no name matches nothing); nil when unrestricted.
local function restriction(list)
  if absent(list) then return nil end
  if type(list) ~= 'table' then return {}, {} end
  local set, values = {}, {}
  for _, v in ipairs(list) do
    if is_name(v) and not set[v] then
      set[v] = true
      values[#values + 1] = v
    end
  end
  return set, values
end
local want_p = restriction(filters.protocols)
local want_r, regions = restriction(filters.regions)
local want_c = restriction(filters.carriers)
local want_u = restriction(filters.upstreams)

local family, slices = 'pool', {''}
if want_r and not (want_p or want_c or want_u) then
  family, slices = 'region', {}
  for _, r in ipairs(regions) do slices[#slices + 1] = r .. '|' end
elseif want_p or want_r or want_c or want_u then
  local kinds = {}
  for _, k in ipairs(redis.call('HKEYS', K.kinds)) do
    local p, c, u = string.match(k, '^([^|]*)|([^|]*)|([^|]*)$')
    if p and (not want_p or want_p[p]) and (not want_c or want_c[c]) and (not want_u or want_u[u]) then
      kinds[#kinds + 1] = {p, c, u}
    end
  end
  slices = {}
  if want_r then
    family = 'atom'
    for _, r in ipairs(regions) do
      for _, k in ipairs(kinds) do slices[#slices + 1] = k[1] .. '|' .. r .. '|' .. k[2] .. '|' .. k[3] .. '|' end
    end
  else
    family = 'kind'
    for _, k in ipairs(kinds) do slices[#slices + 1] = k[1] .. '|' .. k[2] .. '|' .. k[3] .. '|' end
  end
end
local fam_key = K[family]
local in_plan = {}
for _, s in ipairs(slices) do in_plan[s] = true end

-- 3. Due entries: they can never be handed out again without a fresh health
--    result or a refresh (which re-index them), so they leave the index.
--    Each is looked up by its member in the walked family.
local t_min = now + math.max(min_ttl, 1)   -- margin 0: usableUntil = expiresAt > now
local t13 = pad13(t_min)
local cutoff = now - max_age
local due = {}        -- member in the walked family -> its entry
local due_list = {}   -- entries still indexed: {p, r, c, u, e, id, member, slice}
local read = {}       -- {set, n}: the first n members of each set are removed
local more_due = false
for _, spec in ipairs({{K.usable, now_text}, {K.checked, '(' .. cutoff}}) do
  local live, n, more = due_members(spec[1], spec[2], PURGE_BATCH)
  if more then more_due = true end
  read[#read + 1] = {spec[1], n}
  for _, d in ipairs(live) do
    local member, slice = member_in(family, d[1], d[2], d[3], d[4], d[5], d[6])
    if not due[member] then
      d.member, d.slice = member, slice
      due[member] = d
      due_list[#due_list + 1] = d
    end
  end
end

-- Removes what is due (and what was found damaged), changes nothing else,
-- and answers `reply`.
local function purge_only(reply, bad)
  local writes = new_writes()
  for _, d in ipairs(due_list) do unindex_parts(writes, d[1], d[2], d[3], d[4], d[5], d[6]) end
  for _, member in ipairs(bad or {}) do
    push(writes, 'zrem', fam_key, member)
    local loc = locator_from(family, member)
    if loc then unindex(writes, loc, family) end
  end
  local refused = expect_types(writes)
  if refused then return refused end
  apply(writes, read)
  return reply
end
if more_due then return purge_only({'again'}) end

-- 4. Count (only a reserve needs it): every entry in the slices from t_min,
--    minus the due ones among them.
local total
if reserve > 0 then
  total = 0
  for _, s in ipairs(slices) do
    local hi = family == 'pool' and '+' or ('[' .. s .. '\255')
    total = total + redis.call('ZLEXCOUNT', fam_key, '[' .. s .. t13, hi)
  end
  for _, d in ipairs(due_list) do
    if d[5] >= t13 and in_plan[d.slice] then total = total - 1 end
  end
end

local function insufficient(available)
  local reply = purge_only({'insufficient', tostring(available), now_text})
  if reply[1] == 'insufficient' then count_usage('short') end
  return reply
end
local target = count
if reserve > 0 then
  local available = math.max(0, total - reserve)
  if all_or_nothing and available < count then return insufficient(available) end
  target = math.min(count, available)
end

-- 5. The walk: a k-way merge of the slices in expiry order. A cursor reads
--    its slice in pages from t_min. A member is its slice's prefix, then its
--    key "<expiry, 13 digits>|<id>" (which orders members of different
--    slices as each slice orders its own), then (but in the atom family) a
--    tab and the rest of its locator.
local function key_of(cur, member)
  local tab = string.find(member, '\t', cur.from_key + 14, true)
  return string.sub(member, cur.from_key, tab and tab - 1 or -1)
end

local function fill(cur)
  local from = cur.last and ('(' .. cur.last) or ('[' .. cur.prefix .. t13)
  local to = family == 'pool' and '+' or ('[' .. cur.prefix .. '\255')
  local page = redis.call('ZRANGEBYLEX', fam_key, from, to, 'LIMIT', 0, cur.page)
  cur.page = math.min(cur.page * 4, 1024)
  cur.members, cur.pos, cur.records = page, 1, nil
  if #page == 0 then cur.done = true; return false end
  cur.last = page[#page]
  cur.key = key_of(cur, page[1])
  return true
end

local hinted = family ~= 'pool'
local hints = {}
if hinted and #slices > 1 then
  for i = 1, #slices, CHUNK do
    local fields = {}
    for j = i, math.min(i + CHUNK - 1, #slices) do fields[#fields + 1] = family .. ':' .. slices[j] end
    local values = redis.call('HMGET', K.hint, unpack(fields))
    for j, v in ipairs(values) do if v then hints[slices[i + j - 1]] = v end end
  end
end

-- Probed slices are cursors in a binary min-heap by their current key; a
-- slice not probed yet stands for its hint ("" without one: probe it first).
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
local waiting = {}
for i, s in ipairs(slices) do waiting[i] = {slice = s, hint = hints[s] or ''} end
if #waiting > 1 then table.sort(waiting, function(a, b) return a.hint < b.hint end) end
local next_wait = 1

local first_page = math.min(target, math.ceil(target / math.max(#slices, 1))) + 1
local cursors = {}
local valid, bad = {}, {}   -- valid: entries {member, key, rec, cur}, in expiry order
local found = 0
local exhausted = false

-- The details and states of a page, fetched when its first member is examined.
local function load_records(cur)
  local ids = {}
  for i, member in ipairs(cur.members) do
    ids[i] = string.sub(key_of(cur, member), 15)
  end
  cur.records = redis.call('HMGET', K.proxies, unpack(ids))
  cur.states = redis.call('HMGET', K.state, unpack(ids))
end

-- The proxy behind an index entry, if it may be handed out now: its details
-- sound and exactly the entry the index says (the member rebuilt from them),
-- its state allocatable, healthy within the age and before its margin.
-- Returns its details and state.
local function fit(member, key, details_raw, state_raw)
  local d, st = decode_table(details_raw), decode_table(state_raw)
  if not (d and st and sound_details(d) and sound_state(st) and indexed(st)
          and st.usableUntil > now and st.healthCheckedAt >= cutoff) then
    return nil
  end
  local e = string.sub(key, 1, 13)
  if tonumber(e) ~= d.expiresAt or string.sub(key, 15) ~= d.id
     or member_in(family, d.protocol, d.region, d.carrier, d.upstream, e, d.id) ~= member then
    return nil
  end
  return d, st
end

while found < target do
  local top = heap[1]
  local w = waiting[next_wait]
  if w and (top == nil or w.hint <= top.key) then
    next_wait = next_wait + 1
    local cur = {slice = w.slice, prefix = w.slice, from_key = #w.slice + 1, page = first_page,
                 examined = {}, hint = hints[w.slice]}
    cursors[#cursors + 1] = cur
    if fill(cur) then heap[#heap + 1] = cur; sift_up(#heap) end
  elseif top == nil then
    exhausted = true
    break
  else
    local cur = top
    if not cur.records then load_records(cur) end
    local member = cur.members[cur.pos]
    local entry = {member = member, key = cur.key, cur = cur}
    cur.examined[#cur.examined + 1] = entry
    if due[member] then
      entry.fate = 'due'
    else
      local d, st = fit(member, cur.key, cur.records[cur.pos], cur.states[cur.pos])
      if d then
        entry.rec, entry.state, entry.raw = d, st, cur.records[cur.pos]
        valid[#valid + 1] = entry
        found = found + 1
      else
        bad[#bad + 1] = member             -- dangling, malformed or stale: repair first
      end
    end
    cur.pos = cur.pos + 1
    if cur.pos > #cur.members and not fill(cur) then
      heap[1] = heap[#heap]; heap[#heap] = nil
      if #heap > 0 then sift_down(1) end
    else
      cur.key = key_of(cur, cur.members[cur.pos])
      sift_down(1)
    end
  end
end

-- A damaged entry means the counts above may be off: remove it and answer
-- on a clean index (the caller calls again).
if #bad > 0 then return purge_only({'again'}, bad) end

-- 6. Fulfillment.
local available
if exhausted then
  available = math.max(0, found - reserve)   -- the walk saw every eligible entry
elseif reserve > 0 then
  available = math.max(0, total - reserve)
else
  available = found                           -- at least `count`
end
local take = math.min(count, available, found)
if all_or_nothing and take < count then return insufficient(available) end

-- 7. Writes. In the walked family, each slice's examined run that is all
--    removed goes in one ZREMRANGEBYLEX; the rest member by member.
local writes = new_writes()
local ranges = {}
local ranged = {}   -- members of the walked family removed by a range
for i = 1, take do valid[i].fate = 'take' end
for _, cur in ipairs(cursors) do
  local run = 0
  for i, e in ipairs(cur.examined) do
    if e.fate then run = i else break end
  end
  if run > 0 then
    ranges[#ranges + 1] = {'[' .. cur.examined[1].member, '[' .. cur.examined[run].member}
    for i = 1, run do ranged[cur.examined[i].member] = true end
  end
end
for _, d in ipairs(due_list) do
  unindex_parts(writes, d[1], d[2], d[3], d[4], d[5], d[6], ranged[d.member] and family or nil)
end
local records = {}
for i = 1, take do
  local e = valid[i]
  local d = e.rec
  local exp = string.sub(e.key, 1, 13)
  unindex_parts(writes, d.protocol, d.region, d.carrier, d.upstream, exp, d.id,
                ranged[e.member] and family or nil)
  push(writes, 'hdel', K.proxies, d.id)
  push(writes, 'hset', K.state, d.id, tombstone_json(exp))
  records[i] = e.raw
end

-- New hints: each probed slice's first entry left behind, or "~" when it ran dry.
local hint_updates = {}
if hinted then
  for _, cur in ipairs(cursors) do
    local h
    for _, e in ipairs(cur.examined) do
      if e.fate ~= 'take' and e.fate ~= 'due' then h = e.key; break end
    end
    if not h then
      if cur.done then h = '~'
      elseif cur.members and cur.members[cur.pos] then h = cur.key
      elseif cur.examined[#cur.examined] then h = cur.examined[#cur.examined].key
      end
    end
    if h and h ~= cur.hint then hint_updates[#hint_updates + 1] = {family .. ':' .. cur.slice, h} end
  end
end
-- A new hints key lives as long as the index. With no index (the pool
-- family's key absent, so no expiry to take) there is nothing to order:
-- no hint is written, rather than a key that would never expire.
local hint_life
if #hint_updates > 0 and redis.call('EXISTS', K.hint) == 0 then
  hint_life = redis.call('PEXPIRETIME', K.pool)
  if hint_life <= 0 then hint_updates = {} end
end
for _, u in ipairs(hint_updates) do push(writes, 'hset', K.hint, u[1], u[2]) end

local result = '{"requestId":' .. cjson.encode(request_id) .. ',"requested":' .. ARGV[1] ..
  ',"extractedAt":' .. now_text .. ',"proxies":[' .. table.concat(records, ',') .. ']}'

local known = {[fam_key] = #cursors > 0 or nil,
               [K.proxies] = found > 0 or nil, [K.state] = found > 0 or nil,
               [K.hint] = (hinted and #slices > 1) or nil}
local refused = expect_types(writes, known)
if refused then return refused end
for _, range in ipairs(ranges) do redis.call('ZREMRANGEBYLEX', fam_key, range[1], range[2]) end
apply(writes, read)
if hint_life and hint_life > 0 then redis.call('PEXPIREAT', K.hint, hint_life) end
if idem then
  redis.call('SET', idem, digest .. result, 'PX', idem_ttl)
end
count_usage('ok', valid, take)
return {'ok', result}
