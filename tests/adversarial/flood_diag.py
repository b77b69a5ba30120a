"""A diagnostic, not part of the suite (root): one legitimate handshake during a spoofed-Initial
flood, each of its packets printed as it happens (aioquic's own events), then the proxy's
counters that moved. For the open target of the wide floods (docs/reliability.md): where a
handshake begun during the flood spends its time.

Usage: flood_diag.py BINARY RATE SOURCES [LEAD [WARMUP]]
  SOURCES 0: a new source per datagram; LEAD: seconds after the flood starts that the client
  starts (negative: before it); WARMUP: connections made before the flood.
"""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conn_tools  # noqa: E402
import lib  # noqa: E402
from aioquic.quic.logger import QuicLogger, QuicLoggerTrace

T0 = [0.0]


class LiveTrace(QuicLoggerTrace):
    def log_event(self, *, category, event, data):
        if event in ("packet_sent", "packet_received", "packet_lost"):
            h = data.get("header", {})
            frames = [f.get("frame_type") for f in data.get("frames", [])][:4]
            print(f"{time.monotonic() - T0[0]:7.3f} {event:16} {h.get('packet_type')} "
                  f"{h.get('packet_number')} {frames}", flush=True)


class LiveLogger(QuicLogger):
    def start_trace(self, is_client, odcid):
        t = LiveTrace(is_client=is_client, odcid=odcid)
        self._traces.append(t)
        return t


def since() -> str:
    return f"{time.monotonic() - T0[0]:7.3f}"


async def get_once(env, logger=None) -> int | None:
    settings = {"quic_logger": logger} if logger else {}
    async with lib.open_client(env, **settings) as c:
        if logger:
            print(since(), "CONNECTED", flush=True)
        sid = c.new_stream()
        c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
        c.transmit()
        await lib.wait_until(lambda: sid in c.status, 10, 0.005)
        return c.status.get(sid)


async def main(binary: str, rate: int, sources: int, lead: float, warmup: int):
    env = lib.make_env(Path(binary))
    flood = None
    try:
        p = env.proxy
        flood = conn_tools.Flood(env, rate, 8, sources)
        await flood.ready()
        for _ in range(warmup):
            await get_once(env)
        m0 = p.metrics()

        async def client():
            print(since(), "client starts", flush=True)
            status = await get_once(env, LiveLogger())
            print(since(), "status", status, flush=True)

        T0[0] = time.monotonic()
        if lead < 0:
            task = asyncio.create_task(client())
            await asyncio.sleep(-lead)
            flood.go()
            print(since(), "flood starts", flush=True)
        else:
            flood.go()
            await asyncio.sleep(lead)
            task = asyncio.create_task(client())
        await task
        await flood.wait()
        m1 = p.metrics()
        for k in sorted(m1):
            if ("limits_total" in k or "handshakes_total" in k or "drops" in k) and m1[k] != m0.get(k, 0):
                print(k, m1[k] - m0.get(k, 0))
    finally:
        if flood is not None:
            flood.stop()
        env.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    with lib.own_netns("h3i-diag"):
        asyncio.run(main(args[0], int(args[1]), int(args[2]),
                         float(args[3]) if len(args) > 3 else 0.5, int(args[4]) if len(args) > 4 else 0))
