#!lua flags=no-writes
-- inventory.lua: how many proxies each combination could hand out now, a
-- page of combinations per call.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: cursor: "0" to start, else the cursor the previous page returned
-- ARGV[3]: page size, combinations (1..1000)
-- ARGV[4]: a window, ms: `soon` counts what expires within it
-- Returns: {now, {{combination, eligible, indexed, soon}, ...}, held, cursor, exact,
--          records, tombstones}
--   now          the Redis clock (TIME), ms
--   combination  "<protocol>|<region>|<carrier>|<upstream>"
--   eligible     indexed entries whose deadline is ahead: exactly what
--                extraction could hand out now under the pool policy
--   indexed      all its indexed entries (spent ones too, until a walk or
--                the prune takes them out)
--   soon         its indexed entries expiring from now + minRemainingTTL to
--                now + window (spent ones among them too)
--   held         proxies Workers hold (CLAIMED or DRAINING)
--   cursor       pass it back for the next page; "0" when this was the last
--   exact        1; 0 when more than SPENT_READ entries are spent: then
--                none is read, and `eligible` counts the spent ones too
--   records      the pool's live records, indexed or not (HLEN rec)
--   tombstones   proxies handed out whose expiry has not yet been pruned
--                (ZCARD due less the records: each has its `due` member);
--                what memory grows with besides N (docs/operations.md)
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" (prelude/base.lua).
--
-- Read only (flags=no-writes: it runs at maxmemory and on replicas). It
-- pages through the counters of cnt (HSCAN) and reads each combination's
-- window from ax: O(log N) per combination, never the pool's size.

local SPENT_READ = 10000
local COMBINATION = '^[hs][^|]*|[^|]*|[^|]*|[^|]*$'

local function inventory(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  local cursor, page, window = argv[2], tonumber(argv[3]), tonumber(argv[4])
  if not (is_int(page, 1, 1000) and is_int(window, 0, MAX_MS)) then
    error({err = 'ERR bad inventory arguments'})
  end
  local meta = call('HGET', K.cnt, 'meta')
  if meta then check_meta(meta) end
  local t13, until13 = pad13(NOW + M1), pad13(min(NOW + window, MAX_MS))
  -- The spent entries, read (with their records, for their combinations)
  -- only when they are few enough to subtract them all.
  local spent_in, exact = NONE, 1
  local spent = call('ZCOUNT', K.due, '-inf', NOW13)
  if spent > SPENT_READ then
    exact = 0
  elseif spent > 0 then
    spent_in = spent_by_atom(call('ZRANGEBYSCORE', K.due, '-inf', NOW13))
  end
  local scan = call('HSCAN', K.cnt, cursor, 'COUNT', page)
  local rows, fields = {}, scan[2]
  for i = 1, #fields, 2 do
    local atom, value = fields[i], fields[i + 1]
    local n = find(atom, COMBINATION) and tonumber(match(value, '\t(%d+)$'))
    if n then
      local prefix = atom .. '|'
      rows[#rows + 1] = {
        atom,
        max(0, n - (spent_in[atom] or 0)),
        n,
        t13 < until13 and call('ZLEXCOUNT', K.ax, '[' .. prefix .. t13, '(' .. prefix .. until13) or 0,
      }
    end
  end
  local held = tonumber(call('HGET', K.cnt, 'held') or '0') or 0
  local records = call('HLEN', K.rec)
  local tombstones = max(0, call('ZCARD', K.due) - records)
  return {NOW, rows, held, scan[1], exact, records, tombstones}
end
