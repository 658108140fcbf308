#!lua
-- ratelimit.lua: GCRA admission against up to two limits (global, per client)
-- in one call. A request is admitted only if every limit admits it, and only
-- then is any limit charged.
--
-- KEYS[i]: {pp}:rl:global or {pp}:rl:client:<sha256(client id)>, the
--          limit's theoretical arrival time (docs/data-model.md), set to
--          expire when the bucket is full again
-- ARGV[2i-1]: emission interval of KEYS[i], ms per request (may be fractional)
-- ARGV[2i]:   burst of KEYS[i], requests
-- Returns: {admitted (1 or 0), retry_after_ms, then per key: remaining, reset_ms}
--   remaining: requests still admissible right now after this one
--   reset_ms:  time until the bucket is full again
-- Clock: Redis TIME, shared by every Lambda instance.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

local admitted, retry_after = 1, 0
local next_tat, out = {}, {}
for i, key in ipairs(KEYS) do
  local interval, burst = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', key) or 0) or 0
  local new_tat = math.max(tat, now) + interval
  local capacity = interval * burst
  if new_tat - now > capacity then
    admitted = 0
    retry_after = math.max(retry_after, new_tat - capacity - now)
    out[#out + 1] = 0
    out[#out + 1] = math.ceil(math.max(tat, now) - now)
  else
    next_tat[i] = new_tat
    out[#out + 1] = math.floor((capacity - (new_tat - now)) / interval)
    out[#out + 1] = math.ceil(new_tat - now)
  end
end

if admitted == 1 then
  for i, key in ipairs(KEYS) do
    redis.call('SET', key, string.format('%.3f', next_tat[i]), 'PX', math.max(1, math.ceil(next_tat[i] - now)))
  end
end
local reply = {admitted, math.ceil(retry_after)}
for _, v in ipairs(out) do reply[#reply + 1] = v end
return reply
