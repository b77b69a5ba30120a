#!/usr/bin/env python3
"""Assembles the h3-ingress image as an OCI image layout (and an OCI archive of it) without a
Docker engine, byte for byte reproducible: the same binary and root files give the same digest.

    scripts/image/oci.py --binary B --rootfs D --version V --revision R --name REF --out DIR [--tar F]
                         [--spec JSON]

IMAGE below is the Dockerfile's runtime stage written out as data; tests/observe/image_check.py
parses the Dockerfile and fails when the two differ in any instruction. --spec assembles another
image the same way from an object with IMAGE's keys (scripts/addons-build.sh: Traefik and
CoreDNS for the test cluster). Only the standard library is used, so the image can be assembled
on any machine with python3.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

# What BuildKit gives a stage FROM scratch before its first instruction (moby/buildkit
# dockerfile2llb's empty image): these are in docker build's image config, so in ours too.
SCRATCH_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SCRATCH_WORKDIR = "/"

# The runtime stage of the Dockerfile. Layers are its COPY instructions in order: (source as
# the Dockerfile's build stage names it, destination, the --binary/--rootfs input it is).
IMAGE = {
    "from": "scratch",
    "layers": [("/out/rootfs/", "/", "rootfs"), ("/out/h3-ingress", "/h3-ingress", "binary")],
    "user": "65532:65532",
    "entrypoint": ["/h3-ingress"],
    "cmd": ["--help"],
    "env": [],
    "workdir": None,
    "exposed_ports": [],
    "volumes": [],
    "labels": {
        "org.opencontainers.image.title": "h3-ingress",
        "org.opencontainers.image.description":
            "HTTP/3 in front of a Kubernetes cluster's existing TCP ingress",
        "org.opencontainers.image.version": "${VERSION}",
        "org.opencontainers.image.revision": "${REVISION}",
        "org.opencontainers.image.licenses": "Apache-2.0",
    },
}

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MT_INDEX = "application/vnd.oci.image.index.v1+json"
# Every entry of every tar gets this mtime: file times of a build would change the digest.
EPOCH = 0


@dataclass
class Blob:
    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: object) -> dict:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data), **extra}


def canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _entry(name: str, path: Path) -> tarfile.TarInfo:
    st = path.lstat()
    info = tarfile.TarInfo(name)
    # COPY without --chown writes root-owned files and keeps the permission bits.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = EPOCH
    info.mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    else:
        raise SystemExit(f"oci.py: {path}: only files, directories and symlinks go into the image")
    return info


def layer_entries(src: Path, dest: str) -> list[tuple[str, Path]]:
    """(name in the layer, file on disk), parents before children, names sorted.

    A directory copied to / contributes its contents (COPY dir/ /); a file copied to /x is x.
    """
    dest = dest.strip("/")
    if src.is_dir():
        out = []
        for path in sorted(src.rglob("*")):
            rel = path.relative_to(src).as_posix()
            out.append(((dest + "/" + rel) if dest else rel, path))
        return sorted(out)
    return [(dest, src)]


def make_layer(entries: list[tuple[str, Path]]) -> tuple[bytes, bytes]:
    """The uncompressed tar (its digest is the diff_id) and its gzip (the blob)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path in entries:
            info = _entry(name, path)
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tar_bytes = raw.getvalue()
    gz = io.BytesIO()
    # No file name and a fixed mtime in the gzip header, or every run differs.
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz, compresslevel=6, mtime=EPOCH) as z:
        z.write(tar_bytes)
    return tar_bytes, gz.getvalue()


def expand(value: str, args: dict[str, str]) -> str:
    for k, v in args.items():
        value = value.replace("${" + k + "}", v).replace("$" + k, v)
    return value


def image_config(args: dict[str, str], diff_ids: list[str], image: dict = IMAGE) -> dict:
    cfg: dict = {
        "User": image["user"],
        "Env": [SCRATCH_PATH] + list(image["env"]),
        "Entrypoint": image["entrypoint"],
        "Cmd": image["cmd"],
        "WorkingDir": image["workdir"] or SCRATCH_WORKDIR,
        "Labels": {k: expand(v, args) for k, v in image["labels"].items()},
    }
    if image["exposed_ports"]:
        cfg["ExposedPorts"] = {p: {} for p in image["exposed_ports"]}
    if image["volumes"]:
        cfg["Volumes"] = {v: {} for v in image["volumes"]}
    # No "created" anywhere: a timestamp would make every assembly a different image.
    return {"architecture": "amd64", "os": "linux", "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": diff_ids}}


def assemble(inputs: dict[str, Path], args: dict[str, str], name: str,
             image: dict = IMAGE) -> tuple[list[Blob], dict]:
    """All blobs (layers, config, manifest) and index.json's content."""
    blobs: list[Blob] = []
    diff_ids: list[str] = []
    for src, dest, which in image["layers"]:
        tar_bytes, gz = make_layer(layer_entries(inputs[which], dest))
        diff_ids.append("sha256:" + hashlib.sha256(tar_bytes).hexdigest())
        blobs.append(Blob(MT_LAYER, gz))
    config = Blob(MT_CONFIG, canonical(image_config(args, diff_ids, image)))
    manifest = Blob(MT_MANIFEST, canonical({
        "schemaVersion": 2, "mediaType": MT_MANIFEST, "config": config.descriptor(),
        "layers": [b.descriptor() for b in blobs]}))
    blobs += [config, manifest]
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    # ctr images import names the image from io.containerd.image.name; other OCI tools read
    # the tag from org.opencontainers.image.ref.name.
    index = {"schemaVersion": 2, "mediaType": MT_INDEX, "manifests": [manifest.descriptor(
        platform={"architecture": "amd64", "os": "linux"},
        annotations={"io.containerd.image.name": name, "org.opencontainers.image.ref.name": tag})]}
    return blobs, index


def write_layout(out: Path, blobs: list[Blob], index: dict) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "blobs/sha256").mkdir(parents=True)
    for b in blobs:
        (tmp / "blobs/sha256" / b.digest.split(":")[1]).write_bytes(b.data)
    (tmp / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    (tmp / "index.json").write_bytes(canonical(index))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def write_archive(layout: Path, tar_path: Path) -> None:
    """The layout as one tar (an OCI archive, what `ctr images import` reads), reproducible too."""
    tmp = tar_path.with_name(tar_path.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path in layer_entries(layout, ""):
            info = _entry(name, path)
            info.mode = 0o755 if info.isdir() else 0o644
            if info.isreg():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tmp.rename(tar_path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", type=Path, required=True)
    ap.add_argument("--rootfs", type=Path, required=True, help="scripts/image-rootfs.sh's output")
    ap.add_argument("--version", required=True, help="build arg VERSION")
    ap.add_argument("--revision", required=True, help="build arg REVISION")
    ap.add_argument("--name", required=True, help="image reference, e.g. 127.0.0.1:5443/h3-ingress:0.1.0-abc")
    ap.add_argument("--out", type=Path, required=True, help="OCI layout directory (replaced)")
    ap.add_argument("--tar", type=Path, help="also write the layout as an OCI archive here")
    ap.add_argument("--spec", type=json.loads, help="another image than IMAGE: a JSON object with its keys")
    a = ap.parse_args()
    image = IMAGE
    if a.spec is not None:
        missing = sorted(set(IMAGE) - set(a.spec))
        if missing or a.spec.get("from") != "scratch":
            raise SystemExit(f"oci.py: --spec: needs from=scratch and every key of IMAGE (missing: {missing})")
        image = a.spec
    blobs, index = assemble({"binary": a.binary, "rootfs": a.rootfs},
                            {"VERSION": a.version, "REVISION": a.revision}, a.name, image)
    write_layout(a.out, blobs, index)
    if a.tar:
        write_archive(a.out, a.tar)
    manifest = blobs[-1]
    print(json.dumps({"name": a.name, "manifest": manifest.digest,
                      "config": blobs[-2].digest, "layers": [b.digest for b in blobs[:-2]],
                      "compressed_bytes": sum(len(b.data) for b in blobs[:-2])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
