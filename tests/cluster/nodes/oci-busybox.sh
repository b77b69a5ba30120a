#!/usr/bin/env bash
# Writes a one-layer OCI image layout tar holding Debian's static busybox and a static
# pause program (pause.c here), for `ctr images import` (no registry, no pull):
# /bin/busybox plus /bin/sh, /bin/sleep, ... as symlinks, /pause, and /etc/passwd,
# /etc/group for root.
#
#   tests/cluster/nodes/oci-busybox.sh OUT.tar [REF]           image command /bin/sh
#   tests/cluster/nodes/oci-busybox.sh --pause OUT.tar [REF]   entrypoint /pause: the
#                                                              CRI sandbox image
# REF defaults to registry.h3i.test/busybox:1 (registry.h3i.test/pause:1 with --pause).
# Needs /bin/busybox from busybox-static (apt-get install busybox-static), gcc with a
# static libc (libc6-dev), tar, sha256sum.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
pause=false
if [[ ${1:-} == --pause ]]; then
    pause=true
    shift
fi
out=${1:?usage: $0 [--pause] OUT.tar [REF]}
if $pause; then
    ref=${2:-registry.h3i.test/pause:1}
    process='"Entrypoint":["/pause"]'
else
    ref=${2:-registry.h3i.test/busybox:1}
    process='"Cmd":["/bin/sh"]'
fi
bb=/bin/busybox
file "$bb" 2>/dev/null | grep -q 'statically linked' ||
    ldd "$bb" 2>&1 | grep -q 'not a dynamic' || {
    echo "oci-busybox: $bb is not static (apt-get install busybox-static)" >&2
    exit 1
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
mkdir -p "$root"/{bin,etc,tmp,proc,sys,dev,root} "$work/layout/blobs/sha256"
cp "$bb" "$root/bin/busybox"
gcc -O2 -static -o "$root/pause" "$here/pause.c"
for applet in sh ls cat echo sleep ps ip ifconfig hostname id wget nc env date mkdir true false; do
    ln -s busybox "$root/bin/$applet"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
chmod 1777 "$root/tmp"

# The layer: an uncompressed tar with fixed owners and times, so the digest is stable.
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$root" -cf "$work/layer.tar" .
blob() { # FILE MEDIATYPE -> prints a descriptor JSON and stores the blob
    local d s
    d=$(sha256sum "$1" | cut -d' ' -f1)
    s=$(stat -c %s "$1")
    cp "$1" "$work/layout/blobs/sha256/$d"
    printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$2" "$d" "$s"
}
diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
layer=$(blob "$work/layer.tar" application/vnd.oci.image.layer.v1.tar)
printf '{"architecture":"%s","os":"linux","config":{"Env":["PATH=/bin"],%s,"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["%s"]},"history":[{"created_by":"tests/cluster/nodes/oci-busybox.sh"}]}' \
    "$(go env GOARCH 2>/dev/null || echo amd64)" "$process" "$diff_id" >"$work/config.json"
config=$(blob "$work/config.json" application/vnd.oci.image.config.v1+json)
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
    "$config" "$layer" >"$work/manifest.json"
manifest=$(blob "$work/manifest.json" application/vnd.oci.image.manifest.v1+json)
printf '{"schemaVersion":2,"manifests":[%s]}' \
    "${manifest%\}},\"annotations\":{\"io.containerd.image.name\":\"$ref\",\"org.opencontainers.image.ref.name\":\"${ref##*:}\"}}" \
    >"$work/layout/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/layout/oci-layout"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/layout" -cf "$out" .
echo "oci-busybox: $out ($ref, $(stat -c %s "$out") bytes)" >&2
