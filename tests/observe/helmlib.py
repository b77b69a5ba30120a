"""Render and lint the chart offline with the real Helm v4 Go SDK (PyPI helm-python-sdk).

helm-python-sdk's `Chart.render` has no `api_versions`/`kube_version` keyword, but its native
`helm_render` call accepts them in the options JSON (the same fields as `helm template
--api-versions/--kube-version`), so we pass them there. Checked in `selftest()`: a chart that
tests `.Capabilities.APIVersions.Has` must see the difference.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

import helm_python as helm
from helm_python import _native

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "h3-ingress"
# The oldest and newest Kubernetes versions kubernetes-validate 1.37 ships schemas for.
KUBE_VERSIONS = ("1.33.0", "1.37.0")
MONITORING_API = "monitoring.coreos.com/v1"

# Every optional part switched on.
ALL_ON: dict[str, Any] = {
    "operator": {
        "replicas": 2,
        "podDisruptionBudget": {"enabled": True},
        "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
    },
    "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror"}],
    "dataPlane": {"tuneImage": "registry.example.com/busybox@sha256:" + "0" * 64},
    "commonLabels": {"team": "edge"},
    "metrics": {
        "service": {"annotations": {"prometheus.io/scrape": "true"}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {
            "enabled": True,
            "labels": {"release": "kube-prometheus-stack"},
            "alertLabels": {"team": "edge"},
        },
    },
    "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Ingress"}},
    "listener": {
        "enabled": True,
        "name": "nginx",
        "spec": {
            "ingressClassName": "nginx",
            "port": 443,
            "upstream": {"address": "ingress-nginx-controller.ingress-nginx.svc:443"},
            "nodeSelector": {"node-role.kubernetes.io/ingress": ""},
            "socket": {"receiveBufferBytes": 4194304, "sendBufferBytes": 4194304},
            "transport": {"congestionControl": "cubic-hs"},
        },
    },
}


def render(
    values: dict[str, Any] | None = None,
    *,
    api_versions: list[str] | None = None,
    kube_version: str | None = None,
    name: str = "h3-ingress",
    namespace: str = "h3-ingress",
) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` computes it."""
    opts: dict[str, Any] = {"name": name, "namespace": namespace, "is_install": True}
    if api_versions:
        opts["api_versions"] = api_versions
    if kube_version:
        opts["kube_version"] = "v" + kube_version.lstrip("v")
    with helm.Chart.load(CHART) as chart:
        out = _native.call_string(
            "helm_render",
            chart._raw(),
            None if values is None else json.dumps(values),
            json.dumps(opts),
        )
    return json.loads(out)


def objects(rendered: dict[str, str]) -> list[tuple[str, dict[str, Any]]]:
    """(template path, object) for every non-empty YAML document, NOTES.txt excluded."""
    result = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                result.append((path, doc))
    return result


def notes(rendered: dict[str, str]) -> str:
    return next((t for p, t in rendered.items() if p.endswith("NOTES.txt")), "")


def crds() -> list[dict[str, str]]:
    with helm.Chart.load(CHART) as chart:
        return chart.crds


def lint(values: dict[str, Any] | None = None, kube_version: str = KUBE_VERSIONS[0]) -> dict[str, Any]:
    return helm.lint(CHART, values, strict=True, kube_version="v" + kube_version)


def validate_values(values: dict[str, Any]) -> None:
    """Raises helm's HelmValuesError when values.schema.json rejects `values`."""
    with helm.Chart.load(CHART) as chart:
        chart.validate_schema(values)


def selftest() -> None:
    """The api_versions option really reaches .Capabilities (it is not part of the public API)."""
    off = objects(render(ALL_ON))
    on = objects(render(ALL_ON, api_versions=[MONITORING_API]))
    kinds_off = {o["kind"] for _, o in off}
    kinds_on = {o["kind"] for _, o in on}
    assert "ServiceMonitor" not in kinds_off, kinds_off
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= kinds_on, kinds_on


if __name__ == "__main__":
    os.chdir(ROOT)
    for path, obj in objects(render(ALL_ON, api_versions=[MONITORING_API])):
        print("---")
        print(f"# Source: {path}")
        print(yaml.safe_dump(obj, sort_keys=False), end="")
