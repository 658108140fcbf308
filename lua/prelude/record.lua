-- prelude/record.lua: one proxy's record, the code that reads and writes
-- it. A record is one field of {pp}:v4:rec, the proxy id -> a fixed-format
-- string (times are 13 digits of Unix ms); docs/data-model.md ("The
-- record") shows the same three lines, and tests/key_layout.rs keeps them
-- the same:
--
--   live       <S><H><D><U><C><locator>\t<host>\t<port>\t<user>\t<pass>\t<epoch>\t<active>\t<reserved>\t<owner>
--   tombstone  no field; the id's `due` member scores 1e13 + <expiry>
--   locator    <protocol>|<region>|<carrier>|<upstream>|<expiry>|<id>
--
-- S the status: A AVAILABLE (no owner), C CLAIMED, G DRAINING, R DRAINED
-- (Active = Reserved = 0); H the last health check: 1 passed, 0 failed;
-- D the deadline under the pool policy; U usableUntil; C healthCheckedAt.
-- user and pass are "" when the proxy has none. A tombstone is what is left
-- of a proxy handed to a client: its `due` member alone, in band 1 (no
-- record: ~40% of the memory a field beside it took, layout 3); the id
-- never comes back before the expiry that score keeps
-- (prelude/index.lua, read_before).
-- Names (region, carrier, upstream) hold no "|" and no control character,
-- ids only [A-Za-z0-9._:~-], hosts no whitespace: "\t" and "|" separate.
--
-- The deadline D is the instant the record stops being eligible unless
-- something is written (rules 1, 3 and 4 in one comparison, `now < D`):
--   D = min(U, expiry - max(m, 1) + 1, C + A + 1)
-- A record is indexable when allocatable (S is A or R), healthy (H is 1)
-- and its D is ahead; indexed records are in {pp}:v4:ax (prelude/index.lua).

-- Where the locator starts in a live record (after S, H, D, U and C).
local LOC_AT = 42
local PROTOCOL = {http = true, https = true, socks5 = true}
local D13 = '%d%d%d%d%d%d%d%d%d%d%d%d%d'
local LOCATOR = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|(' .. D13 .. ')|([%w%._:~%-]+)$'
-- A live record, its locator read as LOCATOR reads one (nested captures:
-- one match a record).
local LIVE = '^([ACGR])([01])(' .. D13 .. ')(' .. D13 .. ')(' .. D13 .. ')'
  .. '(([^|\t]*)|([^|\t]*)|([^|\t]*)|([^|\t]*)|(' .. D13 .. ')|([%w%._:~%-]+))\t([^\t]*)\t(%d%d?%d?%d?%d?)\t'
  .. '([^\t]*)\t([^\t]*)\t(%d+)\t(%d+)\t(%d+)\t([^\t]*)$'

-- p, r, c, u, expiry (13 digits), id; nil when `loc` is not a locator.
local function split_locator(loc)
  return match(loc, LOCATOR)
end

local function locator(p, r, c, u, e13, id)
  return p .. '|' .. r .. '|' .. c .. '|' .. u .. '|' .. e13 .. '|' .. id
end

-- The combination "<p>|<r>|<c>|<u>" and the entry key "<expiry>|<id>" of a
-- locator with id `id`.
local function atom_of(loc, id)
  return sub(loc, 1, #loc - #id - 15)
end

-- The deadline of a record (numbers, ms) under the call's policy.
local function deadline(u, e, c)
  local d = min(u, e - M1 + 1, c + POLICY_A + 1)
  if d < 0 then return 0 end
  return d
end

-- A live record as a table (nil if it is not one):
-- s, h, d13, u13, c13, loc, host, port, user, pass, epoch, active, reserved,
-- owner (strings), and the locator's parts p, r, c, u, e13, id.
local function decode(raw)
  if not raw then return nil end
  local s, h, d13, u13, c13, loc, p, r, c, u, e13, id, host, port, user, pass, epoch, active, reserved, owner =
    match(raw, LIVE)
  if not s or host == '' or tonumber(port) > 65535 then return nil end
  return {s = s, h = h, d13 = d13, u13 = u13, c13 = c13, loc = loc, host = host, port = port,
          user = user, pass = pass, epoch = epoch, active = active, reserved = reserved,
          owner = owner, p = p, r = r, c = c, u = u, e13 = e13, id = id}
end

-- The locator a live record `raw` holds, when it is the record of `id`
-- (its locator ends in it); nil when it is missing (a tombstone) or
-- damaged. An id's `due` entry is read with it: the locator says which
-- combination counts it and which `ax` entry is its.
local function record_locator(raw, id)
  if not raw then return nil end
  local tab = find(raw, '\t', LOC_AT, true)
  if not tab then return nil end
  local loc = sub(raw, LOC_AT, tab - 1)
  if sub(loc, -#id - 1) ~= '|' .. id then return nil end
  return loc
end

-- The expiry (13 digits) of the live record `raw` of `id`; nil when it is
-- missing or damaged.
local function expiry_of(raw, id)
  local loc = record_locator(raw, id)
  if not loc then return nil end
  local _, _, _, _, e13 = split_locator(loc)
  return e13
end

-- The locators of the records of `ids` (members of `due`), in one read:
-- false for an id without a live record.
local function locators_of(ids)
  local raws = chunked_read('HMGET', K.rec, ids)
  local out = {}
  for i = 1, #ids do out[i] = record_locator(raws[i] or nil, ids[i]) or false end
  return out
end

-- How many of the spent entries `ids` (members of `due`) each combination
-- counts: atom -> n, read from their records.
local function spent_by_atom(ids)
  local locs = locators_of(ids)
  local by = {}
  for i = 1, #locs do
    local loc = locs[i]
    if loc then
      local atom = atom_of(loc, ids[i])
      by[atom] = (by[atom] or 0) + 1
    end
  end
  return by
end

local function encode(t)
  return t.s .. t.h .. t.d13 .. t.u13 .. t.c13 .. t.loc .. '\t' .. t.host .. '\t' .. t.port .. '\t'
    .. t.user .. '\t' .. t.pass .. '\t' .. t.epoch .. '\t' .. t.active .. '\t' .. t.reserved
    .. '\t' .. t.owner
end

-- Recomputes a decoded record's deadline from its U, expiry and C.
local function set_deadline(t)
  t.d13 = pad13(deadline(tonumber(t.u13), tonumber(t.e13), tonumber(t.c13)))
end

-- Belongs in the index at the call's clock: allocatable, healthy, D ahead.
local function indexable(t)
  return (t.s == 'A' or t.s == 'R') and t.h == '1' and t.d13 > NOW13
end

-- What extraction checks of a live record `raw` behind an index entry `loc`
-- (its locator), at fixed offsets, without decoding it:
--   1  eligible: allocatable, healthy, D ahead, exactly this locator, and
--      details a client can be handed; then also the part handed out: the
--      locator, host, port, user and password (none of the pool's state)
--   2  spent: what the index says, but D has passed
--   3  junk: not what the index says (damaged or planted from outside)
local ELIGIBLE, SPENT, JUNK = 1, 2, 3
local INDEXED_HEAD = '^[AR]1' .. D13
local DETAILS = '^\t[^\t%s]+\t(%d%d?%d?%d?%d?)\t[^\t]*\t[^\t]*()\t%d+\t(%d+)\t(%d+)\t[^\t]*$'
-- Bounds for spent(): "A1" or "R1", then NOW13 (rebuilt when the clock moves).
local SPENT_A, SPENT_R, SPENT_AT
-- Whether `raw` is an indexed record whose D has passed: two string
-- comparisons (no pattern, no new string), as a run of spent entries needs.
local function spent(raw)
  if SPENT_AT ~= NOW13 then
    SPENT_A, SPENT_R, SPENT_AT = 'A1' .. NOW13 .. ':', 'R1' .. NOW13 .. ':', NOW13
  end
  return (raw >= 'A1' and raw < SPENT_A) or (raw >= 'R1' and raw < SPENT_R)
end

local function judge(raw, loc)
  if not raw or find(raw, loc, LOC_AT, true) ~= LOC_AT then return JUNK end
  if spent(raw) then return SPENT end
  if not find(raw, INDEXED_HEAD) then return JUNK end
  if sub(raw, 3, 15) <= NOW13 then return SPENT end
  local port, cut, active, reserved = match(raw, DETAILS, LOC_AT + #loc)
  if not port or tonumber(port) > 65535
     or (byte(raw, 1) == 82 and (active ~= '0' or reserved ~= '0')) then
    return JUNK
  end
  return ELIGIBLE, sub(raw, LOC_AT, cut - 1)
end
