"""Which metric names the binary exports, and which ones a PromQL expression uses.

Exported names come either from a real scrape (`/metrics` text) or, before a proxy can run,
from the registrations in src/proxy/observe/metrics.rs (the data plane's) and
src/operator/metrics.rs (the operator's). Expression names come from a small PromQL
tokenizer (string literals, label matchers and grouping clauses removed first); promtool
separately proves that every expression parses.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METRICS_RS = ROOT / "src" / "proxy" / "observe" / "metrics.rs"
OPERATOR_METRICS_RS = ROOT / "src" / "operator" / "metrics.rs"

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
    "and", "or", "unless", "atan2", "inf", "nan", "start", "end",
}


# The accept-error counters both binaries register (src/fds.rs: the name is passed to their
# registries, so it is declared there, not in either metrics.rs).
SHARED_RS = ROOT / "src" / "fds.rs"


def exported_from_source(path: Path = METRICS_RS) -> set[str]:
    """Every `h3_ingress_*` series name metrics.rs (with the shared src/fds.rs) can produce
    (histograms expanded)."""
    src = path.read_text() + "\n" + SHARED_RS.read_text()
    names: set[str] = set()
    for m in re.finditer(r'"(h3_ingress_[a-z0-9_]+)"', src):
        name = m.group(1)
        before = src[max(0, m.start() - 60):m.start()]
        # A histogram: registered through HistogramOpts, or declared with the `histogram(`
        # spec constructor of metrics.rs.
        if re.search(r"(HistogramOpts::new|\bhistogram)\(\s*$", before):
            names.update(name + s for s in HISTOGRAM_SUFFIXES)
        else:
            names.add(name)
    if not names:
        raise SystemExit(f"no h3_ingress_ metric found in {path}")
    return names


def exported_from_scrape(text: str) -> set[str]:
    """Series names present in a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
        if m:
            names.add(m.group(1))
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)        # string literals
    s = re.sub(r"\{[^}]*\}", " ", s)                        # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)                       # range / subquery selectors
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)
    names = set()
    for m in re.finditer(r"(?<![a-zA-Z0-9_:.])[a-zA-Z_:][a-zA-Z0-9_:]*", s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS:
            continue  # a function call or an operator keyword
        if re.match(r"(by|without)\b", rest):
            continue  # an aggregation: sum by (...) (...)
        names.add(word)
    return names


def rule_names(groups: dict) -> set[str]:
    return {r["record"] for g in groups["groups"] for r in g["rules"] if "record" in r}
