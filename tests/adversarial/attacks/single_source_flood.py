"""A connection flood from one address. First 2000 Initials from 127.0.0.2 (each from its own
port, never answered) at 1000/s: once the source holds `limits.halfOpenConnectionsPerSource`
(32) handshakes the rest must get a Retry (not a handshake: they may be spoofed in someone
else's name). Then real clients on 127.0.0.4 complete handshakes and keep their connections
open, more than `limits.connectionsPerSource` (1000) of them: the ones beyond must be refused.
A legitimate client on 127.0.0.1 must not notice."""

import asyncio
import random

import conn_tools
import lib
from attacks import Attack
from aioquic.quic.connection import QuicConnection

INITIALS = 2000
RATE = 1000
PER_SOURCE_HALF_OPEN = 32
PER_SOURCE_CONNECTIONS = 1000
HOLD = PER_SOURCE_CONNECTIONS + 60
BATCH = 16


async def open_from(env: lib.Env, src: str) -> lib.Client | None:
    """A completed connection from `src`, or None when the proxy refused or dropped it."""
    loop = asyncio.get_running_loop()
    quic = QuicConnection(configuration=lib.client_config(env.ca))
    _, proto = await loop.create_datagram_endpoint(lambda: lib.Client(quic), local_addr=(src, 0))
    proto.connect(("127.0.0.1", env.proxy.port))
    try:
        await asyncio.wait_for(proto.wait_connected(), 5)
        return proto
    except (ConnectionError, asyncio.TimeoutError):
        proto.close()
        return None


async def hold_many(env: lib.Env, src: str, n: int) -> tuple[list[lib.Client], int]:
    held, failed = [], 0
    for i in range(0, n, BATCH):
        got = await asyncio.gather(*(open_from(env, src) for _ in range(min(BATCH, n - i))))
        held += [c for c in got if c is not None]
        failed += sum(1 for c in got if c is None)
    return held, failed


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    m0 = p.metrics()
    rss = p.rss_mb()
    p.sampler.reset()
    legit = lib.Legit(env)
    new_conns = conn_tools.NewConnections(env)
    initials = conn_tools.make_initials(INITIALS)
    rnd = random.Random(7)
    ports = rnd.sample(range(1024, 65536), INITIALS)
    await conn_tools.blast(p.port, [("127.0.0.2", port, d) for port, d in zip(ports, initials)], RATE)
    m1 = p.metrics()
    held, failed = await hold_many(env, "127.0.0.4", HOLD)
    m2 = p.metrics()
    for c in held:
        c.close()
    r_open = legit.finish()
    r_new = new_conns.finish()

    def delta(a, b, name, label="limit", metric="h3_ingress_limits_total"):
        return b.get(f'{metric}{{{label}="{name}"}}', 0.0) - a.get(f'{metric}{{{label}="{name}"}}', 0.0)

    half_open_capped = delta(m0, m1, "half_open_per_source")
    retried = delta(m0, m1, "retry")
    conn_capped = delta(m1, m2, "connections_per_source")
    refused = delta(m1, m2, "refused", "result", "h3_ingress_handshakes_total")
    growth = p.sampler.peak() - rss
    checks = [
        ("proxy alive", p.alive()),
        (f"RSS growth {growth:.1f} MB <= 64 MB", growth <= 64),
        (f"Initials: the per-source half-open cap acted ({half_open_capped:g} times), each a Retry",
         half_open_capped >= INITIALS - 2 * PER_SOURCE_HALF_OPEN and retried >= half_open_capped),
        # Each refused client met the cap twice: unvalidated (a Retry), then validated (refused).
        (f"connections: {len(held)} held <= {PER_SOURCE_CONNECTIONS}, {failed} refused "
         f"(per-source cap +{conn_capped:g})",
         len(held) <= PER_SOURCE_CONNECTIONS and refused >= failed > 0 and conn_capped >= refused),
    ]
    checks += conn_tools.legit_checks("open connection", r_open, 1000)
    checks += conn_tools.legit_checks("new connections", r_new, 1000)
    numbers = {
        "rss_mb": f"{rss:.0f}/{p.sampler.peak():.0f}/{p.rss_mb():.0f}",
        "Initials": f"{INITIALS}: half_open_per_source+{half_open_capped:g} retry+{retried:g}",
        "connections": f"{HOLD} tried: {len(held)} held, connections_per_source+{conn_capped:g} refused+{refused:g}",
        "legit (open conn)": conn_tools.legit_numbers(r_open),
        "legit (new conn each)": conn_tools.legit_numbers(r_new),
    }
    return lib.Outcome(numbers, checks)


ATTACK = Attack(
    "single-source connection flood (2000 Initials, 1060 connections)",
    "per-source caps act (Retry unvalidated, refuse validated); legit from another address unaffected",
    run,
)
