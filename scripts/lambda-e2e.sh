#!/usr/bin/env bash
# End-to-end test of the Lambda binary under the Lambda Runtime API, with
# cargo-lambda's runtime-API emulator:
#
#   bash scripts/lambda-e2e.sh           `cargo lambda watch` builds and runs
#                                        proxy-pool-lambda (debug, this host)
#   bash scripts/lambda-e2e.sh BINARY    runs an already built binary, e.g.
#                                        .aws-sam/build/DistributionFunction/bootstrap
#                                        (arm64: under qemu-user, see
#                                        scripts/lambda_runner.py), against
#                                        `cargo lambda watch --only-lambda-apis`
#
# Every event in events/ is sent with `cargo lambda invoke` and checked
# against the table in events/README.md (as tests/events.rs does in
# process). A few real HTTP requests go through the emulator's function URL
# endpoint too. It starts its own redis-server and moto's Secrets Manager
# emulator (holding events/clients/clients.json as the clients secret, read
# by the binary through the real SDK) on free loopback ports, is bounded in
# time (LAMBDA_E2E_TIMEOUT seconds, default 600), stops every process it
# started, and ends with "N passed, M failed" (non-zero exit on any failure).
set -euo pipefail
cd "$(dirname "$0")/.."

binary=${1:-}

deadline=${LAMBDA_E2E_TIMEOUT:-600}
demo_size=300
work=$(mktemp -d)
redis_pid=""
moto_pid=""
watch_pid=""
function_pid=""
passed=0
failed=0

cleanup() {
  # Each runs in its own session (setsid): end each whole group.
  if [ -n "$function_pid" ]; then kill -TERM -- "-$function_pid" 2>/dev/null || true; fi
  if [ -n "$watch_pid" ]; then kill -TERM -- "-$watch_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then kill -TERM -- "-$redis_pid" 2>/dev/null || true; fi
  if [ -n "$moto_pid" ]; then kill -TERM -- "-$moto_pid" 2>/dev/null || true; fi
  if [ -n "$function_pid" ]; then wait "$function_pid" 2>/dev/null || true; fi
  if [ -n "$watch_pid" ]; then wait "$watch_pid" 2>/dev/null || true; fi
  if [ -n "$moto_pid" ]; then wait "$moto_pid" 2>/dev/null || true; fi
  if [ -n "$redis_pid" ]; then wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap 'echo "lambda-e2e: interrupted" >&2; echo "$passed passed, $((failed + 1)) failed"; exit 130' INT TERM
# A watchdog bounds the whole run: on expiry it interrupts this script.
setsid bash -c "sleep $deadline; echo 'lambda-e2e: over ${deadline}s, giving up' >&2; kill -TERM $$" &
watchdog=$!
trap 'kill -TERM -- "-$watchdog" 2>/dev/null || true; cleanup' EXIT

for tool in redis-server redis-cli python3 cargo-lambda moto_server; do
  command -v "$tool" >/dev/null || { echo "lambda-e2e: $tool is missing (run scripts/deps.sh)" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for WHAT SECONDS COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
  local what=$1 seconds=$2
  shift 2
  local tries=$((seconds * 10))
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "lambda-e2e: $what not ready after ${seconds}s" >&2
  return 1
}

pass() { passed=$((passed + 1)); echo "ok    $1"; }
fail() { failed=$((failed + 1)); echo "FAIL  $1: $2"; }

# How the binary under test runs (natively, or an arm64 one under qemu);
# fails here, loudly, if the emulator or the arm64 C library is missing.
if [ -n "$binary" ]; then
  runner_argv=$(python3 scripts/lambda_runner.py "$binary") || exit 1
  mapfile -t run_function <<<"$runner_argv"
  how=$(python3 -c 'import sys; sys.path.insert(0, "scripts"); from lambda_runner import describe; print(describe(sys.argv[1]))' "$binary")
  echo "lambda-e2e: $binary ($how, $(wc -c <"$binary") bytes)"
  # cargo lambda watch --only-lambda-apis serves a function it did not start as "_".
  function_name=_
  function_log="$work/function.log"
  echo "lambda-e2e: building the CLI (demo pool loader)"
  cargo build --locked --quiet --bin proxy-pool
else
  function_name=proxy-pool-lambda
  function_log="$work/watch.log"
  echo "lambda-e2e: building"
  cargo build --locked --quiet --bin proxy-pool-lambda --bin proxy-pool
fi
target_dir=${CARGO_TARGET_DIR:-target}
cli="$target_dir/debug/proxy-pool"

redis_port=$(free_port)
redis_url="redis://127.0.0.1:$redis_port/"
setsid redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no \
  --daemonize no --logfile "$work/redis.log" &
redis_pid=$!
wait_for redis-server 20 redis-cli -p "$redis_port" ping

moto_port=$(free_port)
setsid moto_server -H 127.0.0.1 -p "$moto_port" >"$work/moto.log" 2>&1 </dev/null &
moto_pid=$!
moto_open() { (exec 3<>"/dev/tcp/127.0.0.1/$moto_port") 2>/dev/null; }
wait_for moto_server 60 moto_open
# The clients secret, created with boto3 from moto's own virtualenv.
"$(dirname "$(command -v moto_server)")/python" - "$moto_port" <<'PY'
import sys, boto3
client = boto3.client("secretsmanager", endpoint_url=f"http://127.0.0.1:{sys.argv[1]}",
                      region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
client.create_secret(Name="proxy-pool/clients", SecretString=open("events/clients/clients.json").read())
PY

# The function's configuration, the same in both modes.
function_env=(
  "PROXY_POOL_REDIS_URL=$redis_url" RUST_LOG=info
  PROXY_POOL_AUTH_SCHEMES=apiKey PROXY_POOL_CLIENTS_SECRET_ID=proxy-pool/clients
  PROXY_POOL_TRUST_ALB=true
  "AWS_ENDPOINT_URL=http://127.0.0.1:$moto_port" AWS_REGION=us-east-1
  AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test
)

invoke_port=$(free_port)
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$invoke_port") 2>/dev/null; }
echo "lambda-e2e: cargo lambda watch on 127.0.0.1:$invoke_port, redis on 127.0.0.1:$redis_port, secrets on 127.0.0.1:$moto_port"
if [ -z "$binary" ]; then
  watch_env=()
  for var in "${function_env[@]}"; do watch_env+=(--env-var "$var"); done
  setsid cargo lambda watch --bin proxy-pool-lambda --ignore-changes \
    --invoke-address 127.0.0.1 --invoke-port "$invoke_port" "${watch_env[@]}" \
    >"$function_log" 2>&1 </dev/null &
  watch_pid=$!
  wait_for "cargo lambda watch" 120 port_open
else
  setsid cargo lambda watch --only-lambda-apis \
    --invoke-address 127.0.0.1 --invoke-port "$invoke_port" \
    >"$work/watch.log" 2>&1 </dev/null &
  watch_pid=$!
  wait_for "cargo lambda watch --only-lambda-apis" 120 port_open
  # Started as Lambda starts a custom runtime: a clean environment with the
  # Runtime API's address, the function's settings and its configuration.
  setsid env -i PATH=/usr/bin:/bin LANG=C.UTF-8 TZ=:UTC \
    AWS_LAMBDA_RUNTIME_API="http://127.0.0.1:$invoke_port/.rt" \
    AWS_LAMBDA_FUNCTION_NAME="$function_name" AWS_LAMBDA_FUNCTION_VERSION=1 \
    AWS_LAMBDA_FUNCTION_MEMORY_SIZE=128 AWS_LAMBDA_LOG_FORMAT=JSON \
    AWS_LAMBDA_LOG_GROUP_NAME=/aws/lambda/proxy-pool-e2e AWS_LAMBDA_LOG_STREAM_NAME=e2e \
    _HANDLER=bootstrap "${function_env[@]}" "${run_function[@]}" \
    >"$function_log" 2>&1 </dev/null &
  function_pid=$!
fi

reset_pool() {
  redis-cli -p "$redis_port" flushall >/dev/null </dev/null
  "$cli" load-demo --redis-url "$redis_url" --size "$demo_size" >/dev/null </dev/null
}

# invoke FILE OUT: one invocation through the runtime API; stdout to OUT,
# stderr to OUT.err; returns cargo lambda's exit status.
invoke() {
  if [ -n "$function_pid" ] && ! kill -0 "$function_pid" 2>/dev/null; then
    : >"$2"
    echo "the function exited: $(tail -c 500 "$function_log")" >"$2.err"
    return 1
  fi
  timeout 120 cargo lambda invoke "$function_name" \
    --invoke-address 127.0.0.1 --invoke-port "$invoke_port" \
    --data-file "$1" --output-format json >"$2" 2>"$2.err" </dev/null
}

# check KIND OUT [FIRST]: prints why OUT does not meet the expectation.
check() {
  python3 - "$@" <<'PY'
import json, sys
kind, out = sys.argv[1], sys.argv[2]
doc = json.load(open(out))
def problem(msg):
    print(msg)
    sys.exit(1)
if kind == "summary":
    if doc.get("ready") is not True: problem(f"not ready: {doc}")
    if doc.get("eligibleTotal") != 300: problem(f"eligibleTotal {doc.get('eligibleTotal')}, want 300")
    if len(doc.get("inventory", [])) != 18: problem("want 18 inventory lines")
    sys.exit(0)
status = doc.get("statusCode")
want = 200 if kind == "replay" else int(kind)
if status != want: problem(f"status {status}, want {want}: {doc.get('body')}")
ctype = doc.get("headers", {}).get("content-type")
want_type = "application/problem+json" if want >= 400 else "application/json"
if ctype != want_type: problem(f"content-type {ctype}, want {want_type}")
body = json.loads(doc["body"])
if want == 200 and "proxies" in body and not body["proxies"]: problem("extracted nothing")
if kind == "replay" and len(sys.argv) > 3:
    first = json.load(open(sys.argv[3]))
    if doc["headers"].get("idempotent-replayed") != "true": problem("second answer is not a replay")
    if doc["body"] != first["body"]: problem("replayed body differs")
PY
}

# The expectation table: "file expect" lines from events/README.md.
table=$(python3 - <<'PY'
import re
for line in open("events/README.md"):
    m = re.match(r"\|\s*`([^`]+\.json)`\s*\|.*\|\s*([^|]+?)\s*\|\s*$", line)
    if m:
        print(m.group(1), m.group(2).replace(" + ", "+"))
PY
)
listed=$(echo "$table" | awk '{print $1}' | sort)
present=$(cd events && ls -1 -- *.json | sort)
if [ "$listed" = "$present" ]; then
  pass "events/README.md lists exactly the files in events/"
else
  fail "events/README.md" "table and folder differ: $(diff <(echo "$listed") <(echo "$present") | tr '\n' ' ')"
fi

mapfile -t rows <<<"$table"
for row in "${rows[@]}"; do
  read -r file expect <<<"$row"
  [ -n "${file:-}" ] || continue
  reset_pool
  out="$work/$file.out"
  if invoke "events/$file" "$out"; then rc=0; else rc=$?; fi
  case "$expect" in
    error)
      if [ "$rc" -ne 0 ] && grep -q UnrecognisedEvent "$out.err"; then
        pass "$file -> error (UnrecognisedEvent)"
      else
        fail "$file" "want an UnrecognisedEvent error, got exit $rc: $(head -c 300 "$out") $(head -c 300 "$out.err")"
      fi
      ;;
    *)
      kind=${expect%%+*}
      [ "$expect" = "200+replay" ] && kind=replay
      if [ "$rc" -ne 0 ]; then
        fail "$file" "invoke failed (exit $rc): $(head -c 300 "$out.err")"
      elif why=$(check "$kind" "$out"); then
        if [ "$kind" = replay ]; then
          if invoke "events/$file" "$out.2" && why=$(check replay "$out.2" "$out"); then
            pass "$file -> 200, then replayed"
          else
            fail "$file (retry)" "${why:-invoke failed: $(head -c 300 "$out.2.err")}"
          fi
        else
          pass "$file -> $expect"
        fi
      else
        fail "$file" "$why"
      fi
      ;;
  esac
done

# The health check wrote EMF lines, and the function logs JSON through tracing.
if grep -q '"Namespace":"ProxyPool"' "$function_log" && grep -q '"EligibleProxies":' "$function_log"; then
  pass "health check emitted CloudWatch EMF lines"
else
  fail "EMF" "no ProxyPool EMF line in the function's output"
fi
if grep -q '"message":"request"' "$function_log" && grep -q '"message":"unrecognised event' "$function_log"; then
  pass "JSON access log and unrecognised-event log lines"
else
  fail "logs" "missing JSON request / unrecognised-event log lines"
fi

# Real HTTP through the emulator's function URL endpoint.
reset_pool
url_check=$(python3 - "$invoke_port" "$function_name" <<'PY'
import json, sys, urllib.request, urllib.error
base = f"http://127.0.0.1:{sys.argv[1]}/lambda-url/{sys.argv[2]}"
def call(method, path, body=None, headers=None):
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
status, _, body = call("GET", "/health/ready")
if status != 200: print(f"GET /health/ready: {status} {body[:200]!r}"); sys.exit(1)
key = json.load(open("events/http-extract-partial.json"))["headers"]["x-api-key"]
status, headers, body = call("POST", "/api/v1/proxies/extract", b'{"count":2}', {"content-type": "application/json"})
if status != 401: print(f"POST extract without a key: {status}"); sys.exit(1)
status, headers, body = call("POST", "/api/v1/proxies/extract", b'{"count":2}', {"content-type": "application/json", "x-api-key": key})
if status != 200: print(f"POST extract: {status} {body[:200]!r}"); sys.exit(1)
if json.loads(body)["returned"] != 2: print("POST extract: returned != 2"); sys.exit(1)
status, headers, body = call("POST", "/api/v1/proxies/extract", b'{"count":2}', {"content-type": "text/plain", "x-api-key": key})
if status != 415: print(f"POST text/plain: {status}"); sys.exit(1)
PY
) && pass "function URL: ready 200, no key 401, extract 200 with 2 proxies, text/plain 415" \
  || fail "function URL" "$url_check"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
