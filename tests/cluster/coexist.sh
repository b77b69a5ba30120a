#!/usr/bin/env bash
# Two installations side by side on the real nodes of scripts/cluster.sh (root, H3I_NODES=real):
# the chart installed twice under one release name, in namespaces A and B, each operator with
# its own controller name and its own listener on its own UDP port (A: 443, B: 8443), both
# serving over HTTP/3 through Debian nginx on every node. Then:
#
#   1. a second release with A's controller name is refused by `helm install` itself;
#   2. side by side for H3I_COEXIST_SECONDS (300): both listeners' conditions polled every
#      second (one value each the whole time: no flip), HTTP/3 to both on both nodes every 15 s,
#      no Warning event on either listener, then no 403/Forbidden line in either data plane's
#      log; each DaemonSet, ClusterRole(Binding) exists once, in its own installation's names;
#   3. socket.forceBuffers toggled on B's listener (UDP 8443): the surge roll completes (one uid
#      for the data plane: the new pods join the old ones' SO_REUSEPORT group), the new pods
#      run as uid 0 with NET_ADMIN, and B still serves;
#   4. `helm uninstall` of B: its pre-delete hook leaves no DaemonSet, pod, ClusterRole or Lease
#      of B and nothing bound to UDP 8443 on any node; B's listener says NoController; A's
#      listener keeps its pods (same UIDs), its Ready condition (polled throughout) and serves
#      over HTTP/3 (tests/py/h3client.py).
#
# Every step prints its elapsed time and the run ends with the step table.
#
#   tests/cluster/coexist.sh     brings the cluster up if needed (real nodes) and leaves it up;
#                                its objects and nginx are removed on exit unless
#                                H3I_COEXIST_KEEP=1. H3I_COEXIST_SECONDS sets step 2 (300 by
#                                default, as measured by hand; tests/cluster/run.sh gives 120).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

RELEASE=h3-ingress # the same release name in both namespaces: cluster-scoped names must differ
NS_A=h3i-co-a
NS_B=h3i-co-b
NS_OP=$NS_A # lib.sh's failure report and nginx helpers
NS_APP=h3i-co-app
NAME_A=h3-ingress.dev/operator # the default
NAME_B=example.com/team-b
LISTENER_A=co-a
LISTENER_B=co-b
PORT_A=443
PORT_B=8443
HOST_A=a.h3i.test
HOST_B=b.h3i.test
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
SIDE_BY_SIDE=${H3I_COEXIST_SECONDS:-300}
DP_LABEL=app.kubernetes.io/component=data-plane
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
fail_listeners() {
    echo "--- listeners:"
    kubectl get h3l -o wide
    kubectl get h3l -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions}{"\n"}{end}'
}
fail_pods() { kubectl -n "$NS_A" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nCOEXIST TEST FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    kubectl -n "$NS_B" get pods -o wide >&2 2>&1 || true
    exit 1
}
skip_unless_root "COEXIST TEST"

tmp=$(mktemp -d /tmp/h3i-coexist.XXXXXX)
BG_PIDS=()
cleanup() {
    local rc=$? p
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [[ ${H3I_COEXIST_KEEP:-0} == 1 ]]; then
        echo "H3I_COEXIST_KEEP=1: objects, nginx and $tmp left in place"
        return $rc
    fi
    stop_nginx || true
    if [[ -n ${KUBECONFIG:-} ]]; then
        helm uninstall "$RELEASE" -n "$NS_B" --wait=false --timeout 120s >/dev/null 2>&1 || true
        helm uninstall "$RELEASE" -n "$NS_A" --wait=false --timeout 120s >/dev/null 2>&1 || true
        kubectl delete h3l "$LISTENER_A" "$LISTENER_B" --ignore-not-found --wait=false >/dev/null 2>&1 || true
        kubectl delete namespace "$NS_A" "$NS_B" "$NS_APP" --ignore-not-found --wait=false >/dev/null 2>&1 || true
        kubectl delete ingressclass co-a co-b --ignore-not-found --wait=false >/dev/null 2>&1 || true
        kubectl delete crd http3listeners.h3-ingress.dev --ignore-not-found --wait=false >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

# ---- helpers ---------------------------------------------------------------------------------
h3_ok() { # ADDR HOST PORT
    "$PY" "$JPY" h3 --addr "$1" --host "$2" --port "$3" --cacert "$tmp/pki/ca.crt" --path /whoami >/dev/null 2>&1
}
served() { # HOST PORT: on every node
    local ip
    for ip in "${IPS[@]}"; do h3_ok "$ip" "$1" "$2" || return 1; done
}
cond() { jp h3l "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].$3}"; } # LISTENER TYPE FIELD
ready_is() { [[ "$(cond "$1" Ready status)/$(cond "$1" Ready reason)" == "$2" ]]; }
dp_pods() { # NS: "name uid node ready runAsUser" per data plane pod, not being deleted
    kubectl -n "$1" get pods -l "$DP_LABEL" -o jsonpath='{range .items[*]}{.metadata.name}|{.metadata.uid}|{.spec.nodeName}|{.status.conditions[?(@.type=="Ready")].status}|{.spec.containers[0].securityContext.runAsUser}|{.metadata.deletionTimestamp}{"\n"}{end}' |
        awk -F'|' '$6 == "" {print $1, $2, $3, ($4 == "" ? "-" : $4), ($5 == "" ? "-" : $5)}'
}
all_pods() { kubectl -n "$1" get pods -l "$DP_LABEL" -o name; }
ready_pods() { dp_pods "$1" | awk '$4 == "True"' | wc -l; }
# poll_conditions LISTENER FILE: every condition (type=status/reason@lastTransitionTime) and
# the observed generation once a second, one line each: EPOCH VALUE.
poll_conditions() {
    local got
    while :; do
        got=$(kubectl get h3l "$1" -o jsonpath='{.status.observedGeneration} {range .status.conditions[*]}{.type}={.status}/{.reason}@{.lastTransitionTime} {end}' 2>&1 | tr '\n' ' ') || true
        printf '%s %s\n' "$(date +%s)" "$got" >>"$2"
        sleep 1
    done
}
# one_value FILE FROM: the lines of FILE from epoch FROM on all carry one value (printed).
one_value() {
    "$PY" - "$1" "$2" <<'EOF'
import sys
rows = [l.rstrip("\n").split(" ", 1) for l in open(sys.argv[1]) if l.strip()]
rows = [(int(t), v.strip()) for t, v in rows if int(t) >= int(sys.argv[2])]
values = {}
for t, v in rows:
    values.setdefault(v, []).append(t)
print(f"{len(rows)} observations over {rows[-1][0] - rows[0][0] if rows else 0} s, "
      f"{len(values)} distinct value(s)")
for v, ts in values.items():
    print(f"  {len(ts)}x from +{ts[0] - int(sys.argv[2])} s to +{ts[-1] - int(sys.argv[2])} s: {v}")
sys.exit(0 if len(values) == 1 and rows and "Ready=True/" in rows[0][1] else 1)
EOF
}
# udp_holders PORT: what holds UDP PORT in each node's network namespace (ss lines).
udp_holders() {
    local node
    for node in "${NODES[@]}"; do
        ip netns exec "$node" ss -Hulpn "sport = :$1" | sed "s/^/$node: /"
    done
}
install_release() { # NS CONTROLLER-NAME
    kubectl create namespace "$1" >/dev/null
    kubectl label namespace "$1" pod-security.kubernetes.io/enforce=privileged >/dev/null
    local secret
    secret=$(pull_secret_args "$1")
    # shellcheck disable=SC2086 # secret is empty or one flag
    helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$1" --set image.repository="$IMAGE_REPO" \
        --set controllerName="$2" $secret --wait --timeout 120s
}

# =============================================================================================
cluster_up
pods_real || fail "tests/cluster/coexist.sh needs real nodes (H3I_NODES=real): the uid of a SO_REUSEPORT group is the kernel's rule"
ok "up in $(($(date +%s) - t0))s; nodes: ${NODES[*]}"
if kubectl get ns "$NS_A" "$NS_B" "$NS_APP" >/dev/null 2>&1 || kubectl get crd http3listeners.h3-ingress.dev >/dev/null 2>&1; then
    info "removing what a previous run left"
    kubectl delete h3l --all --wait=true --timeout=60s >/dev/null 2>&1 || true
    helm uninstall "$RELEASE" -n "$NS_B" --wait >/dev/null 2>&1 || true
    helm uninstall "$RELEASE" -n "$NS_A" --wait >/dev/null 2>&1 || true
    kubectl delete namespace "$NS_A" "$NS_B" "$NS_APP" --ignore-not-found --wait=true --timeout=90s >/dev/null
    kubectl delete crd http3listeners.h3-ingress.dev --ignore-not-found >/dev/null
fi
# The tests before this one uninstall their release without waiting: its operator's ClusterRole
# would make `helm install` refuse the default controller name (and its Lease be a running
# operator with it).
others() {
    kubectl get clusterrole -l app.kubernetes.io/name=h3-ingress,app.kubernetes.io/component=operator -o name
    kubectl get lease -A -l app.kubernetes.io/name=h3-ingress,app.kubernetes.io/component=operator -o name
}
# shellcheck disable=SC2016 # expanded by eval inside wait_ok, on every try
wait_ok 120 "no other installation's operator ClusterRole or Lease left" eval '[[ -z $(others) ]]'

step "release $RELEASE in $NS_A (controllerName $NAME_A), then the same release name in $NS_B with the same controllerName: refused by helm"
install_release "$NS_A" "$NAME_A" >"$tmp/helm-a.log" 2>&1 || fail "helm install in $NS_A: $(cat "$tmp/helm-a.log")"
ok "helm install -n $NS_A --wait: $(($(date +%s) - T_START))s since the start"
if install_release "$NS_B" "$NAME_A" >"$tmp/helm-b-dup.log" 2>&1; then
    fail "a second release with controllerName $NAME_A was installed"
fi
grep -q "controllerName \"$NAME_A\" is already the controller name of release $RELEASE in namespace $NS_A" "$tmp/helm-b-dup.log" ||
    fail "the duplicate install failed for another reason: $(cat "$tmp/helm-b-dup.log")"
ok "refused: $(grep -o 'controllerName .*' "$tmp/helm-b-dup.log" | cut -c1-160)"
kubectl delete namespace "$NS_B" --wait=true --timeout=60s >/dev/null

step "release $RELEASE in $NS_B with controllerName $NAME_B"
install_release "$NS_B" "$NAME_B" >"$tmp/helm-b.log" 2>&1 || fail "helm install in $NS_B: $(cat "$tmp/helm-b.log")"
for ns in "$NS_A" "$NS_B"; do
    [[ $(jp clusterrole "$ns.$RELEASE-operator" -o jsonpath='{.metadata.annotations.meta\.helm\.sh/release-namespace}') == "$ns" ]] ||
        fail "ClusterRole $ns.$RELEASE-operator is not release $ns's"
done
ok "ClusterRole(Binding) $NS_A.$RELEASE-operator and $NS_B.$RELEASE-operator, PriorityClasses $(kubectl get priorityclass -o name | grep -c "h3i-co-") (one per release)"

step "nginx on TCP 443 of both nodes for $HOST_A and $HOST_B; listener $LISTENER_A (UDP $PORT_A, $NAME_A) and $LISTENER_B (UDP $PORT_B, $NAME_B)"
make_ca h3i-coexist-ca
leaf "$HOST_A"
leaf "$HOST_B"
mkdir -p "$tmp/www"
for node in "${NODES[@]}"; do start_nginx "$node" "$HOST_A" "$HOST_B"; done
kubectl create namespace "$NS_APP" >/dev/null
tls_secret "$NS_APP" a-tls "$HOST_A"
tls_secret "$NS_APP" b-tls "$HOST_B"
kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: co-a}
spec: {controller: example.com/h3i-co-a}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: co-b}
spec: {controller: example.com/h3i-co-b}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: a, namespace: $NS_APP, annotations: {h3-ingress.dev/enabled: "true"}}
spec:
  ingressClassName: co-a
  tls: [{hosts: [$HOST_A], secretName: a-tls}]
  rules: [{host: $HOST_A, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: a, port: {number: 80}}}}]}}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: b, namespace: $NS_APP, annotations: {h3-ingress.dev/enabled: "true"}}
spec:
  ingressClassName: co-b
  tls: [{hosts: [$HOST_B], secretName: b-tls}]
  rules: [{host: $HOST_B, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: b, port: {number: 80}}}}]}}]
---
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER_A}
spec:
  ingressClassName: co-a
  port: $PORT_A
  upstream: {address: "127.0.0.1:443"}
  http: {drainTimeoutSeconds: 10}
---
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER_B}
spec:
  controllerName: $NAME_B
  ingressClassName: co-b
  port: $PORT_B
  metrics: {address: "0.0.0.0:9486"}
  upstream: {address: "127.0.0.1:443"}
  http: {drainTimeoutSeconds: 10}
EOF
wait_ok 150 "$LISTENER_A Ready=True/AllHostsServing" ready_is "$LISTENER_A" True/AllHostsServing
wait_ok 150 "$LISTENER_B Ready=True/AllHostsServing" ready_is "$LISTENER_B" True/AllHostsServing
wait_ok 60 "$HOST_A over HTTP/3 on UDP $PORT_A of ${IPS[*]}" served "$HOST_A" "$PORT_A"
wait_ok 60 "$HOST_B over HTTP/3 on UDP $PORT_B of ${IPS[*]}" served "$HOST_B" "$PORT_B"
kubectl get h3l -o wide | indent

step "each installation ran only its own listener: DaemonSets, ClusterRole(Binding)s"
want="$NS_A/h3-ingress-$LISTENER_A $NS_B/h3-ingress-$LISTENER_B"
got=$(kubectl get ds -A -l "$DP_LABEL" -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {end}' | xargs)
[[ $got == "$want" ]] || fail "data plane DaemonSets: '$got', want '$want'"
want="$NS_A.h3-ingress-data-plane-$LISTENER_A $NS_B.h3-ingress-data-plane-$LISTENER_B"
got=$(kubectl get clusterrole -l app.kubernetes.io/managed-by=h3-ingress-operator -o jsonpath='{range .items[*]}{.metadata.name} {end}' | xargs)
[[ $got == "$want" ]] || fail "data plane ClusterRoles: '$got', want '$want'"
got=$(kubectl get clusterrolebinding -l app.kubernetes.io/managed-by=h3-ingress-operator -o jsonpath='{range .items[*]}{.metadata.name}={.subjects[0].namespace} {end}' | xargs)
[[ $got == "$NS_A.h3-ingress-data-plane-$LISTENER_A=$NS_A $NS_B.h3-ingress-data-plane-$LISTENER_B=$NS_B" ]] ||
    fail "data plane ClusterRoleBindings: '$got'"
ok "DaemonSets $(kubectl get ds -A -l "$DP_LABEL" -o name | xargs); ClusterRoleBindings $got"
for l in "$LISTENER_A" "$LISTENER_B"; do
    managers=$(jp h3l "$l" -o jsonpath='{range .metadata.managedFields[?(@.subresource=="status")]}{.manager} {end}' | xargs)
    [[ $managers == h3-ingress-operator ]] || fail "$l's status written by '$managers'"
done
ok "each listener's status has one writer (field manager h3-ingress-operator)"

# =============================================================================================
step "side by side for ${SIDE_BY_SIDE}s: both listeners' conditions every second, HTTP/3 to both every 15 s"
# Warning events on listeners, each with its count: the start-up ones (pods not scheduled yet)
# are there already; none may be added or repeated from here on.
listener_warnings() {
    kubectl get events -A --field-selector involvedObject.kind=Http3Listener,type=Warning \
        -o jsonpath='{range .items[*]}{.involvedObject.name} {.reason} {.count}/{.series.count} {.metadata.uid}{"\n"}{end}' | sort
}
WARNINGS_BEFORE=$(listener_warnings)
T_SIDE=$(date +%s)
poll_conditions "$LISTENER_A" "$tmp/cond-a.log" &
POLL_A=$!
poll_conditions "$LISTENER_B" "$tmp/cond-b.log" &
POLL_B=$!
BG_PIDS+=("$POLL_A" "$POLL_B")
PODS_A=$(dp_pods "$NS_A" | awk '{print $1, $2}' | sort)
h3_rounds=0 h3_failed=()
while (($(date +%s) < T_SIDE + SIDE_BY_SIDE)); do
    for ip in "${IPS[@]}"; do
        h3_ok "$ip" "$HOST_A" "$PORT_A" || h3_failed+=("+$(($(date +%s) - T_SIDE))s $HOST_A@$ip:$PORT_A")
        h3_ok "$ip" "$HOST_B" "$PORT_B" || h3_failed+=("+$(($(date +%s) - T_SIDE))s $HOST_B@$ip:$PORT_B")
    done
    h3_rounds=$((h3_rounds + 1))
    sleep 15
done
kill "$POLL_B" 2>/dev/null || true
((${#h3_failed[@]} == 0)) || fail "HTTP/3 requests failed side by side: ${h3_failed[*]}"
ok "$((h3_rounds * 4)) HTTP/3 requests in $h3_rounds rounds over $(($(date +%s) - T_SIDE))s: all 200"
for pair in "A $LISTENER_A" "B $LISTENER_B"; do
    read -r x l <<<"$pair"
    f=$tmp/cond-${x,,}.log
    one_value "$f" "$T_SIDE" >"$tmp/verdict-$x.txt" || { indent <"$tmp/verdict-$x.txt"; fail "$l's conditions changed side by side"; }
    ok "$l: $(head -1 "$tmp/verdict-$x.txt"): $(tail -1 "$tmp/verdict-$x.txt" | cut -c1-200)"
done
new_warnings=$(comm -13 <(echo "$WARNINGS_BEFORE") <(listener_warnings))
[[ -z $new_warnings ]] || fail "Warning events on the listeners side by side: $new_warnings"
ok "no Warning event on either listener side by side ($(grep -c . <<<"$WARNINGS_BEFORE" || true) from their start-up, none since)"

step "no 403/Forbidden line in either data plane's log (nor the operators')"
for ns in "$NS_A" "$NS_B"; do
    while read -r pod _; do
        mapfile -t files < <(pod_logs "$ns" "$pod" h3-ingress)
        ((${#files[@]} > 0)) || fail "no log file of $ns/$pod"
        n=$(cat "${files[@]}" | grep -ciE 'forbidden|\b403\b' || true)
        ((n == 0)) || fail "$ns/$pod logged $n 403/Forbidden line(s): $(cat "${files[@]}" | grep -iE 'forbidden|\b403\b' | head -3)"
        info "$ns/$pod: $(cat "${files[@]}" | wc -l) log lines, 0 with 403/Forbidden"
    done < <(dp_pods "$ns")
    op=$(kubectl -n "$ns" get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
    mapfile -t files < <(pod_logs "$ns" "$op" operator)
    n=$(cat "${files[@]}" | grep -ciE 'forbidden|\b403\b' || true)
    ((n == 0)) || fail "operator $ns/$op logged $n 403/Forbidden line(s): $(cat "${files[@]}" | grep -iE 'forbidden|\b403\b' | head -3)"
    info "operator $ns/$op: $(cat "${files[@]}" | wc -l) log lines, 0 with 403/Forbidden"
done
ok "no data plane or operator log has a 403/Forbidden line"

# =============================================================================================
step "socket.forceBuffers on $LISTENER_B (UDP $PORT_B): the surge roll completes under one uid"
OLD_B=$(dp_pods "$NS_B" | awk '{print $1}' | xargs)
read -r _ _ _ _ uid_before <<<"$(dp_pods "$NS_B" | head -1)"
T_ROLL=$(date +%s)
kubectl patch h3l "$LISTENER_B" --type merge -p '{"spec":{"socket":{"forceBuffers":true}}}' >/dev/null
rolled_b() {
    local p
    for p in $OLD_B; do kubectl -n "$NS_B" get pod "$p" >/dev/null 2>&1 && return 1; done
    [[ $(ready_pods "$NS_B") -eq 2 ]]
}
wait_ok 180 "the old pods ($OLD_B) replaced by two Ready pods" rolled_b
NEW_B=$(dp_pods "$NS_B" | awk '{print $1}' | xargs)
while read -r pod _ node _ uid; do
    [[ $uid == 0 && $uid_before == 0 ]] || fail "$pod runs as uid $uid (the old pods as $uid_before): one uid for the data plane"
    pid=$(pod_pid "$NS_B" "$pod" h3-ingress)
    eff=$((16#$(grep '^CapEff:' "/proc/$pid/status" | awk '{print $2}')))
    [[ $eff -eq $((1 << 12)) ]] || fail "$pod (pid $pid): CapEff $(printf '0x%x' "$eff"), want NET_ADMIN alone (0x1000)"
    info "$pod on $node: uid $(awk '/^Uid:/ {print $2}' "/proc/$pid/status"), CapEff 0x1000 (NET_ADMIN)"
done < <(dp_pods "$NS_B")
wait_ok 60 "$HOST_B over HTTP/3 on UDP $PORT_B of ${IPS[*]}" served "$HOST_B" "$PORT_B"
ok "rolled in $(($(date +%s) - T_ROLL))s: $OLD_B -> $NEW_B, uid $uid_before before and after"

# =============================================================================================
step "helm uninstall of $NS_B: its data plane, RBAC and Lease gone, UDP $PORT_B free; $LISTENER_A untouched"
T_UN=$(date +%s)
helm uninstall "$RELEASE" -n "$NS_B" --wait --timeout 300s >"$tmp/uninstall-b.log" 2>&1 ||
    fail "helm uninstall -n $NS_B: $(cat "$tmp/uninstall-b.log")"
ok "helm uninstall -n $NS_B returned after $(($(date +%s) - T_UN))s"
[[ -z $(all_pods "$NS_B") ]] || fail "data plane pods left in $NS_B: $(all_pods "$NS_B" | xargs)"
[[ -z $(kubectl -n "$NS_B" get ds,sa,svc -l "$DP_LABEL" -o name) ]] ||
    fail "data plane objects left in $NS_B: $(kubectl -n "$NS_B" get ds,sa,svc -l "$DP_LABEL" -o name | xargs)"
left=$(kubectl get clusterrole,clusterrolebinding,priorityclass -o name | grep "/$NS_B\." || true)
[[ -z $left ]] || fail "cluster-scoped objects of $NS_B left: $left"
[[ -z $(kubectl -n "$NS_B" get lease -o name) ]] || fail "Lease left in $NS_B: $(kubectl -n "$NS_B" get lease -o name)"
holders=$(udp_holders "$PORT_B")
[[ -z $holders ]] || fail "UDP $PORT_B still held: $holders"
ok "no pod, DaemonSet, ServiceAccount, ClusterRole(Binding), PriorityClass or Lease of $NS_B; nothing bound to UDP $PORT_B on ${NODES[*]}"
wait_ok 60 "$LISTENER_B Ready=False/NoController" ready_is "$LISTENER_B" False/NoController
info "$LISTENER_B: $(cond "$LISTENER_B" Ready message | cut -c1-200)"
kill "$POLL_A" 2>/dev/null || true
one_value "$tmp/cond-a.log" "$T_SIDE" >"$tmp/verdict-A-all.txt" || {
    indent <"$tmp/verdict-A-all.txt"
    fail "$LISTENER_A's conditions changed from the side-by-side start through B's uninstall"
}
ok "$LISTENER_A from the side-by-side start through B's roll and uninstall: $(head -1 "$tmp/verdict-A-all.txt")"
[[ $(dp_pods "$NS_A" | awk '{print $1, $2}' | sort) == "$PODS_A" ]] || fail "$LISTENER_A's pods changed: $(dp_pods "$NS_A")"
ok "$LISTENER_A's pods unchanged (same names and UIDs): $(awk '{printf "%s uid %.8s; ", $1, $2}' <<<"$PODS_A")"
for ip in "${IPS[@]}"; do
    "$PY" "$REPO/tests/py/h3client.py" "https://$HOST_A/whoami" --resolve "$HOST_A:$PORT_A:$ip" \
        --cacert "$tmp/pki/ca.crt" >"$tmp/h3-a-$ip.json" 2>"$tmp/h3-a-$ip.err" || fail "h3client to $ip: $(cat "$tmp/h3-a-$ip.err")"
    status=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["requests"][0].get("status"))' "$tmp/h3-a-$ip.json")
    [[ $status == 200 ]] || fail "h3client to $HOST_A on $ip: status $status"
done
ok "$HOST_A still served over HTTP/3 (h3client.py, 200) on ${IPS[*]}"
kubectl get h3l -o wide | indent

step_table
printf '\nCOEXIST TEST PASSED in %ss\n' "$(($(date +%s) - T_START))"
