#!/usr/bin/env bash
# A private OCI registry for the tests (root): CNCF distribution's own `registry` binary
# (github.com/distribution/distribution/v3, pinned in tests/cluster/registry/go.mod), built once
# into a cache, serving HTTPS with a test CA and refusing everything without a user and password
# (htpasswd, bcrypt). The project's image is pushed to it by scripts/image/distclient.py, and
# nodes pull it with the chart's imagePullSecrets.
#
#   scripts/registry.sh build            build (or find in the cache) the registry binary
#   scripts/registry.sh start            build, make CA/cert/htpasswd once, start; no-op when up
#   scripts/registry.sh stop             stop it (data and credentials stay for the next start)
#   scripts/registry.sh status           exit 0 when it answers /v2/ with 401 (auth required)
#   scripts/registry.sh push [OCI_DIR] [REPO:TAG]
#                                        start, push an OCI layout (default target/image/oci,
#                                        made by scripts/image.sh; REPO:TAG from its index)
#   scripts/registry.sh verify [REPO:TAG]
#                                        unauthenticated pull refused with 401, wrong password
#                                        refused with 401, authenticated pull of manifest,
#                                        config and layers matches the local layout
#   scripts/registry.sh env              shell lines: REGISTRY, REGISTRY_USER,
#                                        REGISTRY_PASSWORD, REGISTRY_CA
#   scripts/registry.sh dockerconfigjson the .dockerconfigjson of an imagePullSecret for it
#   scripts/registry.sh hosts-toml       containerd's certs.d/HOST:PORT/hosts.toml (the test CA)
#   scripts/registry.sh clean            stop and remove state (data, PKI, credentials)
#
# Environment: H3I_REGISTRY_ADDR (default 127.0.0.1:5443), H3I_CLUSTER_CACHE (default
# /var/cache/h3-ingress, shared with scripts/cluster.sh), H3I_REGISTRY_STATE (default
# /run/h3i-registry).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ADDR=${H3I_REGISTRY_ADDR:-127.0.0.1:5443}
CACHE=${H3I_CLUSTER_CACHE:-/var/cache/h3-ingress}
STATE=${H3I_REGISTRY_STATE:-/run/h3i-registry}
SRC=$REPO/tests/cluster/registry
USER_NAME=h3i-puller
LAYOUT_DEFAULT=$REPO/target/image/oci

log() { printf 'registry: %s\n' "$*" >&2; }
die() { printf 'registry: ERROR: %s\n' "$*" >&2; exit 1; }
command -v go >/dev/null || die "no go on PATH (Go 1.26 builds the registry)"

# The cache key hashes the module files and the Go version, as scripts/cluster.sh does: a
# version bump in go.mod or a new Go builds into a new directory, never over a running binary.
reg_key() { (cd "$SRC" && cat go.mod go.sum; go version) | sha256sum | cut -c1-12; }
REG_DIR=$CACHE/registry-$(reg_key)
REG_BIN=$REG_DIR/registry

cmd_build() {
    mkdir -p "$CACHE"
    exec 8>"$CACHE/.build.lock"
    flock 8
    if [[ -f $REG_DIR/.complete ]]; then
        log "cached in $REG_BIN"
        flock -u 8
        return
    fi
    export GOMODCACHE=$CACHE/gomod GOCACHE=$CACHE/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local
    local t0 t1 t2
    t0=$(date +%s)
    (cd "$SRC" && go mod download)
    t1=$(date +%s)
    log "building github.com/distribution/distribution/v3/cmd/registry"
    mkdir -p "$REG_DIR.tmp"
    (cd "$SRC" && nice -n 10 go build -trimpath -ldflags='-s -w' -o "$REG_DIR.tmp/registry" \
        github.com/distribution/distribution/v3/cmd/registry)
    t2=$(date +%s)
    rm -rf "$REG_DIR" && mv "$REG_DIR.tmp" "$REG_DIR"
    printf 'download_seconds=%s\nbuild_seconds=%s\nbuilt_at=%s\nnproc=%s\nloadavg_after=%s\n' \
        $((t1 - t0)) $((t2 - t1)) "$(date -u +%FT%TZ)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" \
        >"$REG_DIR/build-info"
    touch "$REG_DIR/.complete"
    log "built in $((t2 - t0)) s (download $((t1 - t0)) s, compile $((t2 - t1)) s): $REG_BIN"
    flock -u 8
}

# ---- state: CA, certificate, credentials, config (made once; kept across stop/start) -----
make_pki() {
    local d=$STATE/pki host=${ADDR%:*}
    # A new address needs a certificate naming it; the CA stays, so nodes' trust stays valid.
    [[ -f $d/registry.crt && $(cat "$d/host" 2>/dev/null) == "$host" ]] && return
    mkdir -p "$d" && chmod 700 "$d"
    if [[ ! -f $d/ca.crt ]]; then
        openssl ecparam -name prime256v1 -genkey -noout -out "$d/ca.key" 2>/dev/null
        openssl req -x509 -new -key "$d/ca.key" -subj "/CN=h3i-registry-ca" -days 30 -sha256 \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out "$d/ca.crt" 2>/dev/null
    fi
    openssl ecparam -name prime256v1 -genkey -noout -out "$d/registry.key" 2>/dev/null
    openssl req -new -key "$d/registry.key" -subj "/CN=h3i-registry" -out "$d/registry.csr" 2>/dev/null
    # The address the nodes pull from must be in the certificate: containerd verifies it.
    local san="DNS:localhost,IP:127.0.0.1"
    if [[ $host =~ ^[0-9.]+$ ]]; then
        [[ $host == 127.0.0.1 ]] || san+=",IP:$host"
    elif [[ $host != localhost ]]; then
        san+=",DNS:$host"
    fi
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=%s\n' \
        "$san" >"$d/registry.ext"
    openssl x509 -req -in "$d/registry.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$d/registry.ext" -out "$d/registry.crt" 2>/dev/null
    rm -f "$d/registry.csr" "$d/registry.ext"
    echo "$host" >"$d/host"
}

make_credentials() {
    [[ -s $STATE/htpasswd ]] && return
    (umask 077 && openssl rand -hex 16 >"$STATE/password")
    # bcrypt: the only hash distribution's htpasswd access controller accepts.
    python3 - "$USER_NAME" "$STATE/password" "$STATE/htpasswd" <<'PY'
import sys
import bcrypt
user, pw_file, out = sys.argv[1:]
pw = open(pw_file).read().strip().encode()
open(out, "w").write(f"{user}:{bcrypt.hashpw(pw, bcrypt.gensalt(rounds=10)).decode()}\n")
PY
    chmod 600 "$STATE/htpasswd"
}

write_config() {
    # http.secret signs upload state between requests; kept in the state dir so a restart
    # keeps half-done uploads valid.
    [[ -s $STATE/http-secret ]] || (umask 077 && openssl rand -hex 32 >"$STATE/http-secret")
    cat >"$STATE/config.yml" <<YML
version: 0.1
log:
  level: info
  formatter: text
storage:
  filesystem:
    rootdirectory: $STATE/data
  delete:
    enabled: true
http:
  addr: $ADDR
  secret: $(cat "$STATE/http-secret")
  tls:
    certificate: $STATE/pki/registry.crt
    key: $STATE/pki/registry.key
    minimumtls: tls1.2
auth:
  htpasswd:
    realm: h3i-registry
    path: $STATE/htpasswd
YML
    chmod 600 "$STATE/config.yml"
}

# ---- process ------------------------------------------------------------------------------
pid() { [[ -f $STATE/registry.pid ]] && cat "$STATE/registry.pid"; }
alive() { local p; p=$(pid) && [[ -n $p ]] && kill -0 "$p" 2>/dev/null; }

# 401 with a Basic challenge on /v2/ is the healthy answer: up, TLS valid, auth enforced.
answering() {
    local hdr
    [[ -f $STATE/pki/ca.crt ]] || return 1
    hdr=$(curl -s -o /dev/null -D - --cacert "$STATE/pki/ca.crt" "https://$ADDR/v2/" 2>/dev/null) || return 1
    grep -q '^HTTP/[0-9.]* 401' <<<"$hdr" && grep -qi '^www-authenticate: Basic' <<<"$hdr"
}

cmd_start() {
    cmd_build
    mkdir -p "$STATE/data" && chmod 700 "$STATE"
    if alive && answering; then
        log "already running (pid $(pid)) on https://$ADDR"
        return
    fi
    cmd_stop
    make_pki
    make_credentials
    write_config
    # No OpenTelemetry collector here: without this the registry exports traces to
    # localhost:4318 and logs a failure for each.
    OTEL_TRACES_EXPORTER=none setsid "$REG_BIN" serve "$STATE/config.yml" \
        >>"$STATE/registry.log" 2>&1 </dev/null &
    echo $! >"$STATE/registry.pid"
    local _
    for _ in $(seq 1 100); do
        answering && { log "running (pid $(pid)) on https://$ADDR, user $USER_NAME"; return; }
        alive || break
        sleep 0.1
    done
    tail -20 "$STATE/registry.log" >&2
    die "registry did not come up on https://$ADDR"
}

cmd_stop() {
    if alive; then
        kill "$(pid)"
        local _
        for _ in $(seq 1 50); do alive || break; sleep 0.1; done
        if alive; then kill -9 "$(pid)"; fi
        log "stopped"
    fi
    rm -f "$STATE/registry.pid"
}

client() { python3 "$REPO/scripts/image/distclient.py" "$@" --registry "$ADDR" --cacert "$STATE/pki/ca.crt"; }

cmd_push() {
    local layout=${1:-$LAYOUT_DEFAULT} ref=${2:-}
    [[ -f $layout/index.json ]] || die "$layout is not an OCI layout (scripts/image.sh makes target/image/oci)"
    cmd_start
    client push --layout "$layout" ${ref:+--ref "$ref"} --user "$USER_NAME" --password-file "$STATE/password"
}

cmd_verify() {
    local ref=${1:-} wrong
    answering || die "not running (scripts/registry.sh start)"
    echo "# no credentials"
    client denied --layout "$LAYOUT_DEFAULT" ${ref:+--ref "$ref"}
    echo "# $USER_NAME with a wrong password"
    wrong=$(mktemp)
    echo "not-$(cat "$STATE/password")" >"$wrong"
    client denied --layout "$LAYOUT_DEFAULT" ${ref:+--ref "$ref"} --user "$USER_NAME" --password-file "$wrong"
    rm -f "$wrong"
    echo "# $USER_NAME with the password"
    client pull --layout "$LAYOUT_DEFAULT" ${ref:+--ref "$ref"} --user "$USER_NAME" --password-file "$STATE/password"
}

cmd_env() {
    [[ -s $STATE/password ]] || die "no credentials yet (scripts/registry.sh start)"
    printf 'REGISTRY=%s\nREGISTRY_USER=%s\nREGISTRY_PASSWORD=%s\nREGISTRY_CA=%s\n' \
        "$ADDR" "$USER_NAME" "$(cat "$STATE/password")" "$STATE/pki/ca.crt"
}

# The .dockerconfigjson of a kubernetes.io/dockerconfigjson Secret for the chart's
# imagePullSecrets, what `kubectl create secret docker-registry` writes.
cmd_dockerconfigjson() {
    [[ -s $STATE/password ]] || die "no credentials yet (scripts/registry.sh start)"
    python3 - "$ADDR" "$USER_NAME" "$STATE/password" <<'PY'
import base64, json, sys
addr, user, pw_file = sys.argv[1:]
pw = open(pw_file).read().strip()
auth = base64.b64encode(f"{user}:{pw}".encode()).decode()
print(json.dumps({"auths": {addr: {"username": user, "password": pw, "auth": auth}}}))
PY
}

# containerd's registry host config (config_path/<HOST:PORT>/hosts.toml): trust the test CA for
# this registry only, instead of adding it to the node's system roots.
cmd_hosts_toml() {
    printf 'server = "https://%s"\n\n[host."https://%s"]\n  capabilities = ["pull", "resolve"]\n  ca = "%s"\n' \
        "$ADDR" "$ADDR" "$STATE/pki/ca.crt"
}

case ${1:-} in
    build) cmd_build ;;
    dockerconfigjson) cmd_dockerconfigjson ;;
    hosts-toml) cmd_hosts_toml ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status)
        if answering; then log "running (pid $(pid)) on https://$ADDR, auth required"
        else log "not answering on https://$ADDR"; exit 1; fi ;;
    push) shift; cmd_push "$@" ;;
    verify) shift; cmd_verify "$@" ;;
    env) cmd_env ;;
    clean) cmd_stop; rm -rf "$STATE" ;;
    *) die "usage: $0 build|start|stop|status|push [OCI_DIR] [REPO:TAG]|verify [REPO:TAG]|env|dockerconfigjson|hosts-toml|clean" ;;
esac
