#!/usr/bin/env python3
"""A real Prometheus computes the h3 request share from a running proxy and a real nginx.

Everything runs on loopback, each process started here and stopped at the end:
- nginx (Debian) as the TCP ingress: TLS + HTTP/2 for host share.test, and stub_status on a
  separate port;
- prometheus-nginx-exporter (Debian) turning stub_status into nginx_http_requests_total;
- our proxy (`h3-ingress proxy --config FILE`) in front of nginx, with the same certificate;
- Prometheus (Debian) scraping both every second and evaluating the chart's rules, rendered by
  Helm with the `generic` preset, perHost: false (stub_status has no host label).

stub_status counts its own polls too: one per exporter scrape, and the Debian exporter (0.11) has
no counter of its own scrapes. Prometheus records one `up` sample per scrape, so the denominator
subtracts the scrape rate:
  sum(rate(nginx_http_requests_total[5m])) - sum(count_over_time(up{job="nginx"}[5m])) / 300

A known mix (default 30 h3 requests through the proxy with an aioquic client, 10 h2 requests
straight to nginx with curl) must give share 30 / (30 + 10) = 0.75, because nginx also serves
the proxied requests; nginx's access log must show exactly those requests. The recorded value is
compared within a tolerance: rate() extrapolates each series to the window edges from its own
scrape times, which differ by up to one scrape interval between the proxy and the exporter; a
long pre-roll (scraping before the mix) keeps that error small.

Without a binary that has the `proxy` subcommand the test still runs nginx, the exporter,
Prometheus and the rules, checks the denominator against a known number of h2 requests, and
then reports SKIPPED for the share (exit code 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gen  # noqa: E402

ROOT = HERE.parents[1]
HOST = "share.test"
DENOMINATOR = 'sum(rate(nginx_http_requests_total[5m])) - sum(count_over_time(up{job="nginx"}[5m])) / 300'
TOLERANCE = 0.03
SCRAPE = 0.5  # seconds


def make_pki(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a leaf for HOST signed by it (webpki refuses a CA certificate as a server's)."""
    ca, ca_key = d / "ca.pem", d / "ca-key.pem"
    cert, key, csr, ext = d / "cert.pem", d / "key.pem", d / "leaf.csr", d / "leaf.ext"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=share test CA")
    run("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={HOST}")
    ext.write_text(f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   f"extendedKeyUsage=serverAuth\nsubjectAltName=DNS:{HOST}\n")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert))
    return cert, key, ca


def free_port(kind=socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 20) -> str:
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.read().decode()
        except Exception as e:  # noqa: BLE001 (retry until the deadline on any failure)
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"{url} not reachable: {last}")


class Procs:
    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, cmd: list[str]) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "w")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p))
        return p

    def check_alive(self) -> None:
        for name, p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{(self.logdir / f'{name}.log').read_text()[-2000:]}")

    def stop(self) -> None:
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


class Prom:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params) -> dict:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=5) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"{url}: {body}")
        return body["data"]

    def value(self, expr: str) -> float | None:
        res = self.get("/api/v1/query", query=expr)["result"]
        if not res:
            return None
        if len(res) != 1:
            raise RuntimeError(f"{expr} has {len(res)} series: {res}")
        return float(res[0]["value"][1])

    def wait_samples(self, expr: str, n: int, timeout: float = 30) -> None:
        """Until `expr` (an instant vector) has at least n samples in the last minute."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.value(f"count_over_time({expr}[1m])")
            if v is not None and v >= n:
                return
            time.sleep(0.5)
        raise RuntimeError(f"Prometheus has fewer than {n} samples of {expr}")


def nginx_conf(d: Path, tls_port: int, h1_port: int, stub_port: int, cert: Path, key: Path) -> Path:
    conf = d / "nginx.conf"
    conf.write_text(f"""
user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{tls_port} ssl http2;
        listen 127.0.0.1:{h1_port} ssl;
        server_name {HOST};
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{ return 200 "served by nginx over $server_protocol\\n"; }}
    }}
    server {{
        listen 127.0.0.1:{stub_port};
        location = /stub_status {{ stub_status; }}
    }}
}}
""")
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (d / sub).mkdir(exist_ok=True)
    return conf


async def h3_requests(port: int, n: int, cafile: Path, prefix: str = "/h3/") -> list[int]:
    """n GET requests over one HTTP/3 connection (aioquic), returning the status codes."""
    from aioquic.asyncio import connect
    from aioquic.asyncio.protocol import QuicConnectionProtocol
    from aioquic.h3.connection import H3_ALPN, H3Connection
    from aioquic.h3.events import DataReceived, HeadersReceived
    from aioquic.quic.configuration import QuicConfiguration

    class Client(QuicConnectionProtocol):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.h3 = H3Connection(self._quic)
            self.pending: dict[int, tuple[asyncio.Future, dict]] = {}

        def quic_event_received(self, event):
            for ev in self.h3.handle_event(event):
                if not isinstance(ev, (HeadersReceived, DataReceived)) or ev.stream_id not in self.pending:
                    continue
                fut, resp = self.pending[ev.stream_id]
                if isinstance(ev, HeadersReceived):
                    resp["status"] = int(dict(ev.headers)[b":status"])
                if ev.stream_ended and not fut.done():
                    fut.set_result(resp["status"])

        async def get(self, path: str) -> int:
            sid = self._quic.get_next_available_stream_id()
            fut = asyncio.get_running_loop().create_future()
            self.pending[sid] = (fut, {"status": 0})
            self.h3.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                       (b":authority", HOST.encode()), (b":path", path.encode())],
                                 end_stream=True)
            self.transmit()
            return await asyncio.wait_for(fut, 10)

    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN, server_name=HOST)
    cfg.load_verify_locations(str(cafile))
    async with connect("127.0.0.1", port, configuration=cfg, create_protocol=Client) as client:
        return [await client.get(f"{prefix}{i}") for i in range(n)]


def h2_requests(port: int, n: int, cafile: Path) -> list[str]:
    urls = [f"https://{HOST}:{port}/h2/{i}" for i in range(n)]
    cmd = ["curl", "-sS", "--http2", "--cacert", str(cafile), "--resolve", f"{HOST}:{port}:127.0.0.1",
           "-o", "/dev/null", "-w", "%{http_code} %{http_version}\\n"]
    for u in urls:
        cmd += [u, "-o", "/dev/null"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split("\n")
    return [line for line in out if line]


def has_proxy(binary: Path | None) -> bool:
    if binary is None or not binary.exists():
        return False
    return subprocess.run([str(binary), "proxy", "--help"], capture_output=True).returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--proxy", type=Path, default=ROOT / "target/debug/h3-ingress",
                    help="h3-ingress binary with the `proxy` subcommand")
    ap.add_argument("--h3", type=int, default=30)
    ap.add_argument("--h2", type=int, default=10)
    ap.add_argument("--upstream-http1", action="store_true",
                    help="proxy to an nginx port without h2 (same server block, same counters)")
    ap.add_argument("--smoke", action="store_true",
                    help="only nginx and the proxy: a few h3 requests must reach nginx and succeed")
    ap.add_argument("--preroll", type=float, default=60, help="seconds of scraping before the mix")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--scrape-out", type=Path, help="write the proxy's /metrics here after the mix")
    args = ap.parse_args()
    for tool in ("nginx", "prometheus", "prometheus-nginx-exporter", "promtool", "curl", "openssl"):
        if not shutil.which(tool) and not Path(f"/usr/sbin/{tool}").exists():
            print(f"FAIL prom_share_test: {tool} not installed")
            return 1
    proxy = has_proxy(args.proxy)

    work = Path(tempfile.mkdtemp(prefix="h3-share-"))
    procs = Procs(work)
    try:
        cert, key, ca = make_pki(work)
        tls_port, h1_port, stub_port, exp_port, prom_port, admin_port = (free_port() for _ in range(6))
        udp_port = free_port(socket.SOCK_DGRAM)

        conf = nginx_conf(work, tls_port, h1_port, stub_port, cert, key)
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        procs.start("nginx", [nginx, "-p", str(work), "-c", str(conf), "-g", "daemon off;"])
        wait_http(f"http://127.0.0.1:{stub_port}/stub_status")
        procs.start("exporter", ["prometheus-nginx-exporter", f"-nginx.scrape-uri=http://127.0.0.1:{stub_port}/stub_status",
                                 f"-web.listen-address=127.0.0.1:{exp_port}"])
        exported = wait_http(f"http://127.0.0.1:{exp_port}/metrics")
        for name in ("nginx_http_requests_total",):
            if name not in exported:
                raise RuntimeError(f"the exporter does not export {name}:\n{exported}")

        targets = [("nginx", exp_port)]
        if proxy:
            cfg = work / "h3-ingress.yaml"
            cfg.write_text(json.dumps({
                "port": udp_port,
                "addresses": {"ipv4": "127.0.0.1", "ipv6": None},
                "upstream": {"address": f"127.0.0.1:{h1_port if args.upstream_http1 else tls_port}",
                             "tls": True, "verify": "servedCertificate"},
                "metrics": {"address": f"127.0.0.1:{admin_port}"},
                "hosts": [{"name": HOST, "certFile": str(cert), "keyFile": str(key)}],
            }))
            procs.start("proxy", [str(args.proxy), "proxy", "--config", str(cfg)])
            wait_http(f"http://127.0.0.1:{admin_port}/metrics")
            # Creates the per-host counter series before Prometheus looks: a counter whose first
            # sample already holds the whole mix would show no increase at all.
            warm = asyncio.run(h3_requests(udp_port, 1, ca, prefix="/warmup/"))
            assert warm == [200], f"warm-up h3 request: {warm}"
            targets.append(("h3-ingress", admin_port))
            if args.smoke:
                codes = asyncio.run(h3_requests(udp_port, 3, ca, prefix="/smoke/"))
                protocols = sorted({line.split('"')[1].rsplit(" ", 1)[-1]
                                    for line in (work / "access.log").read_text().splitlines()
                                    if "GET /smoke/" in line or "GET /warmup/" in line})
                print(f"smoke: 3 h3 requests through the proxy -> {codes}; nginx saw them as {protocols}")
                if codes != [200, 200, 200]:
                    print("FAIL prom_share_test --smoke")
                    return 1
                print("ok: prom_share_test --smoke")
                return 0
        elif args.smoke:
            print("SKIPPED: --smoke needs the `proxy` subcommand")
            return 3
        else:
            print("!!!!!!!!!!!!!!!!!!!! no `proxy` subcommand in", args.proxy,
                  "- running without the data plane")

        rules = work / "rules.yml"
        rules.write_text(gen.dump_rules(gen.rule_groups(
            {"share": {"preset": "generic", "generic": {"expr": DENOMINATOR, "perHost": False}}})))
        chk = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
        print("$ promtool check rules rules.yml  # chart rules, preset generic (stub_status), rendered by Helm")
        print("  " + (chk.stdout + chk.stderr).strip().replace("\n", "\n  "))
        if chk.returncode:
            return 1
        scrape_configs = "\n".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: ['127.0.0.1:{port}']" for job, port in targets)
        (work / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {int(SCRAPE * 1000)}ms\n  evaluation_interval: {int(SCRAPE * 1000)}ms\n"
            f"rule_files:\n  - {rules}\n"
            f"scrape_configs:\n{scrape_configs}\n")
        procs.start("prometheus", ["prometheus", f"--config.file={work}/prometheus.yml",
                                   f"--storage.tsdb.path={work}/tsdb", f"--web.listen-address=127.0.0.1:{prom_port}"])
        wait_http(f"http://127.0.0.1:{prom_port}/-/ready", timeout=60)
        prom = Prom(prom_port)
        groups = prom.get("/api/v1/rules")["groups"]
        loaded = sum(len(g["rules"]) for g in groups)
        print(f"Prometheus {prom.get('/api/v1/status/buildinfo')['version']} loaded {len(groups)} groups, "
              f"{loaded} rules")
        for job, _ in targets:
            prom.wait_samples(f'up{{job="{job}"}}', 3)
        if proxy:
            prom.wait_samples(f'h3_ingress_requests_total{{host="{HOST}"}}', 3)
        procs.check_alive()

        print(f"scraping every {SCRAPE}s for {args.preroll:.0f}s before the mix")
        time.sleep(args.preroll)
        procs.check_alive()
        # Requests before this point (the warm-up, the proxy's start-up Alt-Svc probe) are
        # before Prometheus's first samples and outside every rate window.
        log_start = len((work / "access.log").read_text().splitlines())
        h3 = asyncio.run(h3_requests(udp_port, args.h3, ca)) if proxy else []
        h2 = h2_requests(tls_port, args.h2, ca)
        print(f"sent {len(h3)} h3 requests through the proxy (statuses {sorted(set(h3))}), "
              f"{len(h2)} h2 requests to nginx ({sorted(set(h2))})")
        time.sleep(5)  # several scrapes and rule evaluations after the mix
        procs.check_alive()
        log = (work / "access.log").read_text().splitlines()
        seen = {kind: sum(1 for line in log if f"GET /{kind}/" in line) for kind in ("h3", "h2")}
        other = [line for line in log[log_start:]
                 if not any(f"GET /{p}" in line for p in ("stub_status", "h3/", "h2/"))]
        print(f"nginx access log: {seen['h3']} proxied h3 requests, {seen['h2']} h2 requests, "
              f"{len(other)} other request(s) during the mix besides stub_status polls")
        for line in other:
            print("  other: " + line)
        failures = []
        if seen != {"h3": args.h3 if proxy else 0, "h2": args.h2}:
            failures.append(f"nginx saw {seen}, expected h3={args.h3 if proxy else 0} h2={args.h2}")
        denominator = prom.value('h3_ingress:tcp_ingress_requests:rate5m{host="*"}')
        print(f"h3_ingress:tcp_ingress_requests:rate5m{{host=\"*\"}} = {denominator} "
              f"(x 300 s = {denominator * 300 if denominator else None} requests in the window)")
        total = args.h2 + (args.h3 if proxy else 0) + len(other)
        if not denominator or abs(denominator * 300 - total) > 0.25 * total:
            failures.append(f"the denominator does not account for the {total} requests nginx served")
        if args.scrape_out and proxy:
            args.scrape_out.write_text(wait_http(f"http://127.0.0.1:{admin_port}/metrics"))
        if not proxy:
            for f in failures:
                print("FAIL " + f)
            if failures:
                return 1
            print("SKIPPED: share not measured: the data plane (`h3-ingress proxy`) is not in this binary")
            return 3
        if any(code != 200 for code in h3):
            failures.append(f"h3 statuses {h3}")
        expected = args.h3 / (args.h3 + args.h2)
        share = prom.value('h3_ingress:h3_request_share:ratio_rate5m{host="*"}')
        print(f"h3_ingress:h3_request_share:ratio_rate5m{{host=\"*\"}} = {share} (expected {expected})")
        if share is None or abs(share - expected) > TOLERANCE:
            failures.append(f"recorded share {share} is not within {TOLERANCE} of {expected}")
        # The kubectl plugin's check re-executes this binary as `h3-ingress check` against the node.
        plugin = work / "kubectl-h3_ingress"
        plugin.symlink_to(args.proxy.resolve())
        p = subprocess.run([str(plugin), "check", HOST, "--node", f"127.0.0.1:{udp_port}", "--",
                            "--cacert", str(ca)], capture_output=True, text=True, timeout=60)
        print(f"$ kubectl-h3_ingress check {HOST} --node 127.0.0.1:{udp_port} -- --cacert ca.pem  (exit {p.returncode})")
        print("  " + (p.stderr + p.stdout).strip().replace("\n", "\n  "))
        if p.returncode != 0:
            failures.append("kubectl-h3_ingress check against the running proxy failed")
        if failures:
            print("FAIL prom_share_test:\n  " + "\n  ".join(failures))
            return 1
        print("ok: prom_share_test")
        return 0
    except Exception as e:  # noqa: BLE001 (report with the logs)
        print(f"FAIL prom_share_test: {e}")
        for log in sorted(work.glob("*.log")):
            print(f"--- {log.name}\n{log.read_text()[-1500:]}")
        return 1
    finally:
        procs.stop()
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
