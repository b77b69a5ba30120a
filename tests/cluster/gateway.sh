#!/usr/bin/env bash
# Gateway API on the test cluster of scripts/cluster.sh (root): the standard-channel CRDs of
# sigs.k8s.io/gateway-api (pinned below, fetched through the Go module proxy into the cluster's
# cache outside the repo), the chart, a Debian nginx on each node standing in for the TCP
# gateway, a Gateway with HTTPS listeners, an annotated HTTPRoute whose accepted parent status
# the test writes as a gateway controller would (no controller runs), and an Http3Listener with
# gatewayClassName. Then: the host is served over HTTP/3 on both nodes with the Gateway's
# certificate; status, `kubectl h3-ingress status` and Events name the route; the operator never
# writes the route's status; a cross-namespace certificate is RefNotPermitted until a
# ReferenceGrant exists, then served; removing the annotation stops serving. Every check fails
# the run with a message naming what was expected.
#
#   tests/cluster/gateway.sh      brings the cluster up if needed and leaves it up; its own
#                                 objects and nginx are removed on exit unless
#                                 H3I_GATEWAY_KEEP=1
#   H3I_GATEWAY_DOWN=1 tests/cluster/gateway.sh
#                                 also `scripts/cluster.sh down` on exit, whatever happened
#                                 (scripts/test.sh)
#
# Needs the debug binary (or $H3I_BINARY), aioquic (scripts/setup.sh) and Go with the module
# proxy (the CRDs). Without root it prints SKIPPED (and fails when H3I_TESTS_REQUIRE_ROOT=1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
H3CLIENT=$REPO/tests/py/h3client.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_INFRA=h3i-gw-infra   # the Gateway and its own certificate
NS_APP=h3i-gw-app       # the HTTPRoutes
NS_CERTS=h3i-gw-certs   # a certificate shared from another namespace
HOST=gw.h3i.test
HOST_X=cross.h3i.test
CLASS=h3i-test
LISTENER=gateway
DP=h3-ingress-$LISTENER
NS_HOSTS=$NS_OP-hosts   # the certificate mirrors
DP_USER=system:serviceaccount:$NS_OP:$DP
OP_USER=system:serviceaccount:$NS_OP:$RELEASE
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
TEST_MANAGER=h3i-gateway-test # the field manager the test writes route status with
DOC_NS=() # namespaces the documented example names, made for its dry run
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
# On failure: the listener's per-host status, and the logs of every pod that ran in $NS_OP
# (the node agent keeps the directories of deleted pods too).
fail_listeners() {
    echo "--- listener status hosts:"
    kubectl get h3l "$LISTENER" -o jsonpath='{range .status.hosts[*]}{.name} {.state} {.reason} {.message}{"\n"}{end}'
}
fail_pods() {
    local d
    for d in "$H3I_POD_LOGS/$NS_OP"/*/; do
        [[ -d $d ]] || continue
        basename "$d"
    done
}
fail() {
    printf '\nGATEWAY TEST FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root "GATEWAY TEST"

tmp=$(mktemp -d /tmp/h3i-gateway.XXXXXX)
cleanup() {
    local rc=$?
    remove_objects H3I_GATEWAY_KEEP "$LISTENER" "gatewayclass/$CLASS" "$NS_APP" "$NS_INFRA" "$NS_CERTS" "$NS_OP"
    if [[ ${H3I_GATEWAY_DOWN:-0} == 1 ]]; then
        "$CLUSTER" down 2>&1 | tail -n 2 || rc=1
    fi
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

# ---- PKI (make_ca, leaf: lib.sh) -----------------------------------------------------------------
der_sha256() { openssl x509 -in "$1" -outform DER | sha256sum | cut -d' ' -f1; }

# ---- HTTP/3 through aioquic (tests/py/h3client.py) ----------------------------------------------
# h3_get ADDR HOST CERT-SHA: GET /whoami answers 200 with that certificate; prints one line.
h3_get() {
    local rep
    rep=$("$PY" "$H3CLIENT" "https://$2/whoami" --resolve "$2:443:$1" --cacert "$tmp/pki/ca.crt" \
        --connect-timeout 5 --timeout 10 --output - 2>/dev/null) || true
    "$PY" - "$1" "$2" "$3" "$rep" <<'EOF'
import json, sys
addr, host, want, raw = sys.argv[1:5]
try:
    rep = json.loads(raw)
except ValueError:
    sys.exit(f"FAIL: {host} via {addr}: no JSON from h3client.py")
hs = rep["connection"]["handshake"]
if not hs.get("ok"):
    sys.exit(f"FAIL: {host} via {addr}: handshake failed: {hs}")
r = (rep.get("requests") or [{}])[0]
cert = (rep["connection"].get("server_cert") or {}).get("sha256", "")
alt = dict((k.lower(), v) for k, v in r.get("headers", [])).get("alt-svc", "")
if r.get("status") != 200 or cert != want:
    sys.exit(f"FAIL: {host} via {addr}: status {r.get('status')}, cert {cert[:12]}, want 200 and {want[:12]}")
print(f"aioquic {addr:>10} https://{host}/whoami: HTTP/3 {r['status']} ALPN {hs.get('alpn')}, "
      f"cert {cert[:12]}, body {r.get('body', '').strip()!r}, Alt-Svc {alt!r}")
EOF
}
# h3_refused ADDR HOST: the handshake fails with a TLS alert (the data plane has no such host).
h3_refused() {
    local rep
    rep=$("$PY" "$H3CLIENT" "https://$2/whoami" --resolve "$2:443:$1" --cacert "$tmp/pki/ca.crt" \
        --connect-timeout 5 --timeout 10 2>/dev/null) || true
    "$PY" - "$1" "$2" "$rep" <<'EOF'
import json, sys
addr, host, raw = sys.argv[1:4]
hs = json.loads(raw)["connection"]["handshake"]
if hs.get("ok") or hs.get("kind") != "tls_alert":
    sys.exit(f"FAIL: {host} via {addr}: handshake {hs}, want refused with a TLS alert")
print(f"aioquic {addr:>10} {host}: handshake refused ({hs.get('kind')})")
EOF
}
served_everywhere() { # HOST CERT-SHA
    local ip
    for ip in $H3I_NODE_IPS; do h3_get "$ip" "$1" "$2" || return 1; done
}
refused_everywhere() { # HOST
    local ip
    for ip in $H3I_NODE_IPS; do h3_refused "$ip" "$1" || return 1; done
}

# ---- objects ------------------------------------------------------------------------------------
host_field() { # HOST FIELD: that field of the listener's status entry for HOST (hosts not served)
    jp h3l "$LISTENER" -o jsonpath="{.status.hosts[?(@.name==\"$1\")].$2}"
}
host_reason_is() { [[ $(host_field "$1" reason) == "$2" ]]; }
# The row of HOST in `kubectl h3-ingress status` (served hosts come from a pod's /hosts).
plugin_row() {
    PATH=$tmp/plugin:$PATH kubectl h3-ingress status "$LISTENER" 2>/dev/null | awk -v h="$1" '$1 == h'
}
plugin_serving() { plugin_row "$1" | grep -qE "^ *$1 +Serving +Serving "; }
mirror_hosts() { # SOURCE (namespace/name): the hosts of the listener's mirror of that Secret
    kubectl -n "$NS_HOSTS" get secrets -l "h3-ingress.dev/listener=$LISTENER" -o json |
        python3 -c 'import json,sys,base64
for s in json.load(sys.stdin)["items"]:
    if s["metadata"].get("annotations", {}).get("h3-ingress.dev/source") == sys.argv[1]:
        print(",".join(h["name"] for h in json.loads(base64.b64decode(s["data"]["hosts.json"]))["hosts"]))' "$1"
}
route_yaml() { # NAME HOST SECTION ANNOTATED(true|false)
    local ann="{}"
    [[ $4 == true ]] && ann='{h3-ingress.dev/enabled: "true"}'
    cat <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: $1, namespace: $NS_APP, annotations: $ann}
spec:
  parentRefs: [{name: gw, namespace: $NS_INFRA, sectionName: $3}]
  hostnames: [$2]
  rules: [{backendRefs: [{name: shop, port: 80}]}]
EOF
}
# accept_route NAME SECTION: write the route's status as a gateway controller would.
accept_route() {
    local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    kubectl -n "$NS_APP" patch httproute "$1" --subresource=status --type=merge --field-manager="$TEST_MANAGER" -p "$(cat <<EOF
{"status": {"parents": [{"parentRef": {"group": "gateway.networking.k8s.io", "kind": "Gateway",
    "name": "gw", "namespace": "$NS_INFRA", "sectionName": "$2"},
  "controllerName": "example.com/h3i-test-gateway",
  "conditions": [
    {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "accepted by the test",
     "observedGeneration": 1, "lastTransitionTime": "$now"},
    {"type": "ResolvedRefs", "status": "True", "reason": "ResolvedRefs", "message": "",
     "observedGeneration": 1, "lastTransitionTime": "$now"}]}]}}
EOF
)" >/dev/null
}

# =================================================================================================
cluster_up
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
if kubectl get ns "$NS_OP" >/dev/null 2>&1 || kubectl get crd http3listeners.h3-ingress.dev >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run (or the journey) left" "$NS_APP" "$NS_INFRA" "$NS_CERTS" "$NS_OP"
fi
ok "up in $(($(date +%s) - t0))s; nodes ${NODES[*]} at ${IPS[*]}; binary $H3I_BINARY"

step "install the Gateway API $GATEWAY_API_VERSION standard-channel CRDs (sigs.k8s.io/gateway-api via the Go module proxy)"
install_gateway_api_crds

step "helm install the chart (image $IMAGE_REPO = $(image_source))"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
read -r -a pull_args <<<"$(pull_secret_args "$NS_OP")"
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    "${pull_args[@]}" --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
[[ $(can list httproutes.gateway.networking.k8s.io --as "$OP_USER" -A) == yes ]] || fail "the operator cannot list HTTPRoutes"
for verb in update patch; do
    [[ $(can "$verb" httproutes.gateway.networking.k8s.io --subresource=status --as "$OP_USER" -A) == no ]] ||
        fail "the operator can $verb HTTPRoute status"
    [[ $(can "$verb" gateways.gateway.networking.k8s.io --as "$OP_USER" -A) == no ]] || fail "the operator can $verb Gateways"
done
ok "operator running; can list HTTPRoutes, Gateways, ReferenceGrants; cannot update or patch HTTPRoutes' status or Gateways"

step "the TCP gateway: Debian nginx on TCP 443 in each node's namespace, serving $HOST and $HOST_X"
make_ca h3i-gateway-ca
leaf "$HOST"
leaf "$HOST_X"
CERT=$(der_sha256 "$tmp/pki/$HOST.crt")
CERT_X=$(der_sha256 "$tmp/pki/$HOST_X.crt")
for node in "${NODES[@]}"; do start_nginx "$node" "$HOST" "$HOST_X"; done
for ip in "${IPS[@]}"; do
    out=$(curl -sS --http2 --max-time 5 --cacert "$tmp/pki/ca.crt" --resolve "$HOST:443:$ip" \
        -o /dev/null -w '%{http_version} %{response_code}' "https://$HOST/whoami") || fail "nginx on $ip: $out"
    [[ $out == "2 200" ]] || fail "nginx on $ip: $out"
done
ok "nginx answers https://$HOST/whoami over h2 on ${IPS[*]}"

step "a Gateway (class $CLASS, no controller) with HTTPS listeners, its Secret, an annotated HTTPRoute accepted by the test"
kubectl create namespace "$NS_INFRA" >/dev/null
kubectl create namespace "$NS_APP" >/dev/null
kubectl create namespace "$NS_CERTS" >/dev/null
tls_secret "$NS_INFRA" gw-tls "$HOST"
tls_secret "$NS_CERTS" cross-tls "$HOST_X"
kubectl apply -f - >/dev/null <<EOF
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: $CLASS}
spec: {controllerName: example.com/h3i-test-gateway}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: $NS_INFRA}
spec:
  gatewayClassName: $CLASS
  listeners:
    - name: http
      port: 80
      protocol: HTTP
      allowedRoutes: {namespaces: {from: All}}
    - name: https
      port: 443
      protocol: HTTPS
      hostname: $HOST
      tls: {mode: Terminate, certificateRefs: [{kind: Secret, name: gw-tls}]}
      allowedRoutes: {namespaces: {from: All}}
    - name: cross
      port: 8443
      protocol: HTTPS
      hostname: $HOST_X
      tls: {certificateRefs: [{name: cross-tls, namespace: $NS_CERTS}]}
      allowedRoutes: {namespaces: {from: All}}
EOF
route_yaml web "$HOST" https true | kubectl apply -f - >/dev/null
accept_route web https
ok "gateway/gw (listeners http, https -> secret gw-tls, cross -> secret $NS_CERTS/cross-tls), httproute/web for $HOST, status.parents Accepted=True"
kubectl -n "$NS_APP" get httproute web -o jsonpath='{range .status.parents[*]}{.parentRef.name}/{.parentRef.sectionName}: {.conditions[0].type}={.conditions[0].status} by {.controllerName}{"\n"}{end}' | indent

step "an Http3Listener '$LISTENER' with gatewayClassName $CLASS: UDP 443 on every node, upstream the node's nginx"
kubectl apply -f - <<EOF | indent
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER}
spec:
  gatewayClassName: $CLASS
  port: 443
  upstream: {address: "127.0.0.1:443"}
  metrics: {address: "[::]:9476"}
  http: {drainTimeoutSeconds: 2}
EOF
mkdir -p "$tmp/plugin"
ln -sf "$H3I_BINARY" "$tmp/plugin/kubectl-h3_ingress"
until_ok 60 "the certificate mirror of $NS_INFRA/gw-tls in $NS_HOSTS" eval '[[ $(mirror_hosts "$NS_INFRA/gw-tls") == "$HOST" ]]'
ok "the operator copied $NS_INFRA/gw-tls for $HOST into $NS_HOSTS; no mirror of $NS_CERTS/cross-tls: '$(mirror_hosts "$NS_CERTS/cross-tls")'"
[[ -z $(mirror_hosts "$NS_CERTS/cross-tls") ]] || fail "$NS_CERTS/cross-tls was mirrored without a ReferenceGrant"
[[ $(can get secret/gw-tls -n "$NS_INFRA" --as "$DP_USER") == no ]] || fail "the data plane can read $NS_INFRA/gw-tls itself"
[[ $(can list httproutes.gateway.networking.k8s.io --as "$DP_USER" -A) == no ]] || fail "the data plane can list HTTPRoutes"
[[ $(can patch httproutes.gateway.networking.k8s.io --subresource=status --as "$DP_USER" -A) == no ]] || fail "the data plane can patch HTTPRoute status"
ok "the data plane reads neither the Gateway's Secret nor HTTPRoutes: only its mirrors"

step "HTTP/3 to $HOST on both nodes with the Gateway's certificate (aioquic)"
wait_ok 120 "$HOST served over HTTP/3 on ${IPS[*]} with certificate ${CERT:0:12}" served_everywhere "$HOST" "$CERT"
served_everywhere "$HOST" "$CERT" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "HTTP/3 checks"

step "status, kubectl h3-ingress status and Events name the HTTPRoute, Gateway and listener"
wait_ok 60 "$HOST Serving in kubectl h3-ingress status" plugin_serving "$HOST"
PATH=$tmp/plugin:$PATH kubectl h3-ingress status >"$tmp/status.txt" 2>&1 || fail "kubectl h3-ingress status: $(cat "$tmp/status.txt")"
indent <"$tmp/status.txt"
grep -E "^ *$HOST +Serving .*$NS_INFRA/gw-tls +HTTPRoute $NS_APP/web, Gateway $NS_INFRA/gw listener https" "$tmp/status.txt" >/dev/null ||
    fail "kubectl h3-ingress status does not show $HOST Serving from HTTPRoute $NS_APP/web with Secret $NS_INFRA/gw-tls"
ok "kubectl h3-ingress status: $HOST Serving, Secret $NS_INFRA/gw-tls, source HTTPRoute $NS_APP/web, Gateway $NS_INFRA/gw listener https"
route_events() { kubectl -n "$NS_APP" get events --field-selector "involvedObject.kind=HTTPRoute,involvedObject.name=$1" -o jsonpath='{range .items[*]}{.type} {.reason}: {.message}{"\n"}{end}'; }
wait_ok 30 "an Http3Enabled Event on httproute/web" eval 'route_events web | grep -q "Normal Http3Enabled: HTTP/3 enabled for $HOST"'
route_events web | indent
managers=$(jp httproute -n "$NS_APP" web -o jsonpath='{range .metadata.managedFields[?(@.subresource=="status")]}{.manager}{"\n"}{end}' | sort -u | tr '\n' ' ')
[[ $managers == "$TEST_MANAGER " ]] || fail "HTTPRoute status written by '$managers', want only the test ($TEST_MANAGER)"
ok "the route's status has one writer, the test's stand-in gateway controller ($TEST_MANAGER): h3-ingress never wrote it"

step "a cross-namespace certificate without a ReferenceGrant: $HOST_X is RefNotPermitted and not served"
route_yaml cross "$HOST_X" cross true | kubectl apply -f - >/dev/null
accept_route cross cross
wait_ok 60 "status.hosts $HOST_X RefNotPermitted" host_reason_is "$HOST_X" RefNotPermitted
info "$HOST_X: $(host_field "$HOST_X" state) $(host_field "$HOST_X" reason): $(host_field "$HOST_X" message)"
wait_ok 30 "a RefNotPermitted Warning on httproute/cross" eval 'route_events cross | grep -q "Warning RefNotPermitted"'
refused_everywhere "$HOST_X" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "$HOST_X should be refused on every node"
[[ -z $(mirror_hosts "$NS_CERTS/cross-tls") ]] || fail "$NS_CERTS/cross-tls mirrored without a ReferenceGrant"
ok "no mirror of $NS_CERTS/cross-tls: the data plane was not given the Secret; $HOST still served: $(served_everywhere "$HOST" "$CERT" | wc -l) nodes"

step "a ReferenceGrant in $NS_CERTS from Gateways in $NS_INFRA to Secret cross-tls: $HOST_X is served"
kubectl apply -f - >/dev/null <<EOF
apiVersion: gateway.networking.k8s.io/v1beta1
kind: ReferenceGrant
metadata: {name: gateways-from-infra, namespace: $NS_CERTS}
spec:
  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: $NS_INFRA}]
  to: [{group: "", kind: Secret, name: cross-tls}]
EOF
wait_ok 120 "$HOST_X served over HTTP/3 on ${IPS[*]} with certificate ${CERT_X:0:12}" served_everywhere "$HOST_X" "$CERT_X"
served_everywhere "$HOST_X" "$CERT_X" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "HTTP/3 checks for $HOST_X"
[[ $(mirror_hosts "$NS_CERTS/cross-tls") == "$HOST_X" ]] || fail "no mirror of $NS_CERTS/cross-tls for $HOST_X"
wait_ok 90 "$HOST_X Serving in kubectl h3-ingress status" plugin_serving "$HOST_X"
ok "the operator mirrored $NS_CERTS/cross-tls once the grant permitted it; $HOST_X Serving"

step "remove the annotation from httproute/web: $HOST is no longer served"
kubectl -n "$NS_APP" annotate httproute web h3-ingress.dev/enabled- >/dev/null
wait_ok 60 "handshakes for $HOST refused on ${IPS[*]}" refused_everywhere "$HOST"
refused_everywhere "$HOST" | indent
gone() { [[ -z $(host_field "$HOST" name) && -z $(plugin_row "$HOST") && -z $(mirror_hosts "$NS_INFRA/gw-tls") ]]; }
wait_ok 30 "$HOST gone from the status, kubectl h3-ingress status and the mirrors" gone
served_everywhere "$HOST_X" "$CERT_X" >/dev/null || fail "$HOST_X should still be served"
ok "$HOST_X (httproute/cross) still served on every node"

step "the Gateway API example of docs/configuration.md is accepted by the API server (server-side dry run)"
# The YAML blocks of its "Gateway API" section; the namespaces their objects live in.
python3 - "$REPO/docs/configuration.md" "$tmp/doc-example.yaml" >"$tmp/doc-ns" <<'PY'
import re, sys, yaml
section = open(sys.argv[1]).read().split("### Gateway API", 1)[1]
docs = "\n---\n".join(re.findall(r"```yaml\n(.*?)```", section, re.S))
open(sys.argv[2], "w").write(docs)
print(" ".join(sorted({o["metadata"]["namespace"] for o in yaml.safe_load_all(docs) if o and "namespace" in o["metadata"]})))
PY
kinds=$(grep -c '^kind:' "$tmp/doc-example.yaml")
# One line, the namespaces separated by spaces.
read -r -a doc_namespaces <"$tmp/doc-ns"
for ns in "${doc_namespaces[@]}"; do
    kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    DOC_NS+=("$ns")
done
kubectl apply --dry-run=server -f "$tmp/doc-example.yaml" >"$tmp/doc-apply.log" 2>&1 || fail "docs/configuration.md's Gateway API example: $(cat "$tmp/doc-apply.log")"
indent <"$tmp/doc-apply.log"
kubectl delete namespace "${DOC_NS[@]}" --wait=false >/dev/null
ok "$kinds objects of the documented example pass the API server's validation (CRD schemas and CEL rules)"

step "done: Gateway API hosts on the real control plane"
kubectl get h3l "$LISTENER" | indent
ok "all checks passed in $(($(date +%s) - T_START))s"
