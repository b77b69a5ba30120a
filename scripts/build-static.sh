#!/bin/sh
# Builds the h3-ingress binary the container image ships: release profile, locked dependencies,
# glibc linked statically (no musl target can be installed on the build machines), the product
# package only (the TUN network lab is the workspace's other package, a test tool).
#
#   scripts/build-static.sh [OUTPUT]     default OUTPUT: target/static/h3-ingress
#
# The Dockerfile's build stage runs exactly this script; tests/observe/dockerfile_check.py runs it
# too and proves the result is a static executable that starts with nothing else on disk.
set -eu
cd "$(dirname "$0")/.."
out=${1:-target/static/h3-ingress}
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/static}"
# crt-static links glibc (and libgcc) into the executable; ring and our code need nothing else.
export RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static"
cargo build --release --locked -p h3-ingress --target x86_64-unknown-linux-gnu --bin h3-ingress
mkdir -p "$(dirname "$out")"
built="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/h3-ingress"
cp "$built" "$out"
# The release profile builds without debug info; stripping it again keeps the image small even
# if a developer turns it back on. Symbols stay, so a panic still names its functions.
strip --strip-debug "$out"
echo "built $out ($(du -h "$out" | cut -f1))"
