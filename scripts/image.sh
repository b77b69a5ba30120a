#!/usr/bin/env bash
# The h3-ingress image without a Docker engine: the static binaries (scripts/build-static.sh) and
# the root files (scripts/image-rootfs.sh), the Dockerfile build stage's two outputs, assembled
# by scripts/image/oci.py into exactly what the Dockerfile's runtime stage describes
# (tests/observe/image_check.py holds the two together): one image manifest per architecture
# under one image index, as `docker buildx build --platform linux/amd64,linux/arm64` makes it.
# Reproducible: the same binaries on the same machine (same CA bundle) give the same digest.
#
#   scripts/image.sh [BINARY...]        default: one per ARCHITECTURES below, each at
#                                       `scripts/build-static.sh --arch A --print-output`
#                                       and built when missing
#
# Each BINARY's architecture is read from its ELF header. All of them must be the same build
# (`--version`, run through qemu-user-static for another architecture than this machine's).
#
# Writes target/image/oci/ (an OCI image layout: oci-layout, index.json, blobs/sha256/) and
# target/image/h3-ingress.oci.tar (the same as one OCI archive, for `ctr images import`), and
# prints the reference, index digest and each platform's manifest digest and size.
#
# Environment: H3I_IMAGE_REPOSITORY (default ghcr.io/h3-ingress/h3-ingress, the chart's
# default), H3I_IMAGE_OUT (default target/image). The tag is VERSION-COMMIT as in
# scripts/release.sh, read from the binaries' --version, so it names the build it holds.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# The architectures of the project's image: the operator's ARCHITECTURES and the chart's
# image.architectures are the same list (a test in src/operator/mod.rs holds them together).
ARCHITECTURES=(amd64 arm64)
out=${H3I_IMAGE_OUT:-target/image}
repository=${H3I_IMAGE_REPOSITORY:-ghcr.io/h3-ingress/h3-ingress}
die() { echo "image.sh: $*" >&2; exit 1; }

binaries=("$@")
if [[ ${#binaries[@]} -eq 0 ]]; then
    for arch in "${ARCHITECTURES[@]}"; do
        binary=$(scripts/build-static.sh --arch "$arch" --print-output)
        [[ -x $binary ]] || scripts/build-static.sh --arch "$arch" "$binary"
        binaries+=("$binary")
    done
fi

# `h3-ingress --version` of a binary of any architecture: qemu-user runs another one.
run_version() {
    local binary=$1 machine
    machine=$(file -b "$binary")
    case $machine in
        *x86-64*) [[ $(uname -m) == x86_64 ]] || set -- qemu-x86_64-static "$binary" ;;
        *aarch64*) [[ $(uname -m) == aarch64 ]] || set -- qemu-aarch64-static "$binary" ;;
        *) die "$binary is neither x86-64 nor aarch64: $machine" ;;
    esac
    command -v "$1" >/dev/null || die "$1 (Debian's qemu-user-static, scripts/setup.sh) runs $binary here"
    "$@" --version
}

version="" revision="" first=""
for binary in "${binaries[@]}"; do
    [[ -x $binary ]] || die "$binary does not exist"
    file -b "$binary" | grep -Eq 'statically linked|static-pie linked' || die "$binary is not a static executable"
    # `h3-ingress 0.1.0 (commit 3f2a9c1b7d4e)`: VERSION and REVISION as the Dockerfile's build args.
    reported=$(run_version "$binary")
    [[ $reported =~ ^h3-ingress\ ([^ ]+)\ \(commit\ ([^\)]+)\)$ ]] || die "$binary: unexpected --version: $reported"
    if [[ -z $first ]]; then
        first=$binary version=${BASH_REMATCH[1]} revision=${BASH_REMATCH[2]}
    elif [[ ${BASH_REMATCH[1]} != "$version" || ${BASH_REMATCH[2]} != "$revision" ]]; then
        die "$binary is $reported, $first is $version commit $revision: one image holds one build (scripts/build-static.sh --arch ARCH rebuilds)"
    fi
done
cargo_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[[ $version == "$cargo_version" ]] || die "the binary is $version, Cargo.toml says $cargo_version"

mkdir -p "$out"
work=$(mktemp -d "$out/.rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
scripts/image-rootfs.sh "$work/rootfs"
binary_args=()
for binary in "${binaries[@]}"; do binary_args+=(--binary "$binary"); done
python3 scripts/image/oci.py "${binary_args[@]}" --rootfs "$work/rootfs" \
    --version "$version" --revision "$revision" --name "$repository:$version-$revision" \
    --out "$out/oci" --tar "$out/h3-ingress.oci.tar" >"$work/summary.json"
python3 - "$work/summary.json" "$out" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"image {s['name']}\n  index    {s['index']}")
for p in s["platforms"]:
    print(f"  linux/{p['architecture']}: manifest {p['manifest']}, {p['compressed_bytes'] / 1e6:.1f} MB compressed")
    print(f"    config   {p['config']}")
    for d in p["layers"]:
        print(f"    layer    {d}")
print(f"  {sys.argv[2]}/oci and {sys.argv[2]}/h3-ingress.oci.tar")
EOF
