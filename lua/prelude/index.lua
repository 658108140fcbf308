-- prelude/index.lua: the index over the records, and the writes every
-- script collects while it reads and applies at its end.
--
-- Every record has one entry in due, its id: a record is indexed when it
-- is indexable (prelude/record.lua) as it is written, and its id then
-- scores its deadline D (band 0, "counted"; a record not indexed scores
-- 1e13 + its expiry: band 1, and so does a tombstone, which is that
-- member alone, without a record); its locator is
-- in its combination's slice of ax (a combination,
-- "atom", is "<p>|<r>|<c>|<u>"); cnt counts it, and the first entry of
-- each slice (its atom's "head", "<expiry>|<id>") is in hd once per
-- grouping (G, P, R, C, U). docs/data-model.md ("The keys") gives every
-- member and field these keys hold; the code below builds them.
--
-- Time alone writes nothing: an indexed record whose D passes stays counted,
-- "spent". A walk that passes it takes it out of ax only (a trim of the
-- slice's head, cheap); a drain (the prune, a count that must subtract too
-- many) moves it to band 1, out of the counts. So ax holds every counted
-- entry whose D is ahead, and some spent ones; band 0 less ax is spent.
-- Heads are exact: every write that changes an atom's first entry in ax
-- rewrites its five members in the same call.

local ATOM = '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$'
-- A combination's counter "<head>\t<n>" (head "" when it has none).
local ATOM_COUNT = '^([^\t]*)\t(%d+)$'

-- The head of a combination's counter value (one with a head: its first
-- byte is not "\t").
local function counter_head(v)
  return sub(v, 1, find(v, '\t', 1, true) - 1)
end

-- The four grouping counter fields of an atom's parts.
local function grouping_fields(p, r, c, u)
  return 'P|' .. p, 'R|' .. p .. '|' .. r, 'C|' .. p .. '|' .. c, 'U|' .. p .. '|' .. u
end

-- The five hd members of an atom (parts p, r, c, u) with head k, one per
-- grouping: G, P, R, C, U.
local function heads_of(atom, p, r, c, u, k)
  local tail = k .. '|' .. atom
  return 'G|' .. tail, 'P|' .. p .. '|' .. tail, 'R|' .. p .. '|' .. r .. '|' .. tail,
         'C|' .. p .. '|' .. c .. '|' .. tail, 'U|' .. p .. '|' .. u .. '|' .. tail
end

-- Pushes the five hd members of an atom with head k, each after a score
-- "0" when `scored` (a ZADD's arguments).
local function push_heads(list, atom, p, r, c, u, k, scored)
  local members = {heads_of(atom, p, r, c, u, k)}
  local n = #list
  for i = 1, 5 do
    if scored then
      list[n + 1] = '0'
      n = n + 1
    end
    list[n + 1] = members[i]
    n = n + 1
  end
end

-- The writes of one call, applied by `apply` after every read: lists of
-- arguments by name (due_set, due_rem, ax_ranges, ax_rem, ax_add, rec_set,
-- rec_del, cnt_set, cnt_del, hd_rem, hd_add), each made when first used.
local LISTS = {__index = function(w, name)
  local list = {}
  rawset(w, name, list)
  return list
end}
local NONE = {}
local function new_writes()
  return setmetatable({}, LISTS)
end

local function push2(list, a, b)
  local n = #list
  list[n + 1] = a
  list[n + 2] = b
end

-- Index changes of one call, by atom: {delta (of its count), rem (keys
-- removed from ax), run_to (every key up to it removed), nrem, add (the least key added to ax), next (the first
-- entry of ax that stays, when the caller knows it: a key, or false)}.
local function new_changes()
  return {order = {}, by = {}}
end

local function touch(ix, atom)
  local a = ix.by[atom]
  if not a then
    a = {atom = atom, delta = 0, nrem = 0}
    ix.by[atom] = a
    ix.order[#ix.order + 1] = a
  end
  return a
end

-- An entry (key "<expiry>|<id>") leaves the atom's slice in ax; `counted`:
-- it leaves band 0 too (its count goes down).
local function ix_remove(ix, atom, key, counted)
  local a = touch(ix, atom)
  if counted then a.delta = a.delta - 1 end
  if not a.rem then a.rem = {} end
  if not a.rem[key] then
    a.rem[key] = true
    a.nrem = a.nrem + 1
  end
end

-- An entry joins (or stays in) the atom's slice in ax; `counted`: it joins
-- band 0 too (its count goes up).
local function ix_add(ix, atom, key, counted)
  local a = touch(ix, atom)
  if counted then a.delta = a.delta + 1 end
  if not a.add or key < a.add then a.add = key end
end

-- The first `n` entries of the atom's slice in ax, up to `last` (a key),
-- leave it (still counted).
local function ix_remove_run(ix, atom, last, n)
  local a = touch(ix, atom)
  if not a.run_to or last > a.run_to then a.run_to = last end
  a.nrem = a.nrem + n
end

-- Whether this call takes the entry `key` out of the atom's slice.
local function removed(a, key)
  return (a.run_to and key <= a.run_to) or (a.rem and a.rem[key]) or false
end

-- The caller knows the first entry of the atom left after its removals.
local function ix_next(ix, atom, key)
  local a = ix.by[atom]
  if a then a.next = key end
end

-- The first entry of an atom's slice that this call does not remove (nil
-- for none): read from ax, before any write.
local function probe_survivor(a)
  local prefix = a.atom .. '|'
  local page = call('ZRANGEBYLEX', K.ax, '[' .. prefix, '[' .. prefix .. '\255', 'LIMIT', '0', a.nrem + 1)
  local from = #prefix + 1
  for i = 1, #page do
    local key = sub(page[i], from)
    if not removed(a, key) then return key end
  end
  return nil
end

-- The values of each dimension that exist, per protocol: "V|<R, C or U>|<p>"
-- -> "\n<value>\n<value>..." (a value is in its list exactly while its
-- grouping counter "<R, C or U>|<p>|<value>" exists), so a request can
-- enumerate the combinations it names. Plans the lists' changes for the
-- grouping counters that appear and vanish (both lists of field names),
-- reading the lists first.
-- The value list a grouping counter's value belongs to, registered in
-- `names` (list names in order) and `index` (name -> position).
local function value_list(f, names, index)
  local letter, p, v = match(f, '^([RCU])|([^|]*)|(.*)$')
  if not letter then return nil end
  local name = 'V|' .. letter .. '|' .. p
  if not index[name] then
    names[#names + 1] = name
    index[name] = #names
  end
  return name, v
end

local function plan_values(w, appear, vanish)
  local lists, index, names = {}, {}, {}
  for i = 1, #appear do value_list(appear[i], names, index) end
  for i = 1, #vanish do value_list(vanish[i], names, index) end
  if #names == 0 then return end
  local old = call('HMGET', K.cnt, unpack(names))
  for i = 1, #names do lists[names[i]] = old[i] or '' end
  for i = 1, #vanish do
    local name, v = value_list(vanish[i], names, index)
    if name then
      local l = lists[name] .. '\n'
      local at = find(l, '\n' .. v .. '\n', 1, true)
      if at then lists[name] = sub(l, 1, at - 1) .. sub(l, at + #v + 1, -2) end
    end
  end
  for i = 1, #appear do
    local name, v = value_list(appear[i], names, index)
    if name and not find(lists[name] .. '\n', '\n' .. v .. '\n', 1, true) then
      lists[name] = lists[name] .. '\n' .. v
    end
  end
  for i = 1, #names do
    local l = lists[names[i]]
    if l ~= (old[i] or '') then
      if l == '' then w.cnt_del[#w.cnt_del + 1] = names[i] else push2(w.cnt_set, names[i], l) end
    end
  end
end

-- Plans the counts and heads that follow the call's index changes (reading
-- cnt, and ax where an atom's new head is not known), into `w`. `extra`:
-- more cnt fields to read in the same HMGET. Returns the meta field and the
-- extra fields' values (by name). Nothing here writes.
local function plan_index(ix, w, extra)
  if #ix.order == 0 and not extra then return call('HGET', K.cnt, 'meta'), nil end
  local fields, at = {'meta'}, {}
  for i = 1, #(extra or {}) do
    local f = extra[i]
    if not at[f] then fields[#fields + 1] = f; at[f] = #fields end
  end
  local order = ix.order
  for i = 1, #order do
    local a = order[i]
    a.p, a.r, a.c, a.u = match(a.atom, ATOM)
    if a.p then
      fields[#fields + 1] = a.atom
      a.at = #fields
      local gp, gr, gc, gu = grouping_fields(a.p, a.r, a.c, a.u)
      a.g = {gp, gr, gc, gu}
      for j = 1, 4 do
        local f = a.g[j]
        if not at[f] then fields[#fields + 1] = f; at[f] = #fields end
      end
    end
  end
  local values = chunked_read('HMGET', K.cnt, fields)
  local moved, moved_order = {}, {}
  for i = 1, #order do
    local a = order[i]
    if a.p then
      local old = values[a.at]
      local n_old, k_old = '0', nil
      if old then
        local k, n = match(old, ATOM_COUNT)
        n_old = n or '0'
        if k and k ~= '' then k_old = k end
      end
      local survivor
      if a.fix then
        -- Its heads disagreed with ax (damage): the truth is read.
        if a.next ~= nil then survivor = a.next or nil else survivor = probe_survivor(a) end
      elseif k_old and not removed(a, k_old) then
        survivor = k_old
      elseif a.next ~= nil then
        survivor = a.next or nil
      elseif k_old then
        survivor = probe_survivor(a)
      end
      local head = survivor
      if a.add and (not head or a.add < head) then head = a.add end
      local n_new, dn = count_plus(n_old, a.delta)
      local new = (n_new ~= '0' or head) and ((head or '') .. '\t' .. n_new) or nil
      if new ~= old then
        if new then push2(w.cnt_set, a.atom, new) else w.cnt_del[#w.cnt_del + 1] = a.atom end
      end
      if head ~= k_old or a.fix then
        if k_old then push_heads(w.hd_rem, a.atom, a.p, a.r, a.c, a.u, k_old) end
        if head then push_heads(w.hd_add, a.atom, a.p, a.r, a.c, a.u, head, true) end
      end
      local da = (head and 1 or 0) - (k_old and 1 or 0)
      if dn ~= 0 or da ~= 0 then
        for j = 1, 4 do
          local f = a.g[j]
          local m = moved[f]
          if not m then
            m = {0, 0}
            moved[f] = m
            moved_order[#moved_order + 1] = f
          end
          m[1], m[2] = m[1] + dn, m[2] + da
        end
      end
    end
  end
  local appear, vanish = {}, {}
  for i = 1, #moved_order do
    local f = moved_order[i]
    local m = moved[f]
    if m[1] ~= 0 or m[2] ~= 0 then
      local old = values[at[f]]
      local n, c = match(old or '0|0', '^(%d+)|(%d+)$')
      n = count_plus(n or '0', m[1])
      c = count_plus(c or '0', m[2])
      if n ~= '0' or c ~= '0' then
        push2(w.cnt_set, f, n .. '|' .. c)
        if not old then appear[#appear + 1] = f end
      else
        w.cnt_del[#w.cnt_del + 1] = f
        if old then vanish[#vanish + 1] = f end
      end
    end
  end
  if #appear > 0 or #vanish > 0 then plan_values(w, appear, vanish) end
  local extras = {}
  for f, i in pairs(at) do extras[f] = values[i] end
  return values[1], extras
end

-- Written beside the pool's meta: a value over 64 bytes, so that Redis
-- makes cnt a hash table and keeps it one (a hash of at most 128 short
-- fields is a listpack, each field found by a linear search: at 18
-- combinations ~26k instructions of a count=1 call). A pool written before
-- it gets it from its next fill, refresh or contract call.
local ENCODING_NOTE = 'a value over 64 bytes keeps this hash a hash table (docs/data-model.md)'
-- The cnt fields the writers read with plan_index for adopt_meta.
local ADOPT_FIELDS, ADOPT_HELD = {'enc'}, {'enc', 'held'}

-- Checks the pool's `meta` (as plan_index read it, with the extra fields
-- `extra`) and records this call's when the pool has none yet, and the
-- encoding note when it is missing.
local function adopt_meta(w, meta, extra)
  local adopt = check_meta(meta)
  if adopt then push2(w.cnt_set, 'meta', adopt) end
  if extra.enc ~= ENCODING_NOTE then push2(w.cnt_set, 'enc', ENCODING_NOTE) end
end

-- Applies the writes, in an order in which none can fail: `due` first, by
-- redis.pcall (a script may write it without having read it: if it is of
-- the wrong type, that is found before anything is written); every other
-- key was read by a typed command before. Returns nil, or the error reply
-- that refused the writes.
local function made(w, name)
  return rawget(w, name) or NONE
end

local function apply(w)
  local due = made(w, 'due_set')
  if #due > 0 then
    local first = min(#due, CHUNK)
    local reply = pcall_redis('ZADD', K.due, unpack(due, 1, first))
    if type(reply) == 'table' and reply.err then return reply end
    for i = first + 1, #due, CHUNK do
      call('ZADD', K.due, unpack(due, i, min(i + CHUNK - 1, #due)))
    end
  end
  chunked('ZREM', K.due, made(w, 'due_rem'), 1)
  local ranges = made(w, 'ax_ranges')
  for i = 1, #ranges, 2 do call('ZREMRANGEBYLEX', K.ax, ranges[i], ranges[i + 1]) end
  chunked('ZREM', K.ax, made(w, 'ax_rem'), 1)
  chunked('ZADD', K.ax, made(w, 'ax_add'), 2)
  chunked('HDEL', K.rec, made(w, 'rec_del'), 1)
  chunked('HSET', K.rec, made(w, 'rec_set'), 2)
  chunked('HDEL', K.cnt, made(w, 'cnt_del'), 1)
  chunked('HSET', K.cnt, made(w, 'cnt_set'), 2)
  chunked('ZREM', K.hd, made(w, 'hd_rem'), 1)
  chunked('ZADD', K.hd, made(w, 'hd_add'), 2)
  return nil
end

-- Proves that `key` is a sorted set (or absent) before anything is written:
-- a script that writes a key it has not read by a typed command checks it.
local function expect_zset(key)
  call('ZCARD', key)
end

-- What each of `ids` holds before a writer's call, each id read once
-- (where first named; not at all when `skip[id]`), from its raw record
-- (`stored`, by position in `ids`) and its `due` member (one ZMSCORE).
-- Returns:
--   before   id -> a decoded live record, a tombstone {tomb = true, e13 =
--            its expiry} (no record, its member in band 1), or false
--   current  a copy of `before`, for the call to change
--   order    the ids in the order first named
--   was      id -> whether its live record is indexed now (band 0)
--   damaged  whether a record is there but unreadable (read as nothing)
local function read_before(ids, stored, skip)
  local before, bare, order, damaged = {}, {}, {}, false
  for i = 1, #ids do
    local id = ids[i]
    if before[id] == nil and not skip[id] then
      local raw = stored[i] or nil
      local live = decode(raw)
      if raw and not live then damaged = true end
      before[id] = live or false
      bare[id] = not raw
      order[#order + 1] = id
    end
  end
  local was, current = {}, {}
  local scores = chunked_read('ZMSCORE', K.due, order)
  for i = 1, #order do
    local id, score = order[i], tonumber(scores[i])
    if before[id] then
      was[id] = score ~= nil and score < 1e13
    elseif score and score >= 1e13 and bare[id] then
      before[id] = {tomb = true, e13 = pad13(score - 1e13)}
    end
    current[id] = before[id]
  end
  return before, current, order, was, damaged
end

-- The spent `due` entry of `id` (its record `raw`) leaves the index: its
-- combination's count and its `ax` entry. Returns the record's expiry (13
-- digits), nil when it has no record this layout reads.
local function unindex_spent(w, ix, id, raw)
  local loc = record_locator(raw, id)
  if not loc then return nil end
  local p, r, c, u, e13 = split_locator(loc)
  if not p then return nil end
  ix_remove(ix, p .. '|' .. r .. '|' .. c .. '|' .. u, e13 .. '|' .. id, true)
  w.ax_rem[#w.ax_rem + 1] = loc
  return e13
end

-- Plans the writes that move one record from `old` (a decoded record, a
-- tombstone {tomb = true, e13 = its expiry} or false), counted in band 0
-- when `was`, to
-- `new` (a decoded record, or nil: deleted): its field, its `due` entry, its
-- index entry and the counts and heads that follow (in `ix`; nil when the
-- caller knows that nothing counted moves and no head changes: a refresh
-- in place, upsert.lua's move_in_place).
local function move_record(w, ix, id, old, was, new)
  local old_loc = old and not old.tomb and old.loc or nil
  local new_loc = new and new.loc or nil
  local index = new and indexable(new)
  local same = old_loc == new_loc
  if was and (not index or not same) then
    w.ax_rem[#w.ax_rem + 1] = old_loc
    if ix then
      ix_remove(ix, old.p .. '|' .. old.r .. '|' .. old.c .. '|' .. old.u, old.e13 .. '|' .. id, true)
    end
  end
  if not new then
    w.rec_del[#w.rec_del + 1] = id
    w.due_rem[#w.due_rem + 1] = id
    return
  end
  push2(w.rec_set, id, encode(new))
  push2(w.due_set, index and new.d13 or ('1' .. new.e13), id)
  -- Into ax when it was not counted, or when it may have been passed as
  -- spent by a walk (its deadline was not ahead).
  if index and not (was and same and old.d13 > NOW13) then
    push2(w.ax_add, '0', new_loc)
    if ix then
      ix_add(ix, new.p .. '|' .. new.r .. '|' .. new.c .. '|' .. new.u, new.e13 .. '|' .. id, not (was and same))
    end
  end
end
