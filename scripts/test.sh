#!/usr/bin/env bash
# One command to check everything: installs what the tests need, then
# formatting, lints and the whole test suite (real redis-server processes and
# a local Secrets Manager emulator, started by the tests on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
export PATH="$PWD/.venv/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked
