#!/usr/bin/env bash
# The h3-ingress image without a Docker engine: the static binary (scripts/build-static.sh) and
# the root files (scripts/image-rootfs.sh), the Dockerfile build stage's two outputs, assembled
# by scripts/image/oci.py into exactly what the Dockerfile's runtime stage describes
# (tests/observe/image_check.py holds the two together). Reproducible: the same binary on the
# same machine (same CA bundle) gives the same digest.
#
#   scripts/image.sh [BINARY]           default target/static/h3-ingress, built when missing
#
# Writes target/image/oci/ (an OCI image layout: oci-layout, index.json, blobs/sha256/) and
# target/image/h3-ingress.oci.tar (the same as one OCI archive, for `ctr images import`), and
# prints the reference, manifest digest and size.
#
# Environment: H3I_IMAGE_REPOSITORY (default ghcr.io/h3-ingress/h3-ingress, the chart's
# default), H3I_IMAGE_OUT (default target/image). The tag is VERSION-COMMIT as in
# scripts/release.sh, read from the binary's --version, so it names the build it holds.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
binary=${1:-target/static/h3-ingress}
out=${H3I_IMAGE_OUT:-target/image}
repository=${H3I_IMAGE_REPOSITORY:-ghcr.io/h3-ingress/h3-ingress}
die() { echo "image.sh: $*" >&2; exit 1; }

if [[ ! -x $binary ]]; then
    [[ $binary == target/static/h3-ingress ]] || die "$binary does not exist"
    scripts/build-static.sh "$binary"
fi
file -b "$binary" | grep -Eq 'statically linked|static-pie linked' || die "$binary is not a static executable"

# `h3-ingress 0.1.0 (commit 3f2a9c1b7d4e)`: VERSION and REVISION as the Dockerfile's build args.
reported=$("$binary" --version)
[[ $reported =~ ^h3-ingress\ ([^ ]+)\ \(commit\ ([^\)]+)\)$ ]] || die "unexpected --version: $reported"
version=${BASH_REMATCH[1]}
revision=${BASH_REMATCH[2]}
cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[[ $version == "$cargo_version" ]] || die "the binary is $version, Cargo.toml says $cargo_version"

mkdir -p "$out"
work=$(mktemp -d "$out/.rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
scripts/image-rootfs.sh "$work/rootfs"
python3 scripts/image/oci.py --binary "$binary" --rootfs "$work/rootfs" \
    --version "$version" --revision "$revision" --name "$repository:$version-$revision" \
    --out "$out/oci" --tar "$out/h3-ingress.oci.tar" >"$work/summary.json"
python3 - "$work/summary.json" "$out" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"image {s['name']}\n  manifest {s['manifest']}\n  config   {s['config']}")
for d in s["layers"]:
    print(f"  layer    {d}")
print(f"  {s['compressed_bytes'] / 1e6:.1f} MB compressed; {sys.argv[2]}/oci and {sys.argv[2]}/h3-ingress.oci.tar")
EOF
