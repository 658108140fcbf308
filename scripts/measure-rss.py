#!/usr/bin/env python3
"""Measures the Lambda binary's peak resident memory under load.

It starts a private redis-server on a free loopback port, loads a demo pool
into it with `proxy-pool load-demo`, plays a minimal Lambda Runtime API on
loopback, and hands the binary INVOCATIONS API Gateway extraction events
(count=10, anonymous, rate limits off) back to back, as fast as it takes
them (Lambda gives an instance one event at a time). At the end it reads
VmHWM (peak RSS) and VmRSS from /proc/<pid>/status, then stops everything.

Usage: python3 scripts/measure-rss.py [INVOCATIONS] [LAMBDA_BINARY]
  binaries from $CARGO_TARGET_DIR (or target)/release: proxy-pool-lambda
  (unless LAMBDA_BINARY is given), proxy-pool. An arm64 LAMBDA_BINARY
  (.aws-sam/build/DistributionFunction/bootstrap) on an x86_64 host runs
  under qemu-user (scripts/lambda_runner.py): the peak RSS is then that of
  the emulator process (guest memory plus qemu and its translated code),
  not comparable with a native figure.
"""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

from lambda_runner import announce

PREFIX = "/2018-06-01/runtime/invocation/"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event(n: int) -> bytes:
    body = json.dumps({"count": 10})
    return json.dumps({
        "version": "2.0",
        "routeKey": "POST /api/v1/proxies/extract",
        "rawPath": "/api/v1/proxies/extract",
        "rawQueryString": "",
        "headers": {"content-type": "application/json", "content-length": str(len(body))},
        "requestContext": {
            "accountId": "123456789012", "apiId": "rss", "domainName": "rss.local",
            "domainPrefix": "rss", "requestId": f"rss-{n}", "routeKey": "POST /api/v1/proxies/extract",
            "stage": "$default", "time": "12/Mar/2026:09:30:00 +0000", "timeEpoch": 1773307800000,
            "http": {"method": "POST", "path": "/api/v1/proxies/extract", "protocol": "HTTP/1.1",
                     "sourceIp": "203.0.113.7", "userAgent": "measure-rss"},
        },
        "isBase64Encoded": False,
        "body": body,
    }).encode()


def status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def main() -> int:
    invocations = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    release = os.path.join(os.environ.get("CARGO_TARGET_DIR", "target"), "release")
    lambda_bin = sys.argv[2] if len(sys.argv) > 2 else os.path.join(release, "proxy-pool-lambda")
    cli_bin = os.path.join(release, "proxy-pool")
    for b in (lambda_bin, cli_bin):
        if not os.access(b, os.X_OK):
            print(f"measure-rss: {b} is missing; cargo build --release --bins", file=sys.stderr)
            return 1
    lambda_argv = announce(lambda_bin, "measure-rss")
    if lambda_argv is None:
        return 1

    port = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        size = invocations * 10 + 1000
        subprocess.run([cli_bin, "load-demo", "--redis-url", url, "--size", str(size)],
                       check=True, stdout=subprocess.DEVNULL)

        state = {"next": 0, "done": 0, "ok": 0, "first": None, "last": None}
        lock = threading.Lock()
        finished = threading.Event()

        class RuntimeApi(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: without this,
            # Nagle and delayed ACKs add 40 ms to every invocation.
            disable_nagle_algorithm = True

            def handle(self):
                try:
                    super().handle()
                except ConnectionResetError:
                    pass  # the binary was stopped with its next poll open

            def do_GET(self):  # noqa: N802
                if not self.path.endswith("/next"):
                    self.send_error(404)
                    return
                with lock:
                    n = state["next"]
                    state["next"] += 1
                if n >= invocations:
                    finished.wait(30)
                    self.send_error(503)
                    return
                payload = event(n)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.send_header("Lambda-Runtime-Aws-Request-Id", f"rss-{n}")
                self.send_header("Lambda-Runtime-Deadline-Ms", str(int(time.time() * 1000) + 10_000))
                self.send_header("Lambda-Runtime-Invoked-Function-Arn",
                                 "arn:aws:lambda:eu-west-1:123456789012:function:proxy-pool-rss")
                self.send_header("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000")
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()
                with lock:
                    state["done"] += 1
                    now = time.perf_counter()
                    state["first"] = state["first"] or now
                    state["last"] = now
                    if self.path.endswith("/response") and b'"statusCode":200' in body.replace(b" ", b""):
                        state["ok"] += 1
                    if state["done"] >= invocations:
                        finished.set()

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RuntimeApi)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "AWS_LAMBDA_RUNTIME_API": f"127.0.0.1:{server.server_address[1]}",
            "AWS_LAMBDA_FUNCTION_NAME": "proxy-pool-rss",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "128",
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_LOG_STREAM_NAME": "rss",
            "AWS_LAMBDA_LOG_GROUP_NAME": "/aws/lambda/proxy-pool-rss",
            "AWS_LAMBDA_LOG_FORMAT": "JSON",
            "PROXY_POOL_REDIS_URL": url,
            "PROXY_POOL_AUTH_SCHEMES": "none",
            "PROXY_POOL_CLIENT_RATE": "off",
        }
        proc = subprocess.Popen(lambda_argv, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if not finished.wait(300):
                print(f"measure-rss: only {state['done']} of {invocations} invocations in 300 s",
                      file=sys.stderr)
                return 1
            hwm, rss = status_kib(proc.pid, "VmHWM"), status_kib(proc.pid, "VmRSS")
        finally:
            proc.kill()
            proc.wait()
            server.shutdown()
        rate = (invocations - 1) / max(state["last"] - state["first"], 1e-9)
        print(f"{invocations} extraction invocations (count=10), {state['ok']} answered 200, "
              f"{rate:.0f}/s through the emulated Runtime API")
        print(f"peak RSS (VmHWM) {hwm / 1024:.1f} MiB, RSS at the end {rss / 1024:.1f} MiB")
        return 0 if state["ok"] == invocations else 1
    finally:
        redis.kill()
        redis.wait()


if __name__ == "__main__":
    sys.exit(main())
