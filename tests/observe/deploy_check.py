#!/usr/bin/env python3
"""deploy/: `kubectl kustomize deploy/` (real kustomize, built into kubectl) and the examples,
validated like the chart's objects; the annotations in the examples are the ones the code reads."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import helmlib  # noqa: E402
import k8svalidate  # noqa: E402

ROOT = helmlib.ROOT
failures: list[str] = []


def main() -> int:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("FAIL deploy_check: kubectl (with built-in kustomize) not found; install the kubectl package")
        return 1
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True).stdout
    kustomize = re.search(r"Kustomize Version: (\S+)", version)
    p = subprocess.run([kubectl, "kustomize", str(ROOT / "deploy")], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"FAIL deploy_check: kubectl kustomize deploy/: {p.stderr}")
        return 1
    objs = [o for o in yaml.safe_load_all(p.stdout) if o]
    kinds = sorted(o["kind"] for o in objs)
    print(f"kubectl kustomize deploy/ (kustomize {kustomize.group(1) if kustomize else '?'}): {len(objs)} objects: {kinds}")
    want = {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "Role", "RoleBinding", "Deployment", "Service", "PriorityClass"}
    if set(kinds) != want:
        failures.append(f"kustomize output kinds {set(kinds)} != {want}")
    for o in objs:
        ns = o["metadata"].get("namespace")
        cluster_scoped = o["kind"] in {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                                       "PriorityClass"}
        # The certificate mirrors' Role and binding live in the hosts namespace, nothing else.
        home = "h3-ingress-hosts" if o["metadata"]["name"].endswith("-operator-hosts") else "h3-ingress"
        if not cluster_scoped and ns != home:
            failures.append(f"{o['kind']}/{o['metadata']['name']} is in namespace {ns!r}")
    namespaces = {o["metadata"]["name"] for o in objs if o["kind"] == "Namespace"}
    if namespaces != {"h3-ingress", "h3-ingress-hosts"}:
        failures.append(f"namespaces {namespaces} != the release's and the hosts'")
    crd = next(o for o in objs if o["kind"] == "CustomResourceDefinition")
    if crd != yaml.safe_load((ROOT / "crds/http3listeners.h3-ingress.dev.yaml").read_text()):
        failures.append("deploy/ CRD differs from crds/")
    _, errs = k8svalidate.validate(objs, helmlib.KUBE_VERSIONS, "deploy/")
    failures.extend(errs)

    examples = []
    for f in sorted((ROOT / "deploy/examples").glob("*.yaml")):
        examples += [o for o in yaml.safe_load_all(f.read_text()) if o]
    print(f"deploy/examples: {len(examples)} objects: {[o['kind'] + '/' + o['metadata']['name'] for o in examples]}")
    _, errs = k8svalidate.validate(examples, helmlib.KUBE_VERSIONS, "deploy/examples")
    failures.extend(errs)

    # The annotation keys users copy from the example are the constants the operator reads.
    src = (ROOT / "src/api/mod.rs").read_text()
    keys = dict(re.findall(r'pub const (ENABLED|LISTENER|HOSTS): &str = "([^"]+)"', src))
    ingress = next(o for o in examples if o["kind"] == "Ingress")
    used = {k for k in ingress["metadata"]["annotations"] if k.startswith("h3-ingress.dev/")}
    if used != set(keys.values()) or len(keys) != 3:
        failures.append(f"example Ingress annotations {used} != src/api/mod.rs {keys}")
    if ingress["metadata"]["annotations"].get(keys.get("ENABLED")) != "true":
        failures.append("example Ingress does not switch HTTP/3 on")

    if failures:
        print("FAIL deploy_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: deploy_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
