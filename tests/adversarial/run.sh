#!/bin/bash
# The adversarial suite (docs/reliability.md): every attack in tests/adversarial/attacks/
# against the static release binary with default settings, on loopback, in front of Debian
# nginx. Reuses target/static/h3-ingress (built by tests/observe/run.sh's Dockerfile check);
# builds it when missing. Prints one table; exits non-zero when an attack misses its target.
#
#   tests/adversarial/run.sh [--only NAME ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${H3I_ADVERSARIAL_BINARY:-target/static/h3-ingress}
if [ ! -x "$BIN" ]; then
    scripts/build-static.sh "$BIN"
fi
PY=python3
[ -x .venv/bin/python3 ] && PY=.venv/bin/python3
exec "$PY" tests/adversarial/run.py "$BIN" "$@"
