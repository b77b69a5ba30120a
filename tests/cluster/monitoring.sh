#!/usr/bin/env bash
# The chart's monitoring objects under a real Prometheus Operator, on the test cluster's real
# nodes (H3I_NODES=real). A Prometheus set up as kube-prometheus-stack's defaults
# (tests/cluster/prometheus-up.sh: it selects monitors and rules labelled
# release=kube-prometheus-stack); the chart installed as its user would, with
# metrics.serviceMonitor, podMonitor and prometheusRule enabled and that label on each; a Debian
# nginx per node as the TCP ingress, its stub_status exported by Debian's
# prometheus-nginx-exporter (scraped through a ScrapeConfig) as the share's denominator (the
# chart's `generic` preset, no per-host counter); one Http3Listener serving shop.h3i.test. Then
# the checks of tests/cluster/monitoring_checks.py, each a query and its expected answer:
#   - every data-plane pod (one per node) and the operator are targets with up == 1;
#   - h3_ingress_* series exist for each data-plane pod;
#   - every recording rule and alert of the chart's PrometheusRule is loaded and healthy;
#   - every query of the dashboard returns data, after HTTP/3 requests to both nodes;
#   - during a surge roll, while a node runs the old and the new pod, one target per node (the
#     PodMonitor drops the pod name: the two pods share the node's metrics port);
#   - the listener's nodeSelector matching no node (its pods go): H3IngressDataPlaneTargetsMissing
#     pending, then firing, then inactive once the pods are back;
#   - the operator scaled to 0: H3IngressOperatorDown pending, then firing, then inactive.
# Both alerts get `for: 30s` through the chart's metrics.prometheusRule.alertFor (5m and 10m by
# default) and Prometheus evaluates every 15s, so the run stays short.
#
#   tests/cluster/monitoring.sh    brings the cluster up if needed (H3I_NODES=real) and leaves it
#                                  up; its objects and the monitoring stack are removed unless
#                                  H3I_MONITORING_KEEP=1
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
CHECKS=$REPO/tests/cluster/monitoring_checks.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_APP=h3i-monitoring
HOST=shop.h3i.test
CLASS=h3i-monitoring
LISTENER=mon
# The roll's old pods drain a slow download beside the new ones: 640 KiB at 32 KiB/s, about 20 s
# (an old pod without requests in flight leaves at once), within http.drainTimeoutSeconds.
SLOW_BYTES=655360
SLOW_RATE=32k
DRAIN=30
PROM_RELEASE=kube-prometheus-stack
PROM_NS=monitoring
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
STUB_PORT=8080     # nginx stub_status on 127.0.0.1 of each node
EXPORTER_PORT=9113 # prometheus-nginx-exporter on each node's address
DP_JOB=$NS_OP/$RELEASE-data-plane # the PodMonitor's job: <namespace>/<name>
OP_JOB=$RELEASE-operator-metrics   # the ServiceMonitor's: the Service's name
DP_SELECTOR="app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane"
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
fail_listeners() {
    kubectl get h3l -o wide
    kubectl -n "$PROM_NS" get pods -o wide
}
fail() {
    printf '\nMONITORING CHECKS FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    [[ -s ${RESULTS:-} ]] && "$PY" "$CHECKS" table --results "$RESULTS" >&2
    failure_report fail_listeners true
    exit 1
}
skip_unless_root "MONITORING CHECKS"

tmp=$(mktemp -d /tmp/h3i-monitoring.XXXXXX)
RESULTS=$tmp/results.jsonl
EXPORTERS=()
cleanup() {
    local rc=$? p
    for p in "${EXPORTERS[@]}"; do kill "$p" 2>/dev/null || true; done
    if [[ ${H3I_MONITORING_KEEP:-0} != 1 && -n ${KUBECONFIG:-} ]]; then
        "$REPO/tests/cluster/prometheus-up.sh" down --no-wait >/dev/null 2>&1 || true
    fi
    remove_objects H3I_MONITORING_KEEP "$LISTENER" "ingressclass/$CLASS" "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

check() { "$PY" "$CHECKS" "$1" --results "$RESULTS" --prom "$PROM_URL" "${@:2}" || fail "check $1 ${*:2}"; }
ready_pods() { kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true; }
two_ready() { [[ $(ready_pods) -eq 2 ]]; }
no_dp_pods() { [[ -z $(kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o name) ]]; }
h3_ok() { "$PY" "$REPO/tests/cluster/journey.py" h3 --addr "$1" --host "$HOST" --cacert "$tmp/pki/ca.crt" --path /whoami >/dev/null 2>&1; }
served_everywhere() { local ip; for ip in "${IPS[@]}"; do h3_ok "$ip" || return 1; done; }

# =================================================================================================
cluster_up
pods_real || fail "monitoring checks need real nodes: H3I_NODES=real scripts/cluster.sh up (this cluster runs the node agent)"
if kubectl get ns "$NS_OP" >/dev/null 2>&1 || kubectl get ns "$NS_APP" >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run left" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass "$CLASS" --ignore-not-found >/dev/null

# =================================================================================================
step "Prometheus Operator and a Prometheus as kube-prometheus-stack sets them up (tests/cluster/prometheus-up.sh)"
PROM_URL=$(H3I_PROM_NAMESPACE=$PROM_NS H3I_PROM_RELEASE=$PROM_RELEASE "$REPO/tests/cluster/prometheus-up.sh" up 2> >(indent >&2)) ||
    fail "tests/cluster/prometheus-up.sh"
ok "Prometheus at $PROM_URL: $(curl -sf "$PROM_URL/api/v1/status/buildinfo" | python3 -c 'import json,sys; d=json.load(sys.stdin)["data"]; print("version", d["version"], d["goVersion"])')"

# =================================================================================================
step "helm install with metrics.serviceMonitor, podMonitor and prometheusRule enabled, labelled release=$PROM_RELEASE"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
read -r -a pull <<<"$(pull_secret_args "$NS_OP")"
cat >"$tmp/values.yaml" <<EOF
image: {repository: $IMAGE_REPO}
metrics:
  serviceMonitor: {enabled: true, labels: {release: $PROM_RELEASE}}
  podMonitor: {enabled: true, labels: {release: $PROM_RELEASE}}
  prometheusRule:
    enabled: true
    labels: {release: $PROM_RELEASE}
    # Debian nginx is NGINX Open Source: stub_status has no per-host counter.
    share: {preset: generic, generic: {expr: "sum(rate(nginx_http_requests_total[5m]))", perHost: false}}
    # Short, so that the run sees them fire (defaults: 5m and 10m).
    alertFor: {H3IngressDataPlaneTargetsMissing: 30s, H3IngressOperatorDown: 30s}
EOF
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" -f "$tmp/values.yaml" "${pull[@]}" \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
for kind in servicemonitor podmonitor prometheusrule; do
    info "$kind: $(kubectl -n "$NS_OP" get "$kind" -o jsonpath='{range .items[*]}{.metadata.name} release={.metadata.labels.release}{end}')"
done

# =================================================================================================
step "nginx on both nodes serving $HOST, its stub_status exported by prometheus-nginx-exporter (a ScrapeConfig); an annotated Ingress and an Http3Listener"
make_ca "h3i-monitoring-ca"
leaf "$HOST" "$HOST"
mkdir -p "$tmp/www/slow"
head -c "$SLOW_BYTES" /dev/urandom >"$tmp/www/slow/roll.bin"
NGINX_EXTRA="location /slow/ { limit_rate $SLOW_RATE; }"
NGINX_HTTP_EXTRA="server { listen 127.0.0.1:$STUB_PORT; location = /stub_status { stub_status; } }"
for i in "${!NODES[@]}"; do
    start_nginx "${NODES[$i]}" "$HOST"
    ip netns exec "${NODES[$i]}" prometheus-nginx-exporter -nginx.scrape-uri="http://127.0.0.1:$STUB_PORT/stub_status" \
        -web.listen-address="${IPS[$i]}:$EXPORTER_PORT" >"$tmp/exporter-$i.log" 2>&1 &
    EXPORTERS+=($!)
done
targets=$(printf '"%s:'"$EXPORTER_PORT"'",' "${IPS[@]}")
kubectl apply -f - >/dev/null <<EOF
apiVersion: monitoring.coreos.com/v1alpha1
kind: ScrapeConfig
metadata: {name: nginx-stub-status, namespace: $PROM_NS, labels: {release: $PROM_RELEASE}}
spec:
  scrapeInterval: 15s
  staticConfigs: [{targets: [${targets%,}], labels: {tcp_ingress: nginx}}]
EOF
app_objects shop
wait_ok 120 "both data plane pods Ready" two_ready
wait_ok 60 "$HOST served over HTTP/3 on ${IPS[*]}" served_everywhere
info "pod annotation h3-ingress.dev/metrics-port: $(kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.annotations.h3-ingress\.dev/metrics-port} {end}')"

# =================================================================================================
step "targets: every data plane pod and the operator scraped, up == 1"
read -r -a node_list <<<"$H3I_NODES"
nodes_csv=$(IFS=,; echo "${node_list[*]}")
check targets --job "$DP_JOB" --nodes "$nodes_csv" --operator-job "$OP_JOB" --listener "$LISTENER" --timeout 120
check series --job "$DP_JOB" --nodes "$nodes_csv"

step "rules: the chart's recording rules and alerts loaded by Prometheus"
kubectl -n "$NS_OP" get prometheusrule "$RELEASE" -o json >"$tmp/rule.json"
check rules --rule-object "$tmp/rule.json" --timeout 120
check alert --name H3IngressDataPlaneTargetsMissing --state inactive --timeout 60
check alert --name H3IngressOperatorDown --state inactive --timeout 60

step "dashboard: HTTP/3 requests to both nodes (tests/py/h3client.py), then every dashboard query returns data"
for round in 1 2 3; do
    for ip in "${IPS[@]}"; do
        "$PY" "$REPO/tests/py/h3client.py" "https://$HOST/whoami" --resolve "$HOST:443:$ip" --cacert "$tmp/pki/ca.crt" \
            --requests '[{"path": "/whoami"}, {"path": "/whoami"}, {"path": "/missing"}, {"path": "/whoami"}]' \
            >"$tmp/h3-$round-$ip.json" || fail "h3client.py to $ip: $(head -c 300 "$tmp/h3-$round-$ip.json")"
    done
done
info "12 connections, 48 requests (36 x 200, 12 x 404)"
check dashboard --timeout 150

# =================================================================================================
step "a surge roll (socket.receiveBufferBytes changed): one target per node while a node runs the old and the new pod"
# A slow download per node keeps the first node's old pod draining beside its new one.
held=()
for ip in "${IPS[@]}"; do
    "$PY" "$REPO/tests/py/h3client.py" "https://$HOST/slow/roll.bin" --resolve "$HOST:443:$ip" --cacert "$tmp/pki/ca.crt" \
        --output /dev/null --timeout 60 >/dev/null 2>&1 &
    held+=($!)
done
sleep 2
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"socket":{"receiveBufferBytes":3145728}}}' >/dev/null
"$PY" "$CHECKS" roll --results "$RESULTS" --prom "$PROM_URL" --job "$DP_JOB" --namespace "$NS_OP" \
    --selector "$DP_SELECTOR" --timeout 90 || fail "check roll"
kill "${held[@]}" 2>/dev/null || true
roll_done() { kubectl -n "$NS_OP" rollout status "daemonset/h3-ingress-$LISTENER" --timeout 5s; }
wait_ok 120 "the roll done on both nodes (kubectl rollout status)" roll_done

# =================================================================================================
step "the listener's nodeSelector matches no node: its data plane pods go, H3IngressDataPlaneTargetsMissing"
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"nodeSelector":{"h3i-monitoring/none":"true"}}}' >/dev/null
wait_ok 60 "no data plane pod of $LISTENER left" no_dp_pods
check alert --name H3IngressDataPlaneTargetsMissing --state pending --timeout 60
check alert --name H3IngressDataPlaneTargetsMissing --state firing --timeout 60
kubectl patch h3l "$LISTENER" --type json -p '[{"op":"remove","path":"/spec/nodeSelector"}]' >/dev/null
wait_ok 120 "both data plane pods Ready again" two_ready
check alert --name H3IngressDataPlaneTargetsMissing --state inactive --timeout 90
check targets --job "$DP_JOB" --nodes "$nodes_csv" --operator-job "$OP_JOB" --listener "$LISTENER" --timeout 60

step "the operator scaled to 0: H3IngressOperatorDown"
kubectl -n "$NS_OP" scale deployment "$RELEASE-operator" --replicas 0 >/dev/null
check alert --name H3IngressOperatorDown --state pending --timeout 90
check alert --name H3IngressOperatorDown --state firing --timeout 60
kubectl -n "$NS_OP" scale deployment "$RELEASE-operator" --replicas 1 >/dev/null
check alert --name H3IngressOperatorDown --state inactive --timeout 120

step "done: monitoring checks"
"$PY" "$CHECKS" table --results "$RESULTS" || fail "a check failed"
step_table
printf '\nMONITORING CHECKS PASSED in %ss\n' "$(($(date +%s) - T_START))"
