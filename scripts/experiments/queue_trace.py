"""Reading the lab router's queue traces (scripts/experiments/lab-queue-trace.patch), shared by
queue-trace-gaps.py and queue-trace-rounds.py.

Each line: time in ns, the client address's last octet, IP length, backlog bytes ahead, 1 if
dropped, and `c2s` on client-to-server packets (later traces only). Octet 2 is the row's client
(the loss-based flow), octet 3 the competing TCP download.
"""

LOSS_BASED, COMPETITOR = 2, 3


def load(path):
    """Server-to-client rows (time ns, octet, length, backlog, dropped) and client-to-server
    rows (time ns, octet, length)."""
    rows, c2s = [], []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) == 5:
                rows.append((int(p[0]), int(p[1]), int(p[2]), int(p[3]), p[4] == "1"))
            elif len(p) == 6 and p[5] == "c2s":
                c2s.append((int(p[0]), int(p[1]), int(p[2])))
    return rows, c2s


def window(rows, warmup_ns, window_ns):
    """From warmup_ns after the later of the two flows' first packets, for window_ns or until
    the earlier of their last packets."""
    first = max(next(r[0] for r in rows if r[1] == o) for o in (LOSS_BASED, COMPETITOR))
    last = min(max(r[0] for r in rows if r[1] == o) for o in (LOSS_BASED, COMPETITOR))
    start = first + warmup_ns
    return start, min(last, start + window_ns)


def departure(t, length, backlog, rate_bps):
    """When a packet the drop-tail queue kept leaves it: the queue is first in, first out at a
    fixed rate."""
    return t + (backlog + length) * 8e9 / rate_bps
