//! The handshake of the h3-ingress binary when the client's acknowledgements of our Initial
//! are lost. With a certificate flight larger than three times the client's Initial, our
//! server is blocked by the anti-amplification limit until the client sends more; when the
//! client's padded Initial datagrams are lost, only its small Handshake packets arrive, and
//! those have to prove its address (RFC 9000 section 8.1), or the handshake stalls until it
//! times out. One random loss in the lab's S3 once hit exactly this. Here the loss is placed:
//! every client datagram after the first whose first packet is an Initial is dropped, for a
//! quinn client and for aioquic. Without the fix aioquic stalls here (no handshake within
//! the deadline); quinn's client gets through either way, and is kept as a second stack.

mod support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::h3client::H3Client;
use support::net::{free_udp_port, LossyRelay};
use support::pki::{RsaChain, RsaChainBits};
use support::proxy::{sample, ProxyProcess};

/// Both clients finish in about one round trip on loopback; the proxy gives up at 10 s.
const DEADLINE: Duration = Duration::from_secs(4);
/// A client Initial is at least 1200 bytes (RFC 9000 section 14.1).
const THREE_INITIALS: usize = 3 * 1200;

/// A chain whose certificates alone exceed what one client Initial lets us send.
fn big_chain(dir: &std::path::Path) -> RsaChain {
    let names: Vec<String> = std::iter::once("a.test".to_string())
        .chain((0..100).map(|i| format!("alias-{i}.a.test")))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let bits = RsaChainBits {
        root: 2048,
        intermediate: 4096,
        leaf: 4096,
    };
    let chain = RsaChain::generate(dir, &names, bits).expect("RSA chain");
    assert!(
        chain.chain_der_len > THREE_INITIALS,
        "the test needs a flight above 3 x 1200 bytes: {}",
        chain.chain_der_len
    );
    chain
}

fn start(chain: &RsaChain) -> (ProxyProcess, u16) {
    let port = free_udp_port();
    let config = json!({
        "port": port,
        "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
        "upstream": {"address": "127.0.0.1:9"},
        "hosts": [{"name": "a.test", "certFile": chain.chain_path.display().to_string(),
                   "keyFile": chain.leaf_key_path.display().to_string()}],
    });
    (ProxyProcess::start(config).expect("proxy starts"), port)
}

/// Drops each client datagram after the first that starts with an Initial packet.
fn lose_initial_acks(port: u16) -> LossyRelay {
    let is_initial = |d: &[u8]| d.first().is_some_and(|b| b & 0xb0 == 0x80);
    LossyRelay::start(
        ([127, 0, 0, 1], port).into(),
        Box::new(move |d, seen| seen > 0 && is_initial(d)),
    )
    .expect("relay")
}

/// Completed handshakes the proxy counted, once it has counted one (the client is done
/// first: the server's handshake ends with the client's Finished) or at the deadline.
fn handshakes_ok(proxy: &ProxyProcess) -> f64 {
    let end = Instant::now() + DEADLINE;
    loop {
        let ok = sample(
            &proxy.metrics(),
            "h3_ingress_handshakes_total",
            &[("result", "ok")],
        );
        if ok > 0.0 || Instant::now() > end {
            return ok;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quinn_client_whose_initial_acks_are_lost_completes_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let chain = big_chain(dir.path());
    let (proxy, port) = start(&chain);
    let relay = lose_initial_acks(port);
    let ep = support::quic::any_certificate_client();
    let started = Instant::now();
    let connecting = ep.connect(relay.addr(), "a.test").unwrap();
    let conn = tokio::time::timeout(DEADLINE, connecting).await;
    let took = started.elapsed();
    let log = proxy.log();
    let conn = conn
        .unwrap_or_else(|_| panic!("no handshake within {DEADLINE:?}; proxy log:\n{log}"))
        .expect("handshake");
    assert!(relay.dropped() > 0, "the relay dropped nothing");
    let counted = tokio::task::block_in_place(|| handshakes_ok(&proxy));
    assert_eq!(counted, 1.0);
    eprintln!(
        "quinn: handshake in {took:?}, {} client datagrams dropped",
        relay.dropped()
    );
    conn.close(0u32.into(), b"");
}

#[test]
fn aioquic_whose_initial_acks_are_lost_completes_the_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let chain = big_chain(dir.path());
    let (proxy, port) = start(&chain);
    let relay = lose_initial_acks(port);
    let run = H3Client::new(format!("https://a.test:{}/", relay.addr().port()))
        .resolve(format!("a.test:{}:127.0.0.1", relay.addr().port()))
        .cacert(&chain.root_cert_path)
        .arg("--connect-timeout")
        .arg(DEADLINE.as_secs().to_string())
        .run()
        .expect("h3client.py runs");
    let handshake: &Value = &run.connection()["handshake"];
    assert_eq!(
        handshake["ok"],
        true,
        "{handshake}; proxy log:\n{}",
        proxy.log()
    );
    assert!(relay.dropped() > 0, "the relay dropped nothing");
    assert_eq!(handshakes_ok(&proxy), 1.0);
    eprintln!(
        "aioquic: handshake in {} ms, {} client datagrams dropped",
        handshake["ms"],
        relay.dropped()
    );
}
