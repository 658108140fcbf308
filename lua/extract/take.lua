-- extract/take.lua, a part of lua/extract.lua: decide, write and charge: the index changes of what the walk passed
-- and took, the reading of every eligible entry when the walk stalled,
-- the commit, the result and idempotency record, the usage counters,
-- and the count=1 fast path.
-- Joined, with the other parts in src/pool/scripts.rs's order
-- (request, plan, walk, take), between lua/extract.lua's header and its
-- main: one chunk, so each part sees the locals of those before it.

-- The index changes of the entries the walk examined: spent and damaged
-- ones leave the index; eligible ones too when `taking`. `known`: whether
-- each cursor's first entry left is known from its page (else ax is read).
local function walked_changes(X, w, ix, taking, known)
  local junk = {}
  for _, cur in ipairs(X.cursors) do
    local atom, from = cur.atom, cur.from
    local run, first, last, survivor, passed = true, nil, nil, nil, 0
    for k = 1, #cur.ex_m do
      local m, fate = cur.ex_m[k], cur.ex_f[k]
      if fate == ELIGIBLE and not taking then
        run = false
        survivor = survivor or sub(m, from)
      else
        if fate == JUNK then
          junk[#junk + 1] = {m, atom, sub(m, from), cur.ex_r[k]}
        elseif fate == SPENT then
          -- Out of ax only (still counted); a run from the slice's start
          -- is noted as its last key.
          if run then passed = passed + 1 else ix_remove(ix, atom, sub(m, from), false) end
        else
          ix_remove(ix, atom, sub(m, from), true)    -- taken
          push2(w.due_set, '1' .. sub(m, from, from + 12), sub(m, from + 14))
        end
        if run then
          first = first or m
          last = m
        else
          w.ax_rem[#w.ax_rem + 1] = m
        end
      end
    end
    if first == last then
      if first then w.ax_rem[#w.ax_rem + 1] = first end
    else
      push2(w.ax_ranges, '[' .. first, '[' .. last)
    end
    if passed > 0 then ix_remove_run(ix, atom, sub(last, from), passed) end
    if ix.by[atom] and known then
      if survivor then ix_next(ix, atom, survivor)
      elseif not cur.done then ix_next(ix, atom, sub(cur.m[cur.i], from))
      else ix_next(ix, atom, false) end
    end
  end
  if #junk > 0 then
    -- Damaged entries leave the index; counted only if their id's `due`
    -- entry is theirs (no record, or one of this locator) and in band 0.
    local ids = {}
    for i = 1, #junk do ids[i] = sub(junk[i][3], 15) end
    local scores = call('ZMSCORE', K.due, unpack(ids))
    for i = 1, #junk do
      local m, atom, key, raw = junk[i][1], junk[i][2], junk[i][3], junk[i][4]
      local own = not raw or record_locator(raw, ids[i]) == m
      local score = own and tonumber(scores[i]) or nil
      ix_remove(ix, atom, key, score ~= nil and score < 1e13)
      -- Its own record leaves band 0; without one, a band-0 entry dangles
      -- (it goes), a band-1 one is a tombstone (it stays).
      if raw and score then
        push2(w.due_set, '1' .. sub(key, 1, 13), ids[i])
      elseif score and score < 1e13 then
        w.due_rem[#w.due_rem + 1] = ids[i]
      end
    end
  end
  for i = 1, #X.bogus do w.hd_rem[#w.hd_rem + 1] = X.bogus[i] end
  for i = 1, #X.refresh do
    local a = touch(ix, X.refresh[i])
    a.fix = true
  end
end

-- Every eligible entry from `due` (when there are at most FEW): the
-- matching ones in expiry order replace the walk's finds. Returns false
-- when there are more.
local function read_all_eligible(X)
  if call('ZCOUNT', K.due, '(' .. NOW13, BAND1) > FEW then return false end
  local locs = locators_of(call('ZRANGEBYSCORE', K.due, '(' .. NOW13, BAND1))
  local order = {}
  for i = 1, #locs do
    local p, r, c, u, e13, id
    if locs[i] then p, r, c, u, e13, id = split_locator(locs[i]) end
    if p and matches_parts(X, p, r, c, u) then order[#order + 1] = e13 .. '|' .. id .. '\1' .. i end
  end
  sort(order)
  X.eligible = #order
  X.sorted, X.sorted_from = order, locs
  return true
end

-- Reads the records of the first `n` of X.sorted into X.taken; false when
-- one is not what `due` says (it leaves the index; the call answers again).
local function take_sorted(X, w, ix, n)
  local ids, ms = {}, {}
  for i = 1, n do
    local entry = X.sorted[i]
    local cut = find(entry, '\1', 1, true)
    ms[i] = X.sorted_from[tonumber(sub(entry, cut + 1))]
    ids[i] = sub(entry, 15, cut - 1)
  end
  local recs = chunked_read('HMGET', K.rec, ids)
  local sound = true
  X.taken, X.taken_m, X.taken_id, X.found = {}, {}, {}, 0
  for i = 1, n do
    local m = ms[i]
    local p, r, c, u, e13, id = split_locator(m)
    local atom = p .. '|' .. r .. '|' .. c .. '|' .. u
    local fate, handed = judge(recs[i] or nil, m)
    if fate == ELIGIBLE then
      X.found = X.found + 1
      X.taken[X.found], X.taken_m[X.found], X.taken_id[X.found] = handed, m, id
    else
      sound = false
      ix_remove(ix, atom, e13 .. '|' .. id, true)
      if not recs[i] then
        w.due_rem[#w.due_rem + 1] = id
      elseif record_locator(recs[i], id) == m then
        push2(w.due_set, '1' .. e13, id)
      end
      w.ax_rem[#w.ax_rem + 1] = m
    end
  end
  return sound
end

-- The taken entries leave the index and become tombstones.
local function taken_changes(X, w, ix, walked)
  for i = 1, X.found do
    local m = X.taken_m[i]
    local id = X.taken_id[i]
    w.rec_del[#w.rec_del + 1] = id
    if not walked then
      local p, r, c, u, e13 = split_locator(m)
      ix_remove(ix, p .. '|' .. r .. '|' .. c .. '|' .. u, e13 .. '|' .. id, true)
      push2(w.due_set, '1' .. e13, id)
      w.ax_rem[#w.ax_rem + 1] = m
    end
  end
end

-- Plans the counts and heads, checks the pool's meta, applies. Returns nil
-- or the reply that refused the writes.
local function commit(w, ix)
  check_meta(plan_index(ix, w))
  return apply(w)
end

-- The usage counters (see src/pool/usage.rs): after every pool write, each
-- a redis.pcall, so a damaged counter hash never fails a committed call.
local function count_usage(X, outcome)
  local usage = X.usage
  if not usage then return end
  local sec = floor(NOW / 1000)
  local hour = sec - sec % 3600
  local key
  if usage.hour_a == hour then key = usage.a
  elseif usage.hour_b == hour then key = usage.b
  else
    redis.log(redis.LOG_WARNING, 'proxy-pool: usage not counted: the caller clock is over 10 minutes off the Redis clock')
    return
  end
  local client, requested = usage.client, X.requested
  local n = outcome == 'ok' and X.found or 0
  local tuples, order = {}, {}
  for i = 1, n do
    local p, r, _, u = split_locator(X.taken_m[i])
    local tuple = u .. '|' .. p .. '|' .. r
    if not tuples[tuple] then order[#order + 1] = tuple; tuples[tuple] = 0 end
    tuples[tuple] = tuples[tuple] + 1
  end
  local created
  if n > 0 and n == X.count and #order == 1 then
    created = pcall_redis('HINCRBY', key, 'f|' .. client .. '|' .. requested .. '|' .. order[1], '1') == 1
  else
    created = pcall_redis('HINCRBY', key, 'c|' .. client .. '|' .. outcome .. '|' .. requested, '1') == 1
    for _, tuple in ipairs(order) do
      if pcall_redis('HINCRBY', key, 'p|' .. client .. '|' .. tuple, tuples[tuple]) == tuples[tuple] then
        created = true
      end
    end
  end
  if created then pcall_redis('EXPIREAT', key, hour + 3600 + usage.life) end
end

-- The committed result, and its idempotency record.
local function record_result(X)
  local parts = {X.rid, X.requested, NOW13}
  for i = 1, X.found do parts[i + 3] = X.taken[i] end
  local result = concat(parts, '\n')
  local idem = X.idem
  if idem then
    local until_ms = NOW + idem.ttl
    call('HSET', K.idem, idem.field, idem.digest .. pad13(until_ms) .. result)
    call('ZADD', K.idemx, until_ms, idem.field)
    for _, old in ipairs(idem.spent) do
      if old ~= idem.field then
        call('HDEL', K.idem, old)
        call('ZREM', K.idemx, old)
      end
    end
  end
  return result
end

-- The first proxy (count=1, the common request; with a reserve, once
-- the count has left one to take) of a plan that checks no head: the least of its ranges' first heads is the
-- soonest entry of all it names.
-- When that entry is eligible and the counters agree with the index, it is
-- taken here in straight-line code: the same writes the walk and the
-- planner make (prelude/index.lua), without their tables. Anything else
-- (a spent or damaged entry, an empty range) returns nil, nothing written,
-- and the walk answers. Returns true when taken, or the reply refusing the
-- writes.
local function take_first(X)
  -- The soonest head among the ranges' first ones, or the enumerated ones.
  local key, atom
  if X.enumerate then
    local atoms, counts = enumerated(X)
    -- "<head>\t<n>": the values order as their heads do ("\t" sorts below
    -- every character of an id); a value without a head starts with "\t".
    local least, at
    for i = 1, #atoms do
      local v = counts[i]
      if v and byte(v, 1) ~= 9 and (not least or v < least) then least, at = v, i end
    end
    if least then key, atom = counter_head(least), atoms[at] end
  end
  local ranges = X.enumerate and NONE or X.ranges
  for i = 1, #ranges do
    local prefix = ranges[i]
    local member = call('ZRANGEBYLEX', K.hd, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', '0', '1')[1]
    if member then
      local plen = #prefix
      local bar = find(member, '|', plen + 15, true)
      if not bar then return nil end
      local k = sub(member, plen + 1, bar - 1)
      if not key or k < key then key, atom = k, sub(member, bar + 1) end
    end
  end
  if not key then
    -- A quick plan's ranges hold no head: nothing indexed matches.
    if X.quick then X.quick, X.nothing = nil, true end
    return nil
  end
  local from = #atom + 2
  local entries = call('ZRANGEBYLEX', K.ax, '[' .. atom .. '|', '[' .. atom .. '|\255', 'LIMIT', '0', '2')
  local first = entries[1]
  if not first or sub(first, from) ~= key or sub(first, from, from + 12) < X.t13 then return nil end
  local id = sub(first, from + 14)
  local fate, handed = judge(call('HGET', K.rec, id) or nil, first)
  if fate ~= ELIGIBLE then return nil end
  local p, r, c, u = match(atom, ATOM)
  local gp, gr, gc, gu = grouping_fields(p, r, c, u)
  local counts = call('HMGET', K.cnt, 'meta', atom, gp, gr, gc, gu)
  check_meta(counts[1])
  local head, n = match(counts[2] or '', ATOM_COUNT)
  if head ~= key then return nil end
  local second = entries[2]
  local next_key = second and sub(second, from) or nil
  -- The counters less this entry (and, when the slice empties, its head),
  -- as strings (see less_one); a counter that would vanish, or is not one,
  -- is left to the walk's planner (it moves the value lists too).
  n = less_one(n)
  if not n then return nil end
  local set, del = {}, {}
  if n ~= '0' or next_key then
    set[1], set[2] = atom, (next_key or '') .. '\t' .. n
  else
    del[1] = atom
  end
  local fields = {gp, gr, gc, gu}
  for j = 1, 4 do
    local gn, ga = match(counts[j + 2] or '', '^(%d+)|(%d+)$')
    if not gn then return nil end
    gn = less_one(gn)
    if not next_key then ga = less_one(ga) end
    if not (gn and ga) or (gn == '0' and ga == '0') then return nil end
    set[#set + 1], set[#set + 2] = fields[j], gn .. '|' .. ga
  end
  -- The writes, `due` first (see apply).
  local refused = pcall_redis('ZADD', K.due, '1' .. sub(first, from, from + 12), id)
  if type(refused) == 'table' and refused.err then return refused end
  call('ZREM', K.ax, first)
  call('HDEL', K.rec, id)
  if #del > 0 then call('HDEL', K.cnt, del[1]) end
  call('HSET', K.cnt, unpack(set))
  call('ZREM', K.hd, heads_of(atom, p, r, c, u, key))
  if next_key then
    local hg, hp, hr, hc, hu = heads_of(atom, p, r, c, u, next_key)
    call('ZADD', K.hd, '0', hg, '0', hp, '0', hr, '0', hc, '0', hu)
  end
  X.found, X.taken, X.taken_m, X.taken_id = 1, {handed}, {first}, {id}
  return true
end

-- `allOrNothing` cannot be met: `available` can be handed out ("backlog":
-- at most that many could be reached past spent entries on the last round).
local function short(X, available)
  count_usage(X, 'short')
  return {'insufficient', tostring(available), NOW13, X.backlog and 'backlog' or nil}
end
