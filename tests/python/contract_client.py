"""A health checker, a Controller and a Worker in Python: the pool contract
called through the public function library (docs/pool-contract.md,
"Calling the contract from any language") with nothing but redis-py's
``fcall``.

Run by tests/contract_python.rs as ``python contract_client.py REDIS_URL``
with a JSON object on standard input: ``{"policy": "<maxHealthCheckAge
ms>|<minRemainingTTL ms>", "proxies": [...]}``, the proxies the Rust side
loaded as a Controller knows them (``id``, ``protocol``, ``host``, ``port``,
``username``, ``password``, ``region``, ``carrier``, ``upstream``,
``expiresAt`` and ``usableUntil`` in Unix ms). It checks every reply it
gets, exits 1 with the reason on standard error at the first surprise, and
otherwise prints a JSON summary of what it did on standard output.
"""

import json
import sys

import redis

LIBRARY = "proxy_pool_v3"
# The pool keys, KEYS[1..7] of every public function, in this order.
KEYS = [
    "{pp}:v4:rec",
    "{pp}:v4:due",
    "{pp}:v4:ax",
    "{pp}:v4:hd",
    "{pp}:v4:cnt",
    "{pp}:v4:idem",
    "{pp}:v4:idemx",
]
# Health results per call: a few batches here (the Rust side sends up to 500).
BATCH = 200
WORKER = "py-worker-1"


def fail(what):
    sys.exit(f"contract_client: {what}")


def check(condition, what):
    if not condition:
        fail(what)


def call(r, script, *args):
    """One call of a public function: the seven pool keys, then ARGV."""
    return r.fcall(f"{LIBRARY}_{script}", len(KEYS), *KEYS, *args)


def refused(r, script, args, expected):
    """A call that must fail as a whole with an error containing `expected`."""
    try:
        call(r, script, *args)
    except redis.ResponseError as e:
        check(expected in str(e), f"{script}: error {str(e)!r}, wanted {expected!r}")
        return
    fail(f"{script}: accepted a call it must refuse ({expected})")


def upsert_arg(p, healthy, checked_at):
    """upsert's per-proxy argument: H, usableUntil and checkedAt (13 digits
    of Unix ms), the locator, then host, port, user and password ("" when
    none), tab-separated."""
    locator = "|".join(
        [p["protocol"], p.get("region", ""), p.get("carrier", ""), p["upstream"],
         "%013d" % p["expiresAt"], p["id"]]
    )
    return "%s%013d%013d%s\t%s\t%d\t%s\t%s" % (
        "1" if healthy else "0",
        max(p["usableUntil"], 0),
        checked_at,
        locator,
        p["host"],
        p["port"],
        p.get("username") or "",
        p.get("password") or "",
    )


def contract(r, policy, ops):
    """One contract call: `ops` are (name, id, up to four arguments); returns
    the Redis clock and one (verdict, epoch) per operation."""
    args = [policy]
    for op in ops:
        args += list(op) + [""] * (6 - len(op))
    reply = call(r, "contract", *args)
    check(len(reply) == 1 + 2 * len(ops), f"contract reply of {len(reply)} items for {len(ops)} operations")
    return reply[0], [(reply[i], reply[i + 1]) for i in range(1, len(reply), 2)]


def main():
    r = redis.Redis.from_url(sys.argv[1], decode_responses=True)
    doc = json.load(sys.stdin)
    policy, proxies = doc["policy"], doc["proxies"]
    ids = [p["id"] for p in proxies]
    check(len(ids) > 12, "too few proxies to work with")

    # The health checker: every sixth proxy failed, the rest passed, in
    # batches; the first batch checked "now" (""), later ones at the Redis
    # clock the previous call answered with.
    results = [(pid, i % 6 != 0) for i, pid in enumerate(ids)]
    checked_at = ""
    for start in range(0, len(results), BATCH):
        batch = results[start:start + BATCH]
        now, verdicts = contract(
            r, policy, [("health", pid, "1" if ok else "0", checked_at) for pid, ok in batch]
        )
        check(verdicts == [("ok", 0)] * len(batch), f"health batch at {start}: {verdicts[:5]}")
        checked_at = str(now)
    failed = [pid for pid, ok in results if not ok]
    passed = [pid for pid, ok in results if ok]

    # A result older than the recorded one is stale; an unknown id is named.
    now, verdicts = contract(
        r, policy, [("health", ids[1], "0", str(now - 60000)), ("health", "py-no-such-proxy", "1")]
    )
    check(verdicts == [("stale", 0), ("unknown", 0)], f"stale and unknown: {verdicts}")

    # The Controller: three proxies refreshed an hour later, one added with
    # no user, password, region or carrier, one refused as already expired.
    refreshed = {}
    args = [policy]
    for p in proxies[2:5]:
        later = dict(p, expiresAt=p["expiresAt"] + 3600000, usableUntil=p["expiresAt"] + 3570000)
        refreshed[p["id"]] = later["expiresAt"]
        args.append(upsert_arg(later, True, now))
    added = {"id": "py-new-1", "protocol": "socks5", "host": "203.0.113.7", "port": 1080,
             "region": "", "carrier": "", "upstream": "provider-py",
             "expiresAt": now + 1800000, "usableUntil": now + 1770000}
    args.append(upsert_arg(added, True, now))
    late = dict(added, id="py-late-1", expiresAt=now - 1000, usableUntil=now - 1000)
    args.append(upsert_arg(late, True, now))
    reply = call(r, "upsert", *args)
    check(reply[1:] == ["refreshed"] * 3 + ["added", "expired"], f"upsert statuses {reply[1:]}")

    # A Worker: claim (a second Worker's claim of the same proxy in the same
    # call is ineligible), then drain, ack 0/0 and release in one call, and
    # a late release with the old epoch fenced off.
    target = ids[7]
    _, verdicts = contract(r, policy, [("claim", target, WORKER, "30000", "120000"),
                                       ("claim", target, "py-worker-2", "30000", "120000")])
    (claimed, epoch), (second, _) = verdicts
    check(claimed == "ok" and epoch >= 1 and second == "ineligible", f"claims: {verdicts}")
    _, verdicts = contract(r, policy, [
        ("drain", target, WORKER, str(epoch)),
        ("ack", target, WORKER, str(epoch), "0", "0"),
        ("release", target, WORKER, str(epoch)),
        ("release", target, WORKER, str(epoch)),
    ])
    check(verdicts == [("ok", epoch), ("ok", epoch), ("ok", epoch + 1), ("not-owner", epoch + 1)],
          f"drain, ack, release: {verdicts}")

    # Refused whole, nothing written: the wrong pool policy, a malformed
    # operation list (its first operation would fail ids[5]), a bad proxy
    # after a good one (py-never-1 must not appear).
    refused(r, "contract", ["1|1", "health", ids[5], "0", "", "", ""], "POLICY " + policy)
    refused(r, "contract", [policy, "health", ids[5], "0", "", "", "", "health", ids[6]],
            "bad contract arguments")
    never = dict(added, id="py-never-1")
    refused(r, "upsert", [policy, upsert_arg(never, True, now), "not a proxy"], "not a valid proxy")
    # Each field of a proxy checked: a port of 0 or over 65535, a host with
    # a space, a user with a control character, no password field.
    for bad in [dict(never, port=0), dict(never, port=65536), dict(never, host="192.0.2.1 x"),
                dict(never, username="u\x01")]:
        refused(r, "upsert", [policy, upsert_arg(bad, True, now)], "not a valid proxy")
    refused(r, "upsert", [policy, upsert_arg(never, True, now).rsplit("\t", 1)[0]], "not a valid proxy")
    refused(r, "prune", [policy, "0"], "bad prune arguments")

    # Upkeep: nothing has expired; the inventory counts what the Rust side
    # can hand out.
    pruned = call(r, "prune", policy, "100")
    check(pruned == [0, 0, 0, 0], f"prune {pruned}")
    eligible, cursor = 0, "0"
    while True:
        _, rows, held, cursor, exact, records, tombstones = call(
            r, "inventory", policy, cursor, "1000", "300000")
        check(held == 0 and exact == 1, f"inventory held {held}, exact {exact}")
        # Nothing was handed out: no tombstone; every proxy added is a record.
        check(tombstones == 0 and records >= len(failed) + len(passed),
              f"inventory records {records}, tombstones {tombstones}")
        eligible += sum(row[1] for row in rows)
        if cursor == "0":
            break
    check(eligible == len(passed) + 1, f"eligible {eligible}, expected {len(passed) + 1}")

    json.dump({
        "library": LIBRARY,
        "failed": failed,
        "passed": passed,
        "refreshed": refreshed,
        "added": added,
        "claimed": {"id": target, "worker": WORKER, "claimEpoch": epoch, "epoch": epoch + 1},
        "eligible": eligible,
        "neverAdded": never["id"],
    }, sys.stdout)
    print()


if __name__ == "__main__":
    main()
