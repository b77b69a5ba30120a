# shellcheck shell=bash
# Where a pod's process, logs and token are, for the node agent (default) and for real
# nodes (H3I_NODE_MODE=real from `scripts/cluster.sh env`, scripts/cluster-nodes.sh).
# Sourced by tests/cluster/coexist.sh after `eval "$(scripts/cluster.sh env)"`.
# The agent keeps pid, log and kubeconfig files under $H3I_POD_LOGS/NS/POD; a real kubelet
# runs containers (found through containerd's cgroups) and keeps logs under its own
# podLogsDir, and mounts the ServiceAccount token into the container.

pods_real() { [[ ${H3I_NODE_MODE:-agent} == real ]]; }

# image_source: how the project's image reaches a pod, for step titles.
image_source() {
    if pods_real; then echo "the OCI image of the static binary, pulled by containerd from the authenticated registry"; else echo "the local binary through the node agent"; fi
}

# pod_exe: the executable a pod of the project's image runs.
pod_exe() { if pods_real; then echo /h3-ingress; else echo "$H3I_BINARY"; fi; }

# pod_pid NS POD CONTAINER: the container's main process.
pod_pid() {
    if ! pods_real; then
        cat "$H3I_POD_LOGS/$1/$2/$3.pid"
        return
    fi
    local id
    id=$(kubectl -n "$1" get pod "$2" -o jsonpath="{.status.containerStatuses[?(@.name==\"$3\")].containerID}")
    id=${id#containerd://}
    [[ -n $id ]] || return 1
    # runc names the container's cgroups after its ID; the lowest pid in them is init.
    grep -l -- "$id" /proc/[0-9]*/cgroup 2>/dev/null | cut -d/ -f3 | sort -n | head -1 || true
}

# pod_logs NS POD CONTAINER: the container's log files (the kubelet keeps the current and
# the previous instance's, the agent one file for all).
pod_logs() {
    if ! pods_real; then
        echo "$H3I_POD_LOGS/$1/$2/$3.log"
        return
    fi
    local node uid
    read -r node uid <<<"$(kubectl -n "$1" get pod "$2" -o jsonpath='{.spec.nodeName} {.metadata.uid}')"
    ls "$H3I_NODE_LIB/$node/pods/${1}_${2}_$uid/$3/"*.log
}

# pod_kubeconfig NS POD PID OUT: prints a kubeconfig with the pod's ServiceAccount token (the
# agent's own file; for a real node OUT, written from the token mounted in the container).
pod_kubeconfig() {
    if ! pods_real; then
        echo "$H3I_POD_LOGS/$1/$2/kubeconfig"
        return
    fi
    local sa=/proc/$3/root/var/run/secrets/kubernetes.io/serviceaccount kc=$4
    KUBECONFIG=$kc kubectl config set-cluster pod --server "$H3I_APISERVER" --certificate-authority "$sa/ca.crt" --embed-certs >/dev/null
    KUBECONFIG=$kc kubectl config set-credentials pod --token "$(cat "$sa/token")" >/dev/null
    KUBECONFIG=$kc kubectl config set-context pod --cluster pod --user pod >/dev/null
    KUBECONFIG=$kc kubectl config use-context pod >/dev/null
    echo "$kc"
}

# pull_secret_args NS: on real nodes, creates Secret regcred in NS with the cluster
# registry's credentials and prints the helm flag naming it (the agent never pulls: nothing).
pull_secret_args() {
    pods_real || return 0
    kubectl -n "$1" create secret docker-registry regcred --docker-server=registry.h3i.test \
        --docker-username="$H3I_REGISTRY_USER" --docker-password="$(cat "$H3I_REGISTRY_PASSWORD_FILE")" >/dev/null
    echo "--set=imagePullSecrets[0].name=regcred"
}
