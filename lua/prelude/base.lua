-- prelude/base.lua: what every pool script shares before it reads a record:
-- the pool's keys, the one clock (Redis TIME), and the pool's meta (layout
-- version and policy). The prelude heads the function library (loaded once
-- by FUNCTION LOAD, so its definitions are made once, not per call) and is
-- joined in front of each pool script run by EVALSHA where Functions are
-- refused (src/pool/scripts.rs). Its top level only defines.
--
-- The pool keys are KEYS[1..7] of every pool script, in the order of
-- POOL_KEYS below: {pp}:v4:rec, {pp}:v4:due, {pp}:v4:ax, {pp}:v4:hd,
-- {pp}:v4:cnt, {pp}:v4:idem, {pp}:v4:idemx ({pp} is the pool's hash tag).
-- docs/data-model.md ("The keys") describes each: its type, its fields or
-- members, and its TTL: none, so that a volatile-* eviction policy never
-- evicts one; what expires is removed by the scripts.

-- The library functions every script uses, as locals (upvalues are the
-- cheapest names Lua has). A function library's top level runs where only
-- redis.register_function exists, so they are bound by the first call.
-- (Lua's own base functions, tonumber and the like, stay globals.)
local sub, byte, find, match, gmatch, concat, sort
local floor, max, min, call, pcall_redis
local function bind_lua()
  sub, byte, find, match, gmatch = string.sub, string.byte, string.find, string.match, string.gmatch
  concat, sort = table.concat, table.sort
  floor, max, min = math.floor, math.max, math.min
  call, pcall_redis = redis.call, redis.pcall
end

-- The pool keys by name, bound to the call's KEYS[1..7] in this order by
-- bind_keys, the first thing every pool script does.
local K = {}
local POOL_KEYS = {'rec', 'due', 'ax', 'hd', 'cnt', 'idem', 'idemx'}
local POOL_KEY_COUNT = 7
local function bind_keys(keys)
  if not call then bind_lua() end
  for i = 1, POOL_KEY_COUNT do K[POOL_KEYS[i]] = keys[i] end
end

-- This layout's version, recorded in the meta field with the policy.
local LAYOUT = '4'
-- Most arguments sent to one command (Lua's unpack limit is ~8000).
local CHUNK = 1000
local MAX_MS = 9999999999999
local MAX_COUNT = 1000
local ZEROS = '0000000000000'
-- The first score of band 1 (not indexed), as an exclusive bound.
local BAND1 = '(10000000000000'

-- The clock of the current call: NOW (ms, a number) and NOW13 (13 digits).
local NOW, NOW13
local function clock()
  local t = call('TIME')
  NOW13 = t[1] .. sub('00000' .. t[2], -6, -4)
  NOW = tonumber(NOW13)
  return NOW
end

-- 13 digits of a non-negative integer (more when it is 1e13 or over).
local function pad13(n)
  local s = tostring(n)
  if #s >= 13 then return s end
  return sub(ZEROS, 1, 13 - #s) .. s
end

-- A count `s` (decimal digits, as a pattern's %d+ matched them) plus `d`
-- (an integer), floored at 0: the new count as a string, and how much it
-- moved. The common case (the last digit absorbs `d`: no carry, no
-- borrow) swaps the last byte: Lua's number-to-string conversion (an
-- sprintf, ~2k instructions) and its string-to-number one (a strtod, ~1k)
-- cost more than the rest of a counter update. A count written with a
-- leading zero is rewritten plainly.
local DIGITS = {[0] = '0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
local function count_plus(s, d)
  if #s == 1 or byte(s, 1) ~= 48 then
    if d == 0 then return s, 0 end
    local last = byte(s, -1) - 48 + d
    if last >= 0 and last <= 9 then return sub(s, 1, -2) .. DIGITS[last], d end
  end
  local n = tonumber(s)
  local m = max(0, n + d)
  return tostring(m), m - n
end

-- A count `s` less one, as a string; nil when it is 0.
local function less_one(s)
  local n, moved = count_plus(s, -1)
  if moved == 0 then return nil end
  return n
end

local function is_int(v, lo, hi)
  return type(v) == 'number' and v == floor(v) and v >= lo and v <= hi
end

-- The pool policy of the current call: maxHealthCheckAge A, minRemainingTTL
-- m and M1 = max(m, 1) (ms), from the caller's "<A>|<m>" (ARGV[1]).
local POLICY, POLICY_A, POLICY_M, M1, WANT_META
local function read_policy(arg)
  if arg == POLICY then return end        -- (the library's last call's)
  local a, m = match(arg or '', '^(%d+)|(%d+)$')
  a, m = tonumber(a), tonumber(m)
  if not (is_int(a, 0, MAX_MS) and is_int(m, 0, MAX_MS)) then
    error({err = 'ERR bad pool policy argument'})
  end
  POLICY, POLICY_A, POLICY_M, M1 = arg, a, m, max(m, 1)
  WANT_META = LAYOUT .. '|' .. arg
end

-- Checks the pool's meta field (nil when the pool has none yet) against
-- this layout and the caller's policy, before anything is written: another
-- layout raises "LAYOUT <its version>", another policy "POLICY <its A>|<m>".
-- Returns the meta value the pool should record (nil when it has it).
local function check_meta(meta)
  if not meta then return WANT_META end
  if meta == WANT_META then return nil end
  local layout, rest = match(meta, '^([^|]*)|(.*)$')
  if layout ~= LAYOUT then error({err = 'LAYOUT ' .. (layout or meta)}) end
  error({err = 'POLICY ' .. rest})
end

-- A command over a long argument list, in chunks: `head` are its first
-- arguments (key, ...), `args` the rest, `step` how many belong together.
local function chunked(command, key, args, step)
  local n = #args
  if n == 0 then return end
  local size = CHUNK - CHUNK % step
  for i = 1, n, size do
    call(command, key, unpack(args, i, min(i + size - 1, n)))
  end
end

-- The same, returning the replies joined (for reads).
local function chunked_read(command, key, args)
  local n = #args
  if n == 0 then return {} end
  if n <= CHUNK then return call(command, key, unpack(args)) end
  local out = {}
  for i = 1, n, CHUNK do
    local part = call(command, key, unpack(args, i, min(i + CHUNK - 1, n)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end
