#!/usr/bin/env python3
"""One HTTPS GET over TCP that starts with a PROXY protocol header, as a proxy in front of a
TCP ingress sends it (h3i-scenarios traefik-check: Traefik's entryPoint with
proxyProtocol.trustedIPs). curl's --haproxy-protocol sends only version 1 (text); this sends
version 2 (binary, HAProxy's proxy-protocol.txt section 2.2) by default, or version 1.

    proxyv2_get.py --connect IP:PORT --source IP:PORT --sni NAME --cafile CA [--path /]
                   [--header 'Name: value']... [--version 2|1]

Prints one JSON object: {"status": 200, "body": "...", "header_bytes": 28} or
{"error": "..."}; exit 0 when an HTTP response came back, 3 when the connection or the TLS
handshake failed (what a TLS listener that expects no PROXY header does with one).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import ssl
import struct
import sys

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V2_PROXY_COMMAND = 0x21  # version 2 (high nibble), command PROXY (low nibble)
V2_TCP4 = 0x11  # AF_INET, STREAM
V2_TCP6 = 0x21  # AF_INET6, STREAM
TIMEOUT_SECONDS = 10
MAX_RESPONSE_BYTES = 1 << 20


def endpoint(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not IP:PORT ([IPv6]:PORT)")
    try:
        return ipaddress.ip_address(host.strip("[]")), int(port)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def proxy_header(version: int, src, dst) -> bytes:
    (sip, sport), (dip, dport) = src, dst
    if sip.version != dip.version:
        raise SystemExit("proxyv2_get.py: --source and --connect must be the same address family")
    if version == 1:
        fam = "TCP4" if sip.version == 4 else "TCP6"
        return f"PROXY {fam} {sip} {dip} {sport} {dport}\r\n".encode()
    fam = V2_TCP4 if sip.version == 4 else V2_TCP6
    addrs = sip.packed + dip.packed + struct.pack("!HH", sport, dport)
    return V2_SIGNATURE + struct.pack("!BBH", V2_PROXY_COMMAND, fam, len(addrs)) + addrs


def read_response(conn: ssl.SSLSocket) -> bytes:
    data = b""
    while len(data) < MAX_RESPONSE_BYTES:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connect", type=endpoint, required=True, help="the ingress, IP:PORT")
    ap.add_argument("--source", type=endpoint, required=True, help="the client address the header claims")
    ap.add_argument("--sni", required=True, help="TLS server name and Host header")
    ap.add_argument("--cafile", required=True, help="CA certificate that signed the ingress's certificate")
    ap.add_argument("--path", default="/")
    ap.add_argument("--header", action="append", default=[], help="an extra request header, 'Name: value'")
    ap.add_argument("--version", type=int, choices=(1, 2), default=2, help="PROXY protocol version")
    a = ap.parse_args()

    header = proxy_header(a.version, a.source, a.connect)
    request = f"GET {a.path} HTTP/1.1\r\nHost: {a.sni}\r\nConnection: close\r\n"
    request += "".join(f"{h}\r\n" for h in a.header) + "\r\n"
    ctx = ssl.create_default_context(cafile=a.cafile)
    ctx.set_alpn_protocols(["http/1.1"])
    ip, port = a.connect
    try:
        with socket.create_connection((str(ip), port), timeout=TIMEOUT_SECONDS) as raw:
            raw.sendall(header)
            with ctx.wrap_socket(raw, server_hostname=a.sni) as conn:
                conn.sendall(request.encode())
                data = read_response(conn)
    except (OSError, ssl.SSLError) as e:
        print(json.dumps({"error": f"{type(e).__name__}: {e}", "header_bytes": len(header)}))
        return 3
    head, _, body = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        print(json.dumps({"error": f"not an HTTP response: {status_line!r}", "header_bytes": len(header)}))
        return 3
    print(json.dumps({"status": int(parts[1]), "body": body.decode("utf-8", "replace"),
                      "header_bytes": len(header)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
