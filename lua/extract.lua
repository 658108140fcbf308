#!lua
-- extract.lua: take up to `count` eligible proxies out of the pool, atomically.
--
-- KEYS[1..7]: the pool keys (prelude/base.lua); with usage counters, then
--   {pp}:usage:<hour A>, {pp}:usage:<hour B>: the usage counters of the
--   two hours the caller's clock may be in (its time -/+ ten minutes)
-- ARGV[1]  the caller's pool policy "<maxHealthCheckAge ms>|<minRemainingTTL ms>"
-- ARGV[2]  count, 1..1000
-- ARGV[3]  fulfillment: "partial" or "allOrNothing"
-- ARGV[4]  reserve: eligible proxies matching the filters to leave
-- ARGV[5]  the request id, copied into the result
-- ARGV[6]  which groups of arguments follow, in this order: "f" the
--          filters, "i" idempotency, "u" usage counters (e.g. "", "fi");
--          and "s" (no arguments): the caller's last round, answered from
--          what this call reaches, never "again"
-- then, for "f": the filters on protocol, region, carrier, upstream (four
--          arguments): "*" does not restrict; otherwise each allowed value
--          preceded by "\n" (so "" allows nothing and "\n" only the unknown "")
--      for "i": the idempotency field, sha256(client, key) in hex; the
--          request's digest (64 hex); its window, ms; "1": a replay rewrites
--          its record (so a WAIT after the call covers it: replica acks)
--      for "u": the usage client label; hour A and hour B (Unix s of their
--          starts); their life after the hour ends, s
-- Returns one of:
--   {"ok", result}      committed; result is what a replay returns:
--                       "<requestId>\n<count>\n<extractedAt ms>" then, per proxy
--                       handed out, "\n<locator>\t<host>\t<port>\t<user>\t<pass>"
--                       (prelude/record.lua), soonest-expiring first
--   {"replay", result}  the key holds this digest: nothing extracted
--   {"conflict"}        the key holds another digest: nothing extracted
--   {"insufficient", M, now[, "backlog"]}  allOrNothing not met: M =
--                       eligible - reserve, at the Redis clock `now` (ms);
--                       "backlog" on a last round ("s") that could not
--                       count or walk every entry (M is then what it reached)
--   {"again"}           nothing was extracted: this call only took spent or
--                       damaged entries out of the index (progress that
--                       persists); the caller calls again
-- Errors: "POLICY <A>|<m>" / "LAYOUT <v>" when the pool records another
--   policy or layout (prelude/base.lua), before anything is written.
--
-- The phases (main, below; each phase's functions in lua/extract/: request,
-- plan, walk, take, joined before it by src/pool/scripts.rs):
--   read     the request
--   replay   an in-force idempotency record answers instead
--   plan     which head ranges of hd hold what the filters name: none -> the
--            G grouping (one range); protocols only -> P ranges; one of
--            region, carrier, upstream (with or without protocol) -> its
--            ranges, one per (protocol, value) named: exact, nothing skipped;
--            two or more -> the grouping whose named ranges hold the fewest
--            combinations, other dimensions checked on each head; for
--            count=1 without a reserve, a few named ranges are first probed
--            unread (quick: planned again if the walk must answer)
--   count    only with a reserve: the eligible proxies the filters match,
--            exactly: counters of what is indexed (several dimensions: the
--            enumerated combinations', or by inclusion and exclusion), less
--            the spent entries; enumerated, only until reserve + count are
--            there
--   walk     a merge in expiry order over ranges (by their current head),
--            combinations (by head) and entries: each candidate's record is
--            judged (prelude/record.lua); spent and damaged entries are passed
--            and leave the index (once a combination passed one, the spent
--            run right after it goes too, out of merge order); at most
--            SKIP_MAX of them per call, in at most TOUCH_MAX combinations
--            (each one's counter and heads are rewritten)
--   decide   fulfillment; a walk that passed SKIP_MAX entries reads every
--            eligible entry from `due` when there are at most FEW, else
--            answers "again" (the entries it passed are out for good)
--   write    the index changes, tombstones, counts and heads (prelude/index.lua),
--            then the idempotency record
--   usage    the hourly counters (when asked for), each a redis.pcall after
--            every pool write: a damaged counter hash never fails a call

local function extract(keys, argv)
  bind_keys(keys)
  clock()
  read_policy(argv[1])
  local X = read_request(keys, argv)
  local answered = replay(X)
  if answered then
    if answered[1] == 'replay' then count_usage(X, 'replay') end
    return answered
  end
  plan(X, X.count == 1 and X.reserve == 0)
  local w, ix = new_writes(), new_changes()
  X.target = X.count
  if X.reserve > 0 and not X.nothing then
    local eligible = count_eligible(X, w, ix)
    if not eligible and not X.settle then
      local refused = commit(w, ix)
      return refused or {'again'}
    end
    -- Uncountable on the last round: nothing can be spared for the caller.
    X.backlog = not eligible
    X.available = max(0, (eligible or 0) - X.reserve)
    X.target = min(X.count, X.available)
    if X.all and X.available < X.count then
      local refused = commit(w, ix)
      if refused then return refused end
      return short(X, X.available)
    end
  end
  -- (With a reserve, once the count planned no writes of its own.)
  if X.target == 1 and not X.nothing and (X.enumerate or not X.check)
     and (X.reserve == 0 or (next(w) == nil and #ix.order == 0)) then
    local taken = take_first(X)
    if taken == true then
      local result = record_result(X)
      count_usage(X, 'ok')
      return {'ok', result}
    elseif taken then
      return taken
    end
  end
  if X.quick then plan(X) end
  walk(X)
  if X.restart then
    -- The walk skipped more heads than the named combinations number: it
    -- read only, so it starts again over them.
    X.enumerate, X.skip_heads_max, X.restart = X.fallback, nil, nil
    walk(X)
  end
  -- Decide.
  local walked = true
  if X.stuck and not read_all_eligible(X) then
    if not X.settle then
      walked_changes(X, w, ix, false, true)
      local refused = commit(w, ix)
      return refused or {'again'}
    end
    -- The last round answers from the entries the walk reached.
    X.stuck, X.backlog = false, true
  end
  if X.stuck then
    walked = false
    local available = max(0, X.eligible - X.reserve)
    local take = min(X.count, available)
    if X.all and take < X.count then
      walked_changes(X, w, ix, false, true)
      local refused = commit(w, ix)
      if refused then return refused end
      return short(X, available)
    end
    walked_changes(X, w, ix, false, false)
    if not take_sorted(X, w, ix, take) then
      local refused = commit(w, ix)
      return refused or {'again'}
    end
  elseif X.all and X.found < X.count then
    walked_changes(X, w, ix, false, true)
    local refused = commit(w, ix)
    if refused then return refused end
    return short(X, X.found)
  else
    walked_changes(X, w, ix, true, true)
  end
  taken_changes(X, w, ix, walked)
  local refused = commit(w, ix)
  if refused then return refused end
  local result = record_result(X)
  count_usage(X, 'ok')
  return {'ok', result}
end
