"""Tools of the connection-level attacks (spoofed Initial flood, single-source flood,
amplification, restart and stateless reset): Initials made by aioquic and sent from any
127.0.0.0/8 address through a raw socket, a legitimate client that opens a NEW connection
for every request, and the stateless-reset check a client does (RFC 9000 section 10.3.1).

Run as a script it is that legitimate client: conn_tools.py legit PORT CA OUT STOPFILE
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lib  # noqa: E402


# ---------------------------------------------------------------- Initials


def _initials(n: int) -> list[bytes]:
    cfg = QuicConfiguration(is_client=True, alpn_protocols=["h3"], server_name=lib.HOST,
                            verify_mode=ssl.CERT_NONE)
    out = []
    for _ in range(n):
        c = QuicConnection(configuration=cfg)
        c.connect(("127.0.0.1", 443), now=0.0)
        out.append(c.datagrams_to_send(now=0.0)[0][0])
    return out


def make_initials(n: int, workers: int = 2) -> list[bytes]:
    """`n` distinct, valid client Initials (each a fresh aioquic connection: its own
    connection IDs, key share and ClientHello), 1200 bytes each."""
    per = [n // workers + (1 if i < n % workers else 0) for i in range(workers)]
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        parts = pool.map(_initials, per)
    return [d for p in parts for d in p]


def spoofed_sources(n: int, second_octet: int = 1) -> list[str]:
    """`n` distinct addresses 127.<second_octet..>.x.y, none of them 127.0.0.1."""
    out = []
    i = 0
    while len(out) < n:
        i += 1
        a = (second_octet << 16) + i
        out.append(f"127.{(a >> 16) & 255}.{(a >> 8) & 255}.{a & 255}")
    return out


class RawSender:
    """Sends UDP datagrams with any IPv4 source address (IP_HDRINCL; root). On loopback the
    kernel delivers them like any other datagram; the replies go to addresses where nobody
    listens, as they would for a spoofed source on the internet."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)

    def send(self, src: str, sport: int, dst_port: int, payload: bytes):
        udp = struct.pack("!HHHH", sport, dst_port, 8 + len(payload), 0) + payload  # no checksum
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                         socket.inet_aton(src), socket.inet_aton("127.0.0.1"))
        self.sock.sendto(ip + udp, ("127.0.0.1", 0))

    def close(self):
        self.sock.close()


async def blast(port: int, packets: list[tuple[str, int, bytes]], rate: float) -> float:
    """Sends (source, source port, datagram) at `rate` per second; returns seconds taken."""
    raw = RawSender()
    t0 = time.monotonic()
    try:
        for i, (src, sport, data) in enumerate(packets):
            raw.send(src, sport, port, data)
            ahead = t0 + (i + 1) / rate - time.monotonic()
            if ahead > 0.002:
                await asyncio.sleep(ahead)
    finally:
        raw.close()
    return time.monotonic() - t0


class Flood:
    """rawflood.py sending `pool` distinct valid Initials to the proxy at `rate` a second for
    `seconds`, from `sources` spoofed sources (0: a new one per datagram), in its own
    process. It builds its messages first; `ready()` waits for that, `go()` starts it."""

    def __init__(self, env: lib.Env, rate: int, seconds: int, sources: int, pool: int = 4096):
        path = env.dir / "initials.bin"
        path.write_bytes(b"".join(make_initials(pool)))
        self.out = env.dir / f"flood-{rate}-{sources}.json"
        self.go_file = self.out.with_suffix(".go")
        self.seconds = seconds
        self.proc = subprocess.Popen([sys.executable, str(lib.HERE / "rawflood.py"), str(env.proxy.port),
                                      str(path), str(rate), str(seconds), str(sources), str(self.out),
                                      str(self.go_file)])

    async def ready(self, timeout: float = 45):
        if await lib.wait_until(self.out.with_suffix(".ready").exists, timeout, 0.05) is None:
            raise RuntimeError(f"the flood's messages not ready within {timeout:.0f} s")

    def go(self):
        self.go_file.write_text("go")

    async def wait(self):
        """Until the sender is done (its time plus a margin)."""
        await asyncio.get_running_loop().run_in_executor(None, self.proc.wait, self.seconds + 20)

    def sent(self) -> dict:
        """What it sent: {"sent", "seconds", "rate"}."""
        return json.loads(self.out.read_text())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()


# ---------------------------------------------------------------- CPU


TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) per thread of `pid`, keyed `name/tid`, from /proc."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (t / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[f"{name}/{t.name}"] = (int(fields[11]) + int(fields[12])) / TICK
    return out


def cpu_seconds(pid: int) -> float:
    return sum(thread_cpu(pid).values())


# ---------------------------------------------------------------- a client per request


class NewConnections:
    """A legitimate client in its own process that opens a new connection for every GET
    (so it needs a handshake while the attack runs), one every 100 ms, until stopped."""

    def __init__(self, env: lib.Env):
        self.out = env.dir / f"legit-new-{time.monotonic_ns()}.json"
        self.stop_file = self.out.with_suffix(".stop")
        self.proc = subprocess.Popen([sys.executable, __file__, "legit", str(env.proxy.port), str(env.ca),
                                          str(self.out), str(self.stop_file)])

    def finish(self) -> dict:
        self.stop_file.write_text("stop")
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return {"served": 0, "failed": -1, "p99_ms": None}
        return json.loads(self.out.read_text())


async def _one_connection(port: int, ca: Path, seen: dict):
    """One handshake and one GET; `seen` gets the moments (monotonic) it was connected and
    had its answer, so a close that drains slowly after the answer is not a failure."""
    env = type("E", (), {"proxy": type("P", (), {"port": port}), "ca": ca})
    async with lib.open_client(env) as c:
        seen["connected"] = time.monotonic()
        sid = c.new_stream()
        c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
        c.transmit()
        await lib.wait_until(lambda: sid in c.status or sid in c.resets or c.closed_with is not None, 5, 0.005)
        seen["status"] = c.status.get(sid)
        seen["answered"] = time.monotonic()
        # Leaving the block closes the connection and waits out its draining period (three
        # probe timeouts, seconds when the flood inflated the RTT): the request is done.


async def _legit(port: int, ca: Path, out: Path, stop: Path):
    served, failed, times, failures, slowest = 0, 0, [], [], None
    deadline = time.monotonic() + 120
    while not stop.exists() and time.monotonic() < deadline:
        t0, seen = time.monotonic(), {}
        why = "no handshake"
        try:
            await asyncio.wait_for(_one_connection(port, ca, seen), 10)
        except (ConnectionError, OSError, asyncio.TimeoutError) as e:
            why = type(e).__name__
        if seen.get("status") == 200:
            served += 1
            times.append((seen["answered"] - t0) * 1000)
            if times[-1] == max(times):
                slowest = f"slowest: handshake {seen['connected'] - t0:.2f} s, answer {seen['answered'] - t0:.2f} s"
        else:
            failed += 1
            if "connected" in seen:
                why = f"connected, status {seen.get('status')}"
            failures.append(f"{why} after {time.monotonic() - t0:.1f} s")
        await asyncio.sleep(0.1)
    times.sort()
    p99 = round(times[min(len(times) - 1, int(len(times) * 0.99))], 1) if times else None
    out.write_text(json.dumps({"served": served, "failed": failed, "p99_ms": p99, "failures": failures,
                               "slowest": slowest}))


def legit_numbers(r: dict) -> str:
    return f"{r['served']}/{r['failed']} p99 {r['p99_ms']} ms"


def legit_checks(name: str, r: dict, p99_bound_ms: float) -> list[tuple[str, bool]]:
    p99 = r["p99_ms"]
    return [
        (f"{name}: all requests served ({r['served']} ok, {r['failed']} failed)",
         r["served"] > 0 and r["failed"] == 0),
        (f"{name}: p99 {p99} ms <= {p99_bound_ms:g} ms", p99 is not None and p99 <= p99_bound_ms),
    ]


# ---------------------------------------------------------------- stateless reset


def reset_tokens(quic: QuicConnection) -> set[bytes]:
    """The stateless-reset tokens the server gave this client: with its first connection ID
    (transport parameters) and with each NEW_CONNECTION_ID."""
    cids = [quic._peer_cid] + list(quic._peer_cid_available)
    return {c.stateless_reset_token for c in cids if c.stateless_reset_token}


def is_stateless_reset(datagram: bytes, tokens: set[bytes]) -> bool:
    """RFC 9000 10.3.1: a short-header datagram of at least 21 bytes whose last 16 bytes are
    a token the peer issued."""
    return len(datagram) >= 21 and datagram[0] & 0x80 == 0 and datagram[-16:] in tokens


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "legit":
    asyncio.run(_legit(int(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5])))
elif __name__ == "__main__":
    print(__doc__)
    sys.exit(2)
