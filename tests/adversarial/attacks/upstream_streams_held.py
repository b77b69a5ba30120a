"""Requests that hold their upstream stream, while a legitimate client keeps asking for the
same host:

- 200 requests (2 connections x 100 streams) that the upstream never answers: more than the
  128 streams nginx admits on one HTTP/2 connection;
- 16 downloads of 8 MiB whose client stops granting flow control after 256 KiB each.

A pooled HTTP/2 client keeps one connection per host: the first case used to leave it out of
streams, the second out of connection window, and either stalled every other request for the
host. With lanes of at most 100 requests and a connection window that covers every stream's
window, the legitimate client is served throughout."""

import asyncio
import contextlib
import time

import lib
from attacks import Attack

STALLED_CONNECTIONS = 2
STREAMS = 100
NOT_READING = 16
HOLD_S = 8


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    opened = lambda: p.metrics().get("h3_ingress_upstream_lanes_opened_total", 0)  # noqa: E731
    held = lambda: p.metrics().get("h3_ingress_upstream_requests", -1)  # noqa: E731
    before = opened()
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    stall = env.nginx.stall_silent
    async with contextlib.AsyncExitStack() as stack:
        stalled = [await stack.enter_async_context(lib.open_client(env)) for _ in range(STALLED_CONNECTIONS)]
        for c in stalled:
            for _ in range(STREAMS):
                c.h3.send_headers(c.new_stream(), lib.request_headers("/stall-silent"), end_stream=True)
            c.transmit()
        # Room for every response's head (HEADERS are flow-controlled stream data too), and
        # for 256 KiB of each body.
        reader = await stack.enter_async_context(
            lib.open_client(env, max_data=64 << 20, max_stream_data=256 << 10))
        reader.stop_granting_credit()
        downloads = []
        for _ in range(NOT_READING):
            sid = reader.new_stream()
            reader.h3.send_headers(sid, lib.request_headers("/big"), end_stream=True)
            downloads.append(sid)
        reader.transmit()
        reached = await lib.wait_until(lambda: stall.open >= STALLED_CONNECTIONS * STREAMS, 10)
        answered = await lib.wait_until(lambda: all(s in reader.status for s in downloads), 10)
        peak_held = held()
        await asyncio.sleep(HOLD_S)
        ended = sum(1 for s in downloads if s in reader.ended)
    released = await lib.wait_until(lambda: held() == 0 and stall.open == 0, 10)
    r = legit.finish()
    lanes = opened() - before
    checks = lib.standard_checks(env, rss, 64, lanes, r) + [
        (f"all {STALLED_CONNECTIONS * STREAMS} stalled requests reached the upstream ({stall.accepted})",
         reached is not None),
        (f"every download answered ({NOT_READING}), none finished unread ({ended})",
         answered is not None and ended == 0),
        (f"upstream places given back (peak {peak_held:g})", released is not None),
        (f"{lanes:g} lanes opened (100 requests each)", lanes >= 3),
    ]
    numbers = lib.base_numbers(env, rss, lanes, r)
    numbers["upstream requests peak"] = f"{peak_held:g}"
    numbers["released after"] = f"{released:.1f} s" if released is not None else "never"
    return lib.Outcome(numbers, checks)


ATTACK = Attack("200 stalled requests and 16 unread downloads on one host",
                "legit served throughout; lanes opened; places given back", run)
