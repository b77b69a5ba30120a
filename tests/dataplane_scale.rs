//! The data plane at scale: 10,000 certificate mirrors, each with its own real certificate
//! (ECDSA P-256 and RSA-2048, issued by one test CA), fed to the real `h3-ingress proxy
//! --listener` process by a local API server that speaks the list (paginated) + watch
//! protocol over HTTP. Prints a table: the pure core's parse time, the time from process start
//! to `/readyz` (every mirror loaded and served), the process's peak and steady RSS, the time a
//! rotated mirror takes to be applied, and the series of one scrape after a request to every
//! host over HTTP/3.
//!
//! A benchmark, not a unit test: run it in release mode on an idle machine,
//!
//!     cargo test --release --test dataplane_scale -- --ignored --nocapture
//!
//! `H3I_BENCH_MIRRORS` (default 10000) sets the number of mirrors, `H3I_BENCH_RSA_KEYS`
//! (default 200) the RSA keys generated with openssl (cached under `target/bench-rsa-keys`,
//! RSA key generation takes a second each); every other mirror is RSA and reuses one of them,
//! with its own certificate. `H3I_BENCH_REQUESTS=0` skips the requests.

mod support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use h3_ingress::api::mirror;
use h3_ingress::config::mirrors::{self, MirrorInput};

const NS: &str = "h3-hosts";
const LISTENER: &str = "bench";
const LISTENERS: &str = "/apis/h3-ingress.dev/v1alpha1/http3listeners";
const MIRRORS: &str = "/api/v1/namespaces/h3-hosts/secrets";

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One mirror as the harness made it: the Secret's JSON and what `mirrors::parse` reads.
struct Made {
    name: String,
    host: String,
    json: Bytes,
    input: MirrorInput,
}

/// RSA-2048 keys from openssl, generated once and kept under `target/`.
fn rsa_keys(n: usize) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-rsa-keys");
    std::fs::create_dir_all(&dir).unwrap();
    let path = |i: usize| dir.join(format!("rsa-2048-{i}.pem"));
    let missing: Vec<PathBuf> = (0..n).map(path).filter(|p| !p.exists()).collect();
    if !missing.is_empty() {
        eprintln!(
            "generating {} RSA-2048 keys with openssl (cached)",
            missing.len()
        );
    }
    for chunk in missing.chunks(4) {
        let children: Vec<Child> = chunk
            .iter()
            .map(|p| {
                Command::new("openssl")
                    .args([
                        "genpkey",
                        "-algorithm",
                        "RSA",
                        "-pkeyopt",
                        "rsa_keygen_bits:2048",
                    ])
                    .arg("-out")
                    .arg(p)
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("openssl is installed (scripts/setup.sh)")
            })
            .collect();
        for mut c in children {
            assert!(c.wait().unwrap().success(), "openssl genpkey failed");
        }
    }
    (0..n)
        .map(|i| std::fs::read_to_string(path(i)).unwrap())
        .collect()
}

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "h3-ingress scale test CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// Mirror `i`: host `h{i}.ns{i/4}.scale.test` (four hosts per namespace, as the issue's 10,000
/// hosts in 2,500 namespaces), its own certificate, ECDSA for even `i`, RSA for odd.
fn make(i: usize, rv: u64, ca: &CertifiedIssuer<'static, KeyPair>, rsa: &[String]) -> Made {
    let host = format!("h{i}.ns{}.scale.test", i / 4);
    let key = if i % 2 == 0 || rsa.is_empty() {
        KeyPair::generate().unwrap()
    } else {
        KeyPair::from_pem(&rsa[(i / 2) % rsa.len()]).unwrap()
    };
    let mut params = CertificateParams::new(vec![host.clone()]).unwrap();
    params.distinguished_name.push(DnType::CommonName, &host);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params.signed_by(&key, ca).unwrap();
    let chain = format!("{}{}", cert.pem(), ca.pem());
    let name = format!("{LISTENER}-{i:016x}");
    let source = format!("ns{}/web-{i}-tls", i / 4);
    let hosts =
        json!({"hosts": [{"name": host, "source": format!("Ingress ns{}/web-{i}", i / 4)}]})
            .to_string();
    let b64 = |s: &str| support::base64(s.as_bytes());
    let value = json!({"apiVersion": "v1", "kind": "Secret", "type": mirror::SECRET_TYPE,
        "metadata": {"name": name, "namespace": NS, "resourceVersion": rv.to_string(),
                     "labels": {mirror::LISTENER_LABEL: LISTENER},
                     "annotations": {mirror::SOURCE_ANNOTATION: source}},
        "data": {mirror::CERT_KEY: b64(&chain), mirror::KEY_KEY: b64(&key.serialize_pem()),
                 mirror::HOSTS_KEY: b64(&hosts)}});
    Made {
        input: MirrorInput {
            name: name.clone(),
            resource_version: rv.to_string(),
            source,
            cert: Some(chain.into_bytes()),
            key: Some(key.serialize_pem().into_bytes()),
            hosts: Some(hosts.into_bytes()),
        },
        name,
        host,
        json: Bytes::from(serde_json::to_vec(&value).unwrap()),
    }
}

/// The pure core's parse time over every mirror: on one thread, and on every core as the
/// source does.
fn parse_times(made: &[Made]) -> (Duration, Duration) {
    let inputs: Vec<MirrorInput> = made.iter().map(|m| m.input.clone()).collect();
    let t = Instant::now();
    for i in inputs.iter().cloned() {
        let m = mirrors::parse(i);
        assert!(m.problem.is_none(), "{:?}", m.problem);
    }
    let one = t.elapsed();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let chunk = inputs.len().div_ceil(cores).max(1);
    let t = Instant::now();
    std::thread::scope(|s| {
        for part in inputs.chunks(chunk) {
            s.spawn(move || part.iter().cloned().map(mirrors::parse).count());
        }
    });
    (one, t.elapsed())
}

/// What the local API server serves.
struct Api {
    listener: Bytes,
    mirrors: Vec<Bytes>,
    mirror_watch: Option<mpsc::UnboundedSender<Bytes>>,
    /// Held so the listener's watch stays open.
    listener_watch: Option<mpsc::UnboundedSender<Bytes>>,
    requests: BTreeMap<String, u64>,
}

type Body = http_body_util::combinators::BoxBody<Bytes, Infallible>;

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// A page of a list: items from `continue` (an index), at most `limit`.
fn page(items: &[Bytes], query: &str) -> Bytes {
    let start: usize = query_param(query, "continue").map_or(0, |c| c.parse().unwrap());
    let limit: usize = query_param(query, "limit").map_or(items.len(), |l| l.parse().unwrap());
    let end = (start + limit).min(items.len());
    let cont = if end < items.len() {
        format!(",\"continue\":\"{end}\"")
    } else {
        String::new()
    };
    let mut out = format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"List\",\"metadata\":{{\"resourceVersion\":\"1\"{cont}}},\"items\":["
    )
    .into_bytes();
    for (n, item) in items[start..end].iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

fn answer(api: &Mutex<Api>, req: &http::Request<hyper::body::Incoming>) -> http::Response<Body> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let watch = query.contains("watch=true");
    let mut a = api.lock().unwrap();
    *a.requests
        .entry(format!("{path} watch={watch}"))
        .or_default() += 1;
    let full = |b: Bytes| Full::new(b).boxed();
    let body = match (path.as_str(), watch) {
        (LISTENERS, false) => full(page(std::slice::from_ref(&a.listener), "")),
        (MIRRORS, false) => full(page(&a.mirrors, &query)),
        (LISTENERS, true) | (MIRRORS, true) => {
            let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
            if path == MIRRORS {
                a.mirror_watch = Some(tx);
            } else {
                a.listener_watch = Some(tx);
            }
            let s = futures_util::stream::unfold(rx, |mut rx| async move {
                let b = rx.recv().await?;
                Some((Ok::<_, Infallible>(http_body::Frame::data(b)), rx))
            });
            StreamBody::new(s).boxed()
        }
        _ => {
            return http::Response::builder()
                .status(404)
                .body(full(Bytes::from_static(b"{}")))
                .unwrap()
        }
    };
    http::Response::builder()
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

async fn serve_api(api: Arc<Mutex<Api>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            let api = api.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let resp = answer(&api, &req);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

/// A plain-HTTP stand-in for the TCP ingress.
async fn upstream() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    addr
}

fn kubeconfig(dir: &Path, api: SocketAddr) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster: {{server: 'http://{api}'}}\n\
         users:\n- name: bench\n  user: {{}}\ncontexts:\n- name: bench\n  context: {{cluster: bench, user: bench}}\n\
         current-context: bench\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// RSS and open descriptors of the process at a few points after the requests: the QUIC
/// connections close at once, idle upstream connections after the pool's idle timeout.
fn settle(pid: u32, requested: bool) -> Vec<(u64, f64, usize)> {
    // The pool evicts connections idle for 60 s at its next 60 s tick.
    let points: &[u64] = if requested { &[2, 35, 125] } else { &[2] };
    let start = Instant::now();
    points
        .iter()
        .map(|&secs| {
            std::thread::sleep(Duration::from_secs(secs).saturating_sub(start.elapsed()));
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
            (secs, rss_mib(pid).0, fds)
        })
        .collect()
}

/// `VmRSS` and `VmHWM` (peak) of a process, in MiB.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn admin_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).await.ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// The applied mirrors' digest, as the pod reports it on `/status`.
async fn applied_digest(admin: SocketAddr) -> String {
    let Some((200, body)) = admin_get(admin, "/status").await else {
        return String::new();
    };
    let v: Value = serde_json::from_str(&body).unwrap();
    v["mirrors"]["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// One HTTP/3 request to `host` on its own connection (the proxy answers a host only on a
/// connection whose SNI names it).
async fn request(ep: &quinn::Endpoint, addr: SocketAddr, host: &str) -> bool {
    let Ok(connecting) = ep.connect(addr, host) else {
        return false;
    };
    let Ok(conn) = connecting.await else {
        return false;
    };
    let Ok((mut driver, mut send)) = h3::client::new(h3_quinn::Connection::new(conn.clone())).await
    else {
        return false;
    };
    let drive = tokio::spawn(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    let req = http::Request::get(format!("https://{host}/"))
        .body(())
        .unwrap();
    let ok = async {
        let mut s = send.send_request(req).await.ok()?;
        s.finish().await.ok()?;
        let resp = s.recv_response().await.ok()?;
        while s.recv_data().await.ok()?.is_some() {}
        Some(resp.status() == 200)
    }
    .await
    .unwrap_or(false);
    conn.close(0u32.into(), b"done");
    drive.abort();
    ok
}

/// A request to every host, 32 at a time; how many succeeded.
async fn request_every_host(addr: SocketAddr, hosts: Vec<String>) -> usize {
    let ep = support::quic::any_certificate_client();
    let hosts = Arc::new(Mutex::new(hosts));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let (ep, hosts) = (ep.clone(), hosts.clone());
        tasks.spawn(async move {
            let mut ok = 0;
            loop {
                let Some(h) = hosts.lock().unwrap().pop() else {
                    return ok;
                };
                ok += usize::from(request(&ep, addr, &h).await);
            }
        });
    }
    let mut ok = 0;
    while let Some(n) = tasks.join_next().await {
        ok += n.unwrap();
    }
    ok
}

struct Figures {
    mirrors: usize,
    rsa: usize,
    parse_one: Duration,
    parse_all: Duration,
    ready: Duration,
    listed_ms: String,
    rss_ready: (f64, f64),
    rotations: Vec<Duration>,
    requested: Option<(usize, usize)>,
    /// After the requests: seconds since the last one, RSS now, open descriptors.
    rss_after: Vec<(u64, f64, usize)>,
    peak: f64,
    series: usize,
}

fn print(f: &Figures) {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let mut rot = f.rotations.clone();
    rot.sort();
    println!("\n| figure | value |\n|---|---|");
    println!(
        "| mirrors (one host, one certificate each) | {} ({} RSA-2048, {} ECDSA P-256) |",
        f.mirrors,
        f.rsa,
        f.mirrors - f.rsa
    );
    println!(
        "| pure core: parse every mirror, one thread | {} ({:.0} µs per mirror) |",
        ms(f.parse_one),
        f.parse_one.as_secs_f64() * 1e6 / f.mirrors as f64
    );
    println!(
        "| pure core: parse every mirror, {} threads | {} |",
        std::thread::available_parallelism().map_or(2, |n| n.get()),
        ms(f.parse_all)
    );
    println!(
        "| process: first list and parse (its log) | {} ms |",
        f.listed_ms
    );
    println!(
        "| process: start to /readyz 200 (every host served) | {} |",
        ms(f.ready)
    );
    println!(
        "| RSS at ready (now / peak) | {:.0} / {:.0} MiB |",
        f.rss_ready.0, f.rss_ready.1
    );
    if let Some(m) = rot.get(rot.len() / 2) {
        println!(
            "| rotated mirror to applied (median of {}) | {} |",
            rot.len(),
            ms(*m)
        );
    }
    if let Some((ok, n)) = f.requested {
        println!(
            "| HTTP/3 requests, one per host on its own connection | {ok} of {n} answered 200 |"
        );
    }
    for (secs, rss, fds) in &f.rss_after {
        println!("| RSS {secs} s after the last request | {rss:.0} MiB ({fds} open descriptors) |");
    }
    println!("| peak RSS of the whole run | {:.0} MiB |", f.peak);
    println!("| series in one /metrics scrape | {} |", f.series);
}

/// Waits for `/readyz` 200; panics after `limit` or when the process exits.
fn wait_ready(
    child: &mut Child,
    admin: SocketAddr,
    limit: Duration,
    rt: &tokio::runtime::Runtime,
) -> Duration {
    let start = Instant::now();
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the proxy exited");
        if let Some((200, _)) = rt.block_on(admin_get(admin, "/readyz")) {
            break;
        }
        assert!(start.elapsed() < limit, "not ready after {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

#[test]
#[ignore = "benchmark: cargo test --release --test dataplane_scale -- --ignored --nocapture"]
fn ten_thousand_mirrors() {
    let n = env_usize("H3I_BENCH_MIRRORS", 10_000);
    let rsa = rsa_keys(env_usize("H3I_BENCH_RSA_KEYS", 200));
    let ca = ca();
    let t = Instant::now();
    let made: Vec<Made> = (0..n).map(|i| make(i, 1, &ca, &rsa)).collect();
    eprintln!("{n} mirrors made in {:?}", t.elapsed());
    let (parse_one, parse_all) = parse_times(&made);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let port = support::free_udp_port();
    let admin: SocketAddr = format!("127.0.0.1:{}", support::free_tcp_port())
        .parse()
        .unwrap();
    let up = rt.block_on(upstream());
    let listener = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
        "metadata": {"name": LISTENER, "resourceVersion": "1", "uid": "u1", "generation": 1},
        "spec": {"ingressClassName": "nginx", "port": port,
                 "addresses": {"ipv4": "127.0.0.1", "ipv6": null},
                 "upstream": {"address": up.to_string(), "tls": false},
                 "metrics": {"address": admin.to_string()}}});
    let api = Arc::new(Mutex::new(Api {
        listener: Bytes::from(serde_json::to_vec(&listener).unwrap()),
        mirrors: made.iter().map(|m| m.json.clone()).collect(),
        mirror_watch: None,
        listener_watch: None,
        requests: BTreeMap::new(),
    }));
    let api_addr = rt.block_on(serve_api(api.clone()));
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("proxy.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_h3-ingress"))
        .args(["proxy", "--listener", LISTENER, "--hosts-namespace", NS])
        // Its own probe socket, not the pod default in the machine's shared /tmp.
        .arg("--probe-socket")
        .arg(dir.path().join("probe.sock"))
        .env("KUBECONFIG", kubeconfig(dir.path(), api_addr))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id();
    let ready = wait_ready(&mut child, admin, Duration::from_secs(120), &rt);
    let log = std::fs::read_to_string(&log_path).unwrap();
    let listed_ms = log
        .lines()
        .find(|l| l.contains("certificate mirrors listed"))
        .and_then(|l| l.split("elapsed_ms=").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    std::thread::sleep(Duration::from_secs(3));
    let rss_ready = rss_mib(pid);
    let rotations = rt.block_on(rotate(&api, admin, &made, &ca, &rsa));
    let requested = (env_usize("H3I_BENCH_REQUESTS", 1) == 1).then(|| {
        let hosts: Vec<String> = made.iter().map(|m| m.host.clone()).collect();
        let ok = rt.block_on(request_every_host(
            format!("127.0.0.1:{port}").parse().unwrap(),
            hosts,
        ));
        (ok, n)
    });
    let (_, metrics) = rt.block_on(admin_get(admin, "/metrics")).unwrap();
    let series = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .count();
    let rss_after = settle(pid, requested.is_some());
    let peak = rss_mib(pid).1;
    let _ = child.kill();
    let _ = child.wait();
    let requests = api.lock().unwrap().requests.clone();
    println!("\nAPI requests of the proxy: {requests:?}");
    print(&Figures {
        mirrors: n,
        rsa: n / 2,
        parse_one,
        parse_all,
        ready,
        listed_ms,
        rss_ready,
        rotations,
        requested,
        rss_after,
        peak,
        series,
    });
    assert!(
        requests
            .keys()
            .all(|k| k.starts_with(LISTENERS) || k.starts_with(MIRRORS)),
        "{requests:?}"
    );
    if let Some((ok, n)) = requested {
        assert_eq!(ok, n, "every host answers");
    }
}

/// Rotates five mirrors one at a time through the watch; the time from the event to the
/// digest on `/status` naming the new resourceVersion, for each.
async fn rotate(
    api: &Mutex<Api>,
    admin: SocketAddr,
    made: &[Made],
    ca: &CertifiedIssuer<'static, KeyPair>,
    rsa: &[String],
) -> Vec<Duration> {
    let mut versions: Vec<(String, String)> = made
        .iter()
        .map(|m| (m.name.clone(), "1".to_string()))
        .collect();
    let mut out = Vec::new();
    for round in 0..5u64 {
        let i = (round as usize * 997) % made.len();
        let next = make(i, 2 + round, ca, rsa);
        versions[i].1 = (2 + round).to_string();
        let want = mirror::digest(versions.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let mut line = br#"{"type":"MODIFIED","object":"#.to_vec();
        line.extend_from_slice(&next.json);
        line.extend_from_slice(b"}\n");
        let tx = api
            .lock()
            .unwrap()
            .mirror_watch
            .clone()
            .expect("the proxy watches its mirrors");
        let t = Instant::now();
        tx.send(Bytes::from(line)).unwrap();
        while applied_digest(admin).await != want {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "rotation {round} never applied"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        out.push(t.elapsed());
    }
    out
}
