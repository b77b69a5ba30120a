"""The upstream is down (its port refuses connections): 400 requests on 4 connections all
fail with 502, and the proxy writes at most 10 log lines for them (one line per cause per
minute), the periodic "N similar lines suppressed" line included."""

import contextlib

import lib
from attacks import Attack

CONNECTIONS = 4
STREAMS = 100
MAX_LINES = 10
# The suppressed-lines report comes once a minute (src/proxy/observe/logs.rs, WINDOW).
REPORT_WAIT_S = 65


async def run(env: lib.Env) -> lib.Outcome:
    p = env.proxy
    lines0 = p.log_lines()
    rss = p.rss_mb()
    p.sampler.reset()
    errors0 = p.metrics().get('h3_ingress_upstream_errors_total{kind="connect"}', 0)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(lib.open_client(env)) for _ in range(CONNECTIONS)]
        streams = []
        for c in clients:
            for _ in range(STREAMS):
                sid = c.new_stream()
                c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
                streams.append((c, sid))
            c.transmit()
        await lib.wait_until(lambda: all(sid in c.status for c, sid in streams), 20, 0.1)
        statuses = [c.status.get(sid) for c, sid in streams]
    errors = p.metrics().get('h3_ingress_upstream_errors_total{kind="connect"}', 0) - errors0
    failed = statuses.count(502)
    report = "similar log lines suppressed"
    suppressed = await lib.wait_until(lambda: report in p.log_path.read_text(), REPORT_WAIT_S, 0.5)
    lines = p.log_lines() - lines0
    checks = [
        ("proxy alive", p.alive()),
        (f"RSS growth {p.sampler.peak() - rss:.1f} MB <= 16 MB", p.sampler.peak() - rss <= 16),
        (f"{failed}/400 answered 502, {errors:g} counted", failed == 400 and errors == 400),
        (f"{lines} log lines <= {MAX_LINES}", lines <= MAX_LINES),
        ("a periodic suppressed-lines report", suppressed is not None),
    ]
    numbers = {
        "rss_mb": f"{rss:.0f}/{p.sampler.peak():.0f}/{p.rss_mb():.0f}",
        "502s": str(failed),
        "log lines": str(lines),
    }
    return lib.Outcome(numbers, checks)


ATTACK = Attack(
    "upstream down, 400 failed requests",
    f"<= {MAX_LINES} log lines",
    run,
    upstream="down",
    timeout=REPORT_WAIT_S + 40,
)
