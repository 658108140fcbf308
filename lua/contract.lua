#!lua
-- contract.lua: the pool's health and Worker-ownership operations, one
-- atomic operation per call. Extraction (extract.lua) and these operations
-- exclude each other by construction: a proxy is in the index only while no
-- Worker holds it, a claim takes it out of the index in the same call that
-- checks it, and extraction re-checks the record it takes.
--
-- KEYS[1..20]: the pool keys (prelude.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]: operation, ARGV[3]: proxy id, then per operation:
--   health   ARGV[4] "1" passed / "0" failed, ARGV[5] checkedAt ms ("" = now)
--            Records a health result; one older than the recorded one is "stale".
--   claim    ARGV[4] worker, ARGV[5] minRemainingTTL ms, ARGV[6] maxHealthCheckAge ms
--            (the Gateway's own rules for its claim, whatever the pool policy)
--            Takes an allocatable, eligible proxy out of the index for the Worker:
--            status CLAIMED, owner = worker, epoch + 1 (the fencing token returned).
--   drain    ARGV[4] worker, ARGV[5] epoch
--            The Controller publishes DRAINING for the holder it names.
--   ack      ARGV[4] worker, ARGV[5] epoch, ARGV[6] active, ARGV[7] reserved
--            The Worker reports its use of a DRAINING proxy; at 0 and 0 it is
--            DRAINED, no longer held, and allocatable again (rule 2).
--   release  ARGV[4] worker, ARGV[5] epoch
--            Clears the ownership of a DRAINED proxy: AVAILABLE, epoch + 1.
--   remove   Deletes a proxy (not a tombstone: an extracted proxy stays out).
-- Every ownership operation names the holder and epoch it believes in; a stale
-- Worker's (or Controller's) late write is refused as "not-owner", never applied.
-- Returns {verdict, now, epoch}: verdict "ok" or the refusal: "unknown",
--   "extracted", "expired", "stale", "ineligible", "not-owner", "state";
--   now the Redis clock (ms); epoch the record's epoch after the call (0 if none).
-- Errors: "POLICY <pool's policy>" when the pool records another policy.
-- The entry follows the record: out of the index, or (re)indexed at its new
-- deadline (a passed health check brings a spent entry back), and its
-- slices' hints come down to it.

local _, _, adopt = pool_policy(ARGV[1])
local op, id = ARGV[2], ARGV[3]
local A = {select(4, unpack(ARGV))}   -- the operation's own arguments
local now = clock()

-- Reads and checks.
local state_raw = redis.call('HGET', K.state, id)
if not state_raw then return {'unknown', now, 0} end
local rec = decode_record(id, redis.call('HGET', K.proxies, id), state_raw)
if not rec then return redis.error_reply('ERR damaged pool: unreadable record') end
if rec.status == 'EXTRACTED' then return {'extracted', now, 0} end
local old_loc = locator_of(rec)
local was = indexed_at(old_loc)
local epoch = rec.epoch

local function refuse(verdict) return {verdict, now, epoch} end
local function holder_matches()
  return rec.owner == A[1] and tostring(epoch) == A[2]
end
local function count_arg(v)
  local n = tonumber(v)
  return is_int(n, 0, 2 ^ 32) and n or nil
end

local writes = new_writes()
if op == 'remove' then
  reindex(writes, old_loc, was, nil, now)
  push(writes, 'hdel', K.proxies, id)
  push(writes, 'hdel', K.state, id)
  push(writes, 'hdel', K.held, id)
  push(writes, 'zrem', K.expiry, id)
  local refused = commit(writes)
  if refused then return refused end
  return {'ok', now, 0}
end

if rec.expiresAt <= now then return refuse('expired') end

if op == 'health' then
  local at = A[2] == '' and now or tonumber(A[2])
  if not is_int(at, -MAX_MS, MAX_MS) then return redis.error_reply('ERR bad checkedAt') end
  if at < rec.healthCheckedAt then return refuse('stale') end
  rec.healthOk, rec.healthCheckedAt = A[1] == '1', at
elseif op == 'claim' then
  local min_ttl, max_age = tonumber(A[2]), tonumber(A[3])
  if not (is_int(min_ttl, 0, MAX_MS) and is_int(max_age, 0, MAX_MS)) then
    return redis.error_reply('ERR bad claim arguments')
  end
  if not (takeable(rec) and rec.usableUntil > now and rec.expiresAt - now >= min_ttl
          and rec.healthCheckedAt >= now - max_age) then
    return refuse('ineligible')
  end
  epoch = epoch + 1
  rec.status, rec.owner, rec.epoch, rec.active, rec.reserved = 'CLAIMED', A[1], epoch, 0, 0
elseif op == 'drain' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'CLAIMED' and rec.status ~= 'DRAINING' then return refuse('state') end
  rec.status = 'DRAINING'
elseif op == 'ack' then
  if not holder_matches() then return refuse('not-owner') end
  if rec.status ~= 'DRAINING' and rec.status ~= 'DRAINED' then return refuse('state') end
  local active, reserved = count_arg(A[3]), count_arg(A[4])
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
local loc = reindex(writes, old_loc, was, rec, now)
if loc then lower_hints(writes, {loc}) end
if rec.status == 'CLAIMED' or rec.status == 'DRAINING' then
  push(writes, 'hset', K.held, id, rec.owner)
else
  push(writes, 'hdel', K.held, id)
end
push(writes, 'hset', K.state, id, state_json(rec))

-- Keys this call may create live as long as the pool's records do.
local at = redis.call('PEXPIRETIME', K.state)
local life = lifetimes(KEYS)
local refused = commit(writes)
if refused then return refused end
if adopt and at > 0 then redis.call('SET', K.policy, ARGV[1]) end
if at > 0 then raise(KEYS, life, at, writes) end
return {'ok', now, epoch}
