"""Amplification from a silent socket: one valid Initial (1200 bytes, aioquic) from each of a
few sockets that then never answer; every byte the proxy sends back within 10 s is counted.
RFC 9000 section 8 allows 3x before the address is validated. (Before the socket guard,
quinn sent 1200 + 222 + 1200 + 1200 = 3822 bytes: 3.19x.)"""

import asyncio
import socket
import time

import conn_tools
import lib
from attacks import Attack

SOCKETS = 4
LISTEN_S = 10
FACTOR = 3.0


async def silent(port: int, src: str, initial: bytes) -> tuple[int, list[int]]:
    """Sends `initial` from `src`, returns (bytes sent, sizes of the datagrams received)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((src, 0))
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    s.sendto(initial, ("127.0.0.1", port))
    got = []
    end = time.monotonic() + LISTEN_S
    try:
        while (left := end - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(loop.sock_recv(s, 65535), left)
            except asyncio.TimeoutError:
                break
            got.append(len(data))
    finally:
        s.close()
    return len(initial), got


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("amplification")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    initials = conn_tools.make_initials(SOCKETS, workers=1)
    sources = [f"127.0.3.{i + 1}" for i in range(SOCKETS)]
    results = await asyncio.gather(*(silent(p.port, s, d) for s, d in zip(sources, initials)))
    r = legit.finish()
    delta = p.limit("amplification") - before
    ratios = [sum(got) / sent for sent, got in results]
    worst = max(ratios)
    checks = lib.standard_checks(env, rss, 16, delta, r) + [
        (f"largest reply/request ratio {worst:.3f} <= {FACTOR}", worst <= FACTOR),
        ("every socket got the server's first flight", all(got for _, got in results)),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["ratio"] = " ".join(f"{x:.3f}" for x in ratios)
    numbers["replies"] = "+".join(str(n) for n in results[0][1]) + f" for {results[0][0]} bytes"
    return lib.Outcome(numbers, checks)


ATTACK = Attack("amplification from a silent socket (one Initial, 10 s)", "reply bytes <= 3.0x request bytes", run)
