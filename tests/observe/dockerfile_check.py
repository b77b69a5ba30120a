#!/usr/bin/env python3
"""The Dockerfile, parsed with PyPI `dockerfile` (Docker's own parser, buildkit's Go code), and the
binary its build stage produces.

No Docker engine runs here, so instead of `docker build`:
- the Dockerfile's properties are checked on the parse tree (multi-stage, `cargo build --release
  --locked` through scripts/build-static.sh, distroless/scratch runtime, non-root USER, OCI
  labels, only the binary and scripts/image-rootfs.sh's files copied in, exec-form ENTRYPOINT);
- with --build, scripts/build-static.sh (the very command of the RUN line) builds the binary;
- the binary must be static (`file`, `ldd`) and must work in a root with nothing but the image's
  files (scripts/image-rootfs.sh) and what Kubernetes mounts, as the non-root user: it prints the
  CRD, and as the kubectl plugin it resolves `localhost` and reads an Http3Listener from a fake
  API server (needs root for chroot).
tests/observe/image_check.py checks the image scripts/image.sh assembles against the runtime stage.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import dockerfile

ROOT = Path(__file__).resolve().parents[2]
NONROOT = 65532
OCI_LABELS = {"org.opencontainers.image.title", "org.opencontainers.image.description",
              "org.opencontainers.image.version", "org.opencontainers.image.revision",
              "org.opencontainers.image.licenses"}
failures: list[str] = []
skipped: list[str] = []


def check(cond: bool, what: str) -> None:
    if not cond:
        failures.append(what)


def stages(cmds):
    out = []
    for c in cmds:
        if c.cmd == "FROM":
            out.append({"from": c.value[0], "name": c.value[2] if len(c.value) > 2 else None, "cmds": []})
        elif out:
            out[-1]["cmds"].append(c)
    return out


def parse_checks() -> None:
    cmds = dockerfile.parse_file(str(ROOT / "Dockerfile"))
    st = stages(cmds)
    print(f"Dockerfile: {len(cmds)} instructions, {len(st)} stages: "
          + ", ".join(f"{s['name'] or '(final)'} FROM {s['from']}" for s in st))
    check(len(st) >= 2, "not a multi-stage build")
    build, final = st[0], st[-1]
    runs = [c for c in build["cmds"] if c.cmd == "RUN"]
    check(any("scripts/build-static.sh" in " ".join(c.value) for c in runs),
          "the build stage does not run scripts/build-static.sh")
    script = (ROOT / "scripts/build-static.sh").read_text()
    check(re.search(r"^cargo build --release --locked\b", script, re.M) is not None,
          "scripts/build-static.sh does not run `cargo build --release --locked`")
    check("+crt-static" in script, "scripts/build-static.sh does not link statically")
    base = final["from"]
    check(base == "scratch" or base.startswith("gcr.io/distroless/static"), f"runtime base {base} is not distroless/static or scratch")
    check(not any(c.cmd == "RUN" for c in final["cmds"]), "the runtime stage runs commands (it has no shell)")
    users = [c for c in final["cmds"] if c.cmd == "USER"]
    check(bool(users), "the runtime stage sets no USER")
    if users:
        user = users[-1].value[0].split(":")[0]
        check(user not in ("0", "root") and (not user.isdigit() or int(user) != 0), f"USER {user} is root")
        check(user == str(NONROOT) or user == "nonroot", f"USER {user} is not distroless's nonroot ({NONROOT})")
    copies = [c for c in final["cmds"] if c.cmd in ("COPY", "ADD")]
    check(all(c.cmd == "COPY" for c in copies), "the runtime stage uses ADD")
    sources = [v for c in copies for v in c.value[:-1]]
    check(sources == ["/out/rootfs/", "/out/h3-ingress"] and all("--from=build" in c.flags for c in copies),
          f"the runtime stage copies more than scripts/image-rootfs.sh's files and the binary: {sources}")
    check(any("scripts/image-rootfs.sh /out/rootfs" in " ".join(c.value) for c in runs),
          "the build stage does not run scripts/image-rootfs.sh /out/rootfs")
    entry = [c for c in final["cmds"] if c.cmd == "ENTRYPOINT"]
    check(bool(entry) and entry[-1].json and entry[-1].value == ("/h3-ingress",),
          "ENTRYPOINT is not exec-form [\"/h3-ingress\"]")
    labels = {}
    for c in final["cmds"]:
        if c.cmd == "LABEL":
            vals = list(c.value)
            labels.update({vals[i]: vals[i + 1].strip('"') for i in range(0, len(vals) - 1, 2)})
    missing = OCI_LABELS - set(labels)
    check(not missing, f"OCI labels missing: {sorted(missing)}")
    print(f"  runtime stage: base {base}, USER {users[-1].value[0] if users else None}, copies {sources}, "
          f"{len(labels)} OCI labels")
    ignore = (ROOT / ".dockerignore").read_text().split()
    check("target/" in ignore and ".git/" in ignore, ".dockerignore does not keep target/ and .git/ out")


class _FakeApi(http.server.BaseHTTPRequestHandler):
    listener: dict = {}

    def do_GET(self):  # noqa: N802 (http.server's naming)
        if self.path.split("?")[0] == "/apis/h3-ingress.dev/v1alpha1/http3listeners":
            body = json.dumps({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3ListenerList",
                               "metadata": {}, "items": [self.listener]}).encode()
            self.send_response(200)
        else:
            body = b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","code":404}'
            self.send_response(404)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def binary_checks(binary: Path) -> None:
    f = subprocess.run(["file", "-b", str(binary)], capture_output=True, text=True).stdout.strip()
    print(f"  file: {f}")
    check("statically linked" in f or "static-pie linked" in f, "the binary is not statically linked")
    ldd = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    ldd_out = (ldd.stdout + ldd.stderr).strip()
    print(f"  ldd: {ldd_out}")
    check("not a dynamic executable" in ldd_out or "statically linked" in ldd_out, "ldd lists shared libraries")
    print(f"  size: {binary.stat().st_size / 1e6:.1f} MB")

    if os.geteuid() != 0:
        msg = "SKIPPED: needs root (chroot into an empty root as the non-root user)"
        print("  " + "!" * 20 + " " + msg)
        skipped.append(msg)
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        # The image's files (passwd, group, nsswitch.conf, CA bundle: the kube client's TLS setup
        # refuses to start without system roots, even for an http:// API server), plus the
        # /etc/hosts Kubernetes mounts into containers.
        subprocess.run([str(ROOT / "scripts/image-rootfs.sh"), str(root)], check=True)
        shutil.copy(binary, root / "h3-ingress")
        os.symlink("h3-ingress", root / "kubectl-h3_ingress")
        (root / "etc/hosts").write_text("127.0.0.1 localhost\n::1 localhost\n")
        os.chmod(root, 0o755)
        userspec = f"--userspec={NONROOT}:{NONROOT}"
        p = subprocess.run(["chroot", userspec, str(root), "/h3-ingress", "crd"], capture_output=True, text=True)
        want = (ROOT / "crds/http3listeners.h3-ingress.dev.yaml").read_text()
        check(p.returncode == 0 and p.stdout == want, f"/h3-ingress crd in an empty root failed: {p.stderr}")
        print(f"  chroot (empty root, uid {NONROOT}) /h3-ingress crd: exit {p.returncode}, "
              f"{'identical to' if p.stdout == want else 'DIFFERENT from'} crds/")

        _FakeApi.listener = json.loads(json.dumps({
            "apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
            "metadata": {"name": "static-check"},
            "spec": {"port": 443, "upstream": {"address": "127.0.0.1:443"}},
            "status": {"hosts": [{"name": "a.example", "state": "Serving", "reason": "Serving"}]},
        }))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            (root / "kubeconfig").write_text(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: c\n  cluster:\n"
                f"    server: http://localhost:{server.server_address[1]}\ncontexts:\n- name: c\n  context:\n"
                "    cluster: c\n    user: u\nusers:\n- name: u\n  user: {}\n")
            p = subprocess.run(["chroot", userspec, str(root), "/kubectl-h3_ingress", "status",
                                "--kubeconfig", "/kubeconfig"], capture_output=True, text=True, timeout=60)
        finally:
            server.shutdown()
        ok = p.returncode == 0 and "Listener static-check" in p.stdout and "a.example" in p.stdout
        check(ok, f"kubectl-h3_ingress status in an empty root failed: {p.stdout} {p.stderr}")
        print(f"  chroot /kubectl-h3_ingress status (API at http://localhost): exit {p.returncode}, "
              f"{'listed' if ok else 'did NOT list'} the listener")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="store_true", help="run scripts/build-static.sh first")
    ap.add_argument("--binary", type=Path, default=ROOT / "target/static/h3-ingress")
    args = ap.parse_args()
    parse_checks()
    if args.build:
        cmd = [str(ROOT / "scripts/build-static.sh"), str(args.binary)]
        print("$ " + " ".join(cmd))
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        print("  " + (p.stdout + p.stderr).strip().splitlines()[-1])
        check(p.returncode == 0, "scripts/build-static.sh failed:\n" + p.stderr[-3000:])
    if args.binary.exists():
        binary_checks(args.binary)
    else:
        failures.append(f"{args.binary} does not exist (run with --build)")
    for s in skipped:
        print(s)
    if failures:
        print("FAIL dockerfile_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: dockerfile_check" + (" (with skips)" if skipped else ""))
    return 0 if not skipped else 3


if __name__ == "__main__":
    sys.exit(main())
