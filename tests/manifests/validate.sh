#!/usr/bin/env bash
# Validates, without an API server, everything the operator puts into a cluster:
#   1. every object `h3-ingress render` writes (DaemonSet, ServiceAccount, ClusterRole(Binding),
#      Role(Binding)s for a default and an "everything on" listener) and crds/*.yaml against the
#      upstream Kubernetes OpenAPI schemas with `kubernetes-validate --strict` (unknown fields fail);
#   2. the example Http3Listener objects against the CRD's own openAPIV3Schema (jsonschema).
# What it cannot check: admission (PodSecurity, RBAC escalation), CEL rules, defaulting, and
# anything the API server does at run time.
#
# Usage: tests/manifests/validate.sh [RENDER_DIR]   (default: target/rendered/operator, re-rendered)
set -euo pipefail

# Pinned: k8s-openapi 0.29 is built with feature `latest` = v1_37, and kubernetes-validate
# 1.37.0 (PyPI) bundles the upstream schemas up to 1.37.0.
K8S_VERSION=1.37.0
KUBERNETES_VALIDATE_VERSION=1.37.0

repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-$repo/target/rendered/operator}

if ! command -v kubernetes-validate >/dev/null; then
    echo "FAIL: kubernetes-validate not found; pip install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
    exit 2
fi
have=$(kubernetes-validate --version)
if [ "$have" != "$KUBERNETES_VALIDATE_VERSION" ]; then
    echo "FAIL: kubernetes-validate $have installed, $KUBERNETES_VALIDATE_VERSION expected" >&2
    exit 2
fi

if [ -z "${1:-}" ]; then
    # Always re-render the default directory so a stale copy can never be what passes.
    rm -rf "$dir"
    (cd "$repo" && cargo run -q -- render --out "$dir")
fi

mapfile -t objects < <(find "$dir" -mindepth 2 -name '*.yaml' | sort)
mapfile -t listeners < <(find "$dir" -maxdepth 1 -name 'http3listener-*.yaml' | sort)
if [ "${#objects[@]}" -eq 0 ] || [ "${#listeners[@]}" -eq 0 ]; then
    echo "FAIL: nothing rendered in $dir" >&2
    exit 1
fi

echo "== kubernetes-validate $have --strict -k $K8S_VERSION: ${#objects[@]} rendered objects + crds/"
kubernetes-validate --strict -k "$K8S_VERSION" "${objects[@]}" "$repo"/crds/*.yaml

echo "== example Http3Listeners against crds/ openAPIV3Schema: ${#listeners[@]} objects"
python3 - "$repo/crds/http3listeners.h3-ingress.dev.yaml" "${listeners[@]}" <<'PY'
import sys, yaml, jsonschema

def openapi_to_jsonschema(s):
    """OpenAPI v3 `nullable` is not JSON Schema; x-kubernetes-* keys are ignored by jsonschema."""
    if isinstance(s, dict):
        s = {k: openapi_to_jsonschema(v) for k, v in s.items()}
        if s.pop("nullable", False) and "type" in s:
            s["type"] = [s["type"], "null"]
        if s.get("x-kubernetes-int-or-string"):
            s.pop("type", None)
            s["anyOf"] = [{"type": "integer"}, {"type": "string"}]
        return s
    if isinstance(s, list):
        return [openapi_to_jsonschema(v) for v in s]
    return s

crd = yaml.safe_load(open(sys.argv[1]))
schema = openapi_to_jsonschema(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])

def no_unknown_fields(s):
    # What the API server prunes silently, this check refuses, so a typo in a builder shows.
    if isinstance(s, dict):
        s = {k: no_unknown_fields(v) for k, v in s.items()}
        if s.get("type") in ("object", ["object", "null"]) and "properties" in s \
                and "additionalProperties" not in s:
            s["additionalProperties"] = False
        return s
    if isinstance(s, list):
        return [no_unknown_fields(v) for v in s]
    return s

strict = no_unknown_fields(schema)
strict["properties"]["metadata"] = {"type": "object"}
strict["properties"]["apiVersion"] = {"const": "h3-ingress.dev/v1alpha1"}
strict["properties"]["kind"] = {"const": "Http3Listener"}
failed = 0
for path in sys.argv[2:]:
    obj = yaml.safe_load(open(path))
    errors = sorted(jsonschema.Draft7Validator(strict).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        failed += 1
        for e in errors:
            print(f"ERROR {path}: {'.'.join(map(str, e.path))}: {e.message}")
    else:
        print(f"INFO {path} passed against the Http3Listener schema")
sys.exit(1 if failed else 0)
PY
echo "OK: all rendered objects, crds/ and example listeners are valid"
