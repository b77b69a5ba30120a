#!/usr/bin/env python3
"""Slow start without a bottleneck under quinn-proto 0.11's pacer, for S1's transfers.

Tokens refill at k * cwnd / srtt into a bucket of max(10 packets, cwnd * 2 ms / srtt), the
window grows by every acknowledged byte, each packet is acknowledged one RTT after it is sent;
prints when the last byte reaches the client (last send + RTT/2), for k = 1.25 (quinn), 2
(Linux's slow-start pacing) and no pacing. docs/transport-efficiency.md section 4 quotes it.
"""
import heapq, sys
def run(total_bytes, R, k, iw_pkts=32, mss=1200, dt=0.0002):
    cwnd = iw_pkts*mss; inflight = 0; sent = 0; t = 0.0
    cap = lambda: max(10*mss, cwnd*0.002/R)
    tokens = cap(); acks = []; last_send = 0; rounds = []
    while sent < total_bytes:
        while acks and acks[0][0] <= t:
            _, b = heapq.heappop(acks); inflight -= b; cwnd += b
        tokens = min(cap(), tokens + k*cwnd/R*dt) if k else float('inf')
        while sent < total_bytes and inflight + mss <= cwnd and tokens >= mss:
            heapq.heappush(acks, (t+R, mss)); inflight += mss; sent += mss; tokens -= mss; last_send = t
        t += dt
    return last_send + R/2
for R, size in [(0.2, 1e6), (0.2, 4e6), (0.1, 1e6)]:
    base = {k: run(size, R, k) for k in (1.25, 2.0, 0)}
    print(f"RTT {R*1e3:.0f} ms, {size/1e6:.0f} MB: data time with pacing 1.25x {base[1.25]*1e3:.0f} ms "
          f"({base[1.25]/R:.2f} RTT), 2x {base[2.0]*1e3:.0f} ms ({base[2.0]/R:.2f} RTT), unpaced {base[0]*1e3:.0f} ms; "
          f"2x saves {(base[1.25]-base[2.0])*1e3:.0f} ms")
