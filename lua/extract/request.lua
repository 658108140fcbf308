-- extract/request.lua, a part of lua/extract.lua: the request and its replay: the limits every phase shares, reading the
-- arguments into X, the idempotency lookup, and the filter match.
-- Joined, with the other parts in src/pool/scripts.rs's order
-- (request, plan, walk, take), between lua/extract.lua's header and its
-- main: one chunk, so each part sees the locals of those before it.

local SKIP_MAX = 400
local TOUCH_MAX = 48
local FEW = 2000
local SPENT_READ = 1000
local SPENT_READ_LIMIT = '1001'   -- SPENT_READ + 1, as a command argument
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
  idem.spent = call('ZRANGEBYSCORE', K.idemx, '-inf', NOW13, 'LIMIT', '0', '2')
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
