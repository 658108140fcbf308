#!lua flags=no-writes
-- inventory.lua: how many proxies each combination could hand out now, a
-- page of combinations per call.
--
-- KEYS[1..12]: the pool keys (prelude.lua)
-- ARGV[1]: minRemainingTTL, ms
-- ARGV[2]: cursor: "" to start, else the cursor the previous page returned
-- ARGV[3]: page size, combinations (1..1000)
-- Returns: {now, {{combination, eligible, indexed}, ...}, held, cursor}
--   now          the Redis clock (TIME), ms
--   combination  "<protocol>|<region>|<carrier>|<upstream>"
--   eligible     index entries expiring at or after now + minRemainingTTL (the
--                range extraction starts from); exact once the due entries are
--                pruned (prune.lua), which the scheduled health check does first
--   indexed      all index entries of the combination
--   held         proxies Workers hold (CLAIMED or DRAINING), HLEN of the held set
--   cursor       pass it back for the next page; "" when this was the last
--                (a position in the atom family: the next page starts after it)
--
-- Read only (flags=no-writes: it runs at maxmemory and on replicas). It
-- skips from one combination to the next in the atom family: O(log N) per
-- combination, never the pool's size.

local min_ttl, cursor, page = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
if not (is_int(min_ttl, 0, MAX_MS) and is_int(page, 1, 1000)) then
  return redis.error_reply('ERR bad inventory arguments')
end
local now = clock()
local t13 = pad13(now + math.max(min_ttl, 1))

local rows = {}
local steps = 0
while #rows < page and steps < 2 * page do
  steps = steps + 1
  local from = cursor == '' and '-' or ('(' .. cursor)
  local first = redis.call('ZRANGEBYLEX', K.atom, from, '+', 'LIMIT', 0, 1)[1]
  if not first then cursor = ''; break end
  local p, r, c, u = split_locator(first)
  if not p then
    cursor = first                           -- not a member this index writes: step over it
  else
    local combination = p .. '|' .. r .. '|' .. c .. '|' .. u
    local prefix = combination .. '|'
    rows[#rows + 1] = {
      combination,
      redis.call('ZLEXCOUNT', K.atom, '[' .. prefix .. t13, '[' .. prefix .. '\255'),
      redis.call('ZLEXCOUNT', K.atom, '[' .. prefix, '[' .. prefix .. '\255'),
    }
    cursor = prefix .. '\255'
  end
end
return {now, rows, redis.call('HLEN', K.held), cursor}
