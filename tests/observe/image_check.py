#!/usr/bin/env python3
"""The Dockerfile's runtime stage and the image scripts/image.sh assembles, held in step.

The Dockerfile is parsed with PyPI `dockerfile` (buildkit's parser) and its final stage turned
into the image config and layers `docker build` would produce: FROM scratch's defaults (PATH,
WorkingDir /), one layer per COPY with the files of the build-stage path it names, and USER,
ENTRYPOINT, CMD, LABEL (ARGs expanded), ENV, EXPOSE, VOLUME, WORKDIR. The build stage's outputs
are made by the scripts its RUN line names (scripts/build-static.sh -> the binary under test,
scripts/image-rootfs.sh -> run here). The image is read straight from the OCI layout (digests
and sizes checked, layers unpacked), not through scripts/image/oci.py, and every difference is
reported with the instruction and line it comes from. The image is assembled twice: both
image indexes must have the same digest.

The image is an image index with one manifest per binary (one per architecture of
scripts/image.sh's ARCHITECTURES by default): each manifest's platform in the index, its
config's os/architecture and the ELF machine of the binary its layer holds must agree, and
each is checked against the runtime stage with that binary (`--version` of a binary of another
architecture than this machine's runs under Debian's qemu-user-static).

    tests/observe/image_check.py [--binary B ...] [--dockerfile F] [--layout DIR]

Exit 0 when they agree, 1 with one line per difference.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import posixpath
import re
import stat
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile

ROOT = Path(__file__).resolve().parents[2]
MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
# ELF e_machine -> (OCI architecture, `uname -m`, qemu-user binary for it).
ELF = {62: ("amd64", "x86_64", "qemu-x86_64-static"), 183: ("arm64", "aarch64", "qemu-aarch64-static")}
SCRATCH_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
# One file of a layer: (type, mode, uid, gid, sha256 of the content or the link target).
Entry = tuple[str, int, int, int, str]
failures: list[str] = []


def fail(msg: str) -> None:
    failures.append(msg)


def where(c) -> str:
    text = " ".join(c.original.split())
    return f"{text if len(text) <= 60 else text[:57] + '...'} (Dockerfile line {c.start_line})"


@dataclass
class Expected:
    config: dict = field(default_factory=dict)
    origin: dict = field(default_factory=dict)   # config key -> instruction that set it
    layers: list[tuple[str, dict[str, Entry]]] = field(default_factory=list)


def unquote(v: str) -> str:
    if len(v) >= 2 and v[0] == v[-1] == '"':
        return v[1:-1].replace('\\"', '"')
    return v


def expand(v: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), v)


def tree_entries(src: Path, dest: str, uid: int, gid: int, chmod: int | None) -> dict[str, Entry]:
    """What COPY SRC DEST writes: a directory's contents (not the directory), or one file."""
    def entry(p: Path) -> Entry:
        st = p.lstat()
        mode = chmod if chmod is not None else stat.S_IMODE(st.st_mode)
        if stat.S_ISDIR(st.st_mode):
            return ("dir", mode, uid, gid, "")
        if stat.S_ISLNK(st.st_mode):
            return ("symlink", 0o777, uid, gid, str(p.readlink()))
        return ("file", mode, uid, gid, hashlib.sha256(p.read_bytes()).hexdigest())
    if src.is_dir():
        base = dest.strip("/")
        return {posixpath.join(base, p.relative_to(src).as_posix()) if base else p.relative_to(src).as_posix(): entry(p)
                for p in src.rglob("*")}
    name = posixpath.join(dest, src.name) if dest.endswith("/") else dest
    return {name.strip("/"): entry(src)}


def build_outputs(build_stage: list, binary: Path, tmp: Path) -> dict[str, Path]:
    """Build-stage path -> file on disk, from `scripts/X.sh /out/PATH` in the build stage's RUN."""
    outs: dict[str, Path] = {}
    for c in build_stage:
        if c.cmd != "RUN":
            continue
        # `scripts/X.sh [--option ...] /out/PATH`; options start with - or are ${...} expansions.
        for script, path in re.findall(r"(scripts/[\w.-]+\.sh)(?:\s+[-$][^\s;&|)]*)*\s+(/[^\s;&|]+)",
                                       " ".join(c.value)):
            if script == "scripts/build-static.sh":
                outs[path] = binary
            else:
                made = tmp / ("out" + path)
                made.parent.mkdir(parents=True, exist_ok=True)
                p = subprocess.run([str(ROOT / script), str(made)], cwd=ROOT, capture_output=True, text=True)
                if p.returncode != 0:
                    fail(f"{where(c)}: {script} {path} failed: {p.stderr.strip()}")
                outs[path] = made
    return outs


def copy_layer(c, outs: dict[str, Path], build_name: str) -> tuple[str, dict[str, Entry]]:
    flags = dict(f.lstrip("-").split("=", 1) for f in c.flags)
    if flags.get("from") != build_name:
        fail(f"{where(c)}: copies from {flags.get('from', 'the build context')}, "
             f"scripts/image.sh only has the build stage's ({build_name}) outputs")
    uid = gid = 0
    if "chown" in flags:
        u, _, g = flags["chown"].partition(":")
        uid, gid = int(u), int(g or u)
    chmod = int(flags["chmod"], 8) if "chmod" in flags else None
    *srcs, dest = c.value
    files: dict[str, Entry] = {}
    for s in srcs:
        src = outs.get(s) or outs.get(s.rstrip("/"))
        if src is None:
            fail(f"{where(c)}: {s} is not made by a script the build stage runs")
            continue
        files.update(tree_entries(src, dest if len(srcs) == 1 else dest.rstrip("/") + "/", uid, gid, chmod))
    return where(c), files


def expected_image(path: Path, binary: Path, build_args: dict[str, str], tmp: Path) -> Expected:
    cmds = dockerfile.parse_file(str(path))
    stages: list[tuple] = []
    for c in cmds:
        if c.cmd == "FROM":
            stages.append((c, []))
        elif stages:
            stages[-1][1].append(c)
    (first, build), (base, final) = stages[0], stages[-1]
    build_name = first.value[2] if len(first.value) > 2 else "0"
    exp = Expected()
    if base.value[0] != "scratch":
        fail(f"{where(base)}: scripts/image.sh assembles images FROM scratch only "
             "(a pulled base's layers and config are not available offline)")
    # FROM scratch in BuildKit starts with these (moby/buildkit dockerfile2llb's empty image).
    exp.config = {"Env": list(SCRATCH_ENV), "WorkingDir": "/"}
    exp.origin = {"Env": where(base), "WorkingDir": where(base)}
    outs = build_outputs(build, binary, tmp)
    args: dict[str, str] = {}
    for c in final:
        apply(c, exp, args, build_args, outs, build_name)
    return exp


def apply(c, exp: Expected, args: dict, build_args: dict, outs: dict, build_name: str) -> None:
    """One runtime-stage instruction's effect on the expected config and layers."""
    cfg, v = exp.config, [expand(x, args) for x in c.value]
    set_keys: list[str] = []
    if c.cmd == "ARG":
        name, _, default = c.value[0].partition("=")
        args[name] = build_args.get(name, unquote(default))
    elif c.cmd == "LABEL":
        labels = cfg.setdefault("Labels", {})
        labels.update({v[i]: unquote(v[i + 1]) for i in range(0, len(v) - 1, 2)})
        set_keys = ["Labels"]
    elif c.cmd == "ENV":
        env = [e for e in cfg["Env"] if e.split("=", 1)[0] not in v[0::2]]
        cfg["Env"] = env + [f"{k}={unquote(val)}" for k, val in zip(v[0::2], v[1::2])]
        set_keys = ["Env"]
    elif c.cmd in ("ENTRYPOINT", "CMD"):
        key = "Entrypoint" if c.cmd == "ENTRYPOINT" else "Cmd"
        cfg[key] = list(c.value) if c.json else ["/bin/sh", "-c", " ".join(c.value)]
        set_keys = [key]
    elif c.cmd == "USER":
        cfg["User"], set_keys = v[0], ["User"]
    elif c.cmd == "WORKDIR":
        cfg["WorkingDir"], set_keys = posixpath.join(cfg["WorkingDir"], v[0]), ["WorkingDir"]
    elif c.cmd == "EXPOSE":
        ports = cfg.setdefault("ExposedPorts", {})
        ports.update({(p if "/" in p else p + "/tcp"): {} for p in v})
        set_keys = ["ExposedPorts"]
    elif c.cmd == "VOLUME":
        cfg.setdefault("Volumes", {}).update({p: {} for p in v})
        set_keys = ["Volumes"]
    elif c.cmd == "COPY":
        exp.layers.append(copy_layer(c, outs, build_name))
    else:
        fail(f"{where(c)}: {c.cmd} in the runtime stage is not something scripts/image/oci.py models")
    for k in set_keys:
        exp.origin[k] = where(c)


def read_blob(layout: Path, desc: dict) -> bytes:
    algo, hexd = desc["digest"].split(":")
    data = (layout / "blobs" / algo / hexd).read_bytes()
    if hashlib.sha256(data).hexdigest() != hexd or len(data) != desc["size"]:
        # Nothing read from a corrupt blob means anything: stop here.
        raise SystemExit(f"FAIL image_check: blob {desc['digest']} in {layout} does not match its digest or size")
    return data


def layer_files(blob: bytes) -> tuple[dict[str, Entry], str]:
    raw = gzip.decompress(blob)
    files: dict[str, Entry] = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for m in tar.getmembers():
            if m.isdir():
                e: Entry = ("dir", m.mode, m.uid, m.gid, "")
            elif m.issym():
                e = ("symlink", 0o777, m.uid, m.gid, m.linkname)
            else:
                data = tar.extractfile(m).read()  # type: ignore[union-attr]
                e = ("file", m.mode, m.uid, m.gid, hashlib.sha256(data).hexdigest())
            files[m.name.rstrip("/")] = e
    return files, "sha256:" + hashlib.sha256(raw).hexdigest()


@dataclass
class PlatformImage:
    arch: str          # the index's platform.architecture
    digest: str        # the manifest's
    config: dict
    layers: list[dict[str, Entry]]


def read_index(layout: Path) -> tuple[str, list[PlatformImage]]:
    """(index digest, each platform's image), every blob checked against its digest."""
    top = json.loads((layout / "index.json").read_text())
    if json.loads((layout / "oci-layout").read_text()).get("imageLayoutVersion") != "1.0.0":
        fail("oci-layout: imageLayoutVersion is not 1.0.0")
    idesc = top["manifests"][0]
    if idesc["mediaType"] != MT_INDEX:
        fail(f"index.json names a {idesc['mediaType']}, not an image index")
        return idesc["digest"], []
    index = json.loads(read_blob(layout, idesc))
    images = []
    for mdesc in index["manifests"]:
        p = mdesc.get("platform", {})
        if mdesc["mediaType"] != MT_MANIFEST or p.get("os") != "linux" or set(p) != {"os", "architecture"}:
            fail(f"index entry {mdesc['digest']}: {mdesc['mediaType']}, platform {p}: not a linux image manifest")
        config, layers = read_image(layout, mdesc)
        if (config.get("os"), config.get("architecture")) != (p.get("os"), p.get("architecture")):
            fail(f"linux/{p.get('architecture')}: config platform {config.get('os')}/{config.get('architecture')}")
        images.append(PlatformImage(p.get("architecture", "?"), mdesc["digest"], config, layers))
    archs = [i.arch for i in images]
    if len(set(archs)) != len(archs):
        fail(f"the index lists an architecture twice: {archs}")
    return idesc["digest"], images


def read_image(layout: Path, mdesc: dict) -> tuple[dict, list[dict[str, Entry]]]:
    """(config, files of each layer) of one image manifest."""
    manifest = json.loads(read_blob(layout, mdesc))
    config = json.loads(read_blob(layout, manifest["config"]))
    layers, diff_ids = [], []
    for desc in manifest["layers"]:
        if desc["mediaType"] != "application/vnd.oci.image.layer.v1.tar+gzip":
            fail(f"layer {desc['digest']}: media type {desc['mediaType']}")
        files, diff_id = layer_files(read_blob(layout, desc))
        layers.append(files)
        diff_ids.append(diff_id)
    if config.get("rootfs", {}).get("diff_ids") != diff_ids:
        fail(f"{mdesc['digest']}: config rootfs.diff_ids do not match the layers' uncompressed digests")
    return config, layers


def compare(exp: Expected, config: dict, layers: list[dict[str, Entry]]) -> None:
    got = config.get("config", {})
    names = {"Labels": "LABEL", "Env": "ENV", "Entrypoint": "ENTRYPOINT", "Cmd": "CMD",
             "User": "USER", "WorkingDir": "WORKDIR", "ExposedPorts": "EXPOSE", "Volumes": "VOLUME"}
    for key in sorted(set(exp.config) | set(got)):
        want, have = exp.config.get(key), got.get(key)
        if want == have:
            continue
        origin = exp.origin.get(key, f"no {names.get(key, key)} instruction in the runtime stage")
        if key == "Labels" and isinstance(have, dict) and isinstance(want, dict):
            for k in sorted(set(want) | set(have)):
                if want.get(k) != have.get(k):
                    fail(f"{origin}: label {k}: Dockerfile {want.get(k)!r}, image {have.get(k)!r}")
        else:
            fail(f"{origin}: {key}: Dockerfile {want!r}, image {have!r}")
    if len(layers) != len(exp.layers):
        # Pairing COPYs with layers would then report every file: the count says it all.
        fail(f"the runtime stage has {len(exp.layers)} COPY instructions "
             f"({'; '.join(o for o, _ in exp.layers)}), the image {len(layers)} layers")
        return
    for (origin, want_files), have_files in zip(exp.layers, layers):
        for name in sorted(set(want_files) | set(have_files)):
            w, h = want_files.get(name), have_files.get(name)
            if w == h:
                continue
            if w is None:
                fail(f"{origin}: the image's layer has /{name}, which the COPY does not write")
            elif h is None:
                fail(f"{origin}: /{name} is missing from the image's layer")
            else:
                what = [n for n, a, b in zip(("type", "mode", "uid", "gid", "content"), w, h) if a != b]
                fail(f"{origin}: /{name} differs in {', '.join(what)}: Dockerfile "
                     f"{w[0]} {oct(w[1])} {w[2]}:{w[3]}, image {h[0]} {oct(h[1])} {h[2]}:{h[3]}")
    print(f"  config: {json.dumps(got, sort_keys=True)}")
    for (origin, files), n in zip(exp.layers, range(1, len(layers) + 1)):
        print(f"  layer {n}: {len(files)} entries from {origin.split(' (')[0]}")


def elf(binary: Path) -> tuple[str, str, str]:
    """(OCI architecture, uname -m, qemu-user binary) of a 64-bit little-endian ELF executable."""
    head = binary.read_bytes()[:20]
    machine = int.from_bytes(head[18:20], "little") if head[:4] == b"\x7fELF" and head[4:6] == b"\x02\x01" else None
    if machine not in ELF:
        raise SystemExit(f"FAIL image_check: {binary} is not an x86-64 or AArch64 ELF executable")
    return ELF[machine]


def run(binary: Path, *args: str) -> subprocess.CompletedProcess:
    """The binary, under qemu-user when it is for another architecture than this machine's."""
    _, machine, qemu = elf(binary)
    cmd = [str(binary), *args]
    if machine != os.uname().machine:
        if not shutil.which(qemu):
            raise SystemExit(f"FAIL image_check: {qemu} (Debian's qemu-user-static) is needed to run {binary}")
        cmd.insert(0, qemu)
    return subprocess.run(cmd, capture_output=True, text=True)


def build_args(binary: Path) -> dict[str, str]:
    """VERSION and REVISION as scripts/image.sh passes them: from the binary, checked against Cargo.toml."""
    out = run(binary, "--version").stdout.strip()
    m = re.fullmatch(r"h3-ingress (\S+) \(commit (\S+)\)", out)
    if not m:
        fail(f"{binary} --version: unexpected output {out!r}")
        return {}
    cargo = re.search(r'^version = "(.*)"$', (ROOT / "Cargo.toml").read_text(), re.M)
    if not cargo or cargo.group(1) != m.group(1):
        fail(f"the binary is version {m.group(1)}, Cargo.toml {cargo and cargo.group(1)}")
    return {"VERSION": m.group(1), "REVISION": m.group(2)}


def assemble(binaries: list[Path], out: Path) -> Path:
    p = subprocess.run([str(ROOT / "scripts/image.sh"), *map(str, binaries)], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, "H3I_IMAGE_OUT": str(out)})
    if p.returncode != 0:
        raise SystemExit(f"FAIL image_check: scripts/image.sh failed:\n{p.stdout}{p.stderr}")
    return out / "oci"


def default_binaries() -> list[Path]:
    """scripts/image.sh's default: one binary per architecture of its ARCHITECTURES."""
    m = re.search(r"^ARCHITECTURES=\(([^)]*)\)$", (ROOT / "scripts/image.sh").read_text(), re.M)
    if not m:
        raise SystemExit("FAIL image_check: scripts/image.sh sets no ARCHITECTURES=(...)")
    return [ROOT / subprocess.run([str(ROOT / "scripts/build-static.sh"), "--arch", a, "--print-output"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            for a in m.group(1).split()]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", type=Path, action="append",
                    help="a static binary, once per architecture (default: scripts/image.sh's)")
    ap.add_argument("--dockerfile", type=Path, default=ROOT / "Dockerfile")
    ap.add_argument("--layout", type=Path, help="check this OCI layout instead of assembling one")
    a = ap.parse_args()
    binaries = [b.resolve() for b in (a.binary or default_binaries())]
    for b in binaries:
        if not b.exists():
            print(f"FAIL image_check: {b} does not exist (scripts/build-static.sh [--arch ARCH] builds it)")
            return 1
    by_arch = {elf(b)[0]: b for b in binaries}
    with tempfile.TemporaryDirectory(prefix="h3i-image-check.") as tmp:
        t = Path(tmp)
        if a.layout:
            layout = a.layout
        else:
            layout = assemble(binaries, t / "a")
            again = assemble(list(reversed(binaries)), t / "b")
            d1, d2 = (json.loads((x / "index.json").read_text())["manifests"][0]["digest"] for x in (layout, again))
            if d1 != d2:
                fail(f"not reproducible: the same binaries assembled twice gave {d1} and {d2}")
        digest, images = read_index(layout)
        print(f"image index {digest} ({'assembled twice, same digest' if not a.layout else layout})")
        if sorted(i.arch for i in images) != sorted(by_arch):
            fail(f"the index has {sorted(i.arch for i in images)}, the binaries are {sorted(by_arch)}")
        for img in images:
            if img.arch not in by_arch:
                continue
            # The binary's ELF machine is the platform's: its layer holds exactly this binary.
            print(f"linux/{img.arch}: manifest {img.digest}, binary {by_arch[img.arch]}")
            binary = by_arch[img.arch]
            exp = expected_image(a.dockerfile, binary, build_args(binary), t / "build" / img.arch)
            compare(exp, img.config, img.layers)
    if failures:
        print("FAIL image_check: the Dockerfile's runtime stage and the image differ:\n  " + "\n  ".join(failures))
        return 1
    print("ok: image_check (Dockerfile runtime stage == scripts/image.sh's image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
