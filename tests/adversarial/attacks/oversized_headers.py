"""A HEADERS frame declaring 1 GiB, its payload pushed as fast as flow control lets it for
8 s. h3 0.0.8 alone buffers it whole (granting credit as it reads); the proxy must refuse it
from its frame header: STOP_SENDING/RESET_STREAM with H3_EXCESSIVE_LOAD, and no credit. Then
an oversized frame on the control stream must close the connection with H3_EXCESSIVE_LOAD."""

import asyncio
import time

import lib
from attacks import Attack

PUSH_SECONDS = 8
CHUNK = 256 * 1024


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("headers_frame")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    async with lib.open_client(env) as c:
        sid = c.new_stream()
        c.send_raw(sid, lib.var(0x01) + lib.var(1 << 30))
        pushed, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < PUSH_SECONDS and sid not in c.stops:
            # Keep a bounded backlog in aioquic; the server's credit decides what leaves.
            if c.unsent(sid) < 4 * CHUNK:
                try:
                    c.send_raw(sid, b"\0" * CHUNK)
                except RuntimeError:  # aioquic: the stream was stopped
                    break
                pushed += CHUNK
            await asyncio.sleep(0.01)
        stopped_after = time.monotonic() - t0
        await lib.wait_until(lambda: sid in c.resets, 2)
        code = c.stops.get(sid)
        reset = c.resets.get(sid)
    # The control stream: a GOAWAY declaring 1 MiB closes the connection (aioquic's control
    # stream is its first client uni stream, ID 2).
    control0 = p.limit("control_frame")
    async with lib.open_client(env) as c:
        c.send_raw(2, lib.var(0x07) + lib.var(1 << 20))
        await lib.wait_until(lambda: c.closed_with is not None, 5)
        closed = c.closed_with
    control = p.limit("control_frame") - control0
    await asyncio.sleep(1)
    r = legit.finish()
    delta = p.limit("headers_frame") - before
    checks = lib.standard_checks(env, rss, 32, delta, r) + [
        (f"STOP_SENDING code {code} is H3_EXCESSIVE_LOAD", code == lib.H3_EXCESSIVE_LOAD),
        (f"RESET_STREAM code {reset} is H3_EXCESSIVE_LOAD", reset == lib.H3_EXCESSIVE_LOAD),
        (f"oversized control frame closed the connection with {closed} (+{control:g} counted)",
         closed == lib.H3_EXCESSIVE_LOAD and control == 1),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["refused after"] = f"{stopped_after * 1000:.0f} ms"
    return lib.Outcome(numbers, checks)


ATTACK = Attack("oversized HEADERS frame (1 GiB declared)", "RSS growth <= 32 MB, stream refused", run)
