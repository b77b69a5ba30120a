#!/bin/bash
# All install-and-observe checks (issue 5). Exits non-zero when any check fails; a check that
# cannot run here says SKIPPED loudly and is counted as skipped, never as passed.
#
#   tests/observe/run.sh                 everything, including the static release build
#   OBSERVE_STATIC_BUILD=0 tests/observe/run.sh   reuse target/static/h3-ingress if present
#
# Needs: python3 with helm-python-sdk, kubernetes-validate, dockerfile, pyyaml, jsonschema,
# aioquic; node + npm (installs tests/observe/node_modules from package-lock.json); Debian
# prometheus (promtool), nginx, prometheus-nginx-exporter, curl, openssl; kubectl (kustomize);
# file; root for the chroot check.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
OBS=tests/observe
WORK=$(mktemp -d /tmp/h3-observe.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0 failed=0 skipped=0
failed_names=() skipped_names=()

step() {
    local name=$1; shift
    echo
    echo "=== $name: $*"
    "$@"
    local rc=$?
    case $rc in
        0) passed=$((passed + 1)); echo "=== $name: PASSED" ;;
        3) skipped=$((skipped + 1)); skipped_names+=("$name"); echo "=== $name: SKIPPED (see above)" ;;
        *) failed=$((failed + 1)); failed_names+=("$name"); echo "=== $name: FAILED (exit $rc)" ;;
    esac
}

if [ ! -d "$OBS/node_modules/@kubernetes-models/prometheus-operator" ]; then
    (cd "$OBS" && npm ci --no-audit --no-fund --silent) || { echo "npm ci failed"; exit 1; }
fi
cargo build --quiet --bin h3-ingress || { echo "cargo build failed"; exit 1; }
BIN=$ROOT/target/debug/h3-ingress

step generated python3 $OBS/gen.py --check
step chart python3 $OBS/chart_check.py
step operator-flags python3 $OBS/chart_check.py --operator-flags "$BIN"
step deploy python3 $OBS/deploy_check.py

kubectl_plugin() {
    # kubectl finds `kubectl-h3_ingress` on PATH and runs it for `kubectl h3-ingress`.
    mkdir -p "$WORK/bin" && ln -sf "$BIN" "$WORK/bin/kubectl-h3_ingress"
    PATH="$WORK/bin:$PATH" kubectl plugin list 2>/dev/null | grep -q "$WORK/bin/kubectl-h3_ingress" \
        || { echo "kubectl plugin list does not show kubectl-h3_ingress"; return 1; }
    local out
    out=$(PATH="$WORK/bin:$PATH" kubectl h3-ingress status -f $OBS/fixtures/listener-status.yaml \
          --hosts-file $OBS/fixtures/hosts.json) || return 1
    echo "$out"
    if ! { grep -q "Listener nginx-inc: UDP port 443, pods ready 3/3, hosts serving 1/2" <<<"$out" \
        && grep -qE "^  shop.example.com +Serving +Serving +yes +NO +981 " <<<"$out" \
        && grep -q "shop.example.com: Chrome will not use HTTP/3" <<<"$out" \
        && grep -q "api.example.com: api.example.com is not listed under spec.tls of web/shop" <<<"$out"; }; then
        echo "unexpected kubectl h3-ingress status output"
        return 1
    fi
    # --node without a port: the listener's port, or 443 with a warning when no cluster answers.
    out=$(PATH="$WORK/bin:$PATH" kubectl h3-ingress check shop.example.com --node 192.0.2.1 --dry-run \
          --kubeconfig "$WORK/none" 2>"$WORK/err") || return 1
    echo "$out"; cat "$WORK/err"
    [ "$out" = "h3-ingress check https://shop.example.com:443/ --resolve shop.example.com:443:192.0.2.1" ] && grep -q "warning: using port 443" "$WORK/err"
}
step kubectl-plugin kubectl_plugin

# The proxy's upstream to nginx over h2, as TCP ingresses negotiate it by ALPN.
step upstream-h2 python3 $OBS/prom_share_test.py --proxy "$BIN" --smoke
# The share measurement: h3 through the proxy (to nginx over h2, as in production) and h2
# straight to nginx, counted by Prometheus from our /metrics and nginx's stub_status.
step prometheus-share python3 $OBS/prom_share_test.py --proxy "$BIN" --scrape-out "$WORK/scrape.txt"
scrape=()
[ -s "$WORK/scrape.txt" ] && scrape=(--scrape "$WORK/scrape.txt")
step rules python3 $OBS/rules_check.py "${scrape[@]}"
step dashboard python3 $OBS/dashboard_check.py "${scrape[@]}"

if [ "${OBSERVE_STATIC_BUILD:-1}" = "0" ] && [ -x target/static/h3-ingress ]; then
    step dockerfile python3 $OBS/dockerfile_check.py
else
    step dockerfile python3 $OBS/dockerfile_check.py --build
fi
# The image scripts/image.sh assembles from that binary (OCI layout, no Docker engine) against
# the Dockerfile's runtime stage, instruction by instruction, and assembled twice for one digest.
step image python3 $OBS/image_check.py

# The image's binary (static; the lab is a separate package) serves HTTP/3 through the proxy.
if [ -x target/static/h3-ingress ]; then
    step static-binary-proxy python3 $OBS/prom_share_test.py --proxy target/static/h3-ingress --smoke
fi

echo
[ ${#skipped_names[@]} -gt 0 ] && echo "skipped: ${skipped_names[*]}"
[ ${#failed_names[@]} -gt 0 ] && echo "failed: ${failed_names[*]}"
echo "observe: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
