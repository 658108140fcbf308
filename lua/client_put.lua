#!lua
-- client_put.lua: adds or replaces clients of the Redis client registry, all
-- or nothing. Every check (and every read) runs before the first write, so a
-- refused batch changes nothing.
--
-- KEYS[1]: {pp}:clients, the credential digests (docs/data-model.md)
-- KEYS[2]: {pp}:client, the client entries
-- ARGV[1]: "add" (refuse an id already registered), "replace" (refuse an id
--          not registered) or "put" (either)
-- ARGV[2..]: per client: id, entry (JSON), n, then its n credential fields
--          "<kind>:<hex sha256>"
-- Returns: {"ok", added, replaced}, or {"refused", reason, id} with reason
--   "exists" (add of a registered id), "unknown" (replace of an unregistered
--   id), "taken" (a credential another client owns), "duplicate" (an id or a
--   credential twice in the batch), "malformed" (bad arguments)
-- A replaced client's former credentials stop working in the same call.

local mode = ARGV[1]
if mode ~= 'add' and mode ~= 'replace' and mode ~= 'put' then
  return {'refused', 'malformed', ''}
end

local kinds = {apiKeys = 'apiKey', bearerTokens = 'bearer', basic = 'basic'}

-- The credential fields an entry (JSON) lists; nil when it cannot be read.
local function fields_of(entry)
  local ok, doc = pcall(cjson.decode, entry)
  if not ok or type(doc) ~= 'table' then return nil end
  local out = {}
  for list, kind in pairs(kinds) do
    if type(doc[list]) == 'table' then
      for _, digest in ipairs(doc[list]) do
        if type(digest) == 'string' and string.sub(digest, 1, 7) == 'sha256:' then
          out[#out + 1] = kind .. ':' .. string.sub(digest, 8)
        end
      end
    end
  end
  return out
end

-- Read and check everything.
local clients, ids, claimed = {}, {}, {}
local i = 2
while i <= #ARGV do
  local id, entry, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  if not entry or not n or n < 0 or i + 2 + n > #ARGV then
    return {'refused', 'malformed', id or ''}
  end
  if ids[id] then return {'refused', 'duplicate', id} end
  ids[id] = true
  local fields = {}
  for j = 1, n do
    local field = ARGV[i + 2 + j]
    if claimed[field] then return {'refused', 'duplicate', id} end
    claimed[field] = true
    local owner = redis.call('HGET', KEYS[1], field)
    if owner and owner ~= id then return {'refused', 'taken', id} end
    fields[j] = field
  end
  local old = redis.call('HGET', KEYS[2], id)
  if old and mode == 'add' then return {'refused', 'exists', id} end
  if not old and mode == 'replace' then return {'refused', 'unknown', id} end
  local stale = {}
  if old then
    for _, field in ipairs(fields_of(old) or {}) do
      if redis.call('HGET', KEYS[1], field) == id then stale[#stale + 1] = field end
    end
  end
  clients[#clients + 1] = {id = id, entry = entry, fields = fields, stale = stale, old = old}
  i = i + 3 + n
end

-- Write.
local added, replaced = 0, 0
for _, c in ipairs(clients) do
  if #c.stale > 0 then redis.call('HDEL', KEYS[1], unpack(c.stale)) end
  for _, field in ipairs(c.fields) do redis.call('HSET', KEYS[1], field, c.id) end
  redis.call('HSET', KEYS[2], c.id, c.entry)
  if c.old then replaced = replaced + 1 else added = added + 1 end
end
return {'ok', added, replaced}
