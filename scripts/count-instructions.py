#!/usr/bin/env python3
"""Counts the instructions Redis executes per extraction call, against a
trivial EVALSHA (`return 1`) on the same server: a measure of a call's cost
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
to the trivial call.

Usage: python3 scripts/count-instructions.py [SIZE] [COMBINATIONS] [CALLS]
  SIZE defaults to 1M, COMBINATIONS to 18, CALLS to 100;
  the binary is $CARGO_TARGET_DIR (or target)/release/proxy-pool.
Needs valgrind, redis-server, redis-cli. With KEEP=1 the callgrind dumps
are kept (one per case, in order; each names its case on its `desc: Trigger`
line) for `callgrind_annotate --inclusive=yes`.
"""

import glob
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

SIZE = sys.argv[1] if len(sys.argv) > 1 else "1M"
COMBINATIONS = sys.argv[2] if len(sys.argv) > 2 else "18"
CALLS = int(sys.argv[3]) if len(sys.argv) > 3 else 100
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
    args = [*prefix, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
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


def counted(workdir, pid, name, run):
    """Instructions callgrind counts while `run()` runs."""
    subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
    run()
    subprocess.run(["callgrind_control", "-d", name, str(pid)], check=True, capture_output=True)
    newest = max(glob.glob(os.path.join(workdir, "callgrind.out.*")), key=os.path.getmtime)
    with open(newest) as f:
        for line in f:
            m = re.match(r"(?:summary|totals): (\d+)", line)
            if m:
                return int(m.group(1))
    sys.exit(f"count-instructions: no totals in {newest}")


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
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
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
        trivial = counted(workdir, grind.pid, "trivial", lambda: cli(
            port, "-r", str(CALLS), "EVALSHA", sha, "0")) / CALLS
        print(f"pool {SIZE} over {COMBINATIONS} combinations, {CALLS} calls a case "
              f"(callgrind, the whole redis-server: read, run, reply)")
        print(f"{'case':<24} {'by':<8} {'instructions/call':>18} {'x trivial':>10}")
        print(f"{'trivial (return 1)':<24} {'EVALSHA':<8} {trivial:>18,.0f} {1:>10.1f}")
        for name, body, returned in CASES:
            for way, conn in servers.items():
                for _ in range(5):
                    extract(conn, body, returned)  # warm: the pool's hints, the connection
                per_call = counted(workdir, grind.pid, f"{way}-{name}".replace(" ", ""),
                                   lambda: [extract(conn, body, returned) for _ in range(CALLS)]) / CALLS
                print(f"{name:<24} {way:<8} {per_call:>18,.0f} {per_call / trivial:>10.1f}")
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
