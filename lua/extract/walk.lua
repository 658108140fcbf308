-- extract/walk.lua, a part of lua/extract.lua: the count (with a reserve) and the walk: a merge in expiry order over
-- ranges, combinations and entries, judging each candidate's record.
-- Joined, with the other parts in src/pool/scripts.rs's order
-- (request, plan, walk, take), between lua/extract.lua's header and its
-- main: one chunk, so each part sees the locals of those before it.

-- Takes the first `n` spent index entries (ids from the head of `due`) out
-- of the index, their records read in one HMGET.
local function drain(w, ix, spent, n)
  local ids = {}
  for i = 1, min(n, #spent) do ids[i] = spent[i] end
  local raws = chunked_read('HMGET', K.rec, ids)
  for i = 1, #ids do
    local id = ids[i]
    local e13 = unindex_spent(w, ix, id, raws[i] or nil)
    if e13 then push2(w.due_set, '1' .. e13, id) else w.due_rem[#w.due_rem + 1] = id end
  end
end

-- The eligible proxies the filters match, exactly: the counted entries
-- less the spent ones (nil: too many spent entries to subtract; this call
-- drains some of them and answers "again"). Enumerated, it stops at the
-- reserve plus the count: all the call needs once that many are there.
local function count_eligible(X, w, ix)
  if not X.restricted then return call('ZCOUNT', K.due, '(' .. NOW13, BAND1) end
  local spent = call('ZRANGEBYSCORE', K.due, '-inf', NOW13, 'LIMIT', '0', SPENT_READ_LIMIT)
  if #spent > SPENT_READ then
    drain(w, ix, spent, SPENT_DRAIN)
    return nil
  end
  local spent_in = spent_by_atom(spent)
  if not (X.check and X.enumerate) then
    -- One grouping: its counters; several, walked (not enumerated): by
    -- inclusion and exclusion. Less the spent entries the filter matches.
    local sum = X.check and ie_count(X) or X.entries
    for atom, n in pairs(spent_in) do
      if matches(X, atom) then sum = sum - n end
    end
    return max(sum, 0)
  end
  -- Enumerated: per matching combination with a head (one without has only
  -- spent entries), its count less its spent entries; the walk reuses them.
  -- No term is negative, so once the sum covers the reserve and the count
  -- the rest cannot change the call (a short answer's count is exact).
  local atoms, counts = enumerated(X)
  local sum, enough = 0, X.reserve + X.count
  for i = 1, #atoms do
    -- "<head>\t<n>", counted when it has a head (its n read in place).
    local v = counts[i]
    if v and byte(v, 1) ~= 9 then
      local n = tonumber(sub(v, (find(v, '\t', 15, true) or #v) + 1)) or 0
      sum = sum + max(0, n - (spent_in[atoms[i]] or 0))
      if sum >= enough then return sum end
    end
  end
  return sum
end

-- The walk's cursors, in a binary min-heap by their current key
-- ("<expiry>|<id>"): a range cursor's is the head of the combination it
-- stands at, an atom cursor's the entry it stands at.
local function heap_up(h, i)
  while i > 1 do
    local p = floor(i / 2)
    if h[i].key < h[p].key then h[i], h[p] = h[p], h[i]; i = p else return end
  end
end

local function heap_down(h, i)
  local n = #h
  while true do
    local l, m = 2 * i, i
    if l <= n and h[l].key < h[m].key then m = l end
    if l + 1 <= n and h[l + 1].key < h[m].key then m = l + 1 end
    if m == i then return end
    h[i], h[m] = h[m], h[i]
    i = m
  end
end

local function heap_push(h, cur)
  h[#h + 1] = cur
  heap_up(h, #h)
end

local function heap_drop(h)
  local n = #h
  h[1] = h[n]
  h[n] = nil
  if n > 2 then heap_down(h, 1) end
end

-- Page sizes as command arguments (a number argument costs Redis an
-- sprintf a call; the walk's pages are mostly 1-8 entries).
local PAGE_ARG = {'1', '2', '3', '4', '5', '6', '7', '8'}

-- Reads the next page of a cursor over `key` (its members in cur.m from
-- cur.i = 1); false when there is none.
local function next_page(cur, key)
  if cur.short then return false end
  cur.page = min(cur.page * 4, PAGE_MAX)
  cur.m = call('ZRANGEBYLEX', key, '(' .. cur.m[#cur.m], '[' .. cur.prefix .. '\255',
               'LIMIT', '0', PAGE_ARG[cur.page] or cur.page)
  cur.short = #cur.m < cur.page
  cur.i = 1
  cur.recs = {}
  return #cur.m > 0
end

-- Settles a range cursor on its next head from cur.i on: well formed (a
-- member of another shape is damage: it leaves hd) and, when the plan
-- checks heads, of a combination the filters match (the others are passed
-- here, in one loop: a skipped head costs a member read and a check, never
-- a heap step). Sets its key and combination; false when the range has no
-- more.
local function range_at(X, cur)
  local plen, check = cur.plen, X.check
  while cur.i <= #cur.m or next_page(cur, K.hd) do
    local m = cur.m
    for i = cur.i, #m do
      local member = m[i]
      local bar = find(member, '|', plen + 15, true)
      if not bar then
        X.bogus[#X.bogus + 1] = member
      else
        local atom = sub(member, bar + 1)
        if check and not matches(X, atom) then
          local skipped = X.skipped_heads + 1
          X.skipped_heads = skipped
          if skipped > (X.skip_heads_max or skipped) then
            X.restart = true                  -- enumerating costs less now
            return false
          end
        elseif find(member, '^%d%d%d%d%d%d%d%d%d%d%d%d%d|', plen + 1) then
          cur.i, cur.key, cur.atom = i, sub(member, plen + 1, bar - 1), atom
          return true
        else
          X.bogus[#X.bogus + 1] = member
        end
      end
    end
    cur.i = #m + 1
  end
  return false
end

local function open_range(prefix, page)
  local m = call('ZRANGEBYLEX', K.hd, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', '0',
                 PAGE_ARG[page] or page)
  if #m == 0 then return nil end
  return {range = true, prefix = prefix, plen = #prefix, m = m, i = 1, page = page, short = #m < page}
end

local function open_atom(X, atom, page)
  local prefix = atom .. '|'
  local m = call('ZRANGEBYLEX', K.ax, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', '0',
                 PAGE_ARG[page] or page)
  local cur = {atom = atom, prefix = prefix, from = #atom + 2, m = m, i = 1, page = page,
               short = #m < page, recs = {}, burst = 1, ex_m = {}, ex_f = {}, ex_r = {},
               tkey = prefix .. X.t13}
  X.cursors[#X.cursors + 1] = cur
  if #m == 0 then
    cur.done = true
    return nil
  end
  cur.key = sub(m[1], cur.from)
  return cur
end

-- Reads the records of the cursor's page from entry i on (those not spent
-- by their expiry already): one at first, then more each time the cursor
-- needs more (a run of spent entries is read in growing pages), never more
-- than the call still needs unless it passes spent ones.
local function load_records(X, cur, i)
  local n = cur.burst
  cur.burst = min(n * 4, 256)
  if not cur.passed then n = min(n, X.target - X.found) end
  local ids, at = {}, {}
  local m, from, tkey = cur.m, cur.from, cur.tkey
  for j = i, min(#m, i + n - 1) do
    if m[j] >= tkey then
      ids[#ids + 1] = sub(m[j], from + 14)
      at[#ids] = j
    end
  end
  if #ids == 0 then return end
  local recs = call('HMGET', K.rec, unpack(ids))
  for k = 1, #ids do cur.recs[at[k]] = recs[k] or false end
end

-- A range cursor's head has come first: the combination it names is opened
-- (when it passes the filters), and the range moves to its next head.
local function step_range(X, h, cur)
  local atom, head, member = cur.atom, cur.key, cur.m[cur.i]
  cur.i = cur.i + 1
  if range_at(X, cur) then
    heap_down(h, 1)
  else
    heap_drop(h)
  end
  if X.opened[atom] then
    X.bogus[#X.bogus + 1] = member       -- a second head of one combination
    return
  end
  X.opened[atom] = true
  -- A small first page: the next combination's head may come first.
  local ac = open_atom(X, atom, min(X.target - X.found + 1, X.atom_page))
  if not ac or ac.key ~= head then
    X.bogus[#X.bogus + 1] = member       -- a head that is not its atom's first entry
    X.refresh[#X.refresh + 1] = atom
  end
  if ac then heap_push(h, ac) end
end

-- An atom cursor's entry has come first: judged, recorded, passed; and
-- so are the entries after it that still come before every other cursor
-- (a run of spent entries costs a compare and a judgement each, no heap
-- step). Members compare as keys: the cursor's own share one prefix.
-- Once the cursor has passed a spent or damaged entry (its combination's
-- counter and heads are rewritten anyway), the spent entries right after
-- it are passed too, even past the other cursors, across its pages:
-- never a candidate, they leave out of the merge's order at no cost to
-- it, and a backlog spread over many combinations is cleared a run per
-- combination rather than an entry each (the first other entry stops it).
local function step_entry(X, h, cur)
  local limit
  local bound = X.enum_floor_key
  if h[2] then
    if not bound or h[2].key < bound then bound = h[2].key end
    if h[3] and h[3].key < bound then bound = h[3].key end
  end
  if bound then limit = cur.prefix .. bound end
  local m, i, tkey, from = cur.m, cur.i, cur.tkey, cur.from
  local recs, ex_m, ex_f, ex_r = cur.recs, cur.ex_m, cur.ex_f, cur.ex_r
  local n, found, skipped, target = #ex_m, X.found, X.skipped, X.target
  while true do
    local member = m[i]
    local beyond = limit and member > limit
    if beyond and not cur.passed then break end
    local fate, raw, handed
    if member < tkey then
      fate = SPENT
    else
      raw = recs[i]
      if raw == nil then
        X.found = found
        load_records(X, cur, i)
        recs = cur.recs
        raw = recs[i]
      end
      fate, handed = judge(raw, member)
    end
    if beyond and fate ~= SPENT then break end
    n = n + 1
    ex_m[n], ex_f[n] = member, fate
    if fate == ELIGIBLE then
      found = found + 1
      X.taken[found], X.taken_m[found], X.taken_id[found] = handed, member, sub(member, from + 14)
    else
      if fate == JUNK then ex_r[n] = raw end
      if not cur.passed then
        cur.passed = true
        X.touched = X.touched + 1
      end
      skipped = skipped + 1
    end
    i = i + 1
    if found >= target or skipped >= SKIP_MAX then break end
    if not m[i] then
      -- A page ends: past the others, only a run of spent entries goes on.
      if not (beyond and fate == SPENT) or not next_page(cur, K.ax) then break end
      m, i, recs = cur.m, 1, cur.recs
    end
  end
  X.found, X.skipped = found, skipped
  cur.i = i
  if i <= #m or next_page(cur, K.ax) then
    cur.key = sub(cur.m[cur.i], from)
    heap_down(h, 1)
  else
    cur.done = true
    heap_drop(h)
  end
end

-- An enumerated combination's head has come first: it is opened. (A
-- counter whose head is not its slice's first entry is damage: its heads
-- are rewritten.)
local function open_enumerated(X, h, cur)
  local atom = cur.atom
  X.opened[atom] = true
  local ac = open_atom(X, atom, min(X.target - X.found + 1, X.atom_page))
  if not ac or ac.key ~= cur.key then X.refresh[#X.refresh + 1] = atom end
  if ac then heap_push(h, ac) end
end

-- The enumerated combinations with a head join the heap a batch at a
-- time: the least target + 16 by head above X.enum_floor (a
-- counter value "<head>\t<n>": they order as their heads), chosen with a
-- bounded max-heap of those values, so a wide enumeration makes a table
-- only for the heads a walk can reach. X.enum_floor is the batch's last
-- (nil when none is left out); the walk loads the next batch before it
-- passes that head (X.enum_floor_key).
local function push_enumerated(X, h)
  local atoms, counts = enumerated(X)
  local above, k = X.enum_floor, X.target + 16
  local vs, is, n, more = {}, {}, 0, false
  for i = 1, #atoms do
    local v = counts[i]
    if v and byte(v, 1) ~= 9 and (not above or v > above) then
      if n < k then
        n = n + 1
        local j = n
        vs[j], is[j] = v, i
        while j > 1 do
          local p = floor(j / 2)
          if vs[p] >= vs[j] then break end
          vs[p], vs[j], is[p], is[j] = vs[j], vs[p], is[j], is[p]
          j = p
        end
      else
        more = true
        if v < vs[1] then
          vs[1], is[1] = v, i
          local j = 1
          while true do
            local l, m = 2 * j, j
            if l <= n and vs[l] > vs[m] then m = l end
            if l + 1 <= n and vs[l + 1] > vs[m] then m = l + 1 end
            if m == j then break end
            vs[m], vs[j], is[m], is[j] = vs[j], vs[m], is[j], is[m]
            j = m
          end
        end
      end
    end
  end
  X.enum_floor, X.enum_floor_key = nil, nil
  if more then
    X.enum_floor, X.enum_floor_key = vs[1], counter_head(vs[1])
  end
  for j = 1, n do
    heap_push(h, {pending = true, atom = atoms[is[j]], key = counter_head(vs[j])})
  end
end

-- The merge: until `target` eligible entries are found, everything is
-- seen (X.exhausted), or SKIP_MAX entries (or entries in TOUCH_MAX
-- combinations) were passed (X.stuck).
local function walk(X)
  X.found, X.skipped, X.skipped_heads, X.touched = 0, 0, 0, 0
  X.taken, X.taken_m, X.taken_id, X.cursors, X.opened, X.bogus, X.refresh = {}, {}, {}, {}, {}, {}, {}
  if X.nothing or X.target == 0 then X.exhausted = true; return end
  local h = {}
  X.enum_floor, X.enum_floor_key = nil, nil
  -- How many heads the walk sees first: more than it needs proxies, and
  -- each combination it opens most likely gives one (X.atom_page: its
  -- first page holds that entry and the next, the combination's new
  -- head); fewer, and each gives several (a page of up to 8).
  local heads = 0
  if X.enumerate then
    -- The matching combinations with a head, by head, a batch at a time.
    push_enumerated(X, h)
    heads = #h
  else
    local ranges = X.ranges
    local page = #ranges == 1 and min(X.target + 1, 256) or min(floor(X.target / #ranges) + 2, 64)
    for i = 1, #ranges do
      local cur = open_range(ranges[i], page)
      if cur then heads = heads + #cur.m end
      if cur and range_at(X, cur) then heap_push(h, cur) end
      if X.restart then return end
    end
  end
  X.atom_page = heads > X.target and 2 or 8
  while X.found < X.target do
    local cur = h[1]
    if X.enum_floor_key and (not cur or cur.key > X.enum_floor_key) then
      push_enumerated(X, h)
      cur = h[1]
    end
    if not cur then X.exhausted = true; return end
    if cur.range then
      step_range(X, h, cur)
      if X.restart then return end
    elseif cur.pending then
      heap_drop(h)
      open_enumerated(X, h, cur)
    else
      step_entry(X, h, cur)
      if X.skipped >= SKIP_MAX or X.touched >= TOUCH_MAX then X.stuck = true; return end
    end
  end
end
