#!/usr/bin/env bash
# A DaemonSet roll that keeps every QUIC connection, on the test cluster of scripts/cluster.sh
# (root): the chart, a Debian nginx on each node standing in for the TCP ingress (with a
# throttled /slow/ path), an Http3Listener serving one annotated Ingress's host, and on each node
# three clients (tests/py/rollclient.py, aioquic): a new QUIC connection per request every 200 ms,
# one kept connection doing a request every 200 ms, and one slow download that spans the roll.
# While they run, a socket setting changes (socket.receiveBufferBytes): the pod template changes
# and the DaemonSet rolls both nodes with surge (the new pod starts beside the old one, takes the
# node's new connections once ready, the old one drains and exits).
# Checks (tests/cluster/rollcheck.py, per node): 0 failed requests on new connections, none
# waiting for the old process's drain; the kept connection lives on or is closed only by GOAWAY
# with nothing processed lost (a retried request never reached nginx); the slow download completes
# with the right bytes; the old pods are gone only after their last connection ended, and within
# the drain deadline.
#
#   tests/cluster/rollout.sh      brings the cluster up if needed and leaves it up; its objects
#                                 and nginx are removed on exit unless H3I_ROLLOUT_KEEP=1
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_APP=h3i-roll
HOST=roll.h3i.test
CLASS=h3i-roll
LISTENER=roll
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
DP_SELECTOR="app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane"
DRAIN=90          # http.drainTimeoutSeconds: the slow download must finish within it
SLOW_BYTES=2097152
SLOW_RATE=48k     # nginx limit_rate: 2 MiB at 48 KiB/s is about 43 s
CLIENT_SECONDS=50
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
fail_listeners() { kubectl get h3l "$LISTENER" -o wide; }
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nROLLOUT TEST FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root "ROLLOUT TEST"

tmp=$(mktemp -d /tmp/h3i-rollout.XXXXXX)
ROLL_CLIENTS=()
cleanup() {
    local rc=$? p
    for p in "${ROLL_CLIENTS[@]}"; do kill "$p" 2>/dev/null || true; done
    remove_objects H3I_ROLLOUT_KEEP "$LISTENER" "ingressclass/$CLASS" "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

pods_state() { # name uid node deletionTimestamp ready, one line per data plane pod
    kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}
ready_pods() { pods_state | grep -c '|True$' || true; }
h3_ok() { "$PY" "$JPY" h3 --addr "$1" --host "$HOST" --cacert "$tmp/pki/ca.crt" --path /whoami >/dev/null 2>&1; }
served_everywhere() { local ip; for ip in "${IPS[@]}"; do h3_ok "$ip" || return 1; done; }
rolled() { # every pod from before the roll gone, two new pods Ready
    local p
    for p in $OLD_PODS; do jp pod -n "$NS_OP" "$p" -o name >/dev/null && return 1; done
    [[ $(ready_pods) -eq 2 ]]
}

# =================================================================================================
cluster_up
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
if kubectl get ns "$NS_OP" >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run left" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass "$CLASS" --ignore-not-found >/dev/null

step "helm install; nginx on both nodes serving $HOST (/slow/ throttled to $SLOW_RATE/s); an Http3Listener"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
roll_app roll
wait_ok 120 "both data plane pods Ready" eval '[[ $(ready_pods) -eq 2 ]]'
wait_ok 60 "$HOST served over HTTP/3 on ${IPS[*]}" served_everywhere
strategy=$(jp ds -n "$NS_OP" "h3-ingress-$LISTENER" -o jsonpath='{.spec.updateStrategy.rollingUpdate.maxSurge}/{.spec.updateStrategy.rollingUpdate.maxUnavailable}')
[[ $strategy == 10%/0 ]] || fail "DaemonSet maxSurge/maxUnavailable '$strategy', want the defaults 10%/0"
ok "DaemonSet rolls with maxSurge/maxUnavailable $strategy"
OLD_PODS=$(pods_state | cut -d' ' -f1 | tr '\n' ' ')
info "pods before the roll: $OLD_PODS"

# =================================================================================================
step "three clients on each node; a socket setting changes under them: the DaemonSet rolls with surge"
roll_clients "" "$CLIENT_SECONDS"
sleep 3
t_roll=$(date +%s.%N)
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"socket":{"receiveBufferBytes":2097152}}}' >/dev/null
wait_ok 120 "the roll done: the old pods gone, two new pods Ready" rolled
t_rolled=$(date +%s.%N)
NEW_PODS=$(pods_state | cut -d' ' -f1 | tr '\n' ' ')
ok "rolled in $(awk -v a="$t_roll" -v b="$t_rolled" 'BEGIN {printf "%.1f", b - a}') s: $OLD_PODS-> $NEW_PODS"
roll_clients_done ""

# =================================================================================================
step "what the clients saw, per node: no failed request, the kept connection kept or closed only by GOAWAY, the download complete"
roll_verdict "" | tee "$tmp/verdict.txt" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "rollout clients: $(cat "$tmp/verdict.txt")"
slow_ends=$("$PY" -c 'import json,sys
for f in sys.argv[1:]:
    d = json.load(open(f))["slow"]
    print("%.1f" % (d["start"] + d["ms"] / 1000))' "$tmp/clients-0.json" "$tmp/clients-1.json")
info "slow downloads ended at +$(for e in $slow_ends; do awk -v a="$t_roll" -v b="$e" 'BEGIN {printf "%.1f s ", b - a}'; done)after the roll started (the roll took $(awk -v a="$t_roll" -v b="$t_rolled" 'BEGIN {printf "%.1f", b - a}') s)"

step "the old processes drained: gone after their last connection ended, within the drain deadline"
for p in $OLD_PODS; do
    ev=$H3I_POD_LOGS/$NS_OP/$p/_events.log
    [[ -f $ev ]] || fail "no node agent record of $p"
    grep -E 'exit|stopp|removed' "$ev" | tail -3 | indent
done
last_end=$(tr ' ' '\n' <<<"$slow_ends" | sort -n | tail -1)
awk -v r="$t_rolled" -v e="$last_end" 'BEGIN {exit !(r + 1 >= e)}' ||
    fail "the old pods were gone before the slow downloads they carried ended"
awk -v a="$t_roll" -v r="$t_rolled" -v d="$DRAIN" 'BEGIN {exit !(r - a <= d + 60)}' ||
    fail "the old pods outlived the drain deadline"
ok "old pods gone after the last slow download ended and within ${DRAIN} s of drain"
printf '\nROLLOUT TEST PASSED in %ss\n' "$(($(date +%s) - T_START))"
