//! Proves the test harness itself against independent software before any data-plane
//! test relies on it: Debian's nginx, curl, openssl, Caddy (quic-go) and aioquic.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use support::caddy::{CaddyFixture, CaddyOptions};
use support::curl::Curl;
use support::h3client::{exit, H3Client};
use support::nginx::{deterministic_bytes, parse_echo};
use support::pki::civil_from_days;
use support::tls::probe;
use support::*;

const LOG_WAIT: Duration = Duration::from_secs(5);

fn openssl(args: &[&str]) -> (bool, String) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn calendar_conversion_for_certificate_dates() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(-1), (1969, 12, 31));
    assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    assert_eq!(civil_from_days(20_454), (2026, 1, 1));
}

#[test]
fn pki_leaves_have_own_keys_and_verify_with_openssl() {
    let pki = TestPki::generate().unwrap();
    let (a, b) = (pki.leaf("a.test"), pki.leaf("b.test"));
    assert_ne!(a.der_sha256, b.der_sha256);
    assert_ne!(a.key_pem, b.key_pem, "each vhost must have its own key");
    for leaf in [a, b] {
        let (ok, out) = openssl(&[
            "verify",
            "-CAfile",
            path_str(&pki.ca_cert_path),
            "-verify_hostname",
            &leaf.name,
            path_str(&leaf.cert_path),
        ]);
        assert!(ok, "openssl verify {}: {out}", leaf.name);
    }
    // a.test's certificate must not pass as b.test's.
    let (ok, _) = openssl(&[
        "verify",
        "-CAfile",
        path_str(&pki.ca_cert_path),
        "-verify_hostname",
        "b.test",
        path_str(&a.cert_path),
    ]);
    assert!(!ok, "a.test leaf verified for b.test");

    let expired = pki
        .issue("expired", &["a.test"], Validity::expired())
        .unwrap();
    let (ok, out) = openssl(&[
        "verify",
        "-CAfile",
        path_str(&pki.ca_cert_path),
        path_str(&expired.cert_path),
    ]);
    assert!(!ok && out.contains("expired"), "expired leaf: {out}");
}

#[test]
fn rsa_chain_is_three_levels_and_verifies_with_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let chain = RsaChain::generate(dir.path(), &["a.test"], RsaChainBits::default()).unwrap();
    let (ok, out) = openssl(&[
        "verify",
        "-CAfile",
        path_str(&chain.root_cert_path),
        "-untrusted",
        path_str(&chain.intermediate_cert_path),
        "-verify_hostname",
        "a.test",
        path_str(&chain.leaf_cert_path),
    ]);
    assert!(ok, "openssl verify of the RSA chain: {out}");
    // Without the intermediate the leaf must not verify: it really is three levels.
    let (ok, _) = openssl(&[
        "verify",
        "-CAfile",
        path_str(&chain.root_cert_path),
        path_str(&chain.leaf_cert_path),
    ]);
    assert!(!ok, "leaf verified without its intermediate");
    let (_, text) = openssl(&[
        "x509",
        "-noout",
        "-text",
        "-in",
        path_str(&chain.leaf_cert_path),
    ]);
    assert!(text.contains("Public-Key: (2048 bit)"), "{text}");
    assert!(text.contains("sha256WithRSAEncryption"), "{text}");
    let (_, root) = openssl(&[
        "x509",
        "-noout",
        "-text",
        "-in",
        path_str(&chain.root_cert_path),
    ]);
    assert!(root.contains("Public-Key: (4096 bit)"), "{root}");
    let pem = std::fs::read_to_string(&chain.chain_path).unwrap();
    assert_eq!(pem.matches("BEGIN CERTIFICATE").count(), 2);
    eprintln!(
        "RSA chain leaf+intermediate DER bytes: {}",
        chain.chain_der_len
    );
    assert!(chain.chain_der_len > 1500, "{}", chain.chain_der_len);
}

#[test]
fn nginx_serves_both_vhosts_over_h2_on_ipv4_and_ipv6_with_own_certs() {
    let ng = NginxFixture::start(NginxOptions::default()).unwrap();
    let want = ng.content_sha256("/1m.bin").to_string();
    assert_eq!(want, sha256_hex(&deterministic_bytes("/1m.bin", 1 << 20)));

    for host in ["a.test", "b.test"] {
        for family in Family::BOTH {
            let body = tempfile::NamedTempFile::new().unwrap();
            let r = Curl::new(ng.url(host, "/1m.bin"))
                .http2()
                .cacert(ng.ca_path())
                .resolve(ng.curl_resolve(host, family))
                .output(body.path())
                .run()
                .unwrap();
            assert_eq!(
                (r.exit_code, r.status),
                (0, 200),
                "{host} {family:?}: {}",
                r.stderr
            );
            assert_eq!(r.http_version, "2", "{host} {family:?}");
            assert_eq!(r.remote_ip(), family.loopback().to_string());
            assert_eq!(sha256_of(body.path()), want, "{host} {family:?}");
            assert_eq!(r.header("alt-svc"), None, "Alt-Svc is off by default");

            let who = Curl::new(ng.url(host, "/whoami"))
                .http2()
                .cacert(ng.ca_path())
                .resolve(ng.curl_resolve(host, family))
                .run()
                .unwrap();
            assert_eq!(who.body_text(), format!("{host}\n"));

            let tls = probe(ng.addr(family), host, Some("h2,http/1.1")).unwrap();
            assert_eq!(
                tls.leaf_der_sha256,
                ng.pki().leaf(host).der_sha256,
                "{host} {family:?} presented the wrong certificate:\n{}",
                tls.raw
            );
            assert_eq!(tls.alpn.as_deref(), Some("h2"));
        }
    }

    let entries = ng.wait_for_access_log(LOG_WAIT, |e| {
        e.iter().filter(|e| e["uri"] == "/1m.bin").count() == 4
    });
    for host in ["a.test", "b.test"] {
        for family in Family::BOTH {
            let hit = entries.iter().find(|e| {
                e["uri"] == "/1m.bin"
                    && e["server_name"] == host
                    && e["remote_addr"] == family.loopback().to_string()
            });
            let e =
                hit.unwrap_or_else(|| panic!("no log entry for {host} {family:?}: {entries:?}"));
            assert_eq!(e["status"], 200);
            assert_eq!(e["method"], "GET");
            assert_eq!(e["protocol"], "HTTP/2.0");
            assert_eq!(e["ssl_server_name"], host);
            assert_eq!(e["host"], host);
            assert_eq!(e["body_bytes_sent"], 1 << 20);
        }
    }
}

#[test]
fn nginx_echo_headers_and_json_log_show_forwarding_headers() {
    let ng = NginxFixture::start(NginxOptions::default()).unwrap();
    let r = Curl::new(ng.url("b.test", "/echo-headers?x=1"))
        .http2()
        .cacert(ng.ca_path())
        .resolve(ng.curl_resolve("b.test", Family::V6))
        .header("X-Forwarded-For: 192.0.2.7")
        .header("Forwarded: for=192.0.2.7;proto=https")
        .header("Via: 3 h3-ingress")
        .header("X-Forwarded-Proto: https")
        .header("Cookie: a=1")
        .header("Cookie: b=\"2\"")
        .header("User-Agent: selftest")
        .run()
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.stderr);
    let echo = parse_echo(&r.body_text());
    assert_eq!(echo["host"], "b.test");
    assert_eq!(echo["x-forwarded-for"], "192.0.2.7");
    assert_eq!(echo["forwarded"], "for=192.0.2.7;proto=https");
    assert_eq!(echo["via"], "3 h3-ingress");
    assert_eq!(echo["x-forwarded-proto"], "https");
    // HTTP/2 splits cookies into separate fields; nginx joins them back.
    assert_eq!(echo["cookie"], "a=1; b=\"2\"");
    assert_eq!(echo["server-protocol"], "HTTP/2.0");
    assert_eq!(echo["ssl-server-name"], "b.test");
    assert_eq!(echo["request-uri"], "/echo-headers?x=1");
    assert_eq!(echo["remote-addr"], "::1");
    assert_eq!(echo["te"], "");

    let entries = ng.wait_for_access_log(LOG_WAIT, |e| !e.is_empty());
    let e = &entries[0];
    assert_eq!(e["uri"], "/echo-headers?x=1");
    assert_eq!(e["x_forwarded_for"], "192.0.2.7");
    assert_eq!(e["via"], "3 h3-ingress");
    // escape=json keeps a quote inside a value valid JSON.
    assert_eq!(e["cookie"], "a=1; b=\"2\"");
    assert_eq!(e["user_agent"], "selftest");
}

#[test]
fn nginx_put_20_mib_reads_back_identical_and_is_logged() {
    let ng = NginxFixture::start(NginxOptions::default()).unwrap();
    let src = tempfile::NamedTempFile::new().unwrap();
    let bytes = deterministic_bytes("upload-20m", 20 << 20);
    std::fs::write(src.path(), &bytes).unwrap();
    let want = sha256_hex(&bytes);

    let put = Curl::new(ng.url("a.test", "/upload/x"))
        .http2()
        .cacert(ng.ca_path())
        .resolve(ng.curl_resolve("a.test", Family::V4))
        .upload(src.path())
        .run()
        .unwrap();
    assert_eq!(put.status, 201, "{} {}", put.stderr, put.body_text());
    assert_eq!(put.info["size_upload"], 20 << 20);
    assert_eq!(sha256_of(ng.uploaded_path("a.test", "x")), want);

    let back = tempfile::NamedTempFile::new().unwrap();
    let get = Curl::new(ng.url("a.test", "/upload/x"))
        .http2()
        .cacert(ng.ca_path())
        .resolve(ng.curl_resolve("a.test", Family::V6))
        .output(back.path())
        .run()
        .unwrap();
    assert_eq!(get.status, 200);
    assert_eq!(sha256_of(back.path()), want);
    // The upload went to a.test's docroot only.
    assert!(!ng.uploaded_path("b.test", "x").exists());

    let entries = ng.wait_for_access_log(LOG_WAIT, |e| e.len() >= 2);
    let put_log = entries.iter().find(|e| e["method"] == "PUT").unwrap();
    assert_eq!(put_log["status"], 201);
    assert_eq!(put_log["uri"], "/upload/x");
    assert_eq!(put_log["content_length"], (20 << 20).to_string());
    assert!(put_log["request_length"].as_u64().unwrap() >= 20 << 20);
    let get_log = entries.iter().find(|e| e["method"] == "GET").unwrap();
    assert_eq!(get_log["body_bytes_sent"], 20 << 20);
}

#[test]
fn nginx_alt_svc_toggle_and_unknown_sni_rejection() {
    let alt = "h3=\":443\"; ma=604800";
    let ng = NginxFixture::start(NginxOptions {
        alt_svc: Some(alt.into()),
        reject_unknown_sni: true,
        ..Default::default()
    })
    .unwrap();
    let r = Curl::new(ng.url("a.test", "/1m.bin"))
        .http2()
        .cacert(ng.ca_path())
        .resolve(ng.curl_resolve("a.test", Family::V4))
        .arg("--head")
        .run()
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("alt-svc"), Some(alt));
    let err = probe(ng.addr(Family::V4), "c.test", None).unwrap_err();
    assert!(err.to_string().contains("no certificate"), "{err}");
    // The named hosts still work with the rejecting default server in front.
    let ok = probe(ng.addr(Family::V6), "b.test", None).unwrap();
    assert_eq!(ok.leaf_der_sha256, ng.pki().leaf("b.test").der_sha256);
}

#[test]
fn nginx_stops_on_drop_and_releases_its_port() {
    let ng = NginxFixture::start(NginxOptions::default()).unwrap();
    let (pid, port) = (ng.pid(), ng.port());
    // The master forks its workers after it answers; on a loaded machine that takes a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut workers = support::process::descendants(pid);
    while workers.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
        workers = support::process::descendants(pid);
    }
    assert!(
        !workers.is_empty(),
        "nginx master has no workers after 10 s"
    );
    let dir = ng.dir().to_path_buf();
    drop(ng);
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(workers.iter().all(|w| !w.still_running()));
    assert!(TcpStream::connect(Family::V4.addr(port)).is_err());
    assert!(!dir.exists(), "fixture dir left behind");
}

#[test]
fn stalled_upstream_never_answers_and_closed_port_refuses() {
    use std::io::{Read, Write};
    let stalled = StalledUpstream::start().unwrap();
    let mut c = TcpStream::connect(stalled.addr()).unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    c.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 16];
    let err = c.read(&mut buf).expect_err("stalled upstream answered");
    assert!(matches!(
        err.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    ));
    assert_eq!(stalled.accepted(), 1);
    assert!(stalled.bytes_received() > 0);

    let closed = ClosedPort::new().unwrap();
    let err = TcpStream::connect(closed.addr()).expect_err("closed port accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
}

#[test]
fn free_ports_are_bindable_on_both_families() {
    // The port is released before it is returned, so a process outside this test may take it
    // in between (a clean-clone run once lost a UDP port that way). Fixtures retry with a new
    // port; so does this test, a few times, and it fails if no returned port can be bound.
    let bind_tcp = |t| {
        let a = std::net::TcpListener::bind(Family::V4.addr(t)).ok()?;
        let b = std::net::TcpListener::bind(Family::V6.addr(t)).ok()?;
        Some((a, b))
    };
    assert!(
        (0..5).any(|_| bind_tcp(free_tcp_port()).is_some()),
        "five free TCP ports in a row could not be bound on both families"
    );
    let bind_udp = |u| {
        let a = std::net::UdpSocket::bind(Family::V4.addr(u)).ok()?;
        let b = std::net::UdpSocket::bind(Family::V6.addr(u)).ok()?;
        Some((u, a, b))
    };
    let (u, _a, _b) = (0..5)
        .find_map(|_| bind_udp(free_udp_port()))
        .expect("five free UDP ports in a row could not be bound on both families");
    assert!(support::net::udp_port_bound(Family::V4, u));
    assert!(support::net::udp_port_bound(Family::V6, u));
}

#[test]
fn root_only_test_runs_as_root() {
    support::require_root_or_skip!();
    // Raw sockets need CAP_NET_RAW: proves we really have the privilege the root-only
    // tests will need, not just uid 0 in name.
    let raw = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::RAW,
        Some(socket2::Protocol::ICMPV4),
    );
    assert!(raw.is_ok(), "root but no raw socket: {:?}", raw.err());
}

fn body_sha(r: &Value) -> &str {
    r["body_sha256"].as_str().unwrap()
}

/// The aioquic client against Caddy 2.6 (quic-go) reverse-proxying to the nginx
/// fixture: proves the client speaks real HTTP/3 to a server we did not write.
#[test]
fn h3client_works_against_caddy_http3() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let ng = NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        ..Default::default()
    })
    .unwrap();
    let caddy = CaddyFixture::start(CaddyOptions {
        pki: &pki,
        hosts: vec!["a.test".into(), "b.test".into()],
        upstream_port: ng.port(),
        upstream_ca: pki.ca_cert_path.clone(),
        start_timeout: Duration::from_secs(20),
    })
    .unwrap();
    let one_mib = ng.content_sha256("/1m.bin").to_string();

    // Three requests on one connection; the middle one lacks :path, which quic-go
    // rejects by resetting that stream. The others must not notice.
    let run = H3Client::new(caddy.url("a.test", "/"))
        .resolve(caddy.resolve("a.test", Family::V4))
        .cacert(&pki.ca_cert_path)
        .requests(&json!([
            {"name": "first", "path": "/1m.bin"},
            {"name": "malformed", "raw_headers": [
                [":method", "GET"], [":scheme", "https"], [":authority", "a.test"]]},
            {"name": "after", "path": "/whoami", "output": "-"},
        ]))
        .run()
        .unwrap();
    assert_eq!(run.exit_code, exit::OK, "{:#}\n{}", run.json, run.stderr);
    let conn = run.connection();
    assert_eq!(conn["handshake"]["alpn"], "h3");
    assert_eq!(conn["server_cert"]["sha256"], pki.leaf("a.test").der_sha256);
    assert_eq!(conn["server_cert"]["san"], json!(["a.test"]));
    assert_eq!(conn["close"], Value::Null);
    let [first, bad, after] = run.requests() else {
        panic!("expected 3 results: {:#}", run.json)
    };
    assert_eq!(first["status"], 200);
    assert_eq!(body_sha(first), one_mib);
    assert_eq!(first["body_length"], 1 << 20);
    assert!(first["ttfb_ms"].as_f64().unwrap() <= first["total_ms"].as_f64().unwrap());
    assert_eq!(
        bad["status"],
        Value::Null,
        "malformed request answered: {bad:#}"
    );
    assert_eq!(
        bad["reset"]["error_name"], "H3_GENERAL_PROTOCOL_ERROR",
        "{bad:#}"
    );
    assert_eq!(after["status"], 200);
    assert_eq!(after["body"], "a.test\n");
    let ids: Vec<u64> = run
        .requests()
        .iter()
        .map(|r| r["stream_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [0, 4, 8], "all on one connection, consecutive streams");

    parallel_with_a_stalled_request(&caddy, &pki, &one_mib);

    // IPv6, the other vhost, and HEAD (content-length without a body).
    let head = H3Client::new(caddy.url("b.test", "/5m.bin"))
        .resolve(caddy.resolve("b.test", Family::V6))
        .cacert(&pki.ca_cert_path)
        .method("HEAD")
        .run()
        .unwrap();
    assert_eq!(head.exit_code, exit::OK, "{:#}", head.json);
    assert_eq!(head.connection()["peer"], format!("[::1]:{}", caddy.port()));
    assert_eq!(
        head.connection()["server_cert"]["sha256"],
        pki.leaf("b.test").der_sha256
    );
    assert_eq!(head.status(0), Some(200));
    assert_eq!(head.request(0)["body_length"], 0);
    assert!(head.request(0)["headers"]
        .as_array()
        .unwrap()
        .contains(&json!(["content-length", (5 << 20).to_string()])));

    // Upload through Caddy into nginx's WebDAV location.
    let src = tempfile::NamedTempFile::new().unwrap();
    let bytes = deterministic_bytes("h3-upload", 3 << 20);
    std::fs::write(src.path(), &bytes).unwrap();
    let put = H3Client::new(caddy.url("a.test", "/upload/h3.bin"))
        .resolve(caddy.resolve("a.test", Family::V4))
        .cacert(&pki.ca_cert_path)
        .upload(src.path())
        .run()
        .unwrap();
    assert_eq!(put.status(0), Some(201), "{:#}", put.json);
    assert_eq!(
        sha256_of(ng.uploaded_path("a.test", "h3.bin")),
        sha256_hex(&bytes)
    );

    handshake_failures(&caddy, &pki);

    // Caddy logged the HTTP/3 requests it proxied; nginx saw them over HTTP/2 or 1.1.
    let caddy_log = caddy.access_log_entries();
    assert!(
        caddy_log
            .iter()
            .any(|e| e["request"]["proto"] == "HTTP/3.0" && e["request"]["uri"] == "/1m.bin"),
        "{caddy_log:?}"
    );
    ng.wait_for_access_log(LOG_WAIT, |e| e.iter().any(|e| e["uri"] == "/upload/h3.bin"));
}

/// Parallel requests, plus one that never finishes its body: it must time out and be
/// cancelled without hurting the others.
fn parallel_with_a_stalled_request(caddy: &CaddyFixture, pki: &TestPki, one_mib: &str) {
    let par = H3Client::new(caddy.url("a.test", "/"))
        .resolve(caddy.resolve("a.test", Family::V4))
        .cacert(&pki.ca_cert_path)
        .arg("--parallel")
        .requests(&json!([
            {"path": "/1m.bin"},
            {"name": "open", "method": "PUT", "path": "/upload/never",
             "headers": [["content-length", "10"]], "end_stream": false, "timeout": 1.5},
            {"path": "/1m.bin"},
        ]))
        .run()
        .unwrap();
    assert_eq!(par.exit_code, exit::OK, "{:#}", par.json);
    assert_eq!((par.status(0), par.status(2)), (Some(200), Some(200)));
    assert_eq!(body_sha(par.request(0)), one_mib);
    assert_eq!(body_sha(par.request(2)), one_mib);
    assert_eq!(par.request(1)["error"], "timeout", "{:#}", par.json);
}

/// Unknown SNI, and a server certificate from a CA the client does not trust.
fn handshake_failures(caddy: &CaddyFixture, pki: &TestPki) {
    // Unknown SNI: a handshake failure carrying the server's TLS alert, exit code 3.
    let sni = H3Client::new(caddy.url("c.test", "/"))
        .resolve(caddy.resolve("c.test", Family::V4))
        .cacert(&pki.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(sni.exit_code, exit::HANDSHAKE_FAILED, "{:#}", sni.json);
    let hs = &sni.connection()["handshake"];
    assert_eq!(hs["ok"], false);
    assert_eq!(hs["kind"], "tls_alert", "{hs:#}");
    assert_eq!(hs["detail"]["by"], "peer");
    assert!(hs["detail"]["tls_alert"].is_u64(), "{hs:#}");

    // Untrusted server certificate: our side aborts with bad_certificate.
    let other_ca = TestPki::generate_for(&["a.test"]).unwrap();
    let untrusted = H3Client::new(caddy.url("a.test", "/"))
        .resolve(caddy.resolve("a.test", Family::V4))
        .cacert(&other_ca.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(untrusted.exit_code, exit::HANDSHAKE_FAILED);
    let d = &untrusted.connection()["handshake"]["detail"];
    assert_eq!(
        (d["by"].as_str(), d["tls_alert_name"].as_str()),
        (Some("local"), Some("bad_certificate")),
        "{d:#}"
    );
}

/// Nothing listens on the UDP port: the client fails fast with "unreachable" (ICMP
/// port unreachable on its connected socket), not after a long timeout.
#[test]
fn h3client_reports_unreachable_udp_port_as_handshake_failure() {
    let port = free_udp_port();
    let start = std::time::Instant::now();
    let run = H3Client::new(format!("https://a.test:{port}/"))
        .resolve(format!("a.test:{port}:127.0.0.1"))
        .insecure()
        .arg("--connect-timeout")
        .arg("8")
        .run()
        .unwrap();
    assert_eq!(run.exit_code, exit::HANDSHAKE_FAILED, "{:#}", run.json);
    assert_eq!(
        run.connection()["handshake"]["kind"],
        "unreachable",
        "{:#}",
        run.json
    );
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

/// nginx >= 1.25.1 wants `http2 on;` (and warns about `listen ... http2`); 1.22 knows
/// only the listen parameter. The lab's trixie nginx is 1.26.
#[test]
fn nginx_config_picks_http2_syntax_by_version() {
    use support::nginx::{parse_nginx_version, render_config, ConfigInputs};
    assert_eq!(
        parse_nginx_version("nginx version: nginx/1.22.1\n"),
        Some((1, 22, 1))
    );
    assert_eq!(
        parse_nginx_version("nginx version: nginx/1.26.3 (Debian)"),
        Some((1, 26, 3))
    );
    let pki = TestPki::generate().unwrap();
    let opts = NginxOptions::default();
    let render = |version| {
        render_config(&ConfigInputs {
            dir: std::path::Path::new("/x"),
            port: 4433,
            opts: &opts,
            pki: &pki,
            version,
            run_as_root: false,
        })
    };
    let old = render((1, 22, 1));
    assert!(old.contains("listen [::1]:4433 ssl http2"), "{old}");
    assert!(!old.contains("http2 on;"));
    assert!(!old.contains("user root"));
    let new = render((1, 26, 3));
    assert!(new.contains("listen [::1]:4433 ssl;"), "{new}");
    assert!(new.contains("http2 on;"));
}
