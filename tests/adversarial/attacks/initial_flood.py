"""5000 distinct, valid Initials at 1000/s, each from its own spoofed 127.x.y.z address that
never answers (the replies go nowhere). Two legitimate clients on 127.0.0.1 run through it:
one on an open connection, one opening a new connection (a handshake) for every request.
Every one of their requests must be served with p99 <= 1 s, and 35 s after the flood RSS
must be back within 48 MB of what it was before."""

import asyncio
import random
import time

import conn_tools
import lib
from attacks import Attack

COUNT = 5000
RATE = 1000
SETTLE_S = 35
RSS_BOUND_MB = 48
P99_BOUND_MS = 1000


def counters(p: lib.Proxy) -> dict:
    m = p.metrics()
    hs = lambda r: m.get(f'h3_ingress_handshakes_total{{result="{r}"}}', 0.0)  # noqa: E731
    lim = lambda n: m.get(f'h3_ingress_limits_total{{limit="{n}"}}', 0.0)  # noqa: E731
    return {"retry": lim("retry"), "refused": hs("refused"), "timeout": hs("timeout"), "ok": hs("ok"),
            "amplification": lim("amplification"), "half_open": m.get("h3_ingress_half_open_connections", 0.0)}


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    initials = conn_tools.make_initials(COUNT)
    sources = conn_tools.spoofed_sources(COUNT)
    rnd = random.Random(11)
    packets = [(src, rnd.randrange(1024, 65536), d) for src, d in zip(sources, initials)]
    before = counters(p)
    rss0 = p.rss_mb()
    p.sampler.reset()
    open_conn = lib.Legit(env)
    new_conns = conn_tools.NewConnections(env)
    await asyncio.sleep(1.5)
    cpu0 = conn_tools.cpu_seconds(p.proc.pid)
    took = await conn_tools.blast(p.port, packets, RATE)
    cpu = conn_tools.cpu_seconds(p.proc.pid) - cpu0
    flood_end = time.monotonic()
    await asyncio.sleep(2)
    r_open = open_conn.finish()
    r_new = new_conns.finish()
    peak = p.sampler.peak()
    await asyncio.sleep(max(0.0, SETTLE_S - (time.monotonic() - flood_end)))
    rss_after = p.rss_mb()
    after = counters(p)
    d = {k: after[k] - before[k] for k in before}
    back = rss_after - rss0
    checks = [
        ("proxy alive", p.alive()),
        (f"RSS {SETTLE_S} s after the flood {back:+.1f} MB from baseline <= {RSS_BOUND_MB} MB", back <= RSS_BOUND_MB),
        (f"Retry counter moved (+{d['retry']:g})", d["retry"] > 0),
        (f"no handshake left half-open ({after['half_open']:g})", after["half_open"] == 0),
    ]
    checks += conn_tools.legit_checks("open connection", r_open, P99_BOUND_MS)
    checks += conn_tools.legit_checks("new connections", r_new, P99_BOUND_MS)
    numbers = {
        "rss_mb": f"{rss0:.0f}/{peak:.0f}/{rss_after:.0f} after {SETTLE_S} s",
        "flood": f"{COUNT} in {took:.1f} s",
        # Includes the legitimate clients' requests and handshakes during the flood.
        "proxy CPU": f"{cpu:.2f} s ({cpu / COUNT * 1000:.2f} ms per Initial)",
        "retry+": f"{d['retry']:g}",
        "handshakes": f"timeout+{d['timeout']:g} refused+{d['refused']:g} ok+{d['ok']:g}",
        "withheld": f"{d['amplification']:g}",
        "legit (open conn)": conn_tools.legit_numbers(r_open),
        "legit (new conn each)": conn_tools.legit_numbers(r_new),
    }
    return lib.Outcome(numbers, checks)


ATTACK = Attack(
    "spoofed-source Initial flood (5000 at 1000/s)",
    f"legit 100 % served, p99 <= 1 s; RSS within {RSS_BOUND_MB} MB of baseline {SETTLE_S} s later",
    run,
)
