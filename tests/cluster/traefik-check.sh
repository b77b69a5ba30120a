#!/usr/bin/env bash
# The proof that Traefik (tests/cluster/traefik.sh) works as the cluster's TCP ingress on the
# real nodes, with the rules the product's tests will lean on (tests/cluster/README.md,
# "Traefik and CoreDNS"). Run by `tests/cluster/traefik.sh check` and tests/cluster/run.sh.
#
# Traefik up with websecure trusting the host's forwarded headers and entryPoint h3proxy
# taking PROXY protocol from the host; a busybox httpd backend behind a ClusterIP Service that
# Traefik reaches through kube-proxy (service.nativelb), a test CA's TLS Secret, and one
# Ingress of class traefik per case:
#   open.traefik.h3i.test    no middleware: HTTPS on every node, IPv4 and IPv6
#   allow.traefik.h3i.test   ipAllowList [host/32], default ipStrategy (connection address)
#   xff.traefik.h3i.test     ipAllowList [192.0.2.7/32], ipStrategy.depth 1 (X-Forwarded-For)
#   conn.traefik.h3i.test    ipAllowList [192.0.2.7/32, 2001:db8::7/128], default ipStrategy
# Clients: curl on the host (10.79.0.254 on the test instance) and in the other node's
# namespace, tests/py/proxyv2_get.py for PROXY protocol v2 (and v1). Every request's verdict
# is checked with the line it leaves in that node's access log (ClientHost, ClientAddr, the
# X-Forwarded-For and X-Real-Ip it logged, the entryPoint, the service address).
# Ends with `traefik.sh down` unless H3I_TRAEFIK_KEEP=1. Root; real nodes.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TRAEFIK=$REPO/tests/cluster/traefik.sh
NS_CHECK=traefik-check
CLIENT_OK=192.0.2.7        # in the allow lists of xff and conn: only ever a claimed address
CLIENT_OK6=2001:db8::7
CLIENT_OTHER=198.51.100.9  # in no list
T_START=$(date +%s)
# shellcheck disable=SC2034 # lib.sh's failure_report reads it
NS_OP=traefik
tmp=""

fail() {
    printf '\nTRAEFIK CHECK FAILED: %s\n' "$*" >&2
    step_table >&2
    {
        echo "--- pods:"
        kubectl get pods -A -o wide
        echo "--- traefik logs (last 20 lines per pod):"
        for p in $(kubectl -n traefik get pods -o name); do kubectl -n traefik logs "$p" --tail=20; done
    } >&2 2>&1 || true
    exit 1
}
# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
skip_unless_root "TRAEFIK CHECK"

finish() {
    local rc=$?
    if [[ ${H3I_TRAEFIK_KEEP:-0} == 1 ]]; then
        echo "H3I_TRAEFIK_KEEP=1: Traefik, namespace $NS_CHECK and $tmp left in place"
    else
        kubectl delete namespace "$NS_CHECK" --ignore-not-found --wait=false >/dev/null 2>&1 || true
        "$TRAEFIK" down >/dev/null 2>&1 || true
        [[ -z $tmp ]] || rm -rf "$tmp"
    fi
    exit "$rc"
}
trap finish EXIT

eval "$("$REPO/scripts/cluster.sh" env)" || fail "the cluster is not up"
[[ ${H3I_NODE_MODE:-} == real ]] || fail "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
read -r -a NODES <<<"$H3I_NODES"
read -r -a IPS <<<"$H3I_NODE_IPS"
read -r -a IPS6 <<<"$H3I_NODE_IPS6"
HOST4=$H3I_HOST_IP HOST6=$H3I_HOST_IP6
tmp=$(mktemp -d)

step "Traefik up: websecure trusts X-Forwarded-* from $HOST4; h3proxy :8443 takes PROXY protocol from $HOST4, $HOST6"
"$TRAEFIK" up --trusted-ips "$HOST4/32" --proxy-trusted-ips "$HOST4/32,$HOST6/128" | indent ||
    fail "traefik.sh up"

step "backend, TLS Secret, Middlewares and Ingresses (class traefik) in $NS_CHECK"
make_ca traefik-check-ca
HOSTS=(open allow xff conn)
sans=$(printf 'DNS:%s.traefik.h3i.test,' "${HOSTS[@]}")
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=traefik.h3i.test" \
    -keyout "$tmp/pki/check.key" -out "$tmp/pki/check.csr" 2>/dev/null
printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "${sans%,}" >"$tmp/pki/check.ext"
openssl x509 -req -in "$tmp/pki/check.csr" -CA "$tmp/pki/ca.crt" -CAkey "$tmp/pki/ca.key" -CAcreateserial \
    -days 2 -sha256 -extfile "$tmp/pki/check.ext" -out "$tmp/pki/check.crt" 2>/dev/null
kubectl create namespace "$NS_CHECK" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
tls_secret "$NS_CHECK" check-tls check
BODY="traefik-check backend"
ingress() { # HOST [MIDDLEWARE]
    local annotations="{}"
    [[ -z ${2:-} ]] || annotations="{traefik.ingress.kubernetes.io/router.middlewares: $NS_CHECK-$2@kubernetescrd}"
    cat <<EOF
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: $1
  namespace: $NS_CHECK
  annotations: $annotations
spec:
  ingressClassName: traefik
  tls: [{hosts: [$1.traefik.h3i.test], secretName: check-tls}]
  rules:
  - host: $1.traefik.h3i.test
    http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: backend, port: {number: 80}}}}]}
EOF
}
{
    cat <<EOF
apiVersion: v1
kind: ConfigMap
metadata: {name: www, namespace: $NS_CHECK}
data: {index.html: "$BODY\n"}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: backend, namespace: $NS_CHECK}
spec:
  replicas: 1
  selector: {matchLabels: {app: backend}}
  template:
    metadata: {labels: {app: backend}}
    spec:
      containers:
      - name: httpd
        image: registry.h3i.test/busybox:1
        imagePullPolicy: IfNotPresent
        command: [/bin/busybox, httpd, -f, -v, -p, "8080", -h, /www]
        ports: [{containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
        volumeMounts: [{name: www, mountPath: /www}]
      volumes: [{name: www, configMap: {name: www}}]
---
apiVersion: v1
kind: Service
metadata:
  name: backend
  namespace: $NS_CHECK
  # Traefik sends to the ClusterIP (kube-proxy) instead of the pods' addresses.
  annotations: {traefik.ingress.kubernetes.io/service.nativelb: "true"}
spec:
  selector: {app: backend}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: traefik.io/v1alpha1
kind: Middleware
metadata: {name: allow-host, namespace: $NS_CHECK}
spec: {ipAllowList: {sourceRange: ["$HOST4/32"]}}
---
apiVersion: traefik.io/v1alpha1
kind: Middleware
metadata: {name: allow-xff, namespace: $NS_CHECK}
spec: {ipAllowList: {sourceRange: ["$CLIENT_OK/32"], ipStrategy: {depth: 1}}}
---
apiVersion: traefik.io/v1alpha1
kind: Middleware
metadata: {name: allow-conn, namespace: $NS_CHECK}
spec: {ipAllowList: {sourceRange: ["$CLIENT_OK/32", "$CLIENT_OK6/128"]}}
EOF
    ingress open
    ingress allow allow-host
    ingress xff allow-xff
    ingress conn allow-conn
} | kubectl apply -f - >/dev/null || fail "kubectl apply of the fixtures"
wait_ok 90 "backend Ready" kubectl -n "$NS_CHECK" wait --for=condition=Available deploy/backend --timeout=2s
CLUSTER_IP=$(jp -n "$NS_CHECK" svc backend -o jsonpath='{.spec.clusterIP}')

# ---- requests and their access log lines --------------------------------------------------------
LOG_LINES=0 LOG_FILE=""
# request NODE-INDEX FROM URL-HOST ADDRESS PORT [curl args...]: one HTTPS GET from FROM (host,
# or a node name: curl in that namespace) to the node's ADDRESS; sets CODE and BODY_GOT and
# remembers where that node's access log stood.
request() {
    local i=$1 from=$2 host=$3 addr=$4 port=$5 run=()
    shift 5
    LOG_FILE=$("$TRAEFIK" access-log "${NODES[$i]}")
    LOG_LINES=$(wc -l <"$LOG_FILE" 2>/dev/null || echo 0)
    [[ $from == host ]] || run=(ip netns exec "$from")
    [[ $addr != *:* ]] || addr="[$addr]"
    CODE=$("${run[@]}" curl -s -m 10 -o "$tmp/body" -w '%{http_code}' --cacert "$tmp/pki/ca.crt" \
        --resolve "$host.traefik.h3i.test:$port:$addr" "$@" "https://$host.traefik.h3i.test:$port/") || CODE="curl exit $?"
    BODY_GOT=$(cat "$tmp/body" 2>/dev/null || true)
}
# proxy_request NODE-INDEX FROM URL-HOST ADDRESS SOURCE VERSION: the same through h3proxy with
# a PROXY protocol header claiming SOURCE (IP:PORT); sets CODE (or "error: ...").
proxy_request() {
    local i=$1 from=$2 host=$3 addr=$4 src=$5 version=$6 run=() out
    LOG_FILE=$("$TRAEFIK" access-log "${NODES[$i]}")
    LOG_LINES=$(wc -l <"$LOG_FILE" 2>/dev/null || echo 0)
    [[ $from == host ]] || run=(ip netns exec "$from")
    [[ $addr != *:* ]] || addr="[$addr]"
    out=$("${run[@]}" python3 "$REPO/tests/py/proxyv2_get.py" --connect "$addr:8443" --source "$src" \
        --sni "$host.traefik.h3i.test" --cafile "$tmp/pki/ca.crt" --version "$version") || true
    CODE=$(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d.get("status") or "error: " + d["error"])' "$out")
}
# The access log line of the last request (waits up to 3 s for it), as FIELD=VALUE lines.
LOGGED=""
logged() {
    local deadline=$(($(date +%s) + 3))
    until (($(wc -l <"$LOG_FILE" 2>/dev/null || echo 0) > LOG_LINES)); do
        (($(date +%s) < deadline)) || { LOGGED="(no access log line)"; return 0; }
        sleep 0.1
    done
    LOGGED=$(tail -n +"$((LOG_LINES + 1))" "$LOG_FILE" | head -n 1 | python3 -c 'import json, sys
d = json.loads(sys.stdin.read())
keys = ["DownstreamStatus", "ClientHost", "ClientAddr", "request_X-Forwarded-For", "request_X-Real-Ip",
        "entryPointName", "ServiceAddr"]
absent = "-"
print(" ".join(f"{k}={d.get(k, absent)}" for k in keys))')
}
# expect WHAT STATUS [FIELD=VALUE...]: the last request's status and its access log fields.
expect() {
    local what=$1 want=$2 kv
    shift 2
    [[ $CODE == "$want" ]] || fail "$what: status $CODE, want $want"
    if [[ $want != error* ]]; then
        logged
        for kv in "$@"; do
            [[ " $LOGGED " == *" $kv "* ]] || fail "$what: access log has '$LOGGED', want $kv"
        done
        ok "$what: $CODE; logged $LOGGED"
    else
        ok "$what: $CODE"
    fi
}

step "routing: open.traefik.h3i.test on every node, IPv4 and IPv6, to the ClusterIP $CLUSTER_IP through kube-proxy"
until_ok 30 "Traefik routes open.traefik.h3i.test" bash -c \
    "[[ \$(curl -s -o /dev/null -w '%{http_code}' --cacert $tmp/pki/ca.crt --resolve open.traefik.h3i.test:443:${IPS[0]} https://open.traefik.h3i.test/) == 200 ]]"
for i in "${!NODES[@]}"; do
    request "$i" host open "${IPS[$i]}" 443
    [[ $BODY_GOT == "$BODY" ]] || fail "open via ${IPS[$i]}: body '$BODY_GOT'"
    expect "open via ${NODES[$i]} ${IPS[$i]}:443 from the host" 200 "ClientHost=$HOST4" entryPointName=websecure \
        "ServiceAddr=$CLUSTER_IP:80" "request_X-Real-Ip=$HOST4" "request_X-Forwarded-For=-"
    request "$i" host open "${IPS6[$i]}" 443
    expect "open via ${NODES[$i]} [${IPS6[$i]}]:443 from the host" 200 "ClientHost=$HOST6"
done

step "ipAllowList, default ipStrategy: the connection's address decides"
for i in "${!NODES[@]}"; do
    other=${NODES[$(((i + 1) % ${#NODES[@]}))]}
    other_ip=${IPS[$(((i + 1) % ${#NODES[@]}))]}
    request "$i" host allow "${IPS[$i]}" 443
    expect "allow via ${NODES[$i]} from the host ($HOST4, in the list)" 200 "ClientHost=$HOST4"
    request "$i" "$other" allow "${IPS[$i]}" 443
    expect "allow via ${NODES[$i]} from $other ($other_ip, not in it)" 403 "ClientHost=$other_ip"
done
N1=${NODES[1]} IP1=${IPS[1]}

step "forwarded headers: websecure trusts $HOST4 only; ipStrategy.depth 1 reads X-Forwarded-For"
request 0 host xff "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OK"
expect "xff, trusted sender, X-Forwarded-For $CLIENT_OK" 200 "ClientHost=$CLIENT_OK" \
    "request_X-Forwarded-For=$CLIENT_OK" "request_X-Real-Ip=$HOST4"
[[ $LOGGED == *"ClientAddr=$HOST4:"* ]] || fail "ClientAddr is not the connection's ($LOGGED)"
request 0 host xff "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OTHER"
expect "xff, trusted sender, X-Forwarded-For $CLIENT_OTHER" 403 "ClientHost=$CLIENT_OTHER"
request 0 host xff "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OTHER, $CLIENT_OK"
expect "xff, trusted sender, X-Forwarded-For '$CLIENT_OTHER, $CLIENT_OK' (depth 1: the last)" 200
request 0 host xff "${IPS[0]}" 443
expect "xff, trusted sender, no X-Forwarded-For (depth 1 finds no address)" 403 "ClientHost=$HOST4"
request 0 "$N1" xff "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OK" -H "X-Real-Ip: $CLIENT_OK"
expect "xff, untrusted sender $IP1 with X-Forwarded-For and X-Real-Ip $CLIENT_OK (both removed)" 403 \
    "ClientHost=$IP1" "request_X-Forwarded-For=-" "request_X-Real-Ip=$IP1"
request 0 host conn "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OK"
expect "conn (default ipStrategy), trusted sender, X-Forwarded-For $CLIENT_OK (not read)" 403 \
    "ClientHost=$CLIENT_OK" "request_X-Forwarded-For=$CLIENT_OK"
request 0 host allow "${IPS[0]}" 443 -H "X-Forwarded-For: $CLIENT_OTHER"
expect "allow (default ipStrategy), trusted sender, X-Forwarded-For $CLIENT_OTHER (not read)" 200 \
    "ClientHost=$CLIENT_OTHER"

step "PROXY protocol on h3proxy :8443 (trusted: $HOST4, $HOST6): the header's source is the connection's address"
for i in "${!NODES[@]}"; do
    proxy_request "$i" host conn "${IPS[$i]}" "$CLIENT_OK:40000" 2
    expect "conn via ${NODES[$i]}:8443, PROXY v2 from $CLIENT_OK:40000" 200 "ClientHost=$CLIENT_OK" \
        "ClientAddr=$CLIENT_OK:40000" entryPointName=h3proxy "request_X-Real-Ip=$CLIENT_OK"
done
proxy_request 0 host conn "${IPS[0]}" "$CLIENT_OTHER:40001" 2
expect "conn, PROXY v2 from $CLIENT_OTHER:40001" 403 "ClientHost=$CLIENT_OTHER" "ClientAddr=$CLIENT_OTHER:40001"
proxy_request 0 host conn "${IPS6[0]}" "[$CLIENT_OK6]:40002" 2
expect "conn via [${IPS6[0]}]:8443, PROXY v2 (TCP6) from [$CLIENT_OK6]:40002" 200 "ClientHost=$CLIENT_OK6"
proxy_request 0 host conn "${IPS[0]}" "$CLIENT_OK:40003" 1
expect "conn, PROXY v1 from $CLIENT_OK:40003" 200 "ClientAddr=$CLIENT_OK:40003"
proxy_request 0 "$N1" conn "${IPS[0]}" "$CLIENT_OK:40004" 2
expect "conn, PROXY v2 from $CLIENT_OK:40004 sent by the untrusted $IP1 (header read and ignored: its own address)" 403 \
    "ClientHost=$IP1" entryPointName=h3proxy "request_X-Real-Ip=$IP1"
request 0 host conn "${IPS[0]}" 8443
expect "conn via :8443 from the trusted $HOST4 without a PROXY header (allowed; its own address)" 403 \
    "ClientHost=$HOST4" entryPointName=h3proxy

step_table
echo "TRAEFIK CHECK PASSED"
