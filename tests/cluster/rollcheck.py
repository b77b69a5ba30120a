#!/usr/bin/env python3
"""Judges what tests/py/rollclient.py saw across a rollout, one node at a time, and prints one
line of counts per node. Used by tests/cluster/rollout.sh (and the chart upgrade test).

  rollcheck.py --result NODE=FILE.json ... --access-log FILE ... --slow-bytes N --slow-sha256 HEX
               [--max-new-ms MS]

Per node:
- new connections: every request answered 200 (a refused handshake or a timeout is a failure),
  and none slower than --max-new-ms (new connections must not wait for the old process's drain);
- the kept connection: every request answered 200, on the kept connection or, after the server
  closed it with GOAWAY (H3_NO_ERROR) or refused the request unprocessed (H3_REQUEST_REJECTED),
  on a retry; a retried attempt must not appear in any upstream access log (it was never
  processed: nothing in flight was lost); a connection the server closed with an error is a
  broken kept connection;
- the slow download: complete, 200, the expected bytes and SHA-256 (it finished on the process
  that started it, whatever the roll did meanwhile).
The access logs are read together, so a request id must name one attempt of one client: results
that share an id (two clients without their own rollclient.py --id-prefix) are refused, since a
retry on one node would be found "processed" in another node's log.
Exit 1 when any count that must be 0 is not.
"""

import argparse
import json
import sys

H3_NO_ERROR = 0x100
H3_REQUEST_REJECTED = 0x10B


def processed_ids(logs):
    ids = set()
    for path in logs:
        with open(path, errors="replace") as f:
            for line in f:
                at = line.find("id=")
                if at >= 0:
                    ids.add(line[at + 3:].split()[0].split("&")[0].rstrip('"'))
    return ids


def kept_verdict(kept, conns, processed):
    """(requests, failed, retried, broken connections, retried-but-processed)."""
    by_n = {}
    for r in kept:
        n = r["id"].rsplit("-a", 1)[0]
        by_n.setdefault(n, []).append(r)
    failed = sum(1 for attempts in by_n.values() if not any(a["error"] is None for a in attempts))
    retried = [a for attempts in by_n.values() for a in attempts if a["error"] is not None]
    lost = [a["id"] for a in retried if a["id"] in processed]
    broken = 0
    for c in conns:
        close = c.get("close") or {}
        if close.get("by") == "peer" and close.get("code") not in (H3_NO_ERROR, 0):
            broken += 1
        reason = str(close.get("reason", ""))
        if close.get("by") == "local" and "request failed" in reason:
            # The two ways a request can fail cleanly across a GOAWAY: refused unprocessed,
            # or on a connection the server closed without an error.
            clean = (f"stream reset (code {H3_REQUEST_REJECTED})" in reason
                     or f"connection closed (code {H3_NO_ERROR} " in reason)
            if not clean:
                broken += 1
    return len(by_n), failed, len(retried), broken, lost


def judge(node, doc, processed, a):
    new = doc["new"]
    new_failed = [r for r in new if r["error"] is not None]
    slowest = max((r["ms"] for r in new), default=0)
    requests, kept_failed, retried, broken, lost = kept_verdict(
        doc["kept"], doc["kept_connections"], processed)
    slow = doc["slow"] or {}
    slow_ok = (slow.get("error") is None and slow.get("status") == 200
               and slow.get("bytes") == a.slow_bytes and slow.get("sha256") == a.slow_sha256)
    closes = [(c.get("close") or {}).get("by", "?") for c in doc["kept_connections"]]
    print(f"{node}: new {len(new)} requests, {len(new_failed)} failed, slowest {slowest:.0f} ms; "
          f"kept {requests} requests on {len(doc['kept_connections'])} connection(s) "
          f"(closed by {','.join(closes)}), {kept_failed} failed, {retried} retried unprocessed, "
          f"{len(lost)} retried but processed, {broken} broken; slow download "
          f"{slow.get('bytes')} bytes in {slow.get('ms', 0) / 1000:.1f} s, "
          f"{'complete' if slow_ok else 'FAILED: ' + str(slow.get('error'))}")
    for r in doc["kept"]:
        if r["error"] is not None:
            print(f"  {node}: kept {r['id']} retried after {r['ms']:.0f} ms: {r['error']}"
                  f"{' (processed upstream)' if r['id'] in processed else ''}")
    bad = []
    if new_failed:
        bad.append(f"{node}: new-connection requests failed: {new_failed[:3]}")
    if slowest > a.max_new_ms:
        bad.append(f"{node}: a new connection took {slowest:.0f} ms (> {a.max_new_ms} ms)")
    if kept_failed or broken or lost:
        bad.append(f"{node}: kept connection: {kept_failed} failed, {broken} broken, processed retries {lost}")
    if not slow_ok:
        bad.append(f"{node}: slow download: {slow}")
    if not new or not requests:
        bad.append(f"{node}: the clients made no requests")
    return bad


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--result", action="append", required=True, help="NODE=FILE.json")
    p.add_argument("--access-log", action="append", default=[])
    p.add_argument("--slow-bytes", type=int, required=True)
    p.add_argument("--slow-sha256", required=True)
    p.add_argument("--max-new-ms", type=float, default=3000)
    a = p.parse_args()
    processed = processed_ids(a.access_log)
    bad = []
    docs = []
    for r in a.result:
        node, path = r.split("=", 1)
        with open(path) as f:
            docs.append((node, json.load(f)))
    owner = {}
    for node, doc in docs:
        for r in doc["new"] + doc["kept"]:
            if owner.setdefault(r["id"], node) != node:
                sys.exit(f"rollcheck.py: request id {r['id']} is in the results of both {owner[r['id']]} "
                         f"and {node}: give each client its own rollclient.py --id-prefix")
    for node, doc in docs:
        bad += judge(node, doc, processed, a)
    for b in bad:
        print(f"FAIL: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
