#!/usr/bin/env bash
# The cluster part of scripts/test.sh, runnable alone: build the control plane, helm and the
# node agent (cached per version in /var/cache/h3-ingress, outside the repo), the trixie chroot
# with curl 8.14 (the journey's second HTTP/3 client), tests/cluster/smoke.sh (the cluster
# itself), tests/cluster/journey.sh (the product on it), tests/cluster/gateway.sh (Gateway
# API on it), tests/cluster/skew.sh (CRD version skew both ways, certificate renewal),
# tests/cluster/rollout.sh (a DaemonSet roll under clients), tests/cluster/upgrade.sh (helm
# upgrade from the pinned previous release and back, under clients; its binary built once
# into the cache), tests/cluster/scale.sh 1000 (the scale harness, its targets asserted), then
# `scripts/cluster.sh down` whatever happened: on success, on a failed step, on Ctrl-C or a CI
# job's SIGTERM.
#
#   tests/cluster/run.sh        (root) prints each phase's time and the total at the end
#
# Runs target/debug/h3-ingress (or $H3I_BINARY) for the project's image; scripts/test.sh builds
# it with `cargo test` first. Without root it prints a SKIPPED line and exits 0, or 1 when
# H3I_TESTS_REQUIRE_ROOT=1.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%H:%M:%S)"; }

if [[ $(id -u) -ne 0 ]]; then
    echo "=================================================================================="
    echo "CLUSTER TESTS SKIPPED (needs root): scripts/cluster.sh build/up, tests/cluster/smoke.sh"
    echo "tests/cluster/journey.sh, gateway.sh, skew.sh, rollout.sh, upgrade.sh and scale.sh did NOT run; nothing was proven on a real API server."
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

step "cluster: build the control plane, helm and the node agent (cached per version)"
timed build scripts/cluster.sh build
step "the previous release's binary for tests/cluster/upgrade.sh (cached per commit)"
timed release-build tests/cluster/upgrade.sh build
step "trixie chroot with curl 8.14 (HTTP/3), the journey's second HTTP/3 client"
timed trixie bash -c 'set -o pipefail; scripts/trixie-chroot.sh "${H3I_TRIXIE_ROOT:-/work/trixie-root}" | tail -n 3'
step "tests/cluster/smoke.sh (the cluster itself; left up for the journey)"
timed smoke env H3I_SMOKE_KEEP=1 tests/cluster/smoke.sh
step "tests/cluster/journey.sh (the user's journey)"
timed journey tests/cluster/journey.sh
step "tests/cluster/gateway.sh (Gateway API: HTTPRoutes, Gateways, ReferenceGrant)"
timed gateway tests/cluster/gateway.sh
step "tests/cluster/skew.sh (a newer and an older CRD under the running binary, certificate renewal)"
timed skew tests/cluster/skew.sh
step "tests/cluster/rollout.sh (a socket setting rolls the DaemonSet under three clients per node)"
timed rollout tests/cluster/rollout.sh
step "tests/cluster/upgrade.sh (helm upgrade from the previous release and back, under three clients per node)"
timed upgrade tests/cluster/upgrade.sh
step "tests/cluster/scale.sh ${H3I_SCALE_HOSTS:-1000} (the scale harness against a 4-host baseline, targets asserted)"
timed scale tests/cluster/scale.sh "${H3I_SCALE_HOSTS:-1000}"
