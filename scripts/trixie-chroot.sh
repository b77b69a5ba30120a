#!/usr/bin/env bash
# Builds (idempotently) a Debian trixie chroot holding curl 8.14 (HTTP/3 via OpenSSL 3.5 QUIC) and
# nginx 1.26 (http_v3 module) for the lab benchmark. Bookworm's curl and nginx have no
# HTTP/3, and the lab compares against stock nginx QUIC, so we need newer userland without
# touching the host's packages. CI builds it too (tests/cluster/run.sh): its curl is the
# cluster journey's second HTTP/3 client.
#
# Usage: scripts/trixie-chroot.sh DIR        (root; DIR e.g. /work/trixie-root)
# Env:   MIRROR=http://...   override the mirror (default: the host's first non-security
#                            URIs from /etc/apt/sources.list.d/debian.sources)
set -euo pipefail

SUITE=trixie
# Packages installed inside the chroot; add here.
CHROOT_PACKAGES=(curl nginx ca-certificates)

die() { echo "trixie-chroot: $*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: $0 DIR"
DIR=$(realpath -m "$1")
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap and chroot)"
command -v debootstrap >/dev/null || die "debootstrap not installed (run scripts/setup.sh)"

host_mirror() {
    local src=/etc/apt/sources.list.d/debian.sources
    [[ -r $src ]] || return 1
    # deb822 stanzas: pick the URIs of the first stanza whose Suites are not *-security,
    # because the security archive does not carry the base suite debootstrap needs.
    awk '
        /^[[:space:]]*$/ { if (uri != "" && !sec) { print uri; exit } uri=""; sec=0; next }
        /^URIs:/   { uri=$2 }
        /^Suites:/ { for (i = 2; i <= NF; i++) if ($i ~ /-security$/) sec=1 }
        END        { if (uri != "" && !sec) print uri }
    ' "$src" | head -n1
}

MIRROR=${MIRROR:-$(host_mirror || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
echo "trixie-chroot: target $DIR, mirror $MIRROR"

is_complete_chroot() {
    # debootstrap removes DIR/debootstrap only when it finished, so its presence means a
    # previous run was interrupted and the tree cannot be trusted.
    [[ -x $DIR/usr/bin/apt-get && ! -e $DIR/debootstrap ]] &&
        grep -q "^VERSION_CODENAME=$SUITE\$" "$DIR/etc/os-release" 2>/dev/null
}

if is_complete_chroot; then
    echo "trixie-chroot: base system already present, skipping debootstrap"
else
    if [[ -e $DIR/debootstrap ]]; then
        echo "trixie-chroot: found an interrupted debootstrap in $DIR, resuming it"
    fi
    mkdir -p "$DIR"
    debootstrap --variant=minbase "$SUITE" "$DIR" "$MIRROR"
fi

cp /etc/hosts "$DIR/etc/hosts"
# resolv.conf may be a symlink into /run on the host; copy the content, not the link.
rm -f "$DIR/etc/resolv.conf"
cat /etc/resolv.conf >"$DIR/etc/resolv.conf"

# Package postinst scripts must not start nginx inside the chroot: the lab runs its own
# instances with its own configs, and a stray daemon would hold port 80.
cat >"$DIR/usr/sbin/policy-rc.d" <<'EOF'
#!/bin/sh
exit 101
EOF
chmod 0755 "$DIR/usr/sbin/policy-rc.d"

MOUNTED_PROC=0
cleanup() {
    if [[ $MOUNTED_PROC -eq 1 ]]; then umount "$DIR/proc" || true; fi
}
trap cleanup EXIT
if ! mountpoint -q "$DIR/proc"; then
    mount -t proc proc "$DIR/proc"
    MOUNTED_PROC=1
fi

missing=()
for p in "${CHROOT_PACKAGES[@]}"; do
    # shellcheck disable=SC2016 # ${Status} is dpkg-query's format, not a shell variable
    if ! chroot "$DIR" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing+=("$p")
    fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "trixie-chroot: installing in chroot: ${missing[*]}"
    chroot "$DIR" env DEBIAN_FRONTEND=noninteractive apt-get update
    chroot "$DIR" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "trixie-chroot: chroot packages already installed: ${CHROOT_PACKAGES[*]}"
fi

echo "trixie-chroot: curl --version (inside $DIR):"
chroot "$DIR" curl --version
echo "trixie-chroot: nginx -V (inside $DIR):"
chroot "$DIR" nginx -V 2>&1

# Fail loudly if the point of the chroot (HTTP/3 in both tools) is not met.
chroot "$DIR" curl --version | grep -q 'HTTP3' || die "chroot curl lacks HTTP3"
chroot "$DIR" nginx -V 2>&1 | grep -q -- '--with-http_v3_module' || die "chroot nginx lacks http_v3_module"
echo "trixie-chroot: OK"
