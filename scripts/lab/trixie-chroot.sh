#!/usr/bin/env bash
# The bench's client (curl 8.14 with HTTP/3) and peer (nginx 1.26 with http_v3) come from a
# Debian trixie chroot, because bookworm's curl and nginx have no HTTP/3.
#
# Usage: scripts/lab/trixie-chroot.sh DIR      (root; the bench's default DIR is /work/trixie-root)
#
# Uses the project's scripts/trixie-chroot.sh when it exists; otherwise builds the chroot itself
# with debootstrap (minbase) from the mirror of /etc/apt/sources.list.d/debian.sources.
set -euo pipefail

[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
[[ $(id -u) -eq 0 ]] || { echo "$0: needs root (debootstrap, chroot)" >&2; exit 1; }
dir=$(realpath -m "$1")
here=$(cd "$(dirname "$0")" && pwd)

if [[ -x $here/../trixie-chroot.sh ]]; then
    exec "$here/../trixie-chroot.sh" "$dir"
fi

mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

if [[ ! -x $dir/usr/bin/apt-get || -e $dir/debootstrap ]]; then
    echo "debootstrap trixie into $dir from $mirror"
    debootstrap --variant=minbase trixie "$dir" "$mirror"
fi
cp /etc/hosts "$dir/etc/hosts"
cp /etc/resolv.conf "$dir/etc/resolv.conf" 2>/dev/null || true
if ! chroot "$dir" sh -c 'command -v curl && command -v nginx' >/dev/null; then
    chroot "$dir" apt-get update
    # policy-rc.d keeps the package scripts from starting nginx inside the chroot.
    printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"
    chmod +x "$dir/usr/sbin/policy-rc.d"
    DEBIAN_FRONTEND=noninteractive chroot "$dir" apt-get install -y --no-install-recommends \
        curl nginx ca-certificates
fi
chroot "$dir" curl --version | head -n1
chroot "$dir" nginx -v
chroot "$dir" curl --version | grep -q HTTP3 || { echo "curl in $dir has no HTTP3" >&2; exit 1; }
