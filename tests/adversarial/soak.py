#!/usr/bin/env python3
"""The 10-minute soak (not in CI; tests/adversarial/soak.sh): the release proxy with default
settings in front of nginx, under mixed legitimate and abusive load, in rounds of 20 s:

- legitimate, all the time: one client on an open connection (GET every 100 ms) and one that
  opens a new connection for every GET, both started afresh every round (each stops by
  itself after 90-120 s, a guard for the attacks);
- abusive, every round: 2000 spoofed Initials at 1000/s; 50 connections from one address that
  are abandoned without a close; 10 connections with 10 unfinished header sections each,
  PINGing; one silent socket per round sending a lone Initial.

RSS is sampled every 5 s. Passes when RSS over the last 5 minutes (the last half of a run
shorter than 10 minutes) stays within +-10 % of its median, every legitimate request was
served, and `h3_ingress_active_connections`, `h3_ingress_half_open_connections` and
`h3_ingress_buffered_request_bytes` are back to 0 after the load stops (within the idle
timeout plus a margin): nothing a connection held leaked.

Usage: soak.py BINARY [--minutes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conn_tools  # noqa: E402
import lib  # noqa: E402
from attacks.single_source_flood import open_from  # noqa: E402

ROUND_S = 20
SAMPLE_S = 5
SETTLE_S = 30 + 15  # idle timeout + margin
FLAT_WINDOW_S = 300


async def abandoned(env: lib.Env, src: str, n: int, hold: float):
    held = [c for c in await asyncio.gather(*(open_from(env, src) for _ in range(n))) if c]
    await asyncio.sleep(hold)
    for c in held:
        c._transport.close()  # gone without a CONNECTION_CLOSE, like a phone losing coverage
    return len(held)


async def unfinished(env: lib.Env, conns: int, streams: int, hold: float):
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(lib.open_client(env)) for _ in range(conns)]
        for c in clients:
            for _ in range(streams):
                c.send_raw(c.new_stream(), lib.var(0x01) + lib.var(200) + b"\0" * 10)
        end = time.monotonic() + hold
        while time.monotonic() < end:
            for c in clients:
                c.ping()
            await asyncio.sleep(1)


def silent_initial(port: int, initial: bytes):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.9", 0))
    s.sendto(initial, ("127.0.0.1", port))
    return s  # closed at the end of the round, never read


async def one_round(env: lib.Env, i: int, initials: list[bytes]):
    rnd = random.Random(i)
    sources = conn_tools.spoofed_sources(len(initials), second_octet=1 + i % 200)
    packets = [(s, rnd.randrange(1024, 65536), d) for s, d in zip(sources, initials)]
    silent = silent_initial(env.proxy.port, initials[0])
    _, left, _ = await asyncio.gather(
        conn_tools.blast(env.proxy.port, packets, 1000),
        abandoned(env, "127.0.0.8", 50, ROUND_S / 2),
        unfinished(env, 10, 10, ROUND_S - 6),
    )
    silent.close()
    return left


def combined(rounds: list[dict]) -> dict:
    """The legitimate client's results over all rounds; p99 is the worst round's."""
    p99s = [r["p99_ms"] for r in rounds if r["p99_ms"] is not None]
    return {
        "served": sum(r["served"] for r in rounds),
        # A client that did not report (-1) counts as one failure.
        "failed": sum(1 if r["failed"] < 0 else r["failed"] for r in rounds),
        "p99_ms": max(p99s) if p99s else None,
    }


def left_over(m: dict[str, float]) -> dict[str, float]:
    """What connections still hold: each must return to 0 once the load stops."""
    total = lambda prefix: sum(v for k, v in m.items() if k.startswith(prefix))  # noqa: E731
    return {
        "active_connections": total("h3_ingress_active_connections"),
        "half_open_connections": total("h3_ingress_half_open_connections"),
        "buffered_request_bytes": total("h3_ingress_buffered_request_bytes"),
    }


async def soak(env: lib.Env, minutes: float) -> int:
    p = env.proxy
    initials = conn_tools.make_initials(2000)
    legit: list[tuple[dict, dict]] = []
    samples: list[tuple[float, float]] = []
    t0 = time.monotonic()
    end = t0 + minutes * 60

    async def sample():
        while True:
            samples.append((time.monotonic() - t0, p.rss_mb()))
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.ensure_future(sample())
    rounds = abandoned_total = 0
    while time.monotonic() + ROUND_S <= end:
        started = time.monotonic()
        open_conn, new_conns = lib.Legit(env), conn_tools.NewConnections(env)
        abandoned_total += await one_round(env, rounds, initials)
        rounds += 1
        await asyncio.sleep(max(0.0, ROUND_S - (time.monotonic() - started)))
        legit.append((open_conn.finish(), new_conns.finish()))
    sampler.cancel()
    r_open, r_new = combined([o for o, _ in legit]), combined([n for _, n in legit])
    load_end = time.monotonic()
    held = None
    while time.monotonic() - load_end < SETTLE_S:
        held = left_over(p.metrics())
        if not any(held.values()):
            break
        await asyncio.sleep(1)
    settled_after = time.monotonic() - load_end
    m = p.metrics()
    # The last 5 minutes (of 10); the last half of a shorter run.
    window = min(FLAT_WINDOW_S, minutes * 60 / 2)
    last = [rss for t, rss in samples if t >= samples[-1][0] - window]
    median = statistics.median(last)
    spread = (min(last) / median - 1, max(last) / median - 1)
    flat = -0.10 <= spread[0] and spread[1] <= 0.10
    limits = {k.split('"')[1]: int(v) for k, v in m.items() if k.startswith("h3_ingress_limits_total") and v}
    print(f"rounds {rounds} in {load_end - t0:.0f} s; RSS MB samples (every {SAMPLE_S} s): "
          f"first {samples[0][1]:.1f}, max {max(s for _, s in samples):.1f}, last {window:.0f} s median {median:.1f} "
          f"range {min(last):.1f}-{max(last):.1f} ({spread[0] * 100:+.1f} % / {spread[1] * 100:+.1f} %)")
    print(f"abandoned without a close: {abandoned_total} connections")
    print(f"legit (served/failed, worst round's p99) open connection: {conn_tools.legit_numbers(r_open)}; "
          f"new connection each: {conn_tools.legit_numbers(r_new)}")
    print(f"left over {settled_after:.0f} s after the load stopped: {held}; RSS then {p.rss_mb():.1f} MB")
    print(f"limits acted: {limits}")
    served = all(r["served"] > 0 and r["failed"] == 0 for r in (r_open, r_new))
    ok = flat and not any(held.values()) and served and p.alive()
    print("soak: PASS" if ok else "soak: FAIL")
    return 0 if ok else 1


def main():
    a = argparse.ArgumentParser()
    a.add_argument("binary", type=Path)
    a.add_argument("--minutes", type=float, default=10)
    args = a.parse_args()
    env = lib.make_env(args.binary)
    try:
        sys.exit(asyncio.run(soak(env, args.minutes)))
    finally:
        env.close()


if __name__ == "__main__":
    main()
