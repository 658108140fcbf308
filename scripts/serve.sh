#!/usr/bin/env bash
# One command to run the Distribution API locally: installs redis-server if
# missing, builds the release binary, then serves on 127.0.0.1:8081 with a
# private Redis and a demo pool.
# Extra arguments go to `proxy-pool serve` (e.g. --listen, --redis-url).
# Each stage is announced on stderr with the seconds since the start, and
# cargo shows its own progress, so a first run (4-8 minutes on 2 cores,
# almost all of it the release build) is never silent for long.
set -euo pipefail
cd "$(dirname "$0")/.."

started=$SECONDS
stage() { printf 'serve.sh [%4d s] %s\n' $((SECONDS - started)) "$*" >&2; }

target="${CARGO_TARGET_DIR:-target}"
bin="$target/release/proxy-pool"
if [ -x "$bin" ]; then
  stage "a rebuild takes seconds unless the sources changed"
else
  stage "first run: installing redis-server if missing and a release build, roughly 4-8 minutes on 2 cores"
fi

if command -v redis-server >/dev/null; then
  stage "redis-server: $(command -v redis-server)"
else
  stage "installing redis-server (apt-get, about a minute)…"
fi
bash scripts/deps.sh

if [ -x "$bin" ]; then
  stage "building (cargo build --release)…"
else
  stage "building (a first build takes 4-8 min on 2 cores; cargo's progress follows)…"
fi
cargo build --release --bin proxy-pool

stage "starting proxy-pool serve (a private redis-server and a demo pool)…"
exec "$bin" serve "$@"
