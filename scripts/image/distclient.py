#!/usr/bin/env python3
"""A minimal OCI distribution client (Python standard library): pushes an OCI image layout to a
registry and pulls it back, with HTTP Basic authentication as a registry with htpasswd asks
for it (no token service), over HTTPS verified against a given CA.

    distclient.py push   --registry HOST:PORT --layout DIR [--ref REPO:TAG] AUTH
    distclient.py pull   --registry HOST:PORT --layout DIR [--ref REPO:TAG] AUTH
    distclient.py denied --registry HOST:PORT --ref REPO:TAG [--user U --password-file F]

AUTH is --user U --password-file F; --cacert CA for the registry's certificate. REPO:TAG
defaults to the io.containerd.image.name in the layout's index.json, registry host removed.
The image the layout names is an image index (one manifest per platform, scripts/image/oci.py)
or a single image manifest.
push: for each image manifest, the blobs the registry lacks (HEAD, then POST + PUT monolithic
upload), then the manifest (by digest when an index lists it); then the index by tag.
pull: the index (or manifest) by tag, each platform's manifest by digest, config and layers, each
checked against its digest and against the layout. denied: the manifest request must get 401
with a Basic challenge (exit 0), without credentials or with the ones given (a wrong password).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_INDEX = "application/vnd.oci.image.index.v1+json"


class Registry:
    def __init__(self, host: str, cacert: Path | None, user: str | None, password: str | None):
        self.base = f"https://{host}"
        self.ctx = ssl.create_default_context(cafile=str(cacert) if cacert else None)
        self.auth = None
        if user is not None and password is not None:
            self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def request(self, method: str, url: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) for any status: 4xx are answers here, not exceptions."""
        url = urllib.parse.urljoin(self.base, url)
        req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
        if self.auth:
            req.add_header("Authorization", self.auth)
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=60) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def expect(self, want: int, method: str, url: str, **kw) -> tuple[dict[str, str], bytes]:
        status, headers, body = self.request(method, url, **kw)
        if status != want:
            raise SystemExit(f"distclient: {method} {url}: HTTP {status}, expected {want}: {body[:300]!r}")
        return headers, body

    def login(self) -> None:
        """The registry's /v2/ challenge must be Basic; then the credentials must be accepted."""
        auth, self.auth = self.auth, None
        status, headers, _ = self.request("GET", "/v2/")
        challenge = headers.get("www-authenticate", "")
        if status != 401 or not challenge.lower().startswith("basic"):
            raise SystemExit(f"distclient: /v2/ answered {status} {challenge!r}, not 401 with a Basic challenge")
        self.auth = auth
        self.expect(200, "GET", "/v2/")


def read_layout(layout: Path) -> tuple[dict, bytes, str]:
    index = json.loads((layout / "index.json").read_text())
    desc = index["manifests"][0]
    manifest = blob_bytes(layout, desc["digest"])
    return desc, manifest, desc.get("annotations", {}).get("io.containerd.image.name", "")


def blob_bytes(layout: Path, digest: str) -> bytes:
    algo, hexd = digest.split(":")
    return (layout / "blobs" / algo / hexd).read_bytes()


def default_ref(name: str) -> str:
    # "127.0.0.1:5443/h3-ingress:0.1.0-abc" -> "h3-ingress:0.1.0-abc": the registry is --registry.
    first, _, rest = name.partition("/")
    return rest if rest and ("." in first or ":" in first or first == "localhost") else name


def split_ref(ref: str) -> tuple[str, str]:
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:
        raise SystemExit(f"distclient: {ref} is not REPO:TAG")
    return repo, tag


def children(desc: dict, body: bytes) -> list[dict]:
    """The manifests an index lists (with their platforms); none for an image manifest."""
    return json.loads(body)["manifests"] if desc["mediaType"] == MT_INDEX else []


def platform(desc: dict) -> str:
    p = desc.get("platform", {})
    return f"{p.get('os', '?')}/{p.get('architecture', '?')}" if p else "-"


def push(reg: Registry, layout: Path, ref: str) -> None:
    repo, tag = split_ref(ref)
    desc, top, _ = read_layout(layout)
    reg.login()
    for child in children(desc, top):
        print(f"  {platform(child)}:")
        push_manifest(reg, layout, repo, child["digest"], child, blob_bytes(layout, child["digest"]))
    push_manifest(reg, layout, repo, tag, desc, top)
    kind = "image index" if desc["mediaType"] == MT_INDEX else "image manifest"
    print(f"pushed {reg.base.split('//')[1]}/{repo}:{tag} {desc['digest']} ({kind})")


def push_manifest(reg: Registry, layout: Path, repo: str, ref: str, desc: dict, body: bytes) -> None:
    """An image manifest's blobs, then the manifest; an index has no blobs of its own."""
    if desc["mediaType"] == MT_MANIFEST:
        manifest = json.loads(body)
        push_blobs(reg, layout, repo, [manifest["config"], *manifest["layers"]])
    headers, _ = reg.expect(201, "PUT", f"/v2/{repo}/manifests/{ref}", body=body,
                            headers={"Content-Type": desc["mediaType"]})
    got = headers.get("docker-content-digest")
    if got != desc["digest"]:
        raise SystemExit(f"distclient: the registry stored {repo}:{ref} as {got}, not {desc['digest']}")
    print(f"    manifest {ref}: {desc['digest']}, {len(body)} bytes")


def push_blobs(reg: Registry, layout: Path, repo: str, descs: list[dict]) -> None:
    for b in descs:
        digest = b["digest"]
        status, _, _ = reg.request("HEAD", f"/v2/{repo}/blobs/{digest}")
        if status == 200:
            print(f"    blob {digest}: already there")
            continue
        headers, _ = reg.expect(202, "POST", f"/v2/{repo}/blobs/uploads/", body=b"")
        location = headers["location"]
        sep = "&" if "?" in location else "?"
        data = blob_bytes(layout, digest)
        reg.expect(201, "PUT", f"{location}{sep}digest={urllib.parse.quote(digest)}", body=data,
                   headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
        print(f"    blob {digest}: pushed {len(data)} bytes")


def pull(reg: Registry, layout: Path, ref: str) -> None:
    repo, tag = split_ref(ref)
    desc, local, _ = read_layout(layout)
    reg.login()
    pull_manifest(reg, repo, tag, desc, local)
    for child in children(desc, local):
        print(f"  {platform(child)}:")
        body = pull_manifest(reg, repo, child["digest"], child, blob_bytes(layout, child["digest"]))
        manifest = json.loads(body)
        for b in [manifest["config"], *manifest["layers"]]:
            _, data = reg.expect(200, "GET", f"/v2/{repo}/blobs/{b['digest']}")
            if "sha256:" + hashlib.sha256(data).hexdigest() != b["digest"] or len(data) != b["size"]:
                raise SystemExit(f"distclient: blob {b['digest']} came back different")
            print(f"    GET blob {b['digest']}: 200, {len(data)} bytes, digest ok")
    print(f"pulled {ref} {desc['digest']}: identical to {layout}")


def pull_manifest(reg: Registry, repo: str, ref: str, desc: dict, local: bytes) -> bytes:
    """GET a manifest or index as a runtime asks for it (both media types accepted); it must be
    the layout's, byte for byte, with the media type the layout gives it."""
    headers, body = reg.expect(200, "GET", f"/v2/{repo}/manifests/{ref}",
                               headers={"Accept": f"{MT_INDEX}, {MT_MANIFEST}"})
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    print(f"GET /v2/{repo}/manifests/{ref}: 200, {headers.get('content-type')}, {len(body)} bytes, "
          f"Docker-Content-Digest {headers.get('docker-content-digest')}")
    if (digest != desc["digest"] or headers.get("docker-content-digest") != digest or body != local
            or headers.get("content-type") != desc["mediaType"]):
        raise SystemExit(f"distclient: {repo}:{ref} came back as {digest} ({headers.get('content-type')}), "
                         f"not the layout's {desc['digest']} ({desc['mediaType']})")
    return body


def denied(reg: Registry, ref: str) -> None:
    repo, tag = split_ref(ref)
    for url in ("/v2/", f"/v2/{repo}/manifests/{tag}", f"/v2/{repo}/tags/list"):
        status, headers, body = reg.request("GET", url, headers={"Accept": MT_MANIFEST})
        challenge = headers.get("www-authenticate", "")
        who = "wrong password" if reg.auth else "no credentials"
        print(f"GET {url} ({who}): {status}, WWW-Authenticate: {challenge}, body {body.decode()[:120].strip()}")
        if status != 401 or not challenge.lower().startswith("basic"):
            raise SystemExit(f"distclient: {url} answered {status} {challenge!r}, not 401 with a Basic challenge")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("action", choices=["push", "pull", "denied"])
    ap.add_argument("--registry", required=True, help="HOST:PORT")
    ap.add_argument("--layout", type=Path)
    ap.add_argument("--ref", help="REPO:TAG (default: from the layout's index.json)")
    ap.add_argument("--cacert", type=Path)
    ap.add_argument("--user")
    ap.add_argument("--password-file", type=Path)
    a = ap.parse_args()
    password = a.password_file.read_text().strip() if a.password_file else None
    if a.action != "denied" and (a.user is None or password is None or a.layout is None):
        ap.error(f"{a.action} needs --layout, --user and --password-file")
    ref = a.ref
    if not ref and a.layout:
        ref = default_ref(read_layout(a.layout)[2])
    if not ref:
        ap.error("--ref or a --layout whose index.json names the image")
    reg = Registry(a.registry, a.cacert, a.user, password)
    {"push": lambda: push(reg, a.layout, ref), "pull": lambda: pull(reg, a.layout, ref),
     "denied": lambda: denied(reg, ref)}[a.action]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
