#!/usr/bin/env python3
"""Client-side checks of the cluster scripts not yet ported to the scenario runner
(skew.sh, rollout.sh, upgrade.sh; the journey's own are in
tests/cluster/scenarios/src/h3.rs and prom.rs): HTTP/3 requests to a data plane on a node
address with two independent clients (aioquic through tests/py/h3client.py, and curl 8.14 with
HTTP/3 from the Debian trixie chroot), steady traffic, and Prometheus scrapes.

Each subcommand prints one line saying what it saw; on a failed expectation it prints
`FAIL: <what was expected, what came back>` on stderr and exits 1.

  journey.py h3 --client aioquic|curl --addr IP --host HOST --path /1m.bin --cacert CA \
      --cert-sha SHA256 --body-sha SHA256 --alt-svc 'h3=":443"; ma=3600' [--trixie DIR]
  journey.py refused --addr IP --host HOST --cacert CA   (the handshake must fail)
  journey.py load --seconds 60 --target IP,HOST ... --cacert CA --path /whoami [--stop-file F]
  journey.py metric --url http://IP:PORT/metrics --name NAME [--label k=v ...]
  journey.py der-sha256 CERT.pem
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
H3CLIENT = os.path.join(REPO, "tests", "py", "h3client.py")


class Fail(Exception):
    pass


def python():
    """The interpreter with aioquic: the repo's .venv when scripts/setup.sh made one."""
    venv = os.path.join(REPO, ".venv", "bin", "python3")
    return os.environ.get("H3I_PYTHON") or (venv if os.path.exists(venv) else sys.executable)


def der_sha256(pem_path):
    der = subprocess.run(
        ["openssl", "x509", "-in", pem_path, "-outform", "DER"], capture_output=True, check=True
    ).stdout
    return hashlib.sha256(der).hexdigest()


def run_h3client(args, port, extra, timeout=30):
    url = f"https://{args.host}:{port}{getattr(args, 'path', '/')}"
    cmd = [python(), H3CLIENT, url, "--resolve", f"{args.host}:{port}:{args.addr}",
           "--cacert", args.cacert, "--connect-timeout", "5", "--timeout", "20", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    try:
        return json.loads(out.stdout)
    except json.JSONDecodeError:
        raise Fail(f"h3client.py printed no JSON (exit {out.returncode}): {out.stdout[:300]} {out.stderr[-500:]}")


def aioquic_get(args):
    """(status, cert sha256, body sha256, body length, alt-svc, detail) over aioquic."""
    rep = run_h3client(args, args.port, [])
    conn = rep.get("connection", {})
    hs = conn.get("handshake", {})
    if not hs.get("ok"):
        raise Fail(f"aioquic: handshake with {args.addr}:{args.port} (SNI {args.host}) failed: {hs}")
    reqs = rep.get("requests") or [{}]
    r = reqs[0]
    if r.get("error") or r.get("reset"):
        raise Fail(f"aioquic: request failed: error={r.get('error')} reset={r.get('reset')}")
    headers = {k.lower(): v for k, v in r.get("headers", [])}
    cert = (conn.get("server_cert") or {}).get("sha256", "")
    detail = f"ALPN {hs.get('alpn')}, handshake {hs.get('ms', 0):.0f} ms, total {r.get('total_ms', 0):.0f} ms"
    return r.get("status"), cert, r.get("body_sha256"), r.get("body_length"), headers.get("alt-svc", ""), detail


def curl_get(args):
    """The same over trixie curl --http3-only, run inside the chroot (paths must be in it)."""
    root = args.trixie
    if not os.path.exists(os.path.join(root, "usr", "bin", "curl")):
        raise Fail(f"no trixie chroot with curl at {root} (scripts/trixie-chroot.sh {root})")
    work = tempfile.mkdtemp(prefix="h3i-journey-curl-", dir=os.path.join(root, "tmp"))
    inside = "/tmp/" + os.path.basename(work)
    try:
        shutil.copy(args.cacert, os.path.join(work, "ca.crt"))
        cmd = ["chroot", root, "curl", "--http3-only", "-sS", "--max-time", "20",
               "--resolve", f"{args.host}:{args.port}:{args.addr}", "--cacert", f"{inside}/ca.crt",
               "-D", f"{inside}/headers", "-o", f"{inside}/body",
               "-w", "%{json}\\n%{certs}", f"https://{args.host}:{args.port}{args.path}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=40)
        first, _, certs = out.stdout.partition("\n")
        try:
            info = json.loads(first)
        except json.JSONDecodeError:
            raise Fail(f"curl: exit {out.returncode}, no -w JSON: {out.stderr.strip()[:300]}")
        if out.returncode != 0:
            raise Fail(f"curl: exit {out.returncode}: {out.stderr.strip()[:300]}")
        if info.get("http_version") != "3":
            raise Fail(f"curl: answered over HTTP/{info.get('http_version')}, not HTTP/3")
        with open(os.path.join(work, "body"), "rb") as f:
            body = f.read()
        with open(os.path.join(work, "headers"), encoding="latin-1") as f:
            hdrs = [line.split(":", 1) for line in f.read().splitlines() if ":" in line]
        headers = {k.strip().lower(): v.strip() for k, v in hdrs}
        cert = leaf_sha256_from_curl_certs(certs)
        detail = (f"curl {curl_version(root)}, connect {info.get('time_connect', 0) * 1000:.0f} ms, "
                  f"total {info.get('time_total', 0) * 1000:.0f} ms")
        return (info.get("response_code"), cert, hashlib.sha256(body).hexdigest(), len(body),
                headers.get("alt-svc", ""), detail)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def curl_version(root):
    out = subprocess.run(["chroot", root, "curl", "--version"], capture_output=True, text=True).stdout
    return out.split()[1] if out else "?"


def leaf_sha256_from_curl_certs(text):
    """SHA-256 of the first (leaf) certificate of curl's %{certs} write-out (PEM blocks)."""
    m = re.search(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", text, re.S)
    if not m:
        raise Fail(f"curl printed no certificate in %{{certs}}: {text[:200]!r}")
    der = subprocess.run(["openssl", "x509", "-outform", "DER"], input=m.group(0).encode(),
                         capture_output=True, check=True).stdout
    return hashlib.sha256(der).hexdigest()


def cmd_h3(args):
    get = aioquic_get if args.client == "aioquic" else curl_get
    status, cert, body_sha, body_len, alt_svc, detail = get(args)
    problems = []
    if status != 200:
        problems.append(f"status {status}, want 200")
    if args.cert_sha and cert != args.cert_sha:
        problems.append(f"certificate sha256 {cert[:16]}..., want {args.cert_sha[:16]}...")
    if args.body_sha and body_sha != args.body_sha:
        problems.append(f"body sha256 {str(body_sha)[:16]}... ({body_len} B), want {args.body_sha[:16]}...")
    if args.alt_svc is not None and alt_svc != args.alt_svc:
        problems.append(f"Alt-Svc {alt_svc!r}, want {args.alt_svc!r}")
    if problems:
        raise Fail(f"{args.client} https://{args.host}{args.path} via {args.addr}: " + "; ".join(problems))
    print(f"{args.client:7} {args.addr:>10} {args.host}{args.path}: HTTP/3 {status}, cert {cert[:12]}, "
          f"body {body_len} B sha256 {body_sha[:12]}, Alt-Svc {alt_svc!r} ({detail})")


def cmd_refused(args):
    """The handshake fails: with a TLS alert from a live server (--kind tls_alert: it no longer
    has a certificate for the name), or with no answer at all (--kind silent: nothing listens)."""
    rep = run_h3client(args, args.port, [])
    hs = rep.get("connection", {}).get("handshake", {})
    if hs.get("ok"):
        raise Fail(f"{args.host} via {args.addr}: the handshake succeeded (cert "
                   f"{(rep['connection'].get('server_cert') or {}).get('sha256', '')[:12]}), want it refused")
    kind = hs.get("kind")
    want = {"tls_alert": {"tls_alert"}, "silent": {"timeout", "unreachable"}}[args.kind]
    if kind not in want:
        raise Fail(f"{args.host} via {args.addr}: handshake failed with {kind} ({hs.get('detail')}), want {args.kind}")
    detail = hs.get("detail")
    if isinstance(detail, dict):
        detail = f"{detail.get('error_name')} {detail.get('tls_alert_name') or ''} {detail.get('reason') or ''}".strip()
    print(f"{args.addr:>10} {args.host}: handshake failed ({kind}: {str(detail)[:100]})")


def cmd_load(args):
    """Requests over fresh connections to every target, round robin, for --seconds (or until
    --stop-file exists)."""
    targets = [t.split(",", 1) for t in args.target]
    started = time.monotonic()
    deadline = started + args.seconds
    ok = bad = 0
    errors = []
    spec = json.dumps([{"path": args.path} for _ in range(args.per_connection)])
    while time.monotonic() < deadline and not (args.stop_file and os.path.exists(args.stop_file)):
        for addr, host in targets:
            ns = argparse.Namespace(addr=addr, host=host, cacert=args.cacert, path=args.path)
            rep = run_h3client(ns, args.port, ["--requests", spec])
            for r in rep.get("requests", []):
                if r.get("status") == 200:
                    ok += 1
                else:
                    bad += 1
                    errors.append(f"{addr}: {r.get('status')} {r.get('error')}")
            if not rep.get("requests"):
                bad += 1
                errors.append(f"{addr}: {rep.get('connection', {}).get('handshake')}")
        time.sleep(args.pause)
    took = time.monotonic() - started
    if bad:
        raise Fail(f"{bad} of {ok + bad} requests failed over {took:.0f} s: {errors[:3]}")
    print(f"{ok} HTTP/3 requests over {took:.0f} s to {len(targets)} node(s), all 200")


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def cmd_metric(args):
    """Sum of the samples of NAME whose labels include every --label k=v."""
    with urllib.request.urlopen(args.url, timeout=10) as resp:
        text = resp.read().decode()
    want = dict(kv.split("=", 1) for kv in args.label)
    total, seen = 0.0, 0
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m or m.group(1) != args.name:
            continue
        labels = dict(LABEL.findall(m.group(3) or ""))
        if all(labels.get(k) == v for k, v in want.items()):
            total += float(m.group(4))
            seen += 1
    if not seen:
        raise Fail(f"{args.url} exports no {args.name}{want or ''}")
    print(int(total) if total.is_integer() else total)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("h3", "refused"):
        s = sub.add_parser(name)
        s.add_argument("--addr", required=True)
        s.add_argument("--host", required=True)
        s.add_argument("--port", type=int, default=443)
        s.add_argument("--cacert", required=True)
        s.add_argument("--path", default="/")
        if name == "refused":
            s.add_argument("--kind", choices=["tls_alert", "silent"], default="tls_alert")
        if name == "h3":
            s.add_argument("--client", choices=["aioquic", "curl"], default="aioquic")
            s.add_argument("--cert-sha")
            s.add_argument("--body-sha")
            s.add_argument("--alt-svc")
            s.add_argument("--trixie", default=os.environ.get("H3I_TRIXIE_ROOT", "/work/trixie-root"))
    s = sub.add_parser("load")
    s.add_argument("--target", action="append", required=True, help="ADDR,HOST")
    s.add_argument("--seconds", type=float, default=60)
    s.add_argument("--pause", type=float, default=0.5)
    s.add_argument("--per-connection", type=int, default=5)
    s.add_argument("--port", type=int, default=443)
    s.add_argument("--cacert", required=True)
    s.add_argument("--path", default="/")
    s.add_argument("--stop-file", help="stop early once this file exists")
    s = sub.add_parser("metric")
    s.add_argument("--url", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--label", action="append", default=[])
    s = sub.add_parser("der-sha256")
    s.add_argument("pem")
    args = p.parse_args()
    try:
        if args.cmd == "h3":
            cmd_h3(args)
        elif args.cmd == "refused":
            cmd_refused(args)
        elif args.cmd == "load":
            cmd_load(args)
        elif args.cmd == "metric":
            cmd_metric(args)
        else:
            print(der_sha256(args.pem))
    except Fail as e:
        print(f"FAIL: {e}", file=sys.stderr)
        sys.exit(1)
    except (subprocess.SubprocessError, OSError) as e:
        print(f"FAIL: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
