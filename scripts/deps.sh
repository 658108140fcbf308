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

if ! command -v redis-cli >/dev/null; then
  echo "installing redis-tools (apt-get)" >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-tools >/dev/null
fi

# Python tools for the Lambda packaging checks: cfn-lint (template.yaml) and
# cargo-lambda (the Lambda runtime API emulator of scripts/lambda-e2e.sh).
# Ones already on PATH are used as they are; missing ones go into a private
# virtualenv (Debian's python3 refuses system-wide pip installs), whose bin/
# scripts/test.sh puts on PATH. Versions are the ones the checks were written with.
tools_dir=${PROXY_POOL_TOOLS_DIR:-$HOME/.cache/proxy-pool/tools}
missing=()
command -v cfn-lint >/dev/null || [ -x "$tools_dir/bin/cfn-lint" ] || missing+=("cfn-lint==1.51.0")
command -v cargo-lambda >/dev/null || [ -x "$tools_dir/bin/cargo-lambda" ] || missing+=("cargo-lambda==1.9.2")
if [ "${#missing[@]}" -gt 0 ]; then
  if ! command -v python3 >/dev/null; then
    echo "python3 is missing: install python3 (with pip/venv) and retry" >&2
    exit 1
  fi
  if [ ! -x "$tools_dir/bin/pip" ]; then
    if ! python3 -m venv "$tools_dir" >/dev/null 2>&1; then
      # Debian ships venv's pip bootstrap separately.
      echo "installing python3-venv (apt-get)" >&2
      as_root apt-get update -qq
      DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3-venv >/dev/null
      rm -rf "$tools_dir"
      python3 -m venv "$tools_dir"
    fi
  fi
  echo "installing ${missing[*]} into $tools_dir (pip)" >&2
  "$tools_dir/bin/pip" install --quiet --disable-pip-version-check "${missing[@]}"
fi
