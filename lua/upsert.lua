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

-- A refresh that keeps its place: a counted entry whose deadline is ahead,
-- indexable after, in the same combination, neither its combination's
-- head before nor after (the common refresh: a later expiry for one of
-- many). Its record, its `due` score and its `ax` entry move; nothing
-- counted does (its count, heads and groupings stay), so the index is
-- not planned for it.
local function keeps_place(old, was, new)
  return was and old and not old.tomb and old.d13 > NOW13 and indexable(new) and old.loc ~= new.loc
    and old.p == new.p and old.r == new.r and old.c == new.c and old.u == new.u
end

-- Moves the refreshes `ids` (each keeps_place) without planning the index
-- when they leave their combination's head alone, as its counter says (one
-- HMGET); a combination with one that would not, or that another item
-- changes (in `ix`), has all of them moved the general way.
local function move_in_place(w, ix, ids, before, current)
  local atoms, at, of = {}, {}, {}
  for i = 1, #ids do
    local atom = atom_of(before[ids[i]].loc, ids[i])
    if not at[atom] then
      atoms[#atoms + 1] = atom
      at[atom] = #atoms
    end
    of[i] = atom
  end
  local counts = chunked_read('HMGET', K.cnt, atoms)
  local general = {}
  for i = 1, #ids do
    local id, atom = ids[i], of[i]
    local head = match(counts[at[atom]] or '', ATOM_COUNT)
    if not head or head == '' or ix.by[atom] or head == before[id].e13 .. '|' .. id
       or current[id].e13 .. '|' .. id < head then
      general[atom] = true
    end
  end
  for i = 1, #ids do
    local id = ids[i]
    move_record(w, general[of[i]] and ix or nil, id, before[id], true, current[id])
  end
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
  local in_place = {}
  for _, id in ipairs(order) do
    local old, new = before[id], current[id]
    if new ~= old then
      if keeps_place(old, was[id], new) then
        in_place[#in_place + 1] = id
      else
        move_record(w, ix, id, old, was[id], new)
      end
    end
  end
  if #in_place > 0 then move_in_place(w, ix, in_place, before, current) end
  expect_zset(K.ax)
  expect_zset(K.hd)
  adopt_meta(w, plan_index(ix, w, ADOPT_FIELDS))
  local refused = apply(w)
  if refused then return refused end
  return statuses
end
