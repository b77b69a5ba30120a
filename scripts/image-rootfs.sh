#!/bin/sh
# Writes the image's filesystem apart from the binary: the few files a static binary on an empty
# root still reads. The Dockerfile's build stage runs exactly this script and its runtime stage
# (FROM scratch) copies the result to /; scripts/image.sh runs it too, so the image assembled
# without a Docker engine has the same files (tests/observe/image_check.py holds them together).
#
#   scripts/image-rootfs.sh DIR          DIR must not exist or be empty
#
# - /etc/passwd, /etc/group: the non-root user 65532 ("nonroot", the name distroless uses and
#   the operator's DaemonSet assumes) has a name, so nothing that looks it up fails; its home
#   is /nonexistent, as Debian gives system users: the root filesystem is read-only anyway;
# - /etc/nsswitch.conf: glibc's resolver (linked in statically) reads /etc/hosts before DNS;
# - /etc/ssl/certs/ca-certificates.crt: Debian's CA bundle, read by `upstream.verify: system`
#   and by the kube client, whose TLS setup refuses to start without system roots;
# - /tmp, world-writable and sticky, as every Linux program may expect.
# Kubernetes mounts /etc/hosts, /etc/resolv.conf and the service account itself.
set -eu
dir=${1:?usage: $0 DIR}
bundle=/etc/ssl/certs/ca-certificates.crt
[ -s "$bundle" ] || { echo "image-rootfs.sh: $bundle missing (install ca-certificates)" >&2; exit 1; }
if [ -d "$dir" ] && [ -n "$(ls -A "$dir")" ]; then
    echo "image-rootfs.sh: $dir is not empty" >&2
    exit 1
fi
umask 022
mkdir -p "$dir/etc/ssl/certs" "$dir/tmp"
chmod 1777 "$dir/tmp"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >"$dir/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$dir/etc/group"
printf '%s\n' 'hosts: files dns' >"$dir/etc/nsswitch.conf"
cp "$bundle" "$dir/etc/ssl/certs/ca-certificates.crt"
chmod 644 "$dir/etc/passwd" "$dir/etc/group" "$dir/etc/nsswitch.conf" "$dir/etc/ssl/certs/ca-certificates.crt"
