#!/usr/bin/env python3
"""The checks of tests/cluster/monitoring.sh, each one PromQL query (or Prometheus API read) and
the result it must give, against a Prometheus run by the Prometheus Operator from the chart's
monitoring objects. Every subcommand appends one row (check, query, expected, got, verdict,
seconds) to --results FILE, prints it, and exits 1 when the result is not the expected one.

  monitoring_checks.py targets   --prom URL --results F --job J --nodes N1,N2 --operator-job J
  monitoring_checks.py series    --prom URL --results F --job J --nodes N1,N2 --min-names N
  monitoring_checks.py rules     --prom URL --results F --rule-object PROMETHEUSRULE.json
  monitoring_checks.py dashboard --prom URL --results F --timeout S
  monitoring_checks.py alert     --prom URL --results F --name ALERT --state pending|firing|inactive
                                 --timeout S
  monitoring_checks.py roll      --prom URL --results F --job J --namespace NS --selector LABELS
                                 --timeout S     (while a surge rollout runs)
  monitoring_checks.py table     --results F        (the table of every row; exit 1 if one failed)

The dashboard's expressions come from tests/observe/dashboard_check.py (its panels and template
variables, Grafana's variables replaced the same way), so the proof covers what a user's Grafana
asks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests/observe"))
import dashboard_check  # noqa: E402


def api(prom: str, path: str, **params: str) -> dict:
    url = f"{prom}{path}" + (("?" + urllib.parse.urlencode(params)) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError(f"{url}: {body}")
    return body["data"]


def query(prom: str, expr: str) -> list[dict]:
    return api(prom, "/api/v1/query", query=expr)["result"]


def record(args, check: str, q: str, expected: str, got: str, ok: bool, t0: float) -> int:
    row = {"check": check, "query": q, "expected": expected, "got": got, "ok": ok,
           "seconds": round(time.time() - t0, 1)}
    with open(args.results, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"    {'ok' if ok else 'FAIL'}: {check}: {q} -> {got} (expected {expected}, {row['seconds']}s)")
    return 0 if ok else 1


def poll(timeout: float, probe):
    """probe() -> (ok, got); repeated every 2 s until ok or timeout; the last answer."""
    deadline = time.time() + timeout
    while True:
        ok, got = probe()
        if ok or time.time() >= deadline:
            return ok, got
        time.sleep(2)


def cmd_targets(args) -> int:
    """Every node's data plane and the operator are scraped, each with up == 1."""
    t0 = time.time()
    nodes = sorted(args.nodes.split(","))
    q_dp = f'up{{job="{args.job}"}}'
    q_op = f'up{{job="{args.operator_job}"}}'

    def probe():
        dp = sorted((r["metric"].get("node", "?"), r["metric"].get("listener", "?"), r["value"][1])
                    for r in query(args.prom, q_dp))
        op = [r["value"][1] for r in query(args.prom, q_op)]
        ok = dp == [(n, args.listener, "1") for n in nodes] and op == ["1"]
        return ok, f"data plane {dp}; operator {op}"
    ok, got = poll(args.timeout, probe)
    expected = f"one series per node {nodes} (listener {args.listener}) = 1; operator = [1]"
    return record(args, "data plane and operator targets up", f"{q_dp}; {q_op}", expected, got, ok, t0)


def cmd_series(args) -> int:
    """h3_ingress_* series from every node's data plane."""
    t0 = time.time()
    nodes = sorted(args.nodes.split(","))
    q = f'count by (node) (count by (node, __name__) ({{__name__=~"h3_ingress_.+", job="{args.job}"}}))'

    def probe():
        got = {r["metric"].get("node", "?"): int(r["value"][1]) for r in query(args.prom, q)}
        ok = sorted(got) == nodes and all(v >= args.min_names for v in got.values())
        return ok, f"metric names per node {got}"
    ok, got = poll(args.timeout, probe)
    return record(args, "h3_ingress_* series per data plane pod", q,
                  f">= {args.min_names} names for each of {nodes}", got, ok, t0)


def cmd_rules(args) -> int:
    """Every recording rule and alert of the chart's PrometheusRule is loaded and healthy."""
    t0 = time.time()
    obj = json.loads(Path(args.rule_object).read_text())
    want = {(g["name"], r.get("record") or r.get("alert")) for g in obj["spec"]["groups"] for r in g["rules"]}

    def probe():
        groups = api(args.prom, "/api/v1/rules")["groups"]
        loaded = {(g["name"], r["name"]): r.get("health") for g in groups for r in g["rules"]}
        missing = sorted(w for w in want if w not in loaded)
        unhealthy = sorted(w for w in want if w in loaded and loaded[w] != "ok")
        return not missing and not unhealthy, f"{len(want) - len(missing)}/{len(want)} loaded; " \
            f"missing {missing}; not ok {unhealthy}"
    ok, got = poll(args.timeout, probe)
    return record(args, "recording rules and alerts loaded", "GET /api/v1/rules",
                  f"all {len(want)} rules of PrometheusRule {obj['metadata']['name']}, health ok", got, ok, t0)


def cmd_dashboard(args) -> int:
    """Every query of the dashboard (panels and template variables) returns at least one series."""
    t0 = time.time()
    dash = json.loads((REPO / "deploy/grafana/h3-ingress.json").read_text())
    exprs = [(title, dashboard_check.expand(e)) for title, e in dashboard_check.structure(dash)]
    if dashboard_check.failures:
        return record(args, "dashboard queries return data", "deploy/grafana/h3-ingress.json",
                      "a valid dashboard", "; ".join(dashboard_check.failures), False, t0)

    def probe():
        empty = [f"{title}: {e}" for title, e in exprs if not query(args.prom, e)]
        return not empty, f"{len(exprs) - len(empty)}/{len(exprs)} with data" + (f"; empty: {empty}" if empty else "")
    ok, got = poll(args.timeout, probe)
    return record(args, "dashboard queries return data", f"{len(exprs)} expressions of deploy/grafana/h3-ingress.json",
                  f"all {len(exprs)} non-empty", got, ok, t0)


def cmd_alert(args) -> int:
    """ALERTS as Prometheus evaluates it: the alert reaches the state (inactive: no ALERTS series)."""
    t0 = time.time()
    q = f'ALERTS{{alertname="{args.name}"}}'

    def probe():
        states = sorted({r["metric"]["alertstate"] for r in query(args.prom, q)})
        ok = states == [args.state] if args.state != "inactive" else not states
        return ok, f"alertstate {states or ['none (inactive)']}"
    ok, got = poll(args.timeout, probe)
    return record(args, f"{args.name} {args.state}", q, f"alertstate {args.state}", got, ok, t0)


def running_pods(namespace: str, selector: str) -> dict[str, list[str]]:
    """node -> the pods the selector matches in phase Running, draining ones included (they
    are Running until they exit, and Prometheus's pod discovery keeps them as long)."""
    out = subprocess.run(["kubectl", "-n", namespace, "get", "pods", "-l", selector, "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    by_node: dict[str, list[str]] = {}
    for p in json.loads(out)["items"]:
        if p["status"].get("phase") == "Running":
            by_node.setdefault(p["spec"]["nodeName"], []).append(p["metadata"]["name"])
    return by_node


# Prometheus applies discovery changes to its scrape pools at most every 5 s: a node with two
# Running pods and still one target for that long twice over had both pods discovered.
ROLL_PROOF_SECONDS = 10


def cmd_roll(args) -> int:
    """During a surge rollout a node runs the old and the new pod of a listener, both at the
    node's address and metrics port: Prometheus keeps one target per node (the PodMonitor drops
    the pod name, so the two targets are identical and merged). Sampled every 0.5 s until the
    roll is over; proven once a node had two Running pods and one target for
    ROLL_PROOF_SECONDS without a break."""
    t0 = time.time()
    pool = f"podMonitor/{args.job}/0"
    q = f"GET /api/v1/targets?scrapePool={pool}"
    most, samples, longest, since, rolled = 0, 0, (0.0, ""), {}, False
    deadline = time.time() + args.timeout
    while time.time() < deadline:
        pods = running_pods(args.namespace, args.selector)
        targets = api(args.prom, "/api/v1/targets", state="active", scrapePool=pool)["activeTargets"]
        now, samples = time.time(), samples + 1
        per_node: dict[str, int] = {}
        for t in targets:
            node = t["labels"].get("node", "?")
            per_node[node] = per_node.get(node, 0) + 1
        most = max([most, *per_node.values()])
        for node, running in pods.items():
            if len(running) >= 2 and per_node.get(node) == 1:
                since.setdefault(node, (now, sorted(running)))
                span = now - since[node][0]
                if span > longest[0]:
                    longest = (span, f"{node}: {since[node][1]} Running, 1 target for {span:.1f} s")
            else:
                since.pop(node, None)
        rolled = rolled or any(len(r) >= 2 for r in pods.values())
        if rolled and all(len(r) == 1 for r in pods.values()) and longest[0] >= ROLL_PROOF_SECONDS:
            break  # the roll is over
        time.sleep(0.5)
    ok = longest[0] >= ROLL_PROOF_SECONDS and most == 1
    got = f"{samples} samples; most targets on one node {most}; longest: " + (longest[1] or "no node with two Running pods and one target")
    return record(args, "one target per node during a surge roll", q,
                  f"1 target per node, also while a node runs 2 pods (>= {ROLL_PROOF_SECONDS} s)", got, ok, t0)


def cmd_table(args) -> int:
    rows = [json.loads(line) for line in Path(args.results).read_text().splitlines() if line.strip()]
    print(f"\n{'#':<3} {'check':<44} {'verdict':<7} {'took':>6}  query -> got")
    for i, r in enumerate(rows, 1):
        print(f"{i:<3} {r['check'][:44]:<44} {'ok' if r['ok'] else 'FAIL':<7} {r['seconds']:>5}s  "
              f"{r['query'][:90]} -> {r['got'][:160]}")
    failed = [r["check"] for r in rows if not r["ok"]]
    print(f"\n{len(rows) - len(failed)}/{len(rows)} checks passed" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("targets", "series", "rules", "dashboard", "alert", "roll", "table"):
        s = sub.add_parser(name)
        s.add_argument("--results", required=True)
        if name == "table":
            continue
        s.add_argument("--prom", required=True)
        s.add_argument("--timeout", type=float, default=90)
        if name in ("targets", "series"):
            s.add_argument("--job", required=True)
            s.add_argument("--nodes", required=True)
        if name == "targets":
            s.add_argument("--operator-job", required=True)
            s.add_argument("--listener", required=True)
        if name == "series":
            s.add_argument("--min-names", type=int, default=30)
        if name == "rules":
            s.add_argument("--rule-object", required=True)
        if name == "roll":
            s.add_argument("--job", required=True)
            s.add_argument("--namespace", required=True)
            s.add_argument("--selector", required=True)
        if name == "alert":
            s.add_argument("--name", required=True)
            s.add_argument("--state", choices=["pending", "firing", "inactive"], required=True)
    args = p.parse_args()
    return globals()["cmd_" + args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
