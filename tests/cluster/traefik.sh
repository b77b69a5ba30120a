#!/usr/bin/env bash
# Traefik (scripts/addons-build.sh traefik, v3 from the module registry) as the TCP ingress
# controller of the test cluster's real nodes (H3I_NODES=real): its CRDs and the RBAC of its
# docs read from the Traefik module in GOMODCACHE at run time, IngressClass `traefik`
# (controller traefik.io/ingress-controller) and a hostNetwork DaemonSet with providers
# kubernetesIngress and kubernetesCRD. README.md ("Traefik and CoreDNS") says how tests use it
# and which rules of Traefik's they meet.
#
#   tests/cluster/traefik.sh up [OPTIONS]   install, or reconfigure (the DaemonSet rolls);
#                                          returns once every node's Traefik answers on its
#                                          ports with the new arguments
#   tests/cluster/traefik.sh down           remove all that `up` installed, CRDs included
#   tests/cluster/traefik.sh access-log NODE
#                                          the host path of NODE's access log
#
# OPTIONS of up (nothing else is on: no dashboard, API, metrics or plugins):
#   --port N                    TCP port of entryPoint websecure (443; Debian nginx of the other
#                               tests also wants 443 in the node namespaces: one or the other)
#   --trusted-ips CIDR,...      websecure's forwardedHeaders.trustedIPs (default none: Traefik
#                               removes X-Forwarded-* and X-Real-Ip from every sender)
#   --proxy-trusted-ips CIDR,...
#                               adds entryPoint h3proxy with proxyProtocol.trustedIPs
#   --proxy-port N              h3proxy's TCP port (8443)
#   --log-level LEVEL           Traefik's own log (INFO; DEBUG names each allowlist verdict)
#
# Also on each node: entryPoint `traefik` on TCP 9000 for /ping (the probes). Access log: JSON
# lines, one file per node on the host, $H3I_CLUSTER_STATE/traefik/NODE.access.log (the pods
# mount that directory).
# Environment: the instance's H3I_CLUSTER_* as for scripts/cluster.sh (the cluster must be up
# with real nodes).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
NS=traefik
CLASS=traefik
PING_PORT=9000
die() { printf 'traefik.sh: ERROR: %s\n' "$*" >&2; exit 1; }
jp() { kubectl get "$@" 2>/dev/null; } # kubectl get ... -o jsonpath=..., quiet on NotFound
# until_ok SECONDS WHAT COMMAND...: COMMAND until it succeeds, every 0.5 s, at most SECONDS.
until_ok() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    while ! "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || die "$what (not within ${secs}s)"
        sleep 0.5
    done
}

cluster_env() {
    [[ $(id -u) -eq 0 ]] || die "run as root (the cluster's node namespaces)"
    local env
    env=$("$CLUSTER" env) || die "the cluster is not up (scripts/cluster.sh up with H3I_NODES=real)"
    eval "$env"
    [[ ${H3I_NODE_MODE:-} == real ]] || die "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
    read -r -a NODES <<<"$H3I_NODES"
    read -r -a IPS <<<"$H3I_NODE_IPS"
    LOGDIR=$H3I_CLUSTER_STATE/traefik
}

# The Traefik module of tests/cluster/traefik/go.mod in GOMODCACHE, checked against its go.sum.
module_dir() {
    local src=$REPO/tests/cluster/traefik version sum out empty cache=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
    version=$(awk '$1 == "github.com/traefik/traefik/v3" && $2 ~ /^v/ {print $2; exit}' "$src/go.mod")
    sum=$(awk -v v="$version" '$1 == "github.com/traefik/traefik/v3" && $2 == v {print $3}' "$src/go.sum")
    empty=$(mktemp -d)
    out=$(cd "$empty" && GOMODCACHE=$cache/gomod GOTOOLCHAIN=local GOFLAGS=-mod=mod \
        go mod download -json "github.com/traefik/traefik/v3@$version") || die "go mod download traefik $version: $out"
    rmdir "$empty"
    python3 -c 'import json, sys
d, want = json.load(sys.stdin), sys.argv[1]
if d["Sum"] != want:
    sys.exit("traefik.sh: ERROR: %s@%s has %s, go.sum says %s" % (d["Path"], d["Version"], d["Sum"], want))
print(d["Dir"])' "$sum" <<<"$out"
}

# ---- up ----------------------------------------------------------------------------------------
PORT=443 PROXY_PORT=8443 TRUSTED="" PROXY_TRUSTED="" LOG_LEVEL=INFO
parse_options() {
    while [[ $# -gt 0 ]]; do
        case $1 in
            --port) PORT=${2:?--port N} ;;
            --proxy-port) PROXY_PORT=${2:?--proxy-port N} ;;
            --trusted-ips) TRUSTED=${2:?--trusted-ips CIDR,...} ;;
            --proxy-trusted-ips) PROXY_TRUSTED=${2:?--proxy-trusted-ips CIDR,...} ;;
            --log-level) LOG_LEVEL=${2:?--log-level LEVEL} ;;
            *) die "unknown option '$1' (see the header of $0)" ;;
        esac
        shift 2
    done
    local p c
    for p in "$PORT" "$PROXY_PORT"; do
        if ! [[ $p =~ ^[0-9]+$ ]] || ((p < 1 || p > 65535)); then die "port '$p' is not 1-65535"; fi
    done
    [[ $PORT != "$PROXY_PORT" || -z $PROXY_TRUSTED ]] || die "--port and --proxy-port are both $PORT"
    for c in ${TRUSTED//,/ } ${PROXY_TRUSTED//,/ }; do
        python3 -c 'import ipaddress, sys; ipaddress.ip_network(sys.argv[1])' "$c" 2>/dev/null ||
            die "'$c' is not a CIDR (--trusted-ips / --proxy-trusted-ips)"
    done
}

# Traefik's static configuration, one argument per line.
traefik_args() {
    printf '%s\n' --global.checkNewVersion=false --global.sendAnonymousUsage=false \
        "--log.level=$LOG_LEVEL" \
        "--entryPoints.websecure.address=:$PORT" --entryPoints.websecure.http.tls=true
    [[ -z $TRUSTED ]] || echo "--entryPoints.websecure.forwardedHeaders.trustedIPs=$TRUSTED"
    if [[ -n $PROXY_TRUSTED ]]; then
        printf '%s\n' "--entryPoints.h3proxy.address=:$PROXY_PORT" --entryPoints.h3proxy.http.tls=true \
            "--entryPoints.h3proxy.proxyProtocol.trustedIPs=$PROXY_TRUSTED"
    fi
    # shellcheck disable=SC2016 # $(NODE_NAME): the kubelet expands it in the container's args
    printf '%s\n' "--entryPoints.traefik.address=:$PING_PORT" --ping=true --ping.entryPoint=traefik \
        --providers.kubernetesIngress=true --providers.kubernetesCRD=true \
        --accessLog=true --accessLog.format=json \
        '--accessLog.filePath=/var/log/traefik/$(NODE_NAME).access.log' \
        --accessLog.fields.headers.defaultMode=drop \
        --accessLog.fields.headers.names.X-Forwarded-For=keep \
        --accessLog.fields.headers.names.X-Real-Ip=keep
}

# The docs' RBAC (kubernetes-crd-rbac.yml: the reads of both providers, Ingress status) bound
# to this namespace's ServiceAccount instead of the example's default/traefik-ingress-controller.
rbac_json() {
    kubectl create --dry-run=client -o json -f "$1/docs/content/reference/dynamic-configuration/kubernetes-crd-rbac.yml" |
        python3 -c 'import json, sys
ns, text, items, at = sys.argv[1], sys.stdin.read(), [], 0
while text[at:].strip():  # one JSON object per document of the file
    obj, end = json.JSONDecoder().raw_decode(text[at:].lstrip())
    at = len(text) - len(text[at:].lstrip()) + end
    items.append(obj)
for item in items:
    item["metadata"]["name"] = "traefik-" + ns
    if item["kind"] == "ClusterRoleBinding":
        item["roleRef"]["name"] = "traefik-" + ns
        item["subjects"] = [{"kind": "ServiceAccount", "name": "traefik", "namespace": ns}]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))' "$NS"
}

manifests() {
    local image=$1 arg ports
    ports="        - {name: websecure, containerPort: $PORT, protocol: TCP}"
    [[ -z $PROXY_TRUSTED ]] || ports+=$'\n'"        - {name: h3proxy, containerPort: $PROXY_PORT, protocol: TCP}"
    cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: traefik, namespace: $NS}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: $CLASS}
spec: {controller: traefik.io/ingress-controller}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: traefik, namespace: $NS, labels: {app.kubernetes.io/name: traefik}}
spec:
  selector: {matchLabels: {app.kubernetes.io/name: traefik}}
  updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  template:
    metadata: {labels: {app.kubernetes.io/name: traefik}}
    spec:
      serviceAccountName: traefik
      hostNetwork: true
      dnsPolicy: ClusterFirstWithHostNet
      nodeSelector: {kubernetes.io/os: linux}
      terminationGracePeriodSeconds: 10
      securityContext: {seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: traefik
        image: $image
        imagePullPolicy: IfNotPresent
        args:
$(traefik_args | while read -r arg; do printf '        - "%s"\n' "$arg"; done)
        env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
        ports:
$ports
        - {name: traefik, containerPort: $PING_PORT, protocol: TCP}
        readinessProbe: {httpGet: {path: /ping, port: $PING_PORT}, periodSeconds: 2, failureThreshold: 1}
        livenessProbe: {httpGet: {path: /ping, port: $PING_PORT}, periodSeconds: 10, failureThreshold: 3}
        securityContext:
          # uid 0 with NET_BIND_SERVICE alone, as the product's data plane: a non-root
          # process gets no added capability from the runtime (no ambient set), and
          # hostNetwork pods keep the node's unprivileged port floor.
          runAsUser: 0
          runAsGroup: 0
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}
        volumeMounts:
        - {name: logs, mountPath: /var/log/traefik}
        - {name: tmp, mountPath: /tmp}
      volumes:
      - {name: logs, hostPath: {path: $LOGDIR, type: DirectoryOrCreate}}
      - {name: tmp, emptyDir: {}}
EOF
}

# Every node's Traefik pod is of the current template, Ready, and its ports answer.
serving() {
    local gen ready i code
    gen=$(jp -n "$NS" ds traefik -o jsonpath='{.metadata.generation}/{.status.observedGeneration}/{.status.updatedNumberScheduled}/{.status.numberReady}/{.status.numberAvailable}')
    [[ $gen == "${gen%%/*}/${gen%%/*}/${#NODES[@]}/${#NODES[@]}/${#NODES[@]}" ]] || return 1
    ready=$(jp -n "$NS" pods -l app.kubernetes.io/name=traefik -o jsonpath='{range .items[*]}{.metadata.deletionTimestamp}{"|"}{end}')
    [[ $ready != *[0-9]* ]] || return 1
    for i in "${!IPS[@]}"; do
        [[ $(curl -s -m 2 "http://${IPS[$i]}:$PING_PORT/ping") == OK ]] || return 1
        # No route for a bare address: 404 from Traefik's TLS entryPoint.
        code=$(curl -sk -m 2 -o /dev/null -w '%{http_code}' "https://${IPS[$i]}:$PORT/") || return 1
        [[ $code == 404 ]] || return 1
        if [[ -n $PROXY_TRUSTED ]]; then
            code=$(curl -sk -m 2 -o /dev/null -w '%{http_code}' "https://${IPS[$i]}:$PROXY_PORT/") || return 1
            [[ $code == 404 ]] || return 1
        fi
    done
}

cmd_up() {
    parse_options "$@"
    cluster_env
    local t0 mdir image crd
    t0=$(date +%s)
    "$REPO/scripts/addons-build.sh" traefik >/dev/null
    image=$("$CLUSTER" import-addon traefik)
    mdir=$(module_dir)
    mkdir -p "$LOGDIR"
    kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
    # Server-side: the CRDs are too large for the last-applied annotation of a client-side apply.
    kubectl apply --server-side --force-conflicts \
        -f "$mdir/docs/content/reference/dynamic-configuration/kubernetes-crd-definition-v1.yml" >/dev/null
    for crd in middlewares ingressroutes tlsoptions tlsstores serverstransports; do
        kubectl wait --for=condition=Established "crd/$crd.traefik.io" --timeout=30s >/dev/null
    done
    rbac_json "$mdir" | kubectl apply -f - >/dev/null
    manifests "$image" | kubectl apply -f - >/dev/null
    until_ok 120 "Traefik serving on every node (DaemonSet traefik/traefik rolled, /ping, TLS :$PORT)" serving
    echo "traefik.sh: up in $(($(date +%s) - t0)) s: $image on ${NODES[*]}, websecure :$PORT (trusted: ${TRUSTED:-none})$([[ -z $PROXY_TRUSTED ]] || echo ", h3proxy :$PROXY_PORT (PROXY protocol from $PROXY_TRUSTED)"); access logs $LOGDIR/NODE.access.log"
}

cmd_down() {
    cluster_env
    local mdir
    kubectl delete namespace "$NS" --ignore-not-found --wait=true --timeout=60s >/dev/null
    kubectl delete "ingressclass/$CLASS" "clusterrole/traefik-$NS" "clusterrolebinding/traefik-$NS" --ignore-not-found >/dev/null
    mdir=$(module_dir)
    kubectl delete --ignore-not-found -f "$mdir/docs/content/reference/dynamic-configuration/kubernetes-crd-definition-v1.yml" >/dev/null
    rm -rf "$LOGDIR"
    echo "traefik.sh: down"
}

case ${1:-} in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    access-log) cluster_env; echo "$LOGDIR/${2:?access-log NODE}.access.log" ;;
    *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
