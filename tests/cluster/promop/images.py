#!/usr/bin/env python3
"""OCI images of the Prometheus Operator, its config reloader and the Prometheus server for the
test cluster's real nodes, without a Docker engine: one layer each, the static binary at the path
the upstream image has it (the operator starts the reloader as /bin/prometheus-config-reloader and
runs the Prometheus image's entrypoint with its own flags), running as nobody like upstream.

    images.py --bin DIR --out DIR --operator-version V --prometheus-version V

Writes OUT/<name>/ (an OCI image layout each) named registry.h3i.test/<name>:v<version>, so
`scripts/registry.sh push OUT/<name>` stores it as <name>:v<version>. Reproducible: the layer,
gzip and JSON writers of scripts/image/oci.py (fixed owners, times and ordering).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts/image"))
import oci  # noqa: E402

REGISTRY = "registry.h3i.test"
NOBODY = "65534:65534"


def rootfs(tmp: Path, binary: Path, name: str, data_dirs: list[str]) -> Path:
    """A root with /bin/<name>, an /etc/passwd naming nobody, /tmp and the data directories."""
    root = tmp / name
    (root / "bin").mkdir(parents=True)
    (root / "bin" / name).write_bytes(binary.read_bytes())
    (root / "bin" / name).chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n")
    (root / "etc/group").write_text("root:x:0:\nnobody:x:65534:\n")
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    for d in data_dirs:
        (root / d.strip("/")).mkdir(parents=True)
        (root / d.strip("/")).chmod(0o777)
    return root


def assemble(root: Path, ref: str, entrypoint: list[str], workdir: str) -> tuple[list[oci.Blob], dict]:
    tar_bytes, gz = oci.make_layer(oci.layer_entries(root, "/"))
    layer = oci.Blob(oci.MT_LAYER, gz)
    config = oci.Blob(oci.MT_CONFIG, oci.canonical({
        "architecture": "amd64", "os": "linux",
        "config": {"User": NOBODY, "Env": [oci.SCRATCH_PATH], "Entrypoint": entrypoint, "WorkingDir": workdir},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar_bytes).hexdigest()]},
        "history": [{"created_by": "tests/cluster/promop/images.py"}]}))
    manifest = oci.Blob(oci.MT_MANIFEST, oci.canonical({
        "schemaVersion": 2, "mediaType": oci.MT_MANIFEST, "config": config.descriptor(),
        "layers": [layer.descriptor()]}))
    index = {"schemaVersion": 2, "mediaType": oci.MT_INDEX, "manifests": [manifest.descriptor(
        platform={"architecture": "amd64", "os": "linux"},
        annotations={"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1]})]}
    return [layer, config, manifest], index


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", type=Path, required=True, help="operator, prometheus-config-reloader, prometheus")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--operator-version", required=True, help="e.g. 0.85.0")
    ap.add_argument("--prometheus-version", required=True, help="e.g. 3.5.0")
    a = ap.parse_args()
    # (image name, binary, path in the image, version, data directories, working directory)
    images = [
        ("prometheus-operator", "operator", "operator", a.operator_version, [], "/"),
        ("prometheus-config-reloader", "prometheus-config-reloader", "prometheus-config-reloader",
         a.operator_version, [], "/"),
        ("prometheus", "prometheus", "prometheus", a.prometheus_version, ["/prometheus", "/etc/prometheus"],
         "/prometheus"),
    ]
    a.out.mkdir(parents=True, exist_ok=True)
    summary = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, binary, inside, version, dirs, workdir in images:
            root = rootfs(Path(tmp), a.bin / binary, inside, dirs)
            ref = f"{REGISTRY}/{name}:v{version}"
            blobs, index = assemble(root, ref, [f"/bin/{inside}"], workdir)
            oci.write_layout(a.out / name, blobs, index)
            summary[name] = {"ref": ref, "manifest": blobs[-1].digest, "bytes": len(blobs[0].data)}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
