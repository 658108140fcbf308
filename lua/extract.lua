#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua); with usage counters, then
--   {pp}:usage:<hour A>, {pp}:usage:<hour B>: the usage counters of the
--   two hours the caller's clock may be in (its time -/+ ten minutes)
-- ARGV[1]  the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]  count, 1..1000
-- ARGV[3]  fulfillment: "partial" or "allOrNothing"
-- ARGV[4]  reserve: eligible proxies matching the filters to leave
-- ARGV[5]  the request id, copied into the result
-- ARGV[6]  which groups of arguments follow, in this order: "f" the
--          filters, "i" idempotency, "u" usage counters (e.g. "", "fi");
--          and "s" (no arguments): the caller's last round, answered from
--          what this call reaches, never "again"
-- then, for "f": the filters on protocol, region, carrier, upstream (four
--          arguments): "*" does not restrict; otherwise each allowed value
--          preceded by "\n" (so "" allows nothing and "\n" only the unknown "")
--      for "i": the idempotency field, sha256(client, key) in hex; the
--          request's digest (64 hex); its window, ms; "1": a replay rewrites
--          its record (so a WAIT after the call covers it: replica acks)
--      for "u": the usage client label; hour A and hour B (Unix s of their
--          starts); their life after the hour ends, s
-- Returns one of:
--   {"ok", result}      committed; result is what a replay returns:
--                       "<requestId>\n<count>\n<extractedAt ms>" then, per proxy
--                       handed out, "\n<locator>\t<host>\t<port>\t<user>\t<pass>"
--                       (prelude/record.lua), soonest-expiring first
--   {"replay", result}  the key holds this digest: nothing extracted
--   {"conflict"}        the key holds another digest: nothing extracted
--   {"insufficient", M, now[, "backlog"]}  allOrNothing not met: M =
--                       eligible - reserve, at the Redis clock `now` (ms);
--                       "backlog" on a last round ("s") that could not
--                       count or walk every entry (M is then what it reached)
--   {"again"}           nothing was extracted: this call only took spent or
--                       damaged entries out of the index (progress that
--                       persists); the caller calls again
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" when the pool records another
--   policy or layout (prelude/base.lua), before anything is written.
--
-- The phases (main, at the end):
--   read     the request
--   replay   an in-force idempotency record answers instead
--   plan     which head ranges of hd hold what the filters name: none -> the
--            G grouping (one range); protocols only -> P ranges; one of
--            region, carrier, upstream (with or without protocol) -> its
--            ranges, one per (protocol, value) named: exact, nothing skipped;
--            two or more -> the grouping whose named ranges hold the fewest
--            combinations, other dimensions checked on each head
--   count    only with a reserve: the eligible proxies the filters match,
--            exactly: counters of what is indexed (several dimensions: the
--            enumerated combinations', or by inclusion and exclusion), less
--            the spent entries
--   walk     a merge in expiry order over ranges (by their current head),
--            combinations (by head) and entries: each candidate's record is
--            judged (prelude/record.lua); spent and damaged entries are passed
--            and leave the index; at most SKIP_MAX of them per call, in at
--            most TOUCH_MAX combinations (each one's counter and heads are
--            rewritten: the costlier bound when they interleave over many)
--   decide   fulfillment; a walk that passed SKIP_MAX entries reads every
--            eligible entry from `due` when there are at most FEW, else
--            answers "again" (the entries it passed are out for good)
--   write    the index changes, tombstones, counts and heads (prelude/index.lua),
--            then the idempotency record
--   usage    the hourly counters (when asked for), each a redis.pcall after
--            every pool write: a damaged counter hash never fails a call

local SKIP_MAX = 400
local TOUCH_MAX = 48
local FEW = 2000
local SPENT_READ = 1000
local SPENT_DRAIN = 256
local PAGE_MAX = 1024
local PROTOCOLS = {'http', 'https', 'socks5'}
local NO_FILTERS = {}
local G_RANGES = {'G|'}

-- One filter argument: nil (no restriction) or {set, list} of its values.
local function read_dim(arg)
  if arg == '*' then return nil end
  if byte(arg, 1) == 10 and not find(arg, '\n', 2, true) then
    local v = sub(arg, 2)                  -- one value, the common filter
    return {set = {[v] = true}, list = {v}}
  end
  local set, list = {}, {}
  for v in gmatch(arg or '', '\n([^\n]*)') do
    if not set[v] then
      set[v] = true
      list[#list + 1] = v
    end
  end
  return {set = set, list = list}
end

-- The request, as the call's state X.
local function read_request(keys, argv)
  local count, reserve = tonumber(argv[2]), tonumber(argv[4])
  local mode = argv[3]
  if not (is_int(count, 1, MAX_COUNT) and is_int(reserve, 0, 4294967296)
          and (mode == 'partial' or mode == 'allOrNothing') and argv[5]) then
    error({err = 'ERR bad extraction request'})
  end
  local X = {count = count, requested = argv[2], all = mode == 'allOrNothing', reserve = reserve,
             rid = argv[5]}
  local groups, at = argv[6] or '', 7
  -- The caller's last round: answer from what this call reaches.
  X.settle = find(groups, 's', 1, true) ~= nil
  if find(groups, 'f', 1, true) then
    -- Naming every protocol does not restrict; an unknown one matches nothing.
    local fp = read_dim(argv[at])
    if fp then
      local known = {}
      for i = 1, 3 do if fp.set[PROTOCOLS[i]] then known[#known + 1] = PROTOCOLS[i] end end
      fp = #known < 3 and {set = fp.set, list = known} or nil
    end
    X.f = {fp, read_dim(argv[at + 1]), read_dim(argv[at + 2]), read_dim(argv[at + 3])}
    at = at + 4
  else
    X.f = NO_FILTERS
  end
  if find(groups, 'i', 1, true) then
    local ttl = tonumber(argv[at + 2])
    if not (#(argv[at + 1] or '') == 64 and is_int(ttl, 1, MAX_MS)) then
      error({err = 'ERR bad idempotency arguments'})
    end
    X.idem = {field = argv[at], digest = argv[at + 1], ttl = ttl, touch = argv[at + 3] == '1'}
    at = at + 4
  end
  if find(groups, 'u', 1, true) then
    local client, a, b, life = argv[at], tonumber(argv[at + 1]), tonumber(argv[at + 2]), tonumber(argv[at + 3])
    if not (keys[POOL_KEY_COUNT + 2] and client and #client <= 128 and not find(client, '[|%c]')
            and is_int(a, 0, MAX_MS) and is_int(b, 0, MAX_MS) and is_int(life, 0, MAX_MS)) then
      error({err = 'ERR bad usage arguments'})
    end
    X.usage = {a = keys[POOL_KEY_COUNT + 1], b = keys[POOL_KEY_COUNT + 2], client = client,
               hour_a = a, hour_b = b, life = life}
  end
  X.t13 = pad13(min(NOW + M1, MAX_MS))   -- rule 3: expiry - now >= m (before it: spent)
  return X
end

-- An in-force idempotency record answers instead of the pool: its value is
-- "<digest><in force until, 13 digits><result>".
local function replay(X)
  local idem = X.idem
  if not idem then return nil end
  local prev = call('HGET', K.idem, idem.field)
  if prev and sub(prev, 65, 77) > NOW13 then
    if sub(prev, 1, 64) ~= idem.digest then return {'conflict'} end
    if idem.touch then call('HSET', K.idem, idem.field, prev) end
    return {'replay', sub(prev, 78)}
  end
  -- Records out of force, removed as this one is written (two per record
  -- written, so they never pile up; the scheduled prune takes the rest).
  idem.spent = call('ZRANGEBYSCORE', K.idemx, '-inf', NOW13, 'LIMIT', 0, 2)
  return nil
end

-- Whether an atom's parts pass every restricted dimension.
local function matches_parts(X, p, r, c, u)
  local f = X.f
  return not ((f[1] and not f[1].set[p]) or (f[2] and not f[2].set[r])
              or (f[3] and not f[3].set[c]) or (f[4] and not f[4].set[u]))
end

local function matches(X, atom)
  local p, r, c, u = match(atom, ATOM)
  return p ~= nil and matches_parts(X, p, r, c, u)
end

-- Two or more of region, carrier and upstream: the combinations the
-- filters match are, per protocol, the product of each dimension's named
-- values that exist (its whole value list when not restricted). When that
-- product is no larger than the heads the best grouping would walk, they
-- are enumerated instead (X.enumerate: per protocol, the values of R, C
-- and U): looked up in cnt, never skipped.
local DIMS = {'R', 'C', 'U'}
-- Named combinations enumerated whatever the walk would cost.
local ENUMERATE_ALWAYS = 256
-- What opening one range of heads costs, in counter reads.
local RANGE_COST = 8
local function plan_enumeration(X, protocols, dims, counts, volume, ranges)
  local per, restricted = {}, {}
  for i = 1, #protocols do per[i] = {} end
  for _, d in ipairs(dims) do
    restricted[d.letter] = true
    local k = d.from
    for i = 1, #protocols do
      local values = {}
      for j = 1, #d.values do
        if counts[k] then values[#values + 1] = d.values[j] end
        k = k + 1
      end
      per[i][d.letter] = values
    end
  end
  local lists, at = {}, {}
  for i = 1, #protocols do
    for _, letter in ipairs(DIMS) do
      if not restricted[letter] then
        lists[#lists + 1] = 'V|' .. letter .. '|' .. protocols[i]
        at[#lists] = {i, letter}
      end
    end
  end
  if #lists > 0 then
    local got = call('HMGET', K.cnt, unpack(lists))
    for j = 1, #lists do
      local values = {}
      for v in gmatch(got[j] or '', '\n([^\n]*)') do values[#values + 1] = v end
      per[at[j][1]][at[j][2]] = values
    end
  end
  local product = 0
  for i = 1, #protocols do product = product + #per[i].R * #per[i].C * #per[i].U end
  -- Enumerating costs a counter read for each of the `product` combinations
  -- named; walking the grouping opens its `ranges` (a page read each,
  -- about RANGE_COST counters) and skips at most the `volume - product`
  -- heads it holds that are not named, when every named one exists (more
  -- when some do not: a walk that skips more than `product` heads starts
  -- again, enumerating).
  local e = {protocols = protocols, per = per}
  if product <= ENUMERATE_ALWAYS or product <= volume - product + RANGE_COST * ranges then
    X.enumerate = e
  else
    X.fallback, X.skip_heads_max = e, product
  end
  X.product = product
end

-- The combinations an enumerated plan names (X.enumerate) and their
-- counters ("<head>\t<n>", nil where none), read once a call.
local function enumerated(X)
  if X.atoms then return X.atoms, X.atom_counts end
  local atoms = {}
  local e = X.enumerate
  for i = 1, #e.protocols do
    local p, v = e.protocols[i], e.per[i]
    for _, r in ipairs(v.R) do
      local pr = p .. '|' .. r .. '|'
      for _, c in ipairs(v.C) do
        local prc = pr .. c .. '|'
        for _, u in ipairs(v.U) do atoms[#atoms + 1] = prc .. u end
      end
    end
  end
  X.atoms, X.atom_counts = atoms, chunked_read('HMGET', K.cnt, atoms)
  return X.atoms, X.atom_counts
end

-- The hd ranges the walk merges (X.ranges, prefixes), whether each head
-- must be checked against the filters (X.check), and the entries counted in
-- the ranges of a single restricted grouping (X.entries). One HMGET of the
-- named grouping values' counters: a value no combination has drops out
-- unread, and nothing is written for it.
-- The dimensions that restrict: one naming every value the pool holds for
-- each protocol asked (its value lists, one HMGET) matches every
-- combination, and is dropped (from the plan and from the checks).
local function uncovered(X, protocols, dims)
  local lists = {}
  for _, d in ipairs(dims) do
    for i = 1, #protocols do lists[#lists + 1] = 'V|' .. d.letter .. '|' .. protocols[i] end
  end
  local got = call('HMGET', K.cnt, unpack(lists))
  X.values = {}
  for i = 1, #lists do X.values[lists[i]] = got[i] or '' end
  local kept, k = {}, 0
  for _, d in ipairs(dims) do
    local named, covered = X.f[d.at].set, true
    for _ = 1, #protocols do
      k = k + 1
      if covered then
        for v in gmatch(got[k] or '', '\n([^\n]*)') do
          if not named[v] then covered = false; break end
        end
      end
    end
    if covered then X.f[d.at] = false else kept[#kept + 1] = d end
  end
  return kept
end

local function plan(X)
  local f = X.f
  for i = 1, 4 do
    if f[i] and #f[i].list == 0 then X.nothing = true; return end
  end
  local protocols = f[1] and f[1].list or PROTOCOLS
  local dims = {}
  if f[2] then dims[#dims + 1] = {letter = 'R', values = f[2].list, at = 2} end
  if f[3] then dims[#dims + 1] = {letter = 'C', values = f[3].list, at = 3} end
  if f[4] then dims[#dims + 1] = {letter = 'U', values = f[4].list, at = 4} end
  X.restricted = f[1] ~= nil or #dims > 0
  if not X.restricted then
    X.ranges = G_RANGES
    return
  end
  if #dims > 1 then
    dims = uncovered(X, protocols, dims)
    X.restricted = f[1] ~= nil or #dims > 0
    if not X.restricted then
      X.ranges = G_RANGES
      return
    end
  end
  if #dims == 0 then dims[1] = {letter = 'P'} end
  local fields = {}
  for _, d in ipairs(dims) do
    d.from = #fields + 1
    for i = 1, #protocols do
      if d.values then
        local head = d.letter .. '|' .. protocols[i] .. '|'
        for j = 1, #d.values do fields[#fields + 1] = head .. d.values[j] end
      else
        fields[#fields + 1] = 'P|' .. protocols[i]
      end
    end
    d.to = #fields
  end
  local counts = chunked_read('HMGET', K.cnt, fields)
  -- Only a choice among groupings, or a count, reads the numbers; one
  -- grouping without a reserve only asks which ranges hold heads.
  local numbers = #dims > 1 or X.reserve > 0
  local best
  for _, d in ipairs(dims) do
    d.ranges, d.entries, d.volume = {}, 0, 0
    local present = false
    for i = d.from, d.to do
      local v = counts[i]
      if v then
        present = true
        if numbers then
          local n, a = match(v, '^(%d+)|(%d+)$')
          d.entries = d.entries + (tonumber(n) or 0)
          d.volume = d.volume + (tonumber(a) or 0)
        end
        -- "<n>|0": no combination of the value has a head
        if not (byte(v, -1) == 48 and byte(v, -2) == 124) then
          d.ranges[#d.ranges + 1] = fields[i] .. '|'
        end
      end
    end
    if not present then X.nothing = true; return end
    if not best or d.volume < best.volume then best = d end
  end
  if #dims > 1 then plan_enumeration(X, protocols, dims, counts, best.volume, #best.ranges) end
  X.ranges, X.entries, X.volume, X.check = best.ranges, best.entries, best.volume, #dims > 1
end

-- The counted entries of a multi-dimension filter, exactly, by inclusion
-- and exclusion over counters: per protocol, the entries of a product
-- S = R x C x U (each a set of values, or the whole dimension) are those of
-- S with one restricted dimension widened to all its values, less those of
-- S with that dimension's complement. A leaf is the protocol's counter, the
-- grouping counters of one dimension's values, or the combinations of a
-- product (enumerated); the splits chosen read the fewest counters, so a
-- filter naming all but a few values costs about what the few would.
local function product_size(s, full)
  local n = 1
  for _, l in ipairs(DIMS) do n = n * (s[l] and #s[l] or #full[l]) end
  return n
end

-- The cheapest way to count product `s` (a dimension: a list of values,
-- or nil for all), splitting only dimensions not in `fixed`: a node
-- {cost (counters read), s, and either wide and narrow (the nodes of the
-- split: s with one dimension widened, less s with its complement) or leaf:
-- "protocol", "grouping" (of dimension `dim`) or "product"}.
local function ie_plan(s, full, comp, fixed)
  local restricted, only = 0, nil
  for _, l in ipairs(DIMS) do if s[l] then restricted, only = restricted + 1, l end end
  if restricted == 0 then return {cost = 1, s = s, leaf = 'protocol'} end
  local best = {cost = product_size(s, full), s = s, leaf = 'product'}
  if restricted == 1 then
    if #s[only] <= best.cost then best = {cost = #s[only], s = s, leaf = 'grouping', dim = only} end
    return best
  end
  for _, l in ipairs(DIMS) do
    if s[l] and not fixed[l] then
      local wide, narrow, f2 = {}, {}, {[l] = true}
      for _, m in ipairs(DIMS) do wide[m], narrow[m] = s[m], s[m] end
      wide[l], narrow[l] = nil, comp[l]
      for m in pairs(fixed) do f2[m] = true end
      local a, b = ie_plan(wide, full, comp, fixed), ie_plan(narrow, full, comp, f2)
      if a.cost + b.cost < best.cost then best = {cost = a.cost + b.cost, wide = a, narrow = b} end
    end
  end
  return best
end

-- Appends the counter fields of plan `node` for protocol `p` to `out`
-- ({fields, signs}), each with `sign`.
local function ie_fields(p, node, full, sign, out)
  if node.wide then
    ie_fields(p, node.wide, full, sign, out)
    ie_fields(p, node.narrow, full, -sign, out)
    return
  end
  local fields, signs, s = out.fields, out.signs, node.s
  if node.leaf == 'protocol' then
    fields[#fields + 1], signs[#fields + 1] = 'P|' .. p, sign
  elseif node.leaf == 'grouping' then
    for _, v in ipairs(s[node.dim]) do
      fields[#fields + 1], signs[#fields + 1] = node.dim .. '|' .. p .. '|' .. v, sign
    end
  else
    for _, r in ipairs(s.R or full.R) do
      for _, c in ipairs(s.C or full.C) do
        for _, u in ipairs(s.U or full.U) do
          fields[#fields + 1], signs[#fields + 1] = p .. '|' .. r .. '|' .. c .. '|' .. u, sign
        end
      end
    end
  end
end

-- The counted entries the multi-dimension filter matches (spent ones
-- included): X.fallback's named values per protocol, X.values' lists.
local function ie_count(X)
  local e = X.fallback
  local out = {fields = {}, signs = {}}
  for i = 1, #e.protocols do
    local p, named = e.protocols[i], e.per[i]
    local s, full, comp = {}, {}, {}
    for j, l in ipairs(DIMS) do
      if X.f[j + 1] then
        -- Restricted: its named values that exist, and the others.
        local list = X.values['V|' .. l .. '|' .. p]
        s[l], full[l], comp[l] = named[l], {}, {}
        local set = {}
        for _, v in ipairs(named[l]) do set[v] = true end
        for v in gmatch(list, '\n([^\n]*)') do
          full[l][#full[l] + 1] = v
          if not set[v] then comp[l][#comp[l] + 1] = v end
        end
      else
        full[l] = named[l]
      end
    end
    ie_fields(p, ie_plan(s, full, comp, {}), full, 1, out)
  end
  local values = chunked_read('HMGET', K.cnt, out.fields)
  local sum = 0
  for i = 1, #out.fields do
    local v = values[i]
    if v then
      local n = match(v, '\t(%d+)$') or match(v, '^(%d+)|')
      sum = sum + out.signs[i] * (tonumber(n) or 0)
    end
  end
  return sum
end

-- Takes spent index entries (locators from the head of `due`) out of the index.
local function drain(w, ix, spent, n)
  for i = 1, min(n, #spent) do
    local m = spent[i]
    local p, r, c, u, e13, id = split_locator(m)
    if p then
      local atom = p .. '|' .. r .. '|' .. c .. '|' .. u
      ix_remove(ix, atom, e13 .. '|' .. id, true)
      push2(w.due_set, '1' .. e13, m)
      w.ax_rem[#w.ax_rem + 1] = m
    else
      w.due_rem[#w.due_rem + 1] = m
    end
  end
end

-- The eligible proxies the filters match, exactly: the counted entries
-- less the spent ones (nil: too many spent entries to subtract; this call
-- drains some of them and answers "again").
local function count_eligible(X, w, ix)
  if not X.restricted then return call('ZCOUNT', K.due, '(' .. NOW13, BAND1) end
  local spent = call('ZRANGEBYSCORE', K.due, '-inf', NOW13, 'LIMIT', 0, SPENT_READ + 1)
  if #spent > SPENT_READ then
    drain(w, ix, spent, SPENT_DRAIN)
    return nil
  end
  if not (X.check and X.enumerate) then
    -- One grouping: its counters; several, walked (not enumerated): by
    -- inclusion and exclusion. Less the spent entries the filter matches.
    local sum = X.check and ie_count(X) or X.entries
    for i = 1, #spent do
      local p, r, c, u = split_locator(spent[i])
      if p and matches_parts(X, p, r, c, u) then sum = sum - 1 end
    end
    return max(sum, 0)
  end
  -- Enumerated: per matching combination with a head (one without has only
  -- spent entries), its count less its spent entries; the walk reuses them.
  local spent_in = {}
  for i = 1, #spent do
    local p, r, c, u = split_locator(spent[i])
    if p then
      local atom = p .. '|' .. r .. '|' .. c .. '|' .. u
      spent_in[atom] = (spent_in[atom] or 0) + 1
    end
  end
  local atoms, counts = enumerated(X)
  local sum = 0
  for i = 1, #atoms do
    -- "<head>\t<n>", counted when it has a head (its n read in place).
    local v = counts[i]
    if v and byte(v, 1) ~= 9 then
      local n = tonumber(sub(v, (find(v, '\t', 15, true) or #v) + 1)) or 0
      sum = sum + max(0, n - (spent_in[atoms[i]] or 0))
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

-- Reads the next page of a cursor over `key` (its members in cur.m from
-- cur.i = 1); false when there is none.
local function next_page(cur, key)
  if cur.short then return false end
  cur.page = min(cur.page * 4, PAGE_MAX)
  cur.m = call('ZRANGEBYLEX', key, '(' .. cur.m[#cur.m], '[' .. cur.prefix .. '\255', 'LIMIT', 0, cur.page)
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
  local m = call('ZRANGEBYLEX', K.hd, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', 0, page)
  if #m == 0 then return nil end
  return {range = true, prefix = prefix, plen = #prefix, m = m, i = 1, page = page, short = #m < page}
end

local function open_atom(X, atom, page)
  local prefix = atom .. '|'
  local m = call('ZRANGEBYLEX', K.ax, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', 0, page)
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
  local ac = open_atom(X, atom, min(X.target - X.found + 1, 8))
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
local function step_entry(X, h, cur)
  local limit
  if h[2] then
    local bound = h[2].key
    if h[3] and h[3].key < bound then bound = h[3].key end
    limit = cur.prefix .. bound
  end
  local m, i, tkey, from = cur.m, cur.i, cur.tkey, cur.from
  local recs, ex_m, ex_f, ex_r = cur.recs, cur.ex_m, cur.ex_f, cur.ex_r
  local n, found, skipped, target = #ex_m, X.found, X.skipped, X.target
  repeat
    local member = m[i]
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
  until found >= target or skipped >= SKIP_MAX or not m[i] or (limit and m[i] > limit)
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
  local ac = open_atom(X, atom, min(X.target - X.found + 1, 8))
  if not ac or ac.key ~= cur.key then X.refresh[#X.refresh + 1] = atom end
  if ac then heap_push(h, ac) end
end

-- The merge: until `target` eligible entries are found, everything is
-- seen (X.exhausted), or SKIP_MAX entries (or entries in TOUCH_MAX
-- combinations) were passed (X.stuck).
local function walk(X)
  X.found, X.skipped, X.skipped_heads, X.touched = 0, 0, 0, 0
  X.taken, X.taken_m, X.taken_id, X.cursors, X.opened, X.bogus, X.refresh = {}, {}, {}, {}, {}, {}, {}
  if X.nothing or X.target == 0 then X.exhausted = true; return end
  local h = {}
  if X.enumerate then
    -- Every matching combination with a head, by its head (heapified).
    local atoms, counts = enumerated(X)
    for i = 1, #atoms do
      local v = counts[i]
      if v and byte(v, 1) ~= 9 then
        h[#h + 1] = {pending = true, atom = atoms[i], key = sub(v, 1, find(v, '\t', 1, true) - 1)}
      end
    end
    for i = floor(#h / 2), 1, -1 do heap_down(h, i) end
  else
    local ranges = X.ranges
    local page = #ranges == 1 and min(X.target + 1, 256) or min(floor(X.target / #ranges) + 2, 64)
    for i = 1, #ranges do
      local cur = open_range(ranges[i], page)
      if cur and range_at(X, cur) then heap_push(h, cur) end
      if X.restart then return end
    end
  end
  while X.found < X.target do
    local cur = h[1]
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
          push2(w.due_set, '1' .. sub(m, from, from + 12), m)
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
    -- Damaged entries leave the index; counted only if `due` indexed them.
    local members = {}
    for i = 1, #junk do members[i] = junk[i][1] end
    local scores = call('ZMSCORE', K.due, unpack(members))
    for i = 1, #junk do
      local m, atom, key, raw = junk[i][1], junk[i][2], junk[i][3], junk[i][4]
      local score = tonumber(scores[i])
      ix_remove(ix, atom, key, score ~= nil and score < 1e13)
      if score then
        local d = decode(raw or nil)
        if d and d.loc == m then push2(w.due_set, '1' .. d.e13, m) else w.due_rem[#w.due_rem + 1] = m end
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
  local members = call('ZRANGEBYSCORE', K.due, '(' .. NOW13, BAND1)
  local order = {}
  for i = 1, #members do
    local p, r, c, u, e13, id = split_locator(members[i])
    if p and matches_parts(X, p, r, c, u) then order[#order + 1] = e13 .. '|' .. id .. '\1' .. i end
  end
  sort(order)
  X.eligible = #order
  X.sorted, X.sorted_from = order, members
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
      local d = decode(recs[i] or nil)
      if d and d.loc == m then push2(w.due_set, '1' .. e13, m) else w.due_rem[#w.due_rem + 1] = m end
      w.ax_rem[#w.ax_rem + 1] = m
    end
  end
  return sound
end

-- The taken entries leave the index and become tombstones.
local function taken_changes(X, w, ix, walked)
  for i = 1, X.found do
    local m = X.taken_m[i]
    push2(w.rec_set, X.taken_id[i], 'X' .. m)
    if not walked then
      local p, r, c, u, e13, id = split_locator(m)
      ix_remove(ix, p .. '|' .. r .. '|' .. c .. '|' .. u, e13 .. '|' .. id, true)
      push2(w.due_set, '1' .. e13, m)
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
    created = pcall_redis('HINCRBY', key, 'f|' .. client .. '|' .. requested .. '|' .. order[1], 1) == 1
  else
    created = pcall_redis('HINCRBY', key, 'c|' .. client .. '|' .. outcome .. '|' .. requested, 1) == 1
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
    if least then key, atom = sub(least, 1, find(least, '\t', 1, true) - 1), atoms[at] end
  end
  local ranges = X.enumerate and NONE or X.ranges
  for i = 1, #ranges do
    local prefix = ranges[i]
    local member = call('ZRANGEBYLEX', K.hd, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', 0, 1)[1]
    if member then
      local plen = #prefix
      local bar = find(member, '|', plen + 15, true)
      if not bar then return nil end
      local k = sub(member, plen + 1, bar - 1)
      if not key or k < key then key, atom = k, sub(member, bar + 1) end
    end
  end
  if not key then return nil end
  local from = #atom + 2
  local entries = call('ZRANGEBYLEX', K.ax, '[' .. atom .. '|', '[' .. atom .. '|\255', 'LIMIT', 0, 2)
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
  n = tonumber(n) - 1
  local set, del = {}, {}
  if n > 0 or next_key then
    set[1], set[2] = atom, (next_key or '') .. '\t' .. n
  else
    del[1] = atom
  end
  local gone = next_key and 0 or 1
  local fields = {gp, gr, gc, gu}
  for j = 1, 4 do
    local gn, ga = match(counts[j + 2] or '0|0', '^(%d+)|(%d+)$')
    gn, ga = max(0, (tonumber(gn) or 1) - 1), max(0, (tonumber(ga) or gone) - gone)
    if gn > 0 or ga > 0 then
      set[#set + 1], set[#set + 2] = fields[j], gn .. '|' .. ga
    else
      -- A value vanishing from the pool moves a value list: the walk's
      -- planner does that.
      return nil
    end
  end
  -- The writes, `due` first (see apply).
  local refused = pcall_redis('ZADD', K.due, '1' .. sub(first, from, from + 12), first)
  if type(refused) == 'table' and refused.err then return refused end
  call('ZREM', K.ax, first)
  call('HSET', K.rec, id, 'X' .. first)
  if #del > 0 then call('HDEL', K.cnt, unpack(del)) end
  call('HSET', K.cnt, unpack(set))
  local heads = {}
  push_heads(heads, atom, p, r, c, u, key)
  call('ZREM', K.hd, unpack(heads))
  if next_key then
    heads = {}
    push_heads(heads, atom, p, r, c, u, next_key, true)
    call('ZADD', K.hd, unpack(heads))
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

local function extract(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  local X = read_request(keys, argv)
  local answered = replay(X)
  if answered then
    if answered[1] == 'replay' then count_usage(X, 'replay') end
    return answered
  end
  plan(X)
  local w, ix = new_writes(), new_changes()
  X.target = X.count
  if X.reserve > 0 and not X.nothing then
    local eligible = count_eligible(X, w, ix)
    if not eligible and not X.settle then
      local refused = commit(w, ix)
      return refused or {'again'}
    end
    -- Uncountable on the last round: nothing can be spared for the caller.
    X.backlog = not eligible
    X.available = max(0, (eligible or 0) - X.reserve)
    X.target = min(X.count, X.available)
    if X.all and X.available < X.count then
      local refused = commit(w, ix)
      if refused then return refused end
      return short(X, X.available)
    end
  end
  -- (With a reserve, once the count planned no writes of its own.)
  if X.target == 1 and not X.nothing and (X.enumerate or not X.check)
     and (X.reserve == 0 or (next(w) == nil and #ix.order == 0)) then
    local taken = take_first(X)
    if taken == true then
      local result = record_result(X)
      count_usage(X, 'ok')
      return {'ok', result}
    elseif taken then
      return taken
    end
  end
  walk(X)
  if X.restart then
    -- The walk skipped more heads than the named combinations number: it
    -- read only, so it starts again over them.
    X.enumerate, X.skip_heads_max, X.restart = X.fallback, nil, nil
    walk(X)
  end
  -- Decide.
  local walked = true
  if X.stuck and not read_all_eligible(X) then
    if not X.settle then
      walked_changes(X, w, ix, false, true)
      local refused = commit(w, ix)
      return refused or {'again'}
    end
    -- The last round answers from the entries the walk reached.
    X.stuck, X.backlog = false, true
  end
  if X.stuck then
    walked = false
    local available = max(0, X.eligible - X.reserve)
    local take = min(X.count, available)
    if X.all and take < X.count then
      walked_changes(X, w, ix, false, true)
      local refused = commit(w, ix)
      if refused then return refused end
      return short(X, available)
    end
    walked_changes(X, w, ix, false, false)
    if not take_sorted(X, w, ix, take) then
      local refused = commit(w, ix)
      return refused or {'again'}
    end
  elseif X.all and X.found < X.count then
    walked_changes(X, w, ix, false, true)
    local refused = commit(w, ix)
    if refused then return refused end
    return short(X, X.found)
  else
    walked_changes(X, w, ix, true, true)
  end
  taken_changes(X, w, ix, walked)
  local refused = commit(w, ix)
  if refused then return refused end
  local result = record_result(X)
  count_usage(X, 'ok')
  return {'ok', result}
end
