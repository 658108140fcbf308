#!/usr/bin/env bash
# The deployed artifact, proven: builds template.yaml as a user's
# `sam build` does and runs the very `bootstrap` that `sam deploy` would
# upload against every event.
#
#   1. `sam validate --lint` (the SAM CLI's own cfn-lint pass);
#   2. `sam build --beta-features` of template.yaml as it is: arm64 (the
#      Architecture parameter's default), provided.al2023, cargo-lambda
#      (Zig as the cross linker), release profile;
#   3. the artifact's architecture, size and zipped size;
#   4. scripts/lambda-e2e.sh with that artifact: under qemu-user against
#      cargo-lambda's Runtime API emulator, a real redis-server and moto's
#      Secrets Manager, every file of events/ checked against
#      events/README.md, ending with "N passed, M failed".
#
# Needs `bash scripts/deps.sh test` (aws-sam-cli in .venv-sam/, cargo-lambda
# in .venv/, the aarch64 Rust target, qemu-user, libc6-arm64-cross); a
# missing tool stops it with an error, never a skip. The build is bounded by
# SAM_BUILD_TIMEOUT seconds (default 2400), the run by LAMBDA_E2E_TIMEOUT.
# SAM_BUILD_ARGS adds arguments to `sam build`, e.g.
# "--parameter-overrides Architecture=x86_64" (the artifact then runs natively).
set -euo pipefail
cd "$(dirname "$0")/.."

sam=.venv-sam/bin/sam
export PATH="$PWD/.venv/bin:$PATH"
export SAM_CLI_TELEMETRY=0
function_id=DistributionFunction
artifact=".aws-sam/build/$function_id/bootstrap"

[ -x "$sam" ] || { echo "sam-e2e: $sam is missing (run scripts/deps.sh test)" >&2; exit 1; }
for tool in cargo cargo-lambda python3; do
  command -v "$tool" >/dev/null || { echo "sam-e2e: $tool is missing (run scripts/deps.sh test)" >&2; exit 1; }
done

echo "sam-e2e: $("$sam" --version), $(cargo lambda --version)"
"$sam" validate --lint

# A stale artifact must not stand in for this build.
rm -rf .aws-sam/build
start=$(date +%s)
# shellcheck disable=SC2086 # SAM_BUILD_ARGS is a list of words on purpose
timeout "${SAM_BUILD_TIMEOUT:-2400}" "$sam" build --beta-features ${SAM_BUILD_ARGS:-}
echo "sam-e2e: sam build took $(($(date +%s) - start)) s"
[ -f "$artifact" ] || { echo "sam-e2e: sam build made no $artifact" >&2; exit 1; }

# What sam deploy would upload: the build directory, deflated (as sam
# package zips it).
python3 - "$artifact" <<'PY'
import io, os, sys, zipfile
sys.path.insert(0, "scripts")
from lambda_runner import elf_machine
path = sys.argv[1]
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
    z.write(path, "bootstrap")
size, zipped = os.path.getsize(path), len(buf.getvalue())
print(f"sam-e2e: {path}: {elf_machine(path)}, {size:,} bytes ({size / 2**20:.1f} MiB), "
      f"{zipped:,} bytes zipped ({zipped / 2**20:.1f} MiB)")
PY

exec bash scripts/lambda-e2e.sh "$artifact"
