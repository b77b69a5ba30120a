"""Shared pieces of the adversarial suite: a PKI, Debian nginx as the TCP ingress (with stall
servers behind it), the release proxy with its DEFAULT limits, RSS sampling, /metrics
scraping, a legitimate client on its own connection, and an aioquic connection that attacks
can drive frame by frame (or byte by byte: its QUIC layer sends whatever stream bytes we give
it).

Only loopback addresses are used. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3Connection
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HOST = "a.test"
H3_EXCESSIVE_LOAD = 0x107
H3_REQUEST_REJECTED = 0x10B


# ---------------------------------------------------------------- ports, PKI


def free_port(kind=socket.SOCK_STREAM) -> int:
    """A port free for both TCP and UDP on 127.0.0.1."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        other = socket.SOCK_DGRAM if kind == socket.SOCK_STREAM else socket.SOCK_STREAM
        try:
            with socket.socket(socket.AF_INET, other) as s:
                s.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port")


def make_pki(d: Path) -> tuple[Path, Path, Path]:
    """CA and a leaf for a.test; returns (ca, cert, key) paths."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "adversarial CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOST)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(HOST)]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "leaf.pem").write_bytes(leaf.public_bytes(pem))
    (d / "leaf.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return d / "ca.pem", d / "leaf.pem", d / "leaf.key"


# ---------------------------------------------------------------- stall servers


class StallServer:
    """A plain HTTP/1.1 upstream that never finishes: `headers` mode sends a response head
    and a little body, then stalls; `silent` mode never answers. Counts open connections
    (a connection is open until its peer closes it)."""

    def __init__(self, mode: str):
        self.mode = mode
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        self.open = 0
        self.accepted = 0
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.open += 1
                self.accepted += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket):
        try:
            c.recv(65536)
            if self.mode == "headers":
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 100)
            while c.recv(65536):
                pass
        except OSError:
            pass
        finally:
            c.close()
            with self.lock:
                self.open -= 1

    def close(self):
        self.sock.close()


# ---------------------------------------------------------------- nginx


BIG_BYTES = 8 << 20

NGINX_CONF = """
daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        server_name {host};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location = /stall-headers {{ proxy_pass http://127.0.0.1:{stall_headers}; proxy_buffering off; proxy_read_timeout 300s; }}
        location = /stall-silent {{ proxy_pass http://127.0.0.1:{stall_silent}; proxy_read_timeout 300s; }}
        location = /big {{ alias {d}/big.bin; }}
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""


class Nginx:
    def __init__(self, d: Path, cert: Path, key: Path):
        self.dir = d / "nginx"
        self.dir.mkdir()
        self.port = free_port()
        self.stall_headers = StallServer("headers")
        self.stall_silent = StallServer("silent")
        conf = NGINX_CONF.format(d=self.dir, port=self.port, host=HOST, cert=cert, key=key,
                                 stall_headers=self.stall_headers.port, stall_silent=self.stall_silent.port)
        (self.dir / "nginx.conf").write_text(conf)
        # /big: a response larger than every window on the way, for clients that stop
        # reading. nginx's workers run as nobody: the path must be theirs to read.
        (self.dir / "big.bin").write_bytes(b"x" * BIG_BYTES)
        for path, mode in ((d, 0o755), (self.dir, 0o755), (self.dir / "big.bin", 0o644)):
            os.chmod(path, mode)
        nginx = os.environ.get("H3I_NGINX", "/usr/sbin/nginx")
        self.proc = subprocess.Popen([nginx, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_tcp(self.port, 10, what="nginx")

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stall_headers.close()
        self.stall_silent.close()


def wait_tcp(port: int, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {timeout}s")


# ---------------------------------------------------------------- the proxy


class Proxy:
    """The release binary with the DEFAULT settings: the file names only what a test must
    (ports on loopback, the upstream, the host). `port` reuses a UDP port (a restart);
    `extra` is YAML appended to the file, for the few attacks that need a setting (a keys
    file to survive a restart)."""

    def __init__(self, binary: Path, d: Path, cert: Path, key: Path, upstream_port: int,
                 port: int | None = None, extra: str = "", name: str = "h3-ingress"):
        self.port = port or free_port(socket.SOCK_DGRAM)
        self.admin = free_port()
        cfg = d / f"{name}.yaml"
        cfg.write_text(
            f"port: {self.port}\n"
            "addresses: {ipv4: 127.0.0.1, ipv6: null}\n"
            f"upstream: {{address: '127.0.0.1:{upstream_port}'}}\n"
            f"metrics: {{address: '127.0.0.1:{self.admin}'}}\n"
            f"hosts:\n  - {{name: {HOST}, certFile: {cert}, keyFile: {key}}}\n"
            + extra
        )
        self.log_path = d / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(binary), "proxy", "--config", str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 15
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited: {self.log_path.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/readyz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("proxy not ready within 15 s")
        self.sampler = RssSampler(self.proc.pid)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self):
        """SIGKILL, as an OOM kill or a node crash would."""
        self.proc.kill()
        self.proc.wait(5)
        self.sampler.stop()

    def rss_mb(self) -> float:
        return rss_mb(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/metrics", timeout=5).read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    pass
        return out

    def limit(self, name: str) -> float:
        return self.metrics().get(f'h3_ingress_limits_total{{limit="{name}"}}', 0.0)

    def log_lines(self) -> int:
        self.log.flush()
        return len(self.log_path.read_bytes().splitlines())

    def close(self):
        self.sampler.stop()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return 0.0


class RssSampler:
    """Samples RSS every 50 ms; `peak()` since the last `reset()`."""

    def __init__(self, pid: int):
        self.pid = pid
        self.max = 0.0
        self.running = True
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while self.running:
            try:
                self.max = max(self.max, rss_mb(self.pid))
            except OSError:
                return
            time.sleep(0.05)

    def reset(self):
        self.max = rss_mb(self.pid)

    def peak(self) -> float:
        return self.max

    def stop(self):
        self.running = False


# ---------------------------------------------------------------- clients


def client_config(ca: Path) -> QuicConfiguration:
    c = QuicConfiguration(is_client=True, alpn_protocols=["h3"], server_name=HOST)
    c.load_verify_locations(cafile=str(ca))
    c.idle_timeout = 60
    return c


class Legit:
    """A legitimate client in its own process (so the attack's CPU does not skew its
    numbers), on its own connection, sending one GET every 100 ms until stopped."""

    def __init__(self, env: "Env"):
        self.out = env.dir / f"legit-{time.monotonic_ns()}.json"
        self.stop_file = self.out.with_suffix(".stop")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "legit.py"), str(env.proxy.port), str(env.ca),
                                      str(self.out), str(self.stop_file)])

    def finish(self) -> dict:
        self.stop_file.write_text("stop")
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return {"served": 0, "failed": -1, "p99_ms": None}
        return json.loads(self.out.read_text())


class Client(QuicConnectionProtocol):
    """An aioquic connection that records per-stream resets, STOP_SENDING, responses and
    which responses ended (the peer's FIN)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.h3 = H3Connection(self._quic)
        self.resets: dict[int, int] = {}
        self.stops: dict[int, int] = {}
        self.status: dict[int, int] = {}
        self.ended: set[int] = set()
        self.closed_with: int | None = None
        self.changed = asyncio.Event()

    def quic_event_received(self, event):
        if isinstance(event, qe.StreamReset):
            self.resets[event.stream_id] = event.error_code
        elif isinstance(event, qe.StopSendingReceived):
            self.stops[event.stream_id] = event.error_code
        elif isinstance(event, qe.ConnectionTerminated):
            self.closed_with = event.error_code
        elif isinstance(event, qe.StreamDataReceived) and event.end_stream:
            self.ended.add(event.stream_id)
        for ev in self.h3.handle_event(event):
            headers = getattr(ev, "headers", None)
            if headers is not None and ev.stream_id not in self.status:
                self.status[ev.stream_id] = int(dict(headers).get(b":status", b"0"))
        self.changed.set()

    def send_raw(self, stream_id: int, data: bytes, end: bool = False):
        self._quic.send_stream_data(stream_id, data, end_stream=end)
        self.transmit()

    def new_stream(self) -> int:
        return self._quic.get_next_available_stream_id()

    def unsent(self, stream_id: int) -> int:
        s = self._quic._streams.get(stream_id)
        return len(s.sender._buffer) if s is not None else 0

    def stop_granting_credit(self):
        """Never raise MAX_DATA or MAX_STREAM_DATA again: a client that stops reading, as far
        as the server can tell (aioquic grants credit as data arrives, not as it is read)."""
        self._quic._write_stream_limits = lambda **_: None
        self._quic._write_connection_limits = lambda **_: None

    def ping(self):
        self._quic.send_ping(int(time.monotonic() * 1000))
        self.transmit()


def request_headers(path: str = "/", method: str = "GET", extra=()) -> list[tuple[bytes, bytes]]:
    return [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", HOST.encode()),
            (b":path", path.encode())] + [(k.encode(), v.encode()) for k, v in extra]


def var(v: int) -> bytes:
    if v < 64:
        return bytes([v])
    if v < 16384:
        return (v | 0x4000).to_bytes(2, "big")
    if v < 1 << 30:
        return (v | 0x8000_0000).to_bytes(4, "big")
    return (v | 0xC000_0000_0000_0000).to_bytes(8, "big")


def open_client(env: "Env", **settings):
    """`async with open_client(env) as c:` an HTTP/3 connection to the proxy; `settings` are
    QuicConfiguration attributes (max_data=..., max_stream_data=...)."""
    config = client_config(env.ca)
    for k, v in settings.items():
        setattr(config, k, v)
    return connect("127.0.0.1", env.proxy.port, configuration=config, create_protocol=Client)


async def wait_until(pred, timeout: float, step: float = 0.05) -> float | None:
    """Seconds until `pred()` held, or None after `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        await asyncio.sleep(step)
    return None


# ---------------------------------------------------------------- a network namespace


CLONE_NEWNET = 0x40000000


@contextlib.contextmanager
def own_netns(name: str):
    """Runs the block in a new network namespace with only loopback (up), on this thread:
    every process, thread and socket it starts lives there, and so does a flood, away from
    the machine's own loopback. Root only."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        there = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            if libc.setns(there, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns {name}")
            try:
                yield
            finally:
                libc.setns(home, CLONE_NEWNET)
        finally:
            os.close(there)
            os.close(home)
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


# ---------------------------------------------------------------- one attack's world


@dataclass
class Env:
    dir: Path
    binary: Path
    ca: Path
    cert: Path
    key: Path
    nginx: Nginx
    proxy: Proxy
    cleanup: list = field(default_factory=list)

    def close(self):
        for c in reversed(self.cleanup):
            try:
                c()
            except Exception:  # best effort: the next attack gets a fresh world anyway
                pass


def make_env(binary: Path, upstream: str = "nginx") -> Env:
    """nginx and a fresh proxy with default settings; `upstream="down"` points the proxy at
    a closed port instead."""
    d = Path(tempfile.mkdtemp(prefix="h3-adversarial."))
    ca, cert, key = make_pki(d)
    nginx = Nginx(d, cert, key)
    cleanup = [nginx.close]
    try:
        if upstream == "down":
            closed = socket.socket()
            closed.bind(("127.0.0.1", 0))  # bound, never listening: connects get RST
            cleanup.append(closed.close)
            port = closed.getsockname()[1]
        else:
            port = nginx.port
        proxy = Proxy(binary, d, cert, key, port)
    except Exception:
        for c in cleanup:
            c()
        raise
    cleanup.append(proxy.close)
    return Env(d, binary, ca, cert, key, nginx, proxy, cleanup)


@dataclass
class Outcome:
    """What one attack measured. `checks` are (description, passed) pairs; the attack
    passed when all did. `open` are targets the product does not meet yet, each with its
    measured figure: printed as MISSED in the table and in the summary line, never as a
    pass, and kept out of the exit status so the rest of the suite still gates."""
    numbers: dict
    checks: list[tuple[str, bool]]
    open: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(p for _, p in self.checks)


def standard_checks(env: Env, rss_before: float, rss_bound_mb: float, limit_delta: float,
                    legit: dict) -> list[tuple[str, bool]]:
    """The four assertions every attack makes."""
    growth = env.proxy.sampler.peak() - rss_before
    return [
        ("proxy alive", env.proxy.alive()),
        (f"RSS growth {growth:.1f} MB <= {rss_bound_mb} MB", growth <= rss_bound_mb),
        (f"limit counter moved (+{limit_delta:g})", limit_delta > 0),
        (f"legit requests served ({legit['served']} ok, {legit['failed']} failed)",
         legit["served"] > 0 and legit["failed"] == 0),
    ]


def base_numbers(env: Env, rss_before: float, limit_delta: float, legit: dict) -> dict:
    return {
        "rss_mb": f"{rss_before:.0f}/{env.proxy.sampler.peak():.0f}/{env.proxy.rss_mb():.0f}",
        "limit+": f"{limit_delta:g}",
        "legit": f"{legit['served']}/{legit['failed']} p99 {legit['p99_ms']} ms",
    }
