# shellcheck shell=bash
# Helpers shared by the cluster scripts not yet ported to the scenario runner
# (tests/cluster/scenarios), which drive the product on the test cluster of scripts/cluster.sh
# the same way: timed steps, checks that poll the API server until a deadline, and a report of
# the cluster's state when a check fails.
#
# They also stand a Debian nginx in each node's namespace in for the TCP ingress, with a
# throw-away PKI, and (tests/cluster/scale.sh) install the Gateway API CRDs.
#
# Sourced by those scripts after they set their names. It uses, from the sourcing script:
# T_START (the run's start, epoch seconds), CLUSTER (scripts/cluster.sh), NS_OP and RELEASE (the
# chart's namespace and release), ALT_SVC (what nginx advertises), tmp (the run's scratch
# directory, made after sourcing) and a function `fail MESSAGE` that reports the failure (see
# failure_report) and exits 1.
# shellcheck disable=SC2154,SC2153 # those are the sourcing script's; H3I_*: scripts/cluster.sh env's

# ---- output: steps with their elapsed time, ok/info lines, indented command output ----------
STEP_NAMES=()
STEP_AT=()
step() {
    STEP_NAMES+=("$*")
    STEP_AT+=("$(($(date +%s) - T_START))")
    printf '\n--- [%3ss] %s\n' "${STEP_AT[-1]}" "$*"
}
# The step list with each step's own duration (the last one runs until now).
step_table() {
    local i n=${#STEP_NAMES[@]} end now=$(($(date +%s) - T_START))
    ((n > 0)) || return 0
    printf '\n%-4s %6s %6s  %s\n' step start took name
    for ((i = 0; i < n; i++)); do
        end=$now
        ((i + 1 < n)) && end=${STEP_AT[i + 1]}
        printf '%-4s %5ss %5ss  %.110s\n' "$((i + 1))" "${STEP_AT[i]}" "$((end - STEP_AT[i]))" "${STEP_NAMES[i]}"
    done
}
ok() { printf '    ok: %s\n' "$*"; }
info() { printf '    %s\n' "$*"; }
indent() { sed 's/^/    | /'; }

# skip_unless_root TITLE: without root print TITLE SKIPPED and exit 0, or fail when
# H3I_TESTS_REQUIRE_ROOT=1 (CI must not count a skipped run as a pass).
skip_unless_root() {
    [[ $(id -u) -ne 0 ]] || return 0
    echo "$1 SKIPPED (needs root): tests/cluster/${0##*/} needs network namespaces and the cluster's processes"
    [[ ${H3I_TESTS_REQUIRE_ROOT:-0} == 1 ]] && fail "H3I_TESTS_REQUIRE_ROOT=1 but not root"
    exit 0
}

# failure_report LISTENERS-COMMAND PODS-COMMAND: what fail prints after its verdict line, on
# stderr, once the cluster's kubeconfig exists: every pod, what LISTENERS-COMMAND says about
# the script's listeners, the last events, and the last lines of each container log of the pods
# PODS-COMMAND names in $NS_OP (the node agent keeps them under $H3I_POD_LOGS).
failure_report() {
    [[ -n ${KUBECONFIG:-} && -f ${KUBECONFIG:-/nonexistent} ]] || return 0
    {
        echo "--- pods:"
        kubectl get pods -A -o wide
        "$1"
        echo "--- events (last 15):"
        kubectl get events -A --sort-by=.lastTimestamp | tail -n 15
    } >&2 2>&1 || true
    local pod f
    for pod in $("$2"); do
        for f in "$H3I_POD_LOGS/$NS_OP/$pod"/*.log; do
            [[ -f $f ]] || continue
            echo "--- ${f#"$H3I_POD_LOGS"/} (last 15 lines):" >&2
            tail -n 15 "$f" >&2
        done
    done
}

# ---- polling the cluster -----------------------------------------------------------------------
# until_ok SECONDS DESCRIPTION COMMAND...: poll every 0.5 s until the command succeeds.
until_ok() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    while ! "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || fail "$what (not within ${secs}s)"
        sleep 0.5
    done
}
# The same, printing how long it took.
wait_ok() {
    local t0
    t0=$(date +%s)
    until_ok "$@"
    ok "$2 (after $(($(date +%s) - t0))s)"
}
jp() { kubectl get "$@" 2>/dev/null; }                # kubectl get ... -o jsonpath=..., quiet on NotFound
can() { kubectl auth can-i "$@" 2>/dev/null || true; } # yes / no, as the API server judges

# ---- the TCP ingress: Debian nginx in each node's network namespace -------------------------
# One nginx per node on TCP 443 (v4 and v6) serving the given hosts with their certificates
# ($tmp/pki/HOST.crt and .key, copied per node so that a rotation can replace them), advertising
# $ALT_SVC, refusing other names (as an ingress without a catch-all); /whoami says which host and
# node answered, other paths are files under $tmp/www; $NGINX_EXTRA, when set, is added to every
# server (e.g. a throttled location), $NGINX_HTTP_EXTRA to the http block (e.g. another server).
nginx_conf() { # NODE DIR HOST...
    local node=$1 d=$2 h
    shift 2
    cat <<CONF
user root;
worker_processes 1;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 256; }
http {
    access_log $d/access.log;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    default_type application/octet-stream;
    server {
        listen 443 ssl http2 default_server;
        listen [::]:443 ssl http2 default_server;
        ssl_reject_handshake on;
    }
    ${NGINX_HTTP_EXTRA:-}
CONF
    for h in "$@"; do
        cat <<CONF
    server {
        listen 443 ssl http2;
        listen [::]:443 ssl http2;
        server_name $h;
        ssl_certificate $d/$h.crt;
        ssl_certificate_key $d/$h.key;
        add_header Alt-Svc '$ALT_SVC' always;
        root $tmp/www;
        location = /whoami { default_type text/plain; return 200 "$h on $node\n"; }
        ${NGINX_EXTRA:-}
    }
CONF
    done
    echo "}"
}
start_nginx() { # NODE HOST...
    local node=$1 d=$tmp/nginx-$1 h
    shift
    mkdir -p "$d/tmp"
    for h in "$@"; do cp "$tmp/pki/$h.crt" "$tmp/pki/$h.key" "$d/"; done
    nginx_conf "$node" "$d" "$@" >"$d/nginx.conf"
    ip netns exec "$node" nginx -p "$d/" -c "$d/nginx.conf" || fail "nginx did not start in $node: $(cat "$d/error.log" 2>/dev/null)"
}
stop_nginx() {
    local d
    for d in "$tmp"/nginx-*; do
        if [[ -f $d/nginx.pid ]]; then kill -QUIT "$(cat "$d/nginx.pid")" 2>/dev/null || true; fi
    done
}

# ---- a throw-away PKI in $tmp/pki: one CA, a leaf per host -----------------------------------
make_ca() { # COMMON-NAME
    mkdir -p "$tmp/pki"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj "/CN=$1" -keyout "$tmp/pki/ca.key" -out "$tmp/pki/ca.crt" 2>/dev/null || fail "openssl: CA $1"
}
# leaf FILE-BASENAME [HOST]: a server certificate for HOST (default: the basename) signed by the
# CA; a second leaf for the same host under another basename is a rotation's new certificate.
leaf() {
    local host=${2:-$1}
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$host" \
        -keyout "$tmp/pki/$1.key" -out "$tmp/pki/$1.csr" 2>/dev/null
    printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth\n' "$host" >"$tmp/pki/$1.ext"
    openssl x509 -req -in "$tmp/pki/$1.csr" -CA "$tmp/pki/ca.crt" -CAkey "$tmp/pki/ca.key" -CAcreateserial \
        -days 2 -sha256 -extfile "$tmp/pki/$1.ext" -out "$tmp/pki/$1.crt" 2>/dev/null
}
tls_secret() { # NAMESPACE NAME CERT-BASENAME
    kubectl -n "$1" create secret tls "$2" --cert "$tmp/pki/$3.crt" --key "$tmp/pki/$3.key" \
        --dry-run=client -o yaml | kubectl apply -f - >/dev/null
}

# ---- the Gateway API CRDs: the pinned Go module, cached like the cluster's own build ---------
# The release whose standard channel is installed, and its go.sum hash: the module proxy and
# the checksum database must hand out exactly this tree.
GATEWAY_API_VERSION=v1.6.3
GATEWAY_API_SUM=h1:lKpJa5bGlraC/QeACvCpsHLdmO6y0iKfzVl6gzaFEYc=
gateway_api_dir() {
    local out dir sum cache=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
    out=$(cd "$tmp" && GOMODCACHE=$cache/gomod GOCACHE=$cache/gocache GOTOOLCHAIN=local GOFLAGS=-mod=mod \
        go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION") || fail "go mod download sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION: $out"
    dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' <<<"$out")
    sum=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["Sum"])' <<<"$out")
    [[ $sum == "$GATEWAY_API_SUM" ]] || fail "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION has go.sum $sum, pinned $GATEWAY_API_SUM"
    [[ -d $dir/config/crd/standard ]] || fail "no config/crd/standard in $dir"
    echo "$dir/config/crd/standard"
}
# install_gateway_api_crds: apply the standard channel (server-side, as its README says) and
# wait until the kinds h3-ingress reads are Established.
install_gateway_api_crds() {
    local t0 crds crd bundle
    t0=$(date +%s)
    crds=$(gateway_api_dir)
    kubectl apply --server-side --force-conflicts -f "$crds" >"$tmp/crds.log" 2>&1 || fail "kubectl apply $crds: $(cat "$tmp/crds.log")"
    for crd in gateways httproutes referencegrants gatewayclasses; do
        kubectl wait --for=condition=Established "crd/$crd.gateway.networking.k8s.io" --timeout=30s >/dev/null ||
            fail "crd/$crd.gateway.networking.k8s.io not Established"
    done
    bundle=$(jp crd httproutes.gateway.networking.k8s.io -o jsonpath='{.metadata.annotations.gateway\.networking\.k8s\.io/bundle-version} {.metadata.annotations.gateway\.networking\.k8s\.io/channel}')
    [[ $bundle == "$GATEWAY_API_VERSION standard" ]] || fail "HTTPRoute CRD bundle '$bundle', want '$GATEWAY_API_VERSION standard'"
    ok "$(find "$crds" -mindepth 1 -maxdepth 1 | wc -l) files from $crds applied in $(($(date +%s) - t0))s; gateways, httproutes, referencegrants Established (bundle $bundle)"
}

# ---- the cluster and what a run leaves on it -------------------------------------------------
# cluster_up: scripts/cluster.sh up (a health check when it is already up) as a step, its
# environment (KUBECONFIG, H3I_NODES, H3I_NODE_IPS, H3I_NODE_IPS6, H3I_POD_LOGS, H3I_BINARY),
# the node names and addresses as the arrays NODES, IPS and IPS6, and t0 = the step's start.
# shellcheck disable=SC2034 # those are for the sourcing script
cluster_up() {
    step "cluster up (scripts/cluster.sh up; warm: binaries cached)"
    t0=$(date +%s)
    "$CLUSTER" up 2>&1 | indent || fail "scripts/cluster.sh up"
    eval "$("$CLUSTER" env)"
    read -r -a NODES <<<"$H3I_NODES"
    read -r -a IPS <<<"$H3I_NODE_IPS"
    read -r -a IPS6 <<<"$H3I_NODE_IPS6"
}
# remove_leftovers MESSAGE NAMESPACE...: what an interrupted or kept (H3I_*_KEEP=1) run left
# (listeners, the release, the namespaces, the CRD) would confuse every check: delete it and
# wait until it is gone.
remove_leftovers() {
    info "$1"
    shift
    kubectl delete h3l --all --wait=true --timeout=60s >/dev/null 2>&1 || true
    helm uninstall "$RELEASE" -n "$NS_OP" --wait >/dev/null 2>&1 || true
    kubectl delete namespace "$@" --ignore-not-found --wait=true --timeout=90s >/dev/null ||
        fail "namespaces $* not deleted within 90s"
    kubectl delete crd http3listeners.h3-ingress.dev --ignore-not-found >/dev/null ||
        fail "crd http3listeners.h3-ingress.dev not deleted"
}
# remove_objects KEEP-VARIABLE LISTENERS CLUSTER-OBJECT NAMESPACE...: the EXIT trap's part that
# both scripts share. Unless $KEEP-VARIABLE is 1 (to look at what a run left): stop nginx, delete
# the listeners (LISTENERS: a name, or --all), the release, the namespaces, the CRD and the
# script's own cluster-scoped object (KIND/NAME) without waiting (the next run's
# remove_leftovers waits), and remove $tmp. Never fails: the run's verdict is already made.
remove_objects() {
    local keep=$1 listeners=$2 object=$3
    shift 3
    if [[ ${!keep:-0} == 1 ]]; then
        echo "$keep=1: objects, nginx and $tmp left in place"
        return 0
    fi
    stop_nginx || true
    if [[ -n ${KUBECONFIG:-} ]]; then
        kubectl delete h3l "$listeners" --ignore-not-found --wait=false >/dev/null 2>&1 || true
        helm uninstall "$RELEASE" -n "$NS_OP" --wait=false >/dev/null 2>&1 || true
        kubectl delete namespace "$@" --ignore-not-found --wait=false >/dev/null 2>&1 || true
        kubectl delete crd http3listeners.h3-ingress.dev --ignore-not-found --wait=false >/dev/null 2>&1 || true
        kubectl delete "$object" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
}

# ---- a roll under clients (rollout.sh, upgrade.sh) ------------------------------------------
# They share the application and the clients: PY, tmp, NODES, IPS, HOST, NS_APP, CLASS,
# LISTENER, DRAIN, SLOW_BYTES, SLOW_RATE set by the caller.
# roll_app NAME: a throw-away CA, a 2 MiB file under /slow/ that nginx serves at SLOW_RATE
# (sets SLOW_SHA), nginx for HOST on every node, namespace NS_APP with Secret NAME-tls,
# IngressClass CLASS, the annotated Ingress NAME and the Http3Listener LISTENER (upstream the
# node's nginx, drainTimeoutSeconds DRAIN).
roll_app() {
    local name=$1 node
    make_ca "h3i-$name-ca"
    leaf "$HOST" "$HOST"
    mkdir -p "$tmp/www/slow"
    head -c "$SLOW_BYTES" /dev/urandom >"$tmp/www/slow/2m.bin"
    SLOW_SHA=$(sha256sum "$tmp/www/slow/2m.bin" | cut -d' ' -f1)
    NGINX_EXTRA="location /slow/ { limit_rate $SLOW_RATE; }"
    for node in "${NODES[@]}"; do start_nginx "$node" "$HOST"; done
    app_objects "$name"
}
# app_objects NAME: namespace NS_APP with Secret NAME-tls ($tmp/pki/HOST's certificate),
# IngressClass CLASS, the annotated Ingress NAME for HOST and the Http3Listener LISTENER
# (upstream the node's nginx, drainTimeoutSeconds DRAIN).
app_objects() {
    local name=$1
    kubectl create namespace "$NS_APP" >/dev/null
    tls_secret "$NS_APP" "$name-tls" "$HOST"
    kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: $CLASS}
spec: {controller: example.com/h3i-$name}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: $name, namespace: $NS_APP, annotations: {h3-ingress.dev/enabled: "true"}}
spec:
  ingressClassName: $CLASS
  tls: [{hosts: [$HOST], secretName: $name-tls}]
  rules: [{host: $HOST, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}}]
---
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER}
spec:
  ingressClassName: $CLASS
  upstream: {address: "127.0.0.1:443"}
  http: {drainTimeoutSeconds: $DRAIN}
EOF
}
# roll_clients PREFIX SECONDS: tests/py/rollclient.py against every node for SECONDS (a new
# connection per request every 200 ms, a kept connection, the slow download), results in
# $tmp/PREFIXclients-I.json, request ids PREFIXNODE-; their pids in ROLL_CLIENTS. Returns
# once all of them run.
roll_clients() {
    local prefix=$1 seconds=$2 i
    ROLL_CLIENTS=()
    for i in "${!IPS[@]}"; do
        "$PY" "$REPO/tests/py/rollclient.py" --host "$HOST" --addr "${IPS[$i]}" --port 443 \
            --cacert "$tmp/pki/ca.crt" --duration "$seconds" --interval 0.2 \
            --slow-path /slow/2m.bin --slow-timeout $((DRAIN + 30)) \
            --ready-file "$tmp/${prefix}ready-$i" --id-prefix "$prefix${NODES[$i]}-" \
            >"$tmp/${prefix}clients-$i.json" 2>"$tmp/${prefix}clients-$i.err" &
        ROLL_CLIENTS+=($!)
    done
    wait_ok 30 "the clients run on ${IPS[*]}" eval '[[ -e $tmp/${prefix}ready-0 && -e $tmp/${prefix}ready-1 ]]'
}
# roll_clients_done PREFIX: waits for the clients of roll_clients; a client that failed to run
# fails the test.
roll_clients_done() {
    local p
    for p in "${ROLL_CLIENTS[@]}"; do wait "$p" || fail "a client run failed: $(cat "$tmp/$1"clients-*.err)"; done
    ROLL_CLIENTS=()
}
# roll_verdict PREFIX: tests/cluster/rollcheck.py on what the clients saw and both nodes'
# nginx access logs (one line per node on stdout); its exit status is the verdict.
roll_verdict() {
    local node logs=()
    for node in "${NODES[@]}"; do logs+=(--access-log "$tmp/nginx-$node/access.log"); done
    "$PY" "$REPO/tests/cluster/rollcheck.py" --result "${NODES[0]}=$tmp/$1clients-0.json" \
        --result "${NODES[1]}=$tmp/$1clients-1.json" "${logs[@]}" \
        --slow-bytes "$SLOW_BYTES" --slow-sha256 "$SLOW_SHA" --max-new-ms 3000
}
