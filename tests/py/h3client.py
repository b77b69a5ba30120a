#!/usr/bin/env python3
"""HTTP/3 test client on aioquic: a second, independent HTTP/3 implementation for judging
h3-ingress (and any other HTTP/3 server).

All requests share ONE QUIC connection. One JSON document is printed on stdout:

  {
    "exit_code": 0,
    "connection": {
      "url", "server_name", "peer",              # peer = "ADDR:PORT" actually used
      "handshake": {"ok": true, "ms": 3.1, "alpn": "h3", "session_resumed": false}
                 | {"ok": false, "kind": "tls_alert"|"closed"|"timeout"|"unreachable",
                    "detail": ...},
      "server_cert": {"sha256", "subject", "issuer", "san": [...], "not_after",
                      "chain_length"} | null,
      "close": {"by": "peer"|"local", "space": "transport"|"application",
                "error_code", "error_name", "frame_type", "reason",
                "tls_alert", "tls_alert_name"} | null   # null: we closed it normally
    },
    "requests": [
      {"index", "name", "stream_id", "method", "path",
       "status": 200 | null, "interim_statuses": [100],
       "headers": [[name, value], ...], "trailers": [[name, value], ...],
       "body_length", "body_sha256", "ttfb_ms", "total_ms",
       "reset": {"error_code", "error_name"} | null,          # peer RESET_STREAM
       "stop_sending": {"error_code", "error_name"} | null,   # peer STOP_SENDING
       "error": null | "timeout" | "connection closed" | "...",
       "body": "..." | "body_base64": "..."}                  # only with output "-"
    ]
  }

Exit codes: 0 the handshake worked and the connection was not torn down with an error
(individual streams may still have been reset or answered 4xx/5xx: check them);
3 handshake failed (TLS alert, close, timeout, ICMP unreachable); 4 the connection
failed after the handshake (closed with an error, or closed while requests were
pending); 2 usage error; 1 internal error of this script.

--requests takes a JSON list (or @FILE) of request specs, sent in order (or all at
once with --parallel):
  {"name": "label", "method": "GET", "path": "/x" | "url": "https://...",
   "headers": [["name", "value"], ...],          # added after the pseudo-headers
   "raw_headers": [["name", "value"], ...],      # the WHOLE header list, verbatim
   "body": "text" | "body_file": "path" | "body_size": N,
   "end_stream": true,                           # false: leave the request open
   "body_seconds": S,                            # send the body spread evenly over S s
   "fin_seconds": S,                             # without a body: end the stream S s
                                                 # after the HEADERS, not with them
   "partial_headers": N,                         # send only the start of a HEADERS frame
                                                 # declaring N bytes, never the rest
   "delay": seconds,                             # wait before sending (with --parallel)
   "output": "-" | "path",                       # where the response body goes
   "timeout": seconds}
Header strings are encoded as Latin-1, so "\\u0000".."\\u00ff" are single raw bytes
(NUL, CR, LF, uppercase names all go out as given). raw_headers are not validated
by this client (aioquic's send path does not validate); responses ARE validated by
aioquic, and a malformed response closes the connection with H3_MESSAGE_ERROR, which
this client reports. One exception: the content-length of a response to HEAD is not
checked against the (empty) body, which aioquic would otherwise get wrong.
"""

import argparse
import asyncio
import base64
import hashlib
import json
import socket
import ssl
import sys
import time
from urllib.parse import urlsplit

try:
    import aioquic
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3 import events as h3e
    from aioquic.h3.connection import ErrorCode as H3ErrorCode
    from aioquic.h3.connection import H3Connection
    from aioquic.quic import events as qe
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    from aioquic.quic.packet import QuicErrorCode
    from aioquic.tls import AlertDescription
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
except ImportError as exc:  # pragma: no cover
    print(json.dumps({"exit_code": 1, "error": f"missing dependency: {exc} (run scripts/setup.sh)"}))
    sys.exit(1)

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_HANDSHAKE, EXIT_CONNECTION = 0, 1, 2, 3, 4
CRYPTO_ERROR = 0x100  # transport error space: 0x100 + TLS alert
NO_ERROR_CODES = {("transport", 0), ("application", int(H3ErrorCode.H3_NO_ERROR))}
CHUNK = 64 * 1024


def b(s):
    """Header text to bytes: Latin-1 keeps every code point <= 0xff as one raw byte."""
    if isinstance(s, bytes):
        return s
    try:
        return s.encode("latin-1")
    except UnicodeEncodeError:
        return s.encode("utf-8")


def t(bs):
    return bs.decode("latin-1")


def h3_error_name(code):
    try:
        return H3ErrorCode(code).name
    except ValueError:
        return f"0x{code:x}"


def transport_error_name(code):
    if CRYPTO_ERROR <= code <= CRYPTO_ERROR + 0xFF:
        return "CRYPTO_ERROR"
    try:
        return QuicErrorCode(code).name
    except ValueError:
        return f"0x{code:x}"


def alert_name(alert):
    try:
        return AlertDescription(alert).name
    except ValueError:
        return f"alert_{alert}"


def ms(a, z):
    return None if a is None or z is None else round((z - a) * 1000.0, 3)


class H3(H3Connection):
    """aioquic's H3Connection with one documented leniency: a HEAD response carries the
    content-length of the GET it stands for, with no body (RFC 9110 9.3.2); aioquic
    would call that a content-length mismatch and kill the connection."""

    def __init__(self, quic):
        super().__init__(quic)
        self.head_streams = set()

    def _check_content_length(self, stream):
        if stream.stream_id in self.head_streams:
            return
        super()._check_content_length(stream)


class Request:
    def __init__(self, index, spec, loop):
        self.index = index
        self.spec = spec
        self.name = spec.get("name")
        self.stream_id = None
        self.method = None
        self.path = None
        self.status = None
        self.interim = []
        self.headers = []
        self.trailers = []
        self.hasher = hashlib.sha256()
        self.length = 0
        self.t_start = None
        self.t_first = None
        self.t_end = None
        self.reset = None
        self.stop_sending = None
        self.error = None
        self.output = spec.get("output")
        self.body_buf = bytearray() if self.output == "-" else None
        self.body_file = None
        self.done = loop.create_future()

    def finish(self, now, error=None):
        if self.done.done():
            return
        if error and not self.error:
            self.error = error
        self.t_end = now
        if self.body_file:
            self.body_file.close()
        self.done.set_result(None)

    def to_json(self):
        out = {
            "index": self.index,
            "name": self.name,
            "stream_id": self.stream_id,
            "method": self.method,
            "path": self.path,
            "status": self.status,
            "interim_statuses": self.interim,
            "headers": [[t(k), t(v)] for k, v in self.headers],
            "trailers": [[t(k), t(v)] for k, v in self.trailers],
            "body_length": self.length,
            "body_sha256": self.hasher.hexdigest(),
            "ttfb_ms": ms(self.t_start, self.t_first),
            "total_ms": ms(self.t_start, self.t_end),
            "reset": self.reset,
            "stop_sending": self.stop_sending,
            "error": self.error,
        }
        if self.body_buf is not None:
            try:
                out["body"] = bytes(self.body_buf).decode("utf-8")
            except UnicodeDecodeError:
                out["body_base64"] = base64.b64encode(bytes(self.body_buf)).decode()
        return out


class Client(QuicConnectionProtocol):
    def __init__(self, quic, *args, **kwargs):
        super().__init__(quic, *args, **kwargs)
        self.h3 = H3(quic)
        self.requests = {}
        self.handshake = None
        self.t_connect = None
        self.close_info = None
        self.local_close = None
        self.closing = False
        self.icmp_error = None
        # Remember closes we initiate (TLS alert on our side, H3 protocol error) so the
        # report can tell them from the peer's CONNECTION_CLOSE.
        original_close = quic.close

        def close(error_code=0, frame_type=None, reason_phrase=""):
            if not self.closing and self.local_close is None:
                self.local_close = True
            original_close(error_code=error_code, frame_type=frame_type, reason_phrase=reason_phrase)

        quic.close = close

    def now(self):
        return time.monotonic()

    def error_received(self, exc):
        # Connected UDP socket: the kernel reports ICMP port/host unreachable here.
        self.icmp_error = f"{type(exc).__name__}: {exc}"
        waiter = self._connected_waiter
        if waiter is not None and not waiter.done():
            self._connected_waiter = None
            waiter.set_exception(ConnectionError(self.icmp_error))

    def quic_event_received(self, event):
        now = self.now()
        if isinstance(event, qe.HandshakeCompleted):
            self.handshake = {
                "ok": True,
                "ms": ms(self.t_connect, now),
                "alpn": event.alpn_protocol,
                "session_resumed": event.session_resumed,
            }
        elif isinstance(event, qe.StreamReset):
            r = self.requests.get(event.stream_id)
            if r:
                r.reset = {"error_code": event.error_code, "error_name": h3_error_name(event.error_code)}
                r.finish(now)
        elif isinstance(event, qe.StopSendingReceived):
            r = self.requests.get(event.stream_id)
            if r:
                r.stop_sending = {"error_code": event.error_code, "error_name": h3_error_name(event.error_code)}
        elif isinstance(event, qe.ConnectionTerminated):
            if not self.closing:
                self.close_info = self.describe_close(event)
            for r in self.requests.values():
                r.finish(now, error="connection closed")

        for ev in self.h3.handle_event(event):
            self.h3_event(ev, now)

    def describe_close(self, event):
        space = "application" if event.frame_type is None else "transport"
        code = event.error_code
        info = {
            "by": "local" if self.local_close else "peer",
            "space": space,
            "error_code": code,
            "error_name": h3_error_name(code) if space == "application" else transport_error_name(code),
            "frame_type": event.frame_type,
            "reason": event.reason_phrase,
            "tls_alert": None,
            "tls_alert_name": None,
        }
        if space == "transport" and CRYPTO_ERROR <= code <= CRYPTO_ERROR + 0xFF:
            info["tls_alert"] = code - CRYPTO_ERROR
            info["tls_alert_name"] = alert_name(code - CRYPTO_ERROR)
        return info

    def h3_event(self, ev, now):
        r = self.requests.get(getattr(ev, "stream_id", None))
        if r is None:
            return
        if isinstance(ev, h3e.HeadersReceived):
            if r.t_first is None:
                r.t_first = now
            if r.status is None:
                status = dict(ev.headers).get(b":status", b"")
                code = int(status) if status.isdigit() else None
                if code is not None and 100 <= code < 200:
                    r.interim.append(code)
                else:
                    r.status = code
                    r.headers = list(ev.headers)
            else:
                r.trailers = list(ev.headers)
        elif isinstance(ev, h3e.DataReceived):
            if ev.data:
                if r.t_first is None:
                    r.t_first = now
                r.length += len(ev.data)
                r.hasher.update(ev.data)
                if r.body_buf is not None:
                    r.body_buf.extend(ev.data)
                elif r.body_file is not None:
                    r.body_file.write(ev.data)
        if getattr(ev, "stream_ended", False):
            r.finish(now)

    def start_request(self, r, authority, default_path):
        spec = r.spec
        body = None
        if "body" in spec:
            body = b(spec["body"]) if isinstance(spec["body"], str) else bytes(spec["body"])
        elif "body_file" in spec:
            with open(spec["body_file"], "rb") as f:
                body = f.read()
        elif "body_size" in spec:
            n = int(spec["body_size"])
            body = (bytes(range(256)) * (n // 256 + 1))[:n]

        if "raw_headers" in spec:
            headers = [(b(k), b(v)) for k, v in spec["raw_headers"]]
            hd = dict(headers)
            r.method = t(hd.get(b":method", b""))
            r.path = t(hd.get(b":path", b""))
        else:
            url = spec.get("url")
            if url:
                u = urlsplit(url)
                path = (u.path or "/") + (f"?{u.query}" if u.query else "")
                auth = u.netloc
            else:
                path = spec.get("path", default_path)
                auth = authority
            method = spec.get("method") or ("PUT" if body is not None else "GET")
            headers = [
                (b":method", b(method)),
                (b":scheme", b"https"),
                (b":authority", b(auth)),
                (b":path", b(path)),
                (b"user-agent", b(f"h3client.py aioquic/{aioquic.__version__}")),
            ]
            extra = [(b(k).lower(), b(v)) for k, v in spec.get("headers", [])]
            if body is not None and not any(k == b"content-length" for k, _ in extra):
                headers.append((b"content-length", str(len(body)).encode()))
            headers += extra
            r.method, r.path = method, path

        if r.output not in (None, "-"):
            r.body_file = open(r.output, "wb")
        end_stream = spec.get("end_stream", True)
        stream_id = self._quic.get_next_available_stream_id()
        r.stream_id = stream_id
        self.requests[stream_id] = r
        if r.method.upper() == "HEAD":
            self.h3.head_streams.add(stream_id)
        r.t_start = self.now()
        if "partial_headers" in spec:
            # A HEADERS frame (type 0x01) whose declared length never arrives in full.
            n = int(spec["partial_headers"])
            self._quic.send_stream_data(stream_id, b"\x01" + varint(n) + b"\0" * min(10, n - 1))
            self.transmit()
            return None
        if not body and "fin_seconds" in spec:
            self.h3.send_headers(stream_id, headers, end_stream=False)
            self.transmit()
            return self.trickle(stream_id, b"", float(spec["fin_seconds"]), end_stream)
        self.h3.send_headers(stream_id, headers, end_stream=end_stream and not body)
        if body and "body_seconds" in spec:
            self.transmit()
            return self.trickle(stream_id, body, float(spec["body_seconds"]), end_stream)
        if body:
            for off in range(0, len(body), CHUNK):
                last = off + CHUNK >= len(body)
                self.h3.send_data(stream_id, body[off : off + CHUNK], end_stream=end_stream and last)
        self.transmit()

    async def trickle(self, stream_id, body, seconds, end_stream):
        """Sends `body` in 20 pieces a second, spread evenly over `seconds` (an empty body:
        only the end of the stream, after `seconds`)."""
        pieces = max(1, int(seconds * 20))
        size = max(1, -(-len(body) // pieces))
        for off in range(0, max(1, len(body)), size):
            await asyncio.sleep(seconds / pieces)
            if self.closing or self.close_info is not None:
                return
            last = off + size >= len(body)
            try:
                self.h3.send_data(stream_id, body[off : off + size], end_stream=end_stream and last)
            except Exception:  # the stream was reset or stopped by the peer
                return
            self.transmit()

    def ping(self):
        self._quic.send_ping(int(self.now() * 1000))
        self.transmit()

    def cancel(self, r):
        # Abandon a timed-out request the way a browser would.
        try:
            code = int(H3ErrorCode.H3_REQUEST_CANCELLED)
            self._quic.reset_stream(r.stream_id, code)
            self._quic.stop_stream(r.stream_id, code)
            self.transmit()
        except Exception:  # the stream may already be gone
            pass


def varint(v):
    """A QUIC variable-length integer (RFC 9000 16)."""
    for bits, prefix in ((6, 0), (14, 0x40), (30, 0x80), (62, 0xC0)):
        if v < 1 << bits:
            n = (bits + 2) // 8
            return (v | prefix << (8 * n - 8)).to_bytes(n, "big")
    raise ValueError(v)


def parse_resolve(entries):
    table = {}
    for e in entries or []:
        try:
            host, port, addr = e.split(":", 2)
            table[(host.lower(), int(port))] = addr.strip("[]")
        except ValueError:
            raise SystemExit(f"--resolve wants HOST:PORT:ADDR, got {e!r}")
    return table


def cert_info(tls):
    cert = getattr(tls, "_peer_certificate", None)
    if cert is None:
        return None
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        san = ext.get_values_for_type(x509.DNSName) + [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]
    except x509.ExtensionNotFound:
        san = []
    try:
        not_after = cert.not_valid_after_utc.isoformat()
    except AttributeError:  # older cryptography
        not_after = cert.not_valid_after.isoformat()
    return {
        "sha256": cert.fingerprint(hashes.SHA256()).hex(),
        "subject": cert.subject.rfc4514_string(),
        "issuer": cert.issuer.rfc4514_string(),
        "san": san,
        "not_after": not_after,
        "chain_length": 1 + len(getattr(tls, "_peer_certificate_chain", []) or []),
    }


def build_specs(args):
    if args.requests:
        text = args.requests
        if text.startswith("@"):
            with open(text[1:]) as f:
                text = f.read()
        specs = json.loads(text)
        if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
            raise SystemExit("--requests must be a JSON list of objects")
        return specs
    spec = {}
    if args.method:
        spec["method"] = args.method
    if args.upload:
        spec["body_file"] = args.upload
    if args.header:
        hs = []
        for h in args.header:
            if ":" not in h:
                raise SystemExit(f"--header wants 'name: value', got {h!r}")
            k, v = h.split(":", 1)
            hs.append([k.strip(), v.strip()])
        spec["headers"] = hs
    if args.raw_headers:
        spec["raw_headers"] = json.loads(args.raw_headers)
    if args.output:
        spec["output"] = args.output
    return [spec]


async def run(args):
    u = urlsplit(args.url)
    if u.scheme != "https" or not u.hostname:
        raise SystemExit(f"URL must be https://HOST[:PORT]/..., got {args.url!r}")
    host = u.hostname
    port = u.port or 443
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    specs = build_specs(args)
    target = parse_resolve(args.resolve).get((host.lower(), port), host)

    report = {"exit_code": None, "connection": {"url": args.url, "server_name": host}, "requests": []}
    conn = report["connection"]

    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(target, port, type=socket.SOCK_DGRAM)
    except OSError as exc:
        conn["handshake"] = {"ok": False, "kind": "unreachable", "detail": f"resolve {target}: {exc}"}
        report["exit_code"] = EXIT_HANDSHAKE
        return report
    family, _, _, _, addr = infos[0]
    conn["peer"] = f"[{addr[0]}]:{addr[1]}" if family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"

    config = QuicConfiguration(is_client=True, alpn_protocols=args.alpn or ["h3"], server_name=host)
    config.idle_timeout = args.idle_timeout
    if args.insecure:
        config.verify_mode = ssl.CERT_NONE
    elif args.cacert:
        config.load_verify_locations(cafile=args.cacert)
    quic = QuicConnection(configuration=config)

    # Own socket, connected, of the target's family: IPv4 targets get a real AF_INET
    # client (not a v4-mapped dual-stack one), and ICMP errors reach us.
    sock = socket.socket(family, socket.SOCK_DGRAM)
    if args.bind:
        # A chosen source address: on loopback any 127.0.0.0/8 address is ours, so one
        # machine can play clients at several addresses.
        sock.bind((args.bind, 0))
    sock.connect(addr)
    transport, proto = await loop.create_datagram_endpoint(lambda: Client(quic), sock=sock)
    proto.t_connect = proto.now()
    try:
        proto.connect(addr)
        try:
            await asyncio.wait_for(proto.wait_connected(), args.connect_timeout)
        except (ConnectionError, asyncio.TimeoutError) as exc:
            if proto.icmp_error:
                hs = {"ok": False, "kind": "unreachable", "detail": proto.icmp_error}
            elif proto.close_info:
                kind = "tls_alert" if proto.close_info["tls_alert"] is not None else "closed"
                hs = {"ok": False, "kind": kind, "detail": proto.close_info}
            elif isinstance(exc, asyncio.TimeoutError):
                hs = {"ok": False, "kind": "timeout", "detail": f"no handshake within {args.connect_timeout}s"}
            else:
                hs = {"ok": False, "kind": "closed", "detail": str(exc)}
            conn["handshake"] = hs
            conn["server_cert"] = cert_info(quic.tls)
            conn["close"] = proto.close_info
            report["exit_code"] = EXIT_HANDSHAKE
            return report

        conn["handshake"] = proto.handshake
        conn["server_cert"] = cert_info(quic.tls)

        authority = u.netloc
        reqs = [Request(i, s, loop) for i, s in enumerate(specs)]

        async def one(r):
            if r.spec.get("delay"):
                await asyncio.sleep(float(r.spec["delay"]))
            if proto.close_info is not None:
                r.error = "connection closed before the request was sent"
                return
            try:
                trickle = proto.start_request(r, authority, path)
            except Exception as exc:  # e.g. aioquic refusing a frame sequence
                r.error = f"local send error: {type(exc).__name__}: {exc}"
                return
            if trickle is not None:
                asyncio.ensure_future(trickle)
            try:
                await asyncio.wait_for(asyncio.shield(r.done), r.spec.get("timeout", args.timeout))
            except asyncio.TimeoutError:
                r.finish(proto.now(), error="timeout")
                proto.cancel(r)

        async def pings():
            while True:
                await asyncio.sleep(args.ping_interval)
                proto.ping()

        pinger = asyncio.ensure_future(pings()) if args.ping_interval else None
        if args.parallel:
            await asyncio.gather(*(one(r) for r in reqs))
        else:
            for r in reqs:
                await one(r)
        if pinger:
            pinger.cancel()
        report["requests"] = [r.to_json() for r in reqs]

        conn["close"] = proto.close_info
        failed = proto.close_info is not None and (
            (proto.close_info["space"], proto.close_info["error_code"]) not in NO_ERROR_CODES
            or any(r.error == "connection closed" for r in reqs)
        )
        report["exit_code"] = EXIT_CONNECTION if failed else EXIT_OK
        return report
    finally:
        proto.closing = True
        proto.close(error_code=int(H3ErrorCode.H3_NO_ERROR))
        try:
            await asyncio.wait_for(proto.wait_closed(), 2.0)
        except asyncio.TimeoutError:
            pass
        transport.close()


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url")
    p.add_argument("--resolve", action="append", metavar="HOST:PORT:ADDR")
    p.add_argument("--bind", metavar="ADDR", help="source address of the client's socket")
    v = p.add_mutually_exclusive_group()
    v.add_argument("--cacert", metavar="FILE")
    v.add_argument("--insecure", action="store_true")
    p.add_argument("--method")
    p.add_argument("--upload", metavar="FILE", help="send FILE as the body (method defaults to PUT)")
    p.add_argument("--header", action="append", metavar="'name: value'")
    p.add_argument("--raw-headers", metavar="JSON", help="verbatim header list for the request")
    p.add_argument("--requests", metavar="JSON|@FILE", help="several request specs on one connection")
    p.add_argument("--output", metavar="FILE|-", help="body to FILE, or '-' into the JSON")
    p.add_argument("--parallel", action="store_true", help="send all --requests at once")
    p.add_argument("--alpn", action="append", help="ALPN to offer (default h3)")
    p.add_argument("--timeout", type=float, default=30.0, help="per request, seconds")
    p.add_argument("--connect-timeout", type=float, default=10.0)
    p.add_argument("--idle-timeout", type=float, default=30.0)
    p.add_argument("--ping-interval", type=float, default=0.0,
                   help="send a QUIC PING every this many seconds (0: never)")
    args = p.parse_args()
    if args.requests and (args.raw_headers or args.method or args.upload or args.header or args.output):
        p.error("--requests carries everything per request; drop the single-request options")
    try:
        report = asyncio.run(run(args))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(json.dumps({"exit_code": EXIT_USAGE, "error": exc.code}))
            sys.exit(EXIT_USAGE)
        raise
    except Exception as exc:
        print(json.dumps({"exit_code": EXIT_INTERNAL, "error": f"{type(exc).__name__}: {exc}"}))
        sys.exit(EXIT_INTERNAL)
    print(json.dumps(report, indent=1))
    sys.exit(report["exit_code"])


if __name__ == "__main__":
    main()
