#!/usr/bin/env python3
"""When the competing TCP BBR flow left its start-up, and what the queue dropped until then.

Input: pairs written by scripts/experiments/run-traced-s6.sh, given by their common stem
(OUT_DIR/NAME): NAME.trace, the router's queue trace, and NAME.ss, the server namespace's
`ss -tinH` polled every 0.1 s. Not run by CI.

Per run it prints:
- BBR's phases from `ss`: the first sample of the competitor's connection (client octet 3) is
  time 0; each change of BBR v1's pacing gain is printed as time:gain:estimate in Mbit/s. A
  gain of 2.89 is the start-up, 0.34 the drain that ends it, 0.75/1/1.25 the steady cycle.
- The drops at the queue in the first 25 s after both flows send, per flow, and the loss-based
  flow's drops grouped into overflow rounds: drops less than 0.4 s apart (one round trip with a
  full queue at 200 ms) are one round, printed as start time:drops.

- With --rate-mbit (the bottleneck's rate), the loss-based flow's share of the bytes the queue
  delivered over the bench's window, 5-65 s after both flows send.
- With --plot OUT.png (needs matplotlib and --rate-mbit), that share against BBR's estimate
  when its start-up ended, one point per run, one colour per LABEL.

Usage: bbr-startup-exit.py [--rounds-gap-s 0.4] [--rate-mbit R [--plot OUT.png]] [LABEL=]STEM...
"""
import argparse
import re
import sys

from queue_trace import COMPETITOR, LOSS_BASED, departure, load, window

HORIZON_NS = 25e9
WARMUP_NS, WINDOW_NS = 5e9, 60e9
BBR_INFO = re.compile(r"bbr:\(bw:(\S+?)bps,mrtt:\S+?,pacing_gain:(\S+?),cwnd_gain:\S+?\)")
UNITS = {"K": 1e3, "k": 1e3, "M": 1e6, "G": 1e9}


def bits_per_second(text):
    if text[-1] in UNITS:
        return float(text[:-1]) * UNITS[text[-1]]
    return float(text)


def bbr_phases(path):
    """(seconds since the competitor's first sample, pacing gain, estimate Mbit/s) per change."""
    now, start, peer, last, phases = None, None, None, None, []
    competitor = f"10.77.1.{COMPETITOR}:"
    with open(path) as f:
        for line in f:
            if line.startswith("@"):
                now = float(line.split()[1])
                continue
            if not line.startswith("\t"):
                fields = line.split()
                peer = fields[-1] if fields else None
                continue
            match = BBR_INFO.search(line)
            if not (peer and peer.startswith(competitor) and match):
                continue
            start = now if start is None else start
            gain = float(match.group(2))
            if gain != last:
                phases.append((now - start, gain, bits_per_second(match.group(1)) / 1e6))
                last = gain
    return phases


def drop_rounds(rows, gap_s):
    start, end = window(rows, 0, HORIZON_NS)
    drops = {LOSS_BASED: 0, COMPETITOR: 0}
    rounds = []
    for t, octet, _length, _backlog, dropped in rows:
        if not (dropped and octet in drops and start <= t < end):
            continue
        drops[octet] += 1
        if octet != LOSS_BASED:
            continue
        s = (t - start) / 1e9
        if rounds and s - rounds[-1][1] < gap_s:
            rounds[-1][1] = s
            rounds[-1][2] += 1
        else:
            rounds.append([s, s, 1])
    return drops, rounds


def window_share(rows, rate_bps):
    """The loss-based flow's share of the bytes that left the queue in the bench's window."""
    start, end = window(rows, WARMUP_NS, WINDOW_NS)
    delivered = {LOSS_BASED: 0, COMPETITOR: 0}
    for t, octet, length, backlog, dropped in rows:
        if dropped or octet not in delivered:
            continue
        if start <= departure(t, length, backlog, rate_bps) < end:
            delivered[octet] += length
    return delivered[LOSS_BASED] / max(1, sum(delivered.values()))


def plot(points, rate_mbit, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label in dict.fromkeys(p[0] for p in points):
        xs = [p[1] for p in points if p[0] == label]
        ys = [p[2] for p in points if p[0] == label]
        ax.scatter(xs, ys, label=label, s=28)
    ax.set_xlim(0, rate_mbit)
    ax.set_ylim(0, 0.55)
    ax.set_xlabel("BBR's bandwidth estimate when its start-up ended (Mbit/s)")
    ax.set_ylabel("loss-based flow's share, 5-65 s")
    ax.set_title(f"{rate_mbit:g} Mbit/s bottleneck, one point per run")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def report(label, stem, args):
    """Prints one run; returns (label, exit estimate, share) when both are known."""
    phases = bbr_phases(stem + ".ss")
    exit_at = next(((t, bw) for t, gain, bw in phases if gain < 2), None)
    rows, _ = load(stem + ".trace")
    drops, rounds = drop_rounds(rows, args.rounds_gap_s)
    print(f"{stem}" + (f" ({label})" if label else ""))
    if exit_at:
        print(f"  BBR start-up ended at {exit_at[0]:.1f} s, estimate {exit_at[1]:.1f} Mbit/s")
    else:
        print("  BBR start-up did not end in the samples")
    print("  BBR phases: " + " ".join(f"{t:.1f}:{g:.2f}:{bw:.1f}" for t, g, bw in phases[:8]))
    print(f"  drops in the first 25 s: loss-based {drops[LOSS_BASED]}, BBR {drops[COMPETITOR]}")
    print("  loss-based overflow rounds: " + " ".join(f"{a:.2f}:{n}" for a, _b, n in rounds))
    if args.rate_mbit is None:
        return None
    share = window_share(rows, args.rate_mbit * 1e6)
    print(f"  loss-based share, 5-65 s: {share:.3f}")
    return (label, exit_at[1], share) if exit_at else None


def main(argv):
    parser = argparse.ArgumentParser(usage=__doc__.rsplit("Usage: ", 1)[1])
    parser.add_argument("--rounds-gap-s", type=float, default=0.4)
    parser.add_argument("--rate-mbit", type=float)
    parser.add_argument("--plot")
    parser.add_argument("runs", nargs="+", metavar="[LABEL=]STEM")
    args = parser.parse_args(argv)
    if args.plot and args.rate_mbit is None:
        parser.error("--plot needs --rate-mbit")
    points = []
    for run in args.runs:
        label, _, stem = run.rpartition("=")
        point = report(label, stem, args)
        if point:
            points.append(point)
    if args.plot:
        plot(points, args.rate_mbit, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
