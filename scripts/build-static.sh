#!/bin/sh
# Builds the h3-ingress binary the container image ships: release profile, locked dependencies,
# glibc linked statically (no musl target can be installed on the build machines), the product
# package only (the TUN network lab is the workspace's other package, a test tool).
#
#   scripts/build-static.sh [--arch ARCH] [OUTPUT]
#   scripts/build-static.sh [--arch ARCH] --print-output | --cross-packages
#
# ARCH is an image platform's architecture, as Kubernetes' kubernetes.io/arch label and OCI's
# platform.architecture name it: amd64 (x86_64-unknown-linux-gnu) or arm64
# (aarch64-unknown-linux-gnu); default (also for an empty ARCH): the build machine's. OUTPUT defaults to
# target/static/h3-ingress for the build machine's architecture (the binary every test runs
# here) and target/static/ARCH/h3-ingress for another one (`--arch ARCH --print-output` prints
# it). Building for another architecture cross-compiles: Rust's standard library for the
# target (added with rustup when missing) and Debian's cross C toolchain and glibc, which link
# the executable and compile ring's C and assembly (gcc-aarch64-linux-gnu and
# libc6-dev-arm64-cross on an amd64 machine, gcc-x86-64-linux-gnu and libc6-dev-amd64-cross on
# an arm64 one; scripts/setup.sh installs the first pair; `--cross-packages` prints the ones
# this machine needs for ARCH, nothing for its own).
#
# The Dockerfile's build stage runs exactly this script (with --arch $TARGETARCH);
# tests/observe/dockerfile_check.py runs it too and proves the result is a static executable
# that starts with nothing else on disk, and tests/observe/arch_check.py runs the arm64 one
# under qemu.
set -eu
cd "$(dirname "$0")/.."

host_arch() {
    case $(uname -m) in
        x86_64) echo amd64 ;;
        aarch64 | arm64) echo arm64 ;;
        *) echo "build-static.sh: unsupported build machine $(uname -m)" >&2; exit 1 ;;
    esac
}

arch="" out="" print=""
while [ $# -gt 0 ]; do
    case $1 in
        --arch) arch=${2:?--arch needs amd64 or arm64}; shift 2 ;;
        --arch=*) arch=${1#--arch=}; shift ;;
        --print-output) print=output; shift ;;
        --cross-packages) print=packages; shift ;;
        -*) echo "build-static.sh: unknown option $1" >&2; exit 2 ;;
        *) out=$1; shift ;;
    esac
done
[ -n "$arch" ] || arch=$(host_arch)
# The Rust target, and the GNU triple of Debian's cross tools for it.
case $arch in
    amd64) triple=x86_64-unknown-linux-gnu gnu=x86_64-linux-gnu pkgs="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;;
    arm64) triple=aarch64-unknown-linux-gnu gnu=aarch64-linux-gnu pkgs="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;;
    *) echo "build-static.sh: --arch $arch: the image is built for amd64 and arm64" >&2; exit 2 ;;
esac
if [ -z "$out" ]; then
    if [ "$arch" = "$(host_arch)" ]; then out=target/static/h3-ingress; else out=target/static/$arch/h3-ingress; fi
fi
if [ "$print" = output ]; then echo "$out"; exit 0; fi
if [ "$print" = packages ]; then
    if [ "$arch" != "$(host_arch)" ]; then echo "$pkgs"; fi
    exit 0
fi

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/static}"
# crt-static links glibc (and libgcc) into the executable; ring and our code need nothing else.
# With --target, RUSTFLAGS reach only the target's crates: build scripts and proc macros are
# built once for the build machine and shared by both architectures' builds.
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
strip="strip"
if [ "$arch" != "$(host_arch)" ]; then
    command -v "$gnu-gcc" >/dev/null || {
        echo "build-static.sh: no $gnu-gcc: install Debian's $pkgs (scripts/setup.sh)" >&2
        exit 1
    }
    if ! rustup target list --installed 2>/dev/null | grep -qx "$triple"; then
        rustup target add "$triple"
    fi
    # rustc links with cc by default, the build machine's; the cross gcc brings the target's
    # crt files and static glibc. ring's and psm's build scripts (the cc crate) would guess
    # this compiler from the triple; naming it makes a missing one fail here, not there.
    triple_env=$(echo "$triple" | tr 'a-z-' 'A-Z_')
    triple_cc=$(echo "$triple" | tr '-' '_')
    export "CARGO_TARGET_${triple_env}_LINKER=$gnu-gcc" "CC_${triple_cc}=$gnu-gcc" "AR_${triple_cc}=$gnu-ar"
    strip=$gnu-strip
fi
cargo build --release --locked -p h3-ingress --target "$triple" --bin h3-ingress
mkdir -p "$(dirname "$out")"
built="$CARGO_TARGET_DIR/$triple/release/h3-ingress"
cp "$built" "$out"
# The release profile builds without debug info; stripping it again keeps the image small even
# if a developer turns it back on. Symbols stay, so a panic still names its functions.
"$strip" --strip-debug "$out"
echo "built $out ($arch, $(du -h "$out" | cut -f1))"
