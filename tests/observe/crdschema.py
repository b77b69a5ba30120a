"""Validate custom resources against a CRD's openAPIV3Schema, strictly.

kubernetes-validate only knows built-in kinds. The API server validates a CR against the CRD's
structural schema and, with strict field validation (kubectl's default since 1.27), rejects
unknown fields. We reproduce that much: the schema is translated to JSON Schema (`nullable`,
`x-kubernetes-int-or-string`, and `additionalProperties: false` wherever the schema lists
properties and does not preserve unknown fields). CEL rules (`x-kubernetes-validations`) are not
evaluated here; `cel_rule_count` tells how many were skipped.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import yaml

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _translate(node: Any) -> Any:
    if isinstance(node, list):
        return [_translate(n) for n in node]
    if not isinstance(node, dict):
        return node
    n = {k: _translate(v) for k, v in node.items() if not k.startswith("x-kubernetes-validations")}
    if n.pop("x-kubernetes-int-or-string", False):
        n.pop("type", None)
        n["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if n.pop("nullable", False) and "type" in n:
        n["type"] = [n["type"], "null"]
    preserve = n.pop("x-kubernetes-preserve-unknown-fields", False)
    for k in [k for k in n if k.startswith("x-kubernetes-")]:
        n.pop(k)
    if "properties" in n and "additionalProperties" not in n and not preserve:
        n["additionalProperties"] = False
    return n


def _count_cel(node: Any) -> int:
    if isinstance(node, list):
        return sum(_count_cel(n) for n in node)
    if isinstance(node, dict):
        return len(node.get("x-kubernetes-validations", [])) + sum(_count_cel(v) for v in node.values())
    return 0


class CrdValidator:
    def __init__(self, crd_path: Path):
        crd = next(d for d in yaml.safe_load_all(crd_path.read_text()) if d)
        self.group = crd["spec"]["group"]
        self.kind = crd["spec"]["names"]["kind"]
        self.cluster_scoped = crd["spec"]["scope"] == "Cluster"
        self.versions = {}
        self.cel_rule_count = 0
        for v in crd["spec"]["versions"]:
            raw = v["schema"]["openAPIV3Schema"]
            self.cel_rule_count += _count_cel(raw)
            schema = _translate(copy.deepcopy(raw))
            # apiVersion/kind/metadata are the API server's, validated separately below.
            schema.setdefault("properties", {})
            for k in ("apiVersion", "kind", "metadata"):
                schema["properties"].setdefault(k, {})
            self.versions[f"{self.group}/{v['name']}"] = jsonschema.Draft7Validator(schema)

    def handles(self, obj: dict) -> bool:
        return obj.get("kind") == self.kind and obj.get("apiVersion") in self.versions

    def errors(self, obj: dict) -> list[str]:
        errs = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                for e in self.versions[obj["apiVersion"]].iter_errors(obj)]
        name = obj.get("metadata", {}).get("name", "")
        if not DNS_SUBDOMAIN.match(name) or len(name) > 253:
            errs.append(f"metadata/name: {name!r} is not a DNS subdomain")
        if self.cluster_scoped and "namespace" in obj.get("metadata", {}):
            errs.append(f"metadata/namespace: {self.kind} is cluster-scoped")
        return errs
