#!/usr/bin/env python3
"""How to start a built Lambda binary on this machine.

A binary for this machine's own architecture runs as it is. An aarch64 one
(what `sam build` makes for the template's default `arm64`) on another host
runs under qemu's user-mode emulator, with the arm64 C library of Debian's
`libc6-arm64-cross` as its sysroot. Anything else, or a missing emulator or
sysroot, is an error that says what to install: callers must never go on
without running the binary.

As a module: `runner(binary)` returns the argv prefix plus the binary, and
`describe(binary)` says how it runs,
`announce(binary, tool)` prints that and returns the argv or None. As a script: prints that argv, one
argument per line (for scripts/lambda-e2e.sh), exit 1 with a reason on stderr.

Usage: python3 scripts/lambda_runner.py BINARY
"""

import os
import platform
import shutil
import sys

# ELF e_machine values (the ELF specification's EM_* constants).
MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}
ARM64_SYSROOT = "/usr/aarch64-linux-gnu"


class RunnerError(Exception):
    pass


def elf_machine(binary: str) -> str:
    """The architecture an ELF executable is built for (x86_64 or aarch64)."""
    try:
        with open(binary, "rb") as f:
            header = f.read(20)
    except OSError as e:
        raise RunnerError(f"{binary}: {e.strerror}") from e
    if len(header) < 20 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise RunnerError(f"{binary} is not a 64-bit little-endian ELF executable")
    machine = int.from_bytes(header[18:20], "little")
    if machine not in MACHINES:
        raise RunnerError(f"{binary}: unsupported ELF machine {machine:#x}")
    return MACHINES[machine]


def host_machine() -> str:
    m = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def runner(binary: str) -> list:
    if not os.access(binary, os.X_OK):
        raise RunnerError(f"{binary} is not an executable file")
    arch = elf_machine(binary)
    if arch == host_machine():
        return [binary]
    if arch != "aarch64":
        raise RunnerError(f"{binary} is {arch}; this host ({host_machine()}) runs only its own or aarch64 binaries")
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        raise RunnerError("qemu-aarch64 is missing: apt-get install qemu-user (scripts/deps.sh test does)")
    if not os.path.exists(os.path.join(ARM64_SYSROOT, "lib", "ld-linux-aarch64.so.1")):
        raise RunnerError(f"the arm64 C library is missing ({ARM64_SYSROOT}): "
                          "apt-get install libc6-arm64-cross (scripts/deps.sh test does)")
    return [qemu, "-L", ARM64_SYSROOT, binary]


def describe(binary: str) -> str:
    argv = runner(binary)
    if len(argv) == 1:
        return f"{elf_machine(binary)}, native"
    return f"aarch64, under {os.path.basename(argv[0])} (user-mode emulation)"


def announce(binary: str, tool: str):
    """The argv that runs `binary`, after printing how it runs; None, with
    the reason on stderr under `tool`'s name, when it cannot run here."""
    try:
        argv = runner(binary)
    except RunnerError as e:
        print(f"{tool}: {e}", file=sys.stderr)
        return None
    print(f"{binary}: {describe(binary)}")
    return argv


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    try:
        argv = runner(sys.argv[1])
    except RunnerError as e:
        print(f"lambda_runner: {e}", file=sys.stderr)
        return 1
    print("\n".join(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
