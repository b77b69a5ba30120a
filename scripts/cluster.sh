#!/usr/bin/env bash
# A throwaway Kubernetes control plane and two Linux nodes for the tests (root). Real
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and helm, built
# from Go modules once into a cache; the nodes are network namespaces whose pods
# tests/cluster/agent runs as local processes, or, with H3I_NODES=real, real kubelets,
# containerd and kube-proxy (scripts/cluster-nodes.sh). See tests/cluster/README.md.
#
#   scripts/cluster.sh build              build (or find in the cache) all binaries
#   scripts/cluster.sh up                 build, then start everything; a no-op health
#                                         check when it already runs
#   scripts/cluster.sh env                shell lines: eval "$(scripts/cluster.sh env)"
#   scripts/cluster.sh status             health of each component; exit 1 if unhealthy
#   scripts/cluster.sh restart-apiserver [SECONDS]
#                                         stop kube-apiserver, keep it down SECONDS
#                                         (default 0), start it, wait for /readyz
#   scripts/cluster.sh down               stop everything, remove namespaces and state
#   scripts/cluster.sh push-image         real nodes only: rebuild the product image and
#                                         push it to the instance's registry
#   scripts/cluster.sh import-addon NAME  real nodes only: import the image of NAME
#                                         (scripts/addons-build.sh: traefik, coredns) on
#                                         every node; prints its reference
#
# Environment: H3I_BINARY (the project binary run for the project's image; default
# target/debug/h3-ingress of this checkout), H3I_TAG_BINARIES (TAG=PATH,TAG=PATH: the
# binary run for the project's image under that tag instead, e.g. an earlier release's
# build; default none), H3I_CLUSTER_CACHE (default /var/cache/h3-ingress),
# H3I_CLUSTER_STATE (default /run/h3i-cluster).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
K8S_VERSION=v1.37.2 # these three must match tests/cluster/controlplane/go.mod
HELM_VERSION=v4.3.1
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
STATE=${H3I_CLUSTER_STATE:-/run/h3i-cluster}
BINARY=${H3I_BINARY:-$REPO/target/debug/h3-ingress}
[[ $BINARY == /* ]] || BINARY=$PWD/$BINARY
TAG_BINARIES=${H3I_TAG_BINARIES:-}
CP_SRC=$REPO/tests/cluster/controlplane
AGENT_SRC=$REPO/tests/cluster/agent

# ---- network: one bridge on the host, one namespace per node, pods on the bridge ------
# 10.77.0.0/24 and fd77::/64 sit beside the lab's 10.77.1.0/24, 10.77.2.0/24 and
# fd77:1::/64.. without overlapping them; check_subnets refuses any other overlap.
# Every instance constant can be overridden (H3I_CLUSTER_*) so that a second cluster runs
# beside the default one; the defaults are the default instance. LINK_PREFIX names the
# host-side veths and the agent's pod netns (h3ic-n1, h3ic-p-*): net_down and
# check_subnets only touch links of their own prefix.
LINK_PREFIX=${H3I_CLUSTER_LINK_PREFIX:-h3ic}
BRIDGE=${H3I_CLUSTER_BRIDGE:-$LINK_PREFIX-br0}
NET4=${H3I_CLUSTER_NET4:-10.77.0}
NET6=${H3I_CLUSTER_NET6:-fd77:}
HOST4=${H3I_CLUSTER_HOST4:-$NET4.254}
HOST6=${H3I_CLUSTER_HOST6:-${NET6}:fe}
read -r -a NODES <<<"${H3I_CLUSTER_NODES:-h3i-node-1 h3i-node-2}"
POD_FIRST=64
POD_LAST=250
APISERVER_PORT=${H3I_CLUSTER_APISERVER_PORT:-6443}
ETCD_PORT=${H3I_CLUSTER_ETCD_PORT:-23790}
KUBELET_PORT=${H3I_CLUSTER_KUBELET_PORT:-10250}
# Host-wide 127.0.0.1 ports of kube-controller-manager and kube-scheduler.
CM_PORT=${H3I_CLUSTER_CM_PORT:-10257}
SCHED_PORT=${H3I_CLUSTER_SCHED_PORT:-10259}
SERVICE_CIDRS=${H3I_CLUSTER_SERVICE_CIDRS:-10.96.0.0/16,fd77:96::/112}
SA_ISSUER=https://kubernetes.default.svc.cluster.local

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler h3i-node-agent)

log() { printf 'cluster: %s\n' "$*" >&2; }
die() { printf 'cluster: ERROR: %s\n' "$*" >&2; exit 1; }

# Nodes: the simulated agent (default) or, with H3I_NODES=real at the first `up`, real
# kubelets and containerd (scripts/cluster-nodes.sh). A running instance keeps its mode
# (the env output reuses H3I_NODES for the node names).
NODE_MODE=agent
if [[ -f $STATE/node-mode ]]; then
    NODE_MODE=$(cat "$STATE/node-mode")
elif [[ ${H3I_NODES:-} == real ]]; then
    NODE_MODE=real
fi
# The agent names pod netns and veths h3ic-p-*/h3icv* whatever the prefix, and every
# instance's net_down removes its prefix's: another prefix is for real nodes only.
[[ $NODE_MODE == real || $LINK_PREFIX == h3ic ]] ||
    die "H3I_CLUSTER_LINK_PREFIX=$LINK_PREFIX needs H3I_NODES=real (tests/cluster/agent hardcodes h3ic-p-*)"
if [[ $NODE_MODE == real ]]; then
    # shellcheck source=scripts/cluster-nodes.sh
    source "$REPO/scripts/cluster-nodes.sh"
    read -r -a COMPONENTS <<<"etcd kube-apiserver kube-controller-manager kube-scheduler $(rn_components | tr '\n' ' ')"
fi

node_ip4() { echo "$NET4.$(($1 + 1))"; }
node_ip6() { echo "${NET6}:$(($1 + 1))"; }

hash_files() { cat "$@" | sha256sum | cut -c1-12; }

# Release builds stamp their versions into the binaries; without them the API server
# reports v0.0.0-master and helm refuses charts with a kubeVersion constraint.
k8s_minor=${K8S_VERSION#v1.}
k8s_minor=${k8s_minor%%.*}
CP_LDFLAGS="-s -w"
for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    CP_LDFLAGS+=" -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$k8s_minor -X $v.gitTreeState=clean"
done
CP_LDFLAGS+=" -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

cp_key() { (cd "$CP_SRC" && hash_files go.mod go.sum etcd/main.go; go version; echo "$CP_LDFLAGS") | sha256sum | cut -c1-12; }
agent_key() { (cd "$AGENT_SRC" && hash_files go.mod go.sum ./*.go; go version) | sha256sum | cut -c1-12; }
cp_bin() { echo "$CACHE/k8s-$K8S_VERSION-$(cp_key)/bin"; }
agent_bin() { echo "$CACHE/agent-$(agent_key)/h3i-node-agent"; }
command -v go >/dev/null || die "no go on PATH (Go 1.26 builds the control plane)"
# The cache keys hash the module files and the Go version: computed once.
CP_BIN=$(cp_bin)
AGENT_BIN=$(agent_bin)

go_env() {
    export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local
}

# ---- build ------------------------------------------------------------------------------
build_controlplane() {
    local bin=$CP_BIN
    if [[ -f $bin/.complete ]]; then
        log "control plane: cached in $bin"
        return
    fi
    go_env
    local t0 t1 t2 dl
    t0=$(date +%s)
    log "control plane: downloading modules into $GOMODCACHE"
    (cd "$CP_SRC" && go mod download)
    t1=$(date +%s)
    dl=$(du -sm "$GOMODCACHE/cache/download" | cut -f1)
    log "control plane: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, helm (one go build; cold takes long)"
    mkdir -p "$bin.tmp"
    (cd "$CP_SRC" && nice -n 10 go build -trimpath -ldflags="$CP_LDFLAGS" -o "$bin.tmp/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
        helm.sh/helm/v4/cmd/helm ./etcd)
    t2=$(date +%s)
    rm -rf "$bin" && mv "$bin.tmp" "$bin"
    printf 'download_seconds=%s\ndownload_mb=%s\nbuild_seconds=%s\nbuilt_at=%s\nnproc=%s\nloadavg_after=%s\n' \
        $((t1 - t0)) "$dl" $((t2 - t1)) "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        >"$bin/build-info"
    touch "$bin/.complete"
    log "control plane: built in $((t2 - t0)) s (download $((t1 - t0)) s, $dl MB; compile $((t2 - t1)) s)"
}

build_agent() {
    local out=$AGENT_BIN
    if [[ -x $out ]]; then
        log "node agent: cached in $out"
        return
    fi
    go_env
    local t0; t0=$(date +%s)
    mkdir -p "$(dirname "$out")"
    (cd "$AGENT_SRC" && go mod download && nice -n 10 go build -trimpath -ldflags='-s -w' -o "$out.tmp" .)
    mv "$out.tmp" "$out"
    log "node agent: built in $(($(date +%s) - t0)) s"
}

cmd_build() {
    mkdir -p "$CACHE"
    exec 8>"$CACHE/.build.lock"
    flock 8
    build_controlplane
    if [[ $NODE_MODE == real ]]; then rn_build; else build_agent; fi
    flock -u 8
    # The registry takes the same lock itself (outside ours, or it would wait for us).
    if [[ $NODE_MODE == real ]]; then rn_registry build >&2; fi
}

# ---- certificates -------------------------------------------------------------------------
# mkcert NAME SUBJECT EXT: an ECDSA P-256 key and a certificate signed by the cluster CA.
mkcert() {
    local name=$1 subj=$2 ext=$3 d=$STATE/pki
    openssl ecparam -name prime256v1 -genkey -noout -out "$d/$name.key" 2>/dev/null
    openssl req -new -key "$d/$name.key" -subj "$subj" -out "$d/$name.csr" 2>/dev/null
    printf '%b\n' "$ext" >"$d/$name.ext"
    openssl x509 -req -in "$d/$name.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$d/$name.ext" -out "$d/$name.crt" 2>/dev/null
    rm -f "$d/$name.csr" "$d/$name.ext"
}

make_pki() {
    local d=$STATE/pki client server
    mkdir -p "$d" && chmod 700 "$d"
    openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$d/ca.key" -subj "/CN=h3i-cluster-ca" -days 30 -sha256 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$d/ca.crt" 2>/dev/null
    client='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth'
    server='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth'
    mkcert apiserver "/CN=kube-apiserver" "$server\nsubjectAltName=IP:127.0.0.1,IP:::1,IP:$HOST4,IP:$HOST6,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    mkcert etcd "/CN=etcd" "$server\nsubjectAltName=IP:127.0.0.1,DNS:localhost"
    mkcert apiserver-etcd-client "/CN=kube-apiserver-etcd-client" "$client"
    mkcert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    mkcert admin "/O=system:masters/CN=h3i-admin" "$client"
    mkcert controller-manager "/CN=system:kube-controller-manager" "$client"
    mkcert scheduler "/CN=system:kube-scheduler" "$client"
    local sans="" i
    for i in "${!NODES[@]}"; do
        mkcert "node-${NODES[$i]}" "/O=system:nodes/CN=system:node:${NODES[$i]}" "$client"
        sans+="IP:$(node_ip4 "$i"),IP:$(node_ip6 "$i"),DNS:${NODES[$i]},"
    done
    mkcert kubelet "/CN=h3i-node-agent" "$server\nsubjectAltName=${sans%,}"
    openssl genrsa -out "$d/sa.key" 2048 2>/dev/null
    openssl rsa -in "$d/sa.key" -pubout -out "$d/sa.pub" 2>/dev/null
}

# write_kubeconfig FILE CERTNAME SERVER
write_kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: h3i-cluster
  cluster:
    server: $3
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $STATE/pki/$2.crt
    client-key: $STATE/pki/$2.key
contexts:
- name: h3i-cluster
  context:
    cluster: h3i-cluster
    user: $2
current-context: h3i-cluster
EOF
    chmod 600 "$1"
}

# ---- network ------------------------------------------------------------------------------
check_subnets() {
    # Refuse to start when another route overlaps ours (the lab's must not).
    python3 - "$BRIDGE" "$LINK_PREFIX" "$NET4.0/24" "${NET6}:/64" <<'EOF'
import ipaddress, json, subprocess, sys
bridge, prefix, mine = sys.argv[1], sys.argv[2], [ipaddress.ip_network(n) for n in sys.argv[3:]]
bad = []
for fam in ("-4", "-6"):
    out = subprocess.run(["ip", "-j", fam, "route", "show", "table", "all"], capture_output=True, text=True).stdout
    for r in json.loads(out or "[]"):
        dst, dev = r.get("dst", ""), r.get("dev", "")
        if dst in ("default", "") or dev == bridge or dev.startswith(prefix) or r.get("type") in ("local", "broadcast", "multicast", "anycast"):
            continue
        try:
            net = ipaddress.ip_network(dst, strict=False)
        except ValueError:
            continue
        if net.prefixlen == 0:
            continue
        for m in mine:
            if net.version == m.version and net.overlaps(m):
                bad.append(f"{dst} dev {dev} overlaps {m}")
if bad:
    sys.exit("cluster: ERROR: subnet overlap: " + "; ".join(bad))
EOF
}

net_up() {
    check_subnets
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
        ip addr add "$HOST4/24" dev "$BRIDGE"
        ip -6 addr add "$HOST6/64" dev "$BRIDGE" nodad
        ip link set "$BRIDGE" up
    fi
    local i ns
    for i in "${!NODES[@]}"; do
        ns=${NODES[$i]}
        [[ -e /run/netns/$ns ]] && continue
        ip netns add "$ns"
        ip link add "$LINK_PREFIX-n$((i + 1))" type veth peer name eth0 netns "$ns"
        ip link set "$LINK_PREFIX-n$((i + 1))" master "$BRIDGE" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(node_ip4 "$i")/24" dev eth0
        ip -n "$ns" -6 addr add "$(node_ip6 "$i")/64" dev eth0 nodad
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$HOST4"
        ip -n "$ns" -6 route add default via "$HOST6"
    done
}

net_down() {
    local ns
    for ns in "${NODES[@]}" $(ip netns list 2>/dev/null | awk -v p="^$LINK_PREFIX-p-" '$1 ~ p {print $1}'); do
        [[ -e /run/netns/$ns ]] || continue
        kill_netns_pids "$ns"
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
    local l
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^$LINK_PREFIX" || true); do
        ip link del "$l" 2>/dev/null || true
    done
}

# Processes still inside one of our namespaces are pod processes the agent left.
kill_netns_pids() {
    local pids; pids=$(ip netns pids "$1" 2>/dev/null || true)
    # shellcheck disable=SC2086 # one pid per word
    if [[ -n $pids ]]; then kill -9 $pids 2>/dev/null || true; fi
}

# ---- processes ----------------------------------------------------------------------------
pid_of() { [[ -f $STATE/$1.pid ]] && cat "$STATE/$1.pid"; }
alive() { local p; p=$(pid_of "$1") && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }

# start NAME BINARY ARGS...: detached, own session, log in $STATE/logs/NAME.log
start() {
    local name=$1; shift
    mkdir -p "$STATE/logs"
    printf '%q ' "$@" >"$STATE/$name.cmd"
    # fds 8/9 hold our locks: the daemons must not inherit them.
    setsid "$@" >>"$STATE/logs/$name.log" 2>&1 </dev/null 8>&- 9>&- &
    echo $! >"$STATE/$name.pid"
}

stop() {
    local name=$1 grace=${2:-10} p i
    p=$(pid_of "$name") || return 0
    if [[ -n $p ]] && kill -0 "$p" 2>/dev/null; then
        kill -TERM "$p" 2>/dev/null || true
        for ((i = 0; i < grace * 10; i++)); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$p" 2>/dev/null || true
    fi
    rm -f "$STATE/$name.pid"
}

# wait_for WHAT SECONDS COMMAND...: poll until the command succeeds.
wait_for() {
    local what=$1 secs=$2 i; shift 2
    for ((i = 0; i < secs * 2; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    die "$what not ready after ${secs}s (logs: $STATE/logs)"
}

# The running cluster's binaries (it may have been started from another cache).
running_bin() { cat "$STATE/cp-bin" 2>/dev/null || echo "$CP_BIN"; }
kubectl_admin() { "$(running_bin)/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

etcd_healthy() {
    [[ $(curl -sf --cacert "$STATE/pki/ca.crt" --cert "$STATE/pki/apiserver-etcd-client.crt" \
        --key "$STATE/pki/apiserver-etcd-client.key" "https://127.0.0.1:$ETCD_PORT/health") == *'"health":"true"'* ]]
}
apiserver_ready() { [[ $(kubectl_admin get --raw /readyz 2>/dev/null) == ok ]]; }
secure_healthz() { [[ $(curl -sfk "https://127.0.0.1:$1/healthz") == ok ]]; }
nodes_ready() {
    local n
    n=$(kubectl_admin get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c '^True$')
    [[ $n -eq ${#NODES[@]} ]]
}

start_etcd() {
    local d=$STATE/pki
    start etcd "$CP_BIN/etcd" --name h3i --data-dir "$STATE/etcd" \
        --listen-client-urls "https://127.0.0.1:$ETCD_PORT" --advertise-client-urls "https://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 10))" \
        --initial-cluster "h3i=http://127.0.0.1:$((ETCD_PORT + 10))" \
        --cert-file "$d/etcd.crt" --key-file "$d/etcd.key" --client-cert-auth --trusted-ca-file "$d/ca.crt" \
        --unsafe-no-fsync --log-level warn
    wait_for etcd 30 etcd_healthy
}

start_apiserver() {
    local d=$STATE/pki
    start kube-apiserver "$CP_BIN/kube-apiserver" \
        --bind-address=0.0.0.0 --secure-port="$APISERVER_PORT" --advertise-address="$HOST4" \
        --etcd-servers="https://127.0.0.1:$ETCD_PORT" --etcd-cafile="$d/ca.crt" \
        --etcd-certfile="$d/apiserver-etcd-client.crt" --etcd-keyfile="$d/apiserver-etcd-client.key" \
        --tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" \
        --client-ca-file="$d/ca.crt" \
        --kubelet-client-certificate="$d/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$d/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority="$d/ca.crt" --kubelet-preferred-address-types=InternalIP \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --service-account-issuer=$SA_ISSUER --service-account-key-file="$d/sa.pub" \
        --service-account-signing-key-file="$d/sa.key" \
        --service-cluster-ip-range="$SERVICE_CIDRS" --allow-privileged=true \
        --profiling=false --v=1
    wait_for kube-apiserver 120 apiserver_ready
}

start_controllers() {
    local d=$STATE/pki
    start kube-controller-manager "$CP_BIN/kube-controller-manager" \
        --kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig="$STATE/controller-manager.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$CM_PORT" --leader-elect=false \
        --use-service-account-credentials=true --controllers='*' \
        --service-account-private-key-file="$d/sa.key" --root-ca-file="$d/ca.crt" \
        --cluster-signing-cert-file="$d/ca.crt" --cluster-signing-key-file="$d/ca.key" \
        --service-cluster-ip-range="$SERVICE_CIDRS" --profiling=false --v=1
    start kube-scheduler "$CP_BIN/kube-scheduler" \
        --kubeconfig="$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig="$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig="$STATE/scheduler.kubeconfig" \
        --bind-address=127.0.0.1 --secure-port="$SCHED_PORT" --leader-elect=false --profiling=false --v=1
    wait_for kube-controller-manager 60 secure_healthz "$CM_PORT"
    wait_for kube-scheduler 60 secure_healthz "$SCHED_PORT"
}

# tag_binaries_json: H3I_TAG_BINARIES (TAG=PATH,...) as the agent's tagBinaries object.
tag_binaries_json() {
    local out="" pair tag bin
    local -a pairs
    IFS=, read -r -a pairs <<<"$TAG_BINARIES"
    for pair in "${pairs[@]}"; do
        [[ -n $pair ]] || continue
        tag=${pair%%=*}
        bin=${pair#*=}
        [[ $pair == *=* && -n $tag && $bin == /* ]] || die "H3I_TAG_BINARIES: '$pair' is not TAG=/absolute/path"
        [[ -x $bin ]] || log "warning: H3I_TAG_BINARIES: $bin (tag $tag) does not exist yet"
        out+=$(printf '"%s":"%s",' "$tag" "$bin")
    done
    echo "{${out%,}}"
}

write_agent_config() {
    local nodes="" i ns tags
    tags=$(tag_binaries_json)
    for i in "${!NODES[@]}"; do
        ns=${NODES[$i]}
        nodes+=$(printf '{"name":"%s","netns":"%s","ipv4":"%s","ipv6":"%s","certFile":"%s","keyFile":"%s"},' \
            "$ns" "$ns" "$(node_ip4 "$i")" "$(node_ip6 "$i")" "$STATE/pki/node-$ns.crt" "$STATE/pki/node-$ns.key")
    done
    mkdir -p "$STATE/agent"
    cat >"$STATE/agent/config.json.new" <<EOF
{
  "server": "https://$HOST4:$APISERVER_PORT",
  "caFile": "$STATE/pki/ca.crt",
  "stateDir": "$STATE",
  "binary": "$BINARY",
  "tagBinaries": $tags,
  "imageSuffix": "h3-ingress",
  "apiserverHost": "$HOST4",
  "apiserverPort": $APISERVER_PORT,
  "nodes": [${nodes%,}],
  "podNetwork": {"bridge": "$BRIDGE", "prefix4": "$NET4.", "prefixLen4": 24, "gateway4": "$HOST4",
                 "prefix6": "${NET6}:", "prefixLen6": 64, "gateway6": "$HOST6", "first": $POD_FIRST, "last": $POD_LAST},
  "backoffInitialSeconds": 1,
  "backoffMaxSeconds": 30,
  "kubeletCertFile": "$STATE/pki/kubelet.crt",
  "kubeletKeyFile": "$STATE/pki/kubelet.key",
  "kubeletPort": $KUBELET_PORT
}
EOF
    echo "$AGENT_BIN" >"$STATE/agent/config.json.new.bin"
}

# start_agent: (re)starts the agent when its binary or config changed.
start_agent() {
    write_agent_config
    local want have
    want=$(cat "$STATE/agent/config.json.new" "$STATE/agent/config.json.new.bin" | sha256sum)
    have=$(cat "$STATE/agent/config.json" "$STATE/agent/bin" 2>/dev/null | sha256sum || true)
    if alive h3i-node-agent && [[ $want == "$have" ]]; then
        rm -f "$STATE/agent/config.json.new" "$STATE/agent/config.json.new.bin"
        return
    fi
    if alive h3i-node-agent; then
        log "node agent: config or binary changed, restarting it (its pods restart)"
        stop h3i-node-agent 20
    fi
    mv "$STATE/agent/config.json.new" "$STATE/agent/config.json"
    mv "$STATE/agent/config.json.new.bin" "$STATE/agent/bin"
    start h3i-node-agent "$AGENT_BIN" run "$STATE/agent/config.json"
    wait_for "nodes" 60 nodes_ready
}

write_env() {
    local ips4="" ips6="" i
    for i in "${!NODES[@]}"; do
        ips4+="$(node_ip4 "$i") "
        ips6+="$(node_ip6 "$i") "
    done
    cat >"$STATE/env" <<EOF
export KUBECONFIG=$STATE/admin.kubeconfig
export PATH=$CP_BIN:\$PATH
export H3I_CLUSTER_STATE=$STATE
export H3I_CLUSTER_BIN=$CP_BIN
export H3I_CLUSTER_CACHE=$CACHE
export H3I_APISERVER=https://$HOST4:$APISERVER_PORT
export H3I_NODES="${NODES[*]}"
export H3I_NODE_NETNS="${NODES[*]}"
export H3I_NODE_IPS="${ips4% }"
export H3I_NODE_IPS6="${ips6% }"
export H3I_HOST_IP=$HOST4
export H3I_HOST_IP6=$HOST6
export H3I_POD_LOGS=$STATE/pods
export H3I_BINARY=$BINARY
export H3I_TAG_BINARIES=$TAG_BINARIES
EOF
    if [[ $NODE_MODE == real ]]; then
        rn_env >>"$STATE/env"
    fi
}

healthy() {
    local c
    for c in "${COMPONENTS[@]}"; do alive "$c" || return 1; done
    etcd_healthy && apiserver_ready && secure_healthz "$CM_PORT" && secure_healthz "$SCHED_PORT" && nodes_ready
}

cmd_up() {
    [[ $(id -u) -eq 0 ]] || die "run as root (network namespaces)"
    local t0; t0=$(date +%s)
    cmd_build
    mkdir -p "$STATE"
    exec 9>"$STATE.lock"
    flock 9
    if [[ -f $STATE/admin.kubeconfig ]]; then
        if healthy; then
            [[ $NODE_MODE == real ]] || start_agent # picks up a changed H3I_BINARY or agent build
            write_env
            log "already up and healthy ($STATE)"
            return
        fi
        log "a previous cluster is unhealthy: tearing it down first"
        teardown
        mkdir -p "$STATE"
    fi
    [[ -x $BINARY ]] || log "warning: H3I_BINARY=$BINARY does not exist yet; pods of the project image fail until it does"
    make_pki
    echo "$CP_BIN" >"$STATE/cp-bin"
    echo "$NODE_MODE" >"$STATE/node-mode"
    [[ $NODE_MODE == agent ]] || rn_make_pki
    local srv="https://127.0.0.1:$APISERVER_PORT"
    write_kubeconfig "$STATE/admin.kubeconfig" admin "$srv"
    write_kubeconfig "$STATE/controller-manager.kubeconfig" controller-manager "$srv"
    write_kubeconfig "$STATE/scheduler.kubeconfig" scheduler "$srv"
    net_up
    start_etcd
    start_apiserver
    start_controllers
    if [[ $NODE_MODE == real ]]; then rn_start_nodes; else start_agent; fi
    wait_for "default ServiceAccount" 60 kubectl_admin -n default get serviceaccount default
    write_env
    log "up in $(($(date +%s) - t0)) s: eval \"\$($0 env)\""
}

teardown() {
    stop h3i-node-agent 20
    [[ $NODE_MODE == agent ]] || rn_stop_nodes
    net_down
    stop kube-scheduler
    stop kube-controller-manager
    stop kube-apiserver
    stop etcd
    rm -rf "$STATE"
}

cmd_down() {
    [[ $(id -u) -eq 0 ]] || die "run as root"
    mkdir -p "$(dirname "$STATE")"
    exec 9>"$STATE.lock"
    flock 9
    teardown
    log "down"
}

cmd_env() {
    [[ -f $STATE/env ]] || die "not up ($STATE/env missing): run $0 up"
    cat "$STATE/env"
}

cmd_status() {
    [[ -f $STATE/admin.kubeconfig ]] || { echo "cluster: not up"; return 1; }
    local ok=0 c
    for c in "${COMPONENTS[@]}"; do
        if alive "$c"; then printf '%-24s running (pid %s)\n' "$c" "$(pid_of "$c")"; else printf '%-24s NOT RUNNING\n' "$c"; ok=1; fi
    done
    if etcd_healthy; then echo "etcd /health              ok"; else echo "etcd /health              FAILED"; ok=1; fi
    if apiserver_ready; then echo "kube-apiserver /readyz    ok"; else echo "kube-apiserver /readyz    FAILED"; ok=1; fi
    if secure_healthz "$CM_PORT"; then echo "controller-manager        ok"; else echo "controller-manager        FAILED"; ok=1; fi
    if secure_healthz "$SCHED_PORT"; then echo "scheduler                 ok"; else echo "scheduler                 FAILED"; ok=1; fi
    if apiserver_ready; then
        kubectl_admin get nodes -o wide || ok=1
        nodes_ready || { echo "nodes: not all Ready"; ok=1; }
    fi
    return $ok
}

cmd_restart_apiserver() {
    local down=${1:-0}
    [[ -f $STATE/kube-apiserver.cmd ]] || die "not up"
    exec 9>"$STATE.lock"
    flock 9
    local t0; t0=$(date +%s)
    stop kube-apiserver 30
    log "kube-apiserver stopped"
    sleep "$down"
    eval "start kube-apiserver $(cat "$STATE/kube-apiserver.cmd")"
    wait_for kube-apiserver 120 apiserver_ready
    log "kube-apiserver restarted ($(($(date +%s) - t0)) s, $down s of them down on purpose)"
}

case ${1:-} in
    build) cmd_build ;;
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) cmd_status ;;
    restart-apiserver) shift; cmd_restart_apiserver "$@" ;;
    push-image) [[ $NODE_MODE == real ]] || die "push-image: only with real nodes"; rn_push_image ;;
    import-addon)
        [[ $NODE_MODE == real && -n ${2:-} ]] || die "import-addon NAME: only with real nodes"
        rn_addon_image_load "$2"
        for ns in "${NODES[@]}"; do ref=$(rn_import_addon "$ns" "$2"); done
        echo "$ref"
        ;;
    *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
