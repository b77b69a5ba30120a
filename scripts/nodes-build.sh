#!/usr/bin/env bash
# Builds (or finds in the cache) what a real Kubernetes node needs, from Go modules:
# kubelet and kube-proxy (k8s.io/kubernetes, the control plane's version), containerd,
# containerd-shim-runc-v2 and ctr (github.com/containerd/containerd/v2), runc
# (github.com/opencontainers/runc, cgo with Debian's libseccomp) and the CNI reference
# plugins bridge, host-local, loopback and portmap (github.com/containernetworking/plugins).
#
#   scripts/nodes-build.sh            build once; prints the bin directory on stdout
#   scripts/nodes-build.sh bin        print the bin directory of the current key (no build)
#
# The versions are pinned by the wrapper modules under tests/cluster/nodes/ (one per
# upstream project, so each binary builds with the dependency versions its release was
# tested with; the kubelet's module pins the same versions as tests/cluster/controlplane,
# so the packages both builds share come from the Go build cache). The cache directory
# $CACHE/nodes-<key>/bin is keyed by every go.mod/go.sum there, the Go version and the
# flags below; `.complete` marks a finished build, `build-info` records its cost.
# Environment: H3I_CLUSTER_CACHE (default /var/cache/h3-ingress), as scripts/cluster.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
SRC=$REPO/tests/cluster/nodes
MODDIRS=(. containerd runc cni)
CNI_PLUGINS=(main/bridge ipam/host-local main/loopback meta/portmap)

log() { printf 'nodes-build: %s\n' "$*" >&2; }
die() { printf 'nodes-build: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "no go on PATH (Go 1.26 builds the node binaries)"
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local

# The version of MODULE as the wrapper module in DIR resolves it (its go.mod pins it).
modver() { (cd "$SRC/$1" && go list -m -f '{{.Version}}' "$2"); }

K8S_VERSION=$(modver . k8s.io/kubernetes)
CONTAINERD_VERSION=$(modver containerd github.com/containerd/containerd/v2)
RUNC_VERSION=$(modver runc github.com/opencontainers/runc)
CNI_VERSION=$(modver cni github.com/containernetworking/plugins)

# kubelet/kube-proxy: stamped as scripts/cluster.sh stamps the control plane (the kubelet
# reports its version in the Node's status and the API server's version skew checks read it).
k8s_minor=${K8S_VERSION#v1.}
k8s_minor=${k8s_minor%%.*}
K8S_LDFLAGS="-s -w"
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$k8s_minor -X $v.gitTreeState=clean"
done
# containerd: what its Makefile stamps (there from git describe; here the module version).
# Pure Go (CGO_ENABLED=0): the only cgo part is the btrfs snapshotter, left out (no_btrfs).
CTRD_PKG=github.com/containerd/containerd/v2
CTRD_LDFLAGS="-s -w -X $CTRD_PKG/version.Version=$CONTAINERD_VERSION -X $CTRD_PKG/version.Package=$CTRD_PKG"
CTRD_TAGS="urfave_cli_no_docs no_btrfs"
CTRD_SHIM_TAGS="$CTRD_TAGS no_grpc" # as its Makefile builds the shim
# runc: cgo for libseccomp (tag seccomp, as its Makefile); its version is embedded from
# the module's VERSION file. No libpathrs tag: that needs the Rust libpathrs library,
# which Debian 12 does not ship; runc then uses its pure-Go pathrs-lite.
RUNC_LDFLAGS="-s -w"
RUNC_TAGS="seccomp urfave_cli_no_docs"
CNI_LDFLAGS="-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VERSION"

nodes_key() {
    (
        cd "$SRC"
        for d in "${MODDIRS[@]}"; do cat "$d/go.mod" "$d/go.sum"; done | sha256sum
        go version
        echo "$K8S_LDFLAGS|$CTRD_LDFLAGS|$CTRD_TAGS|$CTRD_SHIM_TAGS|$RUNC_LDFLAGS|$RUNC_TAGS|$CNI_LDFLAGS|${CNI_PLUGINS[*]}"
    ) | sha256sum | cut -c1-12
}
BIN=$CACHE/nodes-$(nodes_key)/bin

if [[ ${1:-} == bin ]]; then
    echo "$BIN"
    exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [bin]"

need_libseccomp() {
    pkg-config --exists libseccomp 2>/dev/null && return
    if ! command -v apt-get >/dev/null || [[ $(id -u) -ne 0 ]]; then
        die "runc needs libseccomp-dev and pkg-config (apt-get install libseccomp-dev pkg-config)"
    fi
    log "installing libseccomp-dev pkg-config (runc links libseccomp)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q libseccomp-dev pkg-config >&2
}

# gobuild DIR OUT ENV... -- GO-BUILD-ARGS...: one timed, niced go build in a wrapper module.
declare -A SECONDS_OF=()
gobuild() {
    local dir=$1 what=$2 t0
    shift 2
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    t0=$(date +%s)
    log "$what: building"
    (cd "$SRC/$dir" && env "${envs[@]}" nice -n 10 go build -trimpath "$@")
    SECONDS_OF[$what]=$(($(date +%s) - t0))
    log "$what: ${SECONDS_OF[$what]} s"
}

build() {
    if [[ -f $BIN/.complete ]]; then
        log "cached in $BIN"
        echo "$BIN"
        return
    fi
    need_libseccomp
    local t0 t1 t2 tmp=$BIN.tmp dl_before dl_after
    t0=$(date +%s)
    dl_before=$(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0)
    log "downloading modules into $GOMODCACHE"
    for d in "${MODDIRS[@]}"; do (cd "$SRC/$d" && go mod download); done
    dl_after=$(du -sm "$GOMODCACHE/cache/download" | cut -f1)
    t1=$(date +%s)
    rm -rf "$tmp" && mkdir -p "$tmp/cni"
    gobuild . "kubelet+kube-proxy $K8S_VERSION" -- -ldflags="$K8S_LDFLAGS" -o "$tmp/" \
        k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
    gobuild containerd "containerd+ctr $CONTAINERD_VERSION" CGO_ENABLED=0 -- -tags "$CTRD_TAGS" \
        -ldflags="$CTRD_LDFLAGS" -o "$tmp/" "$CTRD_PKG/cmd/containerd" "$CTRD_PKG/cmd/ctr"
    gobuild containerd "containerd-shim-runc-v2 $CONTAINERD_VERSION" CGO_ENABLED=0 -- -tags "$CTRD_SHIM_TAGS" \
        -ldflags="$CTRD_LDFLAGS" -o "$tmp/" "$CTRD_PKG/cmd/containerd-shim-runc-v2"
    gobuild runc "runc $RUNC_VERSION" CGO_ENABLED=1 -- -tags "$RUNC_TAGS" -ldflags="$RUNC_LDFLAGS" \
        -o "$tmp/runc" github.com/opencontainers/runc
    local p pkgs=()
    for p in "${CNI_PLUGINS[@]}"; do pkgs+=("github.com/containernetworking/plugins/plugins/$p"); done
    gobuild cni "CNI plugins $CNI_VERSION" CGO_ENABLED=0 -- -ldflags="$CNI_LDFLAGS" -o "$tmp/cni/" "${pkgs[@]}"
    t2=$(date +%s)
    local w
    {
        printf 'k8s_version=%s\ncontainerd_version=%s\nrunc_version=%s\ncni_plugins_version=%s\n' \
            "$K8S_VERSION" "$CONTAINERD_VERSION" "$RUNC_VERSION" "$CNI_VERSION"
        printf 'download_seconds=%s\ndownload_mb_added=%s\nbuild_seconds=%s\n' \
            $((t1 - t0)) $((dl_after - dl_before)) $((t2 - t1))
        for w in "${!SECONDS_OF[@]}"; do printf 'seconds[%s]=%s\n' "$w" "${SECONDS_OF[$w]}"; done | sort
        printf 'bin_mb=%s\nbuilt_at=%s\nnproc=%s\nloadavg_after=%s\ngo=%s\n' \
            "$(du -sm "$tmp" | cut -f1)" "$(date -u +%FT%TZ)" "$(nproc)" \
            "$(cut -d' ' -f1-3 /proc/loadavg)" "$(go env GOVERSION)"
    } >"$tmp/build-info"
    rm -rf "$BIN" && mv "$tmp" "$BIN"
    touch "$BIN/.complete"
    log "built in $((t2 - t0)) s (download $((t1 - t0)) s; compile $((t2 - t1)) s) into $BIN"
    echo "$BIN"
}

mkdir -p "$CACHE"
exec 8>"$CACHE/.nodes-build.lock"
flock 8
build
