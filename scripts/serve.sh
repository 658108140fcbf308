#!/usr/bin/env bash
# One command to run the Distribution API locally: installs redis-server if
# missing, then serves on 127.0.0.1:8081 with a private Redis and a demo pool.
# Extra arguments go to `proxy-pool serve` (e.g. --listen, --redis-url).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
exec cargo run --release --quiet --bin proxy-pool -- serve "$@"
