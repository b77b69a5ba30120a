#!/usr/bin/env python3
"""Grafana dashboard: structure, metric names, and every PromQL expression parsed by promtool.

Every metric a panel reads must be exported by the binary (the registrations in
src/proxy/observe/metrics.rs; with --scrape FILE also a real /metrics scrape) or be a recording rule of
our rules file. promtool cannot parse a bare expression offline, so each panel expression (with
Grafana's variables replaced) becomes one recording rule of a throwaway rules file that
`promtool check rules` then parses.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import metricslib  # noqa: E402

ROOT = metricslib.ROOT
DASHBOARDS = [ROOT / "charts/h3-ingress/dashboards/h3-ingress.json", ROOT / "deploy/grafana/h3-ingress.json"]
RULES = ROOT / "deploy/prometheus/h3-ingress.rules.yml"
# What the issue asks the dashboard to show; each must be read by some panel.
REQUIRED = {
    "h3 request share per host": "h3_ingress:h3_request_share:ratio_rate5m",
    "h3 requests/s by status class": "h3_ingress_requests_total",
    "p50/p95 latency": "h3_ingress_request_duration_seconds_bucket",
    "UDP drops, our sockets": "h3_ingress_udp_socket_drops_total",
    "UDP drops, host": "h3_ingress_udp_host_receive_buffer_errors_total",
    "effective receive buffer": "h3_ingress_udp_socket_receive_buffer_bytes",
    "requested receive buffer": "h3_ingress_udp_socket_receive_buffer_requested_bytes",
    "handshakes by result": "h3_ingress_handshakes_total",
    "RTT": "h3_ingress_connection_rtt_seconds_bucket",
    "lost packets": "h3_ingress_connection_lost_packets_total",
    "discovered path MTU": "h3_ingress_connection_path_mtu_bytes_bucket",
    "congestion events": "h3_ingress_connection_congestion_events_total",
    "forgiven handshake losses": "h3_ingress_congestion_handshake_losses_forgiven_total",
    "tolerated random losses": "h3_ingress_congestion_random_losses_tolerated_total",
    "active connections": "h3_ingress_active_connections",
}
GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h",
                "$listener": ".*", "$host": ".*"}

failures: list[str] = []


def expand(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARS.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    if "$" in re.sub(r'"(?:\\.|[^"\\])*"', "", expr):
        failures.append(f"unexpanded Grafana variable in {expr}")
    return expr


def panels_of(dash: dict) -> list[dict]:
    out = []
    for p in dash["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def structure(dash: dict) -> list[tuple[str, str]]:
    """(panel title, expression) for every target; structural problems go to failures."""
    ids = set()
    cells: set[tuple[int, int]] = set()
    exprs = []
    var_names = {v["name"] for v in dash["templating"]["list"]}
    for p in panels_of(dash):
        if p["id"] in ids:
            failures.append(f"duplicate panel id {p['id']}")
        ids.add(p["id"])
        g = p["gridPos"]
        if g["x"] < 0 or g["x"] + g["w"] > 24:
            failures.append(f"panel {p['title']!r} is outside the 24-column grid")
        for dx in range(g["w"]):
            for dy in range(g["h"]):
                cell = (g["x"] + dx, g["y"] + dy)
                if cell in cells:
                    failures.append(f"panel {p['title']!r} overlaps another at {cell}")
                    break
                cells.add(cell)
        if p["type"] == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            failures.append(f"panel {p['title']!r} does not use the $datasource variable")
        if not p.get("targets"):
            failures.append(f"panel {p['title']!r} has no query")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}":
                failures.append(f"a query of {p['title']!r} does not use the $datasource variable")
            for used in re.findall(r"\$\{?(\w+)", t["expr"]):
                if not used.startswith("__") and used not in var_names:
                    failures.append(f"{p['title']!r} uses undefined variable ${used}")
            exprs.append((p["title"], t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            exprs.append((f"variable {v['name']}", re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1",
                                                          v["definition"])))
    return exprs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrape", type=Path, help="a real /metrics scrape of the proxy")
    args = ap.parse_args()

    texts = [p.read_text() for p in DASHBOARDS]
    if texts[0] != texts[1]:
        failures.append("the chart's and deploy/'s dashboard JSON differ")
    dash = json.loads(texts[0])
    exprs = structure(dash)

    exported = metricslib.exported_from_source()
    recorded = metricslib.rule_names(yaml.safe_load(RULES.read_text()))
    scraped = metricslib.exported_from_scrape(args.scrape.read_text()) if args.scrape else None
    used: set[str] = set()
    for title, expr in exprs:
        names = metricslib.metric_names(expand(expr))
        used |= names
        for n in sorted(names - exported - recorded):
            failures.append(f"{title!r} reads {n}, which neither the binary exports nor a rule records")
    for what, metric in REQUIRED.items():
        if metric not in used:
            failures.append(f"no panel shows {what} ({metric})")

    rules = {"groups": [{"name": "dashboard-expressions", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": expand(e)} for i, (_, e) in enumerate(exprs)]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
    cmd = ["promtool", "check", "rules", f.name]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print("$ " + " ".join(cmd) + "   # one recording rule per dashboard expression")
    print("  " + (p.stdout + p.stderr).strip().replace("\n", "\n  "))
    if p.returncode != 0:
        failures.append("promtool could not parse every dashboard expression")
    Path(f.name).unlink()

    n_panels = sum(1 for p in panels_of(dash) if p["type"] != "row")
    ours = sorted(n for n in used if n.startswith("h3_ingress_"))
    print(f"dashboard: {n_panels} panels, {len(exprs)} expressions, {len(ours)} h3_ingress_* metrics "
          f"read, recording rules read {sorted(used & recorded)}")
    if scraped is not None:
        print(f"scrape {args.scrape}: present {len(set(ours) & scraped)}; "
              f"not in this scrape (no event yet): {sorted(set(ours) - scraped)}")
        for n in sorted(scraped):
            if n.startswith("h3_ingress_") and n not in exported:
                failures.append(f"the scrape has {n}, which the metrics.rs parse missed")
    if failures:
        print("FAIL dashboard_check:\n  " + "\n  ".join(failures))
        return 1
    print("ok: dashboard_check")
    return 0


if __name__ == "__main__":
    sys.exit(main())
