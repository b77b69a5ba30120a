#!/usr/bin/env bash
# Builds (or finds in the cache) the cluster add-ons of the real nodes, from Go modules:
# Traefik (tests/cluster/traefik: the ingress controller of tests/cluster/traefik.sh) and
# CoreDNS (tests/cluster/coredns: the cluster DNS of scripts/cluster-nodes.sh). Each is one
# static binary (CGO_ENABLED=0, -trimpath, -s -w, its version stamped as its release build
# stamps it) and an OCI image FROM scratch: the binary and scripts/image-rootfs.sh's files
# (CA bundle, passwd/group, /tmp), assembled by scripts/image/oci.py as an archive for
# `ctr images import`.
#
#   scripts/addons-build.sh [NAME...]     build what is missing (default: traefik coredns);
#                                         prints each NAME's directory
#   scripts/addons-build.sh dir NAME      that directory for the current key (no build)
#   scripts/addons-build.sh image NAME    the image archive (assembled when missing; the
#                                         binary must be built); NAME.ref beside it holds
#                                         its reference and manifest digest
#   scripts/addons-build.sh src traefik DIR
#                                         the Traefik build tree in DIR (for `go mod tidy`
#                                         there after a version change)
#
# $CACHE/NAME-<key>/: bin/NAME, build-info (the build's cost), .complete, and
# image-<key2>/NAME.oci.tar + NAME.ref (registry.h3i.test/NAME:VERSION and its digest).
# <key> hashes the wrapper module's files (for Traefik also the files added to module copies
# and the copies' versions), the Go version and the flags; <key2> hashes <key>, the CA
# bundle, image-rootfs.sh, oci.py and the image spec, so a change to the image alone does
# not rebuild the binary. One flock per NAME.
# Environment: H3I_CLUSTER_CACHE (default /var/cache/h3-ingress), as scripts/cluster.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
ALL=(traefik coredns)

log() { printf 'addons-build: %s\n' "$*" >&2; }
die() { printf 'addons-build: ERROR: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null || die "no go on PATH (Go 1.26 builds the add-ons)"
export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local CGO_ENABLED=0

# The version of MODULE required by the go.mod in DIR (read from the file: `go list -m`
# would load the module graph, whose replaced directories exist only in a build tree).
# Both forms: `require M V` and a line `M V` of a require block.
req_version() {
    local v
    v=$(awk -v m="$2" '$1 == "require" {$0 = substr($0, index($0, $2))} $1 == m && $2 ~ /^v/ {print $2; exit}' "$1/go.mod")
    [[ -n $v ]] || die "$1/go.mod requires no $2"
    echo "$v"
}

# ---- Traefik ---------------------------------------------------------------------------------
TRAEFIK_SRC=$REPO/tests/cluster/traefik
TRAEFIK_PKG=github.com/traefik/traefik/v3
# Served modules copied into the build tree (module@version directory), then the files of
# _added/<directory>/ put into the copy (go.mod's header says why). Lego's version must be
# the one Traefik requires; go-http-auth's is upstream's latest, which Traefik's fork
# github.com/containous/go-http-auth was made from.
TRAEFIK_COPIES=(
    "github.com/go-acme/lego/v5@v5.4.1 lego"
    "github.com/abbot/go-http-auth@v0.4.1-0.20220112235402-e1cee1c72f2f go-http-auth"
)
# Replaced, not only added to: lego's generated registry importing every DNS provider.
TRAEFIK_DROP=(lego/providers/dns/zz_gen_dns_providers.go lego/providers/dns/dns_providers_test.go)
# As Traefik's Makefile and .goreleaser.yml stamp a release (filled in at build time from
# the module: the codename of its release workflow, the version's commit time).
TRAEFIK_LDFLAGS_FMT="-s -w -X $TRAEFIK_PKG/pkg/version.Version=%s -X $TRAEFIK_PKG/pkg/version.Codename=%s -X $TRAEFIK_PKG/pkg/version.BuildDate=%s"

# ---- CoreDNS ---------------------------------------------------------------------------------
COREDNS_SRC=$REPO/tests/cluster/coredns
COREDNS_PKG=github.com/coredns/coredns
# CoreDNS's version is a constant of coremain; its Makefile also stamps coremain.GitCommit,
# which a module download does not know (the registry gives no commit): left empty.
COREDNS_LDFLAGS="-s -w"

src_of() { case $1 in traefik) echo "$TRAEFIK_SRC" ;; coredns) echo "$COREDNS_SRC" ;; *) die "unknown add-on '$1' (traefik, coredns)" ;; esac; }

key_of() {
    local name=$1 src
    src=$(src_of "$name")
    (
        cd "$src"
        find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum \) | LC_ALL=C sort | xargs sha256sum
        go version
        echo "CGO_ENABLED=$CGO_ENABLED -trimpath"
        case $name in
            traefik) printf '%s\n' "${TRAEFIK_COPIES[@]}" "${TRAEFIK_DROP[@]}" "$TRAEFIK_LDFLAGS_FMT" ;;
            coredns) echo "$COREDNS_LDFLAGS" ;;
        esac
    ) | sha256sum | cut -c1-12
}
dir_of() { echo "$CACHE/$1-$(key_of "$1")"; }

# Downloads MODULE@VERSION into the module cache (outside any module, so no go.mod is
# consulted) and prints one field of `go mod download -json` (Dir, Sum) or of its .info
# file (Time).
mod_field() {
    local empty
    empty=$(mktemp -d)
    (cd "$empty" && GOFLAGS=-mod=mod go mod download -json "$1") | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error"):
    sys.exit("addons-build: " + d["Error"])
print(json.load(open(d["Info"]))["Time"] if sys.argv[1] == "Time" else d[sys.argv[1]])' "$2"
    rmdir "$empty"
}

# The Traefik build tree: the wrapper module, the copied modules with our files added.
traefik_tree() {
    local out=$1 entry mod dir
    mkdir -p "$out"
    cp "$TRAEFIK_SRC/go.mod" "$TRAEFIK_SRC/go.sum" "$out/"
    cp -r "$TRAEFIK_SRC/ext" "$out/"
    for entry in "${TRAEFIK_COPIES[@]}"; do
        read -r mod dir <<<"$entry"
        rm -rf "${out:?}/$dir"
        cp -r "$(mod_field "$mod" Dir)" "$out/$dir"
        chmod -R u+w "$out/$dir"
    done
    local lego_want
    lego_want=$(req_version "$TRAEFIK_SRC" github.com/go-acme/lego/v5)
    [[ " ${TRAEFIK_COPIES[*]} " == *" github.com/go-acme/lego/v5@$lego_want "* ]] ||
        die "tests/cluster/traefik/go.mod requires lego $lego_want: update TRAEFIK_COPIES"
    for dir in "${TRAEFIK_DROP[@]}"; do rm -f "${out:?}/$dir"; done
    for dir in "$TRAEFIK_SRC"/_added/*/; do cp -r "$dir." "$out/$(basename "$dir")/"; done
}

declare -A SECONDS_OF=()
# timed WHAT COMMAND...: run it, record its seconds.
timed() {
    local what=$1 t0
    shift
    t0=$(date +%s)
    log "$what"
    "$@"
    SECONDS_OF[$what]=$(($(date +%s) - t0))
    log "$what: ${SECONDS_OF[$what]} s"
}

download_in() { (cd "$1" && go mod download); }
# build_in DIR GO-BUILD-ARGS...: niced, -trimpath (CGO_ENABLED=0 is exported above).
build_in() { (cd "$1" && shift && nice -n 10 go build -trimpath "$@"); }

# build_NAME TMP: the binary into TMP/bin/NAME; TMP/.version holds "VERSION REVISION"
# (the revision is the module's go.sum hash: the registry gives no commit).
build_traefik() {
    local tmp=$1 version codename date tree=$1/src
    version=$(req_version "$TRAEFIK_SRC" "$TRAEFIK_PKG")
    timed "Traefik $version: build tree (copies of lego and go-http-auth)" traefik_tree "$tree"
    codename=$(sed -n 's/^ *CODENAME: *\([a-z-]*\) *$/\1/p' "$(mod_field "$TRAEFIK_PKG@$version" Dir)/.github/workflows/release.yaml")
    date=$(mod_field "$TRAEFIK_PKG@$version" Time)
    [[ -n $codename && -n $date ]] || die "no codename or time for Traefik $version"
    timed "Traefik $version: download modules" download_in "$tree"
    # shellcheck disable=SC2059 # the format is ours
    timed "Traefik $version: compile" build_in "$tree" -ldflags="$(printf -- "$TRAEFIK_LDFLAGS_FMT" "$version" "$codename" "$date")" \
        -o "$tmp/bin/traefik" "$TRAEFIK_PKG/cmd/traefik"
    rm -rf "$tree"
    echo "$version $(mod_field "$TRAEFIK_PKG@$version" Sum)" >"$tmp/.version"
}

build_coredns() {
    local tmp=$1 version
    version=$(req_version "$COREDNS_SRC" "$COREDNS_PKG")
    timed "CoreDNS $version: download modules" download_in "$COREDNS_SRC"
    timed "CoreDNS $version: compile" build_in "$COREDNS_SRC" -ldflags="$COREDNS_LDFLAGS" -o "$tmp/bin/coredns" .
    echo "$version $(mod_field "$COREDNS_PKG@$version" Sum)" >"$tmp/.version"
}

build() {
    local name=$1 dir tmp t0 dl_before dl_after vr
    dir=$(dir_of "$name")
    if [[ -f $dir/.complete ]]; then
        log "$name: cached in $dir"
        return
    fi
    tmp=$dir.tmp
    rm -rf "$tmp" && mkdir -p "$tmp/bin"
    t0=$(date +%s)
    dl_before=$(du -sm "$GOMODCACHE/cache/download" 2>/dev/null | cut -f1 || echo 0)
    SECONDS_OF=()
    "build_$name" "$tmp"
    vr=$(cat "$tmp/.version")
    rm "$tmp/.version"
    dl_after=$(du -sm "$GOMODCACHE/cache/download" | cut -f1)
    file -b "$tmp/bin/$name" | grep -Eq 'statically linked' || die "$tmp/bin/$name is not static"
    local w
    {
        printf 'name=%s\nversion=%s\nrevision=%s\n' "$name" "${vr%% *}" "${vr#* }"
        for w in "${!SECONDS_OF[@]}"; do printf 'seconds[%s]=%s\n' "$w" "${SECONDS_OF[$w]}"; done | sort
        printf 'total_seconds=%s\ndownload_mb_added=%s\nbin_mb=%s\nbuilt_at=%s\nnproc=%s\nloadavg_after=%s\ngo=%s\n' \
            $(($(date +%s) - t0)) $((dl_after - dl_before)) "$(du -sm "$tmp/bin" | cut -f1)" \
            "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(go env GOVERSION)"
    } >"$tmp/build-info"
    rm -rf "$dir" && mv "$tmp" "$dir"
    touch "$dir/.complete"
    log "$name: built in $(($(date +%s) - t0)) s into $dir"
}

# ---- images ----------------------------------------------------------------------------------
# The image config beside the upstream Dockerfile's: Traefik's (alpine, root, /tmp a volume,
# port 80) and CoreDNS's (distroless nonroot 65532, workdir /, port 53).
image_spec() {
    local name=$1 version=$2
    python3 - "$name" "$version" <<'EOF'
import json, sys
name, version = sys.argv[1], sys.argv[2]
spec = {"from": "scratch", "layers": [["/rootfs/", "/", "rootfs"], [f"/{name}", f"/{name}", "binary"]],
        "user": "", "entrypoint": [f"/{name}"], "cmd": [], "env": [], "workdir": None,
        "exposed_ports": [], "volumes": [],
        "labels": {"org.opencontainers.image.title": name, "org.opencontainers.image.version": "${VERSION}",
                   "org.opencontainers.image.revision": "${REVISION}",
                   "org.opencontainers.image.description": f"{name} {version} for the h3-ingress test cluster (scripts/addons-build.sh)"}}
if name == "traefik":
    spec.update(exposed_ports=["80/tcp"], volumes=["/tmp"])
else:
    spec.update(user="65532:65532", workdir="/", exposed_ports=["53/tcp", "53/udp"])
print(json.dumps(spec, sort_keys=True))
EOF
}

image() {
    local name=$1 dir version revision spec key out work
    dir=$(dir_of "$name")
    [[ -f $dir/.complete ]] || die "$name: not built ($dir): run $0 $name"
    version=$(sed -n 's/^version=//p' "$dir/build-info")
    revision=$(sed -n 's/^revision=//p' "$dir/build-info")
    spec=$(image_spec "$name" "$version")
    # The binary is named by its directory's key (a build never changes it in place).
    key=$( (basename "$dir"; sha256sum /etc/ssl/certs/ca-certificates.crt "$REPO/scripts/image-rootfs.sh" \
        "$REPO/scripts/image/oci.py" | cut -d' ' -f1; echo "$spec") | sha256sum | cut -c1-12)
    out=$dir/image-$key
    if [[ ! -s $out/$name.oci.tar ]]; then
        work=$(mktemp -d)
        "$REPO/scripts/image-rootfs.sh" "$work/rootfs"
        mkdir -p "$out"
        python3 "$REPO/scripts/image/oci.py" --binary "$dir/bin/$name" --rootfs "$work/rootfs" \
            --version "$version" --revision "$revision" --name "registry.h3i.test/$name:$version" \
            --spec "$spec" --out "$work/oci" --tar "$out/$name.oci.tar.tmp" >"$work/summary.json"
        mv "$out/$name.oci.tar.tmp" "$out/$name.oci.tar"
        python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); print(s["name"], s["manifest"])' \
            "$work/summary.json" >"$out/$name.ref"
        rm -rf "$work"
        log "$name: image $(cat "$out/$name.ref") in $out"
    fi
    echo "$out/$name.oci.tar"
}

locked() {
    local name=$1
    mkdir -p "$CACHE"
    exec 7>"$CACHE/.$name-build.lock"
    flock 7
    build "$name"
    image "$name" >/dev/null
    flock -u 7
    exec 7>&-
    dir_of "$name"
}

case ${1:-} in
    dir) [[ $# -eq 2 ]] || die "usage: $0 dir NAME"; src_of "$2" >/dev/null; dir_of "$2" ;;
    image) [[ $# -eq 2 ]] || die "usage: $0 image NAME"; src_of "$2" >/dev/null; image "$2" ;;
    src) [[ $# -eq 3 && $2 == traefik ]] || die "usage: $0 src traefik DIR"; traefik_tree "$3" ;;
    -h | --help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2 ;;
    *)
        names=("$@")
        [[ $# -gt 0 ]] || names=("${ALL[@]}")
        for n in "${names[@]}"; do src_of "$n" >/dev/null; done
        for n in "${names[@]}"; do locked "$n"; done
        ;;
esac
