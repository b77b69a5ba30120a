#!/usr/bin/env bash
# The image as containerd sees it, with a private containerd (its own root, state and socket
# under a temporary directory; no CRI), so nothing of a running cluster is touched:
#   1. `ctr images import` of target/image/h3-ingress.oci.tar gives the manifest digest of
#      target/image/oci;
#   2. a pull from scripts/registry.sh without credentials is refused, with them it gives the
#      same digest;
#   3. the pulled image runs: ENTRYPOINT + CMD print the usage, `/h3-ingress crd` prints
#      crds/ exactly, and the process runs as 65532:65532 with the image's PATH.
#
#   tests/cluster/registry/ctr_check.sh BIN_DIR
#
# BIN_DIR holds containerd, ctr, containerd-shim-runc-v2 and runc. Needs root, the image made
# with H3I_IMAGE_REPOSITORY=$REGISTRY/h3-ingress scripts/image.sh and pushed with
# scripts/registry.sh push.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
cd "$REPO"
bin=${1:?usage: $0 BIN_DIR (containerd, ctr, containerd-shim-runc-v2, runc)}
bin=$(cd "$bin" && pwd)
for b in containerd ctr containerd-shim-runc-v2 runc; do [[ -x $bin/$b ]] || { echo "no $bin/$b" >&2; exit 1; }; done
archive=target/image/h3-ingress.oci.tar
layout=target/image/oci
fails=0
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

eval "$(scripts/registry.sh env)"
scripts/registry.sh status
read -r name digest < <(python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["manifests"][0]
print(m["annotations"]["io.containerd.image.name"], m["digest"])' "$layout/index.json")
[[ $name == "$REGISTRY/"* ]] || { echo "the image is $name, not in $REGISTRY (H3I_IMAGE_REPOSITORY=$REGISTRY/h3-ingress scripts/image.sh)" >&2; exit 1; }

dir=$(mktemp -d /tmp/h3i-ctr-check.XXXXXX)
mkdir -p "$dir/certs.d/$REGISTRY"
scripts/registry.sh hosts-toml >"$dir/certs.d/$REGISTRY/hosts.toml"
cat >"$dir/config.toml" <<EOF
version = 3
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
EOF
# The shim and runc are found on containerd's PATH.
export PATH=$bin:$PATH
setsid containerd --config "$dir/config.toml" >"$dir/containerd.log" 2>&1 </dev/null &
cpid=$!
cleanup() {
    kill "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null
    umount -R "$dir/root" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
ctr() { command ctr --address "$dir/containerd.sock" "$@" 2> >(grep -v DEPRECATION >&2); }
for _ in $(seq 50); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done

got=$(ctr -n import images import "$archive" >/dev/null && ctr -n import images ls | awk -v n="$name" '$1 == n {print $3}')
if [[ $got == "$digest" ]]; then ok "ctr images import $archive: $name $got"; else bad "ctr images import: '$got', want $digest"; fi

if out=$(ctr -n pull images pull --hosts-dir "$dir/certs.d" "$name" 2>&1); then
    bad "pull without credentials succeeded"
else
    if grep -q "authorization" <<<"$out"; then ok "pull without credentials refused: ${out##*: }"; else bad "pull without credentials: $out"; fi
fi
ctr -n pull images pull --hosts-dir "$dir/certs.d" --user "$REGISTRY_USER:$REGISTRY_PASSWORD" "$name" >/dev/null
got=$(ctr -n pull images ls | awk -v n="$name" '$1 == n {print $3}')
if [[ $got == "$digest" ]]; then ok "pull as $REGISTRY_USER: $got"; else bad "pull as $REGISTRY_USER: '$got', want $digest"; fi

out=$(ctr -n pull run --rm "$name" h3i-ctr-help 2>&1 || true)
if grep -q "^Usage: h3-ingress" <<<"$out"; then ok "run (ENTRYPOINT + CMD): prints the usage"; else bad "run: $out"; fi
if ctr -n pull run --rm "$name" h3i-ctr-crd /h3-ingress crd | tr -d '\r' | cmp -s - crds/http3listeners.h3-ingress.dev.yaml; then
    ok "run /h3-ingress crd: identical to crds/"
else
    bad "run /h3-ingress crd differs from crds/"
fi
ctr -n pull run -d "$name" h3i-ctr-uid /h3-ingress demo >/dev/null
sleep 2
pid=$(ctr -n pull tasks ls | awk '$1 == "h3i-ctr-uid" {print $2}')
ids=$(awk '/^Uid|^Gid/ {printf "%s:", $2}' "/proc/$pid/status" 2>/dev/null || true)
env=$(tr '\0' ' ' <"/proc/$pid/environ" 2>/dev/null || true)
if [[ $ids == "65532:65532:" ]]; then ok "process uid:gid ${ids%:}, env $env"; else bad "process uid/gid '$ids' is not 65532:65532"; fi
ctr -n pull tasks kill -s SIGKILL h3i-ctr-uid >/dev/null 2>&1 || true
for _ in $(seq 50); do ctr -n pull tasks rm h3i-ctr-uid >/dev/null 2>&1 && break; sleep 0.1; done
ctr -n pull containers rm h3i-ctr-uid >/dev/null 2>&1 || true

if [[ $fails -eq 0 ]]; then echo "ok: ctr_check"; else echo "FAIL: ctr_check ($fails)"; exit 1; fi
