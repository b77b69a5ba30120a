#!/usr/bin/env bash
# Version skew and certificate renewal on the test cluster of scripts/cluster.sh (root), with the
# chart, a Debian nginx on each node standing in for the TCP ingress, and an Http3Listener serving
# two hosts from annotated Ingresses:
#   (a) a newer CRD (the next schema revision, with a defaulted spec.upstream.futureSetting)
#       replaces the served one under the running binary; the operator and data plane pods are
#       restarted under it: every host is still served over HTTP/3 on both nodes, no pod
#       restarts, the listener says CRDCurrent=True/CRDNewer, the CRD is left alone (never
#       downgraded), each process logs the unknown field once, the kubectl plugin reads it;
#   (b) an older CRD (revision 0, without spec.upstream.servedCertificateGraceSeconds) with
#       crd.upgrade=false: CRDCurrent=False/CRDOutdated within one reconcile and a Warning
#       Event; then crd.upgrade=true: the operator applies its own CRD (server-side) and the
#       listener says CRDMatches;
#   (c) with upstream.verify: servedCertificate (the default), a host's certificate rotated in
#       both orders (nginx first, then the Secret first) while HTTP/3 requests run on both
#       nodes: zero failed requests, and the data plane's grace counter shows both leaves.
# Prints the counts; every check fails the run with a message naming what was expected.
#
#   tests/cluster/skew.sh        brings the cluster up if needed and leaves it up; its objects
#                                and nginx are removed on exit unless H3I_SKEW_KEEP=1
#
# Needs the debug binary (or $H3I_BINARY) and aioquic (scripts/setup.sh). Without root it prints
# SKIPPED (and fails when H3I_TESTS_REQUIRE_ROOT=1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_APP=h3i-skew
HOSTS=(skew1.h3i.test skew2.h3i.test)
CLASS=h3i-skew
LISTENER=skew
CRD=http3listeners.h3-ingress.dev
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
DP_SELECTOR="app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane"
OP_SELECTOR=app.kubernetes.io/component=operator
T_START=$(date +%s)
SUMMARY=()

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
fail_listeners() {
    echo "--- listener conditions:"
    kubectl get h3l "$LISTENER" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
    echo "--- CRD annotations:"
    kubectl get crd "$CRD" -o jsonpath='{.metadata.annotations}{"\n"}'
}
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nSKEW TEST FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root "SKEW TEST"

tmp=$(mktemp -d /tmp/h3i-skew.XXXXXX)
cleanup() {
    local rc=$?
    [[ -n ${LOAD_PID:-} ]] && kill "$LOAD_PID" 2>/dev/null
    remove_objects H3I_SKEW_KEEP "$LISTENER" "ingressclass/$CLASS" "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

# ---- helpers ---------------------------------------------------------------------------------
der_sha256() { openssl x509 -in "$1" -outform DER | sha256sum | cut -d' ' -f1; }
# chained_leaf NAME HOST: lib.sh's leaf with the CA appended, as a Secret from a CA whose
# certificate the chain carries (both sides can then recognise a renewal's issuer).
chained_leaf() {
    leaf "$1" "$2"
    cat "$tmp/pki/ca.crt" >>"$tmp/pki/$1.crt"
}
h3_ok() { # ADDR HOST CERT-SHA: one aioquic GET /whoami, 200 with that certificate
    "$PY" "$JPY" h3 --addr "$1" --host "$2" --cacert "$tmp/pki/ca.crt" --path /whoami --cert-sha "$3" >/dev/null 2>&1
}
served_everywhere() { # HOST CERT-SHA
    local ip
    for ip in "${IPS[@]}"; do h3_ok "$ip" "$1" "$2" || return 1; done
}
all_served() { served_everywhere "${HOSTS[0]}" "${CERT[0]}" && served_everywhere "${HOSTS[1]}" "${CERT[1]}"; }
cond() { jp h3l "$LISTENER" -o jsonpath="{.status.conditions[?(@.type==\"$1\")].$2}"; } # TYPE FIELD
crd_is() { [[ "$(cond CRDCurrent status)/$(cond CRDCurrent reason)" == "$1" ]]; }   # STATUS/REASON
crd_revision() { jp crd "$CRD" -o jsonpath='{.metadata.annotations.h3-ingress\.dev/schema-revision}'; }
pods_ready() { # SELECTOR COUNT: that many pods, all Ready, none being deleted
    local out
    out=$(kubectl -n "$NS_OP" get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}')
    [[ $(grep -c . <<<"$out") -eq $2 && $(grep -c '^|True$' <<<"$out") -eq $2 ]]
}
restarts() { kubectl -n "$NS_OP" get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount} {end}'; }
# crd_variant newer|older FILE: this binary's CRD one revision later with a defaulted
# spec.upstream.futureSetting, or one revision earlier (0: not annotated, as before revisions)
# without spec.upstream.servedCertificateGraceSeconds.
crd_variant() {
    "$H3I_BINARY" crd | "$PY" -c '
import sys, yaml
mode, crd = sys.argv[1], yaml.safe_load(sys.stdin)
ann = crd["metadata"]["annotations"]
rev = int(ann["h3-ingress.dev/schema-revision"])
up = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upstream"]["properties"]
if mode == "newer":
    ann["h3-ingress.dev/schema-revision"] = str(rev + 1)
    ann["h3-ingress.dev/schema-hash"] = "sha256:a-later-release"
    up["futureSetting"] = {"type": "integer", "default": 7, "description": "added by a later release"}
else:
    del ann["h3-ingress.dev/schema-revision"], ann["h3-ingress.dev/schema-hash"]
    del up["servedCertificateGraceSeconds"]
yaml.safe_dump(crd, sys.stdout)' "$1" >"$2"
}
unknown_field_lines() { # POD CONTAINER: lines of its log naming spec.upstream.futureSetting as unknown
    grep -c 'does not know.*spec.upstream.futureSetting' "$H3I_POD_LOGS/$NS_OP/$1/$2.log" || true
}
dp_metric() { # NAME LABEL=VALUE: summed over both nodes' data plane pods
    local ip total=0 v
    for ip in "${IPS[@]}"; do
        v=$("$PY" "$JPY" metric --url "http://$ip:9476/metrics" --name "$1" --label "$2") || return 1
        total=$((total + v))
    done
    echo "$total"
}
nginx_use() { # HOST SOURCE-BASENAME: nginx on every node presents that certificate (reloaded)
    local node
    for node in "${NODES[@]}"; do
        cp "$tmp/pki/$2.crt" "$tmp/nginx-$node/$1.crt"
        cp "$tmp/pki/$2.key" "$tmp/nginx-$node/$1.key"
        ip netns exec "$node" nginx -p "$tmp/nginx-$node/" -c "$tmp/nginx-$node/nginx.conf" -s reload 2>/dev/null
    done
}

# =================================================================================================
cluster_up
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
if kubectl get ns "$NS_OP" >/dev/null 2>&1 || kubectl get crd "$CRD" >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run left" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass "$CLASS" --ignore-not-found >/dev/null
REV=$("$H3I_BINARY" crd | "$PY" -c 'import sys, yaml; print(yaml.safe_load(sys.stdin)["metadata"]["annotations"]["h3-ingress.dev/schema-revision"])')
[[ $REV =~ ^[0-9]+$ ]] || fail "the binary's CRD has no schema revision annotation"
ok "up in $(($(date +%s) - t0))s; binary $H3I_BINARY ($("$H3I_BINARY" --version)), CRD schema revision $REV"

step "helm install the chart; nginx on both nodes serving ${HOSTS[*]}; an Http3Listener with two annotated Ingresses"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
[[ $(crd_revision) == "$REV" ]] || fail "the chart's CRD has revision '$(crd_revision)', want $REV"
make_ca h3i-skew-ca
for i in 0 1; do chained_leaf "${HOSTS[$i]}" "${HOSTS[$i]}"; done
CERT=("$(der_sha256 "$tmp/pki/${HOSTS[0]}.crt")" "$(der_sha256 "$tmp/pki/${HOSTS[1]}.crt")")
mkdir -p "$tmp/www"
for node in "${NODES[@]}"; do start_nginx "$node" "${HOSTS[@]}"; done
kubectl create namespace "$NS_APP" >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: $CLASS}
spec: {controller: example.com/h3i-skew}
EOF
for h in "${HOSTS[@]}"; do
    tls_secret "$NS_APP" "${h%%.*}-tls" "$h"
    kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: ${h%%.*}, namespace: $NS_APP, annotations: {h3-ingress.dev/enabled: "true"}}
spec:
  ingressClassName: $CLASS
  tls: [{hosts: [$h], secretName: ${h%%.*}-tls}]
  rules: [{host: $h, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}}]
EOF
done
kubectl apply -f - >/dev/null <<EOF
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER}
spec:
  ingressClassName: $CLASS
  upstream: {address: "127.0.0.1:443"}
  http: {drainTimeoutSeconds: 2}
EOF
wait_ok 120 "both data plane pods Ready" pods_ready "$DP_SELECTOR" 2
wait_ok 60 "${HOSTS[*]} served over HTTP/3 on ${IPS[*]}" all_served
wait_ok 30 "the listener says CRDCurrent=True/CRDMatches" crd_is True/CRDMatches
[[ $(jp h3l "$LISTENER" -o jsonpath='{.spec.upstream.verify}') == servedCertificate ]] || fail "upstream.verify is not servedCertificate"

# =================================================================================================
step "(a) a newer CRD (revision $((REV + 1)), defaulted spec.upstream.futureSetting) replaces the served one"
crd_variant newer "$tmp/crd-newer.yaml"
kubectl replace -f "$tmp/crd-newer.yaml" >/dev/null
wait_ok 30 "the API server fills futureSetting=7 into the listener" \
    eval '[[ $(jp h3l "$LISTENER" -o jsonpath="{.spec.upstream.futureSetting}") == 7 ]]'
wait_ok 30 "the running operator says CRDCurrent=True/CRDNewer" crd_is True/CRDNewer
info "$(cond CRDCurrent message)"

step "(a) the operator and both data plane pods restarted under the newer CRD"
old_pods=$(kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}')
t_restart=$(date +%s)
kubectl -n "$NS_OP" delete pods -l "$OP_SELECTOR" --wait=false >/dev/null
kubectl -n "$NS_OP" delete pods -l "$DP_SELECTOR" --wait=false >/dev/null
fresh() { # no pod from before the restart is left, and the new ones are Ready
    local p
    for p in $old_pods; do jp pod -n "$NS_OP" "$p" -o name >/dev/null && return 1; done
    pods_ready "$OP_SELECTOR" 1 && pods_ready "$DP_SELECTOR" 2
}
wait_ok 120 "a new operator pod and two new data plane pods, all Ready" fresh
wait_ok 60 "every host served over HTTP/3 on both nodes by the new pods" all_served
OP_POD=$(kubectl -n "$NS_OP" get pods -l "$OP_SELECTOR" -o jsonpath='{.items[0].metadata.name}')
new_operator_read_it() { # its own log: the CRD judged newer, the listener read past futureSetting
    grep -q 'newer than this operator' "$H3I_POD_LOGS/$NS_OP/$OP_POD/operator.log" &&
        [[ $(unknown_field_lines "$OP_POD" operator) -ge 1 ]] && crd_is True/CRDNewer
}
wait_ok 60 "the new operator $OP_POD judged the CRD newer and reconciled the listener" new_operator_read_it
a_took=$(($(date +%s) - t_restart))
sleep 5 # time to crash, as the old binaries did here (CrashLoopBackOff within seconds)
for sel in "$OP_SELECTOR" "$DP_SELECTOR"; do
    r=$(restarts "$sel")
    [[ $r =~ ^([^ ]+=0 )+$ ]] || fail "pods restarted under the newer CRD: $r"
done
ok "no restarts: $(restarts "$OP_SELECTOR")$(restarts "$DP_SELECTOR")"
[[ $(crd_revision) == $((REV + 1)) ]] || fail "the operator changed the newer CRD (revision now $(crd_revision))"
ok "the newer CRD is left alone (revision $((REV + 1)))"
n=$(unknown_field_lines "$OP_POD" operator)
[[ $n == 1 ]] || fail "operator $OP_POD logged the unknown field $n times, want once"
for pod in $(kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{.items[*].metadata.name}'); do
    n=$(unknown_field_lines "$pod" h3-ingress)
    [[ $n == 1 ]] || fail "data plane $pod logged the unknown field $n times, want once"
done
ok "the operator and each data plane pod logged spec.upstream.futureSetting once"
mkdir -p "$tmp/bin" && ln -sf "$H3I_BINARY" "$tmp/bin/kubectl-h3_ingress"
PATH=$tmp/bin:$PATH kubectl h3-ingress status "$LISTENER" >"$tmp/plugin.out" 2>"$tmp/plugin.err" ||
    fail "kubectl h3-ingress status: $(cat "$tmp/plugin.err")"
grep -q 'spec.upstream.futureSetting' "$tmp/plugin.err" || fail "the plugin did not note the unknown field: $(cat "$tmp/plugin.err")"
for h in "${HOSTS[@]}"; do grep -q "$h" "$tmp/plugin.out" || fail "the plugin's table lacks $h: $(cat "$tmp/plugin.out")"; done
ok "kubectl h3-ingress status reads it: $(head -c 160 "$tmp/plugin.err")"
SUMMARY+=("(a) newer CRD: 2/2 hosts served on 2/2 nodes by restarted pods ${a_took}s after the restart, 0 restarts, CRDNewer")

# =================================================================================================
step "(b) crd.upgrade=false, then an older CRD (revision 0, without servedCertificateGraceSeconds)"
helm upgrade "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --reuse-values --set crd.upgrade=false \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm upgrade: $(cat "$tmp/helm.log")"
wait_ok 60 "one operator pod, running with --no-crd-upgrade" eval \
    '[[ $(kubectl -n "$NS_OP" get pods -l "$OP_SELECTOR" -o jsonpath="{.items[*].spec.containers[0].args}") == *--no-crd-upgrade* ]] && pods_ready "$OP_SELECTOR" 1'
crd_variant older "$tmp/crd-older.yaml"
kubectl replace -f "$tmp/crd-older.yaml" >/dev/null
t_old=$(date +%s)
wait_ok 60 "CRDCurrent=False/CRDOutdated" crd_is False/CRDOutdated
b_took=$(($(date +%s) - t_old))
message=$(cond CRDCurrent message)
[[ $message == *"drops spec.upstream.servedCertificateGraceSeconds"* ]] || fail "the message does not name the dropped field: $message"
info "$message"
warning() {
    kubectl get events -A --field-selector "involvedObject.kind=Http3Listener,involvedObject.name=$LISTENER,reason=CRDOutdated" \
        -o jsonpath='{range .items[*]}{.type}{"\n"}{end}' | grep -qx Warning
}
wait_ok 30 "a Warning Event CRDOutdated on the listener" warning
wait_ok 30 "still served on both nodes" all_served
SUMMARY+=("(b) older CRD: CRDOutdated after ${b_took}s (the CRD watch reconciles at once), Warning Event")

step "(b) crd.upgrade=true: the operator upgrades the CRD to revision $REV"
t_up=$(date +%s)
helm upgrade "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --reuse-values --set crd.upgrade=true \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm upgrade: $(cat "$tmp/helm.log")"
wait_ok 90 "the CRD has revision $REV again" eval '[[ $(crd_revision) == "$REV" ]]'
grace=$(jp crd "$CRD" -o jsonpath='{.spec.versions[0].schema.openAPIV3Schema.properties.spec.properties.upstream.properties.servedCertificateGraceSeconds.default}')
[[ $grace == 300 ]] || fail "the upgraded CRD lacks servedCertificateGraceSeconds (default '$grace')"
managers=$(jp crd "$CRD" -o jsonpath='{.metadata.managedFields[*].manager}')
[[ $managers == *h3-ingress-operator* ]] || fail "the CRD was not applied by h3-ingress-operator: $managers"
wait_ok 30 "CRDCurrent=True/CRDMatches" crd_is True/CRDMatches
SUMMARY+=("(b) crd.upgrade=true: CRD back to revision $REV by the operator's server-side apply $(($(date +%s) - t_up))s after helm upgrade")

# =================================================================================================
step "(c) ${HOSTS[0]} rotated in both orders under servedCertificate, HTTP/3 requests running on both nodes"
chained_leaf v2 "${HOSTS[0]}"
chained_leaf v3 "${HOSTS[0]}"
V2=$(der_sha256 "$tmp/pki/v2.crt")
V3=$(der_sha256 "$tmp/pki/v3.crt")
targets=()
for ip in "${IPS[@]}"; do targets+=(--target "$ip,${HOSTS[0]}"); done
"$PY" "$JPY" load --seconds 300 --stop-file "$tmp/stop" --pause 0.2 --per-connection 2 \
    --cacert "$tmp/pki/ca.crt" --path /whoami "${targets[@]}" >"$tmp/load.out" 2>&1 &
LOAD_PID=$!
sleep 3
info "nginx first: both nodes' nginx present v2, the Secret follows 5 s later"
nginx_use "${HOSTS[0]}" v2
sleep 5
tls_secret "$NS_APP" "${HOSTS[0]%%.*}-tls" v2
wait_ok 60 "both nodes serve v2" served_everywhere "${HOSTS[0]}" "$V2"
sleep 3
info "the Secret first: v3, nginx follows 5 s after both nodes serve it"
tls_secret "$NS_APP" "${HOSTS[0]%%.*}-tls" v3
wait_ok 60 "both nodes serve v3" served_everywhere "${HOSTS[0]}" "$V3"
sleep 5
nginx_use "${HOSTS[0]}" v3
sleep 3
touch "$tmp/stop"
load_rc=0
wait "$LOAD_PID" || load_rc=$?
LOAD_PID=
indent <"$tmp/load.out"
[[ $load_rc -eq 0 ]] || fail "requests failed during the rotation: $(cat "$tmp/load.out")"
next=$(dp_metric h3_ingress_upstream_certificate_grace_total leaf=next)
previous=$(dp_metric h3_ingress_upstream_certificate_grace_total leaf=previous)
tls_errors=$(dp_metric h3_ingress_upstream_errors_total kind=tls)
info "data plane, both nodes: handshakes accepted with the next leaf $next, the previous leaf $previous; upstream TLS errors $tls_errors"
((next > 0 && previous > 0)) || fail "both orders should have used the grace (next $next, previous $previous)"
((tls_errors == 0)) || fail "$tls_errors upstream TLS errors"
SUMMARY+=("(c) rotation both orders: $(cut -d, -f1 <"$tmp/load.out" | head -n 1), grace next $next / previous $previous, TLS errors $tls_errors")

step "(c) control: with upstream.servedCertificateGraceSeconds 0 the same nginx-first switch fails until the Secret follows"
kubectl patch h3l "$LISTENER" --type=merge -p '{"spec": {"upstream": {"servedCertificateGraceSeconds": 0}}}' >/dev/null
chained_leaf v4 "${HOSTS[0]}"
V4=$(der_sha256 "$tmp/pki/v4.crt")
sleep 3 # the data plane applies the listener change live
nginx_use "${HOSTS[0]}" v4
refused=0
for ip in "${IPS[@]}"; do
    rep=$("$PY" "$JPY" h3 --addr "$ip" --host "${HOSTS[0]}" --cacert "$tmp/pki/ca.crt" --path /whoami 2>&1) || true
    [[ $rep == *"status 502"* ]] && refused=$((refused + 1))
    info "$ip: ${rep:0:150}"
done
((refused == ${#IPS[@]})) || fail "without the grace the nginx-first switch should get 502 on every node ($refused of ${#IPS[@]})"
tls_secret "$NS_APP" "${HOSTS[0]%%.*}-tls" v4
wait_ok 60 "both nodes serve v4 once the Secret follows" served_everywhere "${HOSTS[0]}" "$V4"
SUMMARY+=("(c) control, grace 0: the nginx-first switch got 502 on $refused of ${#IPS[@]} nodes until the Secret followed")

step "done"
printf '\n%s\n' "${SUMMARY[@]}"
step_table
echo "SKEW TEST PASSED in $(($(date +%s) - T_START))s"
