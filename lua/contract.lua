#!lua
-- contract.lua: the pool's health and Worker-ownership operations, one
-- atomic operation per call. Extraction (extract.lua) and these operations
-- exclude each other by construction: a proxy is in the index only while no
-- Worker holds it, a claim takes it out of the index in the same call that
-- checks it, and extraction re-checks the record it takes.
--
-- KEYS[1..12]: the pool keys (prelude.lua)
-- ARGV[1]: operation, ARGV[2]: proxy id, then per operation:
--   health   ARGV[3] "1" passed / "0" failed, ARGV[4] checkedAt ms ("" = now)
--            Records a health result; one older than the recorded one is "stale".
--   claim    ARGV[3] worker, ARGV[4] minRemainingTTL ms, ARGV[5] maxHealthCheckAge ms
--            Takes an allocatable, eligible proxy out of the index for the Worker:
--            status CLAIMED, owner = worker, epoch + 1 (the fencing token returned).
--   drain    ARGV[3] worker, ARGV[4] epoch
--            The Controller publishes DRAINING for the holder it names.
--   ack      ARGV[3] worker, ARGV[4] epoch, ARGV[5] active, ARGV[6] reserved
--            The Worker reports its use of a DRAINING proxy; at 0 and 0 it is
--            DRAINED, no longer held, and allocatable again (rule 2).
--   release  ARGV[3] worker, ARGV[4] epoch
--            Clears the ownership of a DRAINED proxy: AVAILABLE, epoch + 1.
--   remove   Deletes a proxy (not a tombstone: an extracted proxy stays out).
-- Every ownership operation names the holder and epoch it believes in; a stale
-- Worker's (or Controller's) late write is refused as "not-owner", never applied.
-- Returns {verdict, now, epoch}: verdict "ok" or the refusal: "unknown",
--   "extracted", "expired", "stale", "ineligible", "not-owner", "state";
--   now the Redis clock (ms); epoch the record's epoch after the call (0 if none).
-- An entry this call leaves in the index is re-added (it may have been
-- removed as due, e.g. a stale health check now passed) and its slices'
-- hints come down to it.

local op, id = ARGV[1], ARGV[2]
local now = clock()

-- Reads and checks.
local state_raw = redis.call('HGET', K.state, id)
if not state_raw then return {'unknown', now, 0} end
local rec = decode_record(id, redis.call('HGET', K.proxies, id), state_raw)
if not rec then return redis.error_reply('ERR damaged pool: unreadable record') end
if rec.status == 'EXTRACTED' then return {'extracted', now, 0} end
local was_indexed, old_loc = indexed(rec), locator_of(rec)
local epoch = rec.epoch

local function refuse(verdict) return {verdict, now, epoch} end
local function holder_matches()
  return rec.owner == ARGV[3] and tostring(epoch) == ARGV[4]
end
local function count_arg(v)
  local n = tonumber(v)
  return is_int(n, 0, 2 ^ 32) and n or nil
end

local writes = new_writes()
if op == 'remove' then
  unindex(writes, old_loc)
  push(writes, 'hdel', K.proxies, id)
  push(writes, 'hdel', K.state, id)
  push(writes, 'hdel', K.held, id)
  push(writes, 'zrem', K.expiry, id)
  local refused = expect_types(writes)
  if refused then return refused end
  apply(writes)
  return {'ok', now, 0}
end

if rec.expiresAt <= now then return refuse('expired') end

if op == 'health' then
  local at = ARGV[4] == '' and now or tonumber(ARGV[4])
  if not is_int(at, -MAX_MS, MAX_MS) then return redis.error_reply('ERR bad checkedAt') end
  if at < rec.healthCheckedAt then return refuse('stale') end
  rec.healthOk, rec.healthCheckedAt = ARGV[3] == '1', at
elseif op == 'claim' then
  local min_ttl, max_age = tonumber(ARGV[4]), tonumber(ARGV[5])
  if not (is_int(min_ttl, 0, MAX_MS) and is_int(max_age, 0, MAX_MS)) then
    return redis.error_reply('ERR bad claim arguments')
  end
  if not (was_indexed and rec.usableUntil > now and rec.expiresAt - now >= min_ttl
          and rec.healthCheckedAt >= now - max_age) then
    return refuse('ineligible')
  end
  epoch = epoch + 1
  rec.status, rec.owner, rec.epoch, rec.active, rec.reserved = 'CLAIMED', ARGV[3], epoch, 0, 0
elseif op == 'drain' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'CLAIMED' and rec.status ~= 'DRAINING' then return refuse('state') end
  rec.status = 'DRAINING'
elseif op == 'ack' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'DRAINING' and rec.status ~= 'DRAINED' then return refuse('state') end
  local active, reserved = count_arg(ARGV[5]), count_arg(ARGV[6])
  if not (active and reserved) then return redis.error_reply('ERR bad ack arguments') end
  rec.active, rec.reserved = active, reserved
  rec.status = (active == 0 and reserved == 0) and 'DRAINED' or 'DRAINING'
elseif op == 'release' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'DRAINED' then return refuse('state') end
  epoch = epoch + 1
  rec.status, rec.owner, rec.epoch, rec.active, rec.reserved = 'AVAILABLE', nil, epoch, 0, 0
else
  return redis.error_reply('ERR unknown operation')
end

-- The plan: the entry leaves the index, or (re)joins it and lowers its hints.
if indexed(rec) then
  index(writes, rec)
  local p, r, c, u, e = split_locator(old_loc)
  local key = e .. '|' .. id
  local fields = {'region:' .. r .. '|', 'kind:' .. p .. '|' .. c .. '|' .. u .. '|',
                  'atom:' .. p .. '|' .. r .. '|' .. c .. '|' .. u .. '|'}
  local hints = redis.call('HMGET', K.hint, unpack(fields))
  for i, field in ipairs(fields) do
    if hints[i] and key < hints[i] then push(writes, 'hset', K.hint, field, key) end
  end
elseif was_indexed then
  unindex(writes, old_loc)
end
if rec.status == 'CLAIMED' or rec.status == 'DRAINING' then
  push(writes, 'hset', K.held, id, rec.owner)
else
  push(writes, 'hdel', K.held, id)
end
push(writes, 'hset', K.state, id, state_json(rec))

-- Keys this call may create live as long as the pool's records do.
local at = redis.call('PEXPIRETIME', K.state)
local life = lifetimes(KEYS)
local refused = expect_types(writes)
if refused then return refused end
apply(writes)
if at > 0 then raise(KEYS, life, at, writes) end
return {'ok', now, epoch}
