#!/usr/bin/env bash
# Architectures on real nodes (root, H3I_NODES=real): the image in the cluster's registry is an
# index of linux/amd64 and linux/arm64 (scripts/image.sh of both static binaries), and
#   1. with the chart's defaults both (amd64) nodes run the data plane from the amd64 manifest
#      of the index: each pod's imageID is the index digest, and each node's containerd holds
#      the image under the amd64 config's ID (the CRI image ID), not the arm64 one's; the
#      container's process is the amd64 binary of the layer;
#   2. with the data plane narrowed to arm64 (`--architectures=arm64`, what
#      image.architectures passes), the DaemonSet runs no pod on the amd64 nodes and the
#      listener's Ready says why: no node is of architecture arm64; a spec.nodeSelector for
#      amd64 is refused then with InvalidSpec naming the field;
#   3. image.architectures=[arm64] keeps the operator's own new pod off the amd64 nodes
#      (FailedScheduling: node affinity), while the running one stays;
#   4. back to the defaults, both nodes run the data plane again.
# The kubelet sets kubernetes.io/arch from its own GOARCH, so no node can be relabelled arm64:
# the selectors are proven by a list that matches no node.
#
#   tests/cluster/arch.sh       brings the cluster up if needed and leaves it up; its objects
#                               are removed on exit unless H3I_ARCH_KEEP=1
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
NS_OP=h3i-arch
RELEASE=h3-ingress
LISTENER=arch
HOST=arch.h3i.test
DP=h3-ingress-$LISTENER
IMAGE_REPO=registry.h3i.test/h3-ingress
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
fail_listeners() { kubectl get h3l -o wide; kubectl get h3l -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions}{"\n"}{end}'; }
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nARCH FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root ARCH
tmp=$(mktemp -d /tmp/h3i-arch.XXXXXX)
trap 'remove_objects H3I_ARCH_KEEP "$LISTENER" "namespace/$NS_OP" "$NS_OP" "$NS_OP-hosts"' EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

# layout FIELD ARCH: from the image the cluster pushed ($H3I_CLUSTER_STATE/image/oci): the index
# digest, or an architecture's manifest or config digest.
layout() {
    python3 - "$H3I_CLUSTER_STATE/image/oci" "$@" <<'PY'
import json, sys
layout, field, arch = sys.argv[1], sys.argv[2], (sys.argv[3:] or [""])[0]
blob = lambda d: json.load(open(f"{layout}/blobs/{d.replace(':', '/')}"))
top = json.load(open(f"{layout}/index.json"))["manifests"][0]
if field == "index":
    print(top["digest"])
elif field == "platforms":
    print(" ".join(m["platform"]["architecture"] for m in blob(top["digest"])["manifests"]))
else:
    for m in blob(top["digest"])["manifests"]:
        if m["platform"]["architecture"] == arch:
            print(m["digest"] if field == "manifest" else blob(m["digest"])["config"]["digest"])
PY
}
node_ctr() { # NODE ARGS...: the node's containerd, CRI's namespace
    "$("$REPO/scripts/nodes-build.sh" bin)/ctr" --address "$H3I_CLUSTER_STATE/nodes/$1/containerd/containerd.sock" \
        -n k8s.io "${@:2}" 2>/dev/null
}
ds_status() { jp ds -n "$NS_OP" "$DP" -o jsonpath='{.status.desiredNumberScheduled} {.status.numberReady} {.status.currentNumberScheduled}'; }
ds_is() { [[ $(ds_status) == "$1" ]]; }                  # "DESIRED READY CURRENT"
ready_has() { [[ $(ready_cond "$1") == *"$2"* ]]; }      # FIELD TEXT
nonempty() { [[ -n $("$@") ]]; }
ready_cond() { jp h3l "$LISTENER" -o jsonpath="{.status.conditions[?(@.type==\"Ready\")].$1}"; }
dp_pods() { kubectl -n "$NS_OP" get pods -l "app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane" "$@"; }
operator_ready() { [[ $(jp deploy -n "$NS_OP" "$RELEASE-operator" -o jsonpath='{.status.updatedReplicas}/{.status.readyReplicas}/{.status.replicas}') == 1/1/1 ]]; }
helm_upgrade() { # VALUES...: helm upgrade with the install's values and these
    helm upgrade "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --reuse-values "$@" >"$tmp/helm.log" 2>&1 ||
        fail "helm upgrade $*: $(cat "$tmp/helm.log")"
}

# ---- 1. defaults: the amd64 manifest of the index on both nodes --------------------------------
cluster_up
pods_real || fail "tests/cluster/arch.sh needs real nodes (H3I_NODES=real scripts/cluster.sh up)"
remove_leftovers "removing a previous run's objects" "$NS_OP" "$NS_OP-hosts"
INDEX=$(layout index)
read -r -a PLATFORMS <<<"$(layout platforms)"
[[ ${PLATFORMS[*]} == "amd64 arm64" ]] ||
    fail "the registry's image index has ${PLATFORMS[*]}, want amd64 arm64 (scripts/build-static.sh --arch arm64, then scripts/cluster.sh up)"
AMD64_CONFIG=$(layout config amd64) ARM64_CONFIG=$(layout config arm64)
ok "image index $INDEX in $IMAGE_REPO: linux/amd64 manifest $(layout manifest amd64) (config $AMD64_CONFIG), linux/arm64 manifest $(layout manifest arm64) (config $ARM64_CONFIG)"
info "nodes: $(kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.labels.kubernetes\.io/arch} {end}')"

step "helm install (image $IMAGE_REPO, default image.architectures) and a listener with one host"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
secret_arg=$(pull_secret_args "$NS_OP")
helm install "$RELEASE" "$REPO/charts/h3-ingress" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    ${secret_arg:+"$secret_arg"} --wait --timeout 180s >"$tmp/helm.log" 2>&1 || fail "helm install: $(cat "$tmp/helm.log")"
aff=$(jp deploy -n "$NS_OP" "$RELEASE-operator" -o jsonpath='{.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]}')
ok "operator Ready; its pods require $aff"
make_ca h3i-arch-ca
leaf "$HOST"
tls_secret "$NS_OP" arch-tls "$HOST"
kubectl apply -f - >/dev/null <<EOF
apiVersion: h3-ingress.dev/v1alpha1
kind: Http3Listener
metadata: {name: $LISTENER}
spec:
  port: 8443
  upstream: {address: "127.0.0.1:443"}
  metrics: {address: "[::]:9486"}
  http: {drainTimeoutSeconds: 2}
  hosts: [{name: $HOST, secretRef: {namespace: $NS_OP, name: arch-tls}}]
EOF
wait_ok 180 "DaemonSet $DP: 2 of 2 pods ready" ds_is "2 2 2"
ds_aff=$(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]}')
ok "the data plane's pods require $ds_aff"

step "each pod runs the amd64 manifest of the index, pulled by its node's containerd"
for pod in $(dp_pods -o jsonpath='{.items[*].metadata.name}'); do
    read -r node image image_id <<<"$(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.spec.nodeName} {.status.containerStatuses[0].image} {.status.containerStatuses[0].imageID}')"
    arch=$(jp node "$node" -o jsonpath='{.metadata.labels.kubernetes\.io/arch}')
    [[ $image_id == "$IMAGE_REPO@$INDEX" ]] || fail "$pod on $node: imageID $image_id, want $IMAGE_REPO@$INDEX (the index)"
    ids=$(node_ctr "$node" images ls -q | grep -x 'sha256:[0-9a-f]*' || true)
    grep -qx "$AMD64_CONFIG" <<<"$ids" || fail "$node: containerd has no image with ID $AMD64_CONFIG (the amd64 config): $ids"
    ! grep -qx "$ARM64_CONFIG" <<<"$ids" || fail "$node: containerd resolved the arm64 config $ARM64_CONFIG"
    target=$(node_ctr "$node" images ls | awk -v n="$image" '$1 == n {print $2, $3, $5}')
    pid=$(pod_pid "$NS_OP" "$pod" h3-ingress)
    exe=$(file -b -L "/proc/$pid/exe" | cut -d, -f1-2)
    ok "$pod on $node (kubernetes.io/arch=$arch): imageID $image_id; containerd: $image -> $target, CRI image ID $AMD64_CONFIG (amd64 config); pid $pid: $exe"
    info "$node ctr images ls (this image):"
    node_ctr "$node" images ls | awk -v i="$INDEX" 'NR == 1 || $3 == i' | indent
done

# ---- 2. the data plane narrowed to arm64: no pod, and the status says why ---------------------
step "the data plane narrowed to arm64 (operator --architectures=arm64): no pod on the amd64 nodes"
helm_upgrade --set 'operator.extraArgs={--architectures=arm64}' --wait --timeout 180s
ok "operator rolled with $(jp deploy -n "$NS_OP" "$RELEASE-operator" -o jsonpath='{.spec.template.spec.containers[0].args}')"
wait_ok 120 "DaemonSet $DP: desired 0, no pod" eval 'ds_is "0 0 0" && ! nonempty dp_pods -o name'
info "DaemonSet affinity: $(jp ds -n "$NS_OP" "$DP" -o jsonpath='{.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0]}')"
wait_ok 60 "the listener's Ready names the architecture" ready_has message "architecture arm64"
ok "Ready=$(ready_cond status) reason $(ready_cond reason): $(ready_cond message)"
kubectl get h3l "$LISTENER" | indent

kubectl patch h3l "$LISTENER" --type merge -p '{"spec":{"nodeSelector":{"kubernetes.io/arch":"amd64"}}}' >/dev/null
wait_ok 60 "a nodeSelector for amd64 is refused" ready_has reason InvalidSpec
ok "Ready=$(ready_cond status) reason $(ready_cond reason): $(ready_cond message)"
kubectl patch h3l "$LISTENER" --type json -p '[{"op":"remove","path":"/spec/nodeSelector"}]' >/dev/null

# ---- 3. the operator's own pods: image.architectures=[arm64] -----------------------------------
step "image.architectures=[arm64]: the operator's new pod is not scheduled on the amd64 nodes"
old_op=$(kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator -o jsonpath='{.items[0].metadata.name}')
helm_upgrade --set 'image.architectures={arm64}' --set 'operator.extraArgs=null'
pending() { kubectl -n "$NS_OP" get pods -l app.kubernetes.io/component=operator --field-selector=status.phase=Pending -o jsonpath='{.items[0].metadata.name}'; }
wait_ok 60 "a new operator pod, Pending" nonempty pending
new_op=$(pending)
why() { kubectl -n "$NS_OP" get events --field-selector "involvedObject.name=$new_op,reason=FailedScheduling" -o jsonpath='{.items[-1:].message}'; }
wait_ok 60 "FailedScheduling for $new_op" nonempty why
[[ $(why) == *"didn't match Pod's node affinity/selector"* ]] || fail "FailedScheduling of $new_op: $(why)"
ok "$new_op Pending: $(why)"
[[ $(jp pod -n "$NS_OP" "$old_op" -o jsonpath='{.status.phase}') == Running ]] || fail "the running operator $old_op went away"
ok "$old_op still Running (the rolling update waits for a pod that can be scheduled)"

# ---- 4. defaults again ------------------------------------------------------------------------------
step "back to the defaults: both nodes run the data plane again"
helm_upgrade --set 'image.architectures={amd64,arm64}' --wait --timeout 180s
wait_ok 60 "the operator rolled: one pod, Ready" operator_ready
wait_ok 180 "DaemonSet $DP: 2 of 2 pods ready" ds_is "2 2 2"
dp_pods -o wide | indent
for pod in $(dp_pods -o jsonpath='{.items[*].metadata.name}'); do
    [[ $(jp pod -n "$NS_OP" "$pod" -o jsonpath='{.status.containerStatuses[0].imageID}') == "$IMAGE_REPO@$INDEX" ]] ||
        fail "$pod: not the index $INDEX"
done
ok "both data plane pods Ready again from $IMAGE_REPO@$INDEX"
step_table
echo "ARCH PASSED"
