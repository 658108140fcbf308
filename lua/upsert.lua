#!lua
-- upsert.lua: add proxies to the pool or refresh ones it already holds.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua)
-- ARGV[1]: the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2..]: one proxy per argument, as the adapter formats it (src/pool/new_proxy.rs):
--          "<H><U><C><locator>\t<host>\t<port>\t<user>\t<pass>", H "1" when
--          its last health check passed, U usableUntil and C healthCheckedAt
--          (13 digits of Unix ms), the rest as a record holds it
--          (prelude/record.lua)
-- Returns: the Redis clock (ms) the call ran at, then one status per proxy,
--          in order: "added", "refreshed", "extracted" (refused: handed to a
--          client, it never comes back before the expiry it was handed out
--          with) or "expired" (refused: usableUntil or its expiry passed).
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" (prelude/base.lua); an argument
--          that is not a proxy fails the whole call before anything is written.
--
-- A refresh replaces the proxy's details, expiry and health and keeps its
-- ownership state. The index follows the record (prelude/index.lua).

-- H, U, C, the locator (and within it, as LOCATOR in prelude/record.lua
-- reads it, its protocol, region, carrier, upstream, expiry and id), host,
-- port, user, password: one match an argument.
local INCOMING = '^([01])(' .. D13 .. ')(' .. D13 .. ')(([^|\t]*)|([^|\t]*)|([^|\t]*)|([^|\t]*)|('
  .. D13 .. ')|([%w%._:~%-]+))\t([^\t%s]+)\t(%d%d?%d?%d?%d?)\t([^\t%c]*)\t([^\t%c]*)$'

-- The arguments as new records (tables as prelude/record.lua decodes them).
local function read_incoming(argv)
  local incoming = {}
  for i = 2, #argv do
    local h, u13, c13, loc, p, r, c, u, e13, id, host, port, user, pass = match(argv[i], INCOMING)
    local port_n = p and tonumber(port)
    if not (p and u ~= '' and not find(loc, '%c') and u13 <= e13 and PROTOCOL[p]
            and port_n >= 1 and port_n <= 65535) then
      error({err = 'ERR upsert: argument ' .. i .. ' is not a valid proxy'})
    end
    incoming[#incoming + 1] = {s = 'A', h = h, u13 = u13, c13 = c13, loc = loc, host = host, port = port,
                               user = user, pass = pass, epoch = '0', active = '0', reserved = '0',
                               owner = '', p = p, r = r, c = c, u = u, e13 = e13, id = id}
  end
  return incoming
end

local function upsert(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  local incoming = read_incoming(argv)
  local ids = {}
  for i = 1, #incoming do ids[i] = incoming[i].id end
  local stored = chunked_read('HMGET', K.rec, ids)

  -- What each id holds before the call: a live record, a tombstone, or
  -- nothing (a damaged value counts as nothing: it is replaced).
  local before, current, order, was = read_before(ids, stored, NONE)

  -- Decide every item in order, as if each were its own call.
  local statuses = {NOW}
  for i = 1, #incoming do
    local new = incoming[i]
    local old = current[new.id]
    if old and old.tomb and old.e13 <= NOW13 then old = nil end   -- that TTL life is over
    if old and old.tomb then
      statuses[#statuses + 1] = 'extracted'
    elseif new.u13 <= NOW13 or new.e13 <= NOW13 then
      statuses[#statuses + 1] = 'expired'
    else
      if old then
        new.s, new.owner, new.epoch, new.active, new.reserved = old.s, old.owner, old.epoch, old.active, old.reserved
        statuses[#statuses + 1] = 'refreshed'
      else
        statuses[#statuses + 1] = 'added'
      end
      set_deadline(new)
      current[new.id] = new
    end
  end

  -- The writes, from each record's state before the call to its state after.
  local w, ix = new_writes(), new_changes()
  for _, id in ipairs(order) do
    local old, new = before[id], current[id]
    if new ~= old then move_record(w, ix, id, old, was[id], new) end
  end
  expect_zset(K.ax)
  expect_zset(K.hd)
  adopt_meta(w, plan_index(ix, w, ADOPT_FIELDS))
  local refused = apply(w)
  if refused then return refused end
  return statuses
end
