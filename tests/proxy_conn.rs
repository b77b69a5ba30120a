//! The connection lifecycle of the h3-ingress binary, seen by a quinn client: a stateless
//! reset after a SIGKILL and restart (with and without `keys.file`), and the maximum
//! connection age (GOAWAY, then a close once the requests in flight had their grace time).
//! The adversarial suite (tests/adversarial/) attacks the same paths with aioquic.

mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use support::net::{free_udp_port, StalledUpstream};
use support::proxy::{sample, ProxyProcess};
use support::TestPki;

fn config(pki: &TestPki, port: u16, upstream: &str, extra: Value) -> Value {
    let leaf = pki.leaf("a.test");
    let mut c = json!({
        "port": port,
        "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
        "upstream": {"address": upstream},
        "hosts": [{"name": "a.test", "certFile": leaf.cert_path.display().to_string(),
                   "keyFile": leaf.key_path.display().to_string()}],
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

async fn connect(ep: &quinn::Endpoint, port: u16) -> quinn::Connection {
    ep.connect(([127, 0, 0, 1], port).into(), "a.test")
        .unwrap()
        .await
        .expect("QUIC handshake")
}

/// Kills the proxy with SIGKILL and starts another process on the same port and file.
fn kill_and_restart(proxy: ProxyProcess, config: Value) -> ProxyProcess {
    proxy.signal(libc::SIGKILL);
    drop(proxy);
    ProxyProcess::start(config).expect("the second process starts")
}

/// Connects, restarts the proxy, sends a packet on the old connection; returns how the
/// connection ended within `wait` (None: still open).
async fn after_restart(
    pki: &TestPki,
    extra: Value,
    wait: Duration,
) -> Option<(quinn::ConnectionError, Duration)> {
    let port = free_udp_port();
    let cfg = config(pki, port, "127.0.0.1:9", extra);
    let proxy = ProxyProcess::start(cfg.clone()).expect("proxy starts");
    let ep = support::quic::any_certificate_client();
    let conn = connect(&ep, port).await;
    let _second = tokio::task::block_in_place(|| kill_and_restart(proxy, cfg));
    let sent = Instant::now();
    // A packet of the client's own (an ACK, a probe) may reach the new process first, on a
    // loaded machine while the restart takes its time: then the reset has already come.
    let mut s = match conn.open_uni().await {
        Ok(s) => s,
        Err(e) => return Some((e, sent.elapsed())),
    };
    let _ = s.write_all(b"are you still there").await;
    let closed = tokio::time::timeout(wait, conn.closed()).await;
    conn.close(0u32.into(), b"");
    closed.ok().map(|e| (e, sent.elapsed()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_proxy_resets_the_connections_of_the_killed_one_when_they_share_keys() {
    let pki = TestPki::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("quic.keys");
    let extra = json!({"keys": {"file": keys.display().to_string()}});
    let ended = after_restart(&pki, extra, Duration::from_secs(3)).await;
    let (error, after) = ended.expect("the connection ended");
    assert!(matches!(error, quinn::ConnectionError::Reset), "{error:?}");
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert_eq!(std::fs::read(&keys).unwrap().len(), 64);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_keys_file_the_clients_of_a_killed_proxy_hang() {
    let pki = TestPki::generate().unwrap();
    let ended = after_restart(&pki, json!({}), Duration::from_secs(3)).await;
    assert!(ended.is_none(), "{ended:?}");
}

/// The close a connection at its maximum age gets: H3_NO_ERROR, and when.
async fn aged(
    extra: Value,
    upstream: &str,
    request: bool,
) -> (quinn::ConnectionError, Duration, f64) {
    let pki = TestPki::generate().unwrap();
    let port = free_udp_port();
    let proxy = ProxyProcess::start(config(&pki, port, upstream, extra)).expect("proxy starts");
    let ep = support::quic::any_certificate_client();
    let conn = connect(&ep, port).await;
    let t0 = Instant::now();
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .unwrap();
    let _drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let _pending = if request {
        let req = http::Request::get("https://a.test/stalls")
            .body(())
            .unwrap();
        let mut stream = send.send_request(req).await.unwrap();
        stream.finish().await.unwrap();
        Some(tokio::spawn(async move {
            stream.recv_response().await.map(|_| ())
        }))
    } else {
        None
    };
    let error = tokio::time::timeout(Duration::from_secs(10), conn.closed())
        .await
        .expect("closed within 10 s");
    let m = proxy.metrics();
    let counted = sample(
        &m,
        "h3_ingress_limits_total",
        &[("limit", "connection_age")],
    );
    drop::<h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>>(send);
    (error, t0.elapsed(), counted)
}

fn h3_no_error(e: &quinn::ConnectionError) -> bool {
    matches!(e, quinn::ConnectionError::ApplicationClosed(c) if c.error_code == quinn::VarInt::from_u32(0x100))
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_connection_at_its_maximum_age_gets_goaway_and_is_closed() {
    let extra = json!({"http": {"maxConnectionAgeSeconds": 2, "drainTimeoutSeconds": 1}});
    let (error, after, counted) = aged(extra, "127.0.0.1:9", false).await;
    assert!(h3_no_error(&error), "{error:?}");
    // 2 s minus up to 10 % jitter; nothing in flight, so no grace is needed.
    assert!(
        after >= Duration::from_millis(1700) && after < Duration::from_millis(2800),
        "{after:?}"
    );
    assert_eq!(counted, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_in_flight_at_the_maximum_age_gets_the_grace_time_then_the_close() {
    let stalled = StalledUpstream::start().unwrap();
    let upstream = json!({"address": stalled.addr().to_string(), "tls": false});
    let extra = json!({"http": {"maxConnectionAgeSeconds": 2, "drainTimeoutSeconds": 2},
                       "upstream": upstream});
    let (error, after, counted) = aged(extra, &stalled.addr().to_string(), true).await;
    assert!(h3_no_error(&error), "{error:?}");
    // GOAWAY at 1.8-2 s, the stalled request gets 2 s more, then the close.
    assert!(
        after >= Duration::from_millis(3700) && after < Duration::from_millis(5000),
        "{after:?}"
    );
    assert_eq!(counted, 1.0);
}
