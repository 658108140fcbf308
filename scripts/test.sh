#!/usr/bin/env bash
# The tests, in two tiers (docs/testing.md says which to run when):
#
#   bash scripts/test.sh         the full run, what CI runs (.ci/run): installs
#                                what the tests need, then formatting, lints,
#                                the whole test suite (real redis-server
#                                processes, PostgreSQL servers and a local
#                                Secrets Manager emulator, started by the tests
#                                on free loopback ports; Redis faults under
#                                load, fuzzing, Redis Cluster, TLS and replicas
#                                included), cfn-lint of the SAM template, the
#                                Lambda end-to-end test under cargo-lambda's
#                                runtime API emulator, the same test run on the
#                                arm64 `bootstrap` that `sam build` makes (under
#                                qemu-user, after `sam validate --lint`) and the
#                                schemathesis contract test.
#   bash scripts/test.sh quick   the inner loop: formatting, lints, the unit
#                                tests and the core integration tests
#                                (extraction and its Redis faults, HTTP,
#                                admission, pool contract, its Python client,
#                                model, shapes at a small N,
#                                docs, the contract's codes, the key layout,
#                                architecture) against a private
#                                redis-server. No end-to-end run, no cluster,
#                                no PostgreSQL, no SAM build.
#
# Both print each stage's wall time at the end, also when a stage fails.
set -euo pipefail
cd "$(dirname "$0")/.."

tier="${1:-full}"
case "$tier" in
  full | quick) ;;
  *) echo "usage: bash scripts/test.sh [quick]" >&2; exit 2 ;;
esac

stages=()
started_all=$SECONDS
report() {
  local status=$?
  echo
  echo "scripts/test.sh $tier: wall time per stage"
  local line
  for line in "${stages[@]}"; do echo "  $line"; done
  printf '  %-44s %4d s%s\n' total $((SECONDS - started_all)) \
    "$([ "$status" = 0 ] || echo "  (failed)")"
}
trap report EXIT

# stage NAME COMMAND...: runs the command, recording its wall time.
stage() {
  local name=$1 t0=$SECONDS
  shift
  echo "== $name" >&2
  if "$@"; then
    stages+=("$(printf '%-44s %4d s' "$name" $((SECONDS - t0)))")
  else
    local rc=$?
    stages+=("$(printf '%-44s %4d s  FAILED' "$name" $((SECONDS - t0)))")
    return "$rc"
  fi
}

if [ "$tier" = quick ]; then
  stage "deps (redis-server, redis-py)" bash scripts/deps.sh quick
  stage "cargo fmt --check" cargo fmt --all -- --check
  stage "cargo clippy" cargo clippy --all-targets --locked -- -D warnings
  stage "unit tests (lib, bins)" cargo test --locked --lib --bins
  # The core surfaces, at the sizes the full run uses (the model's default
  # case counts; MODEL_CASES and PROXY_POOL_SHAPES_POOL set by the caller win).
  stage "core integration tests" cargo test --locked \
    --test architecture --test docs --test openapi --test key_layout --test extract \
    --test extract_faults --test http_api --test admission --test contract \
    --test contract_python --test model --test shapes
  exit 0
fi

stage "deps (scripts/deps.sh test)" bash scripts/deps.sh test
export PATH="$PWD/.venv/bin:$PATH"
stage "cargo fmt --check" cargo fmt --all -- --check
stage "cargo clippy" cargo clippy --all-targets --locked -- -D warnings
stage "cargo test --all-targets" cargo test --all-targets --locked
stage "cfn-lint template.yaml" cfn-lint template.yaml
echo "cfn-lint: template.yaml clean"
stage "scripts/lambda-e2e.sh" bash scripts/lambda-e2e.sh
stage "scripts/sam-e2e.sh" bash scripts/sam-e2e.sh
stage "scripts/contract.sh" bash scripts/contract.sh
