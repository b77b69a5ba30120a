"""800 requests (8 connections x 100 streams) declaring content-length 65536 and sending
65535 bytes, so each would hold a read-ahead body forever. The buffered-request budget admits
what fits each connection's share (4 MiB), refuses the rest with 503 (counted), and the body
idle timeout then cuts the admitted ones; legitimate requests keep being served."""

import asyncio
import contextlib
import time

import lib
from attacks import Attack

CONNECTIONS = 8
STREAMS = 100
DECLARED = 65536


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("buffered_request_bytes_per_connection") + p.limit("buffered_request_bytes")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    t0 = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(lib.open_client(env)) for _ in range(CONNECTIONS)]
        streams = []
        body = b"x" * (DECLARED - 1)
        for c in clients:
            for _ in range(STREAMS):
                sid = c.new_stream()
                c.h3.send_headers(sid, lib.request_headers("/", "POST", [("content-length", str(DECLARED))]))
                c.h3.send_data(sid, body, end_stream=False)
                streams.append((c, sid))
            c.transmit()
            await asyncio.sleep(0)
        answered = lambda: sum(1 for c, sid in streams if sid in c.status or sid in c.resets)  # noqa: E731
        peak = [0.0]

        def done():
            peak[0] = max(peak[0], p.metrics().get("h3_ingress_buffered_request_bytes", 0))
            return answered() == len(streams)

        took = await lib.wait_until(done, 50, 0.25)
        held = peak[0] / 2**20
        statuses = [c.status.get(sid) for c, sid in streams]
    r = legit.finish()
    refused = statuses.count(503)
    cut = statuses.count(408)
    after = p.metrics().get("h3_ingress_buffered_request_bytes", -1)
    delta = p.limit("buffered_request_bytes_per_connection") + p.limit("buffered_request_bytes") - before
    checks = lib.standard_checks(env, rss, 96, delta, r) + [
        (f"{refused} refused with 503", refused > 0),
        (f"{cut} admitted ones cut with 408", cut > 0 and refused + cut == len(streams)),
        (f"budget returned to {after:g} bytes", after == 0),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["503/408"] = f"{refused}/{cut}"
    numbers["budget peak"] = f"{held:.1f} MiB"
    numbers["all answered after"] = f"{took:.0f} s" if took is not None else "never"
    return lib.Outcome(numbers, checks)


ATTACK = Attack("pre-read exhaustion, 800 x content-length 65536 with 65535 sent",
                "bounded memory, 503s counted, legit served", run)
