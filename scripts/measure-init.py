#!/usr/bin/env python3
"""Measures the Lambda binary's init time: from process start to its first
request to the Lambda Runtime API (GET .../runtime/invocation/next), the
moment Lambda's INIT phase ends for a custom runtime.

It plays a minimal Runtime API on a loopback port, starts the binary with
the environment Lambda gives a function, notes when the first `next` request
arrives, then stops the binary. Repeated RUNS times; prints every run and the
median. The Redis connection is lazy, so no Redis is needed (the URL points
at a closed port on purpose: init must not wait for Redis).

Usage: python3 scripts/measure-init.py [BINARY] [RUNS]
  BINARY defaults to $CARGO_TARGET_DIR (or target)/release/proxy-pool-lambda;
  an arm64 one (.aws-sam/build/DistributionFunction/bootstrap) on an x86_64
  host runs under qemu-user (scripts/lambda_runner.py): that measures the
  emulator as much as the binary, so label such figures as emulated.
"""

import http.server
import os
import statistics
import subprocess
import sys
import threading
import time

from lambda_runner import announce

NEXT_PATH = "/2018-06-01/runtime/invocation/next"


def main() -> int:
    target = os.environ.get("CARGO_TARGET_DIR", "target")
    binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "release", "proxy-pool-lambda")
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 21
    if not os.access(binary, os.X_OK):
        print(f"measure-init: {binary} is not an executable; build it first "
              "(cargo build --release --bin proxy-pool-lambda)", file=sys.stderr)
        return 1
    argv = announce(binary, "measure-init")
    if argv is None:
        return 1

    arrived = threading.Event()
    stop = threading.Event()
    state = {"t1": 0}

    class RuntimeApi(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            if self.path == NEXT_PATH and not arrived.is_set():
                state["t1"] = time.perf_counter_ns()
                arrived.set()
            # Hold the long poll open, as Lambda does between invocations.
            stop.wait(10)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RuntimeApi)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    api = f"127.0.0.1:{server.server_address[1]}"

    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "AWS_LAMBDA_RUNTIME_API": api,
        "AWS_LAMBDA_FUNCTION_NAME": "proxy-pool-measure",
        "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
        "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
        "AWS_LAMBDA_LOG_STREAM_NAME": "measure",
        "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/proxy-pool-measure",
        "AWS_LAMBDA_LOG_FORMAT": "JSON",
        "PROXY_POOL_REDIS_URL": "redis://127.0.0.1:1/",
        # Anonymous: with apiKey (the default) init also fetches the client
        # registry from Secrets Manager, a network call this cannot time.
        "PROXY_POOL_AUTH_SCHEMES": "none",
    }
    samples = []
    for i in range(runs):
        arrived.clear()
        stop.clear()
        t0 = time.perf_counter_ns()
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        ok = arrived.wait(10)
        proc.kill()
        _, err = proc.communicate()
        stop.set()
        if not ok:
            print(f"measure-init: run {i + 1}: no request to the runtime API within 10 s; "
                  f"stderr: {err.decode(errors='replace')[:500]}", file=sys.stderr)
            return 1
        ms = (state["t1"] - t0) / 1e6
        samples.append(ms)
        print(f"run {i + 1:2}: {ms:.2f} ms")
    server.shutdown()
    print(f"init (process start -> first GET {NEXT_PATH}), {runs} runs: "
          f"median {statistics.median(samples):.2f} ms, min {min(samples):.2f} ms, "
          f"max {max(samples):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
