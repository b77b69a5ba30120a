"""Spoofed-source Initials from a WIDE range: a new source address (and port) for every
datagram (rawflood.py, one raw socket and sendmmsg), 4096 distinct valid Initials in turn, for
8 s at 60,000/s and at 200,000/s; for reference, 200,000/s from only 1,000 sources. Both rates
outrun the accept loop (a Retry costs it about 17 µs), so the socket sheds token-less Initials
from new sources while the loop is behind (quic::backlog, counted as
limits_total{limit="accept_backlog"}): the Initials that carry a Retry token, and a real
client's resent first Initial, get in. A legitimate client opens a new connection (a handshake)
for every request throughout; every one must be served, its handshake within 1 s at 60,000/s
(before the shedding: 7.9 s, the length of the flood); within 5 s at 200,000/s is still an
open target, printed as MISSED when missed. Runs in a network
namespace of its own: the flood stays off the machine's loopback, and the replies to the
spoofed sources go nowhere. The figures are only comparable at low load: each line gives the
load average. The full ledger (initial_backlog) is no longer reached by these floods; its
constant work per Initial is held by the unit tests of quic::amplification."""

import asyncio
import os

import conn_tools
import lib
from attacks import Attack

POOL = 4096
SECONDS = 8
P99_BOUND_MS = 1000
# At 200,000/s the kernel drops part of the flood, and the legitimate client's packets with it:
# its handshake rides out lost datagrams on its probe timeouts.
P99_WIDE_MS = 5000


def counters(p: lib.Proxy) -> dict:
    m = p.metrics()
    lim = lambda n: m.get(f'h3_ingress_limits_total{{limit="{n}"}}', 0.0)  # noqa: E731
    hs = lambda r: m.get(f'h3_ingress_handshakes_total{{result="{r}"}}', 0.0)  # noqa: E731
    return {"retry": lim("retry"), "backlog": lim("initial_backlog"), "shed": lim("accept_backlog"), "ok": hs("ok"),
            "timeout": hs("timeout"), "withheld": lim("amplification"),
            "drops": sum(v for k, v in m.items() if k.startswith("h3_ingress_udp_socket_drops_total"))}


async def flood_run(env: lib.Env, rate: int, sources: int) -> lib.Outcome:
    p = env.proxy
    flood = conn_tools.Flood(env, rate, SECONDS, sources, POOL)
    try:
        await flood.ready()
        before = counters(p)
        rss0 = p.rss_mb()
        p.sampler.reset()
        legit = conn_tools.NewConnections(env)
        await asyncio.sleep(1.0)
        load = os.getloadavg()[0]
        cpu0 = conn_tools.cpu_seconds(p.proc.pid)
        flood.go()
        await flood.wait()
        cpu = conn_tools.cpu_seconds(p.proc.pid) - cpu0
    finally:
        flood.stop()
    r = legit.finish()
    sent = flood.sent()
    after = counters(p)
    d = {k: after[k] - before[k] for k in before}
    total = r["served"] + r["failed"]
    wide = sources == 0
    numbers = {
        "load1": f"{load:.1f}",
        "flood": f"{sent['sent']} in {sent['seconds']} s ({sent['rate']}/s, "
                 + ("a new source each" if wide else f"{sources} sources") + ")",
        "legit (new conn each)": f"{r['served']}/{total} p99 {r['p99_ms']} ms"
                                 + "".join(f", {f}" for f in r.get("failures", []))
                                 + (f" ({r['slowest']})" if r.get("slowest") else ""),
        "proxy CPU": f"{cpu:.1f} s ({cpu / max(sent['sent'], 1) * 1e6:.1f} µs per Initial)",
        "retry+": f"{d['retry']:g}",
        "initial_backlog+": f"{d['backlog']:g}",
        "accept_backlog+ (shed)": f"{d['shed']:g}",
        "socket drops+": f"{d['drops']:g}",
        "handshakes": f"ok+{d['ok']:g} timeout+{d['timeout']:g}",
        "rss_mb": f"{rss0:.0f}/{p.sampler.peak():.0f}",
    }
    checks = [("proxy alive", p.alive()),
              (f"the flood reached {int(rate * 0.5)}/s at least ({sent['rate']}/s)", sent["rate"] >= rate * 0.5)]
    if wide:
        # What holds the flood off: new attempts shed at the socket while the accept loop is
        # behind (quic::backlog), and past a full ledger a Retry without an entry.
        checks.append((f"new attempts shed at the socket (+{d['shed']:g}) or past a full ledger "
                       f"(+{d['backlog']:g})", d["shed"] + d["backlog"] > 0))
    checks.append((f"new connections: every one served ({r['served']} ok, {r['failed']} failed)",
                   r["served"] > 0 and r["failed"] == 0))
    p99 = r["p99_ms"]
    bound = P99_BOUND_MS if rate <= 60_000 else P99_WIDE_MS
    latency = (f"new connections: p99 {p99} ms <= {bound:g} ms", p99 is not None and p99 <= bound)
    if rate <= 60_000:
        checks.append(latency)
        return lib.Outcome(numbers, checks)
    # Open at 200,000/s: met in 2 of 3 runs (p99 0.79 and 1.43 s), missed in one (6.2 s: a
    # client's first Initial lost five times in a row; docs/reliability.md, "Wide floods").
    return lib.Outcome(numbers, checks, [latency])


def attack(rate: int, sources: int, target: str) -> Attack:
    who = "a new source per datagram" if sources == 0 else f"{sources} sources"
    return Attack(f"spoofed Initial flood, {rate:,}/s from {who}", target,
                  lambda env: flood_run(env, rate, sources), netns=True)


ATTACKS = [
    attack(60_000, 0, "legit 100 % served, p99 <= 1 s; new attempts shed while the accept loop is behind"),
    attack(200_000, 0, "legit 100 % served, p99 <= 5 s (open); new attempts shed while the accept loop is behind"),
    attack(200_000, 1000, "legit 100 % served, p99 <= 5 s (open) (reference for the wide floods)"),
]
