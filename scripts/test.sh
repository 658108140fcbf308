#!/usr/bin/env bash
# One command to check everything: installs what the tests need, then
# formatting, lints, the whole test suite (real redis-server processes and a
# local Secrets Manager emulator, started by the tests on free loopback
# ports; Redis faults under load, fuzzing, Redis Cluster, TLS and replicas
# included), cfn-lint of the SAM template, the Lambda end-to-end test under
# cargo-lambda's runtime API emulator, the same test run on the arm64
# `bootstrap` that `sam build` makes (under qemu-user, after
# `sam validate --lint`) and the schemathesis contract test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
export PATH="$PWD/.venv/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked
cfn-lint template.yaml
echo "cfn-lint: template.yaml clean"
bash scripts/lambda-e2e.sh
bash scripts/sam-e2e.sh
bash scripts/contract.sh
