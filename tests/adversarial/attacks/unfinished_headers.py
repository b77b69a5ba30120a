"""1000 request streams (10 connections x 100, the default stream limit) each send the start
of a HEADERS frame and never finish it, while their connections keep PINGing. Every stream
must be refused (H3_REQUEST_REJECTED) within the header timeout (10 s) + 5 s."""

import asyncio
import contextlib
import time

import lib
from attacks import Attack

CONNECTIONS = 10
STREAMS = 100
BOUND_S = 10 + 5


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("request_headers_timeout")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(lib.open_client(env)) for _ in range(CONNECTIONS)]
        streams = []
        t0 = time.monotonic()
        for c in clients:
            for _ in range(STREAMS):
                sid = c.new_stream()
                c.send_raw(sid, lib.var(0x01) + lib.var(200) + b"\0" * 10)
                streams.append((c, sid))

        def refused():
            return sum(1 for c, sid in streams if sid in c.resets or sid in c.stops)

        async def pings():
            while True:
                for c in clients:
                    c.ping()
                await asyncio.sleep(1)

        pinger = asyncio.ensure_future(pings())
        took = await lib.wait_until(lambda: refused() == len(streams), BOUND_S + 5, 0.1)
        pinger.cancel()
        n = refused()
        codes = {c.resets.get(sid) for c, sid in streams}
    r = legit.finish()
    delta = p.limit("request_headers_timeout") - before
    closed_in = f"{took:.1f} s" if took is not None else f">{BOUND_S + 5} s"
    checks = lib.standard_checks(env, rss, 64, delta, r) + [
        (f"{n}/{len(streams)} streams refused within {closed_in}", took is not None and took <= BOUND_S),
        (f"reset codes {sorted(c for c in codes if c is not None)} are H3_REQUEST_REJECTED",
         codes == {lib.H3_REQUEST_REJECTED}),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["all closed after"] = closed_in
    return lib.Outcome(numbers, checks)


ATTACK = Attack("unfinished HEADERS x1000 streams, client PINGs", "all closed within 10 s + 5 s", run)
