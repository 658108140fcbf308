#!lua
-- contract.lua: the pool's health and Worker-ownership operations, many per
-- call, each applied as if it were a call of its own, all in one atomic
-- call. Extraction (extract.lua) and these operations exclude each other by
-- construction: a proxy is in the index only while no Worker holds it, a
-- claim takes it out of the index in the same call that checks it, and
-- extraction re-checks the record it takes.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2..]: operations, six arguments each: name, proxy id, then its own
--   (unused ones ""):
--   health   "1" passed / "0" failed, checkedAt ms ("" = now)
--            Records a health result; one older than the recorded one is "stale".
--   claim    worker, minRemainingTTL ms, maxHealthCheckAge ms (the Gateway's
--            own rules for its claim, whatever the pool policy)
--            Takes an allocatable, eligible proxy out of the index for the
--            Worker: CLAIMED, owner = worker, epoch + 1 (its fencing token).
--   drain    worker, epoch: the Controller publishes DRAINING for that holder
--   ack      worker, epoch, active, reserved: the Worker reports its use of a
--            DRAINING proxy; at 0 and 0 it is DRAINED, allocatable (rule 2)
--   release  worker, epoch: clears the ownership of a DRAINED proxy:
--            AVAILABLE, epoch + 1
--   remove   deletes a proxy (not a tombstone: an extracted proxy stays out)
-- Every ownership operation names the holder and epoch it believes in; a
-- stale Worker's (or Controller's) late write is refused as "not-owner".
-- Returns: the Redis clock (ms), then per operation its verdict and the
--   record's epoch after it (0 if none): "ok" or the refusal "unknown",
--   "extracted", "expired", "stale", "ineligible", "not-owner", "state".
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" (prelude/base.lua); a malformed
--   operation fails the whole call before anything is written.
--
-- The `held` field of cnt counts the records CLAIMED or DRAINING.

local WORKER = '^[^%c]+$'
local HELD = {C = true, G = true}

local function copy(t)
  local out = {}
  for k, v in pairs(t) do out[k] = v end
  return out
end

local function count_arg(v)
  local n = tonumber(v)
  if is_int(n, 0, 4294967296) then return tostring(n) end
  return nil
end

-- A health result's checkedAt argument, ms ("" = now).
local function checked_at(arg)
  local at = arg == '' and NOW or tonumber(arg)
  if not is_int(at, 0, MAX_MS) then error({err = 'ERR bad checkedAt'}) end
  return at
end

-- One operation on `rec` (a copy of the current record); returns its
-- verdict, and the record after it when applied (false: deleted).
local function operate(op, rec, a1, a2, a3, a4)
  if op == 'remove' then return 'ok', false end
  if rec.e13 <= NOW13 then return 'expired' end
  local holds = rec.owner == a1 and rec.epoch == a2
  if op == 'health' then
    local c13 = pad13(checked_at(a2))
    if c13 < rec.c13 then return 'stale' end
    rec.h, rec.c13 = a1 == '1' and '1' or '0', c13
  elseif op == 'claim' then
    local min_ttl, max_age = tonumber(a2), tonumber(a3)
    if not (is_int(min_ttl, 0, MAX_MS) and is_int(max_age, 0, MAX_MS) and find(a1, WORKER)) then
      error({err = 'ERR bad claim arguments'})
    end
    if not ((rec.s == 'A' or rec.s == 'R') and rec.h == '1' and tonumber(rec.u13) > NOW
            and tonumber(rec.e13) - NOW >= min_ttl and tonumber(rec.c13) >= NOW - max_age) then
      return 'ineligible'
    end
    rec.s, rec.owner, rec.epoch, rec.active, rec.reserved = 'C', a1, tostring(tonumber(rec.epoch) + 1), '0', '0'
  elseif op == 'drain' then
    if not holds then return 'not-owner' end
    if rec.s ~= 'C' and rec.s ~= 'G' then return 'state' end
    rec.s = 'G'
  elseif op == 'ack' then
    if not holds then return 'not-owner' end
    if rec.s ~= 'G' and rec.s ~= 'R' then return 'state' end
    local active, reserved = count_arg(a3), count_arg(a4)
    if not (active and reserved) then error({err = 'ERR bad ack arguments'}) end
    rec.active, rec.reserved = active, reserved
    rec.s = (active == '0' and reserved == '0') and 'R' or 'G'
  elseif op == 'release' then
    if not holds then return 'not-owner' end
    if rec.s ~= 'R' then return 'state' end
    rec.s, rec.owner, rec.epoch, rec.active, rec.reserved = 'A', '', tostring(tonumber(rec.epoch) + 1), '0', '0'
  else
    error({err = 'ERR unknown operation'})
  end
  set_deadline(rec)
  return 'ok', rec
end

-- A record's head as a health result's fast path reads it: allocatable,
-- healthy, then D, U and C (13 digits each).
local INDEXED_TIMES = '^[AR]1' .. D13 .. D13 .. D13
local EPOCH = '\t(%d+)\t%d+\t%d+\t[^\t]*$'

-- A health result on the raw record of a proxy named once in the call,
-- when it changes nothing but times: an indexed record (allocatable,
-- healthy, D ahead) told it passed, at a checkedAt that keeps D ahead. Its
-- index entry stays, only its `due` score moves: no decode, no index
-- change. Returns the verdict, the epoch, and the record after it and its
-- `due` score D when it changed; nil when the general path must
-- judge it.
local function health_fast(raw, id, ok, at)
  if ok ~= '1' or not raw or not find(raw, INDEXED_TIMES) or sub(raw, 3, 15) <= NOW13 then
    return nil
  end
  local tab = find(raw, '\t', LOC_AT, true)
  local epoch = tab and match(raw, EPOCH, tab)
  if not epoch then return nil end
  local loc = sub(raw, LOC_AT, tab - 1)
  local cut = #loc - #id
  if sub(loc, cut + 1) ~= id or byte(loc, cut) ~= 124 or byte(loc, cut - 14) ~= 124 then return nil end
  local when = checked_at(at)
  local c13 = pad13(when)
  if c13 < sub(raw, 29, 41) then return 'stale', tonumber(epoch) end
  local u13 = sub(raw, 16, 28)
  local d13 = pad13(deadline(tonumber(u13), tonumber(sub(loc, cut - 13, cut - 1)), when))
  if d13 <= NOW13 then return nil end
  return 'ok', tonumber(epoch), sub(raw, 1, 2) .. d13 .. u13 .. c13 .. sub(raw, LOC_AT), d13
end

local function contract(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  if (#argv - 1) % 6 ~= 0 or #argv < 7 then error({err = 'ERR bad contract arguments'}) end
  local ids, named = {}, {}
  for i = 2, #argv, 6 do
    local id = argv[i + 1]
    ids[#ids + 1] = id
    named[id] = (named[id] or 0) + 1
  end
  local stored = chunked_read('HMGET', K.rec, ids)
  -- Health results that change only times, on proxies named once.
  local w, fast = new_writes(), {}
  for i = 1, #ids do
    local at = 2 + (i - 1) * 6
    local id = ids[i]
    if argv[at] == 'health' and named[id] == 1 then
      local verdict, epoch, raw, d13 = health_fast(stored[i] or nil, id, argv[at + 2], argv[at + 3])
      if verdict then
        fast[id] = {verdict, epoch}
        if raw then
          push2(w.rec_set, id, raw)
          push2(w.due_set, d13, id)
        end
      end
    end
  end
  local before, current, order, was, damaged = read_before(ids, stored, fast)
  if damaged then return redis.error_reply('ERR damaged pool: unreadable record') end

  local reply = {NOW}
  for i = 2, #argv, 6 do
    local op, id = argv[i], argv[i + 1]
    local rec = current[id]
    local verdict, after
    if fast[id] then
      reply[#reply + 1] = fast[id][1]
      reply[#reply + 1] = fast[id][2]
    elseif not rec then
      verdict = 'unknown'
    elseif rec.tomb then
      verdict = 'extracted'
    else
      verdict, after = operate(op, copy(rec), argv[i + 2], argv[i + 3], argv[i + 4], argv[i + 5])
      if after ~= nil then current[id] = after end
    end
    if not fast[id] then
      local now_rec = current[id]
      reply[#reply + 1] = verdict
      reply[#reply + 1] = (now_rec and not now_rec.tomb) and tonumber(now_rec.epoch) or 0
    end
  end

  local ix = new_changes()
  local held = 0
  for _, id in ipairs(order) do
    local old, new = before[id], current[id]
    if new ~= old then
      move_record(w, ix, id, old, was[id], new or nil)
      held = held + ((new and HELD[new.s]) and 1 or 0) - ((old and HELD[old.s]) and 1 or 0)
    end
  end
  expect_zset(K.ax)
  expect_zset(K.hd)
  local meta, extra = plan_index(ix, w, held ~= 0 and ADOPT_HELD or ADOPT_FIELDS)
  adopt_meta(w, meta, extra)
  if held ~= 0 then
    local n = max(0, (tonumber(extra.held or '0') or 0) + held)
    if n > 0 then push2(w.cnt_set, 'held', tostring(n)) else w.cnt_del[#w.cnt_del + 1] = 'held' end
  end
  local refused = apply(w)
  if refused then return refused end
  return reply
end
