#!lua
-- prune.lua: take out of the pool what time has ended, one bounded batch
-- per call. Nothing in the pool carries a Redis TTL (prelude/base.lua), so
-- this is how records, tombstones and idempotency records go.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: batch, the most entries sweeps 1 and 3 examine (1..1000); sweep 2
--         examines up to ENDED_PER_BATCH times as many (at most BATCH_MAX):
--         an ended record or tombstone costs a few commands, no index
--         change, so a steady pool's tombstones are deleted as fast as they
--         expire
-- Returns: {records, index, idempotency, more}
--   records      records and tombstones deleted (their expiry passed)
--   index        spent entries taken out of the index (their deadline
--                passed: expired, past their margin or minRemainingTTL, or
--                with a stale health check)
--   idempotency  idempotency records deleted (out of force)
--   more         1 when a sweep was full, so another call may find more
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" (prelude/base.lua).
--
-- Sweeps, each over the head of one sorted set, O(log N + batch):
--   1. due, band 0 up to now: spent entries leave the index (ax, counts,
--      heads) and are scored by their expiry (band 1); those whose expiry
--      passed too are ended at once (2.)
--   2. due, band 1 up to 1e13 + now: records and tombstones (a band-1
--      entry without a record) whose expiry passed are deleted; an entry
--      with a damaged record only goes itself
--   3. idemx up to now: idempotency records out of force
-- Every read and decision happens before the first write.

-- The largest batch a call takes, and the multiple of it sweep 2 examines.
local BATCH_MAX = 1000
local ENDED_PER_BATCH = 4

local function prune(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  local batch = tonumber(argv[2])
  if not is_int(batch, 1, BATCH_MAX) then error({err = 'ERR bad prune arguments'}) end
  local w, ix = new_writes(), new_changes()
  local more = 0

  -- 1. Spent index entries (band 0 up to now) and 2. records and
  -- tombstones past their expiry (band 1 up to 1e13 + now): their records
  -- in one read, for the locators that say what counts them.
  local spent = call('ZRANGEBYSCORE', K.due, '-inf', NOW13, 'LIMIT', '0', batch)
  if #spent == batch then more = 1 end
  local ended_max = min(batch * ENDED_PER_BATCH, BATCH_MAX)
  local past = call('ZRANGEBYSCORE', K.due, '10000000000000', '1' .. NOW13, 'LIMIT', '0', ended_max)
  if #past == ended_max then more = 1 end
  local ids = {}
  for i = 1, #spent do ids[i] = spent[i] end
  for i = 1, #past do ids[#spent + i] = past[i] end
  local stored = chunked_read('HMGET', K.rec, ids)
  local records, held = 0, 0
  for i = 1, #ids do
    local id, raw = ids[i], stored[i] or nil
    local e13
    if i <= #spent then e13 = unindex_spent(w, ix, id, raw) else e13 = expiry_of(raw, id) end
    if not e13 then
      -- No record this layout can read: in band 1 without a field, a
      -- tombstone whose expiry passed.
      w.due_rem[#w.due_rem + 1] = id
      if i > #spent and not raw then records = records + 1 end
    else
      if e13 <= NOW13 then
        w.due_rem[#w.due_rem + 1] = id
        w.rec_del[#w.rec_del + 1] = id
        records = records + 1
        local s = byte(raw, 1)
        if s == 67 or s == 71 then held = held + 1 end    -- C, G
      else
        push2(w.due_set, '1' .. e13, id)
      end
    end
  end

  -- 3. Idempotency records out of force.
  local idem = call('ZRANGEBYSCORE', K.idemx, '-inf', NOW13, 'LIMIT', '0', batch)
  if #idem == batch then more = 1 end

  expect_zset(K.ax)
  expect_zset(K.hd)
  local meta, extra = plan_index(ix, w, held > 0 and {'held'} or nil)
  check_meta(meta)
  if held > 0 then
    local n = max(0, (tonumber(extra.held or '0') or 0) - held)
    if n > 0 then push2(w.cnt_set, 'held', tostring(n)) else w.cnt_del[#w.cnt_del + 1] = 'held' end
  end
  local refused = apply(w)
  if refused then return refused end
  if #idem > 0 then
    call('HDEL', K.idem, unpack(idem))
    call('ZREM', K.idemx, unpack(idem))
  end
  return {records, #spent, #idem, more}
end
