#!/usr/bin/env bash
# The proof that the cluster DNS of the real nodes works (CoreDNS, scripts/cluster-nodes.sh):
# from a pod on the pod network, from a hostNetwork pod with dnsPolicy ClusterFirstWithHostNet,
# and what a hostNetwork pod with the default dnsPolicy gets. Each client is a busybox pod that
# prints its /etc/resolv.conf and runs busybox nslookup, read back with `kubectl logs`:
# kubernetes.default.svc.cluster.local must resolve to the `kubernetes` Service's ClusterIP, a
# test Service (dual-stack) by its full and short name to its ClusterIPs (A and AAAA), over
# both DNS Service addresses (IPv4, IPv6); no MissingClusterDNS event since the cluster came
# up. Root; real nodes; leaves nothing behind. Run by tests/cluster/run.sh.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NS_CHECK=dns-check
T_START=$(date +%s)
tmp=""
fail() {
    printf '\nDNS CHECK FAILED: %s\n' "$*" >&2
    step_table >&2
    kubectl -n kube-system logs deploy/coredns --tail=20 >&2 2>&1 || true
    exit 1
}
# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
skip_unless_root "DNS CHECK"
finish() {
    local rc=$?
    kubectl delete namespace "$NS_CHECK" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    [[ -z $tmp ]] || rm -rf "$tmp"
    exit "$rc"
}
trap finish EXIT

eval "$("$REPO/scripts/cluster.sh" env)" || fail "the cluster is not up"
[[ ${H3I_NODE_MODE:-} == real ]] || fail "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
read -r -a NODES <<<"$H3I_NODES"
read -r -a DNS <<<"$H3I_CLUSTER_DNS"
tmp=$(mktemp -d)

step "CoreDNS: Deployment kube-system/coredns, Service kube-dns at ${DNS[*]}"
info "$(kubectl -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}/{.spec.replicas} Ready, image {.spec.template.spec.containers[0].image}; ')$(
    kubectl -n kube-system get svc kube-dns -o jsonpath='ClusterIPs {.spec.clusterIPs}')"
[[ $(kubectl -n kube-system get svc kube-dns -o jsonpath='{.spec.clusterIPs[*]}') == "${DNS[*]}" ]] ||
    fail "Service kube-dns does not have the ClusterIPs ${DNS[*]} the kubelets hand out"
kubectl -n kube-system get pods -l k8s-app=kube-dns -o wide | indent
KUBERNETES_IP=$(kubectl get svc kubernetes -o jsonpath='{.spec.clusterIP}')

step "namespace $NS_CHECK: Service probe (dual-stack, no pods) and three client pods"
kubectl create namespace "$NS_CHECK" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS_CHECK" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: probe}
spec:
  ipFamilyPolicy: PreferDualStack
  selector: {app: nothing}
  ports: [{port: 80}]
EOF
read -r -a PROBE <<<"$(kubectl -n "$NS_CHECK" get svc probe -o jsonpath='{.spec.clusterIPs[*]}')"
info "kubernetes: $KUBERNETES_IP; probe: ${PROBE[*]}"
# The lookups every client runs (busybox nslookup asks resolv.conf's first nameserver unless
# given one; `-type=aaaa` for the IPv6 address).
script="cat /etc/resolv.conf; echo ===
for q in kubernetes.default.svc.cluster.local probe.$NS_CHECK.svc.cluster.local probe; do
  echo \"=== \$q\"; busybox nslookup \$q || echo LOOKUP-FAILED; done
echo '=== aaaa'; busybox nslookup -type=aaaa probe.$NS_CHECK.svc.cluster.local || echo LOOKUP-FAILED
for s in ${DNS[*]}; do echo \"=== via \$s\"; busybox nslookup kubernetes.default.svc.cluster.local \$s || echo LOOKUP-FAILED; done"
client() { # NAME HOSTNETWORK DNSPOLICY SCRIPT
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: $NS_CHECK}
spec:
  restartPolicy: Never
  hostNetwork: $2
  dnsPolicy: $3
  nodeName: ${NODES[0]}
  containers:
  - name: c
    image: registry.h3i.test/busybox:1
    imagePullPolicy: IfNotPresent
    command: [/bin/sh, -c, $(python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$4")]
EOF
}
{
    client pod-net false ClusterFirst "$script"
    client host-net-cluster true ClusterFirstWithHostNet "$script"
    # Only its resolv.conf: a lookup would go to the machine's resolver from a node namespace.
    client host-net-default true ClusterFirst "cat /etc/resolv.conf"
} | kubectl apply -f - >/dev/null
for p in pod-net host-net-cluster host-net-default; do
    wait_ok 60 "pod $p Succeeded" bash -c "[[ \$(kubectl -n $NS_CHECK get pod $p -o jsonpath='{.status.phase}') == Succeeded ]]"
    kubectl -n "$NS_CHECK" logs "$p" >"$tmp/$p.log"
done

# answers LOG NAME: the addresses busybox nslookup printed for NAME's block of LOG.
answers() {
    awk -v q="=== $2" '$0 == q {on = 1; next} /^=== / {on = 0} on && /^Address: / && !/#53$/ && !/:53$/ {print $2}' "$1" |
        sort | tr '\n' ' ' | sed 's/ $//'
}
check_client() { # POD
    local log=$tmp/$1.log want4 want6 got s
    grep -q '^nameserver '"${DNS[0]}"'$' "$log" || fail "$1: resolv.conf has no nameserver ${DNS[0]}: $(cat "$log")"
    got=$(answers "$log" kubernetes.default.svc.cluster.local)
    [[ $got == "$KUBERNETES_IP" ]] || fail "$1: kubernetes.default.svc.cluster.local -> '$got', want $KUBERNETES_IP"
    # busybox nslookup asks for A and AAAA: every ClusterIP of the Service.
    want4=$(printf '%s\n' "${PROBE[@]}" | sort | tr '\n' ' ' | sed 's/ $//')
    for s in "probe.$NS_CHECK.svc.cluster.local" probe; do
        got=$(answers "$log" "$s")
        [[ $got == "$want4" ]] || fail "$1: $s -> '$got', want $want4"
    done
    if ((${#PROBE[@]} > 1)); then
        want6=${PROBE[1]}
        got=$(answers "$log" aaaa)
        [[ $got == "$want6" ]] || fail "$1: AAAA probe.$NS_CHECK.svc.cluster.local -> '$got', want $want6"
    fi
    for s in "${DNS[@]}"; do
        got=$(answers "$log" "via $s")
        [[ $got == "$KUBERNETES_IP" ]] || fail "$1: kubernetes.default.svc.cluster.local via $s -> '$got'"
    done
    ok "$1: kubernetes.default -> $KUBERNETES_IP; probe (full and short name) -> ${PROBE[*]}; via ${DNS[*]} alike"
    sed -n '1,/^===$/p' "$log" | grep -v '^===$' | indent
}

step "a pod on the pod network (dnsPolicy ClusterFirst)"
check_client pod-net
step "a hostNetwork pod with dnsPolicy ClusterFirstWithHostNet"
check_client host-net-cluster
step "a hostNetwork pod with the default dnsPolicy (ClusterFirst: for hostNetwork the node's resolv.conf)"
if grep -q "^nameserver ${DNS[0]}$" "$tmp/host-net-default.log"; then
    fail "host-net-default got the cluster DNS: $(cat "$tmp/host-net-default.log")"
fi
ok "host-net-default: the kubelet's resolvConf (the host's /etc/resolv.conf), no cluster DNS:"
indent <"$tmp/host-net-default.log"

step "no MissingClusterDNS event"
events=$(kubectl get events -A --field-selector reason=MissingClusterDNS -o name | wc -l)
[[ $events -eq 0 ]] || fail "$events MissingClusterDNS events"
ok "0 MissingClusterDNS events"

step_table
echo "DNS CHECK PASSED"
