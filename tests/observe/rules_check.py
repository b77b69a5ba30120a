#!/usr/bin/env python3
"""Prometheus rules: promtool check + promtool test, for the plain file and every share preset.

Also checks that every alert has a unit test that makes it fire, that every recording rule is
evaluated by a unit test, and that every h3_ingress_* metric a rule reads is one the binary
exports (src/proxy/observe/metrics.rs or src/operator/metrics.rs; the data plane's also in a real
scrape when given with --scrape FILE).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen  # noqa: E402
import metricslib  # noqa: E402

ROOT = metricslib.ROOT
PLAIN = ROOT / "deploy/prometheus/h3-ingress.rules.yml"
UNIT = HERE / "promtool/h3-ingress.test.yml"
PRESETS = {
    "f5-nginx-plus": {"share": {"preset": "f5-nginx-plus"}},
    "generic-perhost": {"share": {"preset": "generic",
                                  "generic": {"expr": "rate(edge_requests_total[5m])", "perHost": True}}},
    "generic-total": {"share": {"preset": "generic",
                                "generic": {"expr": "rate(nginx_ingress_nginx_http_requests_total[5m])",
                                            "perHost": False}}},
}
# Metrics of the TCP ingress the presets read; not ours to export.
EXTERNAL = {"nginx_ingress_controller_requests", "nginx_ingress_nginxplus_server_zone_requests",
            "edge_requests_total", "nginx_ingress_nginx_http_requests_total"}

failures: list[str] = []


def run(cmd: list[str], cwd: Path | None = None) -> None:
    print("$ " + " ".join(cmd))
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    out = (p.stdout + p.stderr).rstrip()
    print("  " + out.replace("\n", "\n  "))
    if p.returncode != 0:
        failures.append(" ".join(cmd))


def coverage(rules_path: Path, tests_path: Path) -> None:
    rules = yaml.safe_load(rules_path.read_text())
    tests = yaml.safe_load(tests_path.read_text())["tests"]
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    records = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    fired = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    quiet = {a["alertname"] for t in tests for a in t.get("alert_rule_test", []) if not a.get("exp_alerts")}
    evaluated = set()
    for t in tests:
        for e in t.get("promql_expr_test", []):
            evaluated |= metricslib.metric_names(e["expr"])
    for name in sorted(alerts - fired):
        failures.append(f"alert {name} has no unit test in which it fires")
    for name in sorted(alerts - quiet):
        failures.append(f"alert {name} has no unit test in which it stays quiet")
    # A recording rule only read by an alert is covered by that alert's tests.
    read_by_alerts = set()
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" in r and r["alert"] in fired:
                read_by_alerts |= metricslib.metric_names(r["expr"])
    for name in sorted(records - evaluated - read_by_alerts):
        failures.append(f"recording rule {name} is not evaluated by any unit test")
    print(f"coverage: {len(alerts)} alerts each fire and stay quiet in a test; "
          f"{len(records)} recording rules evaluated")


def metric_check(scrape: Path | None) -> None:
    exported = metricslib.exported_from_source()
    # The alerts on missing targets read the operator's metrics too.
    operator = metricslib.exported_from_source(metricslib.OPERATOR_METRICS_RS)
    scraped = metricslib.exported_from_scrape(scrape.read_text()) if scrape else None
    rules = yaml.safe_load(PLAIN.read_text())
    records = metricslib.rule_names(rules)
    used = set()
    for g in rules["groups"]:
        for r in g["rules"]:
            used |= metricslib.metric_names(r["expr"])
    ours = {n for n in used if n.startswith("h3_ingress_")}
    other = used - ours - records - EXTERNAL
    for n in sorted(other):
        failures.append(f"rules read {n}, which is neither ours, a recording rule nor a known TCP ingress metric")
    for n in sorted(ours - exported - operator):
        failures.append(f"rules read {n}, which neither src/proxy/observe/metrics.rs nor src/operator/metrics.rs exports")
    print(f"metrics: the rules read {len(ours)} h3_ingress_* metrics, all registered in src/proxy/observe/metrics.rs "
          f"or (h3_ingress_operator_*) src/operator/metrics.rs")
    ours -= operator
    if scraped is not None:
        seen = sorted(ours & scraped)
        unseen = sorted(ours - scraped)
        print(f"scrape {scrape}: {len(seen)} of them present; not in this scrape (no event yet): {unseen}")
        for n in sorted(scraped):
            if n.startswith("h3_ingress_") and n not in exported:
                failures.append(f"the scrape has {n}, which metrics.rs does not register (source parse is stale)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrape", type=Path, help="a real /metrics scrape of the proxy")
    args = ap.parse_args()

    run(["promtool", "check", "rules", str(PLAIN)])
    run(["promtool", "test", "rules", str(UNIT)])
    coverage(PLAIN, UNIT)

    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        for name, values in PRESETS.items():
            rules = tmpdir / f"rules-{name}.yml"
            rules.write_text(gen.dump_rules(gen.rule_groups(values)))
            test = HERE / "promtool" / f"preset-{name}.test.yml"
            shutil.copy(test, tmpdir / test.name)
            run(["promtool", "check", "rules", rules.name], cwd=tmpdir)
            run(["promtool", "test", "rules", test.name], cwd=tmpdir)

    metric_check(args.scrape)
    if failures:
        print("FAIL rules_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: rules_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
