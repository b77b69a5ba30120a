#!/bin/bash
# The 10-minute soak (docs/reliability.md), not part of scripts/test.sh: mixed legitimate and
# abusive load against the static release binary with default settings; passes when RSS is
# flat (+-10 %) over the last 5 minutes and no connection is left afterwards.
#
#   tests/adversarial/soak.sh [--minutes N]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${H3I_ADVERSARIAL_BINARY:-target/static/h3-ingress}
if [ ! -x "$BIN" ]; then
    scripts/build-static.sh "$BIN"
fi
PY=python3
[ -x .venv/bin/python3 ] && PY=.venv/bin/python3
exec "$PY" tests/adversarial/soak.py "$BIN" "$@"
