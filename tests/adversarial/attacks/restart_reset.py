"""SIGKILL and restart (an OOM kill, a crashed node). A client with an open connection sends
its next request to the new process on the same port:

- with `keys.file`, the new process must answer with a stateless reset whose token is one
  the old process gave that client (RFC 9000 10.3.1: what a client accepts), within 2 s, so
  the client can reconnect at once instead of hanging until its idle timeout;
- with the default (random keys per process) it cannot, which the attack measures first so
  the check above can fail;
- a Retry token minted by one process (addressValidation always) must validate on the next
  process with the same keys; one with other keys cannot open it and asks for a Retry again.

aioquic does not act on stateless resets, so the check is done on the datagrams it receives;
tests/proxy_conn.rs shows a quinn client closing with a reset against the same proxy."""

import asyncio
import socket
import time

import conn_tools
import lib
from aioquic.asyncio.client import connect
from aioquic.quic import events as qe
from aioquic.quic.connection import QuicConnection
from attacks import Attack

RESET_BOUND_S = 2.0
CONTROL_WAIT_S = 3.0


class Watching(lib.Client):
    """A client that also keeps every datagram it receives, with its arrival time."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.datagrams: list[tuple[float, bytes]] = []

    def datagram_received(self, data, addr):
        self.datagrams.append((time.monotonic(), data))
        super().datagram_received(data, addr)


def restart(env: lib.Env, old: lib.Proxy, name: str, extra: str) -> lib.Proxy:
    old.kill()
    p = lib.Proxy(env.binary, env.dir, env.cert, env.key, env.nginx.port, port=old.port, extra=extra, name=name)
    env.cleanup.append(p.close)
    return p


async def get(c: Watching) -> float:
    """Sends GET / on `c`; returns when it was sent."""
    sid = c.new_stream()
    c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
    c.transmit()
    return time.monotonic()


async def reset_after_restart(env: lib.Env, proxy: lib.Proxy, name: str, extra: str, wait: float):
    """Connects, proves the connection works, restarts the proxy, sends a request: returns
    (seconds until a valid stateless reset or None, the new proxy)."""
    cfg = lib.client_config(env.ca)
    async with connect("127.0.0.1", proxy.port, configuration=cfg, create_protocol=Watching) as c:
        sid = c.new_stream()
        c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
        c.transmit()
        await lib.wait_until(lambda: sid in c.status, 5, 0.01)
        assert c.status.get(sid) == 200, f"first request: {c.status}"
        tokens = conn_tools.reset_tokens(c._quic)
        new = restart(env, proxy, name, extra)
        sent = await get(c)
        seen = len(c.datagrams)

        def reset_at():
            return next((t for t, d in c.datagrams[seen:] if conn_tools.is_stateless_reset(d, tokens)), None)

        await lib.wait_until(lambda: reset_at() is not None, wait, 0.01)
        at = reset_at()
        c._quic.close()  # no need to tell anyone
        return (at - sent if at is not None else None), new


def drive(sock: socket.socket, quic: QuicConnection, port: int, timeout: float) -> list:
    """Exchanges datagrams with the proxy until the handshake completes, the connection is
    terminated or `timeout` passes; returns the events."""
    events = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for data, _ in quic.datagrams_to_send(now=time.monotonic()):
            sock.sendto(data, ("127.0.0.1", port))
        sock.settimeout(max(0.01, min(0.2, end - time.monotonic())))
        try:
            data, addr = sock.recvfrom(65535)
            quic.receive_datagram(data, addr, now=time.monotonic())
        except socket.timeout:
            quic.handle_timer(now=time.monotonic())
        while (ev := quic.next_event()) is not None:
            events.append(ev)
            if isinstance(ev, (qe.HandshakeCompleted, qe.ConnectionTerminated)):
                # The client's Finished, so the server completes too.
                for data, _ in quic.datagrams_to_send(now=time.monotonic()):
                    sock.sendto(data, ("127.0.0.1", port))
                return events
    return events


def retried_client(env: lib.Env, port: int, src: str) -> tuple[socket.socket, QuicConnection, bytes]:
    """A client that got a Retry from the proxy on `port`: its socket, its state and the
    Initial carrying the token (not yet sent)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((src, 0))
    quic = QuicConnection(configuration=lib.client_config(env.ca))
    quic.connect(("127.0.0.1", port), now=time.monotonic())
    for data, _ in quic.datagrams_to_send(now=time.monotonic()):
        sock.sendto(data, ("127.0.0.1", port))
    sock.settimeout(2)
    retry, addr = sock.recvfrom(65535)
    quic.receive_datagram(retry, addr, now=time.monotonic())
    with_token = [d for d, _ in quic.datagrams_to_send(now=time.monotonic())]
    assert retry[0] & 0xF0 == 0xF0 and with_token, "expected a Retry"
    return sock, quic, with_token[0]


def handshakes(p: lib.Proxy, result: str) -> float:
    return p.metrics().get(f'h3_ingress_handshakes_total{{result="{result}"}}', 0.0)


def token_across_processes(env: lib.Env, proxy: lib.Proxy, keys: str, other: str):
    """(handshake on a second process with the same key completed, without a second Retry;
    a process with another key refused the token), the last proxy."""
    always = "addressValidation: {mode: always}\n"
    minting = restart(env, proxy, "minting", always + keys)
    s1, q1, t1 = retried_client(env, minting.port, "127.0.0.6")
    s2, q2, t2 = retried_client(env, minting.port, "127.0.0.7")
    stranger = restart(env, minting, "stranger", always + other)
    s2.sendto(t2, ("127.0.0.1", stranger.port))
    ev2 = drive(s2, q2, stranger.port, 2)
    # quinn treats a token it cannot open as no token (RFC 9000 8.1.3): a second Retry, which
    # the client must ignore, so its attempt goes nowhere.
    refused = not any(isinstance(e, qe.HandshakeCompleted) for e in ev2) and \
        handshakes(stranger, "retry") == 1 and handshakes(stranger, "ok") == 0
    same = restart(env, stranger, "same-keys", always + keys)
    s1.sendto(t1, ("127.0.0.1", same.port))
    ev1 = drive(s1, q1, same.port, 3)
    completed = any(isinstance(e, qe.HandshakeCompleted) for e in ev1)
    time.sleep(0.3)
    no_second_retry = handshakes(same, "retry") == 0 and handshakes(same, "ok") == 1
    for s in (s1, s2):
        s.close()
    return completed and no_second_retry, refused, same


async def run(env: lib.Env) -> lib.Outcome:
    keys = f"keys: {{file: {env.dir / 'quic.keys'}}}\n"
    other = f"keys: {{file: {env.dir / 'other.keys'}}}\n"
    rss = env.proxy.rss_mb()
    # The default: random keys per process.
    control, p = await reset_after_restart(env, env.proxy, "default-restarted", "", CONTROL_WAIT_S)
    # With a keys file (created by the first process that reads it).
    p = restart(env, p, "keyed", keys)
    took, p = await reset_after_restart(env, p, "keyed-restarted", keys, RESET_BOUND_S + 1)
    token_ok, token_refused, p = token_across_processes(env, p, keys, other)
    # The last process serves (every earlier one was killed under its clients).
    legit = lib.Legit(env)
    await asyncio.sleep(3)
    r = legit.finish()
    checks = [
        ("proxy alive", p.alive()),
        (f"with keys.file: valid stateless reset {took and round(took, 3)} s after the request "
         f"(<= {RESET_BOUND_S} s)", took is not None and took <= RESET_BOUND_S),
        (f"without keys.file: no valid reset within {CONTROL_WAIT_S:g} s (the problem)", control is None),
        ("Retry token from one process completes the handshake on another with the same key", token_ok),
        ("a process with another key does not take the token (Retry again)", token_refused),
        (f"legit requests on the last process served ({r['served']} ok, {r['failed']} failed)",
         r["served"] > 0 and r["failed"] == 0),
    ]
    numbers = {
        "reset after": f"{took * 1000:.1f} ms" if took is not None else "none",
        "default keys": "no reset" if control is None else f"reset after {control:.3f} s",
        "retry token": f"same key {'ok' if token_ok else 'FAILED'}, other key {'retried' if token_refused else 'ACCEPTED'}",
        "rss_mb": f"{rss:.0f}/{p.rss_mb():.0f}",
        "legit": f"{r['served']}/{r['failed']} p99 {r['p99_ms']} ms",
    }
    return lib.Outcome(numbers, checks)


ATTACK = Attack(
    "SIGKILL + restart, client with an open connection",
    f"stateless reset the client accepts <= {RESET_BOUND_S:g} s after its next packet (keys.file); Retry tokens valid across processes",
    run,
)
