"""A request whose upstream stalls (nginx proxies it to a server that sends the response
head and then nothing, or nothing at all); the client then leaves: cancels the stream
(RESET_STREAM + STOP_SENDING) or closes its connection. Each time the stall server's
connection (nginx -> it) must be gone within 1 s, and the proxy's active-connection gauge
must follow."""

import asyncio
import time

import lib
from attacks import Attack

H3_REQUEST_CANCELLED = 0x10C


async def case(env: lib.Env, path: str, leave: str) -> float | None:
    stall = env.nginx.stall_headers if path == "/stall-headers" else env.nginx.stall_silent
    base = stall.open
    async with lib.open_client(env) as c:
        sid = c.new_stream()
        c.h3.send_headers(sid, lib.request_headers(path), end_stream=True)
        c.transmit()
        if await lib.wait_until(lambda: stall.open > base, 5) is None:
            return None
        if path == "/stall-headers":
            await lib.wait_until(lambda: sid in c.status, 5)
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        if leave == "stream":
            c._quic.reset_stream(sid, H3_REQUEST_CANCELLED)
            c._quic.stop_stream(sid, H3_REQUEST_CANCELLED)
            c.transmit()
            took = await lib.wait_until(lambda: stall.open == base, 5, 0.01)
            return took
        c.close()
    # Measured from the close, including the time aioquic takes to finish it.
    if await lib.wait_until(lambda: stall.open == base, 5, 0.01) is None:
        return None
    return time.monotonic() - t0


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    times = {}
    for path in ("/stall-silent", "/stall-headers"):
        for leave in ("stream", "connection"):
            times[f"{path.strip('/')}+{leave}"] = await case(env, path, leave)
    gauge = await lib.wait_until(
        lambda: p.metrics().get('h3_ingress_active_connections{family="ipv4"}', 0) <= 1, 3)
    r = legit.finish()
    worst = max((t if t is not None else 99) for t in times.values())
    checks = [
        ("proxy alive", p.alive()),
        (f"RSS growth {p.sampler.peak() - rss:.1f} MB <= 16 MB", p.sampler.peak() - rss <= 16),
        (f"legit requests served ({r['served']} ok, {r['failed']} failed)", r["served"] > 0 and r["failed"] == 0),
        (f"upstream released within 1 s in every case (worst {worst:.2f} s)", worst <= 1.0),
        ("active_connections back to the legit client's", gauge is not None),
    ]
    numbers = {
        "rss_mb": f"{rss:.0f}/{p.sampler.peak():.0f}/{p.rss_mb():.0f}",
        "legit": f"{r['served']}/{r['failed']} p99 {r['p99_ms']} ms",
        "released after": ", ".join(f"{k} {v:.2f} s" if v is not None else f"{k} never" for k, v in times.items()),
    }
    return lib.Outcome(numbers, checks)


ATTACK = Attack("client leaves during a stalled upstream", "upstream released <= 1 s", run)
