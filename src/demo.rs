//! `h3-ingress demo`: the whole product on localhost with no cluster and no files.
//!
//! A built-in HTTPS server (TCP, h2 and HTTP/1.1) stands in for the existing ingress; the
//! HTTP/3 proxy runs in front of it on the same port number over UDP, with a generated
//! self-signed certificate; then `check` fetches over both protocols and compares.

use std::convert::Infallible;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::api::{FileConfig, Upstream as UpstreamSettings};
use crate::check::{CheckOptions, CheckReport};
use crate::config::{self, HostEntry, HostTable, ProxyConfig};
use crate::fds::{AcceptBackoff, AcceptSocket};
use crate::proxy::{self, RunningProxy};

pub const DEMO_HOST: &str = "localhost";
/// Preferred port (TCP for the stand-in ingress, UDP for us); a free one is used if taken.
pub const DEMO_PORT: u16 = 8443;

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("generating the demo certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("demo configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error("demo host: {0}")]
    Host(#[from] config::HostError),
    #[error("stand-in ingress: {0}")]
    Io(#[from] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error(transparent)]
    Proxy(#[from] proxy::ProxyError),
    #[error(transparent)]
    Check(#[from] crate::check::CheckError),
    #[error("the proxy stopped before it was ready")]
    NotReady,
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
}

/// A deterministic 1 MiB body, so both protocols can be compared by hash.
pub fn demo_blob() -> Bytes {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v = Vec::with_capacity(1 << 20);
    while v.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    Bytes::from(v)
}

/// Binds TCP on both loopback addresses with the same port, preferring `preferred`.
async fn bind_pair(preferred: u16) -> std::io::Result<(TcpListener, Option<TcpListener>, u16)> {
    for port in [preferred, 0] {
        let Ok(v4) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).await else {
            continue;
        };
        let port = v4.local_addr()?.port();
        // UDP of the same number must be free too, for the proxy.
        let udp_free = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok();
        if !udp_free {
            continue;
        }
        let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port)).await.ok();
        return Ok((v4, v6, port));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        "no free port pair",
    ))
}

async fn serve_ingress(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    port: u16,
    blob: Bytes,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let mut backoff = AcceptBackoff::new(AcceptSocket::Ingress);
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => {
                backoff.accepted();
                tcp
            }
            Err(e) => {
                tokio::time::sleep(backoff.failed(&e)).await;
                continue;
            }
        };
        // Without it Nagle holds the tail of a response until the client's delayed ACK
        // (40 ms on Linux): a stall that would be blamed on whichever protocol hit it.
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let blob = blob.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = service_fn(move |req: Request<Incoming>| {
                let blob = blob.clone();
                async move { Ok::<_, Infallible>(ingress_response(&req, port, blob)) }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn ingress_response(req: &Request<Incoming>, port: u16, blob: Bytes) -> Response<Full<Bytes>> {
    let via = req
        .headers()
        .get(header::VIA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let xff = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_string();
    let (status, ctype, body) = match req.uri().path() {
        "/1m.bin" => (StatusCode::OK, "application/octet-stream", blob),
        "/" => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from(format!(
                "hello from the stand-in TCP ingress\nrequest arrived as {:?}, via: {via}, x-forwarded-for: {xff}\n",
                req.version()
            )),
        ),
        _ => (StatusCode::NOT_FOUND, "text/plain", Bytes::from_static(b"not found\n")),
    };
    let len = body.len();
    // HEAD gets the headers of GET and no body (RFC 9110 9.3.2).
    let body = if req.method() == http::Method::HEAD {
        Bytes::new()
    } else {
        body
    };
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, ctype)
        .header(header::CONTENT_LENGTH, len)
        // What the real ingress must send so browsers find HTTP/3.
        .header(header::ALT_SVC, format!("h3=\":{port}\"; ma=86400"))
        .body(Full::new(body))
        .expect("static response parts are valid")
}

/// Starts the stand-in ingress and the proxy; returns once both serve.
pub async fn start(
    shutdown: CancellationToken,
) -> Result<(RunningProxy, u16, std::path::PathBuf), DemoError> {
    let ck = rcgen::generate_simple_self_signed(vec![DEMO_HOST.to_string()])?;
    // The check verifies against this certificate instead of switching verification off.
    let ca_path = std::env::temp_dir().join(format!("h3-ingress-demo-{}.pem", std::process::id()));
    std::fs::write(&ca_path, ck.cert.pem())?;
    let cert_der: CertificateDer<'static> = ck.cert.der().clone();
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));

    let (v4, v6, port) = bind_pair(DEMO_PORT).await?;
    let mut tls = rustls::ServerConfig::builder_with_provider(crate::pki::provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(vec![cert_der.clone()], key_der.clone_key())?;
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let tls = Arc::new(tls);
    let blob = demo_blob();
    tokio::spawn(serve_ingress(v4, tls.clone(), port, blob.clone()));
    let has_v6 = v6.is_some();
    if let Some(v6) = v6 {
        tokio::spawn(serve_ingress(v6, tls, port, blob));
    }

    let mut file: FileConfig = serde_norway::from_str(&format!(
        "upstream: {{address: '127.0.0.1:{port}'}}\nmetrics: {{address: '127.0.0.1:0'}}"
    ))
    .expect("built-in demo config parses");
    file.port = port;
    file.addresses.ipv4 = Some("127.0.0.1".into());
    file.addresses.ipv6 = has_v6.then(|| "::1".to_string());
    file.upstream = UpstreamSettings {
        address: format!("127.0.0.1:{port}"),
        ..file.upstream
    };
    let mut hosts = HostTable::default();
    hosts.insert(HostEntry::from_der(
        DEMO_HOST,
        vec![cert_der],
        key_der,
        config::file::unix_now(),
    )?);
    let cfg: ProxyConfig = config::build(file.listener_settings(), &[], hosts, "")?;

    let (ready_tx, ready_rx) = oneshot::channel();
    let (_updates_tx, updates_rx) = mpsc::channel(1);
    let sd = shutdown.clone();
    tokio::spawn(async move {
        // Keep the sender alive for the proxy's lifetime: the demo never reloads.
        let _keep = _updates_tx;
        if let Err(e) = proxy::serve(
            cfg,
            updates_rx,
            sd.clone(),
            Some(ready_tx),
            Default::default(),
        )
        .await
        {
            tracing::error!("proxy failed: {e}");
            sd.cancel();
        }
    });
    let running = ready_rx.await.map_err(|_| DemoError::NotReady)?;
    Ok((running, port, ca_path))
}

/// Runs the demo check against a started demo.
pub async fn check(port: u16, ca: &std::path::Path) -> Result<CheckReport, DemoError> {
    let opts = CheckOptions {
        url: format!("https://{DEMO_HOST}:{port}/1m.bin"),
        resolve: Some(format!("{DEMO_HOST}:{port}:127.0.0.1")),
        cacert: Some(ca.to_path_buf()),
        insecure: false,
        compare_h2: true,
        timeout: Duration::from_secs(10),
    };
    Ok(crate::check::run(&opts).await?)
}

/// What the user can try by hand while the demo runs.
pub fn instructions(port: u16, admin: SocketAddr, ca: &std::path::Path) -> String {
    let ca = ca.display();
    format!(
        "\nThe demo keeps serving until Ctrl-C. Try it yourself:\n\
         \x20 h3-ingress check https://localhost:{port}/ --cacert {ca} --compare-h2\n\
         \x20 curl -k --http3-only https://localhost:{port}/     (curl with HTTP/3)\n\
         \x20 curl -k --http2 -sI https://localhost:{port}/ | grep -i alt-svc\n\
         \x20 curl http://{admin}/metrics | grep h3_ingress_requests_total\n\
         \x20 curl http://{admin}/status\n"
    )
}

/// `h3-ingress demo`: starts everything, checks it and prints the verdict; then serves until
/// SIGTERM/SIGINT unless `once` (or the check failed). True when HTTP/3 works.
pub async fn run(once: bool) -> Result<bool, DemoError> {
    let shutdown = CancellationToken::new();
    crate::lifecycle::cancel_on_shutdown_signals(shutdown.clone()).map_err(DemoError::Signals)?;
    let (running, port, ca) = start(shutdown.clone()).await?;
    println!(
        "h3-ingress demo: stand-in TCP ingress on https://localhost:{port} (TCP), HTTP/3 proxy on UDP {:?}",
        running.udp_addrs
    );
    let report = check(port, &ca).await?;
    print!("{}", report.render());
    let ok = report.success() && report.h2.as_ref().is_some_and(|h| h.ok);
    println!(
        "result: {}",
        if ok {
            "HTTP/3 works and serves exactly what the TCP ingress serves"
        } else {
            "FAILED"
        }
    );
    let linger = if once || !ok {
        Duration::from_millis(200)
    } else {
        print!("{}", instructions(port, running.admin_addr, &ca));
        shutdown.cancelled().await;
        Duration::from_secs(1)
    };
    // Lets the proxy drain before the runtime goes away.
    shutdown.cancel();
    tokio::time::sleep(linger).await;
    let _ = std::fs::remove_file(&ca);
    Ok(ok)
}
