#!/usr/bin/env python3
"""Counts the instructions Redis executes per extraction call, against a
trivial EVALSHA (`return 1`, sent one at a time over one open connection, as
the service sends its calls) on the same server: a measure of a call's cost
that does not move with what else the machine is doing (the bench's
microseconds do, by +-50% here).

It fills a pool with `proxy-pool load-demo` in a plain redis-server, saves
it, restarts that Redis under valgrind's callgrind (instrumentation off
while the pool loads), starts two `proxy-pool serve` on it (anonymous,
rate limits off, no usage counters), one calling the scripts as Functions
and one by EVALSHA, and for each case and each of them sends CALLS
requests over one keep-alive connection between a zeroing and a dump of
callgrind's counters. The counts are of the whole server: reading the
command, running it, replying. Prints instructions per call and the ratio
to the trivial call, sent TRIVIAL_CALLS times over one open connection
(what one measurement costs once, ~150k instructions, then weighs little;
each case's count holds it too, ~3k a call at 50 calls: a slight
overstatement of the cases).

Usage: python3 scripts/count-instructions.py [SIZE] [COMBINATIONS] [CALLS]
  SIZE defaults to 1M, COMBINATIONS to 18, CALLS to 100;
  the binary is $CARGO_TARGET_DIR (or target)/release/proxy-pool.
Needs valgrind, redis-server (or $REDIS_SERVER), redis-cli. With KEEP=1 the callgrind dumps
are kept (one per case, in order; each names its case on its `desc: Trigger`
line) for `callgrind_annotate --inclusive=yes`.

With AREAS=1 each FCALL case is also split by where its instructions go
(the Lua VM, strings, patterns, the collector, allocation, cjson, Redis's
commands, ...), by the source file of each function callgrind_annotate
names: meaningful with a redis-server built with its symbols, named by
REDIS_SERVER (Debian's has none for Lua; docs/performance.md, "Inside the
Lua", gives the build from `apt-get source redis`).

With PHASES=1 it then profiles the FCALL by phase: a copy of lua/extract.lua
with an `ECHO` marker at the end of each phase is loaded as a library of its
own, and callgrind dumps its counters as each marker's command starts
(`--dump-before=echoCommand`), so each dump holds one phase of one call.
Every phase is given less one marker's own cost (the phase "marker": two
markers in a row), in all instructions and in those of the Redis commands
the phase ran (callgrind_annotate's inclusive `scriptCall`), per call (the
mean over the calls after the first, and the median).
"""

import glob
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

SIZE = sys.argv[1] if len(sys.argv) > 1 else "1M"
COMBINATIONS = sys.argv[2] if len(sys.argv) > 2 else "18"
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 100
TRIVIAL_CALLS = 1000
# Another build of redis-server (one with its symbols, for callgrind_annotate
# to name the Lua VM's and cjson's functions) may be named by REDIS_SERVER.
REDIS_SERVER = os.environ.get("REDIS_SERVER", "redis-server")
BINARY = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release", "proxy-pool")
ENV = dict(
    os.environ,
    # The pool must stay fresh for the whole (slow) run; load-demo and serve
    # record and check the same pool policy.
    PROXY_POOL_MAX_HEALTH_CHECK_AGE_SECONDS="3600",
    PROXY_POOL_AUTH_SCHEMES="none",
    PROXY_POOL_CLIENT_RATE="off",
    PROXY_POOL_GLOBAL_RATE="off",
)
# Pools of up to 3 regions name them; larger ones number their cities
# (src/local/demo.rs).
DIMS = COMBINATIONS.split("x")
REGION = "shanghai" if COMBINATIONS in ("18", "54") or (len(DIMS) == 4 and int(DIMS[1]) <= 3) \
    else "city-000"
CASES = [
    # Matches nothing: the call's fixed part (decode, policy, clock, one
    # lookup, a short answer), nothing walked or written.
    # (name, request, proxies it must return)
    ("count=1, no such region", {"count": 1, "filters": {"regions": ["nowhere"]}}, 0),
    ("count=1, unfiltered", {"count": 1}, 1),
    ("count=1, one region", {"count": 1, "filters": {"regions": [REGION]}}, 1),
    ("count=100, unfiltered", {"count": 100}, 100),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True)
    return out.stdout.strip()


def wait_for(what, ready, seconds):
    """Polls `ready` until it holds (a server coming up has no event to wait on)."""
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            sys.exit(f"count-instructions: {what} not ready in {seconds} s")
        time.sleep(0.2)


def start_redis(port, workdir, prefix=()):
    args = [*prefix, REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
            "--dir", workdir, "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for("redis-server", lambda: cli(port, "PING") == "PONG", 900)
    return proc


def ready(http_port):
    try:
        c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=60)
        c.request("GET", "/health/ready")
        return c.getresponse().status == 200
    except OSError:
        return False


# The probe's markers: (the point of the call a marker stands at, the text
# in lua/extract.lua's main function it goes before; None: at the top of
# the function). Each text occurs once. A call passes the markers of its
# own path; each segment is named by the two markers around it.
MARKERS = [
    ("entered", None),
    ("marker", None),
    ("request read", "  local answered = replay(X)\n"),
    ("idempotency looked up", "  plan(X, X.count == 1 and X.reserve == 0)\n"),
    ("planned", "  local w, ix = new_writes(), new_changes()\n"),
    ("counted (with a reserve)", "  -- (With a reserve, once the count planned no writes of its own.)\n"),
    ("first taken (count=1 path)", "      local result = record_result(X)\n"),
    ("result recorded", "      count_usage(X, 'ok')\n      return {'ok', result}\n"),
    ("usage counted", "      return {'ok', result}\n"),
    ("walk begins", "\n  walk(X)\n"),
    ("walked", "  -- Decide.\n"),
    ("decided", "  local refused = commit(w, ix)\n  if refused then return refused end\n  local result"),
    ("committed", "\n  local result = record_result(X)\n"),
    ("result recorded", "\n  count_usage(X, 'ok')\n  return {'ok', result}\nend"),
    ("usage counted", "\n  return {'ok', result}\nend"),
]
PHASE_CASES = [
    ("count=1, no such region", {"count": 1, "filters": {"regions": ["nowhere"]}}),
    ("count=1, unfiltered", {"count": 1}),
    ("count=1, one region", {"count": 1, "filters": {"regions": [REGION]}}),
    ("count=100, unfiltered", {"count": 100}),
]
POOL_KEYS = ["rec", "due", "ax", "hd", "cnt", "idem", "idemx"]
PRELUDE = ["base.lua", "record.lua", "index.lua"]
# The phases joined before lua/extract.lua's main (src/pool/scripts.rs).
EXTRACT_PARTS = ["request.lua", "plan.lua", "walk.lua", "take.lua"]


def probe_library():
    """lua/extract.lua with its markers, as a library of its own (its code
    built as src/pool/scripts.rs builds the real one)."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lua")
    prelude = ""
    for part in PRELUDE:
        with open(os.path.join(root, "prelude", part)) as f:
            prelude += f.read() + "\n"
    with open(os.path.join(root, "extract.lua")) as f:
        body = f.read().split("\n", 1)[1]
    parts = ""
    for part in EXTRACT_PARTS:
        with open(os.path.join(root, "extract", part)) as f:
            parts += f.read() + "\n"
    body = parts + body
    entry = "local function extract(keys, argv)\n"
    top = ""
    for i, (_, anchor) in enumerate(MARKERS):
        marker = f"  phase_marker({i})\n"
        if anchor is None:
            top += marker
        elif anchor.startswith("\n"):
            if body.count(anchor) != 1:
                sys.exit(f"count-instructions: lua/extract.lua has {body.count(anchor)} of {anchor!r}")
            body = body.replace(anchor, "\n" + marker + anchor[1:])
        elif body.count(anchor) != 1:
            sys.exit(f"count-instructions: lua/extract.lua has {body.count(anchor)} of {anchor!r}")
        else:
            body = body.replace(anchor, marker + anchor)
    body = body.replace(entry, entry + top)
    # Each marker notes its index (phase_probe_hits returns and forgets them)
    # and runs an ECHO, where callgrind dumps.
    markers = ("local HITS = {}\n"
               "local function phase_marker(i)\n"
               "  HITS[#HITS + 1] = i\n"
               "  redis.call('ECHO', 'phase')\n"
               "end\n")
    return (f"#!lua name=phase_probe\n{prelude}\n{markers}local MAIN = {{}}\ndo\n{body}\n"
            "MAIN.extract = extract\nend\n"
            "redis.register_function{function_name = 'phase_probe_extract', callback = MAIN.extract}\n"
            "redis.register_function{function_name = 'phase_probe_hits', callback = function()\n"
            "  local hits = HITS\n  HITS = {}\n  return hits\nend}\n")


def script_args(policy, body):
    """The arguments lua/extract.lua takes for a request `body` (as
    src/pool/redis_pool.rs sends them): policy, count, fulfillment,
    reserve, request id, then the filters if any (no idempotency, no usage)."""
    filters = body.get("filters", {})
    def dim(name):
        values = filters.get(name)
        return "*" if not values else "".join("\n" + v for v in values)
    head = [policy, str(body["count"]), "partial", "0", "phase-probe"]
    if not filters:
        return head + [""]
    return head + ["f", dim("protocols"), dim("regions"), dim("carriers"), dim("allowedUpstreams")]


def dumps(workdir):
    """The callgrind dumps so far (callgrind.out.<pid>.<number>), in the
    order they were made."""
    numbered = {}
    for path in glob.glob(os.path.join(workdir, "callgrind.out.*.*")):
        m = re.search(r"\.(\d+)$", path)
        if m:
            numbered[int(m.group(1))] = path
    return [numbered[n] for n in sorted(numbered)]


def total_of(path):
    """All instructions in a dump."""
    with open(path) as f:
        for line in f:
            m = re.match(r"(?:summary|totals): (\d+)", line)
            if m:
                return int(m.group(1))
    sys.exit(f"count-instructions: no totals in {path}")


def annotate(path, *options):
    """callgrind_annotate's function list of a dump: (instructions, function) pairs."""
    out = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", *options, path],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+(\S.*)$", line)
        if m and "PROGRAM TOTALS" not in line:
            rows.append((int(m.group(1).replace(",", "")), m.group(2)))
    return rows


def costs(path):
    """All instructions in a dump, and those under scriptCall (the commands
    a script runs, from the ACL check to the reply it gets)."""
    commands = sum(n for n, name in annotate(path, "--inclusive=yes")
                   if re.search(r":scriptCall\b", name))
    return total_of(path), commands


# Where a call's instructions go, by the source file of the function that
# ran them (callgrind_annotate's exclusive costs): the first area whose
# pattern matches. Needs a redis-server with its symbols (REDIS_SERVER):
# Debian's names only Redis's exported functions.
AREAS = [
    ("Lua VM: bytecode, calls, tables", r"/lua/src/l(vm|do|table|api|func|tm|object|debug|state)\.c"),
    ("Lua strings: made and interned", r"/lua/src/lstring\.c"),
    ("Lua string library: match, find, sub, format", r"/lua/src/lstrlib\.c|ctype"),
    ("Lua garbage collector", r"/lua/src/lgc\.c"),
    ("memory allocation", r"jemalloc|/lua/src/(lmem|lauxlib)\.c|zmalloc|memset"),
    ("cjson and the numbers it parses and prints",
     r"lua_cjson|strbuf|fpconv|strtod|str_to_mpn|round_and_return|printf|_itoa|_IO_|sprintf"),
    ("Redis commands and their data structures",
     r"/src/(t_\w+|dict|sds|siphash|listpack|ziplist|object|db|server|acl|notify|expire|"
     r"quicklist|intset|rax|util|latency|slowlog)\.[ch]"),
    ("Redis script glue: arguments and replies", r"/src/(script_lua|script|function_lua|functions|eval|resp_parser)\.c"),
    ("Redis networking and event loop", r"/src/(networking|ae|ae_epoll|anet|connection|socket|monotonic)\.c"),
    ("libc memory and string routines", r"mem(cmp|cpy|move|chr)|str(len|chr|cmp)"),
]


def print_areas(path, calls):
    sums = dict.fromkeys([a for a, _ in AREAS] + ["other"], 0)
    for n, name in annotate(path):
        area = next((a for a, pattern in AREAS if re.search(pattern, name)), "other")
        sums[area] += n
    total = total_of(path)
    for area, n in sums.items():
        print(f"    {area:<48} {n / calls:>12,.0f} {100 * n / total:>5.1f}%")


def phases(port, pid, workdir, calls):
    """Prints the phase profile of each PHASE_CASES case."""
    policy = cli(port, "HGET", "{pp}:v4:cnt", "meta").split("|", 1)[1]
    subprocess.run(["redis-cli", "-p", str(port), "-x", "FUNCTION", "LOAD", "REPLACE"],
                   input=probe_library(), capture_output=True, text=True, check=True)
    keys = [f"{{pp}}:v4:{k}" for k in POOL_KEYS]
    print(f"\nFCALL by phase ({calls} calls a case, a call after the first: mean, and median; "
          "each phase less one marker; 'commands': its Redis commands, scriptCall inclusive)")
    for name, body in PHASE_CASES:
        command = ["FCALL", "phase_probe_extract", str(len(keys)), *keys, *script_args(policy, body)]
        # One RESP command, repeated (arguments hold newlines).
        line = f"*{len(command)}\r\n" + "".join(
            f"${len(a.encode())}\r\n{a}\r\n" for a in command)
        seen = set(dumps(workdir))
        replies = subprocess.run(["redis-cli", "-p", str(port), "--pipe"], input=line * calls,
                                 capture_output=True, text=True, check=True).stdout
        if f"replies: {calls}" not in replies or "errors: 0" not in replies:
            sys.exit(f"count-instructions: the probe did not answer ok {calls} times: {replies[:300]}")
        subprocess.run(["callgrind_control", "-d", "phases-end", str(pid)], check=True,
                       capture_output=True)
        new = [costs(p) for p in dumps(workdir) if p not in seen]
        hits = [int(h) for h in cli(port, "FCALL", "phase_probe_hits", "0").split()]
        # The markers one call passes, the same in every call.
        h = len(hits) // calls
        path = hits[:h]
        if h < 2 or hits != path * calls:
            sys.exit(f"count-instructions: the calls passed different markers: {hits[:60]}")
        # new: calls x h, then the last call's tail up to the ECHO
        # `redis-cli --pipe` ends with, and that ECHO's (both left out)
        if len(new) != calls * h + 2:
            sys.exit(f"count-instructions: {len(new)} dumps for {calls} calls of {h} markers")
        # Segment j of call i ends at its marker path[j]; the tail of call i
        # is the "entered" dump of call i + 1.
        per = {j: [new[i * h + j] for i in range(1, calls - 1)] for j in range(1, h)}
        per[0] = [new[(i + 1) * h] for i in range(1, calls - 1)]
        # Means: a call's Lua garbage collection falls in whichever phase
        # allocates past the collector's threshold (the medians leave it out).
        mean = {k: (statistics.mean(t for t, _ in v), statistics.mean(c for _, c in v),
                    statistics.median(t for t, _ in v)) for k, v in per.items()}
        mark_all, mark_cmd, mark_med = mean[1]
        print(f"\n{name}")
        print(f"  {'from -> to':<56} {'instructions':>13} {'commands':>10} {'median':>10}")
        total = 0
        for j in list(range(2, h)) + [0]:
            all_, cmd, med = mean[j]
            if j:
                label = f"{MARKERS[path[j - 1]][0]} -> {MARKERS[path[j]][0]}"
            else:
                label = f"{MARKERS[path[-1]][0]} -> reply, next call entered"
            print(f"  {label:<56} {all_ - mark_all:>13,.0f} {max(0, cmd - mark_cmd):>10,.0f} "
                  f"{med - mark_med:>10,.0f}")
            total += all_ - mark_all
        print(f"  {'the call':<56} {total:>13,.0f}")
        print(f"  ({'one marker':<54} {mark_all:>13,.0f} {mark_cmd:>10,.0f} {mark_med:>10,.0f})")


def counted(workdir, pid, name, run):
    """Instructions callgrind counts while `run()` runs, and their dump."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    run()
    subprocess.run(["callgrind_control", "-d", name, str(pid)], check=True, capture_output=True)
    path = dumps(workdir)[-1]
    return total_of(path), path


def main():
    if not os.path.exists(BINARY):
        sys.exit(f"count-instructions: build first (cargo build --release --bins): no {BINARY}")
    workdir = tempfile.mkdtemp(prefix="count-instructions.")
    procs = []
    try:
        port = free_port()
        plain = start_redis(port, workdir)
        subprocess.run([BINARY, "load-demo", "--redis-url", f"redis://127.0.0.1:{port}/",
                        "--size", SIZE, "--combinations", COMBINATIONS],
                       env=ENV, check=True, stdout=subprocess.DEVNULL)
        cli(port, "SAVE")
        cli(port, "SHUTDOWN", "NOSAVE")
        plain.wait()

        port = free_port()
        grind = start_redis(port, workdir, prefix=(
            "valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=echoCommand",
            f"--callgrind-out-file={workdir}/callgrind.out.%p"))
        procs.append(grind)
        servers = {}
        for way, functions in (("FCALL", "true"), ("EVALSHA", "false")):
            http_port = free_port()
            procs.append(subprocess.Popen(
                [BINARY, "serve", "--listen", f"127.0.0.1:{http_port}",
                 "--redis-url", f"redis://127.0.0.1:{port}/"],
                env=dict(ENV, PROXY_POOL_REDIS_FUNCTIONS=functions),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for("serve", lambda: ready(http_port), 120)
            servers[way] = http.client.HTTPConnection("127.0.0.1", http_port, timeout=600)

        def extract(conn, body, returned):
            conn.request("POST", "/api/v1/proxies/extract", json.dumps(body),
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            if response.status != 200 or answer["returned"] != returned:
                sys.exit(f"count-instructions: {response.status} {answer}")

        subprocess.run(["callgrind_control", "-i", "on", str(grind.pid)], check=True,
                       capture_output=True)
        sha = cli(port, "SCRIPT", "LOAD", "return 1")
        cli(port, "-r", "10", "EVALSHA", sha, "0")
        # The trivial call, one at a time over one open connection, as the
        # service sends its calls, TRIVIAL_CALLS times: what a measurement
        # costs once (~150k instructions) then weighs little (over 50 calls,
        # or through one `redis-cli -r 50`, the trivial call read 14-23k).
        trivial_conn = socket.create_connection(("127.0.0.1", port))
        call = f"*3\r\n$7\r\nEVALSHA\r\n${len(sha)}\r\n{sha}\r\n$1\r\n0\r\n".encode()

        def trivial_calls():
            for _ in range(TRIVIAL_CALLS):
                trivial_conn.sendall(call)
                reply = b""
                while not reply.endswith(b"\r\n"):
                    reply += trivial_conn.recv(64)
                if reply != b":1\r\n":
                    sys.exit(f"count-instructions: trivial call answered {reply!r}")

        trivial = counted(workdir, grind.pid, "trivial", trivial_calls)[0] / TRIVIAL_CALLS
        trivial_conn.close()
        print(f"pool {SIZE} over {COMBINATIONS} combinations, {CALLS} calls a case "
              f"(callgrind, the whole redis-server: read, run, reply)")
        print(f"{'case':<24} {'by':<8} {'instructions/call':>18} {'x trivial':>10}")
        print(f"{'trivial (return 1)':<24} {'EVALSHA':<8} {trivial:>18,.0f} {1:>10.1f}")
        for name, body, returned in CASES:
            for way, conn in servers.items():
                for _ in range(5):
                    extract(conn, body, returned)  # warm: the pool's hints, the connection
                total, path = counted(workdir, grind.pid, f"{way}-{name}".replace(" ", ""),
                                      lambda: [extract(conn, body, returned) for _ in range(CALLS)])
                per_call = total / CALLS
                print(f"{name:<24} {way:<8} {per_call:>18,.0f} {per_call / trivial:>10.1f}")
                if os.environ.get("AREAS") == "1" and way == "FCALL":
                    print_areas(path, CALLS)
        if os.environ.get("PHASES") == "1":
            phases(port, grind.pid, workdir, max(3, min(CALLS, 20)))
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()
        if os.environ.get("KEEP") == "1":
            print(f"callgrind dumps kept in {workdir}")
        else:
            subprocess.run(["rm", "-rf", workdir], check=False)


if __name__ == "__main__":
    main()
