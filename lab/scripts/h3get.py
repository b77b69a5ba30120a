#!/usr/bin/env python3
"""One HTTP/3 request over aioquic, for the lab smoke test (CI has no HTTP/3 curl).

Usage: h3get.py URL [--resolve HOST:PORT:ADDR] [--cacert FILE] [--upload FILE] [--max-time S]
                   [--bind IPV4]

Prints one JSON object: ok, status, bytes (response body, also what arrived before a time
limit ended the request), sha256, time_connect (handshake done), time_total, error. Exit code
0 only when the request completed with a 2xx status. `--bind` sends from that local IPv4
address (the lab's S6 runs a second client from a second address of the same namespace).
An independent client on purpose: the smoke test must not validate our server with our code.
"""

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import sys
import time
from urllib.parse import urlparse

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset


class H3Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.handshake_done = None
        self.done = asyncio.get_running_loop().create_future()
        self.status = None
        self.length = 0
        self.digest = hashlib.sha256()

    def finish(self, error=None):
        if not self.done.done():
            if error:
                self.done.set_exception(RuntimeError(error))
            else:
                self.done.set_result(None)

    def quic_event_received(self, event):
        if isinstance(event, HandshakeCompleted):
            self.handshake_done = time.monotonic()
        elif isinstance(event, ConnectionTerminated):
            self.finish(f"connection closed: {event.error_code} {event.reason_phrase}")
        elif isinstance(event, StreamReset):
            self.finish(f"stream reset: {event.error_code}")
        for ev in self.h3.handle_event(event):
            if isinstance(ev, HeadersReceived):
                for name, value in ev.headers:
                    if name == b":status":
                        self.status = int(value)
            elif isinstance(ev, DataReceived):
                self.length += len(ev.data)
                self.digest.update(ev.data)
            if getattr(ev, "stream_ended", False):
                self.finish()

    def send_request(self, authority, path, body):
        sid = self._quic.get_next_available_stream_id()
        headers = [
            (b":method", b"GET" if body is None else b"PUT"),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", path.encode()),
            (b"user-agent", b"h3lab-aioquic"),
        ]
        if body is not None:
            headers.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(sid, headers, end_stream=body is None)
        if body is not None:
            self.h3.send_data(sid, body, end_stream=True)
        self.transmit()


@contextlib.asynccontextmanager
async def connect_from(bind, addr, port, cfg):
    """Like aioquic's connect(), from an IPv4 socket bound to `bind` (connect() binds "::")."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((bind, 0))
    except OSError:
        sock.close()
        raise
    transport, client = await loop.create_datagram_endpoint(
        lambda: H3Client(QuicConnection(configuration=cfg)), sock=sock
    )
    try:
        client.connect((addr, port))
        await client.wait_connected()
        yield client
    finally:
        client.close()
        await client.wait_closed()
        transport.close()


async def run(args, state):
    url = urlparse(args.url)
    host, port = url.hostname, url.port or 443
    addr = host
    if args.resolve:
        r_host, r_port, r_addr = args.resolve.split(":", 2)
        if r_host == host and int(r_port) == port:
            addr = r_addr.strip("[]")
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=host)
    if args.cacert:
        cfg.load_verify_locations(args.cacert)
    body = open(args.upload, "rb").read() if args.upload else None
    authority = host if port == 443 else f"{host}:{port}"
    path = url.path or "/"
    start = time.monotonic()
    if args.bind:
        connection = connect_from(args.bind, addr, port, cfg)
    else:
        connection = connect(addr, port, configuration=cfg, create_protocol=H3Client)
    async with connection as client:
        state["client"] = client
        client.send_request(authority, path, body)
        await client.done
        end = time.monotonic()
        return {
            "status": client.status,
            "bytes": client.length,
            "sha256": client.digest.hexdigest(),
            "time_connect": (client.handshake_done or end) - start,
            "time_total": end - start,
        }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--resolve")
    p.add_argument("--cacert")
    p.add_argument("--upload")
    p.add_argument("--max-time", type=float, default=30.0)
    p.add_argument("--bind")
    args = p.parse_args()
    out = {"ok": False, "error": None}
    state = {}
    try:
        res = asyncio.run(asyncio.wait_for(run(args, state), args.max_time))
        out.update(res)
        out["ok"] = res["status"] is not None and 200 <= res["status"] < 300
        if not out["ok"]:
            out["error"] = f"status {res['status']}"
    except asyncio.TimeoutError:
        out["error"] = f"timeout after {args.max_time} s"
        if "client" in state:
            out["bytes"] = state["client"].length
    except Exception as e:  # report every failure as JSON, the caller decides
        out["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    main()
