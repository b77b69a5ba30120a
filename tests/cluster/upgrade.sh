#!/usr/bin/env bash
# `helm upgrade` from the previous release to the working tree and back, under clients, on the
# test cluster of scripts/cluster.sh (root). The previous release is the chart and the binary of
# one pinned commit of this repository (PINNED_COMMIT below), built by this script once into the
# shared cache; the node agent runs that build for the image tag it is installed with
# (H3I_TAG_BINARIES) and $H3I_BINARY for the working tree's tag.
#
# The release is installed from the pinned chart with the pinned tag, with a Debian nginx per
# node (a throttled /slow/ path), one annotated Ingress and an Http3Listener. Then twice, under
# three clients per node (tests/py/rollclient.py: a new QUIC connection per request every 200 ms,
# one kept connection doing a request every 200 ms, one slow download spanning the change):
#   up:   helm upgrade to the working tree's chart and tag;
#   down: helm upgrade back to the pinned chart and tag.
# Each change rolls the operator's Deployment; the new operator renders the data plane's image
# from its own (H3_INGRESS_IMAGE), so the DaemonSet rolls with surge. Checks per change: the
# operator and both data plane pods end up running the expected binary (/proc/PID/exe of the
# agent's pid files); tests/cluster/rollcheck.py per node (0 failed requests on new connections,
# the kept connection kept or closed only by GOAWAY with nothing processed lost, the download
# complete); the listener's Ready condition, polled every 0.5 s from before the change until the
# roll is done, never anything but True (every other observation is printed with its reason);
# what CRDCurrent says once the new operator has written it.
#
#   tests/cluster/upgrade.sh        brings the cluster up if needed and leaves it up; its objects
#                                   and nginx are removed on exit unless H3I_UPGRADE_KEEP=1
#   tests/cluster/upgrade.sh build  only builds (or finds) the previous release's binary: no
#                                   cluster, so it can run before taking the cluster's lock
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
JPY=$REPO/tests/cluster/journey.py
PY=python3
[[ -x $REPO/.venv/bin/python3 ]] && PY=$REPO/.venv/bin/python3

# The previous release. 131b96b: the first main commit with everything a roll needs to go
# unnoticed from the old side too (the certificate mirrors and --hosts-namespace, an operator
# that becomes ready whatever order its caches fill in, a drain that keeps every processed
# response); d0332e8, the first with the mirrors, has an operator that at times never became
# ready (06:55 run: 0/1 Available after 120 s). At a release, move it to the released commit:
# the next run builds it once into $CACHE/release-<commit12>/.
PINNED_COMMIT=131b96b

NS_OP=h3-ingress
RELEASE=h3-ingress
NS_APP=h3i-upgrade
HOST=upgrade.h3i.test
CLASS=h3i-upgrade
LISTENER=upgrade
IMAGE_REPO=registry.h3i.test/h3-ingress
ALT_SVC='h3=":443"; ma=3600'
DP_SELECTOR="app.kubernetes.io/instance=$LISTENER,app.kubernetes.io/component=data-plane"
OP_SELECTOR=app.kubernetes.io/component=operator
DRAIN=120         # http.drainTimeoutSeconds: the slow download must finish within it
SLOW_BYTES=2097152
SLOW_RATE=32k      # nginx limit_rate: 2 MiB at 32 KiB/s is about 64 s, longer than a change
CLIENT_SECONDS=100 # the request loops must outlast the change (checked)
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
T_START=$(date +%s)

# shellcheck source=tests/cluster/lib.sh
source "$REPO/tests/cluster/lib.sh"
fail_listeners() { kubectl get h3l "$LISTENER" -o wide; }
fail_pods() { kubectl -n "$NS_OP" get pods -o jsonpath='{.items[*].metadata.name}' 2>/dev/null; }
fail() {
    printf '\nUPGRADE TEST FAILED at %ss: %s\n' "$(($(date +%s) - T_START))" "$*" >&2
    step_table >&2
    failure_report fail_listeners fail_pods
    exit 1
}
skip_unless_root "UPGRADE TEST"

tmp=$(mktemp -d /tmp/h3i-upgrade.XXXXXX)
BG_PIDS=()
cleanup() {
    local rc=$? p
    for p in "${BG_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    remove_objects H3I_UPGRADE_KEEP "$LISTENER" "ingressclass/$CLASS" "$NS_APP" "$NS_OP"
    return $rc
}
trap cleanup EXIT
trap 'fail "line $LINENO: \`$BASH_COMMAND\` failed unexpectedly"' ERR

secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", b - a}'; }

# build_pinned: the pinned commit's binary in $CACHE/release-<commit12>/h3-ingress, built once
# (debug, from `git archive` of the commit, its commit stamped in as build.rs reads it) under a
# lock so that two runs never build it twice; sets PINNED_BIN and PINNED_C12.
build_pinned() {
    local commit dir src t0
    # A shallow clone (CI may make one) lacks the release's commit: deepen it first.
    if ! git -C "$REPO" rev-parse --verify --quiet "$PINNED_COMMIT^{commit}" >/dev/null &&
        [[ $(git -C "$REPO" rev-parse --is-shallow-repository) == true ]]; then
        info "shallow clone: fetching the history to reach $PINNED_COMMIT"
        git -C "$REPO" fetch --quiet --unshallow || fail "git fetch --unshallow failed: the release $PINNED_COMMIT is not in this clone"
    fi
    commit=$(git -C "$REPO" rev-parse --verify --quiet "$PINNED_COMMIT^{commit}") ||
        fail "PINNED_COMMIT=$PINNED_COMMIT is not a commit of $REPO"
    PINNED_C12=${commit:0:12}
    dir=$CACHE/release-$PINNED_C12
    PINNED_BIN=$dir/h3-ingress
    mkdir -p "$dir"
    exec 7>"$dir/.lock"
    flock 7
    if [[ -x $PINNED_BIN ]]; then
        exec 7>&-
        ok "the release $PINNED_C12 is cached: $PINNED_BIN"
        return
    fi
    t0=$(date +%s)
    src=$(mktemp -d /tmp/h3i-release-src.XXXXXX)
    git -C "$REPO" archive "$commit" | tar -x -C "$src"
    info "building $PINNED_C12 (cargo build --locked, debug; log $dir/build.log)"
    if ! (cd "$src" && H3I_GIT_COMMIT=$PINNED_C12 CARGO_TARGET_DIR=$dir/target \
        nice -n 10 cargo build --locked --bin h3-ingress) >"$dir/build.log" 2>&1; then
        rm -rf "$src"
        exec 7>&-
        fail "building the release $PINNED_C12: $(tail -20 "$dir/build.log")"
    fi
    cp "$dir/target/debug/h3-ingress" "$PINNED_BIN.tmp"
    mv "$PINNED_BIN.tmp" "$PINNED_BIN"
    # The binary is what is cached; its build tree is gigabytes (a failed build keeps it, so
    # that the next attempt resumes).
    rm -rf "$src" "$dir/target"
    exec 7>&-
    ok "the release $PINNED_C12 built in $(($(date +%s) - t0)) s: $PINNED_BIN"
}

# tag_of BINARY: the image tag naming that build, VERSION-COMMIT, from its --version.
tag_of() {
    local out
    out=$("$1" --version) || fail "$1 --version failed"
    [[ $out =~ ^h3-ingress\ ([^ ]+)\ \(commit\ ([0-9a-f]{7,40})\)$ ]] ||
        fail "$1 --version says '$out', want 'h3-ingress VERSION (commit HEX)'"
    echo "${BASH_REMATCH[1]}-${BASH_REMATCH[2]}"
}

pods_state() { # name uid node image deletionTimestamp|ready, one line per data plane pod
    kubectl -n "$NS_OP" get pods -l "$DP_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.spec.containers[0].image} {.metadata.deletionTimestamp}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}'
}
ready_pods() { pods_state | grep -c '|True$' || true; }
h3_ok() { "$PY" "$JPY" h3 --addr "$1" --host "$HOST" --cacert "$tmp/pki/ca.crt" --path /whoami >/dev/null 2>&1; }
served_everywhere() { local ip; for ip in "${IPS[@]}"; do h3_ok "$ip" || return 1; done; }
# runs POD CONTAINER BINARY: the container's process (the agent's pid file) runs BINARY.
runs() {
    local pid
    pid=$(cat "$H3I_POD_LOGS/$NS_OP/$1/$2.pid" 2>/dev/null) || return 1
    [[ $(readlink -f "/proc/$pid/exe") == $(readlink -f "$3") ]]
}
# operator_runs TAG BINARY: one operator pod, Ready, of that tag, its process running BINARY.
operator_runs() {
    local pods
    pods=$(kubectl -n "$NS_OP" get pods -l "$OP_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.name} {.spec.containers[0].image} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}')
    [[ $(wc -l <<<"$pods") -eq 1 ]] || return 1
    read -r OP_POD image ready <<<"$pods"
    [[ $image == "$IMAGE_REPO:$1" && $ready == True ]] && runs "$OP_POD" operator "$2"
}
# rolled TAG BINARY: every pod from before the change gone, two pods of TAG Ready, running BINARY.
rolled() {
    local p name image state
    for p in $OLD_PODS; do jp pod -n "$NS_OP" "$p" -o name >/dev/null && return 1; done
    [[ $(ready_pods) -eq 2 ]] || return 1
    while read -r name _ _ image state; do
        [[ $image == "$IMAGE_REPO:$1" && $state == "|True" ]] && runs "$name" h3-ingress "$2" || return 1
    done < <(pods_state)
}
# taken_over TAG: on both nodes a pod of TAG is Ready (the old ones may still be draining).
taken_over() { [[ $(pods_state | grep -c " $IMAGE_REPO:$1 [^|]*|True$" || true) -eq 2 ]]; }
# poll_ready FILE: the listener's Ready condition every 0.5 s, one line each:
# EPOCH STATUS|REASON|MESSAGE (a failed read is recorded as what kubectl said).
poll_ready() {
    local got
    while :; do
        got=$(kubectl get h3l "$LISTENER" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}|{.status.conditions[?(@.type=="Ready")].reason}|{.status.conditions[?(@.type=="Ready")].message}' 2>&1 | tr '\n' ' ') || true
        printf '%s %s\n' "$(date +%s.%N)" "$got" >>"$1"
        sleep 0.5
    done
}
crd_current() {
    jp h3l "$LISTENER" -o jsonpath='{.status.conditions[?(@.type=="CRDCurrent")].status} {.status.conditions[?(@.type=="CRDCurrent")].reason}: {.status.conditions[?(@.type=="CRDCurrent")].message}'
}

# =================================================================================================
step "the previous release: commit $PINNED_COMMIT's binary (built once, then cached) and chart"
build_pinned
mkdir -p "$tmp/pinned"
if [[ ${1:-} == build ]]; then
    trap - EXIT
    rm -rf "$tmp"
    exit 0
fi
git -C "$REPO" archive "$PINNED_C12" charts/h3-ingress | tar -x -C "$tmp/pinned"
PINNED_CHART=$tmp/pinned/charts/h3-ingress
WORK_CHART=$REPO/charts/h3-ingress
PINNED_TAG=$(tag_of "$PINNED_BIN")
# The working tree's binary: as for every cluster test, target/debug unless H3I_BINARY says.
H3I_BINARY=${H3I_BINARY:-$REPO/target/debug/h3-ingress}
export H3I_BINARY
[[ -x $H3I_BINARY ]] || fail "H3I_BINARY=$H3I_BINARY does not exist (cargo build first)"
WORK_TAG=$(tag_of "$H3I_BINARY")
[[ $PINNED_TAG != "$WORK_TAG" ]] || fail "H3I_BINARY is a build of the pinned commit ($WORK_TAG): nothing to upgrade"
ok "previous release: $PINNED_TAG ($PINNED_BIN, chart of $PINNED_C12); working tree: $WORK_TAG ($H3I_BINARY)"
export H3I_TAG_BINARIES="$PINNED_TAG=$PINNED_BIN"

cluster_up
[[ ${H3I_TAG_BINARIES:-} == "$PINNED_TAG=$PINNED_BIN" ]] || fail "the cluster's agent does not map $PINNED_TAG (env: ${H3I_TAG_BINARIES:-})"
if kubectl get ns "$NS_OP" >/dev/null 2>&1; then
    remove_leftovers "removing objects a previous run left" "$NS_APP" "$NS_OP"
fi
kubectl delete ingressclass "$CLASS" --ignore-not-found >/dev/null

step "helm install of the previous release ($PINNED_TAG); nginx on both nodes serving $HOST (/slow/ at $SLOW_RATE/s); an Http3Listener"
kubectl create namespace "$NS_OP" >/dev/null
kubectl label namespace "$NS_OP" pod-security.kubernetes.io/enforce=privileged >/dev/null
helm install "$RELEASE" "$PINNED_CHART" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
    --set image.tag="$PINNED_TAG" --wait --timeout 120s >"$tmp/helm.log" 2>&1 ||
    fail "helm install: $(cat "$tmp/helm.log")"
roll_app upgrade
OLD_PODS=""
wait_ok 120 "the operator and both data plane pods run the previous release" eval \
    'operator_runs "$PINNED_TAG" "$PINNED_BIN" && rolled "$PINNED_TAG" "$PINNED_BIN"'
wait_ok 60 "$HOST served over HTTP/3 on ${IPS[*]}" served_everywhere
wait_ok 60 "the listener Ready=True" eval '[[ $(jp h3l "$LISTENER" -o jsonpath="{.status.conditions[?(@.type==\"Ready\")].status}") == True ]]'
info "CRDCurrent: $(crd_current)"

# =================================================================================================
# change NAME CHART TAG BINARY: helm upgrade to CHART with image tag TAG under three clients per
# node, until the operator and both data plane pods run BINARY; then the verdicts. A missed
# target is added to MISSES (the other change still runs); a change that never completes fails.
MISSES=()
change() {
    local name=$1 chart=$2 tag=$3 bin=$4 t_change t_helm t_op t_new t_rolled
    step "$name: three clients on each node; helm upgrade to the chart of ${chart#"$tmp/"} with image tag $tag under them"
    OLD_PODS=$(pods_state | cut -d' ' -f1 | tr '\n' ' ')
    local old_op=$OP_POD
    local loops_end
    loops_end=$(awk -v t="$(date +%s.%N)" -v d="$CLIENT_SECONDS" 'BEGIN {printf "%.3f", t + d}')
    roll_clients "$name-" "$CLIENT_SECONDS"
    BG_PIDS+=("${ROLL_CLIENTS[@]}")
    poll_ready "$tmp/$name-ready.log" &
    local poller=$!
    BG_PIDS+=("$poller")
    sleep 3
    t_change=$(date +%s.%N)
    helm upgrade "$RELEASE" "$chart" -n "$NS_OP" --set image.repository="$IMAGE_REPO" \
        --set image.tag="$tag" --wait --timeout 180s >"$tmp/helm-$name.log" 2>&1 ||
        fail "helm upgrade ($name): $(cat "$tmp/helm-$name.log")"
    t_helm=$(date +%s.%N)
    wait_ok 120 "the operator runs $tag" operator_runs "$tag" "$bin"
    t_op=$(date +%s.%N)
    wait_ok 120 "a pod of $tag Ready on both nodes" taken_over "$tag"
    t_new=$(date +%s.%N)
    wait_ok 240 "the roll done: the old data plane pods gone, two of $tag Ready running $bin" rolled "$tag" "$bin"
    t_rolled=$(date +%s.%N)
    kill "$poller" 2>/dev/null || true
    roll_clients_done "$name-"
    awk -v r="$t_rolled" -v e="$loops_end" 'BEGIN {exit !(r < e)}' ||
        fail "$name: the request loops ended $(secs "$loops_end" "$t_rolled") s before the roll was done: raise CLIENT_SECONDS"
    ok "$name: helm upgrade --wait returned after $(secs "$t_change" "$t_helm") s; operator $old_op -> $OP_POD ($tag) after $(secs "$t_change" "$t_op") s; new data plane pods Ready on both nodes after $(secs "$t_change" "$t_new") s; the old ones gone (drained) after $(secs "$t_change" "$t_rolled") s: $OLD_PODS-> $(pods_state | cut -d' ' -f1 | tr '\n' ' ')"
    verdicts "$name" "$t_change" "$t_rolled" "$tag"
}

# verdicts NAME T_CHANGE T_ROLLED TAG: what the clients saw, the Ready observations, CRDCurrent.
verdicts() {
    local name=$1 t_change=$2 t_rolled=$3 tag=$4 crd
    step "$name: what the clients saw per node; the listener's Ready condition during the change; CRDCurrent"
    if ! roll_verdict "$name-" >"$tmp/$name-verdict.txt" 2>&1; then
        MISSES+=("$name: $(grep FAIL "$tmp/$name-verdict.txt" | tr '\n' ' ')")
    fi
    indent <"$tmp/$name-verdict.txt"
    info "slow downloads ended at $("$PY" -c 'import json,sys
t0 = float(sys.argv[1])
for f in sys.argv[2:]:
    d = json.load(open(f))["slow"]
    print("+%.1f s" % (d["start"] + d["ms"] / 1000 - t0), end=" ")' "$t_change" "$tmp/$name"-clients-{0,1}.json)after the change began (the roll done at +$(secs "$t_change" "$t_rolled") s)"
    # Ready: every observation from the clients' start to the roll's end.
    if ! "$PY" - "$tmp/$name-ready.log" "$t_change" >"$tmp/$name-ready.txt" <<'EOF'; then
import sys
rows = [l.rstrip("\n").split(" ", 1) for l in open(sys.argv[1]) if l.strip()]
t0 = float(sys.argv[2])
bad = [(float(t), v) for t, v in rows if not v.startswith("True|")]
span = (float(rows[0][0]) - t0, float(rows[-1][0]) - t0) if rows else (0, 0)
print(f"Ready polled {len(rows)} times from {span[0]:+.1f} s to {span[1]:+.1f} s: "
      f"{len(rows) - len(bad)} True, {len(bad)} not")
seen = {}
for t, v in bad:
    first, last, n = seen.get(v, (t, t, 0))
    seen[v] = (first, t, n + 1)
for v, (first, last, n) in seen.items():
    print(f"not Ready {n}x from {first - t0:+.1f} s to {last - t0:+.1f} s: {v}")
sys.exit(1 if bad or not rows else 0)
EOF
        MISSES+=("$name: the listener was not Ready=True throughout: $(tail -n +2 "$tmp/$name-ready.txt" | tr '\n' ' ')")
    fi
    indent <"$tmp/$name-ready.txt"
    wait_ok 60 "CRDCurrent written by the operator of $tag" eval '[[ $(crd_current) == *"($tag)"* ]]'
    crd=$(crd_current)
    info "CRDCurrent: $crd"
    info "the CRD's schema revision annotation: $(jp crd http3listeners.h3-ingress.dev -o jsonpath='{.metadata.annotations}')"
    [[ $crd == True\ * ]] || MISSES+=("$name: CRDCurrent is not True: $crd")
}

change up "$WORK_CHART" "$WORK_TAG" "$H3I_BINARY"
change down "$PINNED_CHART" "$PINNED_TAG" "$PINNED_BIN"

step "after both changes: $HOST still served on both nodes"
wait_ok 30 "$HOST served over HTTP/3 on ${IPS[*]}" served_everywhere
if ((${#MISSES[@]})); then
    printf '    MISSED: %s\n' "${MISSES[@]}"
    fail "${#MISSES[@]} target(s) missed (above)"
fi
step_table
printf '\nUPGRADE TEST PASSED in %ss\n' "$(($(date +%s) - T_START))"
