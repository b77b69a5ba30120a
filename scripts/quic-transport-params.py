#!/usr/bin/env python3
"""Lists the QUIC transport parameters a client sends in its ClientHello.

Usage: scripts/quic-transport-params.py CLIENT-COMMAND... (PORT in it is replaced), e.g.
  scripts/quic-transport-params.py chroot /work/trixie-root curl -sk --http3-only https://127.0.0.1:PORT/
  scripts/quic-transport-params.py target/release/h3-ingress check -k https://127.0.0.1:PORT/

Listens on a UDP port of 127.0.0.1, starts the client against it, decrypts the client's Initial
packets (their keys derive from the destination connection ID, RFC 9001 5.2), reassembles the
CRYPTO stream and prints the ClientHello's quic_transport_parameters: for example whether the
client supports the ACK frequency extension (min_ack_delay) and the largest datagram it accepts
(max_udp_payload_size). Needs aioquic (for its header parser and Initial keys).
"""
import socket
import subprocess
import sys

from aioquic.buffer import Buffer
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import pull_quic_header

s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.settimeout(3)
cmd = sys.argv[1:]
if not cmd:
    sys.exit(__doc__)
cmd = [c.replace("PORT", str(port)) for c in cmd]
p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
crypto = {}
pair = None
try:
    for _ in range(6):
        data, _ = s.recvfrom(65536)
        buf = Buffer(data=data)
        while not buf.eof():
            start = buf.tell()
            try:
                h = pull_quic_header(buf, host_cid_length=8)
            except ValueError:
                break
            if pair is None:
                pair = CryptoPair(); pair.setup_initial(h.destination_cid, is_client=False, version=h.version)
            end = start + h.packet_length
            pkt = data[start:end]
            try:
                plain_header, payload, pn = pair.decrypt_packet(pkt, buf.tell() - start, 0)
            except Exception as e:
                buf.seek(end); continue
            fb = Buffer(data=payload)
            while not fb.eof():
                t = fb.pull_uint_var()
                if t == 0x06:
                    off = fb.pull_uint_var(); ln = fb.pull_uint_var(); crypto[off] = fb.pull_bytes(ln)
                elif t in (0x00, 0x01):
                    continue
                elif t in (0x02, 0x03):
                    fb.pull_uint_var(); fb.pull_uint_var(); n = fb.pull_uint_var(); fb.pull_uint_var()
                    for _ in range(n): fb.pull_uint_var(); fb.pull_uint_var()
                else:
                    break
            buf.seek(end)
except socket.timeout:
    pass
p.kill()
stream = b""
while len(stream) in crypto:
    stream += crypto[len(stream)]
# ClientHello: type(1) len(3) version(2) random(32) sid(1+n) suites(2+n) comp(1+n) exts(2+n)
b = Buffer(data=stream)
b.pull_uint8(); b.pull_bytes(3); b.pull_bytes(2 + 32)
b.pull_bytes(b.pull_uint8()); b.pull_bytes(b.pull_uint16()); b.pull_bytes(b.pull_uint8())
ext_end = b.pull_uint16() + b.tell()
names = {0x00:"original_dcid",0x01:"max_idle_timeout",0x03:"max_udp_payload_size",0x04:"initial_max_data",0x05:"max_stream_data_bidi_local",0x06:"max_stream_data_bidi_remote",0x07:"max_stream_data_uni",0x08:"max_streams_bidi",0x09:"max_streams_uni",0x0a:"ack_delay_exponent",0x0b:"max_ack_delay",0x0c:"disable_active_migration",0x0e:"active_connection_id_limit",0x0f:"initial_source_cid",0x20:"max_datagram_frame_size",0xff04de1b:"min_ack_delay (ACK frequency)",0xff04de1a:"min_ack_delay (older draft)",0x2ab2:"grease_quic_bit"}
while b.tell() < ext_end:
    et = b.pull_uint16(); el = b.pull_uint16(); ed = b.pull_bytes(el)
    if et in (0x39, 0xffa5):
        tb = Buffer(data=ed)
        while not tb.eof():
            i = tb.pull_uint_var(); l = tb.pull_uint_var(); v = tb.pull_bytes(l)
            val = Buffer(data=v).pull_uint_var() if 0 < l <= 8 and i not in (0x0f, 0x00) else v.hex()
            print(f"  {i:#x} {names.get(i, '?')} = {val}")
