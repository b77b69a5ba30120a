#!/usr/bin/env python3
"""The arm64 image binary (aarch64, cross-compiled by scripts/build-static.sh --arch arm64) runs:
under Debian's qemu-user-static, on this amd64 machine, it must

- be a static AArch64 executable (`file`);
- print the same `--version` as this machine's static binary (one build, one commit);
- answer `validate --config` of the README's "Standalone use" file (its certificates made here
  with openssl) exactly as the native binary does: exit 0 and the same summary line;
- refuse a broken copy of it (the upstream address without a port) exactly as the native
  binary does: exit 2 and the error naming `upstream.address`.

A missing qemu-aarch64-static is a failure, not a skip (scripts/setup.sh installs it).

    tests/observe/arch_check.py [--build] [--binary B] [--reference R]

--build runs scripts/build-static.sh --arch arm64 first and prints how long it took.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QEMU = "qemu-aarch64-static"
failures: list[str] = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)


def readme_config() -> str:
    """The YAML block under README's "A minimal file" (Standalone use)."""
    text = (ROOT / "README.md").read_text()
    m = re.search(r"A minimal file[^\n]*\n+```yaml\n(.*?)```", text, re.S)
    if not m:
        raise SystemExit("FAIL arch_check: README.md has no ```yaml block after \"A minimal file\"")
    return m.group(1)


def certificates(config: str, d: Path) -> None:
    """A self-signed ECDSA certificate for each `{name, certFile, keyFile}` host of the file."""
    hosts = re.findall(r"name: \"?([^\",}]+)\"?, certFile: ([^,}]+), keyFile: ([^,}\s]+)", config)
    check(len(hosts) >= 1, f"no hosts found in the README's file: {config}")
    for name, cert, key in hosts:
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-days", "2", "-subj", f"/CN={name}", "-addext", f"subjectAltName=DNS:{name}",
                        "-keyout", str(d / key.strip()), "-out", str(d / cert.strip())],
                       check=True, capture_output=True)


def run(cmd: list[str], cwd: Path) -> tuple[int, str, str]:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout.strip(), p.stderr.strip()


def build(binary: Path) -> None:
    cmd = [str(ROOT / "scripts/build-static.sh"), "--arch", "arm64", str(binary)]
    print("$ " + " ".join(cmd))
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    took = time.monotonic() - t0
    last = (p.stdout.strip() or p.stderr.strip()).splitlines()[-1:] or [""]
    print(f"  {last[0]} in {took:.0f} s")
    check(p.returncode == 0, "scripts/build-static.sh --arch arm64 failed:\n" + p.stderr[-3000:])


def compare(label: str, native: tuple[int, str, str], emulated: tuple[int, str, str]) -> None:
    print(f"  {label}: native exit {native[0]}, arm64 under qemu exit {emulated[0]}: "
          f"{(emulated[1] or emulated[2]).splitlines()[:1]}")
    check(native == emulated, f"{label}: native {native}, arm64 under qemu {emulated}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="store_true", help="run scripts/build-static.sh --arch arm64 first")
    ap.add_argument("--binary", type=Path, default=ROOT / "target/static/arm64/h3-ingress")
    ap.add_argument("--reference", type=Path, default=ROOT / "target/static/h3-ingress",
                    help="this machine's static binary of the same build")
    a = ap.parse_args()
    qemu = shutil.which(QEMU)
    if not qemu:
        print(f"FAIL arch_check: no {QEMU} (Debian's qemu-user-static; scripts/setup.sh installs it)")
        return 1
    if a.build:
        build(a.binary)
    for b in (a.binary, a.reference):
        if not b.exists():
            print(f"FAIL arch_check: {b} does not exist (scripts/build-static.sh [--arch arm64] builds it)")
            return 1
    kind = subprocess.run(["file", "-b", str(a.binary)], capture_output=True, text=True).stdout.strip()
    print(f"  file: {kind}")
    check("ARM aarch64" in kind and ("statically linked" in kind or "static-pie linked" in kind),
          f"{a.binary} is not a static AArch64 executable: {kind}")
    native, arm = [str(a.reference.resolve())], [qemu, str(a.binary.resolve())]
    with tempfile.TemporaryDirectory(prefix="h3i-arch-check.") as tmp:
        d = Path(tmp)
        compare("--version", run(native + ["--version"], d), run(arm + ["--version"], d))
        config = readme_config()
        certificates(config, d)
        (d / "h3-ingress.yaml").write_text(config)
        ok = run(arm + ["validate", "--config", "h3-ingress.yaml"], d)
        check(ok[0] == 0 and ok[1].startswith("ok: "), f"validate of the README's file under qemu: {ok}")
        compare("validate --config (README's file)", run(native + ["validate", "--config", "h3-ingress.yaml"], d), ok)
        broken = re.sub(r"address: (\S+):443", r"address: \1", config, count=1)
        check(broken != config, "the README's file has no upstream address with port 443 to break")
        (d / "broken.yaml").write_text(broken)
        bad = run(arm + ["validate", "--config", "broken.yaml"], d)
        check(bad[0] == 2 and "upstream.address" in bad[2], f"validate of a broken file under qemu: {bad}")
        compare("validate --config (no upstream port)", run(native + ["validate", "--config", "broken.yaml"], d), bad)
    if failures:
        print("FAIL arch_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: arch_check (the arm64 binary under qemu answers as the native one)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
