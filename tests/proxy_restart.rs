//! A restart of the standalone proxy that nobody notices: `h3-ingress proxy` started again on
//! the same configuration takes the port over from the running one (SO_REUSEPORT, connection
//! IDs that name their process, the socket-selection program), with Debian nginx as the TCP
//! ingress and aioquic clients running across it (tests/py/rollclient.py): a new connection
//! per request every 200 ms, one kept connection doing a request every 200 ms, and one slow
//! download that spans the take-over. Then the death of either process: SIGKILL of the newest
//! gives the new connections back to the previous one, and the connections of a killed
//! process get a stateless reset from the survivor (quinn as the client: it checks resets).

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Buf;
use serde_json::{json, Value};
use support::net::free_udp_port;
use support::proxy::ProxyProcess;
use support::{NginxFixture, NginxOptions, TestPki};

/// 1 MiB at 100 KiB/s: a download of about ten seconds.
const SLOW_PATH: &str = "/slow/1m.bin";
const SLOW_RATE: &str = "100k";

fn nginx(pki: &Arc<TestPki>) -> NginxFixture {
    NginxFixture::start(NginxOptions {
        pki: Some(pki.clone()),
        extra_server: format!(
            "        location /slow/ {{ limit_rate {SLOW_RATE}; rewrite ^/slow/(.*)$ /$1 break; }}"
        ),
        ..Default::default()
    })
    .expect("nginx starts")
}

fn config(pki: &TestPki, port: u16, upstream: u16, extra: Value) -> Value {
    let leaf = pki.leaf("a.test");
    let mut c = json!({
        "port": port,
        "addresses": {"ipv4": "127.0.0.1", "ipv6": "::1"},
        "upstream": {"address": format!("127.0.0.1:{upstream}")},
        "hosts": [{"name": "a.test", "certFile": leaf.cert_path.display().to_string(),
                   "keyFile": leaf.key_path.display().to_string()}],
        "http": {"drainTimeoutSeconds": 30},
    });
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// tests/py/rollclient.py against the proxy, running for `secs`.
struct Clients {
    child: Child,
    ready: PathBuf,
    _dir: tempfile::TempDir,
}

impl Clients {
    fn start(pki: &TestPki, port: u16, secs: f64, slow: bool) -> Clients {
        Self::start_with(pki, port, secs, slow, &[])
    }

    fn start_with(pki: &TestPki, port: u16, secs: f64, slow: bool, extra: &[&str]) -> Clients {
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut cmd = Command::new(support::h3client::python());
        cmd.arg(support::repo_root().join("tests/py/rollclient.py"))
            .args(["--host", "a.test", "--port", &port.to_string()])
            .arg("--cacert")
            .arg(&pki.ca_cert_path)
            .args(["--duration", &secs.to_string()])
            .arg("--ready-file")
            .arg(&ready)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if slow {
            cmd.args(["--slow-path", SLOW_PATH]);
        }
        cmd.args(extra);
        let child = cmd.spawn().expect("python runs");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "rollclient.py did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Clients {
            child,
            ready,
            _dir: dir,
        }
    }

    fn report(self) -> Value {
        let out = self.child.wait_with_output().unwrap();
        assert!(out.status.success(), "rollclient.py failed: {out:?}");
        let _ = self.ready;
        serde_json::from_slice(&out.stdout).expect("rollclient.py prints JSON")
    }
}

fn failed(rows: &Value) -> Vec<&Value> {
    rows.as_array()
        .unwrap()
        .iter()
        .filter(|r| !r["error"].is_null())
        .collect()
}

/// Waits for `p` to exit; the moment it was seen gone.
fn exit_time(p: &mut ProxyProcess, timeout: Duration) -> Option<f64> {
    p.wait_exit(timeout).map(|s| {
        assert!(s.success(), "{s}: {}", p.log());
        now()
    })
}

/// The kept connection's requests: every one served in the end, and every attempt that
/// failed never reached nginx (the server had not processed it: a retry is safe).
fn check_kept(report: &Value, nginx: &NginxFixture) -> (usize, usize) {
    let kept = report["kept"].as_array().unwrap();
    let seen: HashSet<String> = nginx
        .access_log_entries()
        .iter()
        .filter_map(|e| e["uri"].as_str().map(str::to_string))
        .collect();
    let mut retried = 0;
    let mut logical = 0;
    for r in kept {
        let id = r["id"].as_str().unwrap();
        let uri = format!("/whoami?id={id}");
        if r["error"].is_null() {
            logical += 1;
            continue;
        }
        retried += 1;
        assert!(!seen.contains(&uri), "a failed attempt was processed: {r}");
        let retry = id.replace("-a1", "-a2");
        let ok = kept
            .iter()
            .any(|x| x["id"] == retry.as_str() && x["error"].is_null());
        assert!(ok, "{id} failed and its retry did not succeed: {kept:?}");
    }
    (logical, retried)
}

/// As the cluster scenarios judge it (`roll::kept_verdict` in tests/cluster/scenarios): a kept
/// connection ends only by the old process's close after GOAWAY (H3_NO_ERROR), or by the
/// client after a request was refused unprocessed (H3_REQUEST_REJECTED) or cut by that close;
/// anything else (a timeout, a response without headers) is a broken connection.
fn kept_ended_cleanly(close: &Value) -> bool {
    let reason = close["reason"].as_str().unwrap_or_default();
    match close["by"].as_str() {
        Some("peer") => close["code"] == 0x100 || close["code"] == 0,
        Some("local") => {
            reason.contains("stream reset (code 267)")
                || reason.contains("connection closed (code 256 ")
        }
        _ => false,
    }
}

#[test]
fn a_second_process_on_the_same_config_takes_over_without_a_failed_request() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki);
    let port = free_udp_port();
    // No keys file: the second process takes the first one's secret in the hand-over.
    let first_cfg = config(&pki, port, nginx.port(), json!({}));
    let mut first = ProxyProcess::start(first_cfg).expect("first proxy");
    let clients = Clients::start(&pki, port, 16.0, true);
    std::thread::sleep(Duration::from_secs(3));
    let asked = now();
    let second = first.start_again(2).expect("second proxy");
    let took_over = now();
    let first_gone = exit_time(&mut first, Duration::from_secs(40));
    let report = clients.report();

    let new = &report["new"];
    let fails = failed(new);
    let n_new = new.as_array().unwrap().len();
    assert!(n_new >= 60, "{n_new} new-connection requests");
    assert!(fails.is_empty(), "new connections failed: {fails:?}");
    // New connections never waited for the old process's drain (which lasts as long as the
    // slow download, 10 s); the bound leaves room for a loaded machine.
    let slowest = new
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(slowest < 3000.0, "a new connection took {slowest} ms");

    let (kept_ok, kept_retried) = check_kept(&report, &nginx);
    assert!(kept_ok >= 60, "{kept_ok} kept-connection requests");
    let conns = report["kept_connections"].as_array().unwrap();
    for c in &conns[..conns.len() - 1] {
        assert!(
            kept_ended_cleanly(&c["close"]),
            "kept connection ended otherwise: {c}"
        );
    }

    let slow = &report["slow"];
    assert!(slow["error"].is_null(), "slow download: {slow}");
    assert_eq!(slow["bytes"], 1 << 20);
    assert_eq!(slow["sha256"], nginx.content_sha256("/1m.bin"));
    let slow_end = slow["start"].as_f64().unwrap() + slow["ms"].as_f64().unwrap() / 1000.0;
    assert!(
        slow_end > took_over + 3.0,
        "the download did not span the take-over"
    );

    // The old process stayed for the download and left when it was done.
    let gone = first_gone.unwrap_or_else(|| panic!("first still running:\n{}", first.log()));
    assert!(
        gone >= slow_end - 0.3,
        "first exited before the download ended"
    );
    // Its last connection closing (quinn's draining state) and the exit, not the 30 s drain.
    assert!(
        gone <= slow_end + 5.0,
        "first exited {} s after its last connection",
        gone - slow_end
    );
    let log = first.log();
    assert!(log.contains("superseded by a newer process"), "{log}");
    let status = second.status();
    assert_eq!(status["rollout"]["role"], "newest", "{status}");
    assert_eq!(status["rollout"]["generations"], 1, "{status}");
    if std::env::var_os("H3I_SHOW_LOGS").is_some() {
        eprintln!("--- first\n{}\n--- second\n{}", first.log(), second.log());
    }
    eprintln!(
        "take-over after {:.2} s; new-connection requests {n_new} (0 failed, slowest {slowest:.0} ms); \
         kept-connection requests {kept_ok} ({kept_retried} attempts refused unprocessed and \
         retried, {} connections, ended by: {:?}); slow download {:.1} s; first exited {:.2} s \
         after it",
        took_over - asked,
        conns.len(),
        conns
            .iter()
            .map(|c| c["close"]["reason"].as_str().unwrap_or_default())
            .collect::<Vec<_>>(),
        slow["ms"].as_f64().unwrap() / 1000.0,
        gone - slow_end
    );
}

/// SIGKILL of the newest: the previous generation, still draining its slow download, takes
/// the new connections back as soon as the hub sees the death.
#[test]
fn sigkill_of_the_newest_gives_the_new_connections_back() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki);
    let port = free_udp_port();
    let mut first = ProxyProcess::start(config(&pki, port, nginx.port(), json!({}))).unwrap();
    // No kept connection: the one on the killed process would wait for its idle timeout
    // (aioquic ignores stateless resets; quinn does not, see the next test).
    let clients = Clients::start_with(&pki, port, 9.0, true, &["--no-kept"]);
    std::thread::sleep(Duration::from_secs(2));
    let second = first.start_again(2).expect("second proxy");
    std::thread::sleep(Duration::from_secs(2));
    second.signal(libc::SIGKILL);
    let killed = now();
    // The first one is the newest again: ready, and it does not exit when idle.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !first.probe("ready") {
        assert!(
            Instant::now() < deadline,
            "first not ready again:\n{}",
            first.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let back = now();
    let report = clients.report();
    let new = report["new"].as_array().unwrap();
    // Connections whose handshake was under way on the killed process die with it.
    let lost: Vec<&Value> = failed(&report["new"])
        .into_iter()
        .filter(|r| {
            let t = r["start"].as_f64().unwrap();
            !(killed - 0.5..killed + 0.1).contains(&t)
        })
        .collect();
    assert!(
        lost.is_empty(),
        "requests failed away from the kill: {lost:?}"
    );
    let after: Vec<&Value> = new
        .iter()
        .filter(|r| r["start"].as_f64().unwrap() > killed + 0.1)
        .collect();
    assert!(after.len() >= 15, "{} requests after the kill", after.len());
    let slow = &report["slow"];
    assert!(slow["error"].is_null(), "slow download: {slow}");
    assert_eq!(slow["sha256"], nginx.content_sha256("/1m.bin"));
    assert!(
        first.still_running(),
        "the first process exited:\n{}",
        first.log()
    );
    let status = first.status();
    assert_eq!(status["rollout"]["role"], "newest", "{status}");
    assert_eq!(status["rollout"]["generations"], 1, "{status}");
    assert!(
        first.log().contains("taking new connections again"),
        "{}",
        first.log()
    );
    eprintln!(
        "SIGKILL of the newest: the previous process ready again {:.0} ms later; {} new-connection \
         requests, {} failed at the kill, {} after it all served",
        (back - killed) * 1000.0,
        new.len(),
        failed(&report["new"]).len(),
        after.len()
    );
}

/// quinn (which checks stateless resets) downloading slowly from the first process; the second
/// takes over; SIGKILL of the first: the survivor resets the connection at once (the same keys:
/// inherited in the hand-over, no keys file), instead of leaving it to its idle timeout.
#[tokio::test(flavor = "multi_thread")]
async fn the_connections_of_a_killed_generation_are_reset_by_the_survivor() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki);
    let port = free_udp_port();
    let cfg = config(&pki, port, nginx.port(), json!({}));
    let first = ProxyProcess::start(cfg).unwrap();
    let ep = support::quic::any_certificate_client();
    let conn = ep
        .connect(([127, 0, 0, 1], port).into(), "a.test")
        .unwrap()
        .await
        .expect("handshake");
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .unwrap();
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let req = http::Request::get(format!("https://a.test:{port}{SLOW_PATH}"))
        .body(())
        .unwrap();
    let mut stream = send.send_request(req).await.unwrap();
    stream.finish().await.unwrap();
    assert_eq!(stream.recv_response().await.unwrap().status(), 200);
    let second = tokio::task::block_in_place(|| first.start_again(2)).expect("second proxy");
    let mut got = 0usize;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        got += stream.recv_data().await.unwrap().expect("data").remaining();
    }
    first.signal(libc::SIGKILL);
    let killed = Instant::now();
    // The client must send for the survivor to answer (a receiving client only acknowledges
    // what arrives): a reserved uni stream type, which HTTP/3 peers ignore.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if let Ok(mut s) = conn.open_uni().await {
        let _ = s.write_all(&[0x21, 0, 0, 0]).await;
    }
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.recv_data().await {
                Ok(Some(b)) => got += b.remaining(),
                Ok(None) => return None,
                Err(_) => return conn.close_reason(),
            }
        }
    })
    .await
    .expect("the connection ended within 10 s");
    let after = killed.elapsed();
    assert!(
        matches!(end, Some(quinn::ConnectionError::Reset)),
        "{end:?} after {after:?}"
    );
    assert!(after < Duration::from_secs(3), "reset after {after:?}");
    assert!(got > 0 && got < 1 << 20, "{got}");
    let status = tokio::task::block_in_place(|| second.status());
    assert_eq!(status["rollout"]["coordinating"], true, "{status}");
    assert_eq!(status["rollout"]["generations"], 1, "{status}");
    drive.abort();
    eprintln!(
        "stateless reset {} ms after the SIGKILL, {got} bytes in",
        after.as_millis()
    );
}

/// The roll from h3-ingress 0.1.0, whose sockets have no SO_REUSEPORT: the new process cannot
/// join them. It must not crash (a crash loop): it runs, answers startup, stays not ready
/// with the reason in the probe and `/status`, retries every second, and serves as soon as
/// the old sockets close.
#[test]
fn a_port_held_without_reuseport_keeps_the_new_process_waiting_not_crashing() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki);
    let port = free_udp_port();
    let held = std::net::UdpSocket::bind(("127.0.0.1", port)).expect("the old release's socket");
    let mut p = ProxyProcess::start_unready(config(&pki, port, nginx.port(), json!({}))).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(p.still_running(), "exited:\n{}", p.log());
    assert!(p.probe("live") && p.probe("startup"), "{}", p.log());
    let (ready, why) = p.probe_output("ready");
    assert!(!ready, "{why}");
    assert!(
        why.contains("no UDP socket bound") && why.contains("SO_REUSEPORT"),
        "{why}"
    );
    let status = p.status();
    let waiting = status["rollout"]["waiting"].as_str().unwrap_or_default();
    assert!(waiting.contains("retrying every second"), "{status}");
    let unready = support::proxy::http_get(p.admin, "/readyz").unwrap();
    assert_eq!(unready.0, 503, "{unready:?}");
    drop(held);
    let released = Instant::now();
    while !p.probe("ready") {
        assert!(
            released.elapsed() < Duration::from_secs(10),
            "not ready after the port was released:\n{}",
            p.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let served = support::h3client::H3Client::new(format!("https://a.test:{port}/whoami"))
        .resolve(format!("a.test:{port}:127.0.0.1"))
        .cacert(&pki.ca_cert_path)
        .run()
        .unwrap();
    assert_eq!(served.request(0)["status"], 200, "{:?}", served.json);
    let warned = p.log().matches("UDP sockets not bound").count();
    assert_eq!(warned, 1, "the retry is logged once:\n{}", p.log());
    eprintln!(
        "port held without SO_REUSEPORT: waited, not ready, served {} ms after the release",
        released.elapsed().as_millis()
    );
}

/// A configuration for an in-process proxy on `port`, loopback only, one self-signed host.
fn in_process_config(port: u16) -> h3_ingress::config::ProxyConfig {
    use h3_ingress::config::{self, HostEntry, HostTable};
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let yaml = format!(
        "port: {port}\naddresses: {{ipv4: 127.0.0.1, ipv6: null}}\n\
         metrics: {{address: '127.0.0.1:0'}}\nupstream: {{address: '127.0.0.1:9'}}\n\
         http: {{drainTimeoutSeconds: 2}}\n"
    );
    let file: h3_ingress::api::FileConfig = serde_norway::from_str(&yaml).unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["a.test".to_string()]).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let mut table = HostTable::default();
    let now = config::file::unix_now();
    table.insert(HostEntry::from_der("a.test", vec![ck.cert.der().clone()], key, now).unwrap());
    config::build(file.listener_settings(), &[], table, "").unwrap()
}

/// One in-process generation: its task, its shutdown token, what it shares.
struct InProcess {
    task: tokio::task::JoinHandle<Result<(), h3_ingress::proxy::ProxyError>>,
    shutdown: tokio_util::sync::CancellationToken,
    running: h3_ingress::proxy::RunningProxy,
    _updates: tokio::sync::mpsc::Sender<h3_ingress::proxy::ConfigUpdate>,
}

async fn in_process(port: u16, when: h3_ingress::proxy::WhenSuperseded) -> InProcess {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (updates, updates_rx) = tokio::sync::mpsc::channel(1);
    let shutdown = tokio_util::sync::CancellationToken::new();
    let opts = h3_ingress::proxy::ServeOptions {
        when_superseded: when,
        ..Default::default()
    };
    let cfg = in_process_config(port);
    let task = tokio::spawn(h3_ingress::proxy::serve(
        cfg,
        updates_rx,
        shutdown.clone(),
        Some(tx),
        opts,
    ));
    let running = rx.await.expect("the proxy runs");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running.shared.is_ready() {
        assert!(Instant::now() < deadline, "not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    InProcess {
        task,
        shutdown,
        running,
        _updates: updates,
    }
}

/// Superseded and idle: standalone, the process exits by itself; under Kubernetes it never
/// does (the kubelet would restart the container) and waits for SIGTERM, still ready: the
/// newer process serves its node, and the DaemonSet controller counts a node by its oldest
/// pod.
#[tokio::test(flavor = "multi_thread")]
async fn a_superseded_process_exits_standalone_and_waits_for_sigterm_under_kubernetes() {
    use h3_ingress::proxy::WhenSuperseded;
    for when in [WhenSuperseded::Exit, WhenSuperseded::AwaitSignal] {
        let port = free_udp_port();
        let old = in_process(port, when).await;
        let new = in_process(port, WhenSuperseded::AwaitSignal).await;
        let rollout = |p: &InProcess| p.running.shared.rollout().unwrap();
        // Ready is the process's own view; the role follows once the hub has the news.
        let deadline = Instant::now() + Duration::from_secs(5);
        while rollout(&new).role != "newest" {
            assert!(Instant::now() < deadline, "{:?}", rollout(&new));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let (mut old_task, old_shutdown) = (old.task, old.shutdown);
        let ended = tokio::time::timeout(Duration::from_secs(4), &mut old_task).await;
        match when {
            WhenSuperseded::Exit => {
                ended.expect("exited on its own").unwrap().unwrap();
            }
            WhenSuperseded::AwaitSignal => {
                ended.expect_err("still running after 4 s, idle");
                assert_eq!(rollout(&new).generations, 2, "{:?}", rollout(&new));
                let r = &old.running.shared;
                assert_eq!(r.rollout().unwrap().role, "superseded");
                assert_eq!(r.readiness().map_err(|e| r.not_ready_text(e)), Ok(()));
                old_shutdown.cancel();
                let done = tokio::time::timeout(Duration::from_secs(5), old_task).await;
                done.expect("exits on SIGTERM").unwrap().unwrap();
            }
        }
        // The survivor coordinates alone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while rollout(&new).generations != 1 || !rollout(&new).coordinating {
            assert!(Instant::now() < deadline, "{:?}", rollout(&new));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        new.shutdown.cancel();
        new.task.await.unwrap().unwrap();
    }
}

/// A UDP path between one client and the proxy that can drop everything the proxy sends (a
/// lossy path, held as long as the test likes): the proxy has then sent responses and a
/// GOAWAY the client does not have, and the client's requests still arrive.
struct LossyPath {
    addr: std::net::SocketAddr,
    drop_answers: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl LossyPath {
    async fn start(server: std::net::SocketAddr) -> LossyPath {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tokio::net::UdpSocket;
        let front = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        let back = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
        back.connect(server).await.unwrap();
        let addr = front.local_addr().unwrap();
        let drop_answers = Arc::new(AtomicBool::new(false));
        let client = Arc::new(std::sync::Mutex::new(None));
        let (f, b, c) = (front.clone(), back.clone(), client.clone());
        let up = async move {
            let mut buf = vec![0u8; 65_536];
            while let Ok((n, from)) = f.recv_from(&mut buf).await {
                *c.lock().unwrap() = Some(from);
                let _ = b.send(&buf[..n]).await;
            }
        };
        let dropping = drop_answers.clone();
        let down = async move {
            let mut buf = vec![0u8; 65_536];
            loop {
                // An ICMP error (the proxy has exited) fails one receive; go on.
                let Ok(n) = back.recv(&mut buf).await else {
                    continue;
                };
                let to = *client.lock().unwrap();
                if let (false, Some(to)) = (dropping.load(Ordering::SeqCst), to) {
                    let _ = front.send_to(&buf[..n], to).await;
                }
            }
        };
        let task = tokio::spawn(async move {
            tokio::join!(up, down);
        });
        LossyPath {
            addr,
            drop_answers,
            task,
        }
    }

    fn drop_answers(&self, on: bool) {
        self.drop_answers
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }
}

type SendRequest = h3::client::SendRequest<h3_quinn::OpenStreams, bytes::Bytes>;

/// How one request ended, as a client deciding about a retry sees it.
#[derive(Debug, PartialEq)]
enum Outcome {
    Status(u16),
    /// The server said it did not process it (H3_REQUEST_REJECTED, or a connection closed
    /// with H3_NO_ERROR after GOAWAY): safe to retry.
    Unprocessed(String),
    Failed(String),
}

/// GET /whoami?id=`id` on `send`, within 10 s.
async fn whoami(mut send: SendRequest, port: u16, id: &str) -> Outcome {
    let req = http::Request::get(format!("https://a.test:{port}/whoami?id={id}"))
        .body(())
        .unwrap();
    let go = async {
        let mut s = send.send_request(req).await?;
        s.finish().await?;
        let status = s.recv_response().await?.status().as_u16();
        while s.recv_data().await?.is_some() {}
        Ok::<_, h3::error::StreamError>(status)
    };
    match tokio::time::timeout(Duration::from_secs(10), go).await {
        Ok(Ok(status)) => Outcome::Status(status),
        Ok(Err(e)) if refused_unprocessed(&e) => Outcome::Unprocessed(format!("{e:?}")),
        Ok(Err(e)) => Outcome::Failed(format!("{e:?}")),
        Err(_) => Outcome::Failed("no answer within 10 s".into()),
    }
}

fn refused_unprocessed(e: &h3::error::StreamError) -> bool {
    matches!(e, h3::error::StreamError::RemoteTerminate { code, .. } if *code == h3::error::Code::H3_REQUEST_REJECTED)
        || e.is_h3_no_error()
}

/// The drain must not lose a response the client has not received yet, nor process a request
/// it told the client (GOAWAY) it would not: a request is answered by the proxy, nginx has
/// served it, but the path drops the answer; SIGTERM drains the proxy (GOAWAY, dropped too);
/// the client, which has heard nothing, sends one more request (its stream ID is the GOAWAY's);
/// then the path recovers. The first request must get its 200 (the proxy keeps the connection
/// until the client has acknowledged it), the second must be refused unprocessed and never
/// reach nginx.
#[tokio::test(flavor = "multi_thread")]
async fn the_drain_keeps_unacknowledged_responses_and_refuses_requests_at_the_goaway_id() {
    let pki = Arc::new(TestPki::generate().unwrap());
    let nginx = nginx(&pki);
    let port = free_udp_port();
    let cfg = config(&pki, port, nginx.port(), json!({}));
    let mut proxy = tokio::task::block_in_place(|| ProxyProcess::start(cfg)).unwrap();
    let path = LossyPath::start(([127, 0, 0, 1], port).into()).await;
    let ep = support::quic::any_certificate_client();
    let conn = ep
        .connect(path.addr, "a.test")
        .unwrap()
        .await
        .expect("handshake");
    let (mut driver, send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .unwrap();
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    assert_eq!(
        whoami(send.clone(), port, "drain-1").await,
        Outcome::Status(200)
    );

    path.drop_answers(true);
    let second = tokio::spawn(whoami(send.clone(), port, "drain-2"));
    let seen = |id: &str| {
        let uri = format!("/whoami?id={id}");
        move |entries: &[Value]| entries.iter().any(|e| e["uri"] == uri.as_str())
    };
    tokio::task::block_in_place(|| {
        nginx.wait_for_access_log(Duration::from_secs(5), seen("drain-2"))
    });
    // The proxy relays the answer (into the void) and its request task ends.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.signal(libc::SIGTERM);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let third = tokio::spawn(whoami(send.clone(), port, "drain-3"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    path.drop_answers(false);

    let second = second.await.unwrap();
    let third = third.await.unwrap();
    // nginx logs a request once it has answered it; give a late one time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let processed_third = seen("drain-3")(&nginx.access_log_entries());
    let exited = tokio::task::block_in_place(|| proxy.wait_exit(Duration::from_secs(10)));
    let log = proxy.log();
    assert_eq!(
        second,
        Outcome::Status(200),
        "a request nginx served lost its response in the drain\n{log}"
    );
    assert!(
        !processed_third,
        "a request at or above the GOAWAY ID was processed: {third:?}\n{log}"
    );
    assert!(
        matches!(third, Outcome::Unprocessed(_)),
        "the request after GOAWAY: {third:?}\n{log}"
    );
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}\n{log}");
    drive.abort();
    path.task.abort();
    eprintln!("drain across a lossy path: the answered request got its 200, the one at the GOAWAY ID was refused ({third:?})");
}
