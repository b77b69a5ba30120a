#!/usr/bin/env bash
# The user's journey on the test cluster of scripts/cluster.sh (root): helm install, a TCP
# ingress (Debian nginx) on each node, an annotated Ingress, an Http3Listener, HTTP/3 on every
# node address with two independent clients, status and the kubectl plugin, certificate
# rotation, the per-host switch, a rolling socket change, leader hand-over, garbage collection,
# the CRD's CEL rule, an API server outage, RBAC as the API server judges it, and the operator's
# fixes a real cluster needs (quiet under traffic, IPv6 admin endpoints, port conflicts, the
# optional Service, Pod Security admission errors in the status). Every step prints its elapsed
# time; every check fails the run with a message naming what was expected.
#
#   tests/cluster/journey.sh       brings the cluster up if needed; leaves it up afterwards
#                                  (scripts/test.sh runs `scripts/cluster.sh down`); the
#                                  journey's own objects and nginx are removed on exit
#                                  unless H3I_JOURNEY_KEEP=1
#
# Needs: the debug binary (or $H3I_BINARY), tests/py/h3client.py's aioquic (scripts/setup.sh),
# and the trixie chroot with curl 8.14 (scripts/trixie-chroot.sh $H3I_TRIXIE_ROOT, default
# /work/trixie-root, the lab's). Without root it prints SKIPPED (and fails when
# H3I_TESTS_REQUIRE_ROOT=1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
TRIXIE=${H3I_TRIXIE_ROOT:-/work/trixie-root}
export H3I_TRIXIE_ROOT=$TRIXIE

NS_OP=h3-ingress # the release namespace: operator and data plane
RELEASE=h3-ingress
NS_APP=h3i-journey-shop
NS_HOSTS=$NS_OP-hosts        # the certificate mirrors (chart default: <release namespace>-hosts)
HOST=shop.h3i.test
HOST2=shop2.h3i.test
LISTENER=journey
DP=h3-ingress-$LISTENER          # DaemonSet and ServiceAccount of the listener
DP_RBAC=h3-ingress-data-plane-$LISTENER # its Role(Binding) in the hosts namespace
DP_CLUSTER_RBAC=$NS_OP.$DP_RBAC  # its ClusterRole(Binding): named after the operator's namespace too
OP_SA=h3-ingress                 # the chart's operator ServiceAccount (release name)
DP_USER=system:serviceaccount:$NS_OP:$DP
OP_USER=system:serviceaccount:$NS_OP:$OP_SA
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'     # what nginx advertises (the proxy's own default differs)
# The privileged init container's image, pinned by digest as a mirror would (never pulled:
# only the Pod Security step's listener, whose pods admission refuses, uses it).
TUNE_IMAGE=registry.h3i.test/mirror/busybox@sha256:$(printf 'h3i-journey' | sha256sum | cut -c1-64)
OP_ROLE=$RELEASE-operator        # the chart's namespaced Role of the operator
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
# On failure: the step table, every listener's columns and conditions, and the logs of the
# pods that exist now in $NS_OP (not of those the rolls and hand-overs replaced).
fail_listeners() {
    echo "--- listeners:"
    kubectl get h3l -o wide
    kubectl get h3l -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions}{"\n"}{end}'
}
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nJOURNEY FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root JOURNEY

tmp=$(mktemp -d /tmp/h3i-journey.XXXXXX)
cleanup() {
    local rc=$?
    remove_objects H3I_JOURNEY_KEEP --all ingressclass/nginx "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
# A command failing outside a check (set -e) still says where and what.
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

# ---- the TCP ingress: lib.sh's nginx per node, serving $HOST, $HOST2 and /1m.bin (random) ---
# nginx_use_cert NAME SOURCE: point nginx on every node at a certificate and reload it.
nginx_use_cert() {
    local node
    for node in $H3I_NODES; do
        cp "$tmp/pki/$2.crt" "$tmp/nginx-$node/$1.crt"
        cp "$tmp/pki/$2.key" "$tmp/nginx-$node/$1.key"
        ip netns exec "$node" nginx -p "$tmp/nginx-$node/" -c "$tmp/nginx-$node/nginx.conf" -s reload
    done
}

# ---- a small PKI: one CA, a leaf per host, and a second leaf for the rotation --------------
make_pki() {
    make_ca h3i-journey-ca
    leaf "$HOST"
    leaf "$HOST.v2" "$HOST"
    leaf "$HOST2" "$HOST2"
    CERT_V1=$(python3 "$JPY" der-sha256 "$tmp/pki/$HOST.crt")
    CERT_V2=$(python3 "$JPY" der-sha256 "$tmp/pki/$HOST.v2.crt")
    CERT_HOST2=$(python3 "$JPY" der-sha256 "$tmp/pki/$HOST2.crt")
}

# ---- HTTP/3 checks ---------------------------------------------------------------------------
# h3_both HOST CERT-SHA: both clients on every node address (IPv4), the IPv6 address of the
# first node with aioquic: status 200, the certificate, /1m.bin's hash and nginx's Alt-Svc.
h3_both() {
    local host=$1 cert=$2 ip
    for ip in $H3I_NODE_IPS; do
        python3 "$JPY" h3 --client aioquic --addr "$ip" --host "$host" --cacert "$tmp/pki/ca.crt" \
            --path /1m.bin --cert-sha "$cert" --body-sha "$BODY_SHA" --alt-svc "$ALT_SVC" || fail "aioquic on $ip"
        python3 "$JPY" h3 --client curl --addr "$ip" --host "$host" --cacert "$tmp/pki/ca.crt" \
            --path /1m.bin --cert-sha "$cert" --body-sha "$BODY_SHA" --alt-svc "$ALT_SVC" || fail "trixie curl on $ip"
    done
    python3 "$JPY" h3 --client aioquic --addr "${IPS6[0]}" --host "$host" --cacert "$tmp/pki/ca.crt" \
        --path /whoami --cert-sha "$cert" --alt-svc "$ALT_SVC" || fail "aioquic on ${IPS6[0]}"
}
# h3_quiet ADDR HOST CERT-SHA: one aioquic GET /whoami, for polling.
h3_quiet() {
    python3 "$JPY" h3 --addr "$1" --host "$2" --cacert "$tmp/pki/ca.crt" --path /whoami --cert-sha "$3" >/dev/null 2>&1
}
h3_all_nodes() { # HOST CERT-SHA
    local ip
    for ip in $H3I_NODE_IPS; do h3_quiet "$ip" "$1" "$2" || return 1; done
}
refused_all_nodes() { # HOST KIND: tls_alert (a live server refuses the name) or silent
    local ip
    for ip in $H3I_NODE_IPS; do
        python3 "$JPY" refused --addr "$ip" --host "$1" --kind "$2" --cacert "$tmp/pki/ca.crt" >/dev/null 2>&1 || return 1
    done
}

# ---- cluster objects -------------------------------------------------------------------------
listener_uid() { jp h3l "$1" -o jsonpath='{.metadata.uid}'; }
cond() { jp h3l "$1" -o jsonpath="{.status.conditions[?(@.type==\"$2\")].$3}"; } # LISTENER TYPE FIELD
ds_pods() { kubectl -n "$NS_OP" get pods -l "app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane" "$@"; }
# pods_state: "name uid restarts node" per data plane pod, sorted.
pods_state() {
    ds_pods -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.status.containerStatuses[0].restartCount} {.spec.nodeName}{"\n"}{end}' | sort
}
ds_rolled_out() { # DS: all pods updated, available and ready
    local s
    s=$(jp ds -n "$NS_OP" "$1" -o jsonpath='{.metadata.generation} {.status.observedGeneration} {.status.desiredNumberScheduled} {.status.updatedNumberScheduled} {.status.numberReady} {.status.numberAvailable}')
    read -r g og want upd ready avail <<<"$s"
    [[ -n $want && $g == "$og" && $want -gt 0 && $upd == "$want" && $ready == "$want" && $avail == "$want" ]]
}
operator_leader_pod() {
    local holder
    holder=$(jp lease -n "$NS_OP" h3-ingress-operator -o jsonpath='{.spec.holderIdentity}')
    [[ -n $holder ]] && echo "${holder%_*}"
}
# A replica that still exists holds the Lease (not empty after a release, not a deleted pod).
leader_running() {
    local p
    p=$(operator_leader_pod) && [[ -z $(jp pod -n "$NS_OP" "$p" -o jsonpath='{.metadata.deletionTimestamp}') ]] &&
        [[ $(jp pod -n "$NS_OP" "$p" -o jsonpath='{.status.phase}') == Running ]]
}
operator_metric() { # NAME: summed over labels, from the leader's admin endpoint
    local pod ip
    pod=$(operator_leader_pod) || return 1
    ip=$(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.podIP}')
    python3 "$JPY" metric --url "http://$ip:9477/metrics" --name "$1"
}
# owned_by_listener KIND NAME [NAMESPACE]: the object has a controller owner reference to the listener.
owned_by_listener() {
    local ref
    ref=$(jp "$1" "$2" ${3:+-n "$3"} -o jsonpath='{range .metadata.ownerReferences[?(@.controller==true)]}{.kind}/{.name}/{.uid}{end}')
    [[ $ref == "Http3Listener/$LISTENER/$LISTENER_UID" ]] || fail "$1 $2${3:+ in $3}: controller owner '$ref', want Http3Listener/$LISTENER/$LISTENER_UID"
}

apply_listener() { # NAME PORT METRICS-PORT [EXTRA-SPEC-YAML (indented by 2)]
    kubectl apply -f - <<EOF
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $1}
spec:
  ingressClassName: nginx
  port: $2
  upstream: {address: "127.0.0.1:443"}
  metrics: {address: "[::]:$3"}
  http: {drainTimeoutSeconds: 2}
${4:-}
EOF
}

ingress_yaml() { # NAME CLASS HOST: an Ingress with the h3 annotation for HOST (Secret <first label>-tls)
    local class=""
    [[ -n $2 ]] && class="ingressClassName: $2"
    cat <<EOF
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: $1
  namespace: $NS_APP
  annotations: {h3-ingress.dev/enabled: "true"}
spec:
  $class
  tls: [{hosts: [$3], secretName: ${3%%.*}-tls}]
  rules:
    - host: $3
      http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}
EOF
}

# =============================================================================================
cluster_up
ok "up in $(($(date +%s) - t0))s; nodes: $(kubectl get nodes --no-headers | awk '{printf "%s=%s ", $1, $2}')"
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
[[ -x $TRIXIE/usr/bin/curl ]] || fail "no trixie chroot with curl at $TRIXIE: scripts/trixie-chroot.sh $TRIXIE"
# A journey left behind by an interrupted run (H3I_JOURNEY_KEEP=1) would confuse every check.
if kubectl get ns "$NS_OP" "$NS_APP" >/dev/null 2>&1 || kubectl get crd http3listeners.h3-ingress.dev >/dev/null 2>&1; then
    remove_leftovers "removing a previous journey's objects" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass nginx --ignore-not-found >/dev/null
for node in "${NODES[@]}"; do
    for pid in $(ip netns pids "$node"); do
        # A kept journey's nginx (its master's command line names its /tmp/h3i-journey.* prefix).
        if [[ $(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) == "nginx: master process nginx -p /tmp/h3i-journey."* ]]; then
            info "stopping a previous journey's nginx in $node (pid $pid)"
            kill -QUIT "$pid" 2>/dev/null || true
        fi
    done
done
ok "binary $H3I_BINARY ($("$H3I_BINARY" --version 2>/dev/null || echo '?')), trixie curl in $TRIXIE"

# =============================================================================================
step "helm install the chart (image $IMAGE_REPO = $(image_source), a pull secret)"
kubectl create namespace "$NS_OP" >/dev/null
# README: the data plane is hostNetwork, so its namespace must allow privileged pods.
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
# The agent never pulls; real nodes pull from the cluster's registry with its credentials.
reg_user=journey reg_password=not-a-real-one
if pods_real; then reg_user=$H3I_REGISTRY_USER reg_password=$(cat "$H3I_REGISTRY_PASSWORD_FILE"); fi
kubectl -n "$NS_OP" create secret docker-registry regcred --docker-server=registry.h3i.test \
    --docker-username="$reg_user" --docker-password="$reg_password" >/dev/null
t0=$(date +%s)
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    --set 'imagePullSecrets[0].name=regcred' --wait --timeout 120s >"$tmp/helm-install.log" 2>&1 ||
    fail "helm install: $(cat "$tmp/helm-install.log")"
ok "helm install --wait: $(($(date +%s) - t0))s; $(helm list -n "$NS_OP" -o json | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(r["name"], r["chart"], "app", r["app_version"], r["status"])')"
app_version=$(awk '/^appVersion:/ {gsub(/"/, "", $2); print $2}' "$REPO/charts/h3-ingress/Chart.yaml")

step "the CRD is established, the operator pod runs the binary and holds the Lease"
kubectl wait --for=condition=Established crd/http3listeners.h3-ingress.dev --timeout=30s >/dev/null ||
    fail "CRD http3listeners.h3-ingress.dev not Established"
ok "crd/http3listeners.h3-ingress.dev Established; $(kubectl api-resources --api-group=h3-ingress.dev --no-headers | awk '{print "kind", $NF, "short name", $2}')"
list_type=$(jp crd http3listeners.h3-ingress.dev -o jsonpath='{.spec.versions[0].schema.openAPIV3Schema.properties.status.properties.conditions.x-kubernetes-list-type}/{.spec.versions[0].schema.openAPIV3Schema.properties.status.properties.conditions.x-kubernetes-list-map-keys}')
[[ $list_type == 'map/["type"]' ]] || fail "status.conditions should be a list map keyed by type: $list_type"
ok "status.conditions: x-kubernetes-list-type map keyed by type (as served by the API server)"
OP_POD=$(kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
[[ -n $OP_POD ]] || fail "no operator pod"
IFS='|' read -r phase ready image pullsecret <<<"$(jp pod -n "$NS_OP" "$OP_POD" -o jsonpath='{.status.phase}|{.status.conditions[?(@.type=="Ready")].status}|{.spec.containers[0].image}|{.spec.imagePullSecrets[0].name}')"
[[ $phase == Running && $ready == True ]] || fail "operator pod $OP_POD: phase $phase Ready $ready"
[[ $image == "$IMAGE_REPO:$app_version" ]] || fail "operator image $image, want $IMAGE_REPO:$app_version (the chart's appVersion)"
[[ $pullsecret == regcred ]] || fail "operator pod imagePullSecrets '$pullsecret', want regcred"
op_pid=$(pod_pid "$NS_OP" "$OP_POD" operator)
[[ $(readlink -f "/proc/$op_pid/exe") == $(readlink -f "$(pod_exe)") ]] || fail "operator pid $op_pid is not $H3I_BINARY"
ok "$OP_POD Running and Ready, image $image, imagePullSecrets regcred, pid $op_pid = $H3I_BINARY $(tr '\0' ' ' <"/proc/$op_pid/cmdline" | cut -d' ' -f2-)"
until_ok 30 "the operator holds Lease $NS_OP/h3-ingress-operator" eval '[[ $(operator_leader_pod) == "$OP_POD" ]]'
ok "Lease $NS_OP/h3-ingress-operator held by $(jp lease -n "$NS_OP" h3-ingress-operator -o jsonpath='{.spec.holderIdentity}')"

# =============================================================================================
step "the TCP ingress: Debian nginx $(nginx -v 2>&1 | cut -d/ -f2) on TCP 443 in each node's namespace"
make_pki
mkdir -p "$tmp/www"
head -c 1048576 /dev/urandom >"$tmp/www/1m.bin"
BODY_SHA=$(sha256sum "$tmp/www/1m.bin" | cut -d' ' -f1)
for node in "${NODES[@]}"; do start_nginx "$node" "$HOST" "$HOST2"; done
for i in 0 1; do
    out=$(curl -sS --http2 --max-time 5 --cacert "$tmp/pki/ca.crt" --resolve "$HOST:443:${IPS[$i]}" \
        -D - -o /dev/null -w '%{http_version} %{response_code}' "https://$HOST/1m.bin") || fail "nginx on ${NODES[$i]}: $out"
    [[ $out == *"alt-svc: $ALT_SVC"* && $out == *"2 200" ]] || fail "nginx on ${IPS[$i]}: $out"
    ok "${NODES[$i]}: https://$HOST/1m.bin over h2 from ${IPS[$i]}:443 -> 200 with Alt-Svc $ALT_SVC"
done

step "namespace $NS_APP: TLS Secrets, an IngressClass, an Ingress annotated h3-ingress.dev/enabled"
kubectl create namespace "$NS_APP" >/dev/null
tls_secret "$NS_APP" shop-tls "$HOST"
kubectl -n "$NS_APP" create secret generic other-secret --from-literal=password=hunter2 >/dev/null
kubectl apply -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: nginx}
spec: {controller: k8s.io/ingress-nginx}
EOF
ingress_yaml shop nginx "$HOST" | kubectl apply -f - >/dev/null
ok "secret/shop-tls (cert sha256 ${CERT_V1:0:12}), secret/other-secret, ingressclass/nginx, ingress/shop for $HOST"

# =============================================================================================
step "an Http3Listener '$LISTENER': UDP 443 on every node, upstream 127.0.0.1:443 (the node's nginx)"
apply_listener "$LISTENER" 443 9476 | indent
LISTENER_UID=$(listener_uid "$LISTENER")
wait_ok 30 "DaemonSet $NS_OP/$DP created" kubectl -n "$NS_OP" get ds "$DP"

step "the DaemonSet, ServiceAccount, least-privilege RBAC and the certificate mirror appear, owned by the listener"
until_ok 30 "Role/RoleBinding $DP_RBAC in $NS_HOSTS" kubectl -n "$NS_HOSTS" get rolebinding "$DP_RBAC"
owned_by_listener ds "$DP" "$NS_OP"
owned_by_listener sa "$DP" "$NS_OP"
owned_by_listener clusterrole "$DP_CLUSTER_RBAC"
owned_by_listener clusterrolebinding "$DP_CLUSTER_RBAC"
owned_by_listener role "$DP_RBAC" "$NS_HOSTS"
owned_by_listener rolebinding "$DP_RBAC" "$NS_HOSTS"
ok "ds/$DP, sa/$DP (ns $NS_OP), clusterrole+binding/$DP_CLUSTER_RBAC, role+rolebinding/$DP_RBAC (ns $NS_HOSTS): controller owner Http3Listener/$LISTENER"
role_rules=$(jp role -n "$NS_HOSTS" "$DP_RBAC" -o jsonpath='{range .rules[*]}{.resources}:{.resourceNames}:{.verbs}{"\n"}{end}')
[[ $role_rules == '["secrets"]::["get","list","watch"]' ]] ||
    fail "Role $NS_HOSTS/$DP_RBAC should grant only reading Secrets there: $role_rules"
ok "Role in $NS_HOSTS: $role_rules"
[[ -z $(kubectl get role,rolebinding -n "$NS_APP" -l "app.kubernetes.io/instance=$LISTENER" -o name) ]] ||
    fail "the data plane got RBAC in the application namespace $NS_APP"
cr_rules=$(jp clusterrole "$DP_CLUSTER_RBAC" -o jsonpath='{range .rules[*]}{.apiGroups}{.resources}{.resourceNames}{.verbs}{"\n"}{end}')
indent <<<"$cr_rules"
[[ $cr_rules == '["h3-ingress.dev"]["http3listeners"]["'"$LISTENER"'"]["get","list","watch"]' ]] ||
    fail "ClusterRole $DP_CLUSTER_RBAC should grant only reading its listener: $cr_rules"
mirror_of() { # SECRET: the mirror's name, type, source and hosts
    kubectl -n "$NS_HOSTS" get secrets -l "h3-ingress.dev/listener=$LISTENER" -o json |
        python3 -c 'import json,sys,base64
for s in json.load(sys.stdin)["items"]:
    a = s["metadata"].get("annotations", {})
    if a.get("h3-ingress.dev/source") == sys.argv[1]:
        hosts = [h["name"] for h in json.loads(base64.b64decode(s["data"]["hosts.json"]))["hosts"]]
        print(s["metadata"]["name"], s["type"], a["h3-ingress.dev/source"], ",".join(hosts))' "$1"
}
until_ok 30 "the certificate mirror of $NS_APP/shop-tls in $NS_HOSTS" eval '[[ -n $(mirror_of "$NS_APP/shop-tls") ]]'
read -r mirror mtype msource mhosts <<<"$(mirror_of "$NS_APP/shop-tls")"
[[ $mtype == h3-ingress.dev/host-certificate && $mhosts == "$HOST" ]] ||
    fail "mirror $mirror: type $mtype, hosts $mhosts"
owned_by_listener secret "$mirror" "$NS_HOSTS"
ok "secret/$mirror (ns $NS_HOSTS, type $mtype): copy of $msource for $mhosts"
IFS='|' read -r sel ips_ds ips_sa img <<<"$(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.spec.nodeSelector.kubernetes\.io/os}|{.spec.template.spec.imagePullSecrets[0].name}|{.spec.template.spec.serviceAccountName}|{.spec.template.spec.containers[0].image}')"
[[ $sel == linux ]] || fail "DaemonSet pods lack nodeSelector kubernetes.io/os=linux"
[[ $ips_ds == regcred ]] || fail "DaemonSet pods lack imagePullSecrets regcred (chart value -> operator -> data plane)"
[[ $(jp sa -n "$NS_OP" "$DP" -o jsonpath='{.imagePullSecrets[0].name}') == regcred ]] || fail "ServiceAccount $DP lacks imagePullSecrets regcred"
[[ $ips_sa == "$DP" && $img == "$IMAGE_REPO:$app_version" ]] || fail "DaemonSet: serviceAccountName $ips_sa image $img"
ok "pod template: serviceAccountName $DP, image $img, nodeSelector kubernetes.io/os=linux, imagePullSecrets regcred (also on the ServiceAccount)"
IFS='|' read -r max_surge max_unavailable <<<"$(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.updateStrategy.rollingUpdate.maxSurge}|{.spec.updateStrategy.rollingUpdate.maxUnavailable}')"
[[ $max_surge == 10% && $max_unavailable == 0 ]] || fail "DaemonSet maxSurge '$max_surge' maxUnavailable '$max_unavailable', want the defaults 10% and 0"
ok "rolling update maxSurge $max_surge, maxUnavailable $max_unavailable"

# =============================================================================================
step "the data plane runs on both nodes with its own ServiceAccount's token"
wait_ok 90 "DaemonSet $DP: 2 of 2 pods Ready" ds_rolled_out "$DP"
declare -A DP_PID
while read -r pod uid restarts node; do
    pid=$(pod_pid "$NS_OP" "$pod" h3-ingress)
    DP_PID[$pod]=$pid
    [[ $(readlink -f "/proc/$pid/exe") == $(readlink -f "$(pod_exe)") && $(ip netns identify "$pid") == "$node" ]] ||
        fail "$pod: pid $pid runs $(readlink -f "/proc/$pid/exe") in netns $(ip netns identify "$pid"), want $H3I_BINARY in $node"
    who=$(KUBECONFIG=$(pod_kubeconfig "$NS_OP" "$pod" "$pid" "$tmp/$pod.kubeconfig") kubectl auth whoami -o jsonpath='{.status.userInfo.username} {.status.userInfo.extra.authentication\.kubernetes\.io/pod-name[0]}')
    [[ $who == "system:serviceaccount:$NS_OP:$DP $pod" ]] || fail "$pod's token is '$who', want system:serviceaccount:$NS_OP:$DP bound to $pod"
    ok "$pod on $node: pid $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -d' ' -f2-)), token of $who"
done < <(pods_state)
[[ ${#DP_PID[@]} -eq 2 ]] || fail "want 2 data plane pods, have ${#DP_PID[@]}"
early=$(kubectl get events -A --field-selector "involvedObject.kind=Http3Listener,involvedObject.uid=$LISTENER_UID" \
    -o jsonpath='{range .items[*]}{.type} {.reason}: {.message}{"\n"}{end}')
indent <<<"$early"
grep -q nodeSelector <<<"$early" && fail "an event blamed spec.nodeSelector while the DaemonSet was merely new"
ok "the listener's events so far do not send the user to spec.nodeSelector"

step "HTTP/3 to $HOST on each node address: aioquic and trixie curl (status, certificate, body, Alt-Svc)"
wait_ok 60 "$HOST answers over HTTP/3 on ${IPS[*]}" h3_all_nodes "$HOST" "$CERT_V1"
h3_both "$HOST" "$CERT_V1" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "HTTP/3 checks"

step "kubectl get h3l: the columns and the Ready condition"
h3l_ready() {
    [[ $(cond "$LISTENER" Ready status) == True && $(jp h3l "$LISTENER" -o jsonpath='{.status.hostsSummary} {.status.nodes.summary}') == "1/1 2/2" ]]
}
wait_ok 60 "h3l/$LISTENER Ready=True, hosts 1/1, pods 2/2" h3l_ready
kubectl get h3l | tee "$tmp/h3l.txt" | indent
header=$(head -1 "$tmp/h3l.txt" | tr -s ' ')
[[ $header == "NAME PORT HOSTS PODS READY UDP-DROPS AGE" ]] || fail "kubectl get h3l columns: '$header'"
row=$(grep "^$LISTENER " "$tmp/h3l.txt" | tr -s ' ' | cut -d' ' -f1-5)
[[ $row == "$LISTENER 443 1/1 2/2 True" ]] || fail "kubectl get h3l row: '$row'"
kubectl get h3l -o wide | indent
ok "Ready=$(cond "$LISTENER" Ready status) reason $(cond "$LISTENER" Ready reason): $(cond "$LISTENER" Ready message)"

step "kubectl h3-ingress status (the binary as the kubectl plugin kubectl-h3_ingress on PATH)"
mkdir -p "$tmp/plugin"
ln -sf "$H3I_BINARY" "$tmp/plugin/kubectl-h3_ingress"
export PATH=$tmp/plugin:$PATH
kubectl plugin list 2>/dev/null | grep -q kubectl-h3_ingress || fail "kubectl plugin list does not find kubectl-h3_ingress"
kubectl h3-ingress status >"$tmp/status.txt" 2>&1 || fail "kubectl h3-ingress status: $(cat "$tmp/status.txt")"
indent <"$tmp/status.txt"
grep -E "^ *$HOST +Serving +Serving +yes " "$tmp/status.txt" >/dev/null ||
    fail "kubectl h3-ingress status does not show $HOST Serving with Alt-Svc advertised (nginx sends $ALT_SVC)"
record=$(grep -F "$HOST. " "$tmp/status.txt" | grep -F 'IN HTTPS 1 . alpn="h3,h2"') ||
    fail "kubectl h3-ingress status lacks the DNS HTTPS record of $HOST"
ok "$HOST Serving (read from a pod's /hosts through the API server), Alt-Svc advertised, DNS HTTPS record:$record"
[[ -z $(jp h3l "$LISTENER" -o jsonpath='{.status.hosts}') ]] ||
    fail "the status lists hosts although every host is served: $(jp h3l "$LISTENER" -o jsonpath='{.status.hosts}')"
ok "status: $(jp h3l "$LISTENER" -o jsonpath='{.status.hostCounts}') (served hosts are counted, not listed)"

step "admin endpoints on IPv6: the data plane on [node]:9476, the operator on its pod's IPv6 address"
for i in 0 1; do
    code=$(curl -sS -g -o /dev/null -w '%{http_code}' "http://[${IPS6[$i]}]:9476/healthz") || true
    [[ $code == 200 ]] || fail "data plane /healthz on [${IPS6[$i]}]:9476: $code"
    ok "http://[${IPS6[$i]}]:9476/healthz -> 200 (and /readyz $(curl -s -g -o /dev/null -w '%{http_code}' "http://[${IPS6[$i]}]:9476/readyz"))"
done
for m in h3_ingress_config_reloads_total h3_ingress_rejected_requests_total h3_ingress_upstream_errors_total; do
    python3 "$JPY" metric --url "http://[${IPS6[0]}]:9476/metrics" --name "$m" >/dev/null || fail "the dashboard's $m is absent from a real scrape"
done
ok "a scrape of [${IPS6[0]}]:9476/metrics has the dashboard's config_reloads_total, rejected_requests_total and upstream_errors_total series (known label values start at 0)"
op_ip6=$(jp pod -n "$NS_OP" "$OP_POD" -o jsonpath='{.status.podIPs[1].ip}')
[[ $op_ip6 == *:* ]] || fail "operator pod has no IPv6 address: $(jp pod -n "$NS_OP" "$OP_POD" -o jsonpath='{.status.podIPs}')"
code=$(curl -sS -g -o /dev/null -w '%{http_code}' "http://[$op_ip6]:9477/healthz") || true
[[ $code == 200 ]] || fail "operator /healthz on [$op_ip6]:9477: $code"
ok "operator http://[$op_ip6]:9477/healthz -> 200"

# =============================================================================================
step "60 s of steady HTTP/3 traffic: at most a handful of reconciles and status writes"
rec0=$(operator_metric h3_ingress_operator_reconciles_total) || fail "no h3_ingress_operator_reconciles_total"
wr0=$(operator_metric h3_ingress_operator_status_writes_total) || fail "no h3_ingress_operator_status_writes_total"
python3 "$JPY" load --seconds 60 --cacert "$tmp/pki/ca.crt" --path /whoami \
    --target "${IPS[0]},$HOST" --target "${IPS[1]},$HOST" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "steady traffic"
rec1=$(operator_metric h3_ingress_operator_reconciles_total)
wr1=$(operator_metric h3_ingress_operator_status_writes_total)
info "operator reconciles_total $rec0 -> $rec1, status_writes_total $wr0 -> $wr1"
(( rec1 - rec0 <= 5 && wr1 - wr0 <= 2 )) ||
    fail "under steady traffic the operator reconciled $((rec1 - rec0)) times and wrote the status $((wr1 - wr0)) times in 60 s (want <= 5 and <= 2)"
ok "$((rec1 - rec0)) reconciles and $((wr1 - wr0)) status writes in 60 s of traffic"
# By the header's name, not its position: columns come and go (PUBLIC-ROOT did).
requests=$(kubectl h3-ingress status "$LISTENER" |
    awk -v h="$HOST" '$1 == "HOST" { for (i = 1; i <= NF; i++) if ($i == "H3-REQUESTS") c = i } c && $1 == h { print $c }')
[[ $requests =~ ^[0-9]+$ && $requests -gt 0 ]] || fail "kubectl h3-ingress status shows no h3 requests for $HOST: '$requests'"
ok "h3 requests for $HOST on the pod kubectl h3-ingress status read: $requests"

# =============================================================================================
step "rotate the Secret (and nginx's certificate, as the TCP ingress would): new connections get it, no pod restarts"
before=$(pods_state)
nginx_use_cert "$HOST" "$HOST.v2"
tls_secret "$NS_APP" shop-tls "$HOST.v2"
wait_ok 60 "new connections on both nodes get certificate ${CERT_V2:0:12}" h3_all_nodes "$HOST" "$CERT_V2"
h3_both "$HOST" "$CERT_V2" | indent
[[ ${PIPESTATUS[0]} -eq 0 ]] || fail "HTTP/3 checks after the rotation"
after=$(pods_state)
[[ $before == "$after" ]] || fail "data plane pods changed during the rotation:\n$before\n->\n$after"
for pod in "${!DP_PID[@]}"; do
    kill -0 "${DP_PID[$pod]}" 2>/dev/null || fail "$pod's process ${DP_PID[$pod]} is gone"
done
ok "same pods, UIDs, restartCounts and processes: $(awk '{printf "%s uid %.8s restarts %s; ", $1, $2, $3}' <<<"$after")"

step "remove the annotation: the host stops being served"
kubectl -n "$NS_APP" annotate ingress shop h3-ingress.dev/enabled- >/dev/null
wait_ok 60 "handshakes for SNI $HOST refused with a TLS alert on ${IPS[*]}" refused_all_nodes "$HOST" tls_alert
for ip in "${IPS[@]}"; do python3 "$JPY" refused --addr "$ip" --host "$HOST" --cacert "$tmp/pki/ca.crt" | indent; done
not_listed() { ! kubectl h3-ingress status 2>&1 | grep -qE "^ *$HOST +Serving" && [[ $(jp h3l "$LISTENER" -o jsonpath='{.status.hostsSummary}') == 0/0 ]]; }
wait_ok 30 "$HOST no longer Serving in kubectl h3-ingress status (hosts 0/0)" not_listed
kubectl get h3l "$LISTENER" | indent
kubectl -n "$NS_APP" annotate ingress shop h3-ingress.dev/enabled=true >/dev/null
wait_ok 60 "annotated again: $HOST served again on both nodes" h3_all_nodes "$HOST" "$CERT_V2"
wait_ok 15 "h3l/$LISTENER hosts 1/1, Ready True again" h3l_ready

# =============================================================================================
step "change a socket setting (socket.receiveBufferBytes 4 MiB -> 2 MiB): the DaemonSet rolls"
before=$(pods_state)
hash0=$(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.metadata.annotations.h3-ingress\.dev/socket-hash}')
rev0=$(ds_pods -o jsonpath='{.items[0].metadata.labels.controller-revision-hash}')
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"socket":{"receiveBufferBytes":2097152}}}' >/dev/null
rolled() {
    local h
    h=$(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.metadata.annotations.h3-ingress\.dev/socket-hash}')
    [[ $h != "$hash0" ]] && ds_rolled_out "$DP" && [[ $(ds_pods -o name | wc -l) -eq 2 ]] &&
        ! ds_pods -o jsonpath='{.items[*].metadata.labels.controller-revision-hash}' | grep -qw "$rev0"
}
wait_ok 120 "DaemonSet rolled: new socket-hash, both pods replaced and Ready" rolled
after=$(pods_state)
info "before: $(awk '{printf "%s(%.8s) ", $1, $2}' <<<"$before")"
info "after:  $(awk '{printf "%s(%.8s) ", $1, $2}' <<<"$after")"
for uid in $(awk '{print $2}' <<<"$before"); do
    grep -q "$uid" <<<"$after" && fail "pod uid $uid survived the roll"
done
ok "socket-hash $hash0 -> $(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.metadata.annotations.h3-ingress\.dev/socket-hash}'), revision $rev0 -> $(ds_pods -o jsonpath='{.items[0].metadata.labels.controller-revision-hash}')"
for ip in "${IPS[@]}"; do
    req=$(python3 "$JPY" metric --url "http://$ip:9476/metrics" --name h3_ingress_udp_socket_receive_buffer_requested_bytes --label family=ipv4) ||
        fail "no h3_ingress_udp_socket_receive_buffer_requested_bytes on $ip"
    [[ $req == 2097152 ]] || fail "$ip: receive buffer requested $req, want 2097152"
done
ok "both new pods request a 2 MiB receive buffer (h3_ingress_udp_socket_receive_buffer_requested_bytes)"
wait_ok 60 "$HOST served on both nodes by the new pods" h3_all_nodes "$HOST" "$CERT_V2"

# =============================================================================================
step "a second listener on the same nodes and UDP port, then one on the same metrics port, get the PortConflict reason"
apply_listener "$LISTENER-twin" 443 9476 | indent
conflict() { [[ $(cond "$LISTENER-twin" Ready reason) == PortConflict ]]; }
wait_ok 30 "h3l/$LISTENER-twin Ready=False reason PortConflict" conflict
[[ $(cond "$LISTENER-twin" Ready status) == False ]] || fail "$LISTENER-twin Ready should be False"
ok "message: $(cond "$LISTENER-twin" Ready message)"
[[ -z $(jp ds -n "$NS_OP" "$DP-twin" -o name) ]] || fail "the conflicting listener's DaemonSet was applied"
kubectl delete h3l "$LISTENER-twin" >/dev/null
# Another UDP port but the same metrics port: the clash is on the TCP hostPort alone.
apply_listener "$LISTENER-twin2" 8443 9476 | indent
metrics_conflict() { [[ $(cond "$LISTENER-twin2" Ready reason) == PortConflict && $(cond "$LISTENER-twin2" Ready message) == *"TCP port 9476 (spec.metrics.address)"* ]]; }
wait_ok 30 "h3l/$LISTENER-twin2 (UDP 8443, metrics 9476) Ready=False reason PortConflict on TCP 9476" metrics_conflict
[[ -z $(jp ds -n "$NS_OP" "$DP-twin2" -o name) ]] || fail "the conflicting listener's DaemonSet was applied"
ok "message: $(cond "$LISTENER-twin2" Ready message | cut -c1-120)..; no DaemonSet for it"
[[ $(cond "$LISTENER" Ready status) == True ]] || fail "the first listener lost Ready=True to the conflicts"
ok "$LISTENER stays Ready=True"
kubectl delete h3l "$LISTENER-twin2" >/dev/null

# =============================================================================================
step "leader hand-over: a second operator replica takes the Lease when the leader hangs, and when it is deleted"
# Also pins the init container's image (checked on the Pod Security step's listener).
helm upgrade "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --reuse-values --set operator.replicas=2 \
    --set dataPlane.tuneImage="$TUNE_IMAGE" \
    --wait --timeout 120s >"$tmp/helm-upgrade.log" 2>&1 || fail "helm upgrade: $(cat "$tmp/helm-upgrade.log")"
ok "helm upgrade --set operator.replicas=2 --set dataPlane.tuneImage=${TUNE_IMAGE%@*}@...: $(jp deploy -n "$NS_OP" "$RELEASE-operator" -o jsonpath='{.status.readyReplicas}') replicas ready"
# The upgrade replaced the replicas: the old leader released the Lease on SIGTERM.
wait_ok 30 "a running replica of the new ReplicaSet holds the Lease" leader_running
leader=$(operator_leader_pod)
pid=$(pod_pid "$NS_OP" "$leader" operator)
info "leader $leader (pid $pid); freezing it with SIGSTOP (a hung or partitioned leader does not release the Lease)"
kill -STOP "$pid"
t0=$(date +%s)
new_leader() { local l; l=$(operator_leader_pod) && [[ -n $l && $l != "$leader" ]]; }
until_ok 45 "another replica takes the Lease from the frozen $leader" new_leader
NEW_LEADER=$(operator_leader_pod)
ok "Lease taken by $NEW_LEADER $(($(date +%s) - t0))s after the freeze (leaseDurationSeconds $(jp lease -n "$NS_OP" h3-ingress-operator -o jsonpath='{.spec.leaseDurationSeconds}'))"
kubectl -n "$NS_OP" delete pod "$leader" --wait=false >/dev/null
kill -CONT "$pid" 2>/dev/null || true
until_ok 30 "the new leader exports h3_ingress_operator_leader 1" eval '[[ $(operator_metric h3_ingress_operator_leader) == 1 ]]'
ok "the frozen pod deleted; $NEW_LEADER reports h3_ingress_operator_leader 1"
wait_ok 60 "operator Deployment back to 2 ready replicas" eval '[[ $(jp deploy -n "$NS_OP" "$RELEASE-operator" -o jsonpath="{.status.readyReplicas}") == 2 ]]'
# The everyday hand-over (rollout, drain, kubectl delete): the leader gets SIGTERM and gives
# the Lease up, so the standby takes it within its retry period, not after the lease expires.
wait_ok 30 "both replicas running, one holding the Lease" leader_running
leader=$(operator_leader_pod)
t0=$(date +%s)
kubectl -n "$NS_OP" delete pod "$leader" --wait=false >/dev/null
handed() { local l; l=$(operator_leader_pod) && [[ $l != "$leader" ]] && leader_running; }
until_ok 8 "the standby takes the Lease that the deleted $leader released (before it could expire)" handed
NEW_LEADER=$(operator_leader_pod)
ok "leader $leader deleted (SIGTERM): $NEW_LEADER holds the Lease $(($(date +%s) - t0))s later"

step "the optional Service (spec.service), applied by the new leader: a 403 becomes Ready=False Forbidden; LoadBalancer, then NodePort"
# The operator's Role loses create/patch on Services (as a cluster admin trimming RBAC
# would): the listener says why in its status and a Warning event, the data plane serves on.
rules0=$(jp role -n "$NS_OP" "$OP_ROLE" -o jsonpath='{.rules}')
rules_ro=$(python3 -c '
import json, sys
rules = json.loads(sys.argv[1])
for r in rules:
    if "services" in r["resources"]:
        r["verbs"] = [v for v in r["verbs"] if v not in ("create", "patch")]
print(json.dumps(rules))' "$rules0")
kubectl -n "$NS_OP" patch role "$OP_ROLE" --type merge -p "{\"rules\":$rules_ro}" >/dev/null
wait_ok 10 "the operator may no longer create Services" eval '[[ $(can create services -n "$NS_OP" --as "$OP_USER") == no ]]'
kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"service":{"type":"LoadBalancer","includeTcp":true,"annotations":{"metallb.universe.tf/allow-shared-ip":"h3i-journey"}}}}' >/dev/null
forbidden() { [[ $(cond "$LISTENER" Ready status) == False && $(cond "$LISTENER" Ready reason) == Forbidden ]]; }
wait_ok 30 "h3l/$LISTENER Ready=False reason Forbidden" forbidden
msg=$(cond "$LISTENER" Ready message)
grep -q services <<<"$msg" || fail "the Forbidden message should name the Service: $msg"
ok "message: ${msg:0:220}"
forbidden_event() {
    kubectl get events -A --field-selector "involvedObject.kind=Http3Listener,involvedObject.uid=$LISTENER_UID,type=Warning,reason=Forbidden" \
        -o jsonpath='{range .items[*]}{.type} {.reason}: {.message}{"\n"}{end}' | grep .
}
wait_ok 30 "a Warning event Forbidden on the listener" forbidden_event
h3_all_nodes "$HOST" "$CERT_V2" || fail "the data plane stopped serving $HOST while the Service was forbidden"
ok "$HOST still served on both nodes"
kubectl -n "$NS_OP" patch role "$OP_ROLE" --type merge -p "{\"rules\":$rules0}" >/dev/null
# Retried on the operator's error schedule (15 s).
wait_ok 45 "Role restored: Service $NS_OP/$DP created" kubectl -n "$NS_OP" get svc "$DP"
owned_by_listener svc "$DP" "$NS_OP"
svc=$(jp svc -n "$NS_OP" "$DP" -o jsonpath='{.spec.type} {.spec.externalTrafficPolicy} {.metadata.annotations.metallb\.universe\.tf/allow-shared-ip} {range .spec.ports[*]}{.protocol}/{.port} {end}')
info "$svc"
[[ $svc == "LoadBalancer Local h3i-journey "*"UDP/443"* && $svc == *"TCP/443"* ]] ||
    fail "Service: '$svc', want LoadBalancer, externalTrafficPolicy Local, the allow-shared-ip annotation, UDP and TCP 443"
ok "mixed-protocol LoadBalancer Service (UDP and TCP 443), externalTrafficPolicy Local, annotation passed through, owned by the listener"
wait_ok 30 "h3l/$LISTENER Ready=True again" h3l_ready
kubectl patch h3l "$LISTENER" --type json -p '[{"op":"replace","path":"/spec/service","value":{"type":"NodePort"}}]' >/dev/null
nodeport() { [[ $(jp svc -n "$NS_OP" "$DP" -o jsonpath='{.spec.type}') == NodePort ]]; }
wait_ok 30 "Service $NS_OP/$DP changed to NodePort" nodeport
svc=$(jp svc -n "$NS_OP" "$DP" -o jsonpath='{.spec.type} {.spec.externalTrafficPolicy} {range .spec.ports[*]}{.protocol}/{.port}->{.nodePort} {end}')
info "$svc"
[[ $svc == "NodePort Local UDP/443->"[0-9]* && $svc != *TCP* ]] || fail "Service: '$svc', want NodePort, externalTrafficPolicy Local, UDP 443 only"
sel=$(jp svc -n "$NS_OP" "$DP" -o jsonpath='{.spec.selector}')
if pods_real; then
    ok "NodePort Service with UDP 443 and externalTrafficPolicy Local, selector $sel (HTTP/3 through it via kube-proxy: tests/cluster/node-checks.sh)"
else
    ok "NodePort Service with UDP 443 and externalTrafficPolicy Local, selector $sel (only the objects are checked: the node agent runs no kube-proxy)"
fi
[[ $(cond "$LISTENER" Ready status) == True ]] || fail "h3l/$LISTENER not Ready after the change to NodePort: $(cond "$LISTENER" Ready reason)"
kubectl patch h3l "$LISTENER" --type json -p '[{"op":"remove","path":"/spec/service"}]' >/dev/null
wait_ok 30 "spec.service removed: Service $DP pruned" eval '! kubectl -n "$NS_OP" get svc "$DP"'

# =============================================================================================
step "an invalid listener is rejected by the API server with the CEL rule's message"
if out=$(kubectl apply -f - 2>&1 <<EOF
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: journey-invalid}
spec:
  upstream: {address: "127.0.0.1:443", tls: false, verify: system}
EOF
); then
    kubectl delete h3l journey-invalid --ignore-not-found >/dev/null
    fail "the API server accepted upstream.tls=false with verify=system: $out"
fi
grep -q 'upstream.verify needs upstream.tls: true' <<<"$out" || fail "unexpected rejection: $out"
info "$out"
ok "rejected with the rule's message"

# =============================================================================================
step "kube-apiserver restart: the data plane keeps serving during the outage and catches up afterwards"
"$CLUSTER" restart-apiserver 5 >"$tmp/restart.log" 2>&1 &
restart_pid=$!
t0=$(date +%s)
until_ok 30 "kube-apiserver down" eval '! kubectl get --raw /readyz --request-timeout=1s'
ok "kube-apiserver is down ($(($(date +%s) - t0))s)"
for ip in "${IPS[@]}"; do
    python3 "$JPY" h3 --addr "$ip" --host "$HOST" --cacert "$tmp/pki/ca.crt" --path /1m.bin \
        --cert-sha "$CERT_V2" --body-sha "$BODY_SHA" --alt-svc "$ALT_SVC" | indent
    [[ ${PIPESTATUS[0]} -eq 0 ]] || fail "HTTP/3 on $ip while the API server is down"
done
kubectl get --raw /readyz --request-timeout=1s >/dev/null 2>&1 && fail "the API server came back before the checks ended: not proven during the outage"
ok "both nodes served $HOST while the API server was still down"
wait "$restart_pid" || fail "restart-apiserver: $(cat "$tmp/restart.log")"
indent <"$tmp/restart.log"
ok "kube-apiserver back after $(($(date +%s) - t0))s"
info "after the restart: a second Ingress for $HOST2 with its own Secret and no ingressClassName,"
info "then IngressClass nginx marked default (the DefaultIngressClass admission plugin fills in the"
info "class only for Ingresses created after that, so this one relies on our default-class rule)"
tls_secret "$NS_APP" shop2-tls "$HOST2"
ingress_yaml shop2 "" "$HOST2" | kubectl apply -f - >/dev/null
[[ -z $(jp ingress -n "$NS_APP" shop2 -o jsonpath='{.spec.ingressClassName}') ]] || fail "ingress shop2 got a class at creation"
kubectl annotate ingressclass nginx ingressclass.kubernetes.io/is-default-class=true >/dev/null
# Watches back off (up to 30 s, as client-go's reflectors do) while the API server is away,
# and the data plane serves the new host once the operator has written its certificate mirror.
wait_ok 90 "$HOST2 served on both nodes (the data plane's watches and the operator caught up)" h3_all_nodes "$HOST2" "$CERT_HOST2"
python3 "$JPY" h3 --addr "${IPS[0]}" --host "$HOST2" --cacert "$tmp/pki/ca.crt" --path /1m.bin \
    --cert-sha "$CERT_HOST2" --body-sha "$BODY_SHA" --alt-svc "$ALT_SVC" | indent
wait_ok 30 "h3l/$LISTENER hosts 2/2, Ready True" eval '[[ $(jp h3l "$LISTENER" -o jsonpath="{.status.hostsSummary}") == 2/2 && $(cond "$LISTENER" Ready status) == True ]]'
for pod in $(ds_pods -o jsonpath='{.items[*].metadata.name}'); do
    [[ $(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}') == 0 ]] ||
        fail "$pod restarted during the API server outage"
done
ok "no data plane restarts"

# =============================================================================================
step "RBAC as the API server judges it (kubectl auth can-i --as)"
expect_can() { # WANT DESCRIPTION ARGS...
    local want=$1 what=$2 got; shift 2
    got=$(can "$@")
    [[ $got == "$want" ]] || fail "$what: kubectl auth can-i $* -> '$got', want '$want'"
    ok "$what: $got"
}
expect_can no "data plane reads its host's Secret in the application namespace" get secret/shop-tls -n "$NS_APP" --as "$DP_USER"
expect_can no "data plane lists Secrets in the application namespace" list secrets -n "$NS_APP" --as "$DP_USER"
expect_can yes "data plane lists the certificate mirrors" list secrets -n "$NS_HOSTS" --as "$DP_USER"
expect_can no "data plane reads Secrets in its own namespace (pull secrets, Helm's)" get secrets -n "$NS_OP" --as "$DP_USER"
expect_can no "data plane reads Secrets in kube-system" get secrets -n kube-system --as "$DP_USER"
expect_can no "data plane reads Ingresses" list ingresses.networking.k8s.io -A --as "$DP_USER"
expect_can no "data plane writes a mirror" patch secrets -n "$NS_HOSTS" --as "$DP_USER"
expect_can no "data plane writes its listener" patch http3listeners.h3-ingress.dev/"$LISTENER" --as "$DP_USER"
expect_can no "operator binds clusterroles" bind clusterroles --as "$OP_USER"
expect_can no "operator binds roles" bind roles -n "$NS_APP" --as "$OP_USER"
expect_can no "operator escalates clusterroles" escalate clusterroles --as "$OP_USER"
expect_can no "operator escalates roles" escalate roles -n "$NS_APP" --as "$OP_USER"
expect_can no "operator creates DaemonSets outside its namespace" create daemonsets -n "$NS_APP" --as "$OP_USER"
expect_can yes "operator creates DaemonSets in its namespace" create daemonsets -n "$NS_OP" --as "$OP_USER"
if out=$(kubectl create clusterrolebinding h3i-journey-escalate --clusterrole=cluster-admin \
    --serviceaccount="$NS_OP:$OP_SA" --as "$OP_USER" 2>&1); then
    kubectl delete clusterrolebinding h3i-journey-escalate >/dev/null
    fail "the operator could bind itself to cluster-admin"
fi
grep -q 'forbidden' <<<"$out" || fail "binding cluster-admin as the operator failed oddly: $out"
ok "the operator cannot bind itself cluster-admin: $(grep -o 'forbidden: [^(]*' <<<"$out" | head -1)"

# =============================================================================================
step "delete the listener (operator stopped): the garbage collector removes everything it owned"
unset DP_PID
declare -A DP_PID
while read -r pod _; do DP_PID[$pod]=$(pod_pid "$NS_OP" "$pod" h3-ingress); done < <(pods_state)
# With the operator scaled to 0 nothing but the garbage collector can remove them.
kubectl -n "$NS_OP" scale deploy "$RELEASE-operator" --replicas=0 >/dev/null
wait_ok 60 "operator scaled to 0 (no operator pod left)" eval '[[ -z $(kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator -o name) ]]'
kubectl delete h3l "$LISTENER" --wait=false >/dev/null
# By name (a label selector would pass on objects that lost their labels), then by label.
owned_gone() {
    local o
    for o in "ds/$DP" "sa/$DP" "svc/$DP"; do kubectl -n "$NS_OP" get "$o" >/dev/null 2>&1 && return 1; done
    for o in "role/$DP_RBAC" "rolebinding/$DP_RBAC"; do kubectl -n "$NS_HOSTS" get "$o" >/dev/null 2>&1 && return 1; done
    for o in "clusterrole/$DP_CLUSTER_RBAC" "clusterrolebinding/$DP_CLUSTER_RBAC"; do kubectl get "$o" >/dev/null 2>&1 && return 1; done
    [[ -z $(kubectl get ds,sa,svc,pods -n "$NS_OP" -l "app.kubernetes.io/instance=$LISTENER" -o name) &&
        -z $(kubectl get role,rolebinding,secrets -n "$NS_HOSTS" -l "app.kubernetes.io/instance=$LISTENER" -o name) &&
        -z $(kubectl get clusterrole,clusterrolebinding -l "app.kubernetes.io/instance=$LISTENER" -o name) ]]
}
wait_ok 90 "DaemonSet, pods, ServiceAccount, ClusterRole(Binding), Role(Binding), certificate mirrors gone" owned_gone
for pod in "${!DP_PID[@]}"; do
    kill -0 "${DP_PID[$pod]}" 2>/dev/null && fail "$pod's process ${DP_PID[$pod]} still runs"
done
wait_ok 15 "UDP 443 no longer answers on ${IPS[*]}" refused_all_nodes "$HOST" silent
ok "processes ${DP_PID[*]} stopped"
kubectl -n "$NS_OP" scale deploy "$RELEASE-operator" --replicas=1 >/dev/null
wait_ok 60 "operator back (a running replica holds the Lease)" leader_running

# =============================================================================================
step "Pod Security admission: the operator's namespace labelled 'restricted' -> Ready=False with a reason and a Warning event"
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=restricted --overwrite >/dev/null 2>&1 ||
    fail "cannot label $NS_OP restricted"
apply_listener "$LISTENER-restricted" 443 9476 '  tuneNodeBufferLimits: true' | indent
not_created() { [[ $(cond "$LISTENER-restricted" Ready status) == False && $(cond "$LISTENER-restricted" Ready reason) == PodsNotCreated ]]; }
wait_ok 60 "h3l/$LISTENER-restricted Ready=False reason PodsNotCreated" not_created
ok "message: $(cond "$LISTENER-restricted" Ready message)"
init_image=$(jp ds -n "$NS_OP" "$DP-restricted" -o jsonpath='{.spec.template.spec.initContainers[0].image}')
[[ $init_image == "$TUNE_IMAGE" ]] || fail "init container image '$init_image', want the chart's dataPlane.tuneImage $TUNE_IMAGE"
ok "tuneNodeBufferLimits: the privileged init container runs the chart's pinned dataPlane.tuneImage ${TUNE_IMAGE:0:60}.."
warning() {
    kubectl get events -A --field-selector "involvedObject.kind=Http3Listener,involvedObject.uid=$(listener_uid "$LISTENER-restricted"),type=Warning,reason=PodsNotCreated" \
        -o jsonpath='{range .items[*]}{.type} {.reason}: {.message}{"\n"}{end}' | grep .
}
wait_ok 30 "a Warning event PodsNotCreated on the listener" warning
warning | head -1 | cut -c1-200 | indent
kubectl delete h3l "$LISTENER-restricted" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged --overwrite >/dev/null

step_table
echo "JOURNEY PASSED in $(($(date +%s) - T_START))s"
