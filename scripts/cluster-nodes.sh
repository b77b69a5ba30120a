# shellcheck shell=bash
# Real nodes for scripts/cluster.sh (H3I_NODES=real), sourced by it: in each node's network
# namespace containerd (overlayfs, runc, cgroupfs on cgroup v1), the real kubelet registered
# with the node's client certificate, and kube-proxy (nftables mode); pods on a CNI bridge
# inside the node netns with a pod CIDR per node. The settings this machine needs are
# explained in docs/real-nodes-notes.md (failCgroupV1, a pre-made cgroupRoot with cpuset,
# restrict_oom_score_adj, own runc root, netns under the state dir, nftables everywhere).
# The cluster DNS is CoreDNS (scripts/addons-build.sh), a Deployment in kube-system behind the
# Service kube-dns at the tenth address of each service CIDR, which the kubelets hand to pods.
# The default agent path of cluster.sh calls nothing from here.
#
# Uses cluster.sh's globals (STATE, NODES, NET4, NET6, HOST4, HOST6, BRIDGE, CACHE, REPO,
# APISERVER_PORT, KUBELET_PORT, SERVICE_CIDRS) and helpers (log, die, start, stop, alive,
# wait_for, mkcert, write_kubeconfig, kubectl_admin).

INSTANCE=$(basename "$STATE")
# Persistent per-node data (containerd root, kubelet root) on disk, not on /run's tmpfs.
RN_LIB=${H3I_CLUSTER_NODE_LIB:-/var/lib/$INSTANCE}
CG_CONTROLLERS=(blkio cpu cpuacct cpuset devices freezer memory pids systemd)
# The registry of this instance, reachable from the nodes on the bridge address.
RN_REGISTRY_ADDR=${H3I_REGISTRY_ADDR:-$HOST4:5443}
RN_REGISTRY_STATE=${H3I_REGISTRY_STATE:-$STATE-registry}
RN_REGISTRY_NAME=registry.h3i.test

rn_bin() { "$REPO/scripts/nodes-build.sh" bin; }
# (the path only: the cache key of the binaries; rn_build builds them when missing)
RN_BIN=$(rn_bin)
rn_lib() { echo "$RN_LIB/$1"; }
rn_run() { echo "$STATE/nodes/$1"; }
rn_sock() { echo "$(rn_run "$1")/containerd/containerd.sock"; }
rn_cgroot() { echo "/$INSTANCE-$1"; }
# Pod CIDRs: 10.79.101.0/24 and fd79:0:0:101::/64 for node index 0, ...
rn_pod4() { echo "${NET4%.*}.$(($1 + 101)).0/24"; }
rn_pod6() { echo "${NET6}0:0:$(($1 + 101))::/64"; }
rn_ctr() {
    "$RN_BIN/ctr" --address "$(rn_sock "$1")" -n k8s.io "${@:2}" 2> >(grep -v 'DEPRECATION: The support for cgroup v1' >&2)
}
rn_components() {
    local ns
    for ns in "${NODES[@]}"; do echo "containerd-$ns kubelet-$ns kube-proxy-$ns"; done
}

rn_build() {
    "$REPO/scripts/nodes-build.sh" >/dev/null
    RN_BIN=$(rn_bin)
    "$REPO/scripts/addons-build.sh" coredns >/dev/null
}

# The cluster DNS Service's addresses: the tenth of each service CIDR (10.96.0.10 and
# fd77:96::a by default), space-separated, IPv4 first as SERVICE_CIDRS lists it.
rn_dns_ips() {
    python3 -c 'import ipaddress, sys
print(" ".join(str(ipaddress.ip_network(c).network_address + 10) for c in sys.argv[1].split(",")))' "$SERVICE_CIDRS"
}

# kube-proxy's identity: the bootstrap ClusterRoleBinding system:node-proxier names it.
rn_make_pki() {
    local client='basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth'
    mkcert kube-proxy "/CN=system:kube-proxy" "$client"
}

# ---- network: pod CIDR routes on the host and between the node namespaces -----------------
rn_routes() {
    local i j ns
    for i in "${!NODES[@]}"; do
        ns=${NODES[$i]}
        # The pods' gateway is the node: it forwards between the pod bridge and eth0.
        ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1
        ip route replace "$(rn_pod4 "$i")" via "$(node_ip4 "$i")" dev "$BRIDGE"
        ip -6 route replace "$(rn_pod6 "$i")" via "$(node_ip6 "$i")" dev "$BRIDGE"
        for j in "${!NODES[@]}"; do
            [[ $i == "$j" ]] && continue
            ip -n "$ns" route replace "$(rn_pod4 "$j")" via "$(node_ip4 "$j")" dev eth0
            ip -n "$ns" -6 route replace "$(rn_pod6 "$j")" via "$(node_ip6 "$j")" dev eth0
        done
    done
}

rn_cgroups() {
    local root=$1 c
    for c in "${CG_CONTROLLERS[@]}"; do
        [[ -d /sys/fs/cgroup/$c ]] && mkdir -p "/sys/fs/cgroup/$c$root"
    done
    # A new cgroup v1 cpuset has no CPUs and no memory nodes.
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset$root/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset$root/cpuset.mems"
}

# ---- configuration files ---------------------------------------------------------------------
rn_containerd_toml() {
    local ns=$1 lib run sock
    lib=$(rn_lib "$ns") run=$(rn_run "$ns") sock=$(rn_sock "$ns")
    cat <<EOF
version = 4
root = '$lib/containerd'
state = '$run/containerd'
imports = []
# NRI would listen on /var/run/nri/nri.sock; opt would install into /opt/containerd.
disabled_plugins = ['io.containerd.nri.v1.nri', 'io.containerd.internal.v1.opt']

[plugins]
  [plugins.'io.containerd.server.v1.grpc']
    address = '$sock'
  [plugins.'io.containerd.server.v1.ttrpc']
    address = '$sock.ttrpc'
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$RN_REGISTRY_NAME/pause:1'
    # certs.d/registry.h3i.test/hosts.toml sends pulls to this instance's registry.
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = '$lib/etc/certs.d'
  [plugins.'io.containerd.cri.v1.runtime']
    cdi_spec_dirs = []
    # No CAP_SYS_RESOURCE here: a negative oom_score_adj fails in runc init.
    restrict_oom_score_adj = true
    # Else the pods' netns files land in /run/netns, shared with every other instance.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RN_BIN/runc'
          SystemdCgroup = false
          # The default /run/containerd/runc is shared by every containerd on the host.
          Root = '$run/runc'
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['$RN_BIN/cni']
      conf_dir = '$lib/etc/cni'
      max_conf_num = 1
EOF
}

# The pod bridge lives inside the node netns; the node routes (no masquerade: the host and
# the other node route the pod CIDRs back). portmap: nftables, there is no iptables here.
rn_cni_conflist() {
    local i=$1 lib
    lib=$(rn_lib "${NODES[$i]}")
    cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$INSTANCE",
  "plugins": [
    {
      "type": "bridge", "bridge": "pods0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local",
               "ranges": [[{"subnet": "$(rn_pod4 "$i")"}], [{"subnet": "$(rn_pod6 "$i")"}]],
               "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}], "dataDir": "$lib/cni-ipam"}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "backend": "nftables"}
  ]
}
EOF
}

rn_kubelet_yaml() {
    local ns=$1
    cat <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Required on this cgroup v1 machine (the default true refuses to start).
failCgroupV1: false
cgroupDriver: cgroupfs
# Its own subtree, made before start: two kubelets sharing one delete each other's pods.
cgroupRoot: $(rn_cgroot "$ns")
containerRuntimeEndpoint: unix://$(rn_sock "$ns")
address: "::"
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $STATE/pki/kubelet.crt
tlsPrivateKeyFile: $STATE/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
podLogsDir: $(rn_lib "$ns")/pods
resolvConf: /etc/resolv.conf
failSwapOn: false
clusterDomain: cluster.local
# CoreDNS's Service kube-dns (rn_coredns): pods get it in their resolv.conf.
clusterDNS: [$(rn_dns_ips | sed 's/^/"/; s/ /", "/g; s/$/"/')]
# The root file system is shared by everything on this machine and often below the
# default 10-15 % free: no evictions or DiskPressure taint from it.
evictionHard: {memory.available: 50Mi, nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 99
imageGCLowThresholdPercent: 98
EOF
}

rn_kube_proxy_yaml() {
    local ns=$1
    cat <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: $ns
clientConnection: {kubeconfig: $(rn_lib "$ns")/kube-proxy.kubeconfig}
# One pair covering every node's pod CIDR (kube-proxy accepts no longer list).
clusterCIDR: ${NET4%.*}.96.0/19,${NET6}0:0:100::/56
# 0: leave the host-global conntrack table size and timeouts alone.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
}

rn_write_configs() {
    local i ns lib srv="https://$HOST4:$APISERVER_PORT"
    for i in "${!NODES[@]}"; do
        ns=${NODES[$i]}
        lib=$(rn_lib "$ns")
        mkdir -p "$lib/etc/cni" "$lib/etc/certs.d/$RN_REGISTRY_NAME" "$lib/kubelet" "$lib/pods" "$(rn_run "$ns")/containerd"
        rn_containerd_toml "$ns" >"$lib/etc/containerd.toml"
        rn_cni_conflist "$i" >"$lib/etc/cni/10-$INSTANCE.conflist"
        rn_kubelet_yaml "$ns" >"$lib/etc/kubelet.yaml"
        rn_kube_proxy_yaml "$ns" >"$lib/etc/kube-proxy.yaml"
        write_kubeconfig "$lib/kubelet.kubeconfig" "node-$ns" "$srv"
        write_kubeconfig "$lib/kube-proxy.kubeconfig" kube-proxy "$srv"
        rn_hosts_toml >"$lib/etc/certs.d/$RN_REGISTRY_NAME/hosts.toml"
    done
}

# registry.h3i.test is a name only: hosts.toml sends it to this instance's registry and
# trusts the registry's CA for it alone.
rn_hosts_toml() {
    printf 'server = "https://%s"\n\n[host."https://%s"]\n  capabilities = ["pull", "resolve"]\n  ca = "%s"\n' \
        "$RN_REGISTRY_ADDR" "$RN_REGISTRY_ADDR" "$RN_REGISTRY_STATE/pki/ca.crt"
}

# ---- images: busybox and the pause sandbox imported, the product image via the registry ----
rn_image_tars() {
    local d=$RN_LIB/images
    mkdir -p "$d"
    [[ -s $d/busybox.tar ]] || "$REPO/tests/cluster/nodes/oci-busybox.sh" "$d/busybox.tar"
    [[ -s $d/pause.tar ]] || "$REPO/tests/cluster/nodes/oci-busybox.sh" --pause "$d/pause.tar"
}

rn_import_images() {
    local ns=$1 img
    for img in busybox pause; do
        rn_ctr "$ns" images ls -q | grep -qx "$RN_REGISTRY_NAME/$img:1" && continue
        rn_ctr "$ns" images import --snapshotter overlayfs "$RN_LIB/images/$img.tar" >/dev/null
    done
    rn_import_addon "$ns" coredns >/dev/null
}

# rn_addon_image NAME: the add-on's image archive without its .oci.tar (.ref beside it).
# rn_addon_image_load NAME asks scripts/addons-build.sh once per run of cluster.sh (in the
# calling shell, not in a $(...)), for the later calls.
declare -A RN_ADDON_IMAGE=()
rn_addon_image_load() {
    local tar
    tar=$("$REPO/scripts/addons-build.sh" image "$1") || die "no image of $1 (scripts/addons-build.sh $1)"
    RN_ADDON_IMAGE[$1]=${tar%.oci.tar}
}
rn_addon_image() {
    [[ -n ${RN_ADDON_IMAGE[$1]:-} ]] || rn_addon_image_load "$1"
    echo "${RN_ADDON_IMAGE[$1]}"
}

# rn_import_addon NODE NAME: the image of an add-on of scripts/addons-build.sh
# (registry.h3i.test/NAME:VERSION, which the registry does not hold), unless the node has
# that name with the same digest. Prints the reference.
rn_import_addon() {
    local ns=$1 name=$2 tar ref digest
    tar=$(rn_addon_image "$name").oci.tar
    read -r ref digest <"${tar%.oci.tar}.ref"
    if [[ $(rn_ctr "$ns" images ls | awk -v r="$ref" '$1 == r {print $3}') != "$digest" ]]; then
        rn_ctr "$ns" images import --snapshotter overlayfs "$tar" >/dev/null
    fi
    echo "$ref"
}

# The names the smoke (h3i-scenarios smoke) uses (the agent maps any image to a local binary) as
# local images, so IfNotPresent never pulls: busybox:1.36.1 is the busybox image,
# ghcr.io/h3-ingress/h3-ingress:0.1.0 and h3-ingress:0.1.0 the product image (imported
# as registry.h3i.test/h3-ingress:VERSION-COMMIT; the chart's :APPVERSION is not imported,
# it comes from the registry with a pull secret). No `ctr images rm` of a name here: on a
# node that had pulled the same image, CRI then forgot the other names too and pulled.
rn_tag_images() {
    local ns=$1 tar=$STATE/image/h3-ingress.oci.tar name
    rn_ctr "$ns" images tag --force "$RN_REGISTRY_NAME/busybox:1" docker.io/library/busybox:1.36.1 >/dev/null
    [[ -f $tar ]] || return 0
    name=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["annotations"]["io.containerd.image.name"])' \
        "$STATE/image/oci/index.json")
    rn_ctr "$ns" images import --snapshotter overlayfs "$tar" >/dev/null
    rn_ctr "$ns" images tag --force "$name" ghcr.io/h3-ingress/h3-ingress:0.1.0 docker.io/library/h3-ingress:0.1.0 >/dev/null
}

# fds 8/9 are cluster.sh's locks: the registry daemon must not inherit them.
rn_registry() { H3I_REGISTRY_ADDR=$RN_REGISTRY_ADDR H3I_REGISTRY_STATE=$RN_REGISTRY_STATE "$REPO/scripts/registry.sh" "$@" 8>&- 9>&-; }

# The product image (scripts/image.sh of the static binary) in the registry as
# registry.h3i.test/h3-ingress:VERSION-COMMIT and :APPVERSION (the chart's default tag).
rn_push_image() {
    local bin=${H3I_IMAGE_BINARY:-$REPO/target/static/h3-ingress} out=$STATE/image app
    [[ -x $bin ]] || { log "warning: no $bin (scripts/build-static.sh): no product image in the registry"; return 0; }
    H3I_IMAGE_REPOSITORY=$RN_REGISTRY_NAME/h3-ingress H3I_IMAGE_OUT=$out "$REPO/scripts/image.sh" "$bin" >&2
    app=$(sed -n 's/^appVersion: "\(.*\)"$/\1/p' "$REPO/charts/h3-ingress/Chart.yaml")
    rn_registry push "$out/oci" >&2
    rn_registry push "$out/oci" "h3-ingress:$app" >&2
    local ns
    for ns in "${NODES[@]}"; do
        if alive "containerd-$ns"; then rn_tag_images "$ns"; fi
    done
}

# ---- processes ----------------------------------------------------------------------------
# innode NS CMD...: only the network namespace changes (nsenter --net, not ip netns exec),
# so the kubelet's volume mounts are visible to containerd and runc as on a real node.
# (start runs it with setsid, so a command, not a function: env, then nsenter execs.)
innode() { INNODE=(env "PATH=$RN_BIN:$PATH" nsenter "--net=/run/netns/$1"); }

rn_start_containerd() {
    local ns=$1
    alive "containerd-$ns" && return
    innode "$ns"
    start "containerd-$ns" "${INNODE[@]}" "$RN_BIN/containerd" --config "$(rn_lib "$ns")/etc/containerd.toml"
    wait_for "containerd on $ns" 30 rn_ctr "$ns" version
}

rn_start_kubelet() {
    local i=$1 ns=${NODES[$1]} lib
    lib=$(rn_lib "$ns")
    alive "kubelet-$ns" && return
    innode "$ns"
    start "kubelet-$ns" "${INNODE[@]}" "$RN_BIN/kubelet" --config "$lib/etc/kubelet.yaml" \
        --kubeconfig "$lib/kubelet.kubeconfig" --root-dir "$lib/kubelet" --hostname-override "$ns" \
        --node-ip "$(node_ip4 "$i"),$(node_ip6 "$i")" --v=1
}

rn_start_kube_proxy() {
    local ns=$1
    alive "kube-proxy-$ns" && return
    innode "$ns"
    start "kube-proxy-$ns" "${INNODE[@]}" "$RN_BIN/kube-proxy" --config "$(rn_lib "$ns")/etc/kube-proxy.yaml" --v=1
}

# start_agent's counterpart: everything of the real nodes, idempotent.
rn_start_nodes() {
    local i ns
    rn_addon_image_load coredns
    rn_registry start
    rn_push_image
    rn_image_tars
    rn_write_configs
    rn_routes
    for i in "${!NODES[@]}"; do
        ns=${NODES[$i]}
        rn_cgroups "$(rn_cgroot "$ns")"
        rn_start_containerd "$ns"
        rn_import_images "$ns"
        rn_tag_images "$ns"
        rn_start_kubelet "$i"
        rn_start_kube_proxy "$ns"
    done
    local t0
    t0=$(date +%s.%N)
    rn_coredns_apply
    log "cluster DNS: CoreDNS applied in $(rn_since "$t0") s"
    wait_for "nodes" 120 nodes_ready
    t0=$(date +%s.%N)
    wait_for "cluster DNS (CoreDNS Ready, kube-dns endpoints)" 90 rn_coredns_ready
    log "cluster DNS: Ready $(rn_since "$t0") s after the nodes"
}
rn_since() { python3 -c 'import sys, time; print(f"{time.time() - float(sys.argv[1]):.1f}")' "$1"; }

# ---- cluster DNS: CoreDNS in kube-system ---------------------------------------------------
# As kubeadm installs it (ServiceAccount, ClusterRole system:coredns with the reads of the
# kubernetes plugin, the Corefile ConfigMap, a Deployment of 2, Service kube-dns), with two
# differences: no `forward` and no `loop` (names outside cluster.local get SERVFAIL at
# once: the pod network is not masqueraded, so the machine's resolver is out of reach), and
# `log` (each query with its client, for tests). Its image is imported on every node.
rn_coredns_yaml() {
    local ips ref families="[IPv4]" policy=SingleStack csv
    read -r -a ips <<<"$(rn_dns_ips)"
    csv=$(printf '"%s", ' "${ips[@]}")
    ref=$(cut -d' ' -f1 "$(rn_addon_image coredns).ref")
    if ((${#ips[@]} > 1)); then families="[IPv4, IPv6]" policy=RequireDualStack; fi
    cat <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "system:coredns", labels: {kubernetes.io/bootstrapping: rbac-defaults}}
rules:
- {apiGroups: [""], resources: [services, pods, namespaces], verbs: [list, watch]}
- {apiGroups: [discovery.k8s.io], resources: [endpointslices], verbs: [list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "system:coredns", labels: {kubernetes.io/bootstrapping: rbac-defaults}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:coredns"}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:53 {
        errors
        log
        health {
            lameduck 5s
        }
        ready
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        prometheus :9153
        cache 30 {
            disable success cluster.local
            disable denial cluster.local
        }
        reload
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 2
  strategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1}}
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      priorityClassName: system-cluster-critical
      serviceAccountName: coredns
      dnsPolicy: Default
      nodeSelector: {kubernetes.io/os: linux}
      tolerations: [{key: CriticalAddonsOnly, operator: Exists}]
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
          - weight: 100
            podAffinityTerm:
              labelSelector: {matchLabels: {k8s-app: kube-dns}}
              topologyKey: kubernetes.io/hostname
      securityContext: {seccompProfile: {type: RuntimeDefault}}
      containers:
      - name: coredns
        image: $ref
        imagePullPolicy: IfNotPresent
        args: [-conf, /etc/coredns/Corefile]
        resources: {requests: {cpu: 50m, memory: 70Mi}, limits: {memory: 170Mi}}
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        - {name: metrics, containerPort: 9153, protocol: TCP}
        securityContext:
          allowPrivilegeEscalation: false
          capabilities: {add: [NET_BIND_SERVICE], drop: [ALL]}
          readOnlyRootFilesystem: true
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 60
          timeoutSeconds: 5
          failureThreshold: 5
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
          periodSeconds: 1
        volumeMounts: [{name: config-volume, mountPath: /etc/coredns, readOnly: true}]
      volumes:
      - name: config-volume
        configMap: {name: coredns, items: [{key: Corefile, path: Corefile}]}
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
  annotations: {prometheus.io/port: "9153", prometheus.io/scrape: "true"}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: "${ips[0]}"
  clusterIPs: [${csv%, }]
  ipFamilies: $families
  ipFamilyPolicy: $policy
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
  - {name: metrics, port: 9153, protocol: TCP}
EOF
}

rn_coredns_apply() {
    rn_coredns_yaml | kubectl_admin apply -f - >/dev/null
}

# Ready: every replica Ready and the Service's EndpointSlices list them (what kube-proxy
# programs; a pod's first query must not race it).
rn_coredns_ready() {
    local want ready eps
    want=$(kubectl_admin -n kube-system get deploy coredns -o jsonpath='{.spec.replicas}')
    ready=$(kubectl_admin -n kube-system get deploy coredns -o jsonpath='{.status.readyReplicas}')
    eps=$(kubectl_admin -n kube-system get endpointslices -l kubernetes.io/service-name=kube-dns \
        -o jsonpath='{range .items[*].endpoints[?(@.conditions.ready==true)]}x{end}')
    [[ -n $want && $ready == "$want" && ${#eps} -ge $want ]]
}

# Extra lines of `cluster.sh env`: the mode, and the registry's credentials for the tests'
# imagePullSecrets (kubectl create secret docker-registry --docker-server=registry.h3i.test).
rn_env() {
    printf 'export H3I_NODE_MODE=real\nexport H3I_NODE_LIB=%s\n' "$RN_LIB"
    printf 'export H3I_CLUSTER_DNS="%s"\n' "$(rn_dns_ips)"
    # The pods run the image's binary: tests that run the binary on the host too (the
    # kubectl plugin, version checks) must use that one (journey.sh's status columns
    # differed with a newer debug build).
    printf 'export H3I_BINARY=%s\n' "${H3I_IMAGE_BINARY:-$REPO/target/static/h3-ingress}"
    printf 'export H3I_REGISTRY_ADDR=%s\nexport H3I_REGISTRY_STATE=%s\n' "$RN_REGISTRY_ADDR" "$RN_REGISTRY_STATE"
    printf 'export H3I_REGISTRY_USER=h3i-puller\nexport H3I_REGISTRY_PASSWORD_FILE=%s\n' "$RN_REGISTRY_STATE/password"
}

# ---- teardown -----------------------------------------------------------------------------
# Stop the kubelet first (else it restarts what we kill), then every task of containerd,
# containerd itself and its shims, then the mounts, cgroups and directories it left.
rn_stop_node() {
    local ns=$1 id pid m c root sock
    sock=$(rn_sock "$ns")
    root=$(rn_cgroot "$ns")
    stop "kube-proxy-$ns"
    stop "kubelet-$ns" 20
    if alive "containerd-$ns"; then
        for id in $(rn_ctr "$ns" tasks ls -q 2>/dev/null); do rn_ctr "$ns" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true; done
    fi
    stop "containerd-$ns"
    # The shims of this containerd carry its socket on their command line.
    for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $sock" || true); do kill -9 "$pid" 2>/dev/null || true; done
    awk -v a="$(rn_run "$ns")/" -v b="$(rn_lib "$ns")/" 'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts |
        sort -r | while read -r m; do umount "$m" 2>/dev/null || umount -l "$m"; done
    # unified: the cgroup v2 hierarchy of this hybrid setup, where runc mirrors the paths.
    for c in "${CG_CONTROLLERS[@]}" unified; do
        [[ -d /sys/fs/cgroup/$c$root ]] || continue
        find "/sys/fs/cgroup/$c$root" -depth -type d -exec rmdir {} \; 2>/dev/null || true
        [[ -d /sys/fs/cgroup/$c$root ]] && log "down: /sys/fs/cgroup/$c$root still there (tasks left?)"
    done
    rm -rf "$(rn_lib "$ns")"
}

rn_stop_nodes() {
    local i ns
    RN_BIN=$(rn_bin)
    for ns in "${NODES[@]}"; do rn_stop_node "$ns"; done
    for i in "${!NODES[@]}"; do
        ip route del "$(rn_pod4 "$i")" 2>/dev/null || true
        ip -6 route del "$(rn_pod6 "$i")" 2>/dev/null || true
    done
    rn_registry clean >/dev/null 2>&1 || true
    rm -rf "$RN_LIB"
    # The shims make /run/containerd/s (and ctr its fifo dir) whatever the config says,
    # and a SIGKILLed shim leaves its socket there: all removed only when no containerd
    # and no shim runs on the host.
    if ! pgrep -x containerd >/dev/null && ! pgrep -f containerd-shim-runc-v2 >/dev/null; then
        local d
        find /run/containerd/s -maxdepth 1 -type s -delete 2>/dev/null || true
        for d in /run/containerd/s /run/containerd/fifo /run/containerd/runc /run/containerd; do rmdir "$d" 2>/dev/null || true; done
    fi
}
