#!/usr/bin/env bash
# Installs what running or testing needs on a fresh Debian/Ubuntu machine
# that has only the Rust toolchain. Idempotent: skips what is already there.
set -euo pipefail

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

if ! command -v redis-server >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "installing redis-server (apt-get)" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
    # Debian starts a system service on install; the project starts its own.
    as_root service redis-server stop >/dev/null 2>&1 || true
  else
    echo "redis-server is missing and apt-get is not available: install Redis 7 and retry" >&2
    exit 1
  fi
fi
