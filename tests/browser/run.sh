#!/bin/bash
# Headless Chromium against h3-ingress (tests/browser/chromium.py; tests/README.md). Local by
# default: nginx on TCP 443 and target/debug/h3-ingress on UDP 443 in a private network
# namespace (root), built here when missing. Arguments go to chromium.py, e.g. a cluster:
#
#   tests/browser/run.sh --ingress 10.0.0.10:443 --ca ca.pem --metrics http://10.0.0.10:9476/metrics
set -euo pipefail
cd "$(dirname "$0")/../.."
build=1
for a in "$@"; do
    if [[ $a == --ingress* || $a == --binary* || $a == -h || $a == --help ]]; then build=0; fi
done
if [[ $build -eq 1 && ! -x target/debug/h3-ingress ]]; then
    cargo build --locked -p h3-ingress --bin h3-ingress
fi
PY=python3
[ -x .venv/bin/python3 ] && PY=.venv/bin/python3
exec "$PY" tests/browser/chromium.py "$@"
