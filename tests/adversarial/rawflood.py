"""A flood of valid client Initials from spoofed IPv4 sources, fast: one raw socket
(IP_HDRINCL) and sendmmsg(2) in batches over messages built once, each a header of its own
(IP and UDP, the source) and an Initial from the pool, so Python does nothing per datagram
and the kernel the rest. `sources` 0 gives every datagram a new source address and port:
524,288 sources from 127.1.0.0 on (never 127.0.0.1), in turn, so a source comes back only
after 2.6 s at 200,000/s, longer than the proxy remembers one it never heard from again
(2 s). N > 0 cycles through N sources. Root only.

Usage: rawflood.py PORT INITIALS RATE SECONDS SOURCES OUT [GO]
  INITIALS: a file of 1200-byte datagrams, back to back; OUT: JSON {"sent", "seconds", "rate"}.
  With GO, writes OUT.ready once the messages are built (a few seconds) and starts when the
  file GO appears.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import socket
import struct
import sys
import time
from pathlib import Path

DATAGRAM = 1200
HEADER = 20 + 8
BATCH = 256
WIDE = 1 << 19
FIRST_SOURCE = (127 << 24) | (1 << 16)
# struct mmsghdr on x86_64: msghdr (name, namelen, iov, iovlen, control, controllen, flags)
# and msg_len, 64 bytes.
MMSGHDR = struct.Struct("=QI4xQQQQi4xI4x")
IOVEC2 = struct.Struct("=QQQQ")


def source(k: int) -> tuple[int, int]:
    """Address and port of source `k`."""
    return FIRST_SOURCE + k, 1024 + (k * 7919) % 64000


def build(port: int, initials: list[bytes], sources: int):
    """The messages: (keep-alive buffers, address of the first mmsghdr, count)."""
    n = sources or WIDE
    n -= n % BATCH if n >= BATCH else 0
    n = max(n, BATCH)
    dst = socket.inet_aton("127.0.0.1")
    udp_len = 8 + DATAGRAM
    headers = ctypes.create_string_buffer(b"".join(
        struct.pack("!BBHHHBBHI4sHHHH", 0x45, 0, 0, 0, 0, 64, socket.IPPROTO_UDP, 0, a, dst, p, port, udp_len, 0)
        for a, p in (source(k % (sources or WIDE)) for k in range(n))))
    payloads = ctypes.create_string_buffer(b"".join(initials))
    addr = ctypes.create_string_buffer(struct.pack("=H", socket.AF_INET) + struct.pack("!H", 0) + dst + b"\0" * 8)
    hb, pb = ctypes.addressof(headers), ctypes.addressof(payloads)
    iovs = ctypes.create_string_buffer(b"".join(
        IOVEC2.pack(hb + k * HEADER, HEADER, pb + (k % len(initials)) * DATAGRAM, DATAGRAM) for k in range(n)))
    ib = ctypes.addressof(iovs)
    msgs = ctypes.create_string_buffer(b"".join(
        MMSGHDR.pack(ctypes.addressof(addr), 16, ib + k * IOVEC2.size, 2, 0, 0, 0, 0) for k in range(n)))
    return (headers, payloads, addr, iovs, msgs), ctypes.addressof(msgs), n


def flood(port: int, initials: list[bytes], rate: float, seconds: float, sources: int,
          ready: Path | None = None, go: Path | None = None) -> dict:
    assert all(len(d) == DATAGRAM for d in initials)
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    keep, base, count = build(port, initials, sources)
    if ready is not None and go is not None:
        ready.write_text("built")
        deadline = time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    # The kernel fills in the IP checksum, total length and id of an IP_HDRINCL packet; a
    # UDP checksum of 0 is none (IPv4).
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    fd = s.fileno()
    sent, n = 0, 0
    t0 = time.monotonic()
    end = t0 + seconds
    try:
        while True:
            now = time.monotonic()
            if now >= end:
                break
            ahead = t0 + n / rate - now
            if ahead > 0.001:
                time.sleep(ahead)
            first = n % count
            r = libc.sendmmsg(fd, ctypes.c_void_p(base + first * MMSGHDR.size), BATCH, 0)
            if r > 0:
                sent += r
            n += BATCH
    finally:
        s.close()
        del keep
    took = time.monotonic() - t0
    return {"sent": sent, "seconds": round(took, 2), "rate": round(sent / took)}


def read_initials(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i:i + DATAGRAM] for i in range(0, len(data), DATAGRAM)]


if __name__ == "__main__":
    if len(sys.argv) not in (7, 8):
        print(__doc__)
        sys.exit(2)
    port, path, rate, seconds, sources, out = sys.argv[1:7]
    go = Path(sys.argv[7]) if len(sys.argv) == 8 else None
    out = Path(out)
    result = flood(int(port), read_initials(Path(path)), float(rate), float(seconds), int(sources),
                   out.with_suffix(".ready"), go)
    out.write_text(json.dumps(result))
