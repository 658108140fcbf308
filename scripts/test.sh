#!/usr/bin/env bash
# One command to check everything: installs what the tests need, then
# formatting, lints and the whole test suite (real redis-server processes,
# started by the tests themselves on random loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --all-targets --locked
