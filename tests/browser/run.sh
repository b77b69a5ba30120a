#!/bin/bash
# Headless Chromium against h3-ingress (tests/browser/chromium.py; tests/README.md). Local by
# default: nginx on TCP 443 and target/debug/h3-ingress on UDP 443 in a private network
# namespace (root), built here when missing; then the DNS discovery check
# (tests/browser/dns_discovery.py: Knot DNS with an HTTPS record, no Alt-Svc, a first visit).
# Arguments go to chromium.py, e.g. a cluster (then the local DNS check is not run):
#
#   tests/browser/run.sh --ingress 10.0.0.10:443 --ca ca.pem --metrics http://10.0.0.10:9476/metrics
set -euo pipefail
cd "$(dirname "$0")/../.."
build=1
local_run=1
binary=()
for a in "$@"; do
    if [[ $a == --ingress* || $a == --binary* || $a == -h || $a == --help ]]; then build=0; fi
    if [[ $a == --ingress* || $a == -h || $a == --help ]]; then local_run=0; fi
done
if [[ $build -eq 1 && ! -x target/debug/h3-ingress ]]; then
    cargo build --locked -p h3-ingress --bin h3-ingress
fi
PY=python3
[ -x .venv/bin/python3 ] && PY=.venv/bin/python3
"$PY" tests/browser/chromium.py "$@"
[[ $local_run -eq 1 ]] || exit 0

# The same proxy binary for the DNS check (--binary B or --binary=B).
prev=
for a in "$@"; do
    [[ $prev == --binary ]] && binary=(--binary "$a")
    [[ $a == --binary=* ]] && binary=("$a")
    prev=$a
done
rc=0
"$PY" tests/browser/dns_discovery.py "${binary[@]}" || rc=$?
if [[ $rc -eq 3 ]]; then
    # Not root: dns_discovery.py printed CHROMIUM DNS DISCOVERY SKIPPED.
    [[ ${H3I_TESTS_REQUIRE_ROOT:-0} == 1 ]] && exit 1
    exit 0
fi
exit "$rc"
