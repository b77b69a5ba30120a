# shellcheck shell=bash
# Helpers shared by tests/cluster/journey.sh and tests/cluster/gateway.sh, which both drive the
# product on the test cluster of scripts/cluster.sh the same way: timed steps, checks that poll
# the API server until a deadline, and a report of the cluster's state when a check fails.
#
# Sourced by those scripts after they set their names. It uses, from the sourcing script:
# T_START (the run's start, epoch seconds), NS_OP (the chart's namespace) and a function
# `fail MESSAGE` that reports the failure (see failure_report) and exits 1.
# shellcheck disable=SC2154 # T_START, NS_OP: the sourcing script's; H3I_*: scripts/cluster.sh env's

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
