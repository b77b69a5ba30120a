#!/usr/bin/env bash
# Proves the test cluster of scripts/cluster.sh works end to end (root):
# control plane up, both nodes Ready, a hostNetwork DaemonSet of the project's image
# running the current binary on both nodes (env, volumes, readiness probe, pod
# ServiceAccount token), a Deployment pod in its own network namespace, container
# restarts, `kubectl logs`, Pod Security admission, an API server restart that the
# pods survive, and garbage collection of the pods when the DaemonSet goes.
#
#   tests/cluster/smoke.sh        H3I_SMOKE_KEEP=1 leaves the cluster up afterwards
#
# Without root it prints SKIPPED (and fails when H3I_TESTS_REQUIRE_ROOT=1).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/scripts/cluster.sh
NS=h3i-smoke
NS_RESTRICTED=h3i-smoke-restricted
T_START=$(date +%s)

step() { printf '\n--- [%3ss] %s\n' "$(($(date +%s) - T_START))" "$*"; }
ok() { printf '    ok: %s\n' "$*"; }
fail() {
    printf '\nSMOKE FAILED: %s\n' "$*" >&2
    if [[ -n ${H3I_CLUSTER_STATE:-} && -d ${H3I_CLUSTER_STATE:-/nonexistent} ]]; then
        echo "--- pods:" >&2
        kubectl get pods -A -o wide >&2 || true
        echo "--- agent or kubelet logs (last 30 lines):" >&2
        tail -n 30 "$H3I_CLUSTER_STATE"/logs/{h3i-node-agent,kubelet-*}.log >&2 || true
        local f
        for f in "$H3I_CLUSTER_STATE"/pods/*/*/*.log; do
            [[ -f $f ]] || continue
            echo "--- ${f#"$H3I_CLUSTER_STATE"/pods/} (last 10 lines):" >&2
            tail -n 10 "$f" >&2
        done
    fi
    exit 1
}
# until_ok SECONDS DESCRIPTION COMMAND...: poll every 0.5 s.
until_ok() {
    local secs=$1 what=$2 i; shift 2
    for ((i = 0; i < secs * 2; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    fail "$what (not within ${secs}s)"
}

if [[ $(id -u) -ne 0 ]]; then
    echo "SMOKE SKIPPED: tests/cluster/smoke.sh needs root (network namespaces, the cluster's processes)"
    [[ ${H3I_TESTS_REQUIRE_ROOT:-0} == 1 ]] && fail "H3I_TESTS_REQUIRE_ROOT=1 but not root"
    exit 0
fi

tmp=$(mktemp -d)
export H3I_BINARY=${H3I_BINARY:-$REPO/target/debug/h3-ingress}
if [[ ! -x $H3I_BINARY ]]; then
    step "building $H3I_BINARY"
    (cd "$REPO" && nice -n 10 cargo build --locked --bin h3-ingress)
fi

step "cluster up"
was_up=0
"$CLUSTER" status >/dev/null 2>&1 && was_up=1
t0=$(date +%s)
"$CLUSTER" up
UP_SECONDS=$(($(date +%s) - t0))
eval "$("$CLUSTER" env)"
ok "up took ${UP_SECONDS}s (cluster was already up: $was_up)"
cleanup() {
    rm -rf "$tmp"
    kubectl delete namespace "$NS" "$NS_RESTRICTED" --ignore-not-found --wait=false >/dev/null 2>&1 || true
    if [[ $was_up -eq 0 && ${H3I_SMOKE_KEEP:-0} != 1 ]]; then "$CLUSTER" down || true; fi
}
trap cleanup EXIT

# shellcheck source=tests/cluster/pods.sh
source "$REPO/tests/cluster/pods.sh"
REAL=0
pods_real && REAL=1
# Who runs the pods, for the step titles.
NODE_DAEMON=agent
[[ $REAL == 0 ]] || NODE_DAEMON=kubelet

step "node agent unit tests (go test, with the cluster's module and build cache)"
if ! (cd "$REPO/tests/cluster/agent" && GOMODCACHE=$H3I_CLUSTER_CACHE/gomod GOCACHE=$H3I_CLUSTER_CACHE/gocache \
    GOFLAGS=-mod=readonly GOTOOLCHAIN=local nice -n 10 go test -trimpath -count=1 -v ./... 2>&1) |
    grep -E '^(--- |ok|FAIL|PASS)' | sed 's/^/    /'; then
    fail "agent unit tests"
fi

step "up again is a no-op health check"
t0=$(date +%s)
"$CLUSTER" up 2>&1 | tee "$tmp/up2.log" | sed 's/^/    /'
grep -q 'already up and healthy' "$tmp/up2.log" || fail "second up did not report an existing healthy cluster"
ok "second up: $(($(date +%s) - t0))s"
"$CLUSTER" status | sed 's/^/    /' || fail "status reports a problem"

step "nodes Ready, labelled, with their namespace addresses"
read -r -a nodes <<<"$H3I_NODES"
read -r -a ips <<<"$H3I_NODE_IPS"
read -r -a ips6 <<<"$H3I_NODE_IPS6"
[[ ${#nodes[@]} -eq 2 ]] || fail "H3I_NODES should name two nodes: $H3I_NODES"
for i in 0 1; do
    n=${nodes[$i]}
    ready=$(kubectl get node "$n" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')
    os=$(kubectl get node "$n" -o jsonpath='{.metadata.labels.kubernetes\.io/os}')
    host=$(kubectl get node "$n" -o jsonpath='{.metadata.labels.kubernetes\.io/hostname}')
    addrs=$(kubectl get node "$n" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
    [[ $ready == True && $os == linux && $host == "$n" && $addrs == "${ips[$i]} ${ips6[$i]}" ]] ||
        fail "node $n: Ready=$ready os=$os hostname=$host InternalIP=$addrs"
    # (no `| grep -q` under pipefail: an early grep exit can SIGPIPE the writer)
    grep -q "inet ${ips[$i]}/" <<<"$(ip netns exec "$n" ip -o addr show dev eth0)" || fail "netns $n lacks ${ips[$i]}"
    ok "$n Ready, os=linux, InternalIP $addrs, lease $(kubectl -n kube-node-lease get lease "$n" -o jsonpath='{.spec.renewTime}')"
done

step "namespace (pod-security enforce=privileged), ServiceAccount, TLS Secret, ConfigMap"
# A previous run deletes its namespaces without waiting; a new one cannot create objects in a
# namespace that is still terminating.
kubectl wait --for=delete "namespace/$NS" "namespace/$NS_RESTRICTED" --timeout=120s >/dev/null 2>&1 || true
kubectl create namespace "$NS" --dry-run=client -o yaml |
    kubectl label --local -f - pod-security.kubernetes.io/enforce=privileged -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS" create serviceaccount smoke --dry-run=client -o yaml | kubectl apply -f - >/dev/null
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=smoke.h3i.test \
    -addext subjectAltName=DNS:smoke.h3i.test -keyout "$tmp/tls.key" -out "$tmp/tls.crt" 2>/dev/null
kubectl -n "$NS" create secret tls smoke-tls --cert "$tmp/tls.crt" --key "$tmp/tls.key" --dry-run=client -o yaml |
    kubectl apply -f - >/dev/null
cat >"$tmp/config.yaml" <<'EOF'
port: 8443
addresses: {ipv4: "0.0.0.0", ipv6: "::"}
upstream: {address: "127.0.0.1:9443"}
metrics: {address: "0.0.0.0:9476"}
hosts:
  - name: smoke.h3i.test
    certFile: /etc/h3i-smoke/tls/tls.crt
    keyFile: /etc/h3i-smoke/tls/tls.key
EOF
kubectl -n "$NS" create configmap smoke-config --from-file=config.yaml="$tmp/config.yaml" --dry-run=client -o yaml |
    kubectl apply -f - >/dev/null
ok "created"

step "DaemonSet: hostNetwork, image ghcr.io/h3-ingress/h3-ingress:0.1.0 = the current binary"
kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: smoke, namespace: $NS}
spec:
  selector: {matchLabels: {app: smoke}}
  template:
    metadata: {labels: {app: smoke}}
    spec:
      hostNetwork: true
      serviceAccountName: smoke
      terminationGracePeriodSeconds: 10
      initContainers:
        - name: prepare
          image: busybox:1.36.1
          command: ["sh", "-c", "echo prepared on \$(NODE_NAME) > /srv/h3i-smoke/prepared"]
          env: [{name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}]
          volumeMounts: [{name: work, mountPath: /srv/h3i-smoke}]
      containers:
        - name: proxy
          image: ghcr.io/h3-ingress/h3-ingress:0.1.0
          args: ["proxy", "--config", "/etc/h3i-smoke/config/config.yaml"]
          env:
            - {name: NODE_NAME, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
            - {name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
            - {name: HOST_IP, valueFrom: {fieldRef: {fieldPath: status.hostIP}}}
            - {name: MEMORY_LIMIT_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
            - {name: GREETING, value: "node=\$(NODE_NAME)"}
            - {name: RUST_LOG, value: info}
          resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 128Mi}}
          ports: [{name: metrics, containerPort: 9476}]
          readinessProbe: {httpGet: {path: /readyz, port: metrics}, periodSeconds: 2}
          livenessProbe: {httpGet: {path: /healthz, port: metrics}, periodSeconds: 5}
          volumeMounts:
            - {name: config, mountPath: /etc/h3i-smoke/config}
            - {name: tls, mountPath: /etc/h3i-smoke/tls}
            - {name: tmp, mountPath: /tmp}
            - {name: work, mountPath: /srv/h3i-smoke}
      volumes:
        - {name: config, configMap: {name: smoke-config}}
        - {name: tls, secret: {secretName: smoke-tls}}
        - {name: tmp, emptyDir: {medium: Memory}}
        - {name: work, emptyDir: {}}
EOF
ds_ready() {
    [[ $(kubectl -n "$NS" get ds smoke -o jsonpath='{.status.numberReady}') == 2 ]]
}
until_ok 90 "DaemonSet smoke: 2 pods Ready" ds_ready
declare -A POD_PID
api_host=${H3I_APISERVER#https://}
api_host=${api_host%:*}
# What the process should be: the agent runs H3I_BINARY with KUBECONFIG and the API
# server's address; a real kubelet runs the image's /h3-ingress with the kubernetes
# Service's ClusterIP and a mounted token.
exe=$H3I_BINARY
svc_host=$api_host
if [[ $REAL == 1 ]]; then
    exe=/h3-ingress
    svc_host=$(kubectl get svc kubernetes -o jsonpath='{.spec.clusterIP}')
fi
for i in 0 1; do
    n=${nodes[$i]}
    pod=$(kubectl -n "$NS" get pods -l app=smoke --field-selector spec.nodeName="$n" -o jsonpath='{.items[0].metadata.name}')
    [[ -n $pod ]] || fail "no smoke pod on $n"
    read -r phase ready podip hostip restarts <<<"$(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.phase} {.status.conditions[?(@.type=="Ready")].status} {.status.podIP} {.status.hostIP} {.status.containerStatuses[0].restartCount}')"
    [[ $phase == Running && $ready == True && $podip == "${ips[$i]}" && $hostip == "${ips[$i]}" && $restarts == 0 ]] ||
        fail "$pod: phase=$phase ready=$ready podIP=$podip hostIP=$hostip restarts=$restarts"
    dir=$H3I_POD_LOGS/$NS/$pod
    pid=$(pod_pid "$NS" "$pod" proxy)
    POD_PID[$pod]=$pid
    [[ $(readlink -f "/proc/$pid/exe") == $(readlink -f "$exe") ]] || fail "$pod runs $(readlink -f "/proc/$pid/exe"), not $exe"
    [[ $(ip netns identify "$pid") == "$n" ]] || fail "$pod (pid $pid) is not in netns $n"
    environ=$(tr '\0' '\n' <"/proc/$pid/environ")
    want_env=("NODE_NAME=$n" "POD_NAME=$pod" "POD_NAMESPACE=$NS" "POD_IP=${ips[$i]}" "HOST_IP=${ips[$i]}"
        "MEMORY_LIMIT_MI=128" "GREETING=node=$n" "KUBERNETES_SERVICE_HOST=$svc_host")
    [[ $REAL == 1 ]] || want_env+=("KUBECONFIG=$dir/kubeconfig")
    for kv in "${want_env[@]}"; do
        grep -qx -- "$kv" <<<"$environ" || fail "$pod: env lacks $kv"
    done
    [[ $(tr '\0' ' ' <"/proc/$pid/cmdline") == "$exe proxy --config /etc/h3i-smoke/config/config.yaml " ]] ||
        fail "$pod: cmdline $(tr '\0' ' ' <"/proc/$pid/cmdline")"
    [[ $(curl -s "http://${ips[$i]}:9476/readyz" -o /dev/null -w '%{http_code}') == 200 ]] || fail "$pod: /readyz on ${ips[$i]}:9476"
    prepared=$dir/volumes/work/prepared
    [[ $REAL == 0 ]] || prepared=/proc/$pid/root/srv/h3i-smoke/prepared
    grep -q "prepared on $n" "$prepared" || fail "$pod: init container output missing"
    ok "$pod on $n: Running, Ready, podIP=hostIP=${ips[$i]}, pid $pid in netns $n running $exe, env and volumes as specified, /readyz 200"
done

step "the pod's ServiceAccount token (TokenRequest bound to the pod) in its KUBECONFIG"
pod=$(kubectl -n "$NS" get pods -l app=smoke -o jsonpath='{.items[0].metadata.name}')
kc=$(pod_kubeconfig "$NS" "$pod" "${POD_PID[$pod]}" "$tmp/$pod.kubeconfig")
who=$(KUBECONFIG=$kc kubectl auth whoami -o jsonpath='{.status.userInfo.username} {.status.userInfo.extra.authentication\.kubernetes\.io/pod-name[0]}')
[[ $who == "system:serviceaccount:$NS:smoke $pod" ]] || fail "auth whoami with the pod kubeconfig: '$who'"
ok "kubectl auth whoami: $who"
[[ $(KUBECONFIG=$kc kubectl auth can-i list secrets -n "$NS") == no ]] || fail "the smoke ServiceAccount may list secrets?"
ok "and it holds no extra rights (cannot list secrets)"

step "container logs: files on the node and kubectl logs (the kubelet API, served by the $NODE_DAEMON)"
log_file=$(pod_logs "$NS" "$pod" proxy | tail -1)
[[ -s $log_file ]] || fail "$log_file is empty"
lines=$(kubectl -n "$NS" logs "$pod" -c proxy | wc -l)
[[ $lines -ge 1 ]] || fail "kubectl logs printed nothing"
ok "$log_file has $(wc -l <"$log_file") lines; kubectl logs returned $lines"

step "Deployment pod without hostNetwork: own network namespace and address, probed there"
kubectl apply -f - >/dev/null <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: $NS}
spec:
  replicas: 1
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      automountServiceAccountToken: false
      containers:
        - name: proxy
          image: h3-ingress:0.1.0
          args: ["proxy", "--config", "/etc/h3i-smoke/config/config.yaml"]
          readinessProbe: {httpGet: {path: /readyz, port: 9476}, periodSeconds: 2}
          volumeMounts:
            - {name: config, mountPath: /etc/h3i-smoke/config}
            - {name: tls, mountPath: /etc/h3i-smoke/tls}
      volumes:
        - {name: config, configMap: {name: smoke-config}}
        - {name: tls, secret: {secretName: smoke-tls}}
EOF
until_ok 60 "Deployment web available" kubectl -n "$NS" wait --for=condition=Available deploy/web --timeout=1s
web=$(kubectl -n "$NS" get pods -l app=web -o jsonpath='{.items[0].metadata.name}')
webip=$(kubectl -n "$NS" get pod "$web" -o jsonpath='{.status.podIP}')
webpid=$(pod_pid "$NS" "$web" proxy)
webns=$(ip netns identify "$webpid")
if [[ $REAL == 1 ]]; then
    # containerd keeps pod netns files under its state dir, so no name; not the node's.
    webnode=$(kubectl -n "$NS" get pod "$web" -o jsonpath='{.spec.nodeName}')
    [[ -z $webns && $(stat -L -c %i "/proc/$webpid/ns/net") != $(stat -L -c %i "/run/netns/$webnode") ]] ||
        fail "web pod: netns '$webns' is the node's"
    webns="(unnamed, not $webnode's)"
    [[ $webip != "${ips[0]}" && $webip != "${ips[1]}" ]] || fail "web pod: podIP $webip"
else
    [[ $webns == h3ic-p-* && $webip != "${ips[0]}" && $webip != "${ips[1]}" ]] || fail "web pod: netns '$webns' podIP $webip"
fi
[[ $(curl -s "http://$webip:9476/readyz" -o /dev/null -w '%{http_code}') == 200 ]] || fail "web /readyz on $webip"
webips=$(kubectl -n "$NS" get pod "$web" -o jsonpath='{.status.podIPs[*].ip}')
if [[ $REAL == 1 ]]; then
    [[ $webips == "$webip "*:* ]] || fail "web pod should be dual-stack, podIPs: $webips"
else
    [[ $webips == "$webip fd77::"* ]] || fail "web pod should be dual-stack, podIPs: $webips"
fi
grep -q '^KUBECONFIG=' <<<"$(tr '\0' '\n' <"/proc/$webpid/environ")" && fail "automountServiceAccountToken: false, yet KUBECONFIG is set"
ok "$web: podIPs $webips in netns $webns, Ready; no token and no KUBECONFIG (automountServiceAccountToken: false)"

step "a crashing container restarts with backoff (busybox image run as a host shell)"
kubectl -n "$NS" run crasher --image=busybox:1.36.1 --restart=Always --command -- sh -c 'echo "run at $(date +%s)"; exit 3' >/dev/null
restarted() { [[ $(kubectl -n "$NS" get pod crasher -o jsonpath='{.status.containerStatuses[0].restartCount}') -ge 2 ]]; }
until_ok 60 "crasher restarted twice" restarted
code=$(kubectl -n "$NS" get pod crasher -o jsonpath='{.status.containerStatuses[0].lastState.terminated.exitCode}')
[[ $code == 3 ]] || fail "crasher lastState exit code $code, want 3"
if [[ $REAL == 1 ]]; then
    # CRI log lines carry a timestamp and stream prefix. The kubelet's container GC keeps one
    # dead instance (and its log file) besides the current one, and may already have removed
    # the older ones: one run in the files, and the last finished run through the kubelet's
    # API. During the back-off this kubelet reports the finished instance as the container's
    # current state (terminated), while lastState names the one before, which the GC may have
    # removed ("unable to retrieve container logs"): the finished run is `kubectl logs` then,
    # and `kubectl logs --previous` once the state is waiting or running again.
    files_hold_run() { [[ $(pod_logs "$NS" crasher crasher | xargs cat | grep -c ' run at') -ge 1 ]]; }
    finished_run() {
        local state flags=(--previous)
        state=$(kubectl -n "$NS" get pod crasher -o jsonpath='{.status.containerStatuses[0].state}')
        [[ $state == *'"terminated"'* ]] && flags=()
        grep -q '^run at' <<<"$(kubectl -n "$NS" logs crasher "${flags[@]}")"
    }
    until_ok 30 "crasher log files hold a run" files_hold_run
    until_ok 30 "kubectl logs shows the last finished instance's run" finished_run
else
    [[ $(grep -c '^run at' "$H3I_POD_LOGS/$NS/crasher/crasher.log") -ge 3 ]] || fail "crasher log should hold 3 runs"
fi
# Now: waiting CrashLoopBackOff (the agent), or terminated Error during the back-off (a kubelet).
now=$(kubectl -n "$NS" get pod crasher -o jsonpath='{.status.containerStatuses[0].state.waiting.reason}{.status.containerStatuses[0].state.terminated.reason}')
ok "crasher: restartCount $(kubectl -n "$NS" get pod crasher -o jsonpath='{.status.containerStatuses[0].restartCount}'), lastState exit 3, now ${now:-running}"
kubectl -n "$NS" delete pod crasher --wait=false >/dev/null

step "Pod Security admission: a hostNetwork pod in a 'restricted' namespace is rejected"
kubectl create namespace "$NS_RESTRICTED" --dry-run=client -o yaml |
    kubectl label --local -f - pod-security.kubernetes.io/enforce=restricted -o yaml | kubectl apply -f - >/dev/null
if out=$(kubectl -n "$NS_RESTRICTED" run hostnet --image=h3-ingress:0.1.0 \
    --overrides='{"spec":{"hostNetwork":true}}' -- demo 2>&1); then
    fail "the restricted namespace accepted a hostNetwork pod: $out"
fi
if ! grep -q 'violates PodSecurity "restricted:latest"' <<<"$out" || ! grep -q 'hostNetwork=true' <<<"$out"; then
    fail "unexpected rejection: $out"
fi
ok "rejected: $(grep -o 'violates PodSecurity[^;]*host namespaces[^;]*' <<<"$out" | head -1)"

step "kube-apiserver restart: pods keep running, the $NODE_DAEMON catches up"
"$CLUSTER" restart-apiserver 3 2>&1 | sed 's/^/    /'
for pod in "${!POD_PID[@]}"; do
    kill -0 "${POD_PID[$pod]}" 2>/dev/null || fail "$pod's process died during the API server restart"
done
until_ok 60 "DaemonSet Ready after the restart" ds_ready
kubectl get nodes | sed 's/^/    /'
if [[ $REAL == 1 ]]; then
    # Real kubelets, kube-proxies and controllers reconnect with client-go back-off:
    # status may stay unhealthy a few seconds after /readyz (seen once, cause not isolated).
    until_ok 60 "status healthy after the restart" "$CLUSTER" status
else
    "$CLUSTER" status >/dev/null || fail "status unhealthy after the restart"
fi
ok "same processes (${POD_PID[*]}), nodes Ready, DaemonSet Ready"

step "the $NODE_DAEMON restores node and pod status that others overwrote (as the node-lifecycle controller does after a long outage)"
pod=$(kubectl -n "$NS" get pods -l app=smoke --field-selector spec.nodeName="${nodes[0]}" -o jsonpath='{.items[0].metadata.name}')
kubectl patch node "${nodes[0]}" --subresource=status \
    -p '{"status":{"conditions":[{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","message":"set by smoke.sh"}]}}' >/dev/null
kubectl -n "$NS" patch pod "$pod" --subresource=status \
    -p '{"status":{"conditions":[{"type":"Ready","status":"False","reason":"NodeNotReady","message":"set by smoke.sh"}]}}' >/dev/null
node_ready() { [[ $(kubectl get node "${nodes[0]}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
pod_ready() { [[ $(kubectl -n "$NS" get pod "$pod" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}') == True ]]; }
until_ok 30 "${nodes[0]} Ready again" node_ready
until_ok 30 "$pod Ready again" pod_ready
ok "${nodes[0]} and $pod were set Unknown/False, and are Ready=True again"

step "delete the DaemonSet: the garbage collector removes its pods, the $NODE_DAEMON stops the processes"
kubectl -n "$NS" delete ds smoke --wait=false >/dev/null
pods_gone() { [[ -z $(kubectl -n "$NS" get pods -l app=smoke -o name) ]]; }
until_ok 60 "smoke pods removed" pods_gone
for pod in "${!POD_PID[@]}"; do
    kill -0 "${POD_PID[$pod]}" 2>/dev/null && fail "$pod's process ${POD_PID[$pod]} still runs"
    if [[ $REAL == 1 ]]; then
        ok "$pod: process ${POD_PID[$pod]} gone"
        continue
    fi
    grep -q 'removed' "$H3I_POD_LOGS/$NS/$pod/_events.log" || fail "$pod: agent did not record the removal"
    ok "$pod: process ${POD_PID[$pod]} gone; $(grep -o 'container proxy exited with [0-9]* ([A-Za-z]*)' "$H3I_POD_LOGS/$NS/$pod/_events.log" | tail -1)"
done

step "done"
echo "SMOKE PASSED in $(($(date +%s) - T_START))s (cluster up: ${UP_SECONDS}s)"
