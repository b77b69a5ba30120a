#!/usr/bin/env python3
"""Clients that run across a restart or rollout of an HTTP/3 server, on aioquic, and report
every request: the three kinds a browser population produces.

- new: a new QUIC connection for every request, one request every --interval;
- kept: one connection doing a request every --interval; when a request fails on it the
  client closes that connection and retries the request once on a new one (a browser does
  this for a request the server never processed, which the test checks against the
  upstream's access log: every attempt carries its own id in the query string);
- slow: one download that spans the whole run (the server side throttles it).

It runs for --duration seconds (the slow download may take longer; the client waits for it)
and prints one JSON document:

  {"new":  [{"id", "start", "ms", "status", "error"}],
   "kept": [{"id", "start", "ms", "status", "error", "attempt", "connection"}],
   "kept_connections": [{"index", "opened", "closed", "close": {"by", "code", "reason"}}],
   "slow": {"start", "ms", "status", "bytes", "sha256", "error"}}

`start` is the wall-clock time (seconds since the epoch), so a test can compare it with
the moments it restarted the server. Request ids are `[PREFIX]new-N` and
`[PREFIX]kept-N-aATTEMPT` (--id-prefix). Exit 0 when the run completed (whatever the results).
"""

import argparse
import asyncio
import hashlib
import json
import ssl
import sys
import time

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3 import events as h3e
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.quic import events as qe
from aioquic.quic.configuration import QuicConfiguration


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = H3Connection(self._quic)
        self.streams = {}
        self.closed = None

    def quic_event_received(self, event):
        if isinstance(event, qe.ConnectionTerminated):
            self.closed = {
                "by": "peer",
                "code": event.error_code,
                "reason": event.reason_phrase,
            }
            for s in self.streams.values():
                if not s["done"].done():
                    s["error"] = f"connection closed (code {event.error_code} {event.reason_phrase!r})"
                    s["done"].set_result(None)
        if isinstance(event, qe.StreamReset) and event.stream_id in self.streams:
            s = self.streams[event.stream_id]
            if not s["done"].done():
                s["error"] = f"stream reset (code {event.error_code})"
                s["done"].set_result(None)
        for ev in self.h3.handle_event(event):
            s = self.streams.get(getattr(ev, "stream_id", None))
            if s is None:
                continue
            if isinstance(ev, h3e.HeadersReceived) and s["status"] is None:
                s["status"] = int(dict(ev.headers).get(b":status", b"0"))
            elif isinstance(ev, h3e.DataReceived):
                s["bytes"] += len(ev.data)
                s["hash"].update(ev.data)
            if getattr(ev, "stream_ended", False) and not s["done"].done():
                s["done"].set_result(None)

    async def get(self, authority, path, timeout):
        sid = self._quic.get_next_available_stream_id()
        s = {
            "status": None,
            "bytes": 0,
            "hash": hashlib.sha256(),
            "error": None,
            "done": asyncio.get_running_loop().create_future(),
        }
        self.streams[sid] = s
        self.h3.send_headers(
            sid,
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", authority.encode()),
                (b":path", path.encode()),
                (b"user-agent", b"rollclient.py"),
            ],
            end_stream=True,
        )
        self.transmit()
        try:
            await asyncio.wait_for(asyncio.shield(s["done"]), timeout)
        except asyncio.TimeoutError:
            s["error"] = "timeout"
        return s


def config(args):
    c = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=args.host)
    c.idle_timeout = 30.0
    if args.cacert:
        c.load_verify_locations(cafile=args.cacert)
    else:
        c.verify_mode = ssl.CERT_NONE
    return c


def result(rid, t0, s=None, error=None):
    out = {"id": rid, "start": t0, "ms": round((time.time() - t0) * 1000, 1)}
    if s is not None:
        out.update(status=s["status"], error=s["error"])
        if s["error"] is None and s["status"] != 200:
            out["error"] = f"status {s['status']}"
    else:
        out.update(status=None, error=error)
    return out


async def one_new(args, n):
    rid = f"{args.id_prefix}new-{n}"
    t0 = time.time()
    try:
        async with connect(args.addr, args.port, configuration=config(args),
                           create_protocol=Client, wait_connected=True) as c:
            s = await c.get(args.authority, f"/whoami?id={rid}", args.timeout)
            return result(rid, t0, s)
    except Exception as e:  # handshake failure, timeout, ICMP
        return result(rid, t0, error=f"{type(e).__name__}: {e}")


async def new_loop(args, stop):
    tasks = []
    n = 0
    while time.time() < stop:
        tasks.append(asyncio.ensure_future(one_new(args, n)))
        n += 1
        await asyncio.sleep(args.interval)
    return await asyncio.gather(*tasks)


class Kept:
    """The kept connection, reopened when a request fails on it or the server closed it."""

    def __init__(self, args):
        self.args = args
        self.cm = None
        self.client = None
        self.conns = []

    async def open(self):
        await self.close(None)
        self.cm = connect(self.args.addr, self.args.port, configuration=config(self.args),
                          create_protocol=Client, wait_connected=True)
        self.client = await self.cm.__aenter__()
        self.conns.append({"index": len(self.conns), "opened": time.time(), "closed": None, "close": None})

    async def close(self, why):
        if self.cm is None:
            return
        info = self.conns[-1]
        info["closed"] = time.time()
        info["close"] = self.client.closed or why
        try:
            await self.cm.__aexit__(None, None, None)
        except Exception:
            pass
        self.cm = self.client = None


async def kept_loop(args, stop):
    k = Kept(args)
    out = []
    n = 0
    while time.time() < stop:
        t_next = time.time() + args.interval
        for attempt in (1, 2):
            rid = f"{args.id_prefix}kept-{n}-a{attempt}"
            t0 = time.time()
            try:
                if k.client is None or k.client.closed is not None:
                    await k.open()
                s = await k.client.get(args.authority, f"/whoami?id={rid}", args.timeout)
                r = result(rid, t0, s)
            except Exception as e:
                r = result(rid, t0, error=f"{type(e).__name__}: {e}")
            r.update(attempt=attempt, connection=len(k.conns) - 1)
            out.append(r)
            if r["error"] is None:
                break
            await k.close({"by": "local", "code": None, "reason": f"request failed: {r['error']}"})
        n += 1
        await asyncio.sleep(max(0.0, t_next - time.time()))
    await k.close({"by": "local", "code": 0, "reason": "end of run"})
    return out, k.conns


async def slow(args):
    t0 = time.time()
    try:
        async with connect(args.addr, args.port, configuration=config(args),
                           create_protocol=Client, wait_connected=True) as c:
            s = await c.get(args.authority, args.slow_path, args.slow_timeout)
            r = result("slow", t0, s)
            r.update(bytes=s["bytes"], sha256=s["hash"].hexdigest())
            return r
    except Exception as e:
        r = result("slow", t0, error=f"{type(e).__name__}: {e}")
        r.update(bytes=0, sha256=None)
        return r


async def nothing():
    return [], []


async def run(args):
    stop = time.time() + args.duration
    slow_task = asyncio.ensure_future(slow(args)) if args.slow_path else None
    kept_task = kept_loop(args, stop) if not args.no_kept else nothing()
    new, (kept, conns) = await asyncio.gather(new_loop(args, stop), kept_task)
    return {
        "new": new,
        "kept": kept,
        "kept_connections": conns,
        "slow": await slow_task if slow_task else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", required=True, help="TLS server name and :authority")
    p.add_argument("--addr", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--cacert")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--interval", type=float, default=0.2)
    p.add_argument("--timeout", type=float, default=10.0, help="per request, seconds")
    p.add_argument("--slow-path", help="path of the slow download (none: no slow client)")
    p.add_argument("--slow-timeout", type=float, default=120.0)
    p.add_argument("--no-kept", action="store_true", help="no kept-connection client")
    p.add_argument("--ready-file", help="touched once the clients have started")
    p.add_argument("--id-prefix", default="",
                   help="prefix of every request id, so that clients whose upstream access logs "
                        "are read together (one per node, one run after another) never share one")
    args = p.parse_args()
    args.authority = args.host if args.port == 443 else f"{args.host}:{args.port}"
    if args.ready_file:
        open(args.ready_file, "w").close()
    print(json.dumps(asyncio.run(run(args)), indent=1))


if __name__ == "__main__":
    sys.exit(main())
