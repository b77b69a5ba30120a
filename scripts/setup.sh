#!/usr/bin/env bash
# Installs what the test suite needs on Debian 12 (root). Idempotent: anything already
# present is skipped, so it is safe to run before every test run and in CI.
#
#   scripts/setup.sh            install missing apt and pip packages
#   PYTHON=/path/python3 scripts/setup.sh   use that interpreter for the pip packages
#
# Rust: rustup's default (stable) toolchain is assumed; the fuzz targets also need rustup's
# nightly toolchain and cargo-fuzz, installed by `scripts/fuzz.sh install` below when missing.
#
# Services: the packages below ship daemons (nginx, caddy, prometheus, the exporter).
# Tests start their own private instances on free ports, so a system instance is only in
# the way (nginx would hold :80, caddy :80/:443). We block service starts during install
# and stop/disable any instance the packages started.
set -euo pipefail

# ---- package lists: add new requirements here ------------------------------------------
APT_PACKAGES=(
    nginx                     # the TCP ingress stand-in (tests/support NginxFixture)
    prometheus                # promtool checks our /metrics output
    prometheus-nginx-exporter # lab: compare against nginx's own metrics
    caddy                     # independent HTTP/3 server for the h3client self-test
    ngtcp2-client             # second independent HTTP/3 client (gtlsclient)
    knot                      # tests/dns_update.rs, tests/dns_advertise.rs, h3i-scenarios advertise: an authoritative server taking RFC 2136 updates
    knot-dnsutils             # ... and kdig, which reads its zone back
    debootstrap               # scripts/trixie-chroot.sh (lab only)
    iproute2                  # ip netns / ip link for lab and root tests
    nftables                  # packet-drop rules in root tests
    curl                      # HTTP/2 client for fixture checks
    openssl                   # RSA key generation (ring cannot), s_client cert checks
    chromium                  # tests/browser: a real browser over Alt-Svc and forced QUIC
    libnss3-tools             # certutil: the browser test's CA in a private NSS db
    busybox-static            # tests/cluster/nodes/oci-busybox.sh: the real nodes' busybox image
    gcc                       # ... and its static pause.c (the CRI sandbox image)
    libc6-dev
    libseccomp-dev            # scripts/nodes-build.sh: runc with seccomp (cgo)
    pkg-config
    gcc-aarch64-linux-gnu     # scripts/build-static.sh --arch arm64: the cross linker and C compiler (ring)
    libc6-dev-arm64-cross     # ... and the aarch64 glibc it links statically
    qemu-user-static          # tests/observe/arch_check.py: runs the arm64 binary here
    shellcheck                # scripts/test.sh: every shell script left passes it
    ca-certificates
    python3
    python3-venv              # fallback when the system python is externally managed
    python3-pip
)
# pip distribution name : import name (the import is how we detect it is present)
PIP_PACKAGES=(
    "aioquic:aioquic"                       # tests/py/h3client.py
    "kubernetes-validate==1.37.0:kubernetes_validate"  # pinned: tests/manifests/validate.sh checks against 1.37 (= k8s-openapi v1_37)
    "helm-python-sdk==0.2.2:helm_python"          # pinned: tests/observe/helmlib.py uses its native call
    "dockerfile:dockerfile"
    "pyyaml:yaml"
    "websockets:websockets"                 # tests/browser/chromium.py (DevTools protocol)
    "bcrypt:bcrypt"                         # scripts/registry.sh: the registry's htpasswd file
)
SERVICES=(nginx caddy prometheus prometheus-nginx-exporter knot)
# -----------------------------------------------------------------------------------------

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$REPO/.venv"
log() { echo "setup: $*"; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (apt-get)"

installed_apt=()
present_apt=()
missing_apt=()
for p in "${APT_PACKAGES[@]}"; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        present_apt+=("$p")
    else
        missing_apt+=("$p")
    fi
done

POLICY=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [[ $created_policy -eq 1 ]]; then rm -f "$POLICY"; fi
}
trap cleanup EXIT

if [[ ${#missing_apt[@]} -gt 0 ]]; then
    log "apt: installing ${missing_apt[*]}"
    # policy-rc.d exit 101 is Debian's documented way to stop maintainer scripts from
    # starting daemons (invoke-rc.d honours it, with or without systemd).
    if [[ ! -e $POLICY ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$POLICY"
        chmod 0755 "$POLICY"
        created_policy=1
    fi
    export DEBIAN_FRONTEND=noninteractive
    flock /tmp/apt.lock apt-get update -q
    flock /tmp/apt.lock apt-get install -y -q --no-install-recommends "${missing_apt[@]}"
    installed_apt=("${missing_apt[@]}")
fi

# Stop and disable daemons the packages may have started (e.g. installed before this
# script ran, or on a host where policy-rc.d was not honoured).
stopped=()
for svc in "${SERVICES[@]}"; do
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null; then
        if systemctl is-enabled --quiet "$svc" 2>/dev/null || systemctl is-active --quiet "$svc" 2>/dev/null; then
            systemctl disable --now "$svc" >/dev/null 2>&1 || true
            stopped+=("$svc")
        fi
    elif [[ -x /etc/init.d/$svc ]]; then
        # Without systemd the init script's status tells us whether its daemon runs; only
        # then do we stop it, so we never touch processes the script did not start.
        if /etc/init.d/"$svc" status >/dev/null 2>&1; then
            /etc/init.d/"$svc" stop >/dev/null 2>&1 || true
            stopped+=("$svc")
        fi
        if command -v update-rc.d >/dev/null; then
            update-rc.d "$svc" disable >/dev/null 2>&1 || true
        fi
    fi
done

# ---- python ------------------------------------------------------------------------------
py_missing() {
    # Prints the pip names whose import fails under interpreter $1.
    local py=$1 spec
    for spec in "${PIP_PACKAGES[@]}"; do
        if ! "$py" -c "import ${spec#*:}" >/dev/null 2>&1; then
            echo "${spec%%:*}"
        fi
    done
}
externally_managed() {
    "$1" -c 'import os, sys, sysconfig; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'
}

PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || die "no $PY"
installed_pip=()
pip_target=""
if [[ -z ${PYTHON:-} && -x $VENV/bin/python3 && -z $(py_missing "$VENV/bin/python3") ]]; then
    pip_target="$VENV/bin/python3 (existing venv)"
elif [[ -z $(py_missing "$PY") ]]; then
    pip_target="$(command -v "$PY")"
else
    if externally_managed "$PY"; then
        # PEP 668: Debian's python refuses system-wide pip installs, so the test
        # helpers get a venv inside the repo; tests/support picks .venv/bin/python3
        # automatically when it exists.
        if [[ ! -x $VENV/bin/python3 ]]; then
            log "pip: $PY is externally managed, creating $VENV"
            "$PY" -m venv "$VENV"
        fi
        PY=$VENV/bin/python3
    fi
    mapfile -t missing_pip < <(py_missing "$PY")
    if [[ ${#missing_pip[@]} -gt 0 ]]; then
        log "pip: installing ${missing_pip[*]} into $PY"
        "$PY" -m pip install -q "${missing_pip[@]}"
        installed_pip=("${missing_pip[@]}")
    fi
    still=$(py_missing "$PY")
    [[ -z $still ]] || die "pip packages still not importable with $PY: $still"
    pip_target="$PY"
fi

# ---- rust: the arm64 image binary's standard library ------------------------------------------
# scripts/build-static.sh --arch arm64 adds it too when missing; here so a CI image has it.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx aarch64-unknown-linux-gnu; then
    rustup target add aarch64-unknown-linux-gnu
fi

# ---- rust: the fuzz targets' nightly toolchain and cargo-fuzz -------------------------------
# scripts/fuzz.sh owns the pins and installs each only when missing (rustup, crates.io); it
# fails, and so does this script, when it cannot: the fuzz step never skips.
"$REPO/scripts/fuzz.sh" install

# ---- summary -----------------------------------------------------------------------------
log "apt installed now:   ${installed_apt[*]:-(none)}"
log "apt already present: ${present_apt[*]:-(none)}"
log "pip installed now:   ${installed_pip[*]:-(none)}"
log "python for tests:    $pip_target"
log "services stopped:    ${stopped[*]:-(none)}"
log "versions: $(nginx -v 2>&1 | tr -d '\n'); caddy $(caddy version 2>/dev/null | cut -d' ' -f1); $(curl --version | head -n1 | cut -d' ' -f1-2); $(chromium --version 2>/dev/null | cut -d' ' -f1-2); $(promtool --version 2>&1 | head -n1)"
