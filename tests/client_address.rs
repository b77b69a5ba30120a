//! The client's address at the TCP ingress. Debian's nginx plays an ingress that trusts the
//! proxy for the client's address (`real_ip_header X-Forwarded-For` with `set_real_ip_from`,
//! or `real_ip_header proxy_protocol` on a second port) and admits only 127.0.2.0/24; HTTP/3
//! clients (aioquic) bound to loopback addresses inside and outside that range go through the
//! real binary. Every address of 127.0.0.0/8 is local on Linux, so one machine plays clients
//! at several addresses without root or namespaces; the proxy's own address (127.0.0.1, ::1)
//! is the one nginx trusts.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::curl::Curl;
use support::h3client::{H3Client, H3Run};
use support::net::free_udp_port;
use support::proxy::ProxyProcess;
use support::{free_tcp_port, NginxFixture, NginxOptions, TestPki};

/// Admitted by the ingress's rule.
const INSIDE: &str = "127.0.2.7";
/// Refused by it.
const OUTSIDE: &str = "127.0.9.9";
const ALLOW_INSIDE_ONLY: &str = "allow 127.0.2.0/24; deny all;";
/// The client's real address, as nginx's realip module takes it from our headers.
const TRUST_PROXY_HEADERS: &str = "set_real_ip_from 127.0.0.1; set_real_ip_from ::1; \
     real_ip_header X-Forwarded-For; real_ip_recursive on;";

fn proxy_config(pki: &TestPki, upstream_port: u16, client_address: Value) -> Value {
    let leaf = pki.leaf("a.test");
    json!({
        "port": free_udp_port(),
        "addresses": {"ipv4": "127.0.0.1", "ipv6": "::1"},
        "upstream": {
            "address": format!("127.0.0.1:{upstream_port}"),
            "clientAddress": client_address,
        },
        "hosts": [{
            "name": "a.test",
            "certFile": leaf.cert_path.display().to_string(),
            "keyFile": leaf.key_path.display().to_string(),
        }],
    })
}

fn nginx(pki: &Arc<TestPki>, extra_http: &str, extra_server: &str) -> NginxFixture {
    NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        extra_http: extra_http.into(),
        extra_server: extra_server.into(),
        ..Default::default()
    })
    .expect("nginx starts")
}

/// One request per `(id, extra headers)` on one connection from `source`. A static file,
/// because nginx's `return` answers before the access phase would judge the address.
fn get_from(
    proxy: &ProxyProcess,
    pki: &TestPki,
    source: &str,
    requests: &[(&str, Value)],
) -> H3Run {
    let target = if source.contains(':') {
        "[::1]"
    } else {
        "127.0.0.1"
    };
    let specs: Vec<Value> = requests
        .iter()
        .map(|(id, headers)| json!({"name": id, "path": format!("/host.txt?id={id}"), "headers": headers}))
        .collect();
    let run = H3Client::new(format!("https://a.test:{}/", proxy.port))
        .resolve(format!("a.test:{}:{target}", proxy.port))
        .bind(source)
        .cacert(&pki.ca_cert_path)
        .requests(&Value::Array(specs))
        .run()
        .expect("h3client runs");
    assert_eq!(
        run.requests().len(),
        requests.len(),
        "{:#}\n{}",
        run.json,
        run.stderr
    );
    run
}

/// nginx's access-log entry of the request `id` (waits for it: nginx logs after answering).
fn logged(nginx: &NginxFixture, id: &str) -> Value {
    let needle = format!("/host.txt?id={id}");
    let entries = nginx.wait_for_access_log(Duration::from_secs(5), |e| {
        e.iter().any(|l| l["uri"] == needle.as_str())
    });
    entries
        .into_iter()
        .find(|l| l["uri"] == needle.as_str())
        .expect("found above")
}

/// What the ingress decided for request `id`, and the address it decided on.
fn verdict(nginx: &NginxFixture, run: &H3Run, i: usize, id: &str) -> (Option<u64>, String) {
    let entry = logged(nginx, id);
    assert_eq!(entry["via"], "3 h3-ingress", "{entry}");
    assert_eq!(run.status(i), entry["status"].as_u64(), "{entry}");
    (
        run.status(i),
        entry["remote_addr"].as_str().unwrap().to_string(),
    )
}

const SPOOF: &str = "X-Forwarded-For";

/// The same checks for every way the address is carried: an inside client is admitted, an
/// outside one refused, also when it claims an inside address in every header an ingress
/// might read; nginx logs each h3 request with the client's own address.
fn inside_admitted_outside_refused(nginx: &NginxFixture, proxy: &ProxyProcess, pki: &TestPki) {
    let tag = proxy.port;
    let id = |what: &str| format!("{what}-{tag}");
    let run = get_from(proxy, pki, INSIDE, &[(&id("in"), json!([]))]);
    assert_eq!(
        verdict(nginx, &run, 0, &id("in")),
        (Some(200), INSIDE.into())
    );

    let run = get_from(
        proxy,
        pki,
        OUTSIDE,
        &[(&id("out"), json!([])), (&id("spoof"), claims())],
    );
    let refused = (Some(403), OUTSIDE.to_string());
    assert_eq!(verdict(nginx, &run, 0, &id("out")), refused);
    assert_eq!(verdict(nginx, &run, 1, &id("spoof")), refused);

    let run = get_from(proxy, pki, "::1", &[(&id("v6"), json!([]))]);
    assert_eq!(
        verdict(nginx, &run, 0, &id("v6")),
        (Some(403), "::1".into())
    );
}

/// An inside address claimed in every header an ingress might read.
fn claims() -> Value {
    json!([
        [SPOOF.to_ascii_lowercase(), INSIDE],
        ["x-real-ip", INSIDE],
        ["forwarded", format!("for={INSIDE}")]
    ])
}

/// (a) The ingress trusts exactly the proxy's addresses for X-Forwarded-For (recursive): with
/// Replace and with Append, the client's own X-Forwarded-For gets no outside client in. A
/// client at an address the ingress itself trusts (here ::1, trusted as the proxy's) is the
/// exception Append leaves: its claim is walked past; Replace leaves it nothing to claim.
#[test]
fn forwarded_headers_carry_the_client_address_in_both_modes() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki, TRUST_PROXY_HEADERS, ALLOW_INSIDE_ONLY);
    let modes = [
        ("Replace", (Some(403), "::1")),
        ("Append", (Some(200), INSIDE)),
    ];
    for (mode, from_trusted) in modes {
        let cfg = proxy_config(&pki, nginx.port(), json!({"clientForwardedFor": mode}));
        let proxy = ProxyProcess::start(cfg).unwrap();
        inside_admitted_outside_refused(&nginx, &proxy, &pki);
        let tag = proxy.port;
        let entry = logged(&nginx, &format!("spoof-{tag}"));
        let want = match mode {
            "Replace" => OUTSIDE.to_string(),
            _ => format!("{INSIDE}, {OUTSIDE}"),
        };
        assert_eq!(entry["x_forwarded_for"], want.as_str(), "{mode}: {entry}");
        assert_eq!(entry["x_real_ip"], OUTSIDE, "{mode}: {entry}");

        let id = format!("v6-spoof-{tag}");
        let run = get_from(&proxy, &pki, "::1", &[(&id, claims())]);
        let (status, addr) = verdict(&nginx, &run, 0, &id);
        assert_eq!((status, addr.as_str()), from_trusted, "{mode}");
    }
}

/// Why Replace is the default: an ingress that trusts every hop (ingress-nginx's
/// `proxy-real-ip-cidr` is `0.0.0.0/0` unless set, with `real_ip_recursive on`) walks an
/// appended list back to the address the client wrote. Replace leaves it nothing to walk to.
#[test]
fn replace_holds_where_the_ingress_trusts_every_hop_and_append_does_not() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let trust_all = "set_real_ip_from 0.0.0.0/0; set_real_ip_from ::/0; \
                     real_ip_header X-Forwarded-For; real_ip_recursive on;";
    let nginx = nginx(&pki, trust_all, ALLOW_INSIDE_ONLY);
    for (mode, want) in [
        ("Replace", (Some(403), OUTSIDE)),
        ("Append", (Some(200), INSIDE)),
    ] {
        let cfg = proxy_config(&pki, nginx.port(), json!({"clientForwardedFor": mode}));
        let proxy = ProxyProcess::start(cfg).unwrap();
        let id = format!("spoof-{}", proxy.port);
        let claim = json!([[SPOOF.to_ascii_lowercase(), INSIDE]]);
        let run = get_from(&proxy, &pki, OUTSIDE, &[(&id, claim)]);
        let (status, addr) = verdict(&nginx, &run, 0, &id);
        assert_eq!((status, addr.as_str()), want, "{mode}");
    }
}

/// (b) PROXY protocol v2 to a second port of the ingress that alone expects it; the main
/// port keeps serving direct TCP clients with their own addresses.
#[test]
fn proxy_protocol_to_a_second_port_carries_the_client_address() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let pp_port = free_tcp_port();
    let nginx = nginx(
        &pki,
        "set_real_ip_from 127.0.0.1; set_real_ip_from ::1; real_ip_header proxy_protocol;",
        &format!("listen 127.0.0.1:{pp_port} ssl proxy_protocol; {ALLOW_INSIDE_ONLY}"),
    );
    let client_address = json!({
        "via": "ProxyProtocol",
        "proxyProtocolAddress": format!("127.0.0.1:{pp_port}"),
    });
    let proxy = ProxyProcess::start(proxy_config(&pki, nginx.port(), client_address)).unwrap();
    inside_admitted_outside_refused(&nginx, &proxy, &pki);
    let entry = logged(&nginx, &format!("in-{}", proxy.port));
    assert_eq!(
        entry["protocol"], "HTTP/1.1",
        "the PROXY port (no http2 there): {entry}"
    );

    // Direct TCP clients of the main port: no PROXY header, judged by their own address.
    for (source, want) in [(INSIDE, 200), (OUTSIDE, 403)] {
        let r = Curl::new(format!("https://a.test:{}/host.txt", nginx.port()))
            .resolve(format!("a.test:{}:127.0.0.1", nginx.port()))
            .cacert(&pki.ca_cert_path)
            .arg("--interface")
            .arg(source)
            .run()
            .unwrap();
        assert_eq!(r.status, want, "direct TCP from {source}: {}", r.stderr);
    }
}

/// `accessLog.enabled`: one JSON line per request on the proxy's standard output, with the
/// client's own address and port, what it asked, what it got and from where, and a path
/// too long for a line cut and said so.
#[test]
fn the_access_log_has_a_line_per_request_with_the_client_address() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki, TRUST_PROXY_HEADERS, ALLOW_INSIDE_ONLY);
    let mut cfg = proxy_config(&pki, nginx.port(), json!({}));
    cfg["accessLog"] = json!({"enabled": true});
    let proxy = ProxyProcess::start(cfg).unwrap();
    let long = "x".repeat(5000);
    let run = get_from(
        &proxy,
        &pki,
        INSIDE,
        &[("ok", json!([])), (&long, json!([]))],
    );
    assert_eq!(run.status(0), Some(200));
    let misdirected = H3Client::new(format!("https://b.test:{}/host.txt", proxy.port))
        .resolve(format!("b.test:{}:127.0.0.1", proxy.port))
        .arg("--insecure")
        .run()
        .unwrap();
    assert_eq!(
        misdirected.exit_code, 3,
        "no certificate for b.test: {:#}",
        misdirected.json
    );
    let lines = |log: &str| -> Vec<Value> {
        log.lines()
            .filter(|l| l.starts_with("{\"time\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let mut entries = Vec::new();
    for _ in 0..100 {
        entries = lines(&proxy.log());
        if entries.len() >= 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(entries.len(), 2, "{}", proxy.log());
    let ok = &entries[0];
    assert_eq!(ok["client"], INSIDE, "{ok}");
    assert!(ok["client_port"].as_u64().unwrap() > 0, "{ok}");
    assert_eq!(ok["sni"], "a.test");
    assert_eq!(ok["method"], "GET");
    assert_eq!(ok["path"], "/host.txt?id=ok");
    assert_eq!(
        (ok["status"].as_u64(), ok["upstream_status"].as_u64()),
        (Some(200), Some(200))
    );
    assert_eq!(ok["bytes_sent"], 7, "a.test\\n: {ok}");
    assert_eq!(ok["upstream"], format!("127.0.0.1:{}", nginx.port()));
    let cut = &entries[1];
    assert_eq!(cut["truncated"], json!(["path"]), "{cut}");
    assert_eq!(cut["path"].as_str().unwrap().len(), 2048);
    let m = proxy.metrics();
    assert_eq!(
        support::proxy::sample(&m, "h3_ingress_access_log_dropped_total", &[]),
        0.0
    );
    assert!(
        m.contains("h3_ingress_access_log_dropped_total 0"),
        "exported from 0"
    );
}
