#!/usr/bin/env python3
"""Chromium finds HTTP/3 from DNS alone, on a first visit: the proof that a DNS HTTPS record
(RFC 9460) like the one the operator publishes is enough for a browser to try QUIC.

Everything runs as root in a private network namespace (deleted at the end):

  - Debian's Knot DNS, authoritative for h3i.test on 127.0.0.1:53 and [::1]:53, with
    shop.h3i.test A 127.0.0.1 and AAAA ::1 in its zone file; the namespace's resolv.conf
    (/etc/netns/NS/resolv.conf, which `ip netns exec` mounts over /etc/resolv.conf) names it;
  - Debian nginx on TCP 443 (h2, NO Alt-Svc header) and the proxy (--binary, default
    target/debug/h3-ingress) on UDP 443, as in chromium.py;
  - headless Chromium with an empty profile, default flags and NO --host-resolver-rules: it
    resolves shop.h3i.test through resolv.conf with its own DNS client.

Two first visits to https://shop.h3i.test/, each with a fresh profile and net log:

  1. control: the zone has no HTTPS record. The net log must show no QUIC job and no QUIC
     session (this is what makes the check able to fail).
  2. discovery: `HTTPS 1 . alpn="h3,h2"` is added to the zone by an RFC 2136 update signed
     with TSIG (knsupdate, with the operator's prerequisite "no HTTPS RRset yet"), the record
     shape src/operator/advertise/dns/plan.rs (`record`) publishes. The net log must show,
     before any Alt-Svc was seen (and none is sent): a HOST_RESOLVER_DNS_TASK that needed an
     HTTPS query, the extracted alpn metadata (h3), an HTTP_STREAM_JOB of type dns_alpn_h3
     using QUIC, and a QUIC_SESSION with require_dns_https_alpn to the proxy.

Chromium then refuses the proxy's certificate (issued by a test CA trusted only in the
profile's NSS database: its QUIC policy for private roots, see chromium.py) and loads the page
over h2; the QUIC attempt is the proof of discovery. Prints the matching net-log lines in a
table. Exit 0 when both runs pass, 1 otherwise, 2 on a setup error, 3 when skipped (not root).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import chromium as c  # noqa: E402  (the shared PKI, servers, browser and net-log reader)

ZONE = "h3i.test"
HOST = c.HOST
# What the operator publishes for a host served on 443 (plan.rs: ALPN, no port= on 443).
HTTPS_RDATA = '1 . alpn="h3,h2"'
KEY_NAME = "h3-ingress"


# ------------------------------------------------------------------------ Knot


class Knot:
    """knotd on port 53 of the namespace's loopback, one zone, one TSIG key for updates."""

    def __init__(self, d: Path):
        self.dir = d / "knot"
        self.dir.mkdir()
        self.secret = base64.b64encode(os.urandom(32)).decode()
        (self.dir / "knot.conf").write_text(
            f'server:\n    rundir: "{self.dir}"\n    listen: [127.0.0.1@53, ::1@53]\n'
            "    udp-workers: 1\n    tcp-workers: 1\n    background-workers: 1\n"
            f'database:\n    storage: "{self.dir}"\n'
            f"key:\n  - id: {KEY_NAME}\n    algorithm: hmac-sha256\n    secret: {self.secret}\n"
            f"acl:\n  - id: update\n    key: {KEY_NAME}\n    action: update\n"
            f'zone:\n  - domain: {ZONE}\n    storage: "{self.dir}"\n    file: "{ZONE}.zone"\n'
            "    acl: update\n    zonefile-sync: -1\n")
        (self.dir / f"{ZONE}.zone").write_text(
            f"$ORIGIN {ZONE}.\n$TTL 60\n@ SOA ns.{ZONE}. admin.{ZONE}. 1 3600 900 604800 60\n"
            "@ NS ns\nns A 127.0.0.1\nshop A 127.0.0.1\nshop AAAA ::1\n")
        self.log_path = self.dir / "knotd.log"
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(["knotd", "-c", str(self.dir / "knot.conf")],
                                         stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True)
        end = time.monotonic() + 10
        while not self.query(ZONE, "SOA"):
            if self.proc.poll() is not None or time.monotonic() > end:
                c.stop(self.proc)
                raise c.SetupError(f"knotd not serving {ZONE}: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.1)

    def query(self, name: str, rtype: str) -> list[str]:
        p = subprocess.run(["kdig", "@127.0.0.1", "+short", "+time=1", "+retry=0", name, rtype],
                           capture_output=True, text=True)
        return [line for line in p.stdout.splitlines() if line.strip()]

    def add_https(self):
        """The record by RFC 2136 update with TSIG, created only where no HTTPS RRset exists
        (the operator's prerequisite: a user's own record is never replaced)."""
        script = (f"server 127.0.0.1 53\nzone {ZONE}.\nkey hmac-sha256:{KEY_NAME} {self.secret}\n"
                  f"prereq nxrrset {HOST}. HTTPS\nupdate add {HOST}. 60 HTTPS {HTTPS_RDATA}\nsend\n")
        p = subprocess.run(["knsupdate"], input=script, capture_output=True, text=True)
        if p.returncode != 0:
            raise c.SetupError(f"knsupdate exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")

    def close(self):
        c.stop(self.proc)


# ------------------------------------------------------------------------ net log


def netlog_findings(path: Path) -> dict:
    """The events that show discovery for HOST, each as (time ms, event name, source id,
    params), in log order:

    - dns_task: HOST_RESOLVER_DNS_TASK begins that needed an HTTPS query, on a resolver job
      for HOST;
    - alpn: HOST_RESOLVER_DNS_TASK_EXTRACTION_RESULTS for HOST with h3 in the alpns;
    - dns_alpn_job: HTTP_STREAM_JOB begins to HOST of type dns_alpn_h3 using QUIC. Chromium
      starts these before the DNS answer arrives, record or not, and drops them when no
      record matches; so `attempted` keeps those whose QUIC pool job went on to create a
      QUIC session (QUIC_SESSION_POOL_JOB_RESULT);
    - quic_session: QUIC_SESSION begins for HOST; quic_connect: QUIC_SESSION_POOL_JOB_CONNECT
      ends (with net_error) of pool jobs for HOST;
    - first_alt_svc: the first ALT_SVC event or alt-svc response header for any host, if
      ever; headers_logged: whether response headers are in the log at all (else "never"
      would prove nothing).
    """
    constants, events = c.read_netlog(path)
    ev_name = {v: k for k, v in constants["logEventTypes"].items()}
    err_name = {v: k for k, v in constants.get("netError", {}).items()}
    f = {"dns_task": [], "alpn": [], "dns_alpn_job": [], "attempted": [], "quic_session": [],
         "quic_connect": [], "first_alt_svc": None, "headers_logged": False, "events": len(events)}

    def line(e, p):
        return (int(e["time"]), ev_name.get(e["type"], str(e["type"])), e["source"]["id"], p)

    resolver_for_host, pool_for_host, bound, pool_session = set(), set(), {}, {}
    for e in events:
        n = ev_name.get(e["type"], str(e["type"]))
        p = e.get("params") or {}
        src = e["source"]["id"]
        text = json.dumps(p)
        if f["first_alt_svc"] is None and ("ALT_SVC" in n or "alt-svc" in text.lower()):
            f["first_alt_svc"] = line(e, p)
        if "cache-control: no-store" in text:  # nginx's own header on every response
            f["headers_logged"] = True
        if n == "HOST_RESOLVER_MANAGER_JOB" and p.get("host") == f"https://{HOST}":
            resolver_for_host.add(src)
        if n == "HOST_RESOLVER_DNS_TASK" and src in resolver_for_host and e.get("phase") == 1 \
                and {"dns_query_type": "HTTPS"} in p.get("transactions_needed", []):
            f["dns_task"].append(line(e, p))
        if n == "HOST_RESOLVER_DNS_TASK_EXTRACTION_RESULTS" and any(
                r.get("domain_name") == HOST and r.get("query_type") == "HTTPS"
                and any("h3" in m.get("metadata_value", {}).get("supported_protocol_alpns", [])
                        for m in r.get("metadatas", []))
                for r in p.get("results", [])):
            f["alpn"].append(line(e, p))
        if n == "HTTP_STREAM_JOB" and e.get("phase") == 1 and p.get("type") == "dns_alpn_h3" \
                and p.get("using_quic") and p.get("destination") == f"https://{HOST}":
            f["dns_alpn_job"].append(line(e, p))
        if n == "BOUND_TO_QUIC_SESSION_POOL_JOB":
            bound[src] = p["source_dependency"]["id"]
        if n == "QUIC_SESSION_POOL_JOB" and e.get("phase") == 1 and p.get("host") == HOST:
            pool_for_host.add(src)
        if n == "QUIC_SESSION_POOL_JOB_RESULT":
            pool_session[src] = p["source_dependency"]["id"]
        if n == "QUIC_SESSION_POOL_JOB_CONNECT" and e.get("phase") == 2 and src in pool_for_host:
            err = p.get("net_error", 0)
            f["quic_connect"].append(line(e, {"net_error": f"net::{err_name.get(err, err)}" if err else "OK"}))
        if n == "QUIC_SESSION" and e.get("phase") == 1 and p.get("host") == HOST:
            f["quic_session"].append(line(e, p))
    sessions = {s[2]: s for s in f["quic_session"]}
    for j in f["dns_alpn_job"]:
        s = sessions.get(pool_session.get(bound.get(j[2])))
        if s:
            f["attempted"].append((j, s))
    return f


def short(p: dict, keys: tuple[str, ...]) -> str:
    kept = {k: p[k] for k in keys if k in p}
    return json.dumps(kept or p)[:160]


def alpns(p: dict) -> dict:
    for r in p.get("results", []):
        for m in r.get("metadatas", []):
            return {"query_type": r.get("query_type"),
                    "supported_protocol_alpns": m["metadata_value"].get("supported_protocol_alpns")}
    return p


def alpns_json(p: dict) -> str:
    return json.dumps(alpns(p))


def print_findings(title: str, f: dict):
    """One line per kind of event (the first of each), times relative to the first DNS task."""
    print(f"\n{title}: {f['events']} events")
    job, sess = f["attempted"][0] if f["attempted"] else (None, None)
    rows = [("HTTPS query", f["dns_task"][:1], lambda p: short(p, ("transactions_needed", "secure"))),
            ("alpn metadata", f["alpn"][:1], alpns_json),
            ("dns_alpn_h3 job", [job] if job else f["dns_alpn_job"][:1],
             lambda p: short(p, ("destination", "type", "using_quic"))),
            ("QUIC session", [sess] if sess else f["quic_session"][:1],
             lambda p: short(p, ("host", "port", "require_dns_https_alpn"))),
            ("QUIC connect", f["quic_connect"][:1], lambda p: short(p, ()))]
    t0 = min((x[0] for _, r, _ in rows for x in r), default=0)
    print(f"  {'what':<16} {'ms':>5}  {'net-log event':<42} {'source':>6}  params")
    for what, found, fmt in rows:
        for t, n, src, p in found:
            print(f"  {what:<16} {t - t0:>5}  {n:<42} {src:>6}  {fmt(p)}")
        if not found:
            print(f"  {what:<16} {'-':>5}  (none)")
    if f["to_proxy"]:
        print(f"  QUIC to the proxy (127.0.0.1:443): {len(f['to_proxy'])} session(s), "
              f"handshake {c.outcome(f['to_proxy'])}")
    print(f"  proxy {c.HANDSHAKES_METRIC}: {f['handshakes'] or 'no change'}")
    a = f["first_alt_svc"]
    print(f"  {'Alt-Svc':<16} {'-' if a is None else a[0] - t0:>5}  "
          f"{'never (response headers are logged)' if a is None and f['headers_logged'] else a and a[1]}")


def check_discovery(f: dict) -> list[str]:
    problems = []
    if not f["dns_task"]:
        problems.append("no HOST_RESOLVER_DNS_TASK with an HTTPS query")
    if not f["alpn"]:
        problems.append("no HOST_RESOLVER_DNS_TASK_EXTRACTION_RESULTS with alpn h3")
    attempted = [(j, s) for j, s in f["attempted"] if s[3].get("require_dns_https_alpn")]
    if not attempted:
        problems.append("no HTTP_STREAM_JOB of type dns_alpn_h3 using QUIC that reached a "
                        "QUIC_SESSION with require_dns_https_alpn")
    if not f["to_proxy"]:
        problems.append("no QUIC session to the proxy at 127.0.0.1:443")
    if not f["headers_logged"]:
        problems.append("no response headers in the net log: cannot tell whether Alt-Svc was seen")
    alt = f["first_alt_svc"]
    if alt is not None:
        first_quic = min([s[0] for _, s in attempted], default=None)
        if first_quic is None or alt[0] <= first_quic:
            problems.append(f"Alt-Svc seen before the DNS-started QUIC attempt: {alt[1]} {short(alt[3], ())}")
    return problems


def check_control(f: dict) -> list[str]:
    """Without the record: the dns_alpn_h3 jobs Chromium opens speculatively must end without
    a QUIC connection attempt."""
    problems = []
    if f["quic_session"] or f["quic_connect"] or f["to_proxy"]:
        problems.append(f"QUIC attempted without an HTTPS record: {len(f['quic_connect'])} connect(s), "
                        f"{len(f['quic_session'])} session(s)")
    if f["alpn"]:
        problems.append("alpn metadata extracted although the zone has no HTTPS record")
    if not f["dns_task"]:
        problems.append("no HOST_RESOLVER_DNS_TASK with an HTTPS query (not Chromium's own resolver?)")
    return problems


# ------------------------------------------------------------------------ runs


def visit(d: Path, home: Path, name: str, metrics_url: str) -> tuple[dict, dict]:
    """A first visit with an empty profile; (page result, net-log findings), the findings
    with `to_proxy` (QUIC sessions whose peer is the proxy, chromium.py's reading) and the
    proxy's handshake counters' change."""
    netlog = d / f"netlog-{name}.json"
    before = c.scrape(metrics_url)
    b = c.Browser(d / name, home, netlog, None, [])
    try:
        res = c.load_page(b, f"https://{HOST}/")
        # The DNS-started QUIC job races the TCP one; let it end (refused) before the log closes.
        time.sleep(1)
    finally:
        b.close()
    f = netlog_findings(netlog)
    f["to_proxy"] = c.analyse_netlog(netlog, "127.0.0.1:443", HOST)["to_proxy"]
    f["handshakes"] = c.metric_deltas(before, c.scrape(metrics_url), c.HANDSHAKES_METRIC)
    return res, f


def page_ok(res: dict) -> str | None:
    main = [e for e in res.get("entries", []) if e["type"] == "navigation"]
    if res.get("error") or not main or main[0].get("status") != 200:
        return f"page did not load: {res.get('error') or main}"
    return None


def run(args, d: Path) -> int:
    start = time.monotonic()
    ca, cert, key = c.make_pki(d, HOST)
    knot = local = None
    try:
        knot = Knot(d)
        c.log(f"knotd serving {ZONE}; {HOST} A {knot.query(HOST, 'A')} AAAA {knot.query(HOST, 'AAAA')}; "
              f"resolv.conf: {Path('/etc/resolv.conf').read_text().strip()!r}")
        local = c.Local(d, Path(args.binary), "127.0.0.1", cert, key, alt_svc=False)
        home = d / "home"
        c.make_nssdb(home, ca)
        version = c.chromium_version(c.chromium_binary())

        if knot.query(HOST, "HTTPS"):
            raise c.SetupError(f"{HOST} has an HTTPS record before the update")
        c.log(f"{version}; run 1 (control): no HTTPS record")
        res1, f1 = visit(d, home, "control", local.metrics_url)
        print_findings("run 1 (control, no HTTPS record): net log", f1)
        p1 = check_control(f1) + [x for x in [page_ok(res1)] if x]
        # The discovery criteria must reject the control's log, or they prove nothing.
        rejected = check_discovery(f1)
        print(f"  discovery criteria on this log: {'rejected: ' + rejected[0] if rejected else 'ACCEPTED'}")
        if not rejected:
            p1.append("the discovery criteria accept the control's log")

        knot.add_https()
        got = knot.query(HOST, "HTTPS")
        c.log(f"knsupdate (TSIG {KEY_NAME}): {HOST} HTTPS {got}")
        if got != ['1 . alpn=h3,h2']:
            raise c.SetupError(f"{HOST} HTTPS after the update: {got}")
        c.log("run 2 (discovery): HTTPS record, no Alt-Svc, empty profile")
        res2, f2 = visit(d, home, "discovery", local.metrics_url)
        print_findings("run 2 (discovery, HTTPS 1 . alpn=\"h3,h2\"): net log", f2)
        p2 = check_discovery(f2) + [x for x in [page_ok(res2)] if x]

        for p in p1:
            print(f"  FAIL run 1: {p}")
        for p in p2:
            print(f"  FAIL run 2: {p}")
        print(f"\nrun 1 control (no QUIC): {'PASS' if not p1 else 'FAIL'}; run 2 DNS discovery "
              f"(dns_alpn_h3 before any Alt-Svc): {'PASS' if not p2 else 'FAIL'}; "
              f"{time.monotonic() - start:.1f}s; {version}")
        return 0 if not p1 and not p2 else 1
    finally:
        if local:
            local.close()
        if knot:
            knot.close()


def in_netns(argv: list[str]) -> int:
    """Re-runs this script in a fresh network namespace with loopback up and its own
    resolv.conf, then removes both."""
    ns = f"h3i-dns-{os.getpid()}"
    etc = Path("/etc/netns") / ns
    etc.mkdir(parents=True)
    try:
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        subprocess.run(["ip", "netns", "add", ns], check=True)
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, "--in-netns", *argv])
        try:
            return p.wait()
        except KeyboardInterrupt:
            p.send_signal(signal.SIGINT)
            return p.wait()
    finally:
        subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL)
        shutil.rmtree(etc, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(c.ROOT / "target/debug/h3-ingress"), help="the proxy binary")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (net logs, zone, logs)")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("CHROMIUM DNS DISCOVERY SKIPPED (needs root): tests/browser/dns_discovery.py needs "
              "a network namespace, its resolv.conf and port 53/443", flush=True)
        return 3
    if not args.in_netns:
        return in_netns(sys.argv[1:])
    d = Path(tempfile.mkdtemp(prefix="h3i-dns-"))
    try:
        if not Path(args.binary).exists():
            raise c.SetupError(f"{args.binary} missing (cargo build)")
        return run(args, d)
    except c.SetupError as e:
        print(f"SETUP ERROR: {e}", file=sys.stderr)
        return 2
    finally:
        if args.keep:
            print(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
