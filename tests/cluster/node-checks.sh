#!/usr/bin/env bash
# What only a real node can answer (H3I_NODES=real: a real kubelet, containerd, runc, CNI and
# kube-proxy; scripts/cluster-nodes.sh), on the test cluster of scripts/cluster.sh (root): the
# chart installed with the registry's pull secret, a Debian nginx on each node standing in for the
# TCP ingress, and an Http3Listener serving shop.h3i.test. Checks:
#   - the image: every pod runs the digest pushed to the authenticated registry; a pod without
#     the pull secret fails with ErrImagePull;
#   - the container runc made: CapEff exactly NET_BIND_SERVICE (and NET_ADMIN only with
#     socket.forceBuffers), no new privileges, seccomp filtering, a read-only root filesystem
#     with a writable /tmp; the operator with no capabilities at all, as its non-root user;
#   - HTTP/3 through spec.service (NodePort) via kube-proxy's nftables rules;
#   - Debian's Chromium through a node address (tests/browser/chromium.py --ingress);
#   - the termination grace honoured: a pod deleted under a slow download keeps serving it
#     after SIGTERM and exits by itself, within the grace period;
#   - the liveness probe: a hung (SIGSTOPped) data plane is restarted by the kubelet;
#   - an OOM kill: a listener with an 8 MiB memory limit buffering uploads to a stalled
#     upstream, and the kubelet's OOMKilled in its Degraded condition.
#
#   tests/cluster/node-checks.sh    brings the cluster up if needed (H3I_NODES=real) and leaves
#                                   it up; its objects are removed unless H3I_NODE_CHECKS_KEEP=1
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_APP=h3i-nodes
HOST=shop.h3i.test # tests/browser/chromium.py's host
CLASS=h3i-nodes
LISTENER=nodes
TINY=tiny          # the listener whose pods the kernel OOM-kills
TINY_MEMORY=8Mi
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
DP_SELECTOR="app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane"
DRAIN=30          # http.drainTimeoutSeconds; the pods' grace period is this plus the margin
SLOW_BYTES=524288 # 512 KiB at 32 KiB/s: a download of about 16 s that spans a pod deletion
SLOW_RATE=32k
CAP_NET_BIND_SERVICE=$((1 << 10))
CAP_NET_ADMIN=$((1 << 12))
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
fail_listeners() { kubectl get h3l -o wide; }
fail_pods() {
    local p
    for p in $(kubectl -n "$NS_OP" get pods -o name 2>/dev/null); do
        echo "--- kubectl logs $p (last 10 lines):"
        kubectl -n "$NS_OP" logs "$p" --all-containers --tail 10 2>&1 || true
    done >&2
}
fail() {
    printf '\nNODE CHECKS FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners true
    fail_pods
    exit 1
}
skip_unless_root "NODE CHECKS"

tmp=$(mktemp -d /tmp/h3i-node-checks.XXXXXX)
SLOW_PID=
STALLED=()
cleanup() {
    local rc=$? p
    [[ -z $SLOW_PID ]] || kill "$SLOW_PID" 2>/dev/null || true
    for p in "${STALLED[@]}"; do kill "$p" 2>/dev/null || true; done
    [[ -z ${KUBECONFIG:-} ]] || kubectl delete h3l "$TINY" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    remove_objects H3I_NODE_CHECKS_KEEP "$LISTENER" "ingressclass/$CLASS" "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

pods_state() { # name node ready, one line per data plane pod of LISTENER
    kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}
ready_pods() { pods_state | grep -c ' True$' || true; }
pod_on() { pods_state | awk -v n="$1" '$2 == n {print $1; exit}'; }
h3_ok() { # ADDR [PORT]
    "$PY" "$JPY" h3 --addr "$1" --port "${2:-443}" --host "$HOST" --cacert "$tmp/pki/ca.crt" --path /whoami >/dev/null 2>&1
}
served_everywhere() { local ip; for ip in "${IPS[@]}"; do h3_ok "$ip" || return 1; done; }
status_field() { grep "^$2:" "/proc/$1/status" | awk '{print $2}'; }
cond() { jp h3l "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].$3}"; }

# caps_check PID WANT WHO: CapEff/CapPrm/CapBnd exactly WANT, no new privileges, seccomp filter.
caps_check() {
    local pid=$1 want=$2 who=$3 eff prm bnd nnp sec uid
    eff=$((16#$(status_field "$pid" CapEff)))
    prm=$((16#$(status_field "$pid" CapPrm)))
    bnd=$((16#$(status_field "$pid" CapBnd)))
    nnp=$(status_field "$pid" NoNewPrivs)
    sec=$(status_field "$pid" Seccomp)
    uid=$(status_field "$pid" Uid)
    [[ $eff == "$want" && $prm == "$want" && $bnd == "$want" ]] ||
        fail "$who (pid $pid): CapEff $eff CapPrm $prm CapBnd $bnd, want $want"
    [[ $nnp == 1 && $sec == 2 ]] || fail "$who (pid $pid): NoNewPrivs $nnp Seccomp $sec, want 1 and 2 (filter)"
    ok "$who (pid $pid, uid $uid): CapEff=CapPrm=CapBnd=$(printf '0x%04x' "$eff"), NoNewPrivs 1, Seccomp 2 (filter)"
}

# rootfs_check PID WHO [tmp]: the container's / refuses a write (EROFS); with `tmp`, its /tmp
# (an emptyDir) takes one.
rootfs_check() {
    local pid=$1 who=$2 err tmp_ok=""
    err=$( (: >"/proc/$pid/root/h3i-write-test") 2>&1) && fail "$who: wrote to its root filesystem"
    [[ $err == *"Read-only file system"* ]] || fail "$who: writing to / failed, but not as read-only: $err"
    if [[ ${3:-} == tmp ]]; then
        : >"/proc/$pid/root/tmp/h3i-write-test" || fail "$who: /tmp is not writable"
        rm -f "/proc/$pid/root/tmp/h3i-write-test"
        tmp_ok=", /tmp writable"
    fi
    ok "$who: / is read-only (EROFS)$tmp_ok; mount: $(awk '$5 == "/" {print $4, $6}' "/proc/$pid/mountinfo" | head -1)"
}

# =================================================================================================
cluster_up
pods_real || fail "node checks need real nodes: H3I_NODES=real scripts/cluster.sh up (this cluster runs the node agent)"
if kubectl get ns "$NS_OP" >/dev/null 2>&1 || kubectl get ns "$NS_APP" >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run left" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass "$CLASS" --ignore-not-found >/dev/null
ok "real nodes: $(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion}; {end}')"

# =================================================================================================
step "helm install with the registry's pull secret; nginx on both nodes serving $HOST (/, /1m.bin, /slow/ at $SLOW_RATE/s); an Http3Listener"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
read -r -a pull <<<"$(pull_secret_args "$NS_OP")"
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    "${pull[@]}" --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
make_ca "h3i-nodes-ca"
leaf "$HOST" "$HOST"
mkdir -p "$tmp/www/slow"
head -c 1048576 /dev/urandom >"$tmp/www/1m.bin"
head -c "$SLOW_BYTES" /dev/urandom >"$tmp/www/slow/512k.bin"
SLOW_SHA=$(sha256sum "$tmp/www/slow/512k.bin" | cut -d' ' -f1)
"$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); import chromium; print(chromium.PAGE.format(fetch_path=chromium.FETCH_PATH))' \
    "$REPO/tests/browser" >"$tmp/www/index.html"
NGINX_EXTRA="location /slow/ { limit_rate $SLOW_RATE; } location = /index.html { default_type text/html; }"
for node in "${NODES[@]}"; do start_nginx "$node" "$HOST"; done
app_objects shop
wait_ok 120 "both data plane pods Ready" eval '[[ $(ready_pods) -eq 2 ]]'
wait_ok 60 "$HOST served over HTTP/3 on ${IPS[*]}" served_everywhere

# =================================================================================================
step "the image: every pod runs the digest pushed to the authenticated registry; without the pull secret, ErrImagePull"
pushed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$H3I_CLUSTER_STATE/image/oci/index.json")
while read -r pod image id; do
    [[ $id == *"@$pushed" ]] || fail "pod $pod runs $id, not the pushed $pushed"
    info "$pod: $image -> ${id##*@}"
done < <(kubectl -n "$NS_OP" get pods -o jsonpath='{range .items[*]}{.metadata.name} {.spec.containers[0].image} {.status.containerStatuses[0].imageID}{"\n"}{end}')
ok "every pod of the release runs $pushed (the digest scripts/image.sh built and scripts/registry.sh pushed)"
app_version=$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$REPO/charts/h3-ingress/Chart.yaml")
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: no-pull-secret, namespace: $NS_APP}
spec:
  nodeName: ${NODES[0]}
  containers: [{name: c, image: "$IMAGE_REPO:$app_version", imagePullPolicy: Always, args: [version]}]
EOF
pull_failed() { [[ $(jp pod -n "$NS_APP" no-pull-secret -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}') =~ ^(ErrImagePull|ImagePullBackOff)$ ]]; }
wait_ok 60 "pod without imagePullSecrets: ErrImagePull" pull_failed
info "$(kubectl -n "$NS_APP" get events --field-selector involvedObject.name=no-pull-secret,reason=Failed -o jsonpath='{.items[0].message}' | cut -c1-300)"
kubectl -n "$NS_APP" delete pod no-pull-secret --wait=false >/dev/null

# =================================================================================================
step "the containers runc made: capabilities, no new privileges, seccomp, read-only root filesystem"
while read -r pod node _; do
    pid=$(pod_pid "$NS_OP" "$pod" h3-ingress)
    [[ -n $pid ]] || fail "no process for $pod"
    [[ $(readlink -f "/proc/$pid/exe") == */h3-ingress ]] || fail "$pod: pid $pid runs $(readlink -f "/proc/$pid/exe")"
    caps_check "$pid" "$CAP_NET_BIND_SERVICE" "data plane $pod on $node"
    rootfs_check "$pid" "data plane $pod" tmp
done < <(pods_state)
op_pod=$(kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
op_pid=$(pod_pid "$NS_OP" "$op_pod" operator)
[[ $(status_field "$op_pid" Uid) == 65532 ]] || fail "operator runs as uid $(status_field "$op_pid" Uid), want 65532"
caps_check "$op_pid" 0 "operator $op_pod"
rootfs_check "$op_pid" "operator $op_pod"

# =================================================================================================
step "HTTP/3 through spec.service (NodePort, externalTrafficPolicy Local) via kube-proxy's nftables rules"
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"service":{"type":"NodePort"}}}' >/dev/null
svc=h3-ingress-$LISTENER
nodeport() { jp svc -n "$NS_OP" "$svc" -o jsonpath='{.spec.ports[0].nodePort}'; }
wait_ok 30 "Service $NS_OP/$svc has a node port" eval '[[ -n $(nodeport) ]]'
port=$(nodeport)
for ip in "${IPS[@]}"; do
    wait_ok 30 "HTTP/3 to $ip:$port (kube-proxy DNAT to the node's pod on UDP 443)" h3_ok "$ip" "$port"
done
info "$(ip netns exec "${NODES[0]}" nft list ruleset 2>/dev/null | grep -m2 "$port" | sed 's/^[[:space:]]*//')"

# =================================================================================================
step "Debian's Chromium through ${IPS[0]}: Alt-Svc discovery from nginx, then the page and 1 MiB over h3"
"$REPO/tests/browser/run.sh" --ingress "${IPS[0]}:443" --ca "$tmp/pki/ca.crt" \
    --metrics "http://${IPS[0]}:9476/metrics" 2>&1 | tee "$tmp/browser.log" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "tests/browser/chromium.py through ${IPS[0]}"
ok "Chromium through ${IPS[0]}: $(grep -m1 '^run 1 discovery:' "$tmp/browser.log")"

# =================================================================================================
step "termination grace: a pod deleted under a slow download keeps serving it, then exits by itself"
node=${NODES[1]} ip=${IPS[1]}
pod=$(pod_on "$node")
pid=$(pod_pid "$NS_OP" "$pod" h3-ingress)
grace=$(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.spec.terminationGracePeriodSeconds}')
"$PY" "$REPO/tests/py/h3client.py" "https://$HOST/slow/512k.bin" --resolve "$HOST:443:$ip" \
    --cacert "$tmp/pki/ca.crt" --timeout 60 >"$tmp/slow.json" 2>"$tmp/slow.err" &
SLOW_PID=$!
sleep 3
t_del=$(date +%s.%N)
kubectl -n "$NS_OP" delete pod "$pod" --wait=false >/dev/null
until_ok 10 "the kubelet saw the deletion" eval '[[ -n $(jp pod -n "$NS_OP" "$pod" -o jsonpath="{.metadata.deletionTimestamp}") ]] || ! kill -0 $pid'
sleep 2
kill -0 "$pid" 2>/dev/null || fail "$pod's process $pid gone 2 s after the deletion, with a download in flight"
ok "$pod (pid $pid) still runs 2 s after SIGTERM, draining"
wait "$SLOW_PID" || fail "the slow download failed: $(cat "$tmp/slow.err")"
SLOW_PID=
t_done=$(date +%s.%N)
read -r status sha len < <("$PY" -c 'import json,sys; r=json.load(open(sys.argv[1]))["requests"][0]; print(r.get("status"), r.get("body_sha256"), r.get("body_length"))' "$tmp/slow.json")
[[ $status == 200 && $sha == "$SLOW_SHA" ]] || fail "slow download through the draining pod: status $status, $len bytes, sha $sha"
until_ok "$((grace + 5))" "$pod's process exits" eval '! kill -0 $pid 2>/dev/null'
t_exit=$(date +%s.%N)
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }
awk -v a="$t_del" -v b="$t_exit" -v g="$grace" 'BEGIN {exit !(b - a < g)}' ||
    fail "$pod exited $(elapsed "$t_del" "$t_exit") s after the deletion: the grace period ($grace s) ran out"
ok "download complete (200, $len bytes, sha256 matches) $(elapsed "$t_del" "$t_done") s after the deletion; the process exited by itself $(elapsed "$t_del" "$t_exit") s after it (grace ${grace} s)"
wait_ok 60 "the DaemonSet's new pod on $node is Ready and serves" eval '[[ $(ready_pods) -eq 2 ]] && h3_ok $ip'

# =================================================================================================
step "liveness probe: a hung data plane (SIGSTOP) is restarted by the kubelet"
node=${NODES[0]} ip=${IPS[0]}
pod=$(pod_on "$node")
pid=$(pod_pid "$NS_OP" "$pod" h3-ingress)
restarts=$(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="h3-ingress")].restartCount}')
t_stop=$(date +%s)
kill -STOP "$pid"
restarted() { [[ $(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="h3-ingress")].restartCount}') -gt $restarts ]]; }
wait_ok 150 "$pod restarted by the kubelet (restartCount > $restarts)" restarted
info "$(kubectl -n "$NS_OP" get events --field-selector "involvedObject.name=$pod,reason=Unhealthy" -o jsonpath='{range .items[*]}{.count}x {.message}{"\n"}{end}' | grep -m1 -i liveness)"
# Three failed probes 10 s apart, then the probe's own grace (not the pod's drain grace): a
# stopped process cannot act on the kubelet's SIGTERM, so its SIGKILL after the grace ends it.
live_grace=$(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.spec.containers[0].livenessProbe.terminationGracePeriodSeconds}')
info "last state: $(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.containerStatuses[?(@.name=="h3-ingress")].lastState.terminated.reason} exit {.status.containerStatuses[?(@.name=="h3-ingress")].lastState.terminated.exitCode}'), $(($(date +%s) - t_stop)) s after SIGSTOP (3 probes 10 s apart, then a ${live_grace:-$grace} s grace before SIGKILL)"
wait_ok 60 "the restarted container is Ready and serves $HOST on $ip" eval '[[ $(ready_pods) -eq 2 ]] && h3_ok $ip'

# =================================================================================================
step "an OOM kill: listener '$TINY' (UDP 8443, memory limit $TINY_MEMORY) buffers uploads to a stalled upstream; the kubelet's reason in its status"
# The upstream accepts TCP connections (the kernel's backlog) and never answers, so the data
# plane holds what clients send, up to its default 2 MiB per stream: 8 uploads are 16 MiB.
for node in "${NODES[@]}"; do
    ip netns exec "$node" "$PY" -c 'import socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 9443)); s.listen(1024); time.sleep(3600)' &
    STALLED+=($!)
done
kubectl apply -f - >/dev/null <<EOF
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $TINY}
spec:
  ingressClassName: $CLASS
  port: 8443
  metrics: {address: "[::]:9486"}
  upstream: {address: "127.0.0.1:9443"}
  resources: {requests: {memory: $TINY_MEMORY}, limits: {memory: $TINY_MEMORY}}
EOF
tiny_ready() { [[ $(kubectl -n "$NS_OP" get pods -l "app.kubernetes.io/instance=$TINY" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{end}') == TrueTrue ]]; }
wait_ok 90 "both '$TINY' pods Ready under the $TINY_MEMORY limit" tiny_ready
tiny_pod=$(kubectl -n "$NS_OP" get pods -l "app.kubernetes.io/instance=$TINY" --field-selector "spec.nodeName=${NODES[0]}" -o jsonpath='{.items[0].metadata.name}')
head -c 2097152 /dev/urandom >"$tmp/2m.bin"
uploads=()
for i in 1 2 3 4 5 6 7 8; do
    "$PY" "$REPO/tests/py/h3client.py" "https://$HOST:8443/upload-$i" --resolve "$HOST:8443:${IPS[0]}" \
        --cacert "$tmp/pki/ca.crt" --upload "$tmp/2m.bin" --timeout 30 >/dev/null 2>&1 &
    uploads+=($!)
done
oom_killed() { [[ $(jp pod -n "$NS_OP" "$tiny_pod" -o jsonpath='{.status.containerStatuses[0].lastState.terminated.reason}') == OOMKilled ]]; }
wait_ok 60 "the kernel OOM-killed $tiny_pod (lastState.terminated.reason OOMKilled)" oom_killed
kill "${uploads[@]}" 2>/dev/null || true
info "kubelet: $tiny_pod $(jp pod -n "$NS_OP" "$tiny_pod" -o jsonpath='{.status.containerStatuses[0].lastState.terminated.reason} exit {.status.containerStatuses[0].lastState.terminated.exitCode}, restartCount {.status.containerStatuses[0].restartCount}'); limit $(jp pod -n "$NS_OP" "$tiny_pod" -o jsonpath='{.spec.containers[0].resources.limits.memory}')"
oom_said() { [[ $(cond "$TINY" Degraded reason) == ContainerExited && $(cond "$TINY" Degraded message) == *"$tiny_pod on ${NODES[0]}: last exit: OOMKilled (exit code 137)"* ]]; }
wait_ok 60 "h3l/$TINY Degraded=True ContainerExited, naming the pod and OOMKilled" oom_said
info "Degraded: $(cond "$TINY" Degraded status) $(cond "$TINY" Degraded reason): $(cond "$TINY" Degraded message)"
kubectl delete h3l "$TINY" --wait=false >/dev/null

# =================================================================================================
step "socket.forceBuffers: the rolled pods get NET_ADMIN too (SO_RCVBUFFORCE), and nothing else"
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"socket":{"forceBuffers":true}}}' >/dev/null
forced() {
    local pod node pid n=0
    while read -r pod node _; do
        pid=$(pod_pid "$NS_OP" "$pod" h3-ingress) || return 1
        [[ -n $pid && $((16#$(status_field "$pid" CapEff))) -eq $((CAP_NET_BIND_SERVICE | CAP_NET_ADMIN)) ]] || return 1
        n=$((n + 1))
    done < <(pods_state)
    [[ $n -eq 2 && $(ready_pods) -eq 2 ]]
}
wait_ok 120 "both pods rolled with NET_BIND_SERVICE and NET_ADMIN" forced
while read -r pod node _; do
    caps_check "$(pod_pid "$NS_OP" "$pod" h3-ingress)" "$((CAP_NET_BIND_SERVICE | CAP_NET_ADMIN))" "data plane $pod on $node (forceBuffers)"
done < <(pods_state)
wait_ok 60 "$HOST served over HTTP/3 on ${IPS[*]} after the roll" served_everywhere
buffers() { [[ $(cond "$LISTENER" BuffersApplied status) == True ]]; }
wait_ok 30 "h3l/$LISTENER BuffersApplied=True" buffers
info "BuffersApplied: $(cond "$LISTENER" BuffersApplied reason): $(cond "$LISTENER" BuffersApplied message)"

step "done: real-node checks"
step_table
printf '\nNODE CHECKS PASSED in %ss\n' "$(($(date +%s) - T_START))"
