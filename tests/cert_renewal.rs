//! Certificate renewal under `upstream.verify: servedCertificate`, end to end: the h3-ingress
//! binary in front of Debian nginx, both rotating one host's certificate in each order while
//! HTTP/3 requests (aioquic) run the whole time. The proxy rotates through a SIGHUP reload,
//! nginx through its own reload, as each would pick up a renewed Secret.
//!
//! Zero 5xx across both orders, with the grace counter showing both the `next` leaf (nginx
//! switched first) and the `previous` one (the proxy switched first) were accepted; then a
//! leaf whose grace has passed, and a leaf from a foreign CA of the same name, are refused.
//! Then the same with renewals that alternate between two intermediates of one root, as a
//! public CA issues them (Let's Encrypt: R10 or R11 at random).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::h3client::H3Client;
use support::net::{free_udp_port, Family};
use support::pki::{Intermediate, LeafCert};
use support::proxy::{sample, ProxyProcess};
use support::{NginxFixture, NginxOptions, TestPki, Validity};

/// The grace the test runs with: long enough for a phase on a loaded machine, short enough to
/// wait out.
const GRACE_SECONDS: u64 = 8;
const HOST: &str = "a.test";

/// Leaves from `days` before today (day granularity), valid 30 days.
fn issue(pki: &TestPki, name: &str, days: i64) -> LeafCert {
    let validity = Validity {
        not_before_days: -days,
        not_after_days: 30,
    };
    pki.issue(name, &[HOST], validity).expect("leaf")
}

fn config(udp: u16, upstream: u16, leaf: &LeafCert) -> Value {
    json!({
        "port": udp,
        "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
        "upstream": {
            "address": format!("127.0.0.1:{upstream}"),
            "servedCertificateGraceSeconds": GRACE_SECONDS,
        },
        "hosts": [{
            "name": HOST,
            "certFile": leaf.cert_path.display().to_string(),
            "keyFile": leaf.key_path.display().to_string(),
        }],
    })
}

struct Rig {
    pki: Arc<TestPki>,
    nginx: NginxFixture,
    proxy: ProxyProcess,
    udp: u16,
    generation: u64,
}

impl Rig {
    /// nginx presents `leaf` and, as an ingress with a full chain, `chain` after it.
    fn nginx_uses(&self, leaf: &LeafCert, chain: &[&str]) {
        let pem = std::iter::once(leaf.cert_pem.as_str())
            .chain(chain.iter().copied())
            .collect::<String>();
        std::fs::write(self.nginx.cert_path(HOST), pem).unwrap();
        std::fs::write(self.nginx.key_path(HOST), &leaf.key_pem).unwrap();
        self.nginx.reload();
        let addr = self.nginx.addr(Family::V4);
        let deadline = Instant::now() + Duration::from_secs(10);
        while support::tls::probe(addr, HOST, None)
            .map(|p| p.leaf_der_sha256)
            .ok()
            != Some(leaf.der_sha256.clone())
        {
            assert!(
                Instant::now() < deadline,
                "nginx did not switch to {}",
                leaf.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The proxy serves `leaf` after a SIGHUP reload.
    fn proxy_uses(&mut self, leaf: &LeafCert) {
        self.proxy
            .rewrite_config(config(self.udp, self.nginx.port(), leaf));
        self.proxy.signal(libc::SIGHUP);
        self.generation += 1;
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.proxy.status()["configGeneration"].as_u64() != Some(self.generation) {
            assert!(
                Instant::now() < deadline,
                "reload {} not applied: {}",
                self.generation,
                self.proxy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn h3(&self, requests: usize) -> H3Client {
        let specs: Vec<Value> = (0..requests).map(|_| json!({"path": "/whoami"})).collect();
        H3Client::new(format!("https://{HOST}:{}/whoami", self.udp))
            .resolve(format!("{HOST}:{}:127.0.0.1", self.udp))
            .cacert(&self.pki.ca_cert_path)
            .arg("--connect-timeout")
            .arg("5")
            .requests(&json!(specs))
    }

    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        sample(&self.proxy.metrics(), name, labels)
    }
}

/// Requests on fresh HTTP/3 connections until stopped: every status seen (0: no answer).
struct Traffic {
    stop: Arc<AtomicBool>,
    statuses: Arc<Mutex<Vec<u64>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Traffic {
    fn start(client: impl Fn() -> H3Client + Send + 'static) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let (s, st) = (stop.clone(), statuses.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let run = client().run().expect("h3client runs");
                let mut seen: Vec<u64> = (0..run.requests().len())
                    .map(|i| run.status(i).unwrap_or(0))
                    .collect();
                if seen.is_empty() {
                    seen.push(0);
                }
                st.lock().unwrap().extend(seen);
            }
        });
        Traffic {
            stop,
            statuses,
            thread,
        }
    }

    fn count(&self) -> usize {
        self.statuses.lock().unwrap().len()
    }

    /// Waits until `more` further requests were answered (or failed).
    fn wait_for(&self, more: usize) {
        let target = self.count() + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.count() < target {
            assert!(
                Instant::now() < deadline,
                "traffic stalled at {}",
                self.count()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        Arc::try_unwrap(self.statuses)
            .unwrap()
            .into_inner()
            .unwrap()
    }
}

#[test]
fn a_renewal_in_either_order_costs_no_request_and_stale_or_foreign_leaves_are_refused() {
    let pki = Arc::new(TestPki::generate_for(&[HOST]).unwrap());
    let ca = pki.ca_cert_pem.clone();
    // L1 (the PKI's) from yesterday; L2, the renewal nginx takes first, from today; L3 and L4
    // from two days and one day ago, so neither is a renewal of the other's successor.
    let l1 = pki.leaf(HOST).clone();
    let l2 = issue(&pki, "l2", 0);
    let l3 = issue(&pki, "l3", 2);
    let l4 = issue(&pki, "l4", 1);
    let nginx = NginxFixture::start(NginxOptions {
        hosts: vec![HOST.into()],
        pki: Some(pki.clone()),
        ..Default::default()
    })
    .unwrap();
    let udp = free_udp_port();
    let proxy = ProxyProcess::start(config(udp, nginx.port(), &l1)).unwrap();
    let mut rig = Rig {
        pki,
        nginx,
        proxy,
        udp,
        generation: 1,
    };
    let traffic = {
        let (udp, ca_path) = (rig.udp, rig.pki.ca_cert_path.clone());
        Traffic::start(move || {
            H3Client::new(format!("https://{HOST}:{udp}/whoami"))
                .resolve(format!("{HOST}:{udp}:127.0.0.1"))
                .cacert(&ca_path)
                .requests(&json!([{"path": "/whoami"}, {"path": "/whoami"}]))
        })
    };
    traffic.wait_for(4);
    // nginx first (its chain names the CA), the proxy six requests later.
    rig.nginx_uses(&l2, &[&ca]);
    traffic.wait_for(6);
    rig.proxy_uses(&l2);
    traffic.wait_for(4);
    // The proxy first, nginx six requests later.
    rig.proxy_uses(&l3);
    traffic.wait_for(6);
    rig.nginx_uses(&l3, &[&ca]);
    traffic.wait_for(4);
    let statuses = traffic.finish();
    let failed: Vec<&u64> = statuses.iter().filter(|s| **s != 200).collect();
    let next = rig.metric(
        "h3_ingress_upstream_certificate_grace_total",
        &[("leaf", "next")],
    );
    let previous = rig.metric(
        "h3_ingress_upstream_certificate_grace_total",
        &[("leaf", "previous")],
    );
    let tls_errors = rig.metric("h3_ingress_upstream_errors_total", &[("kind", "tls")]);
    eprintln!(
        "rotation in both orders: {} HTTP/3 requests, {} not 200 ({failed:?}); upstream handshakes \
         accepted with the next leaf {next}, the previous leaf {previous}; TLS errors {tls_errors}",
        statuses.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}\n{}", rig.proxy.log());
    assert_eq!(tls_errors, 0.0, "{}", rig.proxy.log());
    assert!(
        next >= 1.0 && previous >= 1.0,
        "both orders exercised: next {next}, previous {previous}"
    );

    stale_and_foreign_leaves_are_refused(&mut rig, &l4, &ca);
}

/// After the grace, the leaf the proxy replaced is refused (502); so is a leaf for the same
/// name from another CA with the same name, even sent with that CA.
fn stale_and_foreign_leaves_are_refused(rig: &mut Rig, l4: &LeafCert, ca: &str) {
    rig.proxy_uses(l4);
    std::thread::sleep(Duration::from_secs(GRACE_SECONDS + 1));
    // The Alt-Svc probe connected (within the grace) right after the reload; a reload of nginx
    // closes that connection, so the next request needs a new handshake.
    rig.nginx.reload();
    std::thread::sleep(Duration::from_millis(500));
    let run = rig.h3(1).run().unwrap();
    assert_eq!(
        run.status(0),
        Some(502),
        "l3 after its grace: {:#}",
        run.json
    );
    let tls = rig.metric("h3_ingress_upstream_errors_total", &[("kind", "tls")]);
    assert!(tls >= 1.0, "{}", rig.proxy.log());

    rig.nginx_uses(l4, &[ca]);
    let run = rig.h3(1).run().unwrap();
    assert_eq!(run.status(0), Some(200), "{:#}", run.json);

    let foreign_pki = TestPki::generate_for(&[HOST]).unwrap();
    let foreign = issue(&foreign_pki, "foreign", 0);
    assert_ne!(foreign_pki.ca_der_sha256, rig.pki.ca_der_sha256);
    rig.nginx_uses(&foreign, &[&foreign_pki.ca_cert_pem]);
    let run = rig.h3(1).run().unwrap();
    assert_eq!(run.status(0), Some(502), "a foreign leaf: {:#}", run.json);
    let after = rig.metric("h3_ingress_upstream_errors_total", &[("kind", "tls")]);
    assert!(after > tls, "{}", rig.proxy.log());
    assert!(
        rig.proxy.log().contains("different certificate"),
        "{}",
        rig.proxy.log()
    );
    let accepted = rig.metric("h3_ingress_upstream_certificate_grace_total", &[]);
    eprintln!("refused after the grace and a foreign leaf; grace acceptances in all {accepted}");
}

/// `leaf` from `inter` as the proxy's certificate file holds it: leaf, intermediate, root.
fn with_chain(pki: &TestPki, inter: &Intermediate, leaf: LeafCert) -> LeafCert {
    let path = leaf.cert_path.with_extension("chain.crt");
    let chain = format!("{}{}{}", leaf.cert_pem, inter.cert_pem, pki.ca_cert_pem);
    std::fs::write(&path, chain).unwrap();
    LeafCert {
        cert_path: path,
        ..leaf
    }
}

/// Renewals that alternate between two intermediates of the CA, as a public CA issues them:
/// nginx takes each first twice (R10 to R11, then R11 to R10: a next leaf from the other
/// intermediate), then the proxy first (the previous leaf). nginx sends its leaf with its
/// intermediate, as an ingress does; the proxy's file carries the whole chain, root
/// included, which is how the proxy knows the root both intermediates chain to (for a
/// public CA the web roots it carries play that part).
#[test]
fn a_renewal_from_the_other_intermediate_of_the_root_costs_no_request() {
    let pki = Arc::new(TestPki::generate_for(&[HOST]).unwrap());
    let (r10, r11) = (
        pki.intermediate("R10").unwrap(),
        pki.intermediate("R11").unwrap(),
    );
    let minutes = |m: u64| Duration::from_secs(60 * m);
    let leaf = |i: &Intermediate, stem: &str, ago: u64| {
        let l = i.issue(stem, &[HOST], minutes(ago)).unwrap();
        with_chain(&pki, i, l)
    };
    let (l1, l2, l3, l4) = (
        leaf(&r10, "i1", 4),
        leaf(&r11, "i2", 3),
        leaf(&r10, "i3", 2),
        leaf(&r11, "i4", 1),
    );
    let nginx = NginxFixture::start(NginxOptions {
        hosts: vec![HOST.into()],
        pki: Some(pki.clone()),
        ..Default::default()
    })
    .unwrap();
    let udp = free_udp_port();
    let proxy = ProxyProcess::start(config(udp, nginx.port(), &l1)).unwrap();
    let mut rig = Rig {
        pki,
        nginx,
        proxy,
        udp,
        generation: 1,
    };
    rig.nginx_uses(&l1, &[&r10.cert_pem]);
    let traffic = {
        let (udp, ca_path) = (rig.udp, rig.pki.ca_cert_path.clone());
        Traffic::start(move || {
            H3Client::new(format!("https://{HOST}:{udp}/whoami"))
                .resolve(format!("{HOST}:{udp}:127.0.0.1"))
                .cacert(&ca_path)
                .requests(&json!([{"path": "/whoami"}, {"path": "/whoami"}]))
        })
    };
    traffic.wait_for(4);
    for (next, inter) in [(&l2, &r11), (&l3, &r10)] {
        rig.nginx_uses(next, &[&inter.cert_pem]);
        traffic.wait_for(6);
        rig.proxy_uses(next);
        traffic.wait_for(4);
    }
    rig.proxy_uses(&l4);
    traffic.wait_for(6);
    rig.nginx_uses(&l4, &[&r11.cert_pem]);
    traffic.wait_for(4);
    let statuses = traffic.finish();
    let failed: Vec<&u64> = statuses.iter().filter(|s| **s != 200).collect();
    let grace = |leaf: &str| {
        rig.metric(
            "h3_ingress_upstream_certificate_grace_total",
            &[("leaf", leaf)],
        )
    };
    let (next, previous) = (grace("next"), grace("previous"));
    let tls_errors = rig.metric("h3_ingress_upstream_errors_total", &[("kind", "tls")]);
    eprintln!(
        "renewals across intermediates (R10 to R11 and back, nginx first; R10 to R11, the proxy \
         first): {} HTTP/3 requests, {} not 200 ({failed:?}); upstream handshakes accepted with \
         the next leaf {next}, the previous leaf {previous}; TLS errors {tls_errors}",
        statuses.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{failed:?}\n{}", rig.proxy.log());
    assert_eq!(tls_errors, 0.0, "{}", rig.proxy.log());
    assert!(
        next >= 2.0 && previous >= 1.0,
        "next {next}, previous {previous}"
    );
}
