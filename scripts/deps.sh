#!/usr/bin/env bash
# Installs what running or testing needs on a fresh Debian/Ubuntu machine
# that has only the Rust toolchain. Idempotent: skips what is already there.
#   bash scripts/deps.sh          redis-server (enough for `serve`)
#   bash scripts/deps.sh test     also the Python tools the tests use, into .venv/
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "need root to run: $*" >&2; return 1; fi
}

apt_updated=
apt_install() {
  if ! command -v apt-get >/dev/null; then
    echo "missing $* and apt-get is not available: install them and retry" >&2
    exit 1
  fi
  echo "installing $* (apt-get)" >&2
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

if ! command -v redis-server >/dev/null; then
  apt_install redis-server
  # Debian starts a system service on install; the project starts its own.
  as_root service redis-server stop >/dev/null 2>&1 || true
fi

[ "${1:-}" = test ] || exit 0

# Python tools for the tests, in a project-local virtualenv.
tools=('moto[server]')
if [ ! -x .venv/bin/moto_server ]; then
  python3 -m venv --help >/dev/null 2>&1 || apt_install python3 python3-venv python3-pip
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "${tools[@]}"
fi
