#!/usr/bin/env python3
"""A real browser against h3-ingress: Debian's Chromium, headless, driven over the DevTools
protocol, with a throwaway test CA trusted in a private NSS database.

Two runs, each with a fresh Chromium profile and its own net log (--log-net-log):

  1. discovery: load https://HOST/ from the TCP ingress, which answers over h2 with
     `Alt-Svc: h3=":443"`, then fetch 1 MiB and reload. Chromium tries QUIC to the proxy;
     it refuses certificates that do not chain to a publicly trusted root for QUIC unless the
     origin is forced, so the handshake is expected to fail at certificate verification. The
     run passes when the net log shows a QUIC session attempt to the proxy's address and port,
     and reports whether it was refused and with which error.
  2. forced: the same with --origin-to-force-quic-on=HOST:443. The page and its 1 MiB fetch
     must both have nextHopProtocol "h3" in performance.getEntries(), and the proxy's
     h3_ingress_requests_total must move by at least that many requests.

Targets (all configurable, so the same test runs against a cluster):

  --local           (default) start Debian nginx on TCP 443 with Alt-Svc and the proxy
                    (--binary, default target/debug/h3-ingress) on UDP 443, both on 127.0.0.1
                    inside a private network namespace, and run Chromium there too. Port 443
                    is what nginx advertises (h3=":443"), and the namespace keeps the host's
                    443 free and untouched; the namespace is deleted at the end.
  --ingress ADDR:PORT --quic ADDR:PORT --ca CA.pem --metrics URL
                    use an existing TCP ingress and proxy instead (no servers started): HOST
                    is mapped to the ingress address for Chromium, the QUIC address is what
                    the net log must show, CA.pem is trusted, URL is the proxy's /metrics.
                    The ingress must serve /1m.bin (1 MiB) under HOST.

Exit 0 when both runs pass, 1 otherwise, 2 on a setup error. Prints one table per run (URL,
nextHopProtocol, status, bytes) and the net-log finding of run 1.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HOST = "shop.h3i.test"
FETCH_PATH = "/1m.bin"
FETCH_BYTES = 1 << 20
REQUESTS_METRIC = "h3_ingress_requests_total"
HANDSHAKES_METRIC = "h3_ingress_handshakes_total"


def log(msg: str):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class SetupError(Exception):
    pass


# ------------------------------------------------------------------------ PKI


def make_pki(d: Path, host: str) -> tuple[Path, Path, Path]:
    """A throwaway ECDSA CA and a leaf for `host`; returns (ca, cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    day = datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "h3-ingress browser test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - day).not_valid_after(now + 30 * day)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - day).not_valid_after(now + 30 * day)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (d / "ca.pem").write_bytes(ca.public_bytes(pem))
    (d / "leaf.pem").write_bytes(leaf.public_bytes(pem))
    (d / "leaf.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
    return d / "ca.pem", d / "leaf.pem", d / "leaf.key"


def make_nssdb(home: Path, ca: Path):
    """HOME/.pki/nssdb, the NSS database Chromium on Linux reads user trust from, with `ca`
    trusted for TLS servers (C,,)."""
    db = home / ".pki" / "nssdb"
    db.mkdir(parents=True)
    run(["certutil", "-N", "-d", f"sql:{db}", "--empty-password"])
    run(["certutil", "-A", "-d", f"sql:{db}", "-t", "C,,", "-n", "h3i-test", "-i", str(ca)])
    listed = run(["certutil", "-L", "-d", f"sql:{db}"])
    if "h3i-test" not in listed:
        raise SetupError(f"CA not in the NSS db: {listed}")


def run(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise SetupError(f"{' '.join(cmd)} exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


# ------------------------------------------------------------------------ local servers


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>h3-ingress browser test</title>
<link rel="icon" href="data:,"></head>
<body><h1>shop</h1><p id="state">loading</p>
<script>
// The page's own 1 MiB fetch; the test reads its outcome and performance.getEntries().
window.h3iFetch = fetch("{fetch_path}?t=" + Date.now(), {{cache: "no-store"}})
  .then(r => r.arrayBuffer().then(b => ({{status: r.status, bytes: b.byteLength}})))
  .catch(e => ({{error: String(e)}}))
  .then(x => {{ document.getElementById("state").textContent = JSON.stringify(x); return x; }});
</script></body></html>
"""

NGINX_CONF = """
daemon off;
master_process off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{ worker_connections 256; }}
http {{
    log_format j escape=json '{{"uri":"$request_uri","status":$status,"protocol":"$server_protocol",'
                             '"bytes":$body_bytes_sent,"ua":"$http_user_agent","fwd":"$http_forwarded"}}';
    access_log {d}/access.log j;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    types {{ text/html html; application/octet-stream bin; }}
    server {{
        listen {addr}:443 ssl http2;
        server_name {host};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {d}/www;
        {alt_svc}
        add_header Cache-Control 'no-store' always;
        location / {{ index index.html; }}
    }}
}}
"""


ALT_SVC_LINE = """add_header Alt-Svc 'h3=":443"; ma=86400' always;"""


class Local:
    """Debian nginx (TCP 443, Alt-Svc unless `alt_svc` is false) and the proxy (UDP 443) on
    `addr`; we run inside a network namespace of our own, so 443 is ours."""

    def __init__(self, d: Path, binary: Path, addr: str, cert: Path, key: Path, alt_svc: bool = True):
        self.procs: list[subprocess.Popen] = []
        self.addr = addr
        self.alt_svc = ALT_SVC_LINE if alt_svc else "# no Alt-Svc"
        try:
            self._start(d, binary, addr, cert, key)
        except BaseException:
            self.close()
            raise

    def _start(self, d: Path, binary: Path, addr: str, cert: Path, key: Path):
        ng = d / "nginx"
        (ng / "www").mkdir(parents=True)
        (ng / "tmp").mkdir()
        (ng / "www" / "index.html").write_text(PAGE.format(fetch_path=FETCH_PATH))
        (ng / "www" / FETCH_PATH.lstrip("/")).write_bytes(os.urandom(FETCH_BYTES))
        (ng / "nginx.conf").write_text(NGINX_CONF.format(d=ng, addr=addr, host=HOST, cert=cert, key=key,
                                                            alt_svc=self.alt_svc))
        self.nginx_dir = ng
        nginx = os.environ.get("H3I_NGINX", "/usr/sbin/nginx")
        # master_process off: one process, running as us (root), so it reads our 0700 temp dir.
        self.procs.append(subprocess.Popen([nginx, "-p", str(ng), "-c", str(ng / "nginx.conf")],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                           start_new_session=True))
        wait_tcp(addr, 443, 10, "nginx", self.procs[-1], ng / "error.log")

        self.metrics_port = 9476
        cfg = d / "h3-ingress.yaml"
        cfg.write_text(
            "port: 443\n"
            f"addresses: {{ipv4: {addr}, ipv6: null}}\n"
            f"upstream: {{address: '{addr}:443'}}\n"
            f"metrics: {{address: '{addr}:{self.metrics_port}'}}\n"
            f"keys: {{file: {d}/quic.key}}\n"
            f"hosts:\n  - {{name: {HOST}, certFile: {cert}, keyFile: {key}}}\n"
        )
        self.proxy_log = d / "h3-ingress.log"
        with open(self.proxy_log, "wb") as out:
            self.procs.append(subprocess.Popen([str(binary), "proxy", "--config", str(cfg)],
                                               stdout=out, stderr=subprocess.STDOUT,
                                               start_new_session=True))
        self.metrics_url = f"http://{addr}:{self.metrics_port}/metrics"
        end = time.monotonic() + 15
        while True:
            if self.procs[-1].poll() is not None:
                raise SetupError(f"proxy exited: {self.proxy_log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(f"http://{addr}:{self.metrics_port}/readyz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > end:
                    raise SetupError("proxy not ready within 15 s")
                time.sleep(0.1)

    def access_log(self) -> list[dict]:
        p = self.nginx_dir / "access.log"
        return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []

    def close(self):
        for p in reversed(self.procs):
            stop(p)


def wait_tcp(addr: str, port: int, timeout: float, what: str, proc: subprocess.Popen, errlog: Path):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SetupError(f"{what} exited: {errlog.read_text()[-2000:] if errlog.exists() else ''}")
        try:
            socket.create_connection((addr, port), 0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SetupError(f"{what} did not listen on {addr}:{port} within {timeout}s")


def stop(p: subprocess.Popen, grace: float = 5):
    """SIGTERM, then SIGKILL, to the process group `p` leads (every child here is started
    with start_new_session): Chromium's helpers go with it."""
    def signal_group(sig):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass

    if p.poll() is None:
        signal_group(signal.SIGTERM)
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            signal_group(signal.SIGKILL)
            p.wait(5)
    signal_group(signal.SIGKILL)  # helpers left behind by a leader that already exited


# ------------------------------------------------------------------------ metrics


def scrape(url: str) -> dict[str, float]:
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError as e:
        raise SetupError(f"metrics {url}: {e}") from e
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def metric_sum(m: dict[str, float], name: str, label: str = "") -> float:
    return sum(v for k, v in m.items()
               if (k == name or k.startswith(name + "{")) and label in k)


def metric_deltas(before: dict, after: dict, name: str) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after
            if (k == name or k.startswith(name + "{")) and after[k] != before.get(k, 0.0)}


# ------------------------------------------------------------------------ Chromium / CDP


def chromium_binary() -> str:
    # The Debian launcher /usr/bin/chromium is a shell script that adds flags from
    # /etc/chromium.d; the real binary is /usr/lib/chromium/chromium. Either works; the
    # launcher is what a user runs.
    for c in (os.environ.get("H3I_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if c and os.path.exists(c):
            return c
    raise SetupError("chromium not found (apt-get install chromium)")


def chromium_version(binary: str) -> str:
    p = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
    return (p.stdout.strip().splitlines() or ["?"])[0]


class Browser:
    """Headless Chromium with its own profile and HOME, a net log, and a DevTools page
    session (websockets, synchronous). `resolver_rules` None: Chromium resolves names itself
    (the namespace's resolv.conf), as a user's browser does."""

    def __init__(self, d: Path, home: Path, netlog: Path, resolver_rules: str | None, extra: list[str]):
        self.profile = d / "profile"
        self.profile.mkdir(parents=True)
        self.netlog = netlog
        args = [
            chromium_binary(),
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--no-default-browser-check", "--disable-extensions", "--disable-sync",
            "--disable-background-networking", "--disable-component-update",
            "--disable-features=MediaRouter,OptimizationHints",
            "--password-store=basic", "--use-mock-keychain",
            f"--user-data-dir={self.profile}",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--log-net-log={netlog}", "--net-log-capture-mode=Default",
            *([f"--host-resolver-rules={resolver_rules}"] if resolver_rules else []),
            *extra,
            "about:blank",
        ]
        self.args = args
        env = dict(os.environ, HOME=str(home))
        env.pop("DISPLAY", None)
        self.stderr_path = d / "chromium.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                     start_new_session=True)
        try:
            self._attach()
        except BaseException:
            stop(self.proc)
            self._stderr.close()
            raise

    def _attach(self):
        from websockets.sync.client import connect

        port_file = self.profile / "DevToolsActivePort"
        end = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.proc.poll() is not None:
                raise SetupError(f"chromium exited {self.proc.returncode}: {self.stderr_path.read_text()[-2000:]}")
            if time.monotonic() > end:
                raise SetupError("chromium: no DevToolsActivePort within 30 s")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        # __enter__ (the context-manager entry) on its own: the connection outlives this
        # method, and close() below ends it.
        self.browser_ws = connect(f"ws://127.0.0.1:{port}{path}", max_size=None,
                                  open_timeout=10).__enter__()
        self._id = 0
        self.events: list[dict] = []
        targets = self.call(self.browser_ws, "Target.getTargets")["targetInfos"]
        page = next(t for t in targets if t["type"] == "page")
        self.session = self.call(self.browser_ws, "Target.attachToTarget",
                                 targetId=page["targetId"], flatten=True)["sessionId"]
        self.page("Page.enable")
        self.page("Runtime.enable")

    def call(self, ws, method: str, timeout: float = 30, session: str | None = None, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        ws.send(json.dumps(msg))
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise SetupError(f"CDP {method}: no answer within {timeout}s")
            m = json.loads(ws.recv(timeout=left))
            if m.get("id") == self._id:
                if "error" in m:
                    raise SetupError(f"CDP {method}: {m['error']}")
                return m.get("result", {})
            if "method" in m:
                self.events.append(m)

    def page(self, method: str, timeout: float = 30, **params):
        return self.call(self.browser_ws, method, timeout, self.session, **params)

    def wait_event(self, name: str, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            for i, e in enumerate(self.events):
                if e["method"] == name:
                    return self.events.pop(i)
            left = end - time.monotonic()
            if left <= 0:
                raise SetupError(f"CDP: no {name} within {timeout}s")
            self.events.append(json.loads(self.browser_ws.recv(timeout=left)))

    def navigate(self, url: str, timeout: float = 20) -> dict:
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        r = self.page("Page.navigate", url=url)
        if r.get("errorText"):
            return r
        self.wait_event("Page.loadEventFired", timeout)
        return r

    def reload(self, timeout: float = 20):
        self.events = [e for e in self.events if e["method"] != "Page.loadEventFired"]
        self.page("Page.reload", ignoreCache=True)
        self.wait_event("Page.loadEventFired", timeout)

    def evaluate(self, expr: str, timeout: float = 30):
        r = self.page("Runtime.evaluate", timeout, expression=expr, awaitPromise=True,
                      returnByValue=True)
        if "exceptionDetails" in r:
            raise SetupError(f"JS exception: {r['exceptionDetails']}")
        return r["result"].get("value")

    def close(self):
        # Browser.close lets Chromium finish the net log's JSON; SIGTERM is the fallback
        # (the parser below also reads a truncated log).
        try:
            self.call(self.browser_ws, "Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.browser_ws.close()
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        stop(self.proc)
        self._stderr.close()


# What the page reports: its fetch's outcome and every performance entry with a URL.
RESULT_JS = """
(async () => {
  // Our local page starts the fetch itself; any other page (a cluster's) gets it from here.
  const fetched = await (window.h3iFetch || fetch("%s?t=" + Date.now(), {cache: "no-store"})
    .then(r => r.arrayBuffer().then(b => ({status: r.status, bytes: b.byteLength})))
    .catch(e => ({error: String(e)})));
  const want = (e) => e.name.includes("%s");
  for (let i = 0; i < 100 && !performance.getEntriesByType("resource").some(want); i++)
    await new Promise(r => setTimeout(r, 50));
  const entries = performance.getEntries()
    .filter(e => e.entryType === "navigation" || e.entryType === "resource")
    .map(e => ({url: e.name, type: e.entryType, proto: e.nextHopProtocol,
                status: e.responseStatus, bytes: e.decodedBodySize, transfer: e.transferSize}));
  return JSON.stringify({fetched, entries});
})()
""" % (FETCH_PATH, FETCH_PATH)


def load_page(b: Browser, url: str) -> dict:
    r = b.navigate(url)
    if r.get("errorText"):
        return {"error": r["errorText"], "entries": []}
    return json.loads(b.evaluate(RESULT_JS))


# ------------------------------------------------------------------------ net log


def read_netlog(path: Path) -> tuple[dict, list[dict]]:
    """(constants, events) of a Chromium net log; tolerates a log cut short (no closing
    brackets) by reading the one-event-per-line body."""
    text = path.read_text(errors="replace")
    try:
        j = json.loads(text)
        return j["constants"], j.get("events", [])
    except json.JSONDecodeError:
        pass
    head, sep, body = text.partition('\n"events": [\n')
    if not sep:
        raise SetupError(f"net log {path} has no events section")
    constants = json.loads(head.lstrip("{").strip().rstrip(",").removeprefix('"constants":'))
    events = []
    for line in body.splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break
    return constants, events


def analyse_netlog(path: Path, quic_addr: str, host: str) -> dict:
    """What Chromium did about QUIC for `host`, from its net log:

    - alt_svc: HTTP_STREAM_JOB_CONTROLLER_ALT_SVC_FOUND for a request to `host` (the
      Alt-Svc entry Chromium holds, and whether it has marked it broken);
    - sessions: QUIC sessions to `host` (QUIC_SESSION source), each with the peer address
      (from received packets), whether the handshake was confirmed, and how it closed;
    - to_proxy: those whose peer is `quic_addr`, or, when no packet came back, whose job
      connected a UDP socket to `quic_addr`;
    - jobs: QUIC_SESSION_POOL_JOB_CONNECT results for `host` (the net error a request sees);
    - cert: CERT_VERIFIER_JOB results for `host` (is_issued_by_known_root, cert_status).
    """
    constants, events = read_netlog(path)
    ev_name = {v: k for k, v in constants["logEventTypes"].items()}
    src_name = {v: k for k, v in constants["logSourceType"].items()}
    err_name = {v: k for k, v in constants.get("netError", {}).items()}
    quic_err = {v: k for k, v in constants.get("quicError", {}).items()}

    def net_error(code):
        return "net::" + err_name.get(code, str(code))

    by_src: dict[int, list[dict]] = {}
    for e in events:
        by_src.setdefault(e["source"]["id"], []).append(e)

    def named(e):
        return ev_name.get(e["type"], str(e["type"]))

    def stype(evs):
        return src_name.get(evs[0]["source"]["type"], "")

    alt_svc = []
    for evs in by_src.values():
        url = None
        for e in evs:
            p = e.get("params") or {}
            if named(e) == "HTTP_STREAM_JOB_CONTROLLER" and "url" in p:
                url = p["url"]
            if named(e) == "HTTP_STREAM_JOB_CONTROLLER_ALT_SVC_FOUND" and f" {host}:" in f" {p.get('alt_svc', '')}":
                alt_svc.append({"url": url, "alt_svc": p.get("alt_svc"), "is_broken": p.get("is_broken")})

    sessions = []
    for sid, evs in by_src.items():
        if stype(evs) != "QUIC_SESSION":
            continue
        s = {"source_id": sid, "host": None, "port": None, "peer": None,
             "handshake_confirmed": False, "close": None, "close_frame_sent": None,
             "close_frame_received": None}
        for e in evs:
            n = named(e)
            p = e.get("params") or {}
            if n == "QUIC_SESSION" and e.get("phase") == 1:
                s["host"], s["port"] = p.get("host"), p.get("port")
            if p.get("peer_address") and not s["peer"]:
                s["peer"] = p["peer_address"]
            if n in ("QUIC_SESSION_HANDSHAKE_CONFIRMED", "QUIC_SESSION_CRYPTO_HANDSHAKE_COMPLETE"):
                s["handshake_confirmed"] = True
            key = {"QUIC_SESSION_CLOSED": "close",
                   "QUIC_SESSION_CONNECTION_CLOSE_FRAME_SENT": "close_frame_sent",
                   "QUIC_SESSION_CONNECTION_CLOSE_FRAME_RECEIVED": "close_frame_received"}.get(n)
            if key and p and not s[key]:
                c = dict(p)
                if isinstance(c.get("quic_error"), int):
                    c["quic_error_name"] = quic_err.get(c["quic_error"], str(c["quic_error"]))
                s[key] = c
        if s["host"] == host:
            sessions.append(s)

    jobs, job_udp = [], {}
    for sid, evs in by_src.items():
        if not stype(evs).startswith("QUIC_SESSION_POOL") or stype(evs) == "QUIC_SESSION_POOL":
            continue
        job_host = next(((e.get("params") or {}).get("host") for e in evs
                         if named(e) == "QUIC_SESSION_POOL_JOB" and e.get("phase") == 1), None)
        if job_host != host:
            continue
        created = [(e.get("params") or {}).get("source_dependency", {}).get("id") for e in evs
                   if named(e) == "QUIC_SESSION_CREATED"]
        for e in evs:
            p = e.get("params") or {}
            if named(e) == "QUIC_SESSION_POOL_JOB_CONNECT" and e.get("phase") == 2:
                err = p.get("net_error", 0)
                jobs.append({"job": sid, "sessions": created,
                             "result": net_error(err) if err else "OK"})
    # UDP sockets: UDP_CONNECT on the socket source; its session is found through the
    # QUIC session's own events when packets flowed, else by address alone.
    udp_connects = []
    for evs in by_src.values():
        for e in evs:
            if named(e) == "UDP_CONNECT" and (e.get("params") or {}).get("address"):
                udp_connects.append(e["params"]["address"])

    cert = []
    for evs in by_src.values():
        if stype(evs) != "CERT_VERIFIER_JOB":
            continue
        info = {}
        for e in evs:
            p = e.get("params") or {}
            if "host" in p:
                info["host"] = p["host"]
            for k in ("is_issued_by_known_root", "cert_status", "net_error"):
                if k in p:
                    info[k] = net_error(p[k]) if k == "net_error" else p[k]
        if info.get("host") == host:
            cert.append(info)

    to_proxy = [s for s in sessions
                if s["peer"] == quic_addr or (s["peer"] is None and quic_addr in udp_connects)]
    return {"alt_svc": alt_svc, "sessions": sessions, "to_proxy": to_proxy, "jobs": jobs,
            "cert": cert, "udp_connects": udp_connects, "events": len(events)}


# ------------------------------------------------------------------------ report


def table(title: str, rows: list[dict]):
    print(f"\n{title}")
    w = max([len(r["url"]) for r in rows] + [3])
    print(f"  {'URL':<{w}}  {'nextHopProtocol':<15}  {'status':>6}  {'bytes':>8}")
    for r in rows:
        print(f"  {r['url']:<{w}}  {str(r.get('proto')):<15}  {str(r.get('status')):>6}  {str(r.get('bytes')):>8}")


def outcome(sessions: list[dict]) -> str:
    """One word for what became of the QUIC attempts to the proxy."""
    if any(s["handshake_confirmed"] for s in sessions):
        return "COMPLETED"
    if not any(s["peer"] for s in sessions):
        return "FAILED: no packet came back from the proxy"
    closes = " ".join(json.dumps(s["close"] or {}) + json.dumps(s["close_frame_sent"] or {})
                      for s in sessions)
    if "CERTIFICATE" in closes:
        return "REFUSED by Chromium at certificate verification"
    return "FAILED after the proxy answered"


def run_discovery(args, d: Path, home: Path, rules: str, metrics_url: str | None) -> tuple[bool, list]:
    log("run 1 (discovery): Alt-Svc from the TCP ingress, no forcing")
    before = scrape(metrics_url) if metrics_url else {}
    netlog = d / "netlog-1.json"
    b = Browser(d / "r1", home, netlog, rules, [])
    rows = []
    try:
        url = f"https://{HOST}/"
        first = load_page(b, url)
        rows += [dict(e, url=e["url"] + "  (load 1)") for e in first["entries"]]
        # The Alt-Svc is now cached; a new load starts the alternative (QUIC) job. Give the
        # QUIC attempt time to finish (fail or succeed) before reading the log.
        time.sleep(1)
        second = load_page(b, url)
        rows += [dict(e, url=e["url"] + "  (load 2)") for e in second["entries"]]
        time.sleep(1)
    finally:
        b.close()
    after = scrape(metrics_url) if metrics_url else {}
    table("run 1 (discovery): requests", rows)

    quic_addr = f"{args.quic_host}:{args.quic_port}"
    a = analyse_netlog(netlog, quic_addr, HOST)
    print(f"\nrun 1 net log ({a['events']} events):")
    fresh = [x for x in a["alt_svc"] if not x["is_broken"]]
    for x in fresh:
        print(f"  ALT_SVC_FOUND for {x['url']}: {x['alt_svc']!r} is_broken=false")
    if len(a["alt_svc"]) > len(fresh):
        print(f"  ALT_SVC_FOUND with is_broken=true for {len(a['alt_svc']) - len(fresh)} later request(s)")
    for s in a["sessions"]:
        print(f"  QUIC session #{s['source_id']} {s['host']}:{s['port']} peer={s['peer']} "
              f"handshake_confirmed={s['handshake_confirmed']}")
        for k in ("close_frame_sent", "close_frame_received", "close"):
            if s[k]:
                print(f"    {k}: {json.dumps(s[k])}")
    for j in a["jobs"]:
        print(f"  QUIC_SESSION_POOL_JOB_CONNECT #{j['job']} (sessions {j['sessions']}): {j['result']}")
    for c in a["cert"]:
        print(f"  CERT_VERIFIER_JOB {HOST}: {json.dumps(c)}")
    if metrics_url:
        print(f"  proxy handshakes: {metric_deltas(before, after, HANDSHAKES_METRIC) or 'no change'}")
        print(f"  proxy requests:   {metric_deltas(before, after, REQUESTS_METRIC) or 'no change'}")

    discovered = bool(a["alt_svc"]) and bool(a["to_proxy"])
    if discovered:
        print(f"\nFINDING run 1: after Alt-Svc Chromium attempted QUIC to {quic_addr} "
              f"({len(a['to_proxy'])} session(s)); handshake {outcome(a['to_proxy'])}.")
        for s in a["to_proxy"][:1]:
            c = s["close"] or {}
            if not s["handshake_confirmed"]:
                print(f"  closed by {'the proxy' if c.get('from_peer') else 'Chromium'}: "
                      f"{c.get('quic_error_name')}: {c.get('details')!r}")
        results = sorted({j["result"] for j in a["jobs"] if set(j["sessions"]) & {s["source_id"] for s in a["to_proxy"]}})
        print(f"  QUIC job result: {', '.join(results) or 'none logged'}")
        roots = sorted({str(c.get("is_issued_by_known_root")) for c in a["cert"]})
        status = sorted({str(c.get("cert_status")) for c in a["cert"]})
        print(f"  certificate: is_issued_by_known_root={'/'.join(roots) or '?'} cert_status={'/'.join(status) or '?'} "
              "(cert_status 0: the chain itself verified against the NSS-trusted test CA)")
        if any(x["is_broken"] for x in a["alt_svc"]):
            print("  afterwards Chromium marked the alternative broken and stayed on h2")
    elif not a["alt_svc"]:
        print(f"\nFINDING run 1: Chromium never used an Alt-Svc entry for {HOST} (no ALT_SVC_FOUND)")
    else:
        print(f"\nFINDING run 1: Alt-Svc seen but no QUIC session to {quic_addr} in the net log "
              f"(sessions to: {[s['peer'] for s in a['sessions']]}, UDP: {sorted(set(a['udp_connects']))})")
    # The page and its 1 MiB fetch must load (over TCP); a favicon's 404 does not matter.
    main = [e for e in first.get("entries", []) if e["type"] == "navigation" or FETCH_PATH in e["url"]]
    ok_pages = len(main) == 2 and all(e.get("status") == 200 for e in main)
    if not ok_pages:
        print(f"  FAIL: page load over TCP: {first}")
    return discovered and ok_pages, rows


def run_forced(args, d: Path, home: Path, rules: str, metrics_url: str) -> tuple[bool, list]:
    log(f"run 2 (forced): --origin-to-force-quic-on={HOST}:443")
    before = scrape(metrics_url)
    netlog = d / "netlog-2.json"
    b = Browser(d / "r2", home, netlog, rules, [f"--origin-to-force-quic-on={HOST}:443"])
    try:
        res = load_page(b, f"https://{HOST}/")
    finally:
        b.close()
    after = scrape(metrics_url)
    rows = res.get("entries", [])
    problems = [f"page: {res['error']}"] if res.get("error") else []
    table("run 2 (forced QUIC): requests", rows)
    print(f"  page's fetch(): {json.dumps(res.get('fetched') or res.get('error'))}")
    delta = metric_sum(after, REQUESTS_METRIC) - metric_sum(before, REQUESTS_METRIC)
    print(f"  proxy {REQUESTS_METRIC}: +{delta:g} {metric_deltas(before, after, REQUESTS_METRIC)}")
    print(f"  proxy handshakes: {metric_deltas(before, after, HANDSHAKES_METRIC) or 'no change'}")
    a = analyse_netlog(netlog, f"{args.quic_host}:{args.quic_port}", HOST)
    for s in a["to_proxy"]:
        print(f"  net log: QUIC session #{s['source_id']} to {s['peer']} handshake_confirmed={s['handshake_confirmed']}")
    if not a["to_proxy"]:
        problems.append("no QUIC session to the proxy in the net log")

    page = [r for r in rows if r["type"] == "navigation"]
    fetch = [r for r in rows if FETCH_PATH in r["url"]]
    if not page or page[0]["proto"] != "h3" or page[0]["status"] != 200:
        problems.append(f"page not 200 over h3: {page}")
    if not fetch or fetch[0]["proto"] != "h3" or fetch[0]["status"] != 200:
        problems.append(f"fetch not 200 over h3: {fetch}")
    fetched = res.get("fetched") or {}
    if fetched.get("bytes") != FETCH_BYTES:
        problems.append(f"fetch got {fetched} (want {FETCH_BYTES} bytes)")
    h3_rows = sum(1 for r in rows if r["proto"] == "h3")
    if delta < max(2, h3_rows):
        problems.append(f"{REQUESTS_METRIC} moved by {delta:g}, want >= {max(2, h3_rows)}")
    for p in problems:
        print(f"  FAIL: {p}")
    return not problems, rows


# ------------------------------------------------------------------------ netns


def in_netns(argv: list[str]) -> int:
    """Re-runs this script inside a fresh network namespace with loopback up, then removes
    the namespace. Everything (nginx, proxy, Chromium, us) lives there, so TCP/UDP 443 on
    127.0.0.1 are ours and nothing on the host is touched."""
    if os.geteuid() != 0:
        print("the local setup needs root (ip netns, port 443)", file=sys.stderr)
        return 2
    ns = f"h3i-browser-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        p = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, __file__, "--in-netns", *argv])
        try:
            return p.wait()
        except KeyboardInterrupt:
            p.send_signal(signal.SIGINT)
            return p.wait()
    finally:
        subprocess.run(["ip", "netns", "del", ns])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=str(ROOT / "target/debug/h3-ingress"),
                    help="local setup: the proxy binary")
    ap.add_argument("--ingress", help="ADDR:PORT of an existing TCP ingress (no local servers)")
    ap.add_argument("--quic", help="ADDR:PORT of the proxy (default: ingress address, port 443)")
    ap.add_argument("--ca", help="CA certificate (PEM) that issued HOST's certificate")
    ap.add_argument("--metrics", help="the proxy's /metrics URL")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (net logs, profiles)")
    ap.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if not args.ingress and not args.in_netns:
        return in_netns(sys.argv[1:])

    start = time.monotonic()
    d = Path(tempfile.mkdtemp(prefix="h3i-browser-"))
    local = None
    try:
        if args.ingress:
            if not (args.ca and args.metrics):
                ap.error("--ingress needs --ca and --metrics")
            ing_host, ing_port = args.ingress.rsplit(":", 1)
            quic = args.quic or f"{ing_host}:443"
            args.quic_host, args.quic_port = quic.rsplit(":", 1)
            # The net log writes IPv6 peers as [addr]:port.
            if ":" in args.quic_host and not args.quic_host.startswith("["):
                args.quic_host = f"[{args.quic_host}]"
            ca = Path(args.ca)
            metrics_url = args.metrics
        else:
            ing_host, ing_port = "127.0.0.1", "443"
            args.quic_host, args.quic_port = "127.0.0.1", "443"
            binary = Path(args.binary)
            if not binary.exists():
                raise SetupError(f"{binary} missing (cargo build)")
            ca, cert, key = make_pki(d, HOST)
            log("starting nginx (TCP 443, Alt-Svc h3=\":443\") and the proxy (UDP 443) in the netns")
            local = Local(d, binary, "127.0.0.1", cert, key)
            metrics_url = local.metrics_url
        # MAP with a port only when the ingress is not on 443 (then QUIC goes there too).
        target = ing_host if ing_port == "443" else f"{ing_host}:{ing_port}"
        rules = f"MAP {HOST} {target}"
        home = d / "home"
        make_nssdb(home, ca)
        version = chromium_version(chromium_binary())
        log(f"{version}; {rules}; proxy {args.quic_host}:{args.quic_port}; metrics {metrics_url}")

        ok1, _ = run_discovery(args, d, home, rules, metrics_url)
        ok2, _ = run_forced(args, d, home, rules, metrics_url)
        if local:
            # Chromium's requests as nginx saw them: straight over TCP, or through the proxy
            # (which adds Forwarded). The proxy's own Alt-Svc probe is left out.
            seen = {}
            for e in local.access_log():
                if "HeadlessChrome" in e.get("ua", ""):
                    k = f"{e['protocol']} {'via proxy' if e.get('fwd') else 'direct'}"
                    seen[k] = seen.get(k, 0) + 1
            print(f"\nnginx access log, Chromium's requests: {seen}")
        print(f"\nrun 1 discovery: {'PASS' if ok1 else 'FAIL'}; run 2 forced h3: {'PASS' if ok2 else 'FAIL'}; "
              f"{time.monotonic() - start:.1f}s; {version}")
        return 0 if ok1 and ok2 else 1
    except SetupError as e:
        print(f"SETUP ERROR: {e}", file=sys.stderr)
        return 2
    finally:
        if local:
            local.close()
        if args.keep:
            print(f"kept {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
