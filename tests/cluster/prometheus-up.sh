#!/usr/bin/env bash
# A Prometheus Operator and a Prometheus on the test cluster's real nodes (scripts/cluster.sh up
# with H3I_NODES=real), set up as kube-prometheus-stack sets them up by default: the operator's
# CRDs, RBAC and Deployment from its Go module (the version tests/cluster/promop pins; read from
# GOMODCACHE at run time), and one Prometheus object that selects ServiceMonitors, PodMonitors,
# PrometheusRules and ScrapeConfigs in every namespace by the label `release: <release name>`
# (kube-prometheus-stack's `*SelectorNilUsesHelmValues: true`), with its RBAC. The images are
# scripts/promop-build.sh's, pushed to the instance's registry and pulled with a pull secret.
#
#   tests/cluster/prometheus-up.sh [up]   build (cached), install or update, wait until
#                                         Prometheus is ready; prints its URL on stdout
#   tests/cluster/prometheus-up.sh url    the URL of the running Prometheus
#   tests/cluster/prometheus-up.sh down [--no-wait]
#                                         delete the namespace, the cluster objects and CRDs
#                                         (and wait until they are gone, unless --no-wait)
#
# Environment: H3I_PROM_NAMESPACE (default monitoring), H3I_PROM_RELEASE (the release label the
# Prometheus selects, default kube-prometheus-stack), H3I_PROM_EVALUATION_INTERVAL (default 15s;
# kube-prometheus-stack leaves the operator's 30s), and the cluster's H3I_CLUSTER_* variables.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
NS=${H3I_PROM_NAMESPACE:-monitoring}
RELEASE=${H3I_PROM_RELEASE:-kube-prometheus-stack}
EVAL=${H3I_PROM_EVALUATION_INTERVAL:-15s}
PROM=$RELEASE-prometheus # kube-prometheus-stack's name for it (<fullname>-prometheus)
PROMOP_SRC=$REPO/tests/cluster/promop
REG=registry.h3i.test

log() { printf 'prometheus-up: %s\n' "$*" >&2; }
die() { printf 'prometheus-up: ERROR: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "needs root (the test cluster's state and registry)"
eval "$("$REPO/scripts/cluster.sh" env)"
[[ ${H3I_NODE_MODE:-agent} == real ]] || die "needs real nodes (H3I_NODES=real scripts/cluster.sh up): the node agent runs no images"

# The operator's module as the wrapper module pins it (downloaded by scripts/promop-build.sh).
module_dir() {
    local cache=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
    (cd "$PROMOP_SRC" && GOMODCACHE=$cache/gomod GOFLAGS=-mod=readonly GOTOOLCHAIN=local \
        go list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)
}

prometheus_url() {
    local ip
    ip=$(kubectl -n "$NS" get pod "prometheus-$PROM-0" -o jsonpath='{.status.podIP}' 2>/dev/null) || return 1
    [[ -n $ip ]] || return 1
    echo "http://$ip:9090"
}

# The operator's CRDs this script waits for.
CRDS=(prometheuses servicemonitors podmonitors prometheusrules scrapeconfigs)

# Neither the namespace nor any of the operator's CRDs (all of which `down` deletes) is still
# being deleted.
not_terminating() {
    [[ $(kubectl get namespace "$NS" -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null) == "" ]] &&
        [[ $(kubectl get crd -o jsonpath='{range .items[?(@.spec.group=="monitoring.coreos.com")]}{.metadata.deletionTimestamp}{end}') == "" ]]
}

# Polled rather than `kubectl wait --for=condition=Established`, which fails at once ("accessor
# error") when it reads a CRD created a moment ago that has no conditions yet.
crds_established() {
    local crd
    for crd in "${CRDS[@]}"; do
        [[ $(kubectl get crd "$crd.monitoring.coreos.com" \
            -o jsonpath='{.status.conditions[?(@.type=="Established")].status}') == True ]] || return 1
    done
}

wait_for() { # SECONDS WHAT COMMAND...
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        (($(date +%s) < deadline)) || die "$what: not within ${secs}s"
        sleep 1
    done
}

# The example manifests (FILE...) as one stream, in namespace $NS instead of `default`.
in_namespace() {
    local f
    for f in "$@"; do
        echo "---"
        sed "s/^\(\s*namespace:\) default$/\1 $NS/" "$f"
    done
}

cmd_up() {
    local t0 dir mod ver
    t0=$(date +%s)
    dir=$("$REPO/scripts/promop-build.sh")
    # shellcheck source=/dev/null
    source "$dir/versions" # OPERATOR_VERSION, PROMETHEUS_VERSION
    mod=$(module_dir)
    [[ -d $mod/example/prometheus-operator-crd ]] || die "no example/prometheus-operator-crd in $mod"
    log "images of $dir to the registry ($H3I_REGISTRY_ADDR)"
    for img in prometheus-operator prometheus-config-reloader prometheus; do
        "$REPO/scripts/registry.sh" push "$dir/images/$img" >&2
    done

    # What a `down --no-wait` just deleted must be gone before it is created again.
    wait_for 180 "namespace $NS and the CRDs of an earlier down to go" not_terminating
    log "CRDs of prometheus-operator $OPERATOR_VERSION ($mod)"
    kubectl apply --server-side --force-conflicts -f "$mod/example/prometheus-operator-crd/" >/dev/null
    wait_for 60 "the CRDs Established" crds_established

    kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -n "$NS" -f - >/dev/null
    kubectl -n "$NS" create secret docker-registry regcred --docker-server="$REG" \
        --docker-username="$H3I_REGISTRY_USER" --docker-password="$(cat "$H3I_REGISTRY_PASSWORD_FILE")" \
        --dry-run=client -o yaml | kubectl apply -n "$NS" -f - >/dev/null

    log "operator: RBAC and Deployment of the module's example/rbac/prometheus-operator"
    local rbac=$mod/example/rbac/prometheus-operator
    in_namespace "$rbac/prometheus-operator-cluster-role.yaml" "$rbac/prometheus-operator-cluster-role-binding.yaml" \
        "$rbac/prometheus-operator-service-account.yaml" | kubectl apply -n "$NS" -f - >/dev/null
    # Our images; the kubelet Service it would manage is not needed (no kubelet monitoring).
    local patch
    patch=$(printf '{"spec":{"template":{"spec":{"imagePullSecrets":[{"name":"regcred"}],"containers":[{"name":"prometheus-operator","image":"%s","args":["--prometheus-config-reloader=%s"]}]}}}}' \
        "$REG/prometheus-operator:$OPERATOR_VERSION" "$REG/prometheus-config-reloader:$OPERATOR_VERSION")
    local work
    work=$(mktemp -d)
    in_namespace "$rbac/prometheus-operator-deployment.yaml" >"$work/deployment.yaml"
    kubectl patch --local -f "$work/deployment.yaml" --type=strategic -p "$patch" -o yaml | kubectl apply -n "$NS" -f - >/dev/null
    rm -rf "$work"
    kubectl -n "$NS" rollout status deployment/prometheus-operator --timeout=120s >&2

    log "Prometheus $PROMETHEUS_VERSION: RBAC of example/rbac/prometheus and a Prometheus selecting release=$RELEASE"
    ver=$PROMETHEUS_VERSION
    in_namespace "$mod/example/rbac/prometheus/prometheus-service-account.yaml" \
        "$mod/example/rbac/prometheus/prometheus-cluster-role.yaml" \
        "$mod/example/rbac/prometheus/prometheus-cluster-role-binding.yaml" | kubectl apply -n "$NS" -f - >/dev/null
    kubectl apply -f - >/dev/null <<EOF
apiVersion: monitoring.coreos.com/v1
kind: Prometheus
metadata:
  name: $PROM
  namespace: $NS
  labels: {app: kube-prometheus-stack-prometheus, release: $RELEASE}
spec:
  version: $ver
  image: $REG/prometheus:$ver
  imagePullSecrets: [{name: regcred}]
  serviceAccountName: prometheus
  replicas: 1
  evaluationInterval: $EVAL
  retention: 1d
  serviceMonitorSelector: {matchLabels: {release: $RELEASE}}
  serviceMonitorNamespaceSelector: {}
  podMonitorSelector: {matchLabels: {release: $RELEASE}}
  podMonitorNamespaceSelector: {}
  ruleSelector: {matchLabels: {release: $RELEASE}}
  ruleNamespaceSelector: {}
  scrapeConfigSelector: {matchLabels: {release: $RELEASE}}
  scrapeConfigNamespaceSelector: {}
  probeSelector: {matchLabels: {release: $RELEASE}}
  probeNamespaceSelector: {}
  securityContext:
    runAsGroup: 2000
    runAsNonRoot: true
    runAsUser: 1000
    fsGroup: 2000
    seccompProfile: {type: RuntimeDefault}
EOF
    wait_for 180 "the operator's StatefulSet prometheus-$PROM" kubectl -n "$NS" get statefulset "prometheus-$PROM"
    kubectl -n "$NS" rollout status "statefulset/prometheus-$PROM" --timeout=180s >&2
    local url
    wait_for 60 "a pod IP for prometheus-$PROM-0" prometheus_url
    url=$(prometheus_url)
    wait_for 120 "$url/-/ready" curl -sf "$url/-/ready"
    local build
    build=$(curl -sf "$url/api/v1/status/buildinfo" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"]["version"])')
    [[ v$build == "$ver" ]] || die "Prometheus reports version $build, its object says $ver"
    log "Prometheus $build ready at $url after $(($(date +%s) - t0)) s (operator $OPERATOR_VERSION, release=$RELEASE)"
    echo "$url"
}

cmd_down() { # [--no-wait]
    local mod wait=true
    [[ ${1:-} == --no-wait ]] && wait=false
    kubectl delete namespace "$NS" --ignore-not-found --wait="$wait" --timeout=120s >/dev/null || true
    kubectl delete clusterrole,clusterrolebinding prometheus prometheus-operator --ignore-not-found >/dev/null || true
    mod=$(module_dir 2>/dev/null) || mod=
    if [[ -n $mod && -d $mod/example/prometheus-operator-crd ]]; then
        kubectl delete --ignore-not-found --wait="$wait" -f "$mod/example/prometheus-operator-crd/" >/dev/null || true
    fi
}

case ${1:-up} in
    up) cmd_up ;;
    url) prometheus_url || die "no Prometheus pod in $NS" ;;
    down) cmd_down "${2:-}" ;;
    *) die "usage: $0 [up|url|down [--no-wait]]" ;;
esac
