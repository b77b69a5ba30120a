#!/usr/bin/env bash
# The cluster part of scripts/test.sh, runnable alone. Builds (cached per version in
# /var/cache/h3-ingress, outside the repo) the control plane, helm, the node agent, the real
# node components (kubelet, kube-proxy, containerd, runc, CNI) and the registry, the Prometheus
# Operator and Prometheus with their images (scripts/promop-build.sh), the trixie chroot with
# curl 8.14 (the journey's second HTTP/3 client). Then two clusters, one after the other:
#   - real nodes (H3I_NODES=real), the product's OCI image pulled from the authenticated
#     registry: tests/cluster/smoke.sh (the cluster itself), journey.sh (the product on it),
#     gateway.sh (Gateway API), node-checks.sh (what only a real node answers, a real browser),
#     monitoring.sh (the chart's monitors and rules under a real Prometheus Operator);
#   - the node agent (pods as local processes, the fast mode): skew.sh (CRD version skew both
#     ways, certificate renewal), rollout.sh (a DaemonSet roll under clients), upgrade.sh (helm
#     upgrade from the pinned previous release and back, under clients; its binary built once
#     into the cache), scale.sh 1000 (the scale harness, its targets asserted);
# then `scripts/cluster.sh down` whatever happened: on success, on a failed step, on Ctrl-C or
# a CI job's SIGTERM.
#
#   tests/cluster/run.sh        (root) prints each phase's time and the total at the end
#
# Real nodes run target/static/h3-ingress in the image (built when missing); the agent runs
# target/debug/h3-ingress (or $H3I_BINARY), which scripts/test.sh builds with `cargo test`
# first. Without root it prints a SKIPPED line and exits 0, or 1 when H3I_TESTS_REQUIRE_ROOT=1.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "=================================================================================="
    echo "CLUSTER TESTS SKIPPED (needs root): scripts/cluster.sh build/up, tests/cluster/smoke.sh"
    echo "tests/cluster/journey.sh, gateway.sh, node-checks.sh, monitoring.sh, skew.sh, rollout.sh, upgrade.sh and scale.sh did NOT run; nothing was proven on a real API server or real nodes."
    echo "=================================================================================="
    [[ ${H3I_TESTS_REQUIRE_ROOT:-0} == 1 ]] && { echo "H3I_TESTS_REQUIRE_ROOT=1: failing" >&2; exit 1; }
    exit 0
fi

PHASES=()
T_ALL=$(date +%s)
timed() { # NAME COMMAND...: run it, record its wall time
    local name=$1 t0 rc=0; shift
    t0=$(date +%s)
    "$@" || rc=$?
    PHASES+=("$name $(($(date +%s) - t0))s$([[ $rc -eq 0 ]] || echo " (failed, exit $rc)")")
    return "$rc"
}
finish() {
    local rc=$?
    trap - EXIT INT TERM
    step "cluster: down (always)"
    timed down scripts/cluster.sh down || { [[ $rc -ne 0 ]] || rc=1; }
    local p
    printf '\ncluster tests:'
    for p in "${PHASES[@]}"; do printf ' %s;' "$p"; done
    printf ' total %ss\n' "$(($(date +%s) - T_ALL))"
    [[ $rc -eq 0 ]] && echo "CLUSTER TESTS PASSED" || echo "CLUSTER TESTS FAILED (exit $rc)"
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "cluster: build the control plane, helm, the node agent, the real nodes and the registry (cached per version)"
timed build bash -c 'scripts/cluster.sh build && H3I_NODES=real scripts/cluster.sh build'
step "the Prometheus Operator, its config reloader and Prometheus, with their images (cached per version)"
timed promop-build scripts/promop-build.sh
step "the previous release's binary for tests/cluster/upgrade.sh (cached per commit)"
timed release-build tests/cluster/upgrade.sh build
step "trixie chroot with curl 8.14 (HTTP/3), the journey's second HTTP/3 client"
timed trixie bash -c 'set -o pipefail; scripts/trixie-chroot.sh "${H3I_TRIXIE_ROOT:-/work/trixie-root}" | tail -n 3'
# The image the real nodes pull: the static binary (tests/observe/run.sh builds it in
# scripts/test.sh; built here when missing).
[[ -x target/static/h3-ingress ]] || timed static scripts/build-static.sh

# Real nodes first: kubelet, containerd, runc, CNI and kube-proxy, the image pulled from the
# authenticated registry (scripts/cluster-nodes.sh).
step "real nodes: scripts/cluster.sh up with H3I_NODES=real (kubelet, containerd, kube-proxy, registry)"
timed up-real env H3I_NODES=real scripts/cluster.sh up
step "tests/cluster/smoke.sh on real nodes (the cluster itself; left up for the journey)"
timed smoke env H3I_SMOKE_KEEP=1 tests/cluster/smoke.sh
step "tests/cluster/journey.sh on real nodes (the user's journey)"
timed journey tests/cluster/journey.sh
step "tests/cluster/gateway.sh on real nodes (Gateway API: HTTPRoutes, Gateways, ReferenceGrant)"
timed gateway tests/cluster/gateway.sh
step "tests/cluster/node-checks.sh (what only a real node answers: image, capabilities, NodePort, Chromium, grace, probes, OOM)"
timed node-checks tests/cluster/node-checks.sh
step "tests/cluster/monitoring.sh (the chart's ServiceMonitor, PodMonitor and PrometheusRule under a real Prometheus Operator)"
timed monitoring tests/cluster/monitoring.sh
step "real nodes: down"
timed down-real scripts/cluster.sh down

# Then the node agent (the fast mode: pods as local processes) for what runs many pods or
# many versions: the agent runs each tag's binary without building an image per release.
step "tests/cluster/skew.sh (a newer and an older CRD under the running binary, certificate renewal)"
timed skew tests/cluster/skew.sh
step "tests/cluster/rollout.sh (a socket setting rolls the DaemonSet under three clients per node)"
timed rollout tests/cluster/rollout.sh
step "tests/cluster/upgrade.sh (helm upgrade from the previous release and back, under three clients per node)"
timed upgrade tests/cluster/upgrade.sh
step "tests/cluster/scale.sh ${H3I_SCALE_HOSTS:-1000} (the scale harness against a 4-host baseline, targets asserted)"
timed scale tests/cluster/scale.sh "${H3I_SCALE_HOSTS:-1000}"
