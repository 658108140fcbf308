-- extract/plan.lua, a part of lua/extract.lua: the plan: which head ranges of `hd` hold what the filters name, the
-- enumeration of named combinations, and the exact count by inclusion
-- and exclusion.
-- Joined, with the other parts in src/pool/scripts.rs's order
-- (request, plan, walk, take), between lua/extract.lua's header and its
-- main: one chunk, so each part sees the locals of those before it.

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

-- At most this many ranges are probed unread by a `quick` plan.
local QUICK_RANGES = 3

-- `quick`: the plan of a count=1 request without a reserve, whose first
-- try (take_first) needs only the ranges: with one dimension naming at most
-- QUICK_RANGES (protocol, value) pairs they are probed as named, the
-- counters unread (X.quick); the call plans again (not quick) if the walk
-- must answer.
local function plan(X, quick)
  X.quick = nil
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
  if quick and #dims == 1 and #protocols * (dims[1].values and #dims[1].values or 1) <= QUICK_RANGES then
    -- count=1 without a reserve (take_first): its few ranges, unread.
    local d, ranges = dims[1], {}
    for i = 1, #protocols do
      if d.values then
        local head = d.letter .. '|' .. protocols[i] .. '|'
        for j = 1, #d.values do ranges[#ranges + 1] = head .. d.values[j] .. '|' end
      else
        ranges[i] = 'P|' .. protocols[i] .. '|'
      end
    end
    X.ranges, X.quick = ranges, true
    return
  end
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
