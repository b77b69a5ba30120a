#!/usr/bin/env bash
# One traced S6 run: a bench invocation of one row and one run, with the router's queue trace,
# the server namespace's `ss -tin` every 0.1 s and a copy of the lab's logs (the proxy's
# included, so RUST_LOG=info,h3_ingress::proxy::cc=debug shows each window cut). The logs are
# copied every 2 s while the bench runs, because it removes them on exit: the last 2 s may be
# missing.
#
# The lab must be built with scripts/experiments/lab-queue-trace.patch applied. Run from the
# checkout whose target/release holds that build. Not run by CI.
#
# usage: run-traced-s6.sh OUT_DIR NAME ROW [more bench arguments]
#   CELL=S6-200ms-20mbit-bdp-bbr (default) picks the cell.
# Writes OUT_DIR/NAME.trace, NAME.ss, NAME.log and NAME.logs/.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 OUT_DIR NAME ROW [bench arguments]" >&2
  exit 2
fi
out=$1 name=$2 row=$3
shift 3
mkdir -p "$out"
prefix="t$((RANDOM % 10000))"
rm -f "$out/$name.trace"

# The server namespace exists only while the bench runs; poll until it goes away.
(
  while true; do
    if ip netns list 2>/dev/null | grep -q "^$prefix-s"; then
      printf '@ %s\n' "$(date +%s.%N)"
      ip netns exec "$prefix-s" ss -tinH state established 2>/dev/null
    fi
    sleep 0.1
  done
) >"$out/$name.ss" &
poller=$!
(
  while true; do
    if [ -d "/run/$prefix/work/logs" ]; then
      mkdir -p "$out/$name.logs"
      cp -a "/run/$prefix/work/logs/." "$out/$name.logs/" 2>/dev/null
    fi
    sleep 2
  done
) &
copier=$!
trap 'kill $poller $copier 2>/dev/null' EXIT

H3I_EXPERIMENT_QUEUE_TRACE="$out/$name.trace" RUST_LOG="${RUST_LOG:-info,h3_ingress::proxy::cc=debug}" \
  timeout 900 target/release/h3-ingress-lab bench --prefix "$prefix" --scenarios S6 \
  --rows "$row" --runs 1 --cells "${CELL:-S6-200ms-20mbit-bdp-bbr}" "$@" >"$out/$name.log" 2>&1
status=$?
grep -h ' 1/1\] ' "$out/$name.log"
exit $status
