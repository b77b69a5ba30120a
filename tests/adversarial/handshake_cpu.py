#!/usr/bin/env python3
"""What a full handshake costs the proxy in CPU, and on how many threads that CPU runs
(issue 11 item 9: is handshake work stuck on one core under a flood?). Not part of the suite.

The release proxy with default settings; CLIENTS aioquic clients (each in its own process, so
the client side is not the bottleneck of one Python interpreter) each complete handshakes in a
loop (connect, close) for SECONDS. The proxy's CPU time (utime + stime from /proc) is read
before and after, in total and per thread, and divided by the handshakes it counted
(`h3_ingress_handshakes_total{result="ok"}`).

Usage: handshake_cpu.py BINARY [--clients 4] [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conn_tools  # noqa: E402
import lib  # noqa: E402

def handshake_loop(port: int, ca: str, seconds: float, q) -> None:
    env = type("E", (), {"proxy": type("P", (), {"port": port}), "ca": Path(ca)})

    async def loop() -> int:
        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            async with lib.open_client(env):
                n += 1
        return n

    q.put(asyncio.run(loop()))


def main() -> int:
    a = argparse.ArgumentParser()
    a.add_argument("binary", type=Path)
    a.add_argument("--clients", type=int, default=4)
    a.add_argument("--seconds", type=float, default=20)
    args = a.parse_args()
    env = lib.make_env(args.binary)
    try:
        p = env.proxy
        ok = 'h3_ingress_handshakes_total{result="ok"}'
        hs0, cpu0, wall0 = p.metrics().get(ok, 0.0), conn_tools.thread_cpu(p.proc.pid), time.monotonic()
        q = multiprocessing.Queue()
        procs = [multiprocessing.Process(target=handshake_loop, args=(p.port, str(env.ca), args.seconds, q))
                 for _ in range(args.clients)]
        for pr in procs:
            pr.start()
        client_count = sum(q.get(timeout=args.seconds + 60) for _ in procs)
        for pr in procs:
            pr.join()
        wall = time.monotonic() - wall0
        cpu1 = conn_tools.thread_cpu(p.proc.pid)
        hs = p.metrics().get(ok, 0.0) - hs0
        per_thread = sorted(((cpu1[k] - cpu0.get(k, 0.0), k) for k in cpu1), reverse=True)
        total = sum(d for d, _ in per_thread)
        print(f"{hs:g} handshakes ({client_count} by the clients) in {wall:.1f} s = {hs / wall:.0f}/s; "
              f"proxy CPU {total:.2f} s = {total / wall * 100:.0f} % of one core; "
              f"{total / max(hs, 1) * 1000:.2f} ms CPU per handshake")
        busy = [(d, k) for d, k in per_thread if d >= 0.01]
        print("proxy threads with CPU: " + ", ".join(f"{k} {d:.2f} s ({d / total * 100:.0f} %)" for d, k in busy))
        return 0
    finally:
        env.close()


if __name__ == "__main__":
    sys.exit(main())
