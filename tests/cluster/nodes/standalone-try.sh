#!/usr/bin/env bash
# Feasibility check of a real node on this machine, without an API server (root): in a
# network namespace of its own, containerd (overlayfs, runc, cgroupfs on cgroup v1) runs
# a container from a locally assembled image, then a standalone kubelet (no kubeconfig)
# runs static pods from a directory through CRI and the CNI bridge plugin.
#
#   tests/cluster/nodes/standalone-try.sh up      build (cached), start, run the checks
#   tests/cluster/nodes/standalone-try.sh check   the checks again on a running setup
#   tests/cluster/nodes/standalone-try.sh down    stop everything it started, unmount,
#                                                 remove its netns, cgroups and state
#
# Everything is named after H3I_TRY (default h3i-try): netns $H3I_TRY, state
# /var/lib/$H3I_TRY and /run/$H3I_TRY, cgroup root /$H3I_TRY in each cgroup v1 hierarchy,
# pod logs /var/log/$H3I_TRY-pods. Addresses: node 10.78.255.1/24 on a veth pair inside
# the netns (no link to the host), pods 10.78.0.0/24 on bridge h3itry0. Ports (inside the
# netns): kubelet 10350, kubelet healthz 127.0.0.1:10358. Nothing of scripts/cluster.sh's
# (h3i-node-*, h3ic-br0, /run/h3i-cluster) is touched. See docs/real-nodes-notes.md.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
NAME=${H3I_TRY:-h3i-try}
NETNS=$NAME
LIB=/var/lib/$NAME
RUN=/run/$NAME
PODLOGS=/var/log/$NAME-pods
CGROOT=/$NAME
NODE_IP=10.78.255.1
POD_SUBNET=10.78.0.0/24
KUBELET_PORT=10350
HEALTHZ_PORT=10358
SOCK=$RUN/containerd/containerd.sock
CG_CONTROLLERS=(blkio cpu cpuacct cpuset devices freezer memory pids systemd)

log() { printf 'try: %s\n' "$*" >&2; }
die() { printf 'try: ERROR: %s\n' "$*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root"

BIN=$("$REPO/scripts/nodes-build.sh" bin)
ctr() { "$BIN/ctr" --address "$SOCK" -n k8s.io "$@" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2); }
innet() { nsenter --net="/run/netns/$NETNS" "$@"; }
alive() { [[ -f $RUN/$1.pid ]] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

# wait_for SECONDS WHAT CMD...: poll CMD every second.
wait_for() {
    local n=$1 what=$2
    shift 2
    for ((i = 0; i < n; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 1
    done
    die "timed out after $n s waiting for $what"
}

write_configs() {
    mkdir -p "$LIB/etc/cni" "$LIB/manifests" "$LIB/logs" "$LIB/kubelet" "$RUN/containerd" "$PODLOGS"
    # containerd: own root/state/sockets; the runc shim's state under $RUN too (default
    # /run/containerd/runc, shared by every containerd on the host) and the pods' netns
    # files under the state dir (default /run/netns, where `ip netns` lists them).
    cat >"$LIB/etc/containerd.toml" <<EOF
version = 4
root = '$LIB/containerd'
state = '$RUN/containerd'
imports = []
# NRI would listen on /var/run/nri/nri.sock; opt would install into /opt/containerd.
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.opt']

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '$SOCK'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '$SOCK.ttrpc'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'registry.h3i.test/pause:1'
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = []
    # No CAP_SYS_RESOURCE on this machine: a negative oom_score_adj (pause -998,
    # Guaranteed pods -997) fails in runc init; clamp to containerd's own (0).
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$BIN/runc'
          SystemdCgroup = false
          Root = '$RUN/runc'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$BIN/cni']
      conf_dir = '$LIB/etc/cni'
      max_conf_num = 1
EOF
    # CNI: a bridge inside the netns; no masquerade (the netns has no uplink) and the
    # nftables backend of portmap (Debian 12 here has nft but no iptables binary).
    cat >"$LIB/etc/cni/10-$NAME.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NAME",
  "plugins": [
    {
      "type": "bridge", "bridge": "h3itry0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_SUBNET"}]],
               "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$LIB/cni-ipam"}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"}
  ]
}
EOF
    cat >"$LIB/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Required on this cgroup v1 machine (the default true refuses to start).
failCgroupV1: false
cgroupDriver: cgroupfs
# Its own subtree in every hierarchy: it must exist before the kubelet starts, and two
# kubelets on one host must not share one (each deletes pod cgroups it does not know).
cgroupRoot: $CGROOT
containerRuntimeEndpoint: unix://$SOCK
staticPodPath: $LIB/manifests
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $HEALTHZ_PORT
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
podLogsDir: $PODLOGS
resolvConf: /etc/resolv.conf
failSwapOn: false
EOF
}

write_pods() {
    # A pod on the CNI bridge, Guaranteed (limits only).
    cat >"$LIB/manifests/hello.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: hello, namespace: default}
spec:
  containers:
  - name: hello
    image: registry.h3i.test/busybox:1
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo hello from $(hostname); ip -4 addr show eth0; cat /proc/self/cgroup; while true; do date; sleep 5; done"]
    resources:
      limits: {memory: 64Mi, cpu: 200m}
EOF
    # A hostNetwork pod (as the h3-ingress data plane) with an HTTP readiness probe,
    # Burstable, and a container that exits 3 every time (CrashLoopBackOff).
    cat >"$LIB/manifests/web.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: default}
spec:
  hostNetwork: true
  containers:
  - name: httpd
    image: registry.h3i.test/busybox:1
    imagePullPolicy: Never
    command: ["/bin/busybox", "sh", "-c", "mkdir -p /www && echo ok-from-web > /www/index.html && exec /bin/busybox httpd -f -p $NODE_IP:18080 -h /www"]
    readinessProbe:
      httpGet: {host: $NODE_IP, port: 18080, path: /index.html}
      periodSeconds: 2
    resources:
      requests: {memory: 16Mi, cpu: 50m}
  - name: crasher
    image: registry.h3i.test/busybox:1
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "echo start; sleep 3; exit 3"]
EOF
    # Allocates 200 MB under a 32 Mi limit: the memory cgroup must OOM-kill it.
    cat >"$LIB/manifests/oom.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: oom, namespace: default}
spec:
  restartPolicy: Never
  containers:
  - name: eater
    image: registry.h3i.test/busybox:1
    imagePullPolicy: Never
    command: ["/bin/busybox", "dd", "if=/dev/zero", "of=/dev/null", "bs=200M", "count=1"]
    resources:
      limits: {memory: 32Mi}
EOF
}

setup_netns() {
    ip netns list | grep -qx "$NETNS\( .*\)\?" && return
    ip netns add "$NETNS"
    ip -n "$NETNS" link set lo up
    # No dummy driver in this kernel (modules off): a veth pair with both ends inside.
    ip -n "$NETNS" link add h3itry-node type veth peer name h3itry-peer
    ip -n "$NETNS" addr add "$NODE_IP/24" dev h3itry-node
    ip -n "$NETNS" link set h3itry-node up
    ip -n "$NETNS" link set h3itry-peer up
    ip -n "$NETNS" route add default via 10.78.255.254 dev h3itry-node onlink
}

setup_cgroups() {
    local c
    for c in "${CG_CONTROLLERS[@]}"; do
        [[ -d /sys/fs/cgroup/$c ]] || continue
        mkdir -p "/sys/fs/cgroup/$c$CGROOT"
    done
    # cgroup v1 cpuset: a new cgroup starts with no CPUs and no memory nodes.
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$CGROOT/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$CGROOT/cpuset.mems"
}

start_containerd() {
    alive containerd && return
    log "containerd: starting in netns $NETNS"
    # nohup and nsenter exec, so $! is containerd's pid; cwd / so it holds no directory.
    cd /
    PATH=$BIN:$PATH nohup nsenter --net="/run/netns/$NETNS" "$BIN/containerd" \
        --config "$LIB/etc/containerd.toml" --log-level info </dev/null >>"$LIB/logs/containerd.log" 2>&1 &
    echo $! >"$RUN/containerd.pid"
    wait_for 30 "containerd's socket" ctr version
    ctr plugins ls | awk '$1 == "io.containerd.snapshotter.v1" {print "try: snapshotter " $2 ": " $4}' >&2
}

import_images() {
    local img
    for img in busybox pause; do
        ctr images ls -q | grep -qx "registry.h3i.test/$img:1" && continue
        [[ -f $LIB/$img.tar ]] || {
            if [[ $img == pause ]]; then
                "$REPO/tests/cluster/nodes/oci-busybox.sh" --pause "$LIB/$img.tar"
            else
                "$REPO/tests/cluster/nodes/oci-busybox.sh" "$LIB/$img.tar"
            fi
        }
        ctr images import --snapshotter overlayfs "$LIB/$img.tar" >&2
    done
}

check_runc() {
    log "runc: one container straight from ctr (overlayfs, cgroupfs under $CGROOT/ctr)"
    local out
    out=$(ctr run --rm --snapshotter overlayfs --cgroup "$CGROOT/ctr/try-runc" \
        --runc-binary "$BIN/runc" --runc-root "$RUN/runc" \
        registry.h3i.test/busybox:1 try-runc /bin/sh -c 'echo runc-ok; grep memory /proc/self/cgroup; grep " / " /proc/mounts')
    printf '%s\n' "$out" | sed 's/^/try:   /' >&2
    grep -q runc-ok <<<"$out" || die "the runc container did not run"
}

start_kubelet() {
    alive kubelet && return
    log "kubelet: starting (standalone, static pods from $LIB/manifests)"
    cd /
    PATH=$BIN:$PATH nohup nsenter --net="/run/netns/$NETNS" "$BIN/kubelet" \
        --config "$LIB/etc/kubelet.yaml" --root-dir "$LIB/kubelet" --hostname-override "$NAME" \
        --node-ip "$NODE_IP" --v=2 </dev/null >>"$LIB/logs/kubelet.log" 2>&1 &
    echo $! >"$RUN/kubelet.pid"
    wait_for 60 "kubelet /healthz" innet curl -sf "http://127.0.0.1:$HEALTHZ_PORT/healthz"
}

pods_json() { innet curl -sfk "https://$NODE_IP:$KUBELET_PORT/pods"; }

# pod_state POD CONTAINER: phase/state/reason/restarts/ready as the kubelet reports them.
pod_state() {
    pods_json | python3 -c '
import json, sys
pod, ctr = sys.argv[1], sys.argv[2]
for p in json.load(sys.stdin)["items"]:
    if p["metadata"]["name"] != pod:
        continue
    for c in p["status"].get("containerStatuses", []):
        if c["name"] == ctr:
            st = c.get("state", {})
            k = next(iter(st), "none")
            print(p["status"].get("phase"), k, st.get(k, {}).get("reason", ""),
                  c.get("restartCount", 0), "ready" if c.get("ready") else "notready")
' "$1-$NAME" "$2"
}
state_has() { pod_state "$1" "$2" | grep -q -- "$3"; }
restarted() { [[ $(pod_state "$1" "$2" | cut -d' ' -f4) -ge 1 ]]; }

check() {
    log "checks:"
    wait_for 60 "pod hello running" state_has hello hello "Running running"
    log "  hello: $(pod_state hello hello) on $(grep -m1 -o 'inet 10.78.0.[0-9]*' "$PODLOGS"/default_hello-"$NAME"_*/hello/0.log)"
    wait_for 60 "web/httpd ready" state_has web httpd "running .* ready"
    log "  web/httpd: $(pod_state web httpd), answers: $(innet curl -sf "http://$NODE_IP:18080/index.html")"
    wait_for 60 "web/crasher restarted" restarted web crasher
    log "  web/crasher: $(pod_state web crasher)"
    wait_for 60 "oom/eater OOMKilled" state_has oom eater OOMKilled
    log "  oom/eater: $(pod_state oom eater)"
    local p
    p=$(cgpath memory hello)
    log "  hello's memory limit $(cat "$p/memory.limit_in_bytes"), cpu quota $(cat "$(cgpath cpu hello)/cpu.cfs_quota_us") us"
    log "  oom_score_adj: $(for t in $(ctr tasks ls | awk '$3 == "RUNNING" {print $2}'); do
        printf '%s=%s ' "$(tr '\0' ' ' </proc/"$t"/cmdline | cut -c1-20 | tr ' ' _)" "$(cat /proc/"$t"/oom_score_adj)"
    done)"
    log "  containers: $(ctr containers ls -q | wc -l), tasks running: $(ctr tasks ls | grep -c RUNNING)"
    log "all checks passed"
}

# cgpath CONTROLLER POD: the pod's cgroup directory (any QoS class).
cgpath() {
    local uid
    uid=$(pods_json | python3 -c 'import json,sys; print(next(p["metadata"]["uid"] for p in json.load(sys.stdin)["items"] if p["metadata"]["name"] == sys.argv[1]))' "$2-$NAME")
    find "/sys/fs/cgroup/$1$CGROOT/kubepods" -maxdepth 2 -type d -name "pod$uid" | head -1
}

stop_pid() { # NAME: SIGTERM, wait 30 s, SIGKILL
    local f=$RUN/$1.pid pid
    [[ -f $f ]] || return 0
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for ((i = 0; i < 30; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$f"
}

down() {
    if alive kubelet; then
        log "down: removing the static pods, waiting for the kubelet to stop them"
        rm -f "$LIB"/manifests/*.yaml
        for ((i = 0; i < 90; i++)); do
            [[ $(ctr tasks ls -q 2>/dev/null | wc -l) -eq 0 ]] && break
            sleep 1
        done
    fi
    stop_pid kubelet
    if alive containerd; then
        local id
        for id in $(ctr tasks ls -q); do ctr tasks kill -s SIGKILL "$id" || true; done
        sleep 1
        for id in $(ctr tasks ls -q); do ctr tasks rm -f "$id" || true; done
        for id in $(ctr containers ls -q); do ctr containers rm "$id" || true; done
    fi
    stop_pid containerd
    # Shims of this containerd (its socket is on their command line), by pid.
    local pid
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $SOCK" || true); do kill -9 "$pid" || true; done
    # Mounts (overlay rootfs, shm, netns files, kubelet volumes), deepest first.
    local m
    awk -v a="$RUN/" -v b="$LIB/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts | sort -r |
        while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    ip netns list | grep -qx "$NETNS\( .*\)\?" && ip netns del "$NETNS"
    local c d
    # unified: the cgroup v2 hierarchy of this hybrid setup, where runc mirrors the paths.
    for c in "${CG_CONTROLLERS[@]}" unified; do
        [[ -d /sys/fs/cgroup/$c$CGROOT ]] || continue
        find "/sys/fs/cgroup/$c$CGROOT" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [[ -d /sys/fs/cgroup/$c$CGROOT ]] && log "down: /sys/fs/cgroup/$c$CGROOT still there (tasks left?)"
    done
    rm -rf "$RUN" "$LIB" "$PODLOGS"
    # Created by the shim (sockets, /run/containerd/s) and ctr (fifo) whatever the config
    # says; removed only when empty and no other containerd runs.
    if ! pgrep -x containerd >/dev/null; then
        for d in /run/containerd/s /run/containerd/fifo /run/containerd/runc/pull /run/containerd/runc/k8s.io \
            /run/containerd/runc /run/containerd; do
            rmdir "$d" 2>/dev/null || true
        done
    fi
    log "down: done"
}

case ${1:-} in
up)
    [[ -f $BIN/.complete ]] || "$REPO/scripts/nodes-build.sh" >/dev/null
    write_configs
    write_pods
    setup_netns
    setup_cgroups
    start_containerd
    import_images
    check_runc
    start_kubelet
    check
    ;;
check) check ;;
down) down ;;
*) die "usage: $0 up|check|down" ;;
esac
