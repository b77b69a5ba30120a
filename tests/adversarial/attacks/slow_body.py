"""A POST declaring 1000 bytes whose body arrives at 1 byte/s: the body makes no progress by
the proxy's measure (at least 1 KiB per idle window), so it is cut at the body idle timeout
(30 s) with 408."""

import asyncio
import time

import lib
from attacks import Attack

IDLE_S = 30


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    before = p.limit("request_body_idle_timeout")
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    async with lib.open_client(env) as c:
        sid = c.new_stream()
        c.h3.send_headers(sid, lib.request_headers("/", "POST", [("content-length", "1000")]))
        c.transmit()
        t0 = time.monotonic()
        sent = 0
        while time.monotonic() - t0 < IDLE_S + 8 and sid not in c.status and sid not in c.resets:
            c.h3.send_data(sid, b"x", end_stream=False)
            c.transmit()
            sent += 1
            await asyncio.sleep(1)
        took = time.monotonic() - t0
        status = c.status.get(sid)
    r = legit.finish()
    delta = p.limit("request_body_idle_timeout") - before
    checks = lib.standard_checks(env, rss, 32, delta, r) + [
        (f"answered {status} after {took:.1f} s ({sent} bytes sent)",
         status == 408 and IDLE_S - 1 <= took <= IDLE_S + 3),
    ]
    numbers = lib.base_numbers(env, rss, delta, r)
    numbers["cut after"] = f"{took:.1f} s with {status}"
    return lib.Outcome(numbers, checks)


ATTACK = Attack("slow body, 1 byte/s", "cut at the body idle timeout (30 s) with 408", run)
