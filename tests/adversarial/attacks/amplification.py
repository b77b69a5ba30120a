"""Amplification from a silent socket: one valid Initial (1200 bytes, aioquic) from each of a
few sockets that then never answer; every byte the proxy sends back within 10 s is counted.
RFC 9000 section 8 allows 3x before the address is validated. (Before the socket guard,
quinn sent 1200 + 222 + 1200 + 1200 = 3822 bytes: 3.19x.)

The same silent handshakes prove the handshake timeout: each must be dropped (counted as
`handshake_timeout`) `transport.handshakeTimeoutSeconds` (10) after its Initial, not before
and not much later, leaving no handshake half-open."""

import asyncio
import socket
import time

import conn_tools
import lib
from attacks import Attack

SOCKETS = 4
LISTEN_S = 10
FACTOR = 3.0
HANDSHAKE_TIMEOUT_S = 10
TIMEOUT_SLACK_S = 2.0


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


async def timed_out_after(p: lib.Proxy, before: float, sent_at: float) -> tuple[float, float]:
    """(handshake timeouts counted since `before`, seconds from `sent_at` until all SOCKETS were)."""
    deadline = sent_at + HANDSHAKE_TIMEOUT_S + TIMEOUT_SLACK_S
    while True:
        n = p.limit("handshake_timeout") - before
        if n >= SOCKETS or time.monotonic() > deadline:
            return n, time.monotonic() - sent_at
        await asyncio.sleep(0.1)


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("amplification")
    timeouts_before = p.limit("handshake_timeout")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    initials = conn_tools.make_initials(SOCKETS, workers=1)
    sources = [f"127.0.3.{i + 1}" for i in range(SOCKETS)]
    sent_at = time.monotonic()
    results = await asyncio.gather(*(silent(p.port, s, d) for s, d in zip(sources, initials)))
    timed_out, after_s = await timed_out_after(p, timeouts_before, sent_at)
    half_open = p.metrics().get("h3_ingress_half_open_connections", -1)
    r = legit.finish()
    delta = p.limit("amplification") - before
    ratios = [sum(got) / sent for sent, got in results]
    worst = max(ratios)
    checks = lib.standard_checks(env, rss, 16, delta, r) + [
        (f"largest reply/request ratio {worst:.3f} <= {FACTOR}", worst <= FACTOR),
        ("every socket got the server's first flight", all(got for _, got in results)),
        (f"{timed_out:g}/{SOCKETS} handshakes timed out {after_s:.1f} s after the Initials "
         f"(timeout {HANDSHAKE_TIMEOUT_S} s, +{TIMEOUT_SLACK_S} s), none left half-open ({half_open:g})",
         timed_out == SOCKETS and HANDSHAKE_TIMEOUT_S - 0.5 <= after_s <= HANDSHAKE_TIMEOUT_S + TIMEOUT_SLACK_S
         and half_open == 0),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["ratio"] = " ".join(f"{x:.3f}" for x in ratios)
    numbers["replies"] = "+".join(str(n) for n in results[0][1]) + f" for {results[0][0]} bytes"
    numbers["handshake_timeout"] = f"+{timed_out:g} at {after_s:.1f} s"
    return lib.Outcome(numbers, checks)


ATTACK = Attack(
    "amplification from a silent socket (one Initial, 10 s)",
    "reply bytes <= 3.0x request bytes; handshake dropped at the 10 s handshake timeout",
    run,
)
