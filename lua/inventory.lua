#!lua flags=no-writes
-- inventory.lua: how many proxies each combination could hand out now, a
-- page of combinations per call.
--
-- KEYS[1..20]: the pool keys (prelude.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: cursor: "" to start, else the cursor the previous page returned
-- ARGV[3]: page size, combinations (1..1000)
-- ARGV[4]: a window, ms: `soon` counts what expires within it
-- Returns: {now, {{combination, eligible, indexed, soon}, ...}, held, cursor}
--   now          the Redis clock (TIME), ms
--   combination  "<protocol>|<region>|<carrier>|<upstream>"
--   eligible     index entries whose deadline is ahead: exactly what
--                extraction could hand out now under the pool policy
--   indexed      all index entries of the combination (spent ones too, until
--                prune.lua removes them)
--   soon         entries of its expiry slice from now + minRemainingTTL to now
--                + window: those eligible entries that expire within the
--                window, plus any spent ones no walk or prune removed yet
--   held         proxies Workers hold (CLAIMED or DRAINING), HLEN of the held set
--   cursor       pass it back for the next page; "" when this was the last
--                (a position in the datom family: the next page starts after it)
-- Errors: "POLICY <pool's policy>" when the pool records another policy.
--
-- Read only (flags=no-writes: it runs at maxmemory and on replicas). It
-- skips from one combination to the next in the datom family: O(log N) per
-- combination, never the pool's size.

pool_policy(ARGV[1])
local cursor, page, window = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if not (is_int(page, 1, 1000) and is_int(window, 0, MAX_MS)) then
  return redis.error_reply('ERR bad inventory arguments')
end
local now = clock()
local from13 = pad13(now + 1)
local t13 = pad13(now + math.max(POLICY_M, 1))
local until13 = pad13(now + window)

local rows = {}
local steps = 0
while #rows < page and steps < 2 * page do
  steps = steps + 1
  local from = cursor == '' and '-' or ('(' .. cursor)
  local first = redis.call('ZRANGEBYLEX', K.datom, from, '+', 'LIMIT', 0, 1)[1]
  if not first then cursor = ''; break end
  local p, r, c, u = string.match(first, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|%d+|%d+|[^|]+$')
  if not p then
    cursor = first                           -- not a member this index writes: step over it
  else
    local combination = p .. '|' .. r .. '|' .. c .. '|' .. u
    local prefix = combination .. '|'
    rows[#rows + 1] = {
      combination,
      redis.call('ZLEXCOUNT', K.datom, '[' .. prefix .. from13, '[' .. prefix .. '\255'),
      redis.call('ZLEXCOUNT', K.datom, '[' .. prefix, '[' .. prefix .. '\255'),
      t13 < until13 and redis.call('ZLEXCOUNT', K.atom, '[' .. prefix .. t13, '(' .. prefix .. until13) or 0,
    }
    cursor = prefix .. '\255'
  end
end
return {now, rows, redis.call('HLEN', K.held), cursor}
