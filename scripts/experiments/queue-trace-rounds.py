#!/usr/bin/env python3
"""Per-round view of a lab queue trace: each flow's share of the bottleneck's service over time,
the 10-round maximum that TCP BBR v1 would take from its own delivery rate, and the loss-based
flow's congestion events.

Traces come from a lab built with scripts/experiments/lab-queue-trace.patch and run with
H3I_EXPERIMENT_QUEUE_TRACE=FILE (one bench invocation per file, one row, one run; the format is
in queue_trace.py). Octet 2 is the row's client (the loss-based flow), octet 3 the
competing TCP download (BBR in the cells this was written for).

The drop-tail queue is first in, first out at a fixed rate, so a packet that was not dropped
leaves at arrival + (backlog ahead + its length) / rate. Service per flow is counted by
departure, in bins of one round trip (--bin-ms, 400 ms: 200 ms of path plus a full 1 BDP
queue), over --window-s (60) seconds after the first --warmup-s (5) seconds in which both flows
send:

- per flow: delivered Mbit/s, and the spread of its per-bin share (p10, median, p90);
- per flow, its data in flight as the bottleneck sees it: bytes in the queue plus bytes that
  left it within the last --pipe-ms (200: the path's round trip), so still on the way to the
  client or acknowledged on the way back;
- BBR's emulated estimate: the maximum of its per-bin delivery rate over the last 10 bins, and
  how often that maximum falls by more than 5 % from one bin to the next (an expiry);
- the loss-based flow's congestion events (a drop more than --event-gap-ms after the first drop
  of the previous event starts a new one): count, intervals, the flow's rate in the bin
  before each and its lowest rate in the three bins after;
- stretches of at least 10 bins in which the loss-based flow's share stays above --high
  (0.30): what pulls a 10-round maximum down.

--plot draws, per trace, both flows' delivered rates with the 10-bin maximum, and both flows'
data in flight, with the loss-based flow's congestion events as red lines (needs matplotlib).

Usage: queue-trace-rounds.py --rate-mbit 20 [--bin-ms 400] [--warmup-s 5] [--window-s 60]
       [--pipe-ms 200] [--event-gap-ms 450] [--high 0.30] [--plot OUT.png] TRACE...
"""
import argparse
import os

from queue_trace import COMPETITOR, LOSS_BASED, departure, load, window


def bins(rows, start, end, bin_ns, rate_bps):
    """Per bin and flow: delivered bits (by departure), arrived bits and drops."""
    n = int((end - start) // bin_ns)
    out = {o: {"deliv": [0.0] * n, "arr": [0.0] * n, "drops": [0] * n}
           for o in (LOSS_BASED, COMPETITOR)}
    for t, octet, length, backlog, dropped in rows:
        if octet not in out:
            continue
        f = out[octet]
        i = int((t - start) // bin_ns)
        if 0 <= i < n:
            f["arr"][i] += length * 8
            if dropped:
                f["drops"][i] += 1
        if not dropped:
            j = int((departure(t, length, backlog, rate_bps) - start) // bin_ns)
            if 0 <= j < n:
                f["deliv"][j] += length * 8
    return n, out


def inflight(rows, start, n, bin_ns, rate_bps, pipe_ns):
    """Per flow and bin end: bytes in the queue plus bytes that left it within the last
    --pipe-ms (still on the way to the client, or their acknowledgement on the way back): the
    flow's data in flight, as far as the bottleneck can tell."""
    out = {}
    for octet in (LOSS_BASED, COMPETITOR):
        arr, dep = [], []
        for t, o, length, backlog, dropped in rows:
            if o == octet and not dropped:
                arr.append((t, length))
                dep.append((departure(t, length, backlog, rate_bps), length))
        dep.sort()
        series, ia, idq, ip_, queued, piped = [], 0, 0, 0, 0, 0
        for i in range(n):
            edge = start + (i + 1) * bin_ns
            while ia < len(arr) and arr[ia][0] <= edge:
                queued += arr[ia][1]
                ia += 1
            while idq < len(dep) and dep[idq][0] <= edge:
                queued -= dep[idq][1]
                piped += dep[idq][1]
                idq += 1
            while ip_ < idq and dep[ip_][0] <= edge - pipe_ns:
                piped -= dep[ip_][1]
                ip_ += 1
            series.append((queued + piped) / 1e3)
        out[octet] = series
    return out


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))]


def events(rows, start, end, gap_ns):
    starts = []
    for t, octet, _, _, dropped in rows:
        if octet == LOSS_BASED and dropped and start <= t < end:
            if not starts or t - starts[-1] > gap_ns:
                starts.append(t)
    return starts


def stretches(flags):
    """Lengths of runs of True."""
    runs, cur = [], 0
    for f in flags:
        if f:
            cur += 1
        else:
            if cur:
                runs.append(cur)
            cur = 0
    if cur:
        runs.append(cur)
    return runs


def summarise(path, args):
    rows, _ = load(path)
    start, end = window(rows, args.warmup_s * 1e9, args.window_s * 1e9)
    bin_ns = args.bin_ms * 1e6
    rate_bps = args.rate_mbit * 1e6
    n, f = bins(rows, start, end, bin_ns, rate_bps)
    if n < 1:
        print(f"{path}: no whole {args.bin_ms:.0f} ms bin in the window (the flows ended)")
        return None
    sec = bin_ns / 1e9
    mbit = {o: [b / sec / 1e6 for b in f[o]["deliv"]] for o in f}
    share = [lb / (lb + c) if lb + c else 0.0
             for lb, c in zip(mbit[LOSS_BASED], mbit[COMPETITOR])]
    print(f"{path}: {n} bins of {args.bin_ms:.0f} ms")
    for o, name in ((LOSS_BASED, "loss-based"), (COMPETITOR, "competitor")):
        m = mbit[o]
        print(f"  {name}: delivered {sum(m) / n:.2f} Mbit/s (per bin p10 {pct(m, .1):.2f}, "
              f"median {pct(m, .5):.2f}, p90 {pct(m, .9):.2f}), arrived "
              f"{sum(f[o]['arr']) / n / sec / 1e6:.2f}, drops {sum(f[o]['drops'])}")
    lb_bits, c_bits = sum(f[LOSS_BASED]["deliv"]), sum(f[COMPETITOR]["deliv"])
    print(f"  loss-based share of delivered bytes: {lb_bits / (lb_bits + c_bits):.3f}")
    print(f"  loss-based share per bin: p10 {pct(share, .1):.2f}, median {pct(share, .5):.2f}, "
          f"p90 {pct(share, .9):.2f}, mean of bins {sum(share) / n:.3f}")
    kb = inflight(rows, start, n, bin_ns, rate_bps, args.pipe_ms * 1e6)
    for o, name in ((LOSS_BASED, "loss-based"), (COMPETITOR, "competitor")):
        k = kb[o]
        print(f"  {name} in flight KB: p10 {pct(k, .1):.0f}, median {pct(k, .5):.0f}, "
              f"p90 {pct(k, .9):.0f}, max {max(k):.0f}")
    total = [a + b for a, b in zip(kb[LOSS_BASED], kb[COMPETITOR])]
    print(f"  both in flight KB: p10 {pct(total, .1):.0f}, median {pct(total, .5):.0f}, "
          f"p90 {pct(total, .9):.0f}")
    est = [max(mbit[COMPETITOR][max(0, i - 9):i + 1]) for i in range(n)]
    falls = sum(1 for a, b in zip(est, est[1:]) if b < a * 0.95)
    full = est[10:] or est  # once the maximum spans 10 bins, unless the window is shorter
    print(f"  competitor's 10-bin maximum: median {pct(full, .5):.2f}, p10 "
          f"{pct(full, .1):.2f}, min {min(full):.2f}; falls over 5 %: {falls}")
    ev = events(rows, start, end, args.event_gap_ms * 1e6)
    gaps = [(b - a) / 1e9 for a, b in zip(ev, ev[1:])]
    before, after = [], []
    for t in ev:
        i = int((t - start) // bin_ns)
        if 1 <= i < n - 3:
            before.append(mbit[LOSS_BASED][i - 1])
            after.append(min(mbit[LOSS_BASED][i + 1:i + 4]))
    if gaps:
        print(f"  loss-based congestion events: {len(ev)}; interval s p10 {pct(gaps, .1):.1f}, "
              f"median {pct(gaps, .5):.1f}, p90 {pct(gaps, .9):.1f}, max {max(gaps):.1f}")
    if before:
        print(f"    rate in the bin before: median {pct(before, .5):.2f}, p90 "
              f"{pct(before, .9):.2f}; lowest in the 3 bins after: median {pct(after, .5):.2f}")
    runs = stretches([s > args.high for s in share])
    long_runs = [r for r in runs if r >= 10]
    print(f"  stretches with loss-based share > {args.high:.2f}: {len(runs)}, longest "
          f"{max(runs, default=0)} bins; {len(long_runs)} of 10 bins or more "
          f"({sum(long_runs) * sec:.1f} s)")
    return {"mbit": mbit, "est": est, "kb": kb, "events": [(t - start) / 1e9 for t in ev], "sec": sec}


def plot(results, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2 * len(results), 1, figsize=(14, 5.6 * len(results)),
                             squeeze=False)
    for k, (path, r) in enumerate(results):
        ax, ax2 = axes[2 * k, 0], axes[2 * k + 1, 0]
        x = [i * r["sec"] for i in range(len(r["est"]))]
        ax.plot(x, r["mbit"][COMPETITOR], lw=0.8, label="competitor delivered")
        ax.plot(x, r["est"], lw=1.2, label="competitor 10-bin max")
        ax.plot(x, r["mbit"][LOSS_BASED], lw=0.8, label="loss-based delivered")
        for t in r["events"]:
            ax.axvline(t, color="red", lw=0.4, alpha=0.6)
        ax.set_title(os.path.basename(path), fontsize=8)
        ax.set_ylabel("Mbit/s")
        ax.legend(fontsize=7, loc="center right")
        ax2.plot(x, r["kb"][COMPETITOR], lw=0.8, label="competitor in flight KB")
        ax2.plot(x, r["kb"][LOSS_BASED], lw=0.8, label="loss-based in flight KB")
        for t in r["events"]:
            ax2.axvline(t, color="red", lw=0.4, alpha=0.6)
        ax2.set_ylabel("KB in flight")
        ax2.set_xlabel("s after --warmup-s")
        ax2.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(out, dpi=72)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-mbit", type=float, required=True)
    ap.add_argument("--bin-ms", type=float, default=400.0)
    ap.add_argument("--event-gap-ms", type=float, default=450.0)
    ap.add_argument("--high", type=float, default=0.30)
    ap.add_argument("--pipe-ms", type=float, default=200.0)
    ap.add_argument("--warmup-s", type=float, default=5.0)
    ap.add_argument("--window-s", type=float, default=60.0)
    ap.add_argument("--plot")
    ap.add_argument("traces", nargs="+")
    args = ap.parse_args()
    results = [(p, summarise(p, args)) for p in args.traces]
    results = [(p, r) for p, r in results if r is not None]
    if args.plot and results:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
