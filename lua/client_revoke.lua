#!lua
-- client_revoke.lua: removes one client of the Redis client registry and
-- every credential it owns, in one atomic call: the next lookup on any
-- instance refuses them. Reads everything before the first write.
--
-- KEYS[1]: {pp}:clients, the credential digests (docs/data-model.md)
-- KEYS[2]: {pp}:client, the client entries
-- ARGV[1]: client id
-- Returns: the number of credentials removed, or -1 when the id is not registered.

local id = ARGV[1]
local entry = redis.call('HGET', KEYS[2], id)
if not entry then return -1 end

local kinds = {apiKeys = 'apiKey', bearerTokens = 'bearer', basic = 'basic'}
local owned = {}
local ok, doc = pcall(cjson.decode, entry)
if ok and type(doc) == 'table' then
  for list, kind in pairs(kinds) do
    if type(doc[list]) == 'table' then
      for _, digest in ipairs(doc[list]) do
        if type(digest) == 'string' and string.sub(digest, 1, 7) == 'sha256:' then
          local field = kind .. ':' .. string.sub(digest, 8)
          if redis.call('HGET', KEYS[1], field) == id then owned[#owned + 1] = field end
        end
      end
    end
  end
end

if #owned > 0 then redis.call('HDEL', KEYS[1], unpack(owned)) end
redis.call('HDEL', KEYS[2], id)
return #owned
