#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1..20]: the pool keys (prelude.lua), then, in this order, those the
--   request names:
--   {pp}:idem:<sha256(client id, Idempotency-Key)>  STRING  (with "idem")
--   {pp}:usage:<hour A>, {pp}:usage:<hour B>        HASH    (with "usage"):
--          the hourly counters of the two hours the caller's clock may be in
--          (its time minus and plus ten minutes; usually the same key twice)
--   {pp}:rl:client:<sha256(client id)>              STRING  (with "rate"):
--          the client's rate limit (lua/ratelimit.lua), charged the units of
--          work this call cost beyond the first (see step 8)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: the request, JSON:
--   {"count": 1..1000, "fulfillment": "partial"|"allOrNothing", "reserve": n,
--    "filters": {"protocols":[..],"regions":[..],"carriers":[..],"upstreams":[..]},
--    "requestId": "...",
--    "idem": {"digest": 64 hex, "ttl": ms, "touch": bool},   (optional)
--    "usage": {"client": label, "hourA": s, "hourB": s, "life": s},  (optional)
--    "rate": {"interval": ms per request}}   (optional)
--   A filter dimension that is absent does not restrict; a present one (even
--   empty) restricts to its values. "touch": rewrite a replayed record's
--   expiry to the same instant, a write, so a WAIT after this call also
--   covers the record it replays (used when replica acks are on).
-- Returns one of:
--   {"ok", result, units}     committed; result is the JSON recorded for replay:
--                             {"requestId","requested","extractedAt"(ms),"proxies":[..]},
--                             each proxy its details (the response's fields only)
--   {"replay", result}        the idempotency key held the same digest: nothing extracted
--   {"conflict"}              it held another digest: nothing was extracted
--   {"insufficient", M, now, units}  allOrNothing could not be met; M = eligible -
--                             reserve, now the Redis clock it was decided at (ms)
--   {"broad", slices, most, dims, units}  refused, nothing read past the plan
--                             and nothing written but the charge: the filters
--                             name `slices` combinations (or kinds) of existing
--                             values, more than the `most` one call may search;
--                             dims: "<dimension>=<existing values named>,..."
--   {"again"}                 nothing was extracted: this call only cleaned up
--                             (a damaged entry, or a long run of spent entries
--                             ahead of many eligible ones); call again
--   `units`: what the client's rate limit was charged for this call (step 8).
-- Errors: "POLICY <pool's policy>" when the pool records another policy.
--
-- How it answers (see prelude.lua for the index):
--   1. Plan, from what exists, never from what the request names: each
--      restricted dimension keeps the named values some combination has
--      (none left: nothing matches); one that names every existing value
--      restricts nothing. Then the smallest family whose slices are exactly
--      the match: no restriction -> pool (one slice); regions only -> one
--      region slice each; no region -> the existing kinds matching
--      protocol, carrier and upstream; regions and others -> the existing
--      combinations. A plan over more than MAX_SLICES slices (or that would
--      enumerate more than MAX_CANDIDATES to find them) is refused: "broad".
--   2. Count, only with a reserve: the entries of each slice whose deadline
--      is ahead (ZLEXCOUNT in the deadline family; `live` for the pool).
--      Exact, O(log N) per slice, whatever is spent, expired or due.
--   3. Walk the slices' expiry family from now + minRemainingTTL in expiry
--      order (a k-way merge; with several slices the hints order the probes,
--      so a small request probes about one slice). Each page's deadlines are
--      read from `live` in one ZMSCORE: a spent entry is passed over, an
--      entry ahead of its deadline is re-checked against its record.
--      Past STALE_MAX probes of slices whose hint was stale, the call
--      writes the probed slices' true hints and answers "again" (the next
--      call probes only what it needs).
--      Past SKIP_MAX spent (or junk) entries the walk stops: when at most
--      FEW entries are eligible they are read from the deadline family and
--      taken in expiry order; otherwise the call removes the spent run it
--      passed from the walked family and answers "again" (the next call
--      starts past it).
--   4. Fulfillment, then the writes: the taken entries leave the index,
--      their details are deleted and their state becomes a tombstone; the
--      spent run the walk passed leaves the walked family; hints; the
--      idempotency record. Nothing before them writes; nothing among them
--      can fail.
--   5. Usage counters (when asked for), after every other write, in the hash
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
--      for lack of inventory (short) and replays; not key conflicts, "broad"
--      refusals nor "again" answers (the caller calls again).
--   6-8. See count_usage and charge below.
-- The cost is O(log N) per slice planned, counted or probed, plus the
-- entries examined (count, plus at most SKIP_MAX spent ones): it does not
-- grow with the pool's size, nor with what a request names.

-- Most slices one call may count or walk, most candidate slices it may
-- look up to plan them, and the walk's limits (step 3).
local MAX_SLICES = 256
local MAX_CANDIDATES = 2048
local SKIP_MAX = 2000
local FEW = 1000
-- Most probes of slices whose hint was behind their first entry (a hint
-- goes stale when another family's walk takes that entry, or when it
-- reaches its margin): past it the call writes the probed slices' hints
-- and answers "again" (step 3). A cold probe costs ~100 us here: with the
-- largest plan's own ~1.5 ms, 24 keep a call under 5 ms (measured with
-- `proxy-pool bench --filters slices`: 512 slices cost 4.4 ms a call on
-- average, 256 slices 2.1 ms).
local STALE_MAX = 24
-- Rate limit units (step 8): one per started UNIT_WORK of work, where a
-- slice planned or counted is 1, a page read (a probe) PAGE_WORK, an entry
-- examined 1, a candidate slice looked up or a spent entry passed 1/4, and
-- a proxy taken TAKE_WORK. The weights follow Redis time (one unit of work
-- is ~2.5 us on the 2-core machine: a page's ZRANGEBYLEX and ZMSCORE
-- ~40 us, a proxy's removal from the index 115-240 us), so a unit is
-- ~1.3 ms of Redis time, and a client at 20 requests/s spends at most a
-- few percent of it (docs/performance.md, "Bounded requests").
local UNIT_WORK = 512
local PAGE_WORK = 16
local TAKE_WORK = 48

pool_policy(ARGV[1])
local ok_req, req = pcall(cjson.decode, ARGV[2] or '')
if not ok_req or type(req) ~= 'table' then return redis.error_reply('ERR bad extraction request') end
local count, reserve = req.count, req.reserve
if not (is_int(count, 1, MAX_COUNT) and is_int(reserve, 0, MAX_U32)
        and (req.fulfillment == 'partial' or req.fulfillment == 'allOrNothing')
        and type(req.requestId) == 'string' and (absent(req.filters) or type(req.filters) == 'table')) then
  return redis.error_reply('ERR bad extraction request')
end
local all_or_nothing = req.fulfillment == 'allOrNothing'
local filters = absent(req.filters) and {} or req.filters
local requested = tostring(count)

-- The extra keys, in order.
local next_key = POOL_KEY_COUNT + 1
local idem, usage, rate
if type(req.idem) == 'table' then
  idem = {key = KEYS[next_key], digest = req.idem.digest, ttl = req.idem.ttl, touch = req.idem.touch == true}
  next_key = next_key + 1
  if not (idem.key and type(idem.digest) == 'string' and #idem.digest == 64 and is_int(idem.ttl, 1, MAX_MS)) then
    return redis.error_reply('ERR bad idempotency arguments')
  end
end
if type(req.usage) == 'table' then
  local u = req.usage
  usage = {a = KEYS[next_key], b = KEYS[next_key + 1], client = u.client, hour_a = u.hourA,
           hour_b = u.hourB, life = u.life}
  next_key = next_key + 2
  if not (usage.b and type(u.client) == 'string' and #u.client >= 1 and #u.client <= 128
          and not string.find(u.client, '[|%c]') and is_int(u.hourA, 0, MAX_MS)
          and is_int(u.hourB, 0, MAX_MS) and is_int(u.life, 0, MAX_MS)) then
    return redis.error_reply('ERR bad usage arguments')
  end
end
if type(req.rate) == 'table' then
  rate = {key = KEYS[next_key], interval = req.rate.interval}
  next_key = next_key + 1
  if not (rate.key and type(rate.interval) == 'number' and rate.interval > 0 and rate.interval < MAX_MS) then
    return redis.error_reply('ERR bad rate arguments')
  end
end

local now, now_text = clock()
local work = 0

-- 5. Usage counters: called once per counted answer, after its writes.
--    `taken` (a committed extraction): the entries handed out, `n` of them.
local function count_usage(outcome, taken, n)
  if not usage then return end
  local sec = math.floor(now / 1000)
  local hour = sec - sec % 3600
  local key
  if usage.hour_a == hour then key = usage.a
  elseif usage.hour_b == hour then key = usage.b
  else
    redis.log(redis.LOG_WARNING, 'proxy-pool: usage not counted: the caller clock is over 10 minutes off the Redis clock')
    return
  end
  local client = usage.client
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
    created = redis.pcall('HINCRBY', key, 'f|' .. client .. '|' .. requested .. '|' .. first.upstream
                          .. '|' .. first.protocol .. '|' .. first.region, 1) == 1
  else
    created = redis.pcall('HINCRBY', key, 'c|' .. client .. '|' .. outcome .. '|' .. requested, 1) == 1
    local by, order = {}, {}
    for i = 1, taken and n or 0 do
      local d = taken[i].rec
      local field = 'p|' .. client .. '|' .. d.upstream .. '|' .. d.protocol .. '|' .. d.region
      local k = by[field]
      if not k then order[#order + 1] = field end
      by[field] = (k or 0) + 1
    end
    for _, field in ipairs(order) do
      if redis.pcall('HINCRBY', key, field, by[field]) == by[field] then created = true end
    end
  end
  if created then redis.pcall('EXPIREAT', key, hour + 3600 + usage.life) end
end

-- 8. The charge: the units this call's work comes to (at least 1: the
--    admission already charged that one); the units beyond the first move
--    the client's rate limit (GCRA: its theoretical arrival time) forward by
--    as many emission intervals. A SET that cannot fail, after every other
--    write. Returns the units.
local function charge()
  local units = math.max(1, math.ceil(work / UNIT_WORK))
  if rate and units > 1 then
    local tat = tonumber(redis.call('GET', rate.key) or '0') or 0
    local new_tat = math.max(tat, now) + (units - 1) * rate.interval
    redis.call('SET', rate.key, string.format('%.3f', new_tat), 'PX', math.max(1, math.ceil(new_tat - now)))
  end
  return units
end

-- Idempotency: a recorded result is replayed, never re-executed.
if idem then
  local prev = redis.call('GET', idem.key)
  if prev then
    if string.sub(prev, 1, 64) == idem.digest then
      if idem.touch then
        local at = redis.call('PEXPIRETIME', idem.key)
        if at > 0 then redis.call('PEXPIREAT', idem.key, at) end
      end
      count_usage('replay')
      return {'replay', string.sub(prev, 65)}
    end
    return {'conflict'}
  end
end

-- 1. The plan.
-- A restricted dimension: the named values some combination has, in the
-- order named; nil when unrestricted or when it names every existing value.
local nothing = false   -- a restricted dimension with no existing value: no match
local DIMS = {{'p', 'protocols', K.vp}, {'r', 'regions', K.vr}, {'c', 'carriers', K.vc},
              {'u', 'upstreams', K.vu}}
local want, named = {}, {}
for _, dim in ipairs(DIMS) do
  local key, list = dim[1], filters[dim[2]]
  if not absent(list) then
    local values, seen = {}, {}
    if type(list) == 'table' then
      for _, v in ipairs(list) do
        if is_name(v) and not seen[v] then seen[v] = true; values[#values + 1] = v end
      end
    end
    local existing, set = {}, {}
    if #values > 0 then
      work = work + #values / 4
      local counts = redis.call('HMGET', dim[3], unpack(values))
      for i, v in ipairs(values) do
        if counts[i] then existing[#existing + 1] = v; set[v] = true end
      end
    end
    if #existing == 0 then nothing = true
    elseif #existing < redis.call('HLEN', dim[3]) then
      want[key] = set
      named[key] = existing
    end
  end
end

local function refuse_broad(slices, dims_used)
  local parts = {}
  for _, dim in ipairs(DIMS) do
    local n = dims_used[dim[1]]
    if n then parts[#parts + 1] = dim[2] .. '=' .. n end
  end
  work = work + math.min(slices, MAX_CANDIDATES) / 4
  local units = charge()
  return {'broad', tostring(slices), tostring(MAX_SLICES), table.concat(parts, ','), tostring(units)}
end

local family, slices = 'pool', {''}
if nothing then
  slices = {}
elseif want.r and not (want.p or want.c or want.u) then
  family, slices = 'region', {}
  for _, r in ipairs(named.r) do slices[#slices + 1] = r .. '|' end
elseif want.p or want.r or want.c or want.u then
  -- The kinds (protocol, carrier, upstream) that exist and match: from the
  -- kinds themselves, or from the product of the values when that is smaller.
  local n_kinds = redis.call('HLEN', K.kinds)
  local product, dims_used = 1, {}
  local values = {}
  for _, dim in ipairs({{'p', K.vp}, {'c', K.vc}, {'u', K.vu}}) do
    local d = dim[1]
    local n = named[d] and #named[d] or redis.call('HLEN', dim[2])
    if named[d] then dims_used[d] = n end
    product = product * n
    values[d] = dim[2]
  end
  local regions = named.r and #named.r or 1
  if named.r then dims_used.r = regions end
  local lookups = math.min(product, n_kinds)
  if lookups > MAX_CANDIDATES or (named.r and lookups * regions > MAX_CANDIDATES * 4) then
    return refuse_broad(math.min(product, n_kinds) * regions, dims_used)
  end
  local kinds = {}
  work = work + lookups / 4
  if n_kinds <= product then
    for _, k in ipairs(redis.call('HKEYS', K.kinds)) do
      local p, c, u = string.match(k, '^([^|]*)|([^|]*)|([^|]*)$')
      if p and (not want.p or want.p[p]) and (not want.c or want.c[c]) and (not want.u or want.u[u]) then
        kinds[#kinds + 1] = k
      end
    end
  else
    local lists = {}
    for _, d in ipairs({'p', 'c', 'u'}) do lists[d] = named[d] or redis.call('HKEYS', values[d]) end
    local candidates = {}
    for _, p in ipairs(lists.p) do
      for _, c in ipairs(lists.c) do
        for _, u in ipairs(lists.u) do candidates[#candidates + 1] = p .. '|' .. c .. '|' .. u end
      end
    end
    for i = 1, #candidates, CHUNK do
      local part = {unpack(candidates, i, math.min(i + CHUNK - 1, #candidates))}
      local counts = redis.call('HMGET', K.kinds, unpack(part))
      for j, k in ipairs(part) do if counts[j] then kinds[#kinds + 1] = k end end
    end
  end
  slices = {}
  if not want.r then
    family = 'kind'
    if #kinds > MAX_SLICES then return refuse_broad(#kinds, dims_used) end
    for _, k in ipairs(kinds) do slices[#slices + 1] = k .. '|' end
  else
    family = 'atom'
    if #kinds * regions > MAX_CANDIDATES then return refuse_broad(#kinds * regions, dims_used) end
    local candidates = {}
    for _, k in ipairs(kinds) do
      local p, c, u = string.match(k, '^([^|]*)|([^|]*)|([^|]*)$')
      local cu = '|' .. c .. '|' .. u .. '|'
      for _, r in ipairs(named.r) do candidates[#candidates + 1] = p .. '|' .. r .. cu end
    end
    work = work + #candidates / 4
    for i = 1, #candidates, CHUNK do
      local part = {unpack(candidates, i, math.min(i + CHUNK - 1, #candidates))}
      local counts = redis.call('HMGET', K.atoms, unpack(part))
      for j, a in ipairs(part) do if counts[j] then slices[#slices + 1] = a end end
    end
    if #slices > MAX_SLICES then return refuse_broad(#slices, dims_used) end
  end
end
work = work + #slices
local fam_key = K[family]
local dkey = K[DFAMILY[family] or 'live']

-- 2. Count: the entries of the slices whose deadline is ahead.
local from13 = pad13(now + 1)
local function count_eligible()
  if family == 'pool' then
    return #slices == 0 and 0 or redis.call('ZCOUNT', K.live, '(' .. now_text, '+inf')
  end
  if family == 'atom' then
    -- A combination's entries are counted (atoms): less the spent ones,
    -- read from `live` when there are few, there is no need to count each.
    local spent = redis.call('ZCOUNT', K.live, '-inf', now_text)
    if spent <= FEW then
      local of = {}
      if spent > 0 then
        for _, m in ipairs(redis.call('ZRANGEBYSCORE', K.live, '-inf', now_text, 'LIMIT', 0, FEW)) do
          local loc = locator_from('pool', m)
          local p, r, c, u
          if loc then p, r, c, u = split_locator(loc) end
          if p then
            local slice = slice_of('atom', p, r, c, u)
            of[slice] = (of[slice] or 0) + 1
          end
        end
      end
      work = work + #slices / 4 + spent
      local total = 0
      for i = 1, #slices, CHUNK do
        local part, fields = {}, {}
        for j = i, math.min(i + CHUNK - 1, #slices) do part[#part + 1] = slices[j] end
        local counts = redis.call('HMGET', K.atoms, unpack(part))
        for j, s in ipairs(part) do
          total = total + math.max(0, (tonumber(counts[j] or '0') or 0) - (of[s] or 0))
        end
      end
      return total
    end
  end
  work = work + #slices
  local total = 0
  for _, s in ipairs(slices) do
    total = total + redis.call('ZLEXCOUNT', dkey, '[' .. s .. from13, '[' .. s .. '\255')
  end
  return total
end

local total
local target = count
if reserve > 0 then
  total = count_eligible()
  local available = math.max(0, total - reserve)
  if all_or_nothing and available < count then
    local units = charge()
    count_usage('short')
    return {'insufficient', tostring(available), now_text, tostring(units)}
  end
  target = math.min(count, available)
end

-- 3. The walk: a k-way merge of the slices in expiry order. A cursor reads
--    its slice in pages from t_min. A member is its slice's prefix, then its
--    key "<expiry, 13 digits>|<id>" (which orders members of different
--    slices as each slice orders its own), then (but in the atom family) a
--    tab and the rest of its locator.
local t13 = pad13(now + math.max(POLICY_M, 1))   -- rule 3: e - now >= m (m = 0: e > now)
local function key_of(cur, member)
  local tab = string.find(member, '\t', cur.from_key + 14, true)
  return string.sub(member, cur.from_key, tab and tab - 1 or -1)
end

-- Reads the cursor's next page, its members' locators and their deadlines.
local function fill(cur)
  local from = cur.last and ('(' .. cur.last) or ('[' .. cur.prefix .. t13)
  local to = family == 'pool' and '+' or ('[' .. cur.prefix .. '\255')
  local page = redis.call('ZRANGEBYLEX', fam_key, from, to, 'LIMIT', 0, cur.page)
  work = work + PAGE_WORK
  cur.page = math.min(cur.page * 4, 1024)
  cur.members, cur.pos, cur.records = page, 1, nil
  if #page == 0 then cur.done = true; return false end
  cur.last = page[#page]
  cur.key = key_of(cur, page[1])
  -- Their deadlines, by their members in `live` (the pool family's own).
  local lives = page
  if family ~= 'pool' then
    lives = {}
    for i, member in ipairs(page) do
      local loc = locator_from(family, member)
      lives[i] = loc and live_member(loc) or ''
    end
  end
  cur.ds = redis.call('ZMSCORE', K.live, unpack(lives))
  return true
end

local hinted = family ~= 'pool'
local hints_read = hinted and #slices > 1   -- the hints key's type is then proven
local hints = {}
if hints_read then
  for i = 1, #slices, CHUNK do
    local fields = {}
    for j = i, math.min(i + CHUNK - 1, #slices) do fields[#fields + 1] = slices[j] end
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
-- The slices not probed yet, in hint order: "<hint>\1<slice number>",
-- sorted as plain strings (no comparison function: sorted in C).
local order = {}
for i, s in ipairs(slices) do order[i] = (hints[s] or '') .. '\1' .. i end
if #order > 1 then table.sort(order) end
local next_wait = 1
local function waiting_at(n)
  local entry = order[n]
  if not entry then return nil end
  local cut = string.find(entry, '\1', 1, true)
  local s = slices[tonumber(string.sub(entry, cut + 1))]
  return {slice = s, hint = string.sub(entry, 1, cut - 1)}
end

local first_page = math.min(target, math.ceil(target / math.max(#slices, 1))) + 1
local cursors = {}
local valid = {}     -- entries {member, key, loc, d13, rec, raw, cur}, in expiry order
local damaged = {}   -- indexed, deadline ahead, yet not what the index says: {loc, d13}
local found, skipped, stale = 0, 0, 0
local exhausted, hints_behind = false, false

-- The details and states of the page's members whose deadline is ahead,
-- fetched when the first of them is examined.
local function load_records(cur)
  local ids, at = {}, {}
  local members, ds = cur.members, cur.ds
  for i = 1, #members do
    local d = ds[i]
    if d and tonumber(d) > now then
      ids[#ids + 1] = string.sub(key_of(cur, members[i]), 15)
      at[i] = #ids
    end
  end
  cur.records, cur.states, cur.at = {}, {}, at
  if #ids > 0 then
    cur.records = redis.call('HMGET', K.proxies, unpack(ids))
    cur.states = redis.call('HMGET', K.state, unpack(ids))
  end
end

-- The proxy behind an indexed entry whose deadline is ahead, if it is what
-- the index says: its details sound and exactly the entry's locator, its
-- state takeable with that same deadline. Returns its details.
local function fit(loc, d13, details_raw, state_raw)
  local d, st = decode_table(details_raw), decode_table(state_raw)
  if not (d and st and sound_details(d) and sound_state(st)) then return nil end
  if locator_of(d) ~= loc then return nil end
  st.expiresAt = d.expiresAt
  if not (takeable(st) and type(st.active) == 'number' and type(st.reserved) == 'number'
          and pad13(deadline(st)) == d13) then
    return nil
  end
  return d
end

while found < target and skipped <= SKIP_MAX do
  local top = heap[1]
  local w = waiting_at(next_wait)
  if w and (top == nil or w.hint <= top.key) then
    if stale >= STALE_MAX then
      hints_behind = true
      break
    end
    next_wait = next_wait + 1
    local cur = {slice = w.slice, prefix = w.slice, from_key = #w.slice + 1, page = first_page,
                 examined = {}, hint = hints[w.slice]}
    cursors[#cursors + 1] = cur
    if fill(cur) then heap[#heap + 1] = cur; sift_up(#heap) end
    if cur.done or cur.key ~= w.hint then stale = stale + 1 end
  elseif top == nil then
    exhausted = true
    break
  else
    local cur = top
    local i = cur.pos
    local member = cur.members[i]
    local d = cur.ds[i]
    if d and tonumber(d) <= now then
      -- A run of spent entries, passed over in one step (it may be long:
      -- a stalled health checker's).
      local first, last = i, #cur.members
      while i < last and skipped + (i - first) < SKIP_MAX do
        local nd = cur.ds[i + 1]
        if not (nd and tonumber(nd) <= now) then break end
        i = i + 1
      end
      skipped = skipped + (i - first + 1)
      work = work + (i - first + 1) / 4
      cur.examined[#cur.examined + 1] = {member = member, last = cur.members[i], key = cur.key,
                                         cur = cur, fate = 'spent'}
    else
      local entry = {member = member, key = cur.key, cur = cur}
      cur.examined[#cur.examined + 1] = entry
      work = work + 1
      local loc = locator_from(family, member)
      if not (loc and d) then
        entry.fate = 'junk'             -- not a member of an indexed entry
        skipped = skipped + 1           -- (passed over like a spent one)
      else
        if not cur.records then load_records(cur) end
        local j = cur.at[i]
        local d13 = pad13(tonumber(d))
        local rec = fit(loc, d13, cur.records[j], cur.states[j])
        if rec then
          entry.loc, entry.d13, entry.rec, entry.raw = loc, d13, rec, cur.records[j]
          valid[#valid + 1] = entry
          found = found + 1
        else
          entry.fate = 'junk'
          damaged[#damaged + 1] = {loc, d13}
        end
      end
    end
    cur.pos = i + 1
    if cur.pos > #cur.members and not fill(cur) then
      heap[1] = heap[#heap]; heap[#heap] = nil
      if #heap > 0 then sift_down(1) end
    else
      cur.key = key_of(cur, cur.members[cur.pos])
      sift_down(1)
    end
  end
end

-- The writes of every answer below: in the walked family, each cursor's
-- examined run of entries that leave it goes in one ZREMRANGEBYLEX (the
-- spent ones leave that family only: the rest of the index keeps them until
-- prune.lua); junk members leave their expiry families; damaged entries
-- leave the index.
local writes = new_writes()
local ranges, ranged = {}, {}
local function plan_cleanup()
  for _, cur in ipairs(cursors) do
    local run = 0
    for i, e in ipairs(cur.examined) do
      if e.fate then run = i else break end
    end
    cur.run = run
    if run > 0 then
      local last = cur.examined[run]
      ranges[#ranges + 1] = {'[' .. cur.examined[1].member, '[' .. (last.last or last.member)}
      for i = 1, run do ranged[cur.examined[i].member] = true end
    end
    for _, e in ipairs(cur.examined) do
      if e.fate == 'junk' then
        if not ranged[e.member] then push(writes, 'zrem', fam_key, e.member) end
        local loc = locator_from(family, e.member)
        local p, r, c, u, ex, id
        if loc then p, r, c, u, ex, id = split_locator(loc) end
        if p then
          local members = {members_of(p, r, c, u, ex, id)}
          for i, f in ipairs(FAMILIES) do
            if f ~= family then push(writes, 'zrem', K[f], members[i]) end
          end
        end
      end
    end
  end
  for _, dmg in ipairs(damaged) do
    local p, r, c, u, e, id = split_locator(dmg[1])
    unindex_parts(writes, p, r, c, u, e, id, dmg[2], family)
  end
end

-- New hints (after plan_cleanup): each probed slice's first entry left in
-- it, or "~" when it ran dry. A new hints key lives as long as the index.
-- With no index (the pool family's key absent, so no expiry to take) there
-- is nothing to order: no hint is written, rather than a key that would
-- never expire. Returns the expiry to give a new hints key, if any.
local function plan_hints()
  local hint_updates = {}
  if hinted then
    for _, cur in ipairs(cursors) do
      local h
      local next_left = cur.examined[cur.run + 1]
      if next_left then h = next_left.key
      elseif cur.done then h = '~'
      elseif cur.members and cur.members[cur.pos] then h = cur.key
      end
      if h and h ~= cur.hint then hint_updates[#hint_updates + 1] = {cur.slice, h} end
    end
  end
  local hint_life
  if #hint_updates > 0 and redis.call('EXISTS', K.hint) == 0 then
    hint_life = redis.call('PEXPIRETIME', K.live)
    if hint_life <= 0 then hint_updates = {} end
  end
  for _, u in ipairs(hint_updates) do push(writes, 'hset', K.hint, u[1], u[2]) end
  return hint_life
end

local function cleanup_only(reply, with_hints)
  plan_cleanup()
  local hint_life = with_hints and plan_hints()
  local refused = commit(writes, {[fam_key] = #cursors > 0 or nil,
                                  [K.hint] = (with_hints and hints_read) or nil})
  if refused then return refused end
  for _, range in ipairs(ranges) do redis.call('ZREMRANGEBYLEX', fam_key, range[1], range[2]) end
  if hint_life and hint_life > 0 then redis.call('PEXPIREAT', K.hint, hint_life) end
  return reply
end

-- A damaged entry means the counts above may be off: it leaves the index
-- and the caller calls again on a clean one.
if #damaged > 0 then return cleanup_only({'again'}) end

-- Too many stale hints among the slices ahead: they are set right, and the
-- caller calls again. Its work is charged whole: the admission's unit
-- covers the call that answers.
if hints_behind then
  local reply = cleanup_only({'again'}, true)
  if reply[1] == 'again' then
    work = work + UNIT_WORK
    charge()
  end
  return reply
end

-- Too many spent entries ahead: take the few eligible ones by deadline, or
-- clear the run passed and call again.
if found < target and not exhausted then
  total = total or count_eligible()
  if total > FEW then return cleanup_only({'again'}) end
  -- Every eligible entry of the plan, in expiry order, from the deadline
  -- family: {key "<expiry>|<id>", id, d13, slice}.
  local cands = {}
  for _, s in ipairs(slices) do
    if family == 'pool' then
      local members = redis.call('ZRANGEBYSCORE', K.live, '(' .. now_text, '+inf', 'WITHSCORES',
                                 'LIMIT', 0, FEW + 1)
      for i = 1, #members, 2 do
        local e, id = string.match(members[i], '^(%d+)|([^\t]+)\t')
        if e then
          cands[#cands + 1] = {key = e .. '|' .. id, id = id, d13 = pad13(tonumber(members[i + 1])),
                               slice = s, member = members[i]}
        end
      end
      work = work + 1 + #members / 2
    else
      local members = redis.call('ZRANGEBYLEX', dkey, '[' .. s .. from13, '[' .. s .. '\255', 'LIMIT', 0, FEW + 1)
      for _, m in ipairs(members) do
        local d13, e, id = string.match(string.sub(m, #s + 1), '^(%d+)|(%d+)|([^|]+)$')
        if d13 then cands[#cands + 1] = {key = e .. '|' .. id, id = id, d13 = d13, slice = s, member = m} end
      end
      work = work + 1 + #members
    end
  end
  table.sort(cands, function(a, b) return a.key < b.key end)
  valid, found, exhausted = {}, 0, true
  for i = 1, #cands, CHUNK do
    local ids = {}
    for j = i, math.min(i + CHUNK - 1, #cands) do ids[#ids + 1] = cands[j].id end
    local details = redis.call('HMGET', K.proxies, unpack(ids))
    local states = redis.call('HMGET', K.state, unpack(ids))
    for j in ipairs(ids) do
      local cand = cands[i + j - 1]
      local d = decode_table(details[j])
      local loc = d and sound_details(d) and locator_of(d)
      local p, r, c, u, e, id
      if loc then p, r, c, u, e, id = split_locator(loc) end
      local rec = p and e .. '|' .. id == cand.key and slice_of(family, p, r, c, u) == cand.slice
        and fit(loc, cand.d13, details[j], states[j])
      if not rec then
        -- The index says more than the records: this entry leaves it (what
        -- of it can be found without a sound record: the member read), and
        -- the caller counts again.
        if p then damaged[#damaged + 1] = {loc, cand.d13} end
        push(writes, 'zrem', dkey, cand.member)
        return cleanup_only({'again'})
      end
      valid[#valid + 1] = {key = cand.key, loc = loc, d13 = cand.d13, rec = rec, raw = details[j]}
      found = found + 1
    end
  end
end

-- 4. Fulfillment.
local available
if exhausted then
  available = math.max(0, found - reserve)   -- every eligible entry was seen
elseif reserve > 0 then
  available = math.max(0, total - reserve)
else
  available = found                           -- at least `count`
end
local take = math.min(count, available, found)
if all_or_nothing and take < count then
  local reply = cleanup_only({'insufficient', tostring(available), now_text})
  if reply[1] == 'insufficient' then
    reply[4] = tostring(charge())
    count_usage('short')
  end
  return reply
end

-- The writes: the taken entries leave the index and the pool.
for i = 1, take do valid[i].fate = 'take' end
plan_cleanup()
local records = {}
for i = 1, take do
  local v = valid[i]
  local p, r, c, u, e, id = split_locator(v.loc)
  unindex_parts(writes, p, r, c, u, e, id, v.d13, ranged[v.member] and family or nil)
  push(writes, 'hdel', K.proxies, id)
  push(writes, 'hset', K.state, id, tombstone_json(e))
  records[i] = v.raw
end

local hint_life = plan_hints()

local result = '{"requestId":' .. cjson.encode(req.requestId) .. ',"requested":' .. requested ..
  ',"extractedAt":' .. now_text .. ',"proxies":[' .. table.concat(records, ',') .. ']}'

work = work + TAKE_WORK * take
local known = {[fam_key] = #cursors > 0 or nil,
               [K.proxies] = found > 0 or nil, [K.state] = found > 0 or nil,
               [K.hint] = hints_read or nil}
local refused = commit(writes, known)
if refused then return refused end
for _, range in ipairs(ranges) do redis.call('ZREMRANGEBYLEX', fam_key, range[1], range[2]) end
if hint_life and hint_life > 0 then redis.call('PEXPIREAT', K.hint, hint_life) end
if idem then
  redis.call('SET', idem.key, idem.digest .. result, 'PX', idem.ttl)
end
local units = charge()
count_usage('ok', valid, take)
return {'ok', result, tostring(units)}
