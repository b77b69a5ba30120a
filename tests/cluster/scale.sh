#!/usr/bin/env bash
# The scale harness on the test cluster of scripts/cluster.sh (root): HOSTS annotated hosts in
# HOSTS/4 namespaces, each with its own TLS Secret (a distinct certificate from one test CA),
# a share of them HTTPRoutes on Gateways, against a 4-host baseline in the same run; then one
# table of what the product costs at each size. h3-ingress is a black box here: the harness
# writes only what users, cert-manager and a gateway controller write, and reads the
# listener's status.hostsSummary and conditions, the pods' /metrics, the API server's /metrics
# and the node agent's files (pids, logs), so it measures any implementation alike.
#
#   tests/cluster/scale.sh HOSTS [--no-assert] [--keep] [--out FILE] [--rsa]
#                          [--route-share PERCENT] [--window SECONDS] [--rounds N]
#                          [--base-rounds N] [--base-restart] [--served-timeout SECONDS]
#                          [--latency-timeout SECONDS] [--restart-timeout SECONDS]
#
#   HOSTS              annotated hosts at scale (a multiple of 4, at least 8)
#   --no-assert        print the table and exit 0 even when targets are missed
#   --keep             leave the objects, nginx and the scratch directory in place
#   --out FILE         also write the table as markdown to FILE
#   --rsa              RSA-2048 keys (cert-manager's default) instead of ECDSA P-256
#   --route-share P    percent of namespaces whose hosts are HTTPRoutes (default 10)
#   --window S         length of each steady-state window (default 60; it runs on, at most
#                      150 s more, until the data plane's upstream pool has emptied and a
#                      trim has run since: the memory read at its end is the steady state)
#   --rounds N         rounds of new host / rotation / removal at HOSTS (default 5)
#   --base-rounds N    the same at the baseline (default 3)
#   --base-restart     also delete a data-plane pod at the baseline
#   --served-timeout S cap on "every host served" and the status, from the last create (120)
#   --latency-timeout S  cap on each new-host / rotation / removal wait (30)
#   --restart-timeout S  cap on the deleted pod's replacement serving every host (90)
#
# The run: cluster up, the Gateway API CRDs, helm install, a Debian nginx per node as the TCP
# ingress (one catch-all server presenting each host's own certificate, loaded per handshake
# from $tmp/nginx-certs/HOST.pem, so the listener keeps its default upstream.verify:
# servedCertificate), IngressClass nginx, GatewayClass h3i-scale and one Http3Listener with
# both classes. Then, for the baseline (4 hosts) and for HOSTS: create; every host proven over
# HTTP/3 on both nodes (tests/cluster/scale, a Go tool with quic-go); the listener's status;
# peak memory; series per scrape; a steady-state window (API requests, watches, memory, log
# lines); new host, rotation and removal latencies; at HOSTS a data-plane pod deleted. Targets
# are issue 26's at 10,000 hosts (series per scrape scaled by HOSTS/10000); every wait is
# bounded, so a run on code that misses them ends and says what it saw.
#
# Needs the debug binary (or $H3I_BINARY), Go with the module proxy (the tool and the Gateway
# API CRDs, cached under $H3I_CLUSTER_CACHE) and Debian nginx. Without root it prints SKIPPED
# (and fails when H3I_TESTS_REQUIRE_ROOT=1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}

NS_OP=h3-ingress
RELEASE=h3-ingress
LISTENER=scale
CLASS=nginx
GW_CLASS=h3i-scale
NS_LABEL=h3i-scale=1 # every namespace the tool makes
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
T_START=$(date +%s)

usage() { sed -n '10,26p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
HOSTS=${1:-}
[[ $HOSTS =~ ^[0-9]+$ ]] || usage
shift
ASSERT=1 KEEP=0 OUT="" RSA="" ROUTE_SHARE=10 WINDOW=60 ROUNDS=5 BASE_ROUNDS=3 BASE_RESTART=0
SETTLE_CAP=150 # seconds the steady window may run past WINDOW for the upstream pool to empty
TRIM_WAIT=35   # the data plane returns freed memory every 30 s (src/memory.rs PERIOD)
SETTLE_MIN=100 # upstream connections at the window's start below which it does not wait
SERVED_TIMEOUT=120 LATENCY_TIMEOUT=30 RESTART_TIMEOUT=90
while (($#)); do
    case $1 in
        --no-assert) ASSERT=0 ;;
        --keep) KEEP=1 ;;
        --out) OUT=$(realpath -m "$2"); shift ;;
        --rsa) RSA=--rsa ;;
        --route-share) ROUTE_SHARE=$2; shift ;;
        --window) WINDOW=$2; shift ;;
        --rounds) ROUNDS=$2; shift ;;
        --base-rounds) BASE_ROUNDS=$2; shift ;;
        --base-restart) BASE_RESTART=1 ;;
        --served-timeout) SERVED_TIMEOUT=$2; shift ;;
        --latency-timeout) LATENCY_TIMEOUT=$2; shift ;;
        --restart-timeout) RESTART_TIMEOUT=$2; shift ;;
        *) usage ;;
    esac
    shift
done
((HOSTS >= 8 && HOSTS % 4 == 0)) || { echo "HOSTS must be a multiple of 4, at least 8: $HOSTS" >&2; exit 2; }
# shellcheck disable=SC2034 # read as ${!keep} by lib.sh's remove_objects
H3I_SCALE_KEEP=$KEEP

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
fail_listeners() {
    echo "--- listener:"
    kubectl get h3l -o wide
    kubectl get h3l -o jsonpath='{range .items[*]}{.metadata.name}: {.status.hostsSummary} {.status.conditions}{"\n"}{end}' | cut -c1-2000
}
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nSCALE RUN FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root "SCALE RUN"

tmp=$(mktemp -d /tmp/h3i-scale.XXXXXX)
STATE=$tmp/state.json
RESULTS=$tmp/results.json
cleanup() {
    local rc=$?
    if [[ $KEEP != 1 && -n ${KUBECONFIG:-} ]]; then
        kubectl delete namespace -l "$NS_LABEL" --wait=false >/dev/null 2>&1 || true
        kubectl delete ingressclass "$CLASS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    fi
    remove_objects H3I_SCALE_KEEP "$LISTENER" "gatewayclass/$GW_CLASS" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

now_ms() { date +%s%3N; }
load() { cut -d' ' -f1-3 /proc/loadavg; }

# ---- the tool: tests/cluster/scale (Go), built once per source hash into the cache ---------
build_tool() {
    local src=$REPO/tests/cluster/scale key out
    key=$( (cd "$src" && cat go.mod go.sum ./*.go && go version) | sha256sum | cut -c1-12)
    out=$CACHE/scale-$key/h3i-scale
    if [[ ! -x $out ]]; then
        mkdir -p "$(dirname "$out")"
        (cd "$src" && GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local \
            nice -n 10 go build -trimpath -ldflags='-s -w' -o "$out.tmp" .) >"$tmp/tool-build.log" 2>&1 ||
            fail "go build tests/cluster/scale: $(cat "$tmp/tool-build.log")"
        mv "$out.tmp" "$out"
        ok "built $out"
    else
        ok "cached $out"
    fi
    TOOL=$out
}
# tool COMMAND ARGS...: the tool with the run's files; its output indented.
tool() {
    local cmd=$1
    shift
    "$TOOL" "$cmd" --kubeconfig "$KUBECONFIG" --state "$STATE" --results "$RESULTS" --ca "$tmp/pki/ca.crt" \
        --pki "$tmp/pki" --nginx-certs "$tmp/nginx-certs" --namespace "$NS_OP" --nodes "$H3I_NODE_IPS" "$@" 2>&1 | indent
    return "${PIPESTATUS[0]}"
}

# ---- the TCP ingress: one catch-all nginx per node ------------------------------------------
# Every host's certificate and key sit in $tmp/nginx-certs/HOST.pem (the tool writes them
# before the Secret): nginx loads the file named by the handshake's SNI, so it presents each
# host's own certificate, refuses names without a file, and a rotation needs no reload.
scale_nginx() { # NODE
    local node=$1 d=$tmp/nginx-$1 nofile
    # One connection from the data plane per host (its pool keeps them 60 s): as many files as
    # the hard limit allows.
    nofile=$(ulimit -Hn)
    [[ $nofile == unlimited ]] && nofile=200000
    mkdir -p "$d/tmp"
    cat >"$d/nginx.conf" <<CONF
user root;
worker_processes 1;
worker_rlimit_nofile $nofile;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections $((nofile - 100)); }
http {
    access_log off;
    client_body_temp_path $d/tmp/body;
    proxy_temp_path $d/tmp/proxy;
    fastcgi_temp_path $d/tmp/fastcgi;
    uwsgi_temp_path $d/tmp/uwsgi;
    scgi_temp_path $d/tmp/scgi;
    server {
        listen 443 ssl http2 default_server;
        listen [::]:443 ssl http2 default_server;
        ssl_certificate $tmp/nginx-certs/\$ssl_server_name.pem;
        ssl_certificate_key $tmp/nginx-certs/\$ssl_server_name.pem;
        add_header Alt-Svc '$ALT_SVC' always;
        location / { default_type text/plain; return 200 "\$host on $node\n"; }
    }
}
CONF
    ip netns exec "$node" nginx -p "$d/" -c "$d/nginx.conf" || fail "nginx did not start in $node: $(cat "$d/error.log" 2>/dev/null)"
}

# ---- the product's objects ------------------------------------------------------------------
dp_pods_up() { # both data-plane pods run and answer /healthz (not Ready: no host yet)
    local ip
    for ip in "${IPS[@]}"; do
        [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$ip:9476/healthz") == 200 ]] || return 1
    done
}
listener_bytes() { kubectl get h3l "$LISTENER" -o json | wc -c; }

# upstream_open IP: the data plane's connections to the TCP ingress (in use or idle in its pool).
upstream_open() {
    curl -s --max-time 2 "http://$1:9476/metrics" | awk '$1 == "h3_ingress_upstream_connections" { print $2 }'
}
# rest_window FROM-MS: the steady window, WINDOW seconds from FROM-MS, and longer if needed until
# the pool's connections from the harness's requests to every host have closed (idle timeout;
# fewer than SETTLE_MIN left) and a trim (every 30 s) has run since, so the memory read after it is the steady state and
# not the tail of that burst (cap SETTLE_CAP seconds past the window).
rest_window() {
    local from=$1 empty_at="" open ip n end=$(($1 + WINDOW * 1000)) cap=$(($1 + (WINDOW + SETTLE_CAP) * 1000)) first=""
    while :; do
        open=0 # the most of any pod
        for ip in "${IPS[@]}"; do
            n=$(upstream_open "$ip")
            ((${n:-0} > open)) && open=${n:-0}
        done
        [[ -n $first ]] || first=$open
        # A few connections weigh nothing (the baseline's pool; the Alt-Svc probe, one host a
        # second, keeps 30 to 60 open per pod): only the pool of a burst is awaited.
        if ((open < SETTLE_MIN)); then
            [[ -n $empty_at ]] || empty_at=$(now_ms)
        else
            empty_at=""
        fi
        local t
        t=$(now_ms)
        if ((t >= end)) && [[ -n $empty_at ]] && ((t - empty_at >= TRIM_WAIT * 1000)); then break; fi
        if ((t >= cap)); then
            info "upstream connections still open ($open) ${SETTLE_CAP}s after the window: memory read anyway"
            break
        fi
        sleep 5
    done
    if ((first < SETTLE_MIN)); then
        info "steady window: $((($(now_ms) - from) / 1000)) s ($first upstream connections at its start, the most of any pod)"
    else
        info "steady window: $((($(now_ms) - from) / 1000)) s ($first upstream connections at its start, the most of any pod; fewer than $SETTLE_MIN from $(((${empty_at:-$(now_ms)} - from) / 1000)) s into it)"
    fi
}

# heap_info: what each process's allocator says it holds (h3_ingress_*heap_bytes): live data
# against what it keeps, next to the RSS the table shows.
heap_info() {
    local ip op_ip line=""
    op_ip=$(kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator \
        -o jsonpath='{.items[0].status.podIP}' 2>/dev/null || true)
    heap_of() { curl -s --max-time 2 "http://$1/metrics" | awk -v m="$2" \
        '$1 == m "{state=\"in_use\"}" { u = $2 } $1 == m "{state=\"free\"}" { f = $2 }
         END { if (u != "") printf "%.0f MiB in use, %.0f MiB free", u / 1048576, f / 1048576; else printf "?" }'; }
    [[ -n $op_ip ]] && line="operator $(heap_of "$op_ip:9477" h3_ingress_operator_heap_bytes)"
    for ip in "${IPS[@]}"; do line+="; data plane $ip $(heap_of "$ip:9476" h3_ingress_heap_bytes)"; done
    info "heap: $line"
}

# measure COL FIRST-CREATE-MS: what follows each batch of creates (the state file names the
# last create): every host served and the status, peak memory, series, the steady window.
measure() {
    local col=$1 load_from=$2 load_to rest_from rest_to
    tool served --col "$col" --listener "$LISTENER" --timeout "${SERVED_TIMEOUT}s" || fail "served ($col)"
    load_to=$(now_ms)
    tool procs --col "$col" --phase peak || fail "procs"
    tool series --col "$col" --node "${IPS[0]}" || info "no scrape of ${IPS[0]}:9476/metrics"
    step "$([[ $col == base ]] && echo baseline || echo scale): steady state, a ${WINDOW}s window (no request from the harness meanwhile; load $(load))"
    kubectl get --raw /metrics >"$tmp/api-$col-before.txt"
    rest_from=$(now_ms)
    rest_window "$rest_from"
    rest_to=$(now_ms)
    kubectl get --raw /metrics >"$tmp/api-$col-after.txt"
    tool apirate --col "$col" --before "$tmp/api-$col-before.txt" --after "$tmp/api-$col-after.txt" \
        --seconds "$(((rest_to - rest_from) / 1000))" || fail "apirate"
    tool watches --col "$col" --scrape "$tmp/api-$col-after.txt" || fail "watches"
    tool procs --col "$col" --phase steady || fail "procs"
    heap_info
    "$TOOL" set --results "$RESULTS" --col "$col" "listener_bytes=$(listener_bytes)" \
        "load_from_ms=$load_from" "load_to_ms=$load_to" "rest_from_ms=$rest_from" "rest_to_ms=$rest_to"
    ok "listener object: $(listener_bytes) bytes; status: $(jp h3l "$LISTENER" -o jsonpath='{.status.hostsSummary} Ready={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}')"
}
# logs COL REPEAT-FROM-MS: log lines per pod per minute in the col's windows, and repeats
# from REPEAT-FROM-MS until now.
logs() {
    local col=$1 r
    r=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); c=sys.argv[2]; print(" ".join("%d" % r[c+"."+k] for k in ("load_from_ms","load_to_ms","rest_from_ms","rest_to_ms")))' "$RESULTS" "$col")
    read -r lf lt rf rt <<<"$r"
    tool logs --col "$col" --load-from "$lf" --load-to "$lt" --rest-from "$rf" --rest-to "$rt" \
        --repeat-from "$2" --repeat-to "$(now_ms)" || fail "logs"
}
latency() { # COL ROUNDS
    tool latency --col "$1" --rounds "$2" --timeout "${LATENCY_TIMEOUT}s" $RSA --route-share "$ROUTE_SHARE" ||
        fail "latency ($1)"
}
restart() { # COL
    tool restart --col "$1" --node "${NODES[0]}" --node-ip "${IPS[0]}" --timeout "${RESTART_TIMEOUT}s" || fail "restart ($1)"
}

# =============================================================================================
LOAD_START=$(load)
cluster_up
ok "up in $(($(date +%s) - t0))s; nodes ${NODES[*]} at ${IPS[*]}; load $(load)"
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
command -v nginx >/dev/null || fail "no nginx (apt-get install nginx)"
T_RUN=$(date +%s)
if kubectl get ns "$NS_OP" >/dev/null 2>&1 || kubectl get crd http3listeners.h3-ingress.dev >/dev/null 2>&1 ||
    [[ -n $(kubectl get ns -l "$NS_LABEL" -o name 2>/dev/null) ]]; then
    remove_leftovers "removing what a previous run left" "$NS_OP"
    n=$(kubectl get ns -l "$NS_LABEL" -o name | wc -l)
    info "deleting $n namespaces labelled $NS_LABEL"
    kubectl delete ns -l "$NS_LABEL" --wait=true --timeout=600s >/dev/null || fail "namespaces $NS_LABEL not deleted within 600s"
fi
for node in "${NODES[@]}"; do
    for pid in $(ip netns pids "$node"); do
        if [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == "nginx: master process nginx -p /tmp/h3i-scale."* ]]; then
            info "stopping a previous run's nginx in $node (pid $pid)"
            kill -QUIT "$pid" 2>/dev/null || true
        fi
    done
done
ok "binary $H3I_BINARY ($("$H3I_BINARY" --version 2>/dev/null || echo '?'))"

step "the harness's tool (tests/cluster/scale: client-go, quic-go)"
build_tool

step "the Gateway API $GATEWAY_API_VERSION standard-channel CRDs"
install_gateway_api_crds

step "helm install the chart (image $IMAGE_REPO = the local binary through the node agent)"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    --wait --timeout 120s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
ok "operator running"

step "the TCP ingress: a catch-all Debian nginx per node presenting each host's own certificate"
make_ca h3i-scale-ca
mkdir -p "$tmp/nginx-certs"
for node in "${NODES[@]}"; do scale_nginx "$node"; done
ok "nginx on TCP 443 in ${NODES[*]}"

step "IngressClass $CLASS, GatewayClass $GW_CLASS, Http3Listener $LISTENER (upstream 127.0.0.1:443, verify servedCertificate)"
kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: $CLASS}
spec: {controller: k8s.io/ingress-nginx}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: $GW_CLASS}
spec: {controllerName: example.com/h3i-scale-gateway}
---
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER}
spec:
  ingressClassName: $CLASS
  gatewayClassName: $GW_CLASS
  port: 443
  upstream: {address: "127.0.0.1:443"}
  metrics: {address: "[::]:9476"}
  http: {drainTimeoutSeconds: 2}
EOF
wait_ok 90 "both data-plane pods answer /healthz on ${IPS[*]}:9476" dp_pods_up

# =============================================================================================
step "baseline: 4 annotated Ingresses with their Secrets in one namespace (load $(load))"
T_BASE=$(now_ms)
tool create --col base --from 0 --to 4 --route-share "$ROUTE_SHARE" $RSA || fail "create (baseline)"
h=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["hosts"][0]["name"])' "$STATE")
out=$(curl -sS --http2 --max-time 5 --cacert "$tmp/pki/ca.crt" --resolve "$h:443:${IPS[0]}" -o /dev/null \
    -w '%{http_version} %{response_code}' "https://$h/") || fail "nginx for $h: $out"
[[ $out == "2 200" ]] || fail "nginx on ${IPS[0]} for $h: $out"
ok "nginx presents $h's certificate over h2 (and refuses names without one)"
measure base "$T_BASE"
step "baseline: $BASE_ROUNDS rounds of new host, rotated Secret, removed annotation"
latency base "$BASE_ROUNDS"
if ((BASE_RESTART)); then
    step "baseline: delete the data-plane pod on ${NODES[0]}"
    restart base
fi
logs base "$T_BASE"

# =============================================================================================
step "scale: $((HOSTS - 4)) more hosts in $((HOSTS / 4 - 1)) more namespaces, ${ROUTE_SHARE}% of namespaces HTTPRoutes (load $(load))"
T_SCALE=$(now_ms)
tool create --col scale --from 4 --to "$HOSTS" --route-share "$ROUTE_SHARE" $RSA || fail "create ($HOSTS)"
step "scale: every host served over HTTP/3 on both nodes, and the listener's status (cap ${SERVED_TIMEOUT}s)"
measure scale "$T_SCALE"
step "scale: $ROUNDS rounds of new host, rotated Secret, removed annotation (load $(load))"
latency scale "$ROUNDS"
step "scale: delete the data-plane pod on ${NODES[0]} (cap ${RESTART_TIMEOUT}s)"
restart scale
logs scale "$T_SCALE"

# =============================================================================================
step "the table"
ELAPSED=$(($(date +%s) - T_RUN))
set +e
"$TOOL" report --results "$RESULTS" --hosts "$HOSTS" --assert="$([[ $ASSERT == 1 ]] && echo true || echo false)" \
    --elapsed "$ELAPSED" ${OUT:+--out "$OUT"}
rc=$?
set -e
step_table
echo "load average: at the start $LOAD_START, at the end $(load); binary $H3I_BINARY"
if ((rc != 0)); then
    printf '\nSCALE RUN FAILED: targets missed at %s hosts (see above)\n' "$HOSTS" >&2
    exit 1
fi
if ((ASSERT)); then
    echo "SCALE RUN PASSED at $HOSTS hosts in $(($(date +%s) - T_START))s"
else
    echo "SCALE RUN DONE at $HOSTS hosts in $(($(date +%s) - T_START))s (--no-assert: targets reported, not enforced)"
fi
