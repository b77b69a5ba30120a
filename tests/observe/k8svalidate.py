"""Validate Kubernetes objects with the real validators available offline.

- Built-in kinds: the `kubernetes-validate --strict -k VERSION` CLI (PyPI), pinned versions. It
  exits 0 with a WARN for kinds it has no schema for, so every object must print `passed`.
- Http3Listener: the CRD's openAPIV3Schema, strictly (crdschema.py).
- Prometheus Operator kinds: validate_monitoring.mjs (npm @kubernetes-models/prometheus-operator).
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import yaml

import crdschema

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CRD = ROOT / "crds" / "http3listeners.h3-ingress.dev.yaml"
MONITORING = "monitoring.coreos.com/v1"


def ensure_node_modules() -> None:
    if not (HERE / "node_modules/@kubernetes-models/prometheus-operator").exists():
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--silent"], cwd=HERE, check=True)


def validate(objs: list[dict], versions: tuple[str, ...], label: str) -> tuple[int, list[str]]:
    """Returns (objects validated, failures). Prints one line per tool run."""
    failures: list[str] = []
    listener = crdschema.CrdValidator(CRD)
    builtin = [o for o in objs if not listener.handles(o) and not o["apiVersion"].startswith("monitoring.coreos.com/")]
    crs = [o for o in objs if listener.handles(o)]
    mon = [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]

    if builtin:
        with tempfile.TemporaryDirectory() as tmp:
            files = []
            for i, o in enumerate(builtin):
                f = Path(tmp) / f"{i:02d}-{o['kind'].lower()}-{o['metadata']['name']}.yaml"
                f.write_text(yaml.safe_dump(o))
                files.append(str(f))
            for version in versions:
                cmd = ["kubernetes-validate", "--strict", "-k", version, *files]
                p = subprocess.run(cmd, capture_output=True, text=True)
                lines = (p.stdout + p.stderr).splitlines()
                passed = [ln for ln in lines if " passed for resource " in ln]
                bad = [ln for ln in lines if not (" passed for resource " in ln)]
                print(f"  kubernetes-validate --strict -k {version}: {len(passed)}/{len(builtin)} {label} objects passed")
                for ln in bad:
                    print("    " + ln.replace(tmp + "/", ""))
                if p.returncode != 0 or len(passed) != len(builtin) or bad:
                    failures.append(f"kubernetes-validate -k {version} rejected {label} objects")

    for o in crs:
        errs = listener.errors(o)
        status = "ok" if not errs else "FAIL"
        print(f"  CRD schema (strict): {status} {o['kind']}/{o['metadata']['name']}")
        for e in errs:
            failures.append(f"{o['kind']}/{o['metadata']['name']}: {e}")
    if crs and listener.cel_rule_count:
        print(f"  note: {listener.cel_rule_count} CEL rule(s) in the CRD were not evaluated")

    if mon:
        ensure_node_modules()
        p = subprocess.run(["node", "validate_monitoring.mjs"], cwd=HERE, input=json.dumps(mon),
                           capture_output=True, text=True)
        for ln in (p.stdout + p.stderr).splitlines():
            print("  " + ln)
        if p.returncode != 0:
            failures.append(f"prometheus-operator schema rejected {label} objects")
    return len(objs), failures
