#!/usr/bin/env bash
# Builds (or finds in the cache) the monitoring stack of the cluster tests, from Go modules: the
# Prometheus Operator and its prometheus-config-reloader
# (github.com/prometheus-operator/prometheus-operator) and the Prometheus server
# (github.com/prometheus/prometheus), then their OCI images (tests/cluster/promop/images.py).
#
#   scripts/promop-build.sh            build once; prints the cache directory on stdout
#   scripts/promop-build.sh dir        print the cache directory of the current key (no build)
#
# The versions are pinned by the wrapper modules tests/cluster/promop (the operator's release)
# and tests/cluster/promop/prometheus (a Prometheus its compatibility matrix lists,
# pkg/operator/defaults.go: the operator passes flags by the Prometheus version it is told, so
# the Prometheus object's spec.version must be this one), one per project so that each binary
# builds with the dependency versions its release has (in one module the operator's client-go
# 0.33 broke Prometheus 3.5's Kubernetes discovery, written for 0.32). The server is built
# without its web UI assets (the module has only their sources; the API answers, the UI pages
# do not).
# $CACHE/promop-<key>/ holds bin/ (operator, prometheus-config-reloader, prometheus), images/
# (one OCI layout each), versions (shell lines) and build-info; the key hashes both modules'
# go.mod and go.sum, the image assembly scripts, the Go version and the flags below; `.complete` marks a finished
# build. Environment: H3I_CLUSTER_CACHE (default /var/cache/h3-ingress), as scripts/cluster.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
SRC=$REPO/tests/cluster/promop
MODDIRS=(. prometheus)
OPERATOR_MOD=github.com/prometheus-operator/prometheus-operator
PROMETHEUS_MOD=github.com/prometheus/prometheus

log() { printf 'promop-build: %s\n' "$*" >&2; }
die() { printf 'promop-build: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "no go on PATH (Go 1.26 builds the monitoring stack)"
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0

# The version of MODULE as the wrapper module in DIR resolves it (its go.mod pins it).
modver() { (cd "$SRC/$1" && go list -m -f '{{.Version}}' "$2"); }
OPERATOR_VERSION=$(modver . $OPERATOR_MOD)
PROMETHEUS_MODVER=$(modver prometheus $PROMETHEUS_MOD)
# Prometheus 3.x is published as module v0.3MM.P: v0.305.0 is 3.5.0.
[[ $PROMETHEUS_MODVER =~ ^v0\.([0-9])([0-9][0-9])\.([0-9]+)$ ]] || die "unexpected $PROMETHEUS_MOD version $PROMETHEUS_MODVER"
PROMETHEUS_VERSION=v${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}

# What their Makefiles stamp (github.com/prometheus/common/version), from the module versions.
stamp() { # VERSION-WITHOUT-v BRANCH
    local v=github.com/prometheus/common/version
    echo "-s -w -X $v.Version=$1 -X $v.Revision=module -X $v.Branch=$2 -X $v.BuildUser=h3-ingress-tests -X $v.BuildDate=module"
}
OPERATOR_LDFLAGS=$(stamp "${OPERATOR_VERSION#v}" "$OPERATOR_VERSION")
PROMETHEUS_LDFLAGS=$(stamp "${PROMETHEUS_VERSION#v}" "$PROMETHEUS_VERSION")
# Pure Go (CGO_ENABLED=0) with Go's own resolver, as upstream builds all three.
TAGS=netgo

promop_key() {
    (
        cd "$SRC"
        for d in "${MODDIRS[@]}"; do cat "$d/go.mod" "$d/go.sum"; done | sha256sum
        cat images.py "$REPO/scripts/image/oci.py" | sha256sum
        go version
        echo "$OPERATOR_LDFLAGS|$PROMETHEUS_LDFLAGS|$TAGS|$CGO_ENABLED"
    ) | sha256sum | cut -c1-12
}
DIR=$CACHE/promop-$(promop_key)

if [[ ${1:-} == dir ]]; then
    echo "$DIR"
    exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [dir]"

declare -A SECONDS_OF=()
gobuild() { # DIR WHAT LDFLAGS PACKAGE...
    local dir=$1 what=$2 ldflags=$3 t0
    shift 3
    t0=$(date +%s)
    log "$what: building"
    (cd "$SRC/$dir" && nice -n 10 go build -trimpath -tags "$TAGS" -ldflags="$ldflags" -o "$tmp/bin/" "$@")
    SECONDS_OF[$what]=$(($(date +%s) - t0))
    log "$what: ${SECONDS_OF[$what]} s"
}

build() {
    if [[ -f $DIR/.complete ]]; then
        log "cached in $DIR"
        echo "$DIR"
        return
    fi
    local t0 t1 t2 t3 tmp=$DIR.tmp dl_before dl_after w
    t0=$(date +%s)
    dl_before=$(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0)
    log "downloading modules into $GOMODCACHE"
    for d in "${MODDIRS[@]}"; do (cd "$SRC/$d" && go mod download); done
    dl_after=$(du -sm "$GOMODCACHE/cache/download" | cut -f1)
    t1=$(date +%s)
    rm -rf "$tmp" && mkdir -p "$tmp/bin"
    gobuild . "operator+config-reloader $OPERATOR_VERSION" "$OPERATOR_LDFLAGS" \
        $OPERATOR_MOD/cmd/operator $OPERATOR_MOD/cmd/prometheus-config-reloader
    gobuild prometheus "prometheus $PROMETHEUS_VERSION" "$PROMETHEUS_LDFLAGS" $PROMETHEUS_MOD/cmd/prometheus
    t2=$(date +%s)
    python3 "$SRC/images.py" --bin "$tmp/bin" --out "$tmp/images" \
        --operator-version "${OPERATOR_VERSION#v}" --prometheus-version "${PROMETHEUS_VERSION#v}" >"$tmp/images.json"
    t3=$(date +%s)
    printf 'OPERATOR_VERSION=%s\nPROMETHEUS_VERSION=%s\n' "$OPERATOR_VERSION" "$PROMETHEUS_VERSION" >"$tmp/versions"
    {
        printf 'operator_version=%s\nprometheus_version=%s\n' "$OPERATOR_VERSION" "$PROMETHEUS_VERSION"
        printf 'download_seconds=%s\ndownload_mb_added=%s\nbuild_seconds=%s\nimages_seconds=%s\n' \
            $((t1 - t0)) $((dl_after - dl_before)) $((t2 - t1)) $((t3 - t2))
        for w in "${!SECONDS_OF[@]}"; do printf 'seconds[%s]=%s\n' "$w" "${SECONDS_OF[$w]}"; done | sort
        printf 'bin_mb=%s\nimages_mb=%s\nbuilt_at=%s\nnproc=%s\nloadavg_after=%s\ngo=%s\n' \
            "$(du -sm "$tmp/bin" | cut -f1)" "$(du -sm "$tmp/images" | cut -f1)" "$(date -u +%FT%TZ)" \
            "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(go env GOVERSION)"
    } >"$tmp/build-info"
    rm -rf "$DIR" && mv "$tmp" "$DIR"
    touch "$DIR/.complete"
    log "built in $((t3 - t0)) s (download $((t1 - t0)) s; compile $((t2 - t1)) s; images $((t3 - t2)) s) into $DIR"
    echo "$DIR"
}

mkdir -p "$CACHE"
exec 8>"$CACHE/.promop-build.lock"
flock 8
build
