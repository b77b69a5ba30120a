//! End to end: the h3-ingress binary in front of a real Debian nginx (the TCP ingress), judged
//! by an independent HTTP/3 client (aioquic) and by our own `check`.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::h3client::{exit, H3Client};
use support::net::{
    free_udp_port, udp_port_bound, ClosedPort, Family, HeadersThenStall, StalledUpstream,
    STALL_BODY_BYTES,
};
use support::proxy::{sample, ProxyProcess};
use support::{sha256_of, NginxFixture, NginxOptions, TestPki};

/// nginx plus the proxy in front of it, sharing certificates as in production.
struct Setup {
    pki: Arc<TestPki>,
    nginx: NginxFixture,
    proxy: ProxyProcess,
}

fn base_config(pki: &TestPki, udp_port: u16, upstream_port: u16) -> Value {
    let hosts: Vec<Value> = ["a.test", "b.test"]
        .iter()
        .map(|h| {
            let leaf = pki.leaf(h);
            json!({
                "name": h,
                "certFile": leaf.cert_path.display().to_string(),
                "keyFile": leaf.key_path.display().to_string(),
            })
        })
        .collect();
    json!({
        "port": udp_port,
        "addresses": {"ipv4": "127.0.0.1", "ipv6": "::1"},
        "upstream": {"address": format!("127.0.0.1:{upstream_port}")},
        "hosts": hosts,
    })
}

/// The UDP port: nginx's TCP port number when free (as on a real node: TCP 443 for the
/// ingress, UDP 443 for us), so `check --compare-h2` compares the two directly.
fn udp_port_for(nginx: &NginxFixture) -> u16 {
    let p = nginx.port();
    if !udp_port_bound(Family::V4, p) && !udp_port_bound(Family::V6, p) {
        p
    } else {
        free_udp_port()
    }
}

impl Setup {
    fn start() -> Setup {
        Self::start_with(NginxOptions::default(), |c| c)
    }

    fn start_with(opts: NginxOptions, edit: impl FnOnce(Value) -> Value) -> Setup {
        Self::start_proxy(opts, edit, ProxyProcess::start)
    }

    fn start_proxy(
        mut opts: NginxOptions,
        edit: impl FnOnce(Value) -> Value,
        start: fn(Value) -> support::error::Result<ProxyProcess>,
    ) -> Setup {
        let pki = Arc::new(TestPki::generate().expect("test PKI"));
        opts.pki = Some(pki.clone());
        let nginx = NginxFixture::start(opts).expect("nginx starts");
        let port = udp_port_for(&nginx);
        let config = edit(base_config(&pki, port, nginx.port()));
        let proxy = start(config).expect("proxy starts");
        Setup { pki, nginx, proxy }
    }

    fn resolve(&self, host: &str, family: Family) -> String {
        format!("{host}:{}:{}", self.proxy.port, family.loopback_literal())
    }

    fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.proxy.port)
    }

    fn h3(&self, host: &str, path: &str, family: Family) -> H3Client {
        H3Client::new(self.url(host, path))
            .resolve(self.resolve(host, family))
            .cacert(&self.pki.ca_cert_path)
    }
}

/// nginx with a rate-limited copy of /5m.bin, so a download stays in flight for ~2.5 s.
fn slow_download_nginx() -> NginxOptions {
    NginxOptions {
        extra_server: "location = /slow/5m.bin { rewrite ^ /5m.bin break; limit_rate 2m; }".into(),
        ..Default::default()
    }
}

/// Waits until the proxy has an open QUIC connection (the client's Python start-up is slow).
fn wait_for_active_connection(proxy: &ProxyProcess) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while sample(&proxy.metrics(), "h3_ingress_active_connections", &[]) < 1.0 {
        assert!(Instant::now() < deadline, "no connection arrived");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn entries_with_uri(nginx: &NginxFixture, needle: &str) -> Vec<Value> {
    nginx
        .access_log_entries()
        .into_iter()
        .filter(|e| {
            e["uri"].as_str().unwrap_or("").contains(needle)
                || e["request_uri"].as_str().unwrap_or("").contains(needle)
        })
        .collect()
}

#[test]
fn downloads_and_uploads_match_nginx_over_both_families_and_both_clients() {
    let s = Setup::start();
    let five = s.nginx.content_sha256("/5m.bin").to_string();
    let upload = s.nginx.dir().join("upload-20m.bin");
    std::fs::write(
        &upload,
        support::nginx::deterministic_bytes("upload", 20 << 20),
    )
    .unwrap();
    let upload_sha = sha256_of(&upload);

    for family in Family::BOTH {
        // Independent client: aioquic.
        let run = s.h3("a.test", "/5m.bin", family).run().unwrap();
        assert_eq!(run.exit_code, exit::OK, "{:#}", run.json);
        assert_eq!(run.status(0), Some(200));
        assert_eq!(run.request(0)["body_length"], 5 << 20);
        assert_eq!(
            run.request(0)["body_sha256"],
            five.as_str(),
            "5 MiB over {family:?}"
        );

        let name = format!("up-{family:?}.bin");
        let run = s
            .h3("b.test", &format!("/upload/{name}"), family)
            .method("PUT")
            .upload(&upload)
            .run()
            .unwrap();
        assert_eq!(run.exit_code, exit::OK, "{:#}", run.json);
        let status = run.status(0).unwrap();
        assert!(status == 201 || status == 204, "PUT status {status}");
        assert_eq!(
            sha256_of(s.nginx.uploaded_path("b.test", &name)),
            upload_sha
        );
    }

    // Our own client, comparing HTTP/3 through the proxy with HTTP/2 straight from nginx.
    for family in Family::BOTH {
        let out = std::process::Command::new(support::proxy::binary())
            .args([
                "check",
                &s.url("a.test", "/5m.bin"),
                "--resolve",
                &s.resolve("a.test", family),
                "--cacert",
                &s.pki.ca_cert_path.display().to_string(),
                "--json",
            ])
            .args(if s.proxy.port == s.nginx.port() {
                &["--compare-h2"][..]
            } else {
                &[][..]
            })
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert!(out.status.success(), "{report:#}");
        assert_eq!(report["h3"]["body_sha256"], five.as_str());
        if s.proxy.port == s.nginx.port() {
            assert_eq!(report["bodies_match"], true, "{report:#}");
        }
    }
    // nginx saw the proxied requests over TLS with the right SNI.
    let gets = entries_with_uri(&s.nginx, "/5m.bin");
    assert!(gets.len() >= 4, "{gets:#?}");
    assert!(
        gets.iter().all(|e| e["ssl_server_name"] == "a.test"),
        "{gets:#?}"
    );
}

#[test]
fn each_host_gets_its_own_certificate_unknown_sni_fails_unknown_authority_gets_421() {
    let s = Setup::start();
    for family in Family::BOTH {
        for host in ["a.test", "b.test"] {
            let run = s.h3(host, "/whoami", family).run().unwrap();
            assert_eq!(run.exit_code, exit::OK, "{:#}", run.json);
            assert_eq!(
                run.connection()["server_cert"]["sha256"],
                s.pki.leaf(host).der_sha256.as_str(),
                "{host} over {family:?}"
            );
            assert_eq!(run.status(0), Some(200));
        }
        let run = s.h3("c.test", "/", family).run().unwrap();
        assert_eq!(run.exit_code, exit::HANDSHAKE_FAILED, "{:#}", run.json);
    }
    assert!(s
        .proxy
        .log()
        .contains("SNI \"c.test\" is not a configured host"));

    // SNI a.test, but :authority names an unconfigured host or another certificate's host.
    let reqs = json!([
        {"name": "unknown", "raw_headers": [[":method","GET"],[":scheme","https"],[":authority","c.test"],[":path","/421-unknown"]]},
        {"name": "other-cert", "raw_headers": [[":method","GET"],[":scheme","https"],[":authority","b.test"],[":path","/421-other"]]},
        {"name": "ok", "path": "/whoami"}
    ]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(421), "{:#}", run.json);
    assert_eq!(run.status(1), Some(421), "{:#}", run.json);
    assert_eq!(run.status(2), Some(200), "{:#}", run.json);
    std::thread::sleep(Duration::from_millis(300));
    assert!(entries_with_uri(&s.nginx, "/421-").is_empty());

    let m = s.proxy.metrics();
    assert_eq!(
        sample(
            &m,
            "h3_ingress_handshakes_total",
            &[("result", "unknown_sni")]
        ),
        2.0
    );
    assert_eq!(
        sample(&m, "h3_ingress_handshakes_total", &[("result", "failed")]),
        0.0
    );
}

#[test]
fn forwarding_headers_and_cookie_crumbs_reach_nginx() {
    let s = Setup::start();
    let reqs = json!([{
        "name": "echo",
        "path": "/echo-headers",
        "headers": [["cookie", "a=1"], ["cookie", "b=2"], ["x-forwarded-for", "198.51.100.9"]],
        "output": "-"
    }]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(200), "{:#}", run.json);
    let body = run.request(0)["body"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let seen = support::nginx::parse_echo(&body);
    // Replace, the default: the client's own X-Forwarded-For does not reach the ingress.
    assert_eq!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("127.0.0.1"),
        "{body}"
    );
    assert_eq!(
        seen.get("x-real-ip").map(String::as_str),
        Some("127.0.0.1"),
        "{body}"
    );
    assert_eq!(
        seen.get("x-forwarded-proto").map(String::as_str),
        Some("https"),
        "{body}"
    );
    assert_eq!(
        seen.get("via").map(String::as_str),
        Some("3 h3-ingress"),
        "{body}"
    );
    assert_eq!(
        seen.get("cookie").map(String::as_str),
        Some("a=1; b=2"),
        "{body}"
    );
    assert_eq!(
        seen.get("forwarded").map(String::as_str),
        Some(format!("for=127.0.0.1;proto=https;host=\"a.test:{}\"", s.proxy.port).as_str()),
        "{body}"
    );

    // An IPv6 client appears as itself, bracketed and quoted in Forwarded.
    let run = s
        .h3("a.test", "/", Family::V6)
        .requests(&reqs)
        .run()
        .unwrap();
    let body = run.request(0)["body"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let seen = support::nginx::parse_echo(&body);
    assert_eq!(
        seen.get("x-forwarded-for").map(String::as_str),
        Some("::1"),
        "{body}"
    );
    assert!(seen["forwarded"].starts_with("for=\"[::1]\""), "{body}");

    // The h3 response advertises us.
    let alt = run.request(0)["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "alt-svc")
        .map(|h| h[1].as_str().unwrap().to_string());
    assert_eq!(alt, Some(format!("h3=\":{}\"; ma=86400", s.proxy.port)));
}

/// Malformed requests as (name, raw header list, body): missing or unknown pseudo-headers,
/// connection-specific fields, forbidden bytes, a `host` naming another host, and a body
/// shorter or longer than its Content-Length. Paths under `/m-` must never reach nginx.
fn malformed_cases(authority: &str) -> Vec<(&'static str, Value, Option<&'static str>)> {
    let with = |path: &str, name: &str, value: &str| -> Value {
        json!([
            [":method", "GET"],
            [":scheme", "https"],
            [":authority", authority],
            [":path", path],
            [name, value]
        ])
    };
    let without = |skip: &str, path: &str| -> Value {
        let all = [
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "a.test"),
            (":path", path),
        ];
        let kept = all.iter().filter(|(n, _)| *n != skip);
        Value::Array(kept.map(|(n, v)| json!([n, v])).collect())
    };
    vec![
        ("uppercase-name", with("/m-upper", "X-Upper", "1"), None),
        ("missing-path", without(":path", ""), None),
        ("missing-method", without(":method", "/m-nomethod"), None),
        ("missing-scheme", without(":scheme", "/m-noscheme"), None),
        ("unknown-pseudo", with("/m-pseudo", ":bogus", "1"), None),
        (
            "connection",
            with("/m-connection", "connection", "keep-alive"),
            None,
        ),
        (
            "keep-alive",
            with("/m-keepalive", "keep-alive", "timeout=5"),
            None,
        ),
        (
            "proxy-connection",
            with("/m-proxyconn", "proxy-connection", "close"),
            None,
        ),
        (
            "transfer-encoding",
            with("/m-te-chunked", "transfer-encoding", "chunked"),
            None,
        ),
        ("upgrade", with("/m-upgrade", "upgrade", "websocket"), None),
        ("te-gzip", with("/m-tegzip", "te", "gzip"), None),
        ("crlf-value", with("/m-crlf", "x-a", "1\r\nx-b: 2"), None),
        ("nul-value", with("/m-nul", "x-a", "1\u{0}2"), None),
        ("host-mismatch", with("/m-host", "host", "b.test"), None),
        (
            "content-length-short",
            with("/upload/m-cl-short", "content-length", "10"),
            Some("abc"),
        ),
        (
            "content-length-long",
            with("/upload/m-cl-long", "content-length", "2"),
            Some("abcdef"),
        ),
    ]
}

/// Each malformed case rides on one connection with a good request after it; the bad one
/// fails alone and never reaches nginx.
#[test]
fn malformed_requests_fail_their_stream_only_and_never_reach_nginx() {
    let mut s = Setup::start();
    let cases = malformed_cases(&format!("a.test:{}", s.proxy.port));
    for (name, headers, body) in &cases {
        let mut bad = json!({"name": name, "raw_headers": headers});
        if let Some(b) = body {
            bad["method"] = json!("PUT");
            bad["body"] = json!(b);
            let mut h = headers.as_array().unwrap().clone();
            h[0] = json!([":method", "PUT"]);
            bad["raw_headers"] = Value::Array(h);
        }
        let reqs = json!([bad, {"name": "good", "path": "/whoami"}]);
        let run = s
            .h3("a.test", "/", Family::V4)
            .requests(&reqs)
            .run()
            .unwrap();
        assert_eq!(
            run.exit_code,
            exit::OK,
            "{name}: the connection must survive: {:#}",
            run.json
        );
        let r = run.request(0);
        let rejected = r["status"] == 400 || r["reset"]["error_name"] == "H3_MESSAGE_ERROR";
        assert!(
            rejected,
            "{name}: expected 400 or H3_MESSAGE_ERROR, got {r:#}"
        );
        assert_eq!(
            run.status(1),
            Some(200),
            "{name}: the good stream failed: {:#}",
            run.json
        );
    }
    std::thread::sleep(Duration::from_millis(500));
    let leaked = entries_with_uri(&s.nginx, "/m-");
    assert!(
        leaked.is_empty(),
        "malformed requests reached nginx: {leaked:#?}"
    );
    let good = entries_with_uri(&s.nginx, "/whoami");
    assert_eq!(good.len(), cases.len());
    assert!(s.proxy.still_running());
    let m = s.proxy.metrics();
    assert!(
        sample(&m, "h3_ingress_rejected_requests_total", &[]) >= cases.len() as f64,
        "{m}"
    );
}

#[test]
fn oversized_field_section_is_refused_with_431() {
    let s = Setup::start();
    // 20 fields of 4 KiB: more than the advertised 64 KiB field section.
    let big: Vec<Value> = (0..20)
        .map(|i| json!([format!("x-big-{i}"), "x".repeat(4096)]))
        .collect();
    let reqs = json!([
        {"name": "big", "path": "/m-big", "headers": big},
        {"name": "good", "path": "/whoami"}
    ]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    assert_eq!(run.exit_code, exit::OK, "{:#}", run.json);
    let r = run.request(0);
    assert!(r["status"] == 431 || !r["reset"].is_null(), "{r:#}");
    assert_eq!(run.status(1), Some(200));
    assert!(entries_with_uri(&s.nginx, "/m-big").is_empty());
}

#[test]
fn upstream_down_is_502_within_a_second_and_slow_upstream_is_504() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let closed = ClosedPort::new().unwrap();
    let proxy = ProxyProcess::start(base_config(&pki, free_udp_port(), closed.port())).unwrap();
    let url = format!("https://a.test:{}/", proxy.port);
    let started = Instant::now();
    let run = H3Client::new(&url)
        .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
        .cacert(&pki.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(502), "{:#}", run.json);
    let ms = run.request(0)["total_ms"].as_f64().unwrap();
    assert!(ms < 1000.0, "502 took {ms} ms");
    assert!(started.elapsed() < Duration::from_secs(10));
    let m = proxy.metrics();
    assert_eq!(
        sample(
            &m,
            "h3_ingress_upstream_errors_total",
            &[("kind", "connect")]
        ),
        1.0,
        "{m}"
    );
    drop(proxy);

    // A TCP ingress that accepts and never answers: plain HTTP, 1 s response timeout.
    let stalled = StalledUpstream::start().unwrap();
    let mut cfg = base_config(&pki, free_udp_port(), stalled.port());
    cfg["upstream"]["tls"] = json!(false);
    cfg["upstream"]["verify"] = json!("servedCertificate");
    cfg["upstream"]["responseTimeoutSeconds"] = json!(1);
    let proxy = ProxyProcess::start(cfg).unwrap();
    let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
        .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
        .cacert(&pki.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(504), "{:#}", run.json);
    let ms = run.request(0)["total_ms"].as_f64().unwrap();
    assert!((900.0..5000.0).contains(&ms), "504 after {ms} ms");
    assert!(stalled.accepted() >= 1);

    // Same with TLS: the handshake itself stalls; the connect timeout gives 504 too.
    let mut cfg = base_config(&pki, free_udp_port(), stalled.port());
    cfg["upstream"]["connectTimeoutSeconds"] = json!(1);
    let proxy = ProxyProcess::start(cfg).unwrap();
    let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
        .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
        .cacert(&pki.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(504), "{:#}", run.json);
}

#[test]
fn upstream_presenting_another_certificate_is_refused_in_served_certificate_mode() {
    // nginx serves a.test with a certificate from a different PKI than the proxy's.
    let theirs = Arc::new(TestPki::generate().unwrap());
    let ours = TestPki::generate().unwrap();
    let nginx = NginxFixture::start(NginxOptions {
        pki: Some(theirs),
        ..Default::default()
    })
    .unwrap();
    let proxy = ProxyProcess::start(base_config(&ours, free_udp_port(), nginx.port())).unwrap();
    let run = H3Client::new(format!("https://a.test:{}/whoami", proxy.port))
        .resolve(format!("a.test:{}:127.0.0.1", proxy.port))
        .cacert(&ours.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(run.status(0), Some(502), "{:#}", run.json);
    let m = proxy.metrics();
    assert_eq!(
        sample(&m, "h3_ingress_upstream_errors_total", &[("kind", "tls")]),
        1.0,
        "{m}"
    );
    assert!(
        proxy.log().contains("different certificate"),
        "{}",
        proxy.log()
    );
}

#[test]
fn sigterm_during_a_download_lets_it_finish() {
    let docroot_note = "limit_rate keeps the 5 MiB download running for about 2.5 s";
    let opts = slow_download_nginx();
    let mut s = Setup::start_with(opts, |c| c);
    let five = s.nginx.content_sha256("/5m.bin").to_string();
    let client = s.h3("a.test", "/slow/5m.bin", Family::V4);
    let started = Instant::now();
    let handle = std::thread::spawn(move || client.run().unwrap());
    wait_for_active_connection(&s.proxy);
    std::thread::sleep(Duration::from_millis(300));
    s.proxy.signal(libc::SIGTERM);
    // New connections are refused while the old one drains.
    std::thread::sleep(Duration::from_millis(200));
    let late = s
        .h3("a.test", "/whoami", Family::V4)
        .arg("--connect-timeout")
        .arg("2")
        .run()
        .unwrap();
    assert_ne!(
        late.exit_code,
        exit::OK,
        "a new connection was accepted during the drain"
    );
    let run = handle.join().unwrap();
    assert_eq!(run.exit_code, exit::OK, "{docroot_note}: {:#}", run.json);
    assert_eq!(run.status(0), Some(200));
    assert_eq!(run.request(0)["body_sha256"], five.as_str());
    assert!(
        started.elapsed() > Duration::from_millis(1500),
        "{docroot_note}"
    );
    let exit_status = s
        .proxy
        .wait_exit(Duration::from_secs(10))
        .expect("proxy exits after the drain");
    assert!(exit_status.success(), "{exit_status}");
    assert!(s.proxy.log().contains("GOAWAY"), "{}", s.proxy.log());
}

/// Also the log a user sees without RUST_LOG: the startup, each reload and the shutdown at
/// INFO, nothing from the noisy dependencies, no debug lines.
#[test]
fn sighup_swaps_certificates_live_and_refuses_socket_changes_loudly() {
    let opts = slow_download_nginx();
    let mut s = Setup::start_proxy(opts, |c| c, ProxyProcess::start_with_default_log);
    let five = s.nginx.content_sha256("/5m.bin").to_string();
    let before = s.pki.leaf("a.test").der_sha256.clone();

    // A download on a connection opened before the swap.
    let client = s.h3("a.test", "/slow/5m.bin", Family::V4);
    let handle = std::thread::spawn(move || client.run().unwrap());
    wait_for_active_connection(&s.proxy);
    std::thread::sleep(Duration::from_millis(300));

    // New certificate for a.test (same CA), a.test only, and a port change.
    // The TCP ingress rotates too (servedCertificate mode requires the same certificate).
    let fresh = s
        .pki
        .issue("a.test-rotated", &["a.test"], support::Validity::current())
        .unwrap();
    std::fs::copy(&fresh.cert_path, s.nginx.cert_path("a.test")).unwrap();
    std::fs::copy(&fresh.key_path, s.nginx.key_path("a.test")).unwrap();
    s.nginx.reload();
    let mut cfg = base_config(&s.pki, s.proxy.port, s.nginx.port());
    cfg["hosts"] = json!([{
        "name": "a.test",
        "certFile": fresh.cert_path.display().to_string(),
        "keyFile": fresh.key_path.display().to_string(),
    }]);
    cfg["port"] = json!(s.proxy.port.wrapping_add(1));
    s.proxy.rewrite_config(cfg);
    s.proxy.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(500));

    let run = s.h3("a.test", "/whoami", Family::V4).run().unwrap();
    assert_eq!(run.status(0), Some(200), "{:#}", run.json);
    assert_eq!(
        run.connection()["server_cert"]["sha256"],
        fresh.der_sha256.as_str()
    );
    assert_ne!(fresh.der_sha256, before);
    // b.test was removed: its SNI now fails.
    let run = s.h3("b.test", "/whoami", Family::V4).run().unwrap();
    assert_eq!(run.exit_code, exit::HANDSHAKE_FAILED, "{:#}", run.json);

    let old = handle.join().unwrap();
    assert_eq!(old.exit_code, exit::OK, "{:#}", old.json);
    assert_eq!(old.connection()["server_cert"]["sha256"], before.as_str());
    assert_eq!(
        old.request(0)["body_sha256"],
        five.as_str(),
        "the open connection survived the swap"
    );

    let log = s.proxy.log();
    assert!(
        log.contains("need new sockets and were NOT applied"),
        "{log}"
    );
    let status = s.proxy.status();
    assert_eq!(status["port"], s.proxy.port, "{status:#}");
    assert!(
        status["restartRequired"][0]
            .as_str()
            .unwrap()
            .starts_with("port "),
        "{status:#}"
    );
    let m = s.proxy.metrics();
    assert_eq!(
        sample(
            &m,
            "h3_ingress_config_reloads_total",
            &[("result", "restart_required")]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            "h3_ingress_config_reloads_total",
            &[("result", "applied")]
        ),
        1.0
    );

    // A broken file is refused and the running configuration stays.
    std::fs::write(s.proxy.config_path(), "upstream: {address: nope}\n").unwrap();
    s.proxy.signal(libc::SIGHUP);
    std::thread::sleep(Duration::from_millis(300));
    assert!(s
        .proxy
        .log()
        .contains("upstream.address: \"nope\" is not host:port"));
    let run = s.h3("a.test", "/whoami", Family::V4).run().unwrap();
    assert_eq!(run.status(0), Some(200));
    s.proxy.signal(libc::SIGTERM);
    s.proxy.wait_exit(Duration::from_secs(10)).expect("exits");
    assert_default_log(&s.proxy.log());
}

/// `text` without ANSI colour sequences (ESC [ ... m), which the log carries.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            chars.by_ref().find(|c| *c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

/// What the default log filter shows of a run with two reloads (one applied, one invalid).
fn assert_default_log(log: &str) {
    let log = strip_ansi(log);
    let count = |line: &str| log.lines().filter(|l| l.contains(line)).count();
    for (line, times) in [
        (
            " INFO h3_ingress::proxy::quic::endpoint: UDP socket bound",
            2,
        ),
        (
            " INFO h3_ingress::proxy::quic::endpoint: QUIC endpoint serving",
            2,
        ),
        (
            " INFO h3_ingress::proxy::server: metrics and health endpoint",
            1,
        ),
        ("SIGHUP: reloading configuration", 2),
        (
            " INFO h3_ingress::proxy::server: configuration applied live",
            1,
        ),
        (
            "configuration update rejected, still serving the previous one",
            1,
        ),
        ("SIGTERM: shutting down", 1),
        (" INFO h3_ingress::proxy::server: shut down", 1),
    ] {
        assert_eq!(count(line), times, "{line:?} in:\n{log}");
    }
    for quiet in [
        " DEBUG ",
        " TRACE ",
        " INFO quinn",
        " INFO h3:",
        " INFO rustls",
        " INFO hyper",
    ] {
        assert_eq!(count(quiet), 0, "{quiet:?} in:\n{log}");
    }
}

#[test]
fn proxy_protocol_v2_carries_the_client_address() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let pp_port = support::free_tcp_port();
    let leaf = pki.leaf("a.test");
    let extra = format!(
        "server {{ listen 127.0.0.1:{pp_port} ssl proxy_protocol; server_name a.test; \
         ssl_certificate {}; ssl_certificate_key {}; \
         location / {{ return 200 \"pp=$proxy_protocol_addr xff=$http_x_forwarded_for\"; }} }}",
        leaf.cert_path.display(),
        leaf.key_path.display()
    );
    let nginx = NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        extra_http: extra,
        ..Default::default()
    })
    .unwrap();
    let mut cfg = base_config(&pki, free_udp_port(), pp_port);
    cfg["upstream"]["proxyProtocol"] = json!(true);
    let proxy = ProxyProcess::start(cfg).unwrap();
    for (family, want) in [(Family::V4, "pp=127.0.0.1"), (Family::V6, "pp=::1")] {
        let reqs = json!([{"name": "pp", "path": "/", "output": "-"}]);
        let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
            .resolve(format!(
                "a.test:{}:{}",
                proxy.port,
                family.loopback_literal()
            ))
            .cacert(&pki.ca_cert_path)
            .requests(&reqs)
            .run()
            .unwrap();
        assert_eq!(run.status(0), Some(200), "{:#}", run.json);
        let body = run.request(0)["body"].as_str().unwrap_or_default();
        assert!(body.starts_with(want), "{family:?}: {body}");
    }
    drop(nginx);
}

#[test]
fn metrics_pass_promtool_and_count_exactly() {
    let s = Setup::start();
    let before = s.proxy.metrics();
    let n = 7;
    let reqs = Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("r{i}"), "path": "/whoami"}))
            .collect(),
    );
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    assert!((0..n).all(|i| run.status(i) == Some(200)), "{:#}", run.json);
    let run = s.h3("b.test", "/nope-404", Family::V6).run().unwrap();
    assert_eq!(run.status(0), Some(404));
    let after = s.proxy.metrics();
    let key = [
        ("host", "a.test"),
        ("status_class", "2xx"),
        ("family", "ipv4"),
    ];
    assert_eq!(
        sample(&after, "h3_ingress_requests_total", &key)
            - sample(&before, "h3_ingress_requests_total", &key),
        n as f64
    );
    assert_eq!(
        sample(
            &after,
            "h3_ingress_requests_total",
            &[
                ("host", "b.test"),
                ("status_class", "4xx"),
                ("family", "ipv6")
            ]
        ),
        1.0
    );

    // /hosts counts the same requests, in total and over the last minutes.
    let status = s.proxy.hosts();
    let a = status
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "a.test")
        .unwrap()
        .clone();
    assert_eq!(a["requests"], n as u64, "{status:#}");
    assert_eq!(a["requestsLast5m"], n as u64, "{status:#}");

    // promtool, the real Prometheus linter, on a real scrape.
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed by scripts/setup.sh");
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(after.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // UDP counters are the kernel's own values.
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap();
    let line = snmp
        .lines()
        .filter(|l| l.starts_with("Udp:"))
        .nth(1)
        .unwrap();
    let header = snmp.lines().find(|l| l.starts_with("Udp:")).unwrap();
    let idx = header
        .split_whitespace()
        .position(|h| h == "RcvbufErrors")
        .unwrap();
    let kernel_before: f64 = line.split_whitespace().nth(idx).unwrap().parse().unwrap();
    let scraped = sample(
        &s.proxy.metrics(),
        "h3_ingress_udp_host_receive_buffer_errors_total",
        &[("family", "ipv4")],
    );
    let snmp = std::fs::read_to_string("/proc/net/snmp").unwrap();
    let line = snmp
        .lines()
        .filter(|l| l.starts_with("Udp:"))
        .nth(1)
        .unwrap();
    let kernel_after: f64 = line.split_whitespace().nth(idx).unwrap().parse().unwrap();
    assert!(
        kernel_before <= scraped && scraped <= kernel_after,
        "{kernel_before} <= {scraped} <= {kernel_after}"
    );
    let status = s.proxy.status();
    for sock in status["sockets"].as_array().unwrap() {
        let fam = sock["family"].as_str().unwrap();
        let m = s.proxy.metrics();
        assert_eq!(
            sample(&m, "h3_ingress_udp_socket_drops_total", &[("family", fam)]),
            sock["drops"].as_f64().unwrap()
        );
    }
}

/// Inodes of the UDP sockets bound to `port` in /proc/net/udp or udp6.
fn udp_inodes(file: &str, port: u16) -> Vec<u64> {
    let text = std::fs::read_to_string(file).unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            (local_port == port).then(|| f.get(9)?.parse().ok())?
        })
        .collect()
}

fn getsockopt_int(fd: i32, level: i32, name: i32) -> i32 {
    let mut v: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: fd is a descriptor we own; v/len are valid for the call.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    assert_eq!(
        rc,
        0,
        "getsockopt({level}, {name}): {}",
        std::io::Error::last_os_error()
    );
    v
}

/// Duplicates the proxy's socket with `inode` into this process (pidfd_getfd), so the options
/// are read from the live socket the running proxy uses, not from a copy of its code.
fn grab_socket(pid: u32, inode: u64) -> i32 {
    let link = format!("socket:[{inode}]");
    let fd_dir = format!("/proc/{pid}/fd");
    let target_fd: i32 = std::fs::read_dir(&fd_dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy() == link)
                .unwrap_or(false)
        })
        .and_then(|e| e.file_name().to_str()?.parse().ok())
        .unwrap_or_else(|| panic!("no fd for {link} in {fd_dir}"));
    // SAFETY: plain syscalls with integer arguments; results are checked.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) as i32;
        assert!(
            pidfd >= 0,
            "pidfd_open: {}",
            std::io::Error::last_os_error()
        );
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, target_fd, 0) as i32;
        assert!(fd >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        libc::close(pidfd);
        fd
    }
}

#[test]
fn live_sockets_are_split_v6only_with_df_and_export_what_the_kernel_granted() {
    let s = Setup::start();
    let port = s.proxy.port;
    let v4 = udp_inodes("/proc/net/udp", port);
    let v6 = udp_inodes("/proc/net/udp6", port);
    assert_eq!(v4.len(), 1, "one IPv4 socket on {port}");
    assert_eq!(v6.len(), 1, "one IPv6 socket on {port}");
    let m = s.proxy.metrics();

    let fd4 = grab_socket(s.proxy.pid(), v4[0]);
    let df = getsockopt_int(fd4, libc::IPPROTO_IP, libc::IP_MTU_DISCOVER);
    assert!(
        df == libc::IP_PMTUDISC_DO || df == libc::IP_PMTUDISC_PROBE,
        "IPv4 DF off: {df}"
    );
    let rcv4 = getsockopt_int(fd4, libc::SOL_SOCKET, libc::SO_RCVBUF);
    let snd4 = getsockopt_int(fd4, libc::SOL_SOCKET, libc::SO_SNDBUF);
    assert_eq!(
        sample(
            &m,
            "h3_ingress_udp_socket_receive_buffer_bytes",
            &[("family", "ipv4")]
        ),
        rcv4 as f64
    );
    assert_eq!(
        sample(
            &m,
            "h3_ingress_udp_socket_send_buffer_bytes",
            &[("family", "ipv4")]
        ),
        snd4 as f64
    );

    let fd6 = grab_socket(s.proxy.pid(), v6[0]);
    assert_eq!(
        getsockopt_int(fd6, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY),
        1,
        "v6only"
    );
    assert_eq!(
        getsockopt_int(fd6, libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG),
        1,
        "IPV6_DONTFRAG"
    );
    let pmtu6 = getsockopt_int(fd6, libc::IPPROTO_IPV6, libc::IPV6_MTU_DISCOVER);
    assert!(
        pmtu6 == libc::IPV6_PMTUDISC_DO || pmtu6 == libc::IPV6_PMTUDISC_PROBE,
        "{pmtu6}"
    );
    let rcv6 = getsockopt_int(fd6, libc::SOL_SOCKET, libc::SO_RCVBUF);
    assert_eq!(
        sample(
            &m,
            "h3_ingress_udp_socket_receive_buffer_bytes",
            &[("family", "ipv6")]
        ),
        rcv6 as f64
    );
    // SAFETY: closing our duplicates only.
    unsafe {
        libc::close(fd4);
        libc::close(fd6);
    }

    // The requested size is exported too, and the clamp (if any) is both logged and reported.
    let requested = sample(
        &m,
        "h3_ingress_udp_socket_receive_buffer_requested_bytes",
        &[("family", "ipv4")],
    );
    assert_eq!(requested, 4_194_304.0);
    let clamped = (rcv4 as f64) < 2.0 * requested;
    let status = s.proxy.status();
    assert_eq!(status["sockets"][0]["clamped"], clamped, "{status:#}");
    assert_eq!(s.proxy.log().contains("net.core.rmem_max=7500000"), clamped);
}

#[test]
fn a_cancelled_stream_drops_the_upstream_request() {
    let s = Setup::start_with(slow_download_nginx(), |c| c);
    let reqs = json!([
        {"name": "cancelled", "path": "/slow/5m.bin", "timeout": 0.8},
        {"name": "after", "path": "/whoami"}
    ]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    assert_eq!(run.request(0)["error"], "timeout", "{:#}", run.json);
    assert_eq!(run.status(1), Some(200), "{:#}", run.json);
    // nginx finishes (and logs) the request when its h2 stream is reset, long before the
    // 2.5 s the rate-limited body would take, and having sent only part of it.
    let entries = s.nginx.wait_for_access_log(Duration::from_secs(5), |es| {
        es.iter().any(|e| e["uri"] == "/slow/5m.bin")
    });
    let entry = entries.iter().find(|e| e["uri"] == "/slow/5m.bin").unwrap();
    let sent = entry["body_bytes_sent"].as_u64().unwrap();
    assert!(sent < 5 << 20, "nginx sent the whole body: {entry:#}");
    let took = entry["request_time"].as_f64().unwrap();
    assert!(
        took < 2.0,
        "upstream request was not dropped (nginx took {took} s): {entry:#}"
    );
}

#[test]
fn alt_svc_probe_reports_whether_the_tcp_ingress_advertises_us() {
    // nginx advertising our UDP port for its hosts...
    let pki = Arc::new(TestPki::generate().unwrap());
    let port = free_udp_port();
    let nginx = NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        alt_svc: Some(format!("h3=\":{port}\"; ma=86400")),
        ..Default::default()
    })
    .unwrap();
    let proxy = ProxyProcess::start(base_config(&pki, port, nginx.port())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let st = proxy.hosts();
        if st
            .as_array()
            .unwrap()
            .iter()
            .all(|h| !h["altSvcAdvertised"].is_null())
        {
            break st;
        }
        assert!(Instant::now() < deadline, "probe never ran: {st:#}");
        std::thread::sleep(Duration::from_millis(100));
    };
    for h in status.as_array().unwrap() {
        assert_eq!(h["altSvcAdvertised"], true, "{status:#}");
    }
    assert_eq!(
        sample(
            &proxy.metrics(),
            "h3_ingress_alt_svc_advertised",
            &[("host", "a.test")]
        ),
        1.0
    );
    drop(proxy);

    // ...and one that does not: status says so and how to fix it.
    let s = Setup::start();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = s.proxy.hosts();
        let h = &st[0];
        if h["altSvcAdvertised"] == false {
            assert!(
                h["altSvcMessage"]
                    .as_str()
                    .unwrap()
                    .contains("nginx.org/server-snippets"),
                "{st:#}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "probe never ran: {st:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.proxy.log().contains("does not send Alt-Svc"));
}

fn limit_count(proxy: &ProxyProcess, limit: &str) -> f64 {
    sample(
        &proxy.metrics(),
        "h3_ingress_limits_total",
        &[("limit", limit)],
    )
}

/// The response timeout counts from the end of the request body: a 2 MiB upload streamed
/// over 5 s (above the 64 KiB read-ahead, so nginx reads it as it arrives) with a 2 s
/// response timeout is answered by nginx, not with 504.
#[test]
fn an_upload_longer_than_the_response_timeout_gets_the_upstream_answer() {
    let s = Setup::start_with(NginxOptions::default(), |mut c| {
        c["upstream"]["responseTimeoutSeconds"] = json!(2);
        c
    });
    let size: u64 = 2 << 20;
    let reqs = json!([{
        "name": "slow-upload", "method": "PUT", "path": "/upload/slow.bin",
        "body_size": size, "body_seconds": 5, "timeout": 20
    }]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    let r = run.request(0);
    assert!(
        matches!(run.status(0), Some(201 | 204)),
        "nginx must answer the upload: {r:#}"
    );
    let took = r["total_ms"].as_f64().unwrap();
    assert!(
        took > 4500.0,
        "the upload must outlast the timeout: {took} ms"
    );
    let stored = std::fs::metadata(s.nginx.uploaded_path("a.test", "slow.bin")).unwrap();
    assert_eq!(stored.len(), size);
    assert_eq!(limit_count(&s.proxy, "response_timeout"), 0.0);
    let m = s.proxy.metrics();
    let timeouts = sample(
        &m,
        "h3_ingress_upstream_errors_total",
        &[("kind", "timeout")],
    );
    assert_eq!(timeouts, 0.0, "{m}");
}

/// A backend behind nginx sends its response head and 100 bytes, then stalls: after
/// `upstream.responseBodyIdleTimeoutSeconds` the client's stream is reset, the upstream
/// request dropped (nginx lets go of the backend), the limit counted, and the connection
/// keeps serving.
#[test]
fn a_response_body_that_stalls_is_reset_and_the_upstream_released() {
    let stall = HeadersThenStall::start().unwrap();
    let opts = NginxOptions {
        extra_server: format!(
            "location = /stall-headers {{ proxy_pass http://127.0.0.1:{}; proxy_buffering off; proxy_read_timeout 300s; }}",
            stall.port()
        ),
        ..Default::default()
    };
    let s = Setup::start_with(opts, |mut c| {
        c["upstream"]["responseBodyIdleTimeoutSeconds"] = json!(2);
        c
    });
    let reqs = json!([
        {"name": "stalled", "path": "/stall-headers", "timeout": 15},
        {"name": "after", "path": "/whoami"}
    ]);
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&reqs)
        .run()
        .unwrap();
    let reset_at = Instant::now();
    let r = run.request(0);
    assert_eq!(run.status(0), Some(200), "{r:#}");
    assert_eq!(r["body_length"].as_u64(), Some(STALL_BODY_BYTES), "{r:#}");
    assert_eq!(r["reset"]["error_name"], "H3_INTERNAL_ERROR", "{r:#}");
    let took = r["total_ms"].as_f64().unwrap();
    assert!(
        (1900.0..4500.0).contains(&took),
        "reset after {took} ms, want the 2 s idle timeout"
    );
    assert_eq!(run.status(1), Some(200), "{:#}", run.json);
    assert_eq!(stall.accepted(), 1);
    while stall.open() > 0 {
        assert!(
            reset_at.elapsed() < Duration::from_secs(2),
            "nginx still holds the stalled backend: the upstream request was not dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(limit_count(&s.proxy, "response_body_idle_timeout"), 1.0);
}

/// A stream whose header section never completes is refused after
/// `http.requestHeadersTimeoutSeconds`, counted from its opening, although the client keeps
/// its connection busy the whole time (PINGs every 0.3 s, a request every 0.5 s); the
/// connection and its other requests are unaffected.
#[test]
fn a_header_section_that_never_completes_is_refused_while_the_connection_is_busy() {
    let s = Setup::start_with(NginxOptions::default(), |mut c| {
        c["http"]["requestHeadersTimeoutSeconds"] = json!(2);
        c
    });
    let mut reqs = vec![json!({"name": "unfinished", "partial_headers": 200, "timeout": 10})];
    for i in 1..=9 {
        reqs.push(json!({"name": format!("busy-{i}"), "path": "/whoami", "delay": 0.5 * i as f64}));
    }
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&Value::Array(reqs))
        .arg("--parallel")
        .arg("--ping-interval")
        .arg("0.3")
        .run()
        .unwrap();
    assert_eq!(run.exit_code, exit::OK, "{:#}", run.json);
    let r = run.request(0);
    assert_eq!(r["reset"]["error_name"], "H3_REQUEST_REJECTED", "{r:#}");
    let took = r["total_ms"].as_f64().unwrap();
    assert!(
        (1900.0..4000.0).contains(&took),
        "refused after {took} ms, want the 2 s header timeout"
    );
    for i in 1..=9 {
        assert_eq!(run.status(i), Some(200), "{:#}", run.request(i));
    }
    assert_eq!(limit_count(&s.proxy, "request_headers_timeout"), 1.0);
}

/// nginx ends every HTTP/2 connection with GOAWAY after `keepalive_requests` (1000 by
/// default, 60 here): the requests the proxy had already sent on it past the GOAWAY's last
/// stream ID were never processed, and are sent again on a new connection instead of being
/// answered 502 (tests/access_log_cost.rs lost 4-30 of 4000 requests a round to this). 100
/// GETs at once on one QUIC connection: the first upstream connection takes 60, the second
/// the rest, so one more try is always enough here (as with nginx's 1000 and our lanes of
/// 100).
#[test]
fn requests_past_an_upstream_goaway_are_sent_again() {
    goaways_cost_no_request(60, None);
}

/// As above with `keepalive_requests 40`: 100 GETs at once need three upstream connections,
/// and a request sent past the first GOAWAY can be sent past the second one too.
#[test]
fn requests_past_two_upstream_goaways_are_sent_again() {
    goaways_cost_no_request(40, None);
}

/// As above, each GET's stream ended 50 ms after its HEADERS (a client whose FIN comes in a
/// later packet): the proxy has forwarded the request before it knows the body is empty.
#[test]
fn requests_past_an_upstream_goaway_are_sent_again_when_the_fin_comes_later() {
    goaways_cost_no_request(40, Some(0.05));
}

/// 100 GETs at once through nginx ending each HTTP/2 connection after `keepalive_requests`:
/// every one answered 200, none counted as an upstream error, each processed once.
fn goaways_cost_no_request(keepalive_requests: usize, fin_seconds: Option<f64>) {
    let opts = NginxOptions {
        extra_http: format!("keepalive_requests {keepalive_requests};"),
        ..Default::default()
    };
    let s = Setup::start_with(opts, |c| c);
    let reqs: Vec<Value> = (0..100)
        .map(|i| {
            let mut r = json!({"name": format!("r{i}"), "path": format!("/whoami?r={i}")});
            if let Some(f) = fin_seconds {
                r["fin_seconds"] = json!(f);
            }
            r
        })
        .collect();
    let run = s
        .h3("a.test", "/", Family::V4)
        .requests(&Value::Array(reqs))
        .arg("--parallel")
        .run()
        .unwrap();
    let failed: Vec<_> = (0..100)
        .filter(|i| run.status(*i) != Some(200))
        .map(|i| run.request(i).to_string())
        .collect();
    assert!(failed.is_empty(), "{} failed: {failed:#?}", failed.len());
    let m = s.proxy.metrics();
    for kind in ["protocol", "reset"] {
        let n = sample(&m, "h3_ingress_upstream_errors_total", &[("kind", kind)]);
        assert_eq!(n, 0.0, "{kind}");
    }
    let served = s.nginx.access_log_entries();
    let whoami = served
        .iter()
        .filter(|e| e["uri"].as_str().is_some_and(|u| u.starts_with("/whoami")));
    assert_eq!(whoami.count(), 100, "each request processed once");
}
