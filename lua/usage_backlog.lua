#!lua flags=no-writes
-- usage_backlog.lua: which hourly usage hashes exist, and which of them are
-- closed at the Redis clock (read only). A closed hour is never counted
-- into again, so a flush may move it to PostgreSQL; an open one may be.
--
-- KEYS[1..n]: {pp}:usage:<hour>, the candidate hours' hashes
-- ARGV[1..n]: their hours, Unix seconds of the hour's start
-- ARGV[n + 1]: seconds after an hour's end before it counts as closed
--              (a margin for a Redis clock that steps back, e.g. after a
--              failover)
-- Returns {now (ms, decimal string), {the closed hours that exist, as
-- given}, how many open hours exist}.

local n = #KEYS
local t = redis.call('TIME')
local now_s = tonumber(t[1])
local grace = tonumber(ARGV[n + 1])
if not grace then return redis.error_reply('ERR bad usage backlog arguments') end
local closed, open = {}, 0
for i = 1, n do
  local hour = tonumber(ARGV[i])
  if not hour then return redis.error_reply('ERR bad usage backlog arguments') end
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if hour + 3600 + grace <= now_s then closed[#closed + 1] = ARGV[i] else open = open + 1 end
  end
end
return {t[1] .. string.sub('00000' .. t[2], -6, -4), closed, open}
