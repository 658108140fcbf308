#!lua flags=no-writes
-- client_lookup.lua: the registered client owning one credential digest, in
-- O(1) (two hash reads), for the Redis client registry.
--
-- KEYS[1]: {pp}:clients, the credential digests (docs/data-model.md)
-- KEYS[2]: {pp}:client, the client entries
-- ARGV[1]: "<kind>:<hex sha256>" of the presented credential, kind one of
--          apiKey, bearer, basic
-- Returns: the owner's entry (JSON), or nil when no client owns the digest.
-- Writes nothing; reads the current state, so a change is seen by the next
-- call on any instance.

local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return false end
return redis.call('HGET', KEYS[2], id)
