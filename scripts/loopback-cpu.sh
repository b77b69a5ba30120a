#!/usr/bin/env bash
# CPU per byte of the proxy: bulk downloads over loopback from Debian's nginx (TLS + h2) through
# h3-ingress to curl 8.14 (HTTP/3) from the trixie chroot, next to the same downloads over
# HTTP/2 straight from nginx. Prints one row per transfer with the process CPU time (utime +
# stime from /proc/PID/stat, so other load on the machine does not count) of the proxy and of
# nginx, and the proxy's CPU seconds per GB; the summary row is the median.
#
# The measurement of record is the lab bench's E1 (`h3-ingress-lab bench --scenarios E1`: our
# proxy next to Caddy, nginx 1.26 and nginx h2 in one run). This script stays for what the bench
# does not do: one build against another (`--binary`, run it per build in turns) and profiling.
#
# Usage: scripts/loopback-cpu.sh [--binary target/release/h3-ingress] [--size-mb 256] [--runs 3]
#            [--chroot /work/trixie-root] [--max-udp-payload 1472] [--callgrind N_MB] [--perf]
#            [--strace] [--keep] [--client curl|check]
#   --max-udp-payload the proxy's path-MTU probing bound (transport.maxUdpPayloadBytes); pinned
#                     because by default it follows the host's largest interface MTU, and the
#                     packet size sets most of the cost per byte
#   --callgrind N_MB  also run the proxy under valgrind's callgrind for one N_MB download and
#                     print the top functions by instructions (reproducible on a loaded box)
#   --perf            also record the proxy with `perf record -e cpu-clock` for one download
#   --strace          also count the proxy's system calls (strace -c) for one download
#   --keep            keep the work directory (certs, configs, logs, profiles)
#   --client          the HTTP/3 client: curl 8.14 (default; 1200-byte datagrams, no UDP GRO) or
#                     the binary's own `check` (quinn: path-MTU discovery to the payload bound,
#                     UDP GRO, a 4 MiB receive buffer), to tell the client's share of the cost
# Needs root (chroot), nginx, openssl; valgrind/perf for the profiling options.
set -euo pipefail

BIN=target/release/h3-ingress
SIZE_MB=256
RUNS=3
CHROOT=/work/trixie-root
CALLGRIND_MB=0
MAX_UDP_PAYLOAD=1472
PERF=0
STRACE=0
KEEP=0
CLIENT=curl
while [[ $# -gt 0 ]]; do
    case $1 in
        --binary) BIN=$2; shift 2 ;;
        --size-mb) SIZE_MB=$2; shift 2 ;;
        --runs) RUNS=$2; shift 2 ;;
        --chroot) CHROOT=$2; shift 2 ;;
        --callgrind) CALLGRIND_MB=$2; shift 2 ;;
        --max-udp-payload) MAX_UDP_PAYLOAD=$2; shift 2 ;;
        --perf) PERF=1; shift ;;
        --strace) STRACE=1; shift ;;
        --keep) KEEP=1; shift ;;
        --client) CLIENT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done

die() { echo "loopback-cpu: $*" >&2; exit 1; }
[[ $CLIENT == curl || $CLIENT == check ]] || die "--client must be curl or check, not $CLIENT"
[[ $(id -u) -eq 0 ]] || die "needs root (chroot for curl)"
[[ -x $BIN ]] || die "no binary at $BIN (cargo build --release)"
[[ -x $CHROOT/usr/bin/curl ]] || die "no curl in $CHROOT (scripts/trixie-chroot.sh $CHROOT)"
BIN=$(realpath "$BIN")
TICK=$(getconf CLK_TCK)

# The work directory lives inside the chroot so curl can read the CA file.
WORK=$(mktemp -d "$CHROOT/tmp/h3i-cpu.XXXXXX")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [[ $KEEP -eq 1 ]]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Both TCP (nginx) and UDP (proxy) must be free on the same number, as on a node.
while :; do
    PORT=$(free_port)
    python3 -c "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1',$PORT))" 2>/dev/null && break
done
ADMIN=$(free_port)

openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca \
    -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=a.test \
    -keyout "$WORK/key.pem" -out "$WORK/leaf.csr" 2>/dev/null
printf 'subjectAltName=DNS:a.test\nbasicConstraints=critical,CA:FALSE\n' >"$WORK/ext.cnf"
openssl x509 -req -in "$WORK/leaf.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 2 -extfile "$WORK/ext.cnf" -out "$WORK/cert.pem" 2>/dev/null
mkdir -p "$WORK/html" "$WORK/logs"
head -c $((SIZE_MB << 20)) /dev/urandom >"$WORK/html/bulk.bin"
[[ $CALLGRIND_MB -gt 0 ]] && head -c $((CALLGRIND_MB << 20)) /dev/urandom >"$WORK/html/small.bin"

# Debian's nginx, as the TCP ingress: one worker, TLS 1.3, h2, no access log.
cat >"$WORK/nginx.conf" <<EOF
worker_processes 1;
user root;
pid $WORK/nginx.pid;
error_log $WORK/logs/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    server {
        listen 127.0.0.1:$PORT ssl http2;
        server_name a.test;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        root $WORK/html;
    }
}
EOF
cat >"$WORK/proxy.yaml" <<EOF
port: $PORT
addresses: {ipv4: 127.0.0.1}
upstream: {address: "127.0.0.1:$PORT"}
metrics: {address: "127.0.0.1:$ADMIN"}
transport: {maxUdpPayloadBytes: $MAX_UDP_PAYLOAD}
hosts:
  - {name: a.test, certFile: $WORK/cert.pem, keyFile: $WORK/key.pem}
EOF

nginx -c "$WORK/nginx.conf" -p "$WORK" -g 'daemon off;' >"$WORK/logs/nginx.out" 2>&1 &
PIDS+=($!)
NGINX_MASTER=$!

start_proxy() {
    RUST_LOG=${RUST_LOG:-info} "$@" proxy --config "$WORK/proxy.yaml" >>"$WORK/logs/proxy.log" 2>&1 &
    PROXY=$!
    PIDS+=("$PROXY")
    for _ in $(seq 1 200); do
        curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "proxy not ready: $(tail -5 "$WORK/logs/proxy.log")"
}
# Under strace or perf the proxy is the wrapper's child; valgrind runs it in its own process.
stop_proxy() {
    local child
    child=$(pgrep -P "$PROXY" | head -1 || true)
    kill -INT "${child:-$PROXY}" 2>/dev/null || true
    wait "$PROXY" 2>/dev/null || true
}
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
nginx_worker() { pgrep -P "$NGINX_MASTER" | head -1; }
metric() { curl -s "http://127.0.0.1:$ADMIN/metrics" | awk -v n="$1" '$1 == n {print $2}'; }

fetch() { # proto path -> "time_total size_download http_version"
    if [[ $1 == http3-only && $CLIENT == check ]]; then
        "$BIN" check --json --timeout 300 --cacert "$WORK/ca.pem" --resolve "a.test:$PORT:127.0.0.1" \
            "https://a.test:$PORT/$2" | python3 -c 'import json, sys
h3 = json.load(sys.stdin)["h3"]
print(h3["total_ms"] / 1000 if h3["ok"] else 0, h3["body_bytes"], 3)'
        return
    fi
    chroot "$CHROOT" curl -sk -o /dev/null --resolve "a.test:$PORT:127.0.0.1" "--$1" \
        -w '%{time_total} %{size_download} %{http_version}\n' "https://a.test:$PORT/$2"
}

sleep 0.5
WORKER=$(nginx_worker)
[[ -n $WORKER ]] || die "nginx did not start: $(cat "$WORK/logs/nginx.out" "$WORK/logs/error.log")"
start_proxy "$BIN"

echo "loopback-cpu: $(basename "$BIN") $(sha256sum "$BIN" | cut -c1-12), h3 client $CLIENT, ${SIZE_MB} MB x $RUNS, max UDP payload $MAX_UDP_PAYLOAD, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-3s | %-8s | %7s | %8s | %9s | %9s | %11s | %13s | %10s |\n' \
    run proto seconds MB/s "proxy cpu" "nginx cpu" "proxy s/GB" "proxy+nginx" "h3 loss"
printf '|-----|----------|---------|----------|-----------|-----------|-------------|---------------|------------|\n'
row() { # run proto time bytes proxy_ticks nginx_ticks lost sent
    awk -v r="$1" -v p="$2" -v t="$3" -v b="$4" -v pc="$5" -v nc="$6" -v tick="$TICK" -v lost="$7" -v sent="$8" 'BEGIN {
        gb = b / 1e9; ps = pc / tick; ns = nc / tick
        loss = (sent > 0) ? sprintf("%.2f %%", 100 * lost / sent) : "-"
        printf "| %-3s | %-8s | %7.2f | %8.1f | %8.2fs | %8.2fs | %11.2f | %8.2f s/GB | %10s |\n",
            r, p, t, b / t / 1e6, ps, ns, ps / gb, (ps + ns) / gb, loss
    }'
}

for run in $(seq 1 "$RUNS"); do
    for proto in http3-only http2; do
        p0=$(cpu_ticks "$PROXY"); n0=$(cpu_ticks "$WORKER")
        l0=$(metric h3_ingress_connection_lost_packets_total); s0=$(metric h3_ingress_connection_sent_packets_total)
        read -r t bytes ver < <(fetch "$proto" bulk.bin)
        [[ $bytes -eq $((SIZE_MB << 20)) ]] || die "$proto download incomplete: $bytes bytes (HTTP/$ver)"
        sleep 0.3 # the proxy records connection stats when the connection closes
        p1=$(cpu_ticks "$PROXY"); n1=$(cpu_ticks "$WORKER")
        l1=$(metric h3_ingress_connection_lost_packets_total); s1=$(metric h3_ingress_connection_sent_packets_total)
        if [[ $proto == http3-only ]]; then
            row "$run" h3-proxy "$t" "$bytes" $((p1 - p0)) $((n1 - n0)) $((${l1%.*} - ${l0%.*})) $((${s1%.*} - ${s0%.*}))
        else
            row "$run" h2-nginx "$t" "$bytes" $((p1 - p0)) $((n1 - n0)) 0 0
        fi
    done
done

if [[ $PERF -eq 1 ]]; then
    stop_proxy
    start_proxy perf record -e cpu-clock -F 999 -g -o "$WORK/perf.data" -- "$BIN"
    fetch http3-only bulk.bin >/dev/null
    stop_proxy
    echo; echo "perf (cpu-clock samples of the proxy, one ${SIZE_MB} MB download), self time:"
    perf report -i "$WORK/perf.data" --stdio --no-children --sort symbol 2>/dev/null |
        grep -E '^ +[0-9.]+%' | head -30
    start_proxy "$BIN"
fi

if [[ $STRACE -eq 1 ]]; then
    stop_proxy
    start_proxy strace -f -c -o "$WORK/strace.txt" "$BIN"
    fetch http3-only bulk.bin >/dev/null
    stop_proxy
    echo; echo "system calls of the proxy (start-up included, one ${SIZE_MB} MB download):"
    head -20 "$WORK/strace.txt"
    start_proxy "$BIN"
fi

if [[ $CALLGRIND_MB -gt 0 ]]; then
    stop_proxy
    start_proxy valgrind --tool=callgrind --callgrind-out-file="$WORK/callgrind.out" "$BIN"
    fetch http3-only small.bin >/dev/null
    # Only the transfer: the start-up is the same work in both builds but not per byte.
    stop_proxy
    echo; echo "callgrind (instructions of the proxy, start-up included, one ${CALLGRIND_MB} MB download):"
    callgrind_annotate --inclusive=no "$WORK/callgrind.out" 2>/dev/null | sed -n '1,45p' |
        grep -E 'PROGRAM TOTALS|^ *[0-9,]+ \(' | head -32
fi
