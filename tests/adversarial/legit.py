"""A legitimate client for the adversarial suite: one connection (re-opened if it fails), a
GET / every 100 ms (served when its whole response arrived within 5 s) until the stop file
appears (at most 90 s); writes {"served", "failed", "p99_ms"} as JSON.
Usage: legit.py PORT CA OUT STOPFILE"""

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lib  # noqa: E402


async def one(c: lib.Client) -> bool:
    sid = c.new_stream()
    c.h3.send_headers(sid, lib.request_headers("/"), end_stream=True)
    c.transmit()
    # The whole response, not just its head: a stalled upstream connection still lets the
    # HEADERS through and holds the body.
    ok = await lib.wait_until(lambda: sid in c.ended or sid in c.resets or c.closed_with is not None, 5, 0.005)
    return ok is not None and c.status.get(sid) == 200 and sid in c.ended


async def main(port: int, ca: Path, out: Path, stop: Path):
    served, failed, times = 0, 0, []
    deadline = time.monotonic() + 90
    env = type("E", (), {"proxy": type("P", (), {"port": port}), "ca": ca})
    while not stop.exists() and time.monotonic() < deadline:
        try:
            async with lib.open_client(env) as c:
                while not stop.exists() and time.monotonic() < deadline and c.closed_with is None:
                    t0 = time.monotonic()
                    if await one(c):
                        served += 1
                        times.append((time.monotonic() - t0) * 1000)
                    else:
                        failed += 1
                    await asyncio.sleep(0.1)
        except (ConnectionError, OSError, asyncio.TimeoutError):
            failed += 1
            await asyncio.sleep(0.1)
    times.sort()
    p99 = round(times[min(len(times) - 1, int(len(times) * 0.99))], 1) if times else None
    out.write_text(json.dumps({"served": served, "failed": failed, "p99_ms": p99}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])))
