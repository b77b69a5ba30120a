#!/usr/bin/env python3
"""Read traces of the lab router's server-to-client drop-tail queue and summarise each flow.

The traces come from a lab built with scripts/experiments/lab-queue-trace.patch and run with
H3I_EXPERIMENT_QUEUE_TRACE=FILE (one bench invocation per file, one row, one run). Each line:
time in ns, the client address's last octet, IP length, backlog bytes ahead, 1 if dropped.
Octet 2 is the row's client (the loss-based flow), octet 3 the competing TCP download.

Per flow, over the 60 s after the first 5 s in which both flows send: the arrival rate, the
drops, the silences between consecutive arrivals (longer than 10, 25, 50 and 100 ms) and, for
the loss-based flow, how long before each silence over 25 ms its own last drop was.

Usage: queue-trace-gaps.py TRACE...
"""
import bisect
import sys

WARMUP_NS = 5e9
WINDOW_NS = 60e9
LOSS_BASED, COMPETITOR = 2, 3


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 5:
                rows.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4] == "1"))
    return rows


def since_drop_bucket(since_ms):
    if since_ms is None:
        return "none"
    for bound, label in ((200, "<0.2 s"), (500, "0.2-0.5 s"), (1000, "0.5-1 s")):
        if since_ms < bound:
            return label
    return ">1 s"


def summarise(path):
    rows = load(path)
    first = max(next(r[0] for r in rows if r[1] == o) for o in (LOSS_BASED, COMPETITOR))
    last = min(max(r[0] for r in rows if r[1] == o) for o in (LOSS_BASED, COMPETITOR))
    start, end = first + WARMUP_NS, min(last, first + WARMUP_NS + WINDOW_NS)
    seconds = (end - start) / 1e9
    print(f"{path}: {seconds:.1f} s")
    for octet, name in ((LOSS_BASED, "row's flow"), (COMPETITOR, "competitor")):
        flow = [r for r in rows if r[1] == octet and start <= r[0] < end]
        times = [r[0] for r in flow]
        gaps = [(b - a) / 1e6 for a, b in zip(times, times[1:])]
        mbit = sum(r[2] for r in flow) * 8 / seconds / 1e6
        counts = " ".join(f">{t}ms {sum(1 for g in gaps if g > t)}" for t in (10, 25, 50, 100))
        in_gaps = sum(g for g in gaps if g > 10) / 1e3
        print(f"  {name}: {mbit:.2f} Mbit/s, drops {sum(1 for r in flow if r[4])}, "
              f"silences {counts}, {in_gaps:.2f} s in silences over 10 ms, "
              f"longest {max(gaps):.0f} ms")
    own = [r for r in rows if r[1] == LOSS_BASED and start - 2e9 <= r[0] < end]
    drops = [r[0] for r in own if r[4]]
    times = [r[0] for r in own if r[0] >= start]
    buckets = {}
    for a, b in zip(times, times[1:]):
        gap = (b - a) / 1e6
        if gap <= 25:
            continue
        i = bisect.bisect_right(drops, a)
        key = since_drop_bucket((a - drops[i - 1]) / 1e6 if i else None)
        n, total = buckets.get(key, (0, 0.0))
        buckets[key] = (n + 1, total + gap / 1e3)
    for key in ("<0.2 s", "0.2-0.5 s", "0.5-1 s", ">1 s", "none"):
        if key in buckets:
            n, total = buckets[key]
            print(f"    row's silences over 25 ms, own last drop {key} before: {n}, {total:.2f} s")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarise(p)
