#!/usr/bin/env python3
"""Read traces of the lab router's server-to-client drop-tail queue and summarise each flow.

The traces come from a lab built with scripts/experiments/lab-queue-trace.patch and run with
H3I_EXPERIMENT_QUEUE_TRACE=FILE (one bench invocation per file, one row, one run). Each line:
time in ns, the client address's last octet, IP length, backlog bytes ahead, 1 if dropped, and
`c2s` on client-to-server packets (later traces only). Octet 2 is the row's client (the
loss-based flow), octet 3 the competing TCP download.

Per flow, over the 60 s after the first 5 s in which both flows send: the arrival rate, the
drops, the silences between consecutive arrivals (longer than 10, 25, 50 and 100 ms) and, for
the loss-based flow, how long before each silence over 25 ms its own last drop was. With
client-to-server lines, also each client's packets per second toward the server (its
acknowledgements), the server's packets per client packet, and per silence how many client
packets reached the server during it (the router records them one one-way delay earlier).

Usage: queue-trace-gaps.py [--one-way-ms 100] TRACE...
"""
import bisect
import sys

from queue_trace import COMPETITOR, LOSS_BASED, load, window

WARMUP_NS = 5e9
WINDOW_NS = 60e9


def since_drop_bucket(since_ms):
    if since_ms is None:
        return "none"
    for bound, label in ((200, "<0.2 s"), (500, "0.2-0.5 s"), (1000, "0.5-1 s")):
        if since_ms < bound:
            return label
    return ">1 s"


def summarise(path, one_way_ns):
    rows, c2s = load(path)
    start, end = window(rows, WARMUP_NS, WINDOW_NS)
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
        back = [r[0] for r in c2s if r[1] == octet and start <= r[0] < end]
        if back:
            spacing = sorted((b - a) / 1e6 for a, b in zip(back, back[1:]))
            print(f"    its client sent {len(back) / seconds:.0f} packets/s, "
                  f"{len(flow) / len(back):.1f} server packets per client packet, spacing "
                  f"median {spacing[len(spacing) // 2]:.1f} ms, "
                  f"p90 {spacing[len(spacing) * 9 // 10]:.1f} ms")
    silences(rows, c2s, start, end, one_way_ns)


def silences(rows, c2s, start, end, one_way_ns):
    """The row's silences over 25 ms by time since its own last drop, with the client packets
    that reached the server while each lasted."""
    own = [r for r in rows if r[1] == LOSS_BASED and start - 2e9 <= r[0] < end]
    drops = [r[0] for r in own if r[4]]
    times = [r[0] for r in own if r[0] >= start]
    back = sorted(r[0] + one_way_ns for r in c2s if r[1] == LOSS_BASED)
    buckets = {}
    for a, b in zip(times, times[1:]):
        gap = (b - a) / 1e6
        if gap <= 25:
            continue
        i = bisect.bisect_right(drops, a)
        key = since_drop_bucket((a - drops[i - 1]) / 1e6 if i else None)
        acks = bisect.bisect_left(back, b) - bisect.bisect_left(back, a)
        buckets.setdefault(key, []).append((gap, acks))
    for key in ("<0.2 s", "0.2-0.5 s", "0.5-1 s", ">1 s", "none"):
        if key in buckets:
            found = buckets[key]
            total = sum(g for g, _ in found) / 1e3
            line = f"    row's silences over 25 ms, own last drop {key} before: {len(found)}, {total:.2f} s"
            if back:
                acks = sorted(n for _, n in found)
                line += f"; client packets reaching the server in each: median {acks[len(acks) // 2]}"
            print(line)


if __name__ == "__main__":
    args = sys.argv[1:]
    one_way_ms = 100.0
    if args[:1] == ["--one-way-ms"]:
        one_way_ms, args = float(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    for p in args:
        summarise(p, one_way_ms * 1e6)
