#!/usr/bin/env bash
# Contract test: schemathesis generates requests (valid and invalid) from
# api/openapi/proxy-pool.yaml and sends them to `proxy-pool serve` (its
# private redis-server and demo pool, the printed demo API key), checking
# that no answer is a server error and that every status code, content type
# and response body conforms to the contract (plus documented headers,
# refusal of schema-invalid requests and of unlisted methods, and that
# authentication is enforced). Bounded: a fixed number of examples per
# operation and a wall-clock limit.
# `positive_data_acceptance` is left out on purpose: the contract answers
# some schema-valid requests 422 (an empty filter value) or 400 (an
# Idempotency-Key that is not visible ASCII), as its business rules say.
#   bash scripts/contract.sh        (needs `bash scripts/deps.sh test` first)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
command -v schemathesis >/dev/null || {
  echo "contract: schemathesis is missing; run bash scripts/deps.sh test" >&2
  exit 1
}
max_examples="${CONTRACT_MAX_EXAMPLES:-500}"
wall_clock="${CONTRACT_TIMEOUT_SECONDS:-420}"

cargo build --locked --quiet --bin proxy-pool
bin="${CARGO_TARGET_DIR:-target}/debug/proxy-pool"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
work=$(mktemp -d)
out="$work/serve.out"

# No per-client rate limit, so the run exercises extraction rather than 429s
# (429 is part of the contract and tested elsewhere); a large demo pool.
PROXY_POOL_CLIENT_RATE=off RUST_LOG=warn \
  "$bin" serve --listen "127.0.0.1:$port" --demo-size 3000 >"$out" 2>"$work/serve.err" &
serve_pid=$!
cleanup() {
  kill "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# serve prints its URL, then a curl line with the demo key (bounded wait).
for _ in $(seq 1 200); do
  grep -q "X-API-Key" "$out" 2>/dev/null && break
  kill -0 "$serve_pid" 2>/dev/null || { cat "$work/serve.err" >&2; exit 1; }
  sleep 0.1
done
key=$(grep -o "X-API-Key: pp_[0-9a-f]*" "$out" | head -1 | cut -d' ' -f2)
[ -n "$key" ] || { echo "contract: serve printed no demo key" >&2; exit 1; }

set +e
timeout "$wall_clock" schemathesis run api/openapi/proxy-pool.yaml \
  --url "http://127.0.0.1:$port" \
  --header "X-API-Key: $key" \
  --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance,negative_data_rejection,unsupported_method,ignored_auth \
  --phases examples,coverage,fuzzing \
  --max-examples "$max_examples" \
  --request-timeout 10 \
  --generation-database none \
  --workers 2 \
  --no-color | tee "$work/schemathesis.out"
status=${PIPESTATUS[0]}
set -e
if [ "$status" = 124 ]; then
  echo "contract: schemathesis did not finish within ${wall_clock}s" >&2
fi
# The tally as one closing line: "contract: N passed, M failed".
summary=$(grep -E '^ *[0-9]+ generated' "$work/schemathesis.out" | tail -1 || true)
passed=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
failed=$(grep -oE '[0-9]+ unique failures?' <<<"$summary" | grep -oE '^[0-9]+' || echo 0)
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then failed=1; fi
echo "contract: $passed passed, $failed failed"
exit "$status"
