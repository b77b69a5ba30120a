//! `h3-ingress check`: proves HTTP/3 really runs, with the same request over HTTP/3 and
//! HTTP/2 instead of trusting a browser's protocol column.
//!
//! Fetches a URL over HTTP/3 (quinn + h3) and, with `--compare-h2`, over HTTP/2 (hyper),
//! then compares status and body hashes and shows the Alt-Svc header the TCP side sends.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Buf;
use http::{Request, Uri};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::Serialize;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone)]
pub struct CheckOptions {
    pub url: String,
    /// `HOST:PORT:ADDR`, like curl's `--resolve`.
    pub resolve: Option<String>,
    pub cacert: Option<PathBuf>,
    pub insecure: bool,
    pub compare_h2: bool,
    pub timeout: Duration,
}

/// `h3-ingress check` as typed on the command line.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// https:// URL to fetch.
    pub url: String,
    /// HOST:PORT:ADDR, like curl's --resolve.
    #[arg(long)]
    pub resolve: Option<String>,
    /// PEM file of CA certificates to trust instead of the system store.
    #[arg(long, conflicts_with = "insecure")]
    pub cacert: Option<PathBuf>,
    /// Do not verify the server certificate.
    #[arg(long, short = 'k')]
    pub insecure: bool,
    /// Also fetch over HTTP/2 and compare status and body hash.
    #[arg(long)]
    pub compare_h2: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Seconds before giving up on each protocol.
    #[arg(long, default_value_t = 15)]
    pub timeout: u64,
}

impl CheckArgs {
    pub fn options(&self) -> CheckOptions {
        CheckOptions {
            url: self.url.clone(),
            resolve: self.resolve.clone(),
            cacert: self.cacert.clone(),
            insecure: self.insecure,
            compare_h2: self.compare_h2,
            timeout: Duration::from_secs(self.timeout),
        }
    }
}

/// Runs `h3-ingress check` and prints the report (text, or JSON with `--json`). True when
/// every requested protocol answered as it should.
pub async fn run_cli(args: &CheckArgs) -> Result<bool, CheckError> {
    let report = run(&args.options()).await?;
    if args.json {
        let json = serde_json::to_string_pretty(&report).expect("the report serialises");
        println!("{json}");
    } else {
        print!("{}", report.render());
    }
    Ok(report.success())
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("URL {0:?}: {1}")]
    Url(String, &'static str),
    #[error("--resolve {0:?} is not HOST:PORT:ADDR")]
    Resolve(String),
    #[error("resolving {0}: {1}")]
    Dns(String, std::io::Error),
    #[error("CA file {0}: {1}")]
    CaFile(PathBuf, String),
    #[error("TLS setup: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// One fetch over one protocol.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Fetch {
    pub protocol: String,
    pub ok: bool,
    pub error: Option<String>,
    pub status: Option<u16>,
    pub alt_svc: Option<String>,
    pub server_cert_sha256: Option<String>,
    pub body_bytes: u64,
    pub body_sha256: Option<String>,
    pub ttfb_ms: Option<f64>,
    pub total_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub url: String,
    pub address: String,
    pub h3: Fetch,
    pub h2: Option<Fetch>,
    /// Both succeeded with the same status and the same body hash.
    pub bodies_match: Option<bool>,
}

impl CheckReport {
    /// Exit status for scripts: success only if h3 worked (and matched h2 when compared).
    pub fn success(&self) -> bool {
        self.h3.ok && self.bodies_match.unwrap_or(true)
    }

    pub fn render(&self) -> String {
        let mut out = format!("check {} via {}\n", self.url, self.address);
        let line = |f: &Fetch| -> String {
            if !f.ok {
                return format!(
                    "  {:<6} FAILED: {}\n",
                    f.protocol,
                    f.error.as_deref().unwrap_or("unknown error")
                );
            }
            format!(
                "  {:<6} status {}  ttfb {:.1} ms  total {:.1} ms  {} bytes  sha256 {}\n",
                f.protocol,
                f.status.unwrap_or(0),
                f.ttfb_ms.unwrap_or(0.0),
                f.total_ms.unwrap_or(0.0),
                f.body_bytes,
                f.body_sha256.as_deref().unwrap_or("-"),
            )
        };
        out += &line(&self.h3);
        if let Some(h2) = &self.h2 {
            out += &line(h2);
            out += &format!(
                "  alt-svc on the HTTP/2 response: {}\n",
                h2.alt_svc
                    .as_deref()
                    .unwrap_or("(none: browsers will not discover HTTP/3)")
            );
        }
        match self.bodies_match {
            Some(true) => out += "  bodies match: yes (same status, same SHA-256)\n",
            Some(false) => out += "  bodies match: NO\n",
            None => {}
        }
        out
    }
}

struct Target {
    host: String,
    port: u16,
    path: String,
    addr: SocketAddr,
}

async fn target(opts: &CheckOptions) -> Result<Target, CheckError> {
    let uri: Uri = opts
        .url
        .parse()
        .map_err(|_| CheckError::Url(opts.url.clone(), "not a URL"))?;
    if uri.scheme_str() != Some("https") {
        return Err(CheckError::Url(opts.url.clone(), "scheme must be https"));
    }
    let host = uri
        .host()
        .ok_or(CheckError::Url(opts.url.clone(), "no host"))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let addr = match &opts.resolve {
        Some(r) => {
            let mut it = r.splitn(3, ':');
            let (h, p, a) = (it.next(), it.next(), it.next());
            let (Some(h), Some(p), Some(a)) = (h, p, a) else {
                return Err(CheckError::Resolve(r.clone()));
            };
            let p: u16 = p.parse().map_err(|_| CheckError::Resolve(r.clone()))?;
            let ip: IpAddr = a
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse()
                .map_err(|_| CheckError::Resolve(r.clone()))?;
            if !h.eq_ignore_ascii_case(&host) || p != port {
                return Err(CheckError::Resolve(r.clone()));
            }
            SocketAddr::new(ip, p)
        }
        None => tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| CheckError::Dns(host.clone(), e))?
            .next()
            .ok_or_else(|| CheckError::Dns(host.clone(), std::io::ErrorKind::NotFound.into()))?,
    };
    Ok(Target {
        host,
        port,
        path,
        addr,
    })
}

fn client_tls(opts: &CheckOptions, alpn: &[u8]) -> Result<rustls::ClientConfig, CheckError> {
    let provider = crate::pki::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?;
    let mut cfg = if opts.insecure {
        builder
            .dangerous()
            .with_custom_certificate_verifier(crate::pki::AnyServerCertificate::new())
            .with_no_client_auth()
    } else {
        let mut roots = rustls::RootCertStore::empty();
        match &opts.cacert {
            Some(path) => {
                let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                    .map_err(|e| CheckError::CaFile(path.clone(), e.to_string()))?
                    .collect::<Result<_, _>>()
                    .map_err(|e| CheckError::CaFile(path.clone(), e.to_string()))?;
                for c in certs {
                    roots
                        .add(c)
                        .map_err(|e| CheckError::CaFile(path.clone(), e.to_string()))?;
                }
            }
            None => {
                for c in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(c);
                }
            }
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Ok(cfg)
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1_000_000.0).round() / 1000.0
}

/// The client's UDP socket: the target's family only, never dual-stack (field report 000 in
/// docs/field-reports.md), with the receive buffer the proxy asks for its own sockets. With the kernel default (208 KB) a
/// server's window on a fast path (loopback, LAN) outruns this client's reading, the kernel
/// drops whole GSO batches (about 20 % of the packets of 1 MiB on loopback) and a lost tail
/// costs a probe timeout of 25 ms or more: the check would time its own socket, not the
/// server. quic-go's clients raise the buffer for the same reason.
fn client_socket(ipv6: bool) -> std::io::Result<std::net::UdpSocket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let (domain, bind): (Domain, SocketAddr) = if ipv6 {
        (Domain::IPV6, "[::]:0".parse().expect("literal"))
    } else {
        (Domain::IPV4, "0.0.0.0:0".parse().expect("literal"))
    };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if ipv6 {
        socket.set_only_v6(true)?;
    }
    // Best effort: the kernel caps it at net.core.rmem_max, which is fine for a check.
    let _ = socket.set_recv_buffer_size(crate::api::DEFAULT_BUFFER_BYTES as usize);
    socket.bind(&bind.into())?;
    Ok(socket.into())
}

/// Fetches over HTTP/3 with a fresh connection.
async fn fetch_h3(opts: &CheckOptions, t: &Target) -> Fetch {
    let mut f = Fetch {
        protocol: "HTTP/3".into(),
        ..Default::default()
    };
    let r = tokio::time::timeout(opts.timeout, fetch_h3_inner(opts, t, &mut f)).await;
    match r {
        Ok(Ok(())) => f.ok = true,
        Ok(Err(e)) => f.error = Some(e),
        Err(_) => f.error = Some(format!("timed out after {:?}", opts.timeout)),
    }
    f
}

async fn fetch_h3_inner(opts: &CheckOptions, t: &Target, f: &mut Fetch) -> Result<(), String> {
    let tls = client_tls(opts, b"h3").map_err(|e| e.to_string())?;
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls).map_err(|e| e.to_string())?;
    let mut cfg = quinn::ClientConfig::new(Arc::new(quic));
    let mut transport = quinn::TransportConfig::default();
    transport.stream_receive_window(quinn::VarInt::from_u32(8 << 20));
    transport.receive_window(quinn::VarInt::from_u32(32 << 20));
    cfg.transport_config(Arc::new(transport));
    // A socket of the target's family only: never a dual-stack socket, which sends IPv4
    // without DF (docs/field-reports.md, "000 dual-stack socket without DF").
    let socket = client_socket(t.addr.is_ipv6()).map_err(|e| format!("UDP socket: {e}"))?;
    let mut endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        Arc::new(quinn::TokioRuntime),
    )
    .map_err(|e| format!("UDP socket: {e}"))?;
    endpoint.set_default_client_config(cfg);
    let start = Instant::now();
    let conn = endpoint
        .connect(t.addr, &t.host)
        .map_err(|e| e.to_string())?
        .await
        .map_err(|e| format!("QUIC handshake: {e}"))?;
    if let Some(certs) = conn
        .peer_identity()
        .and_then(|i| i.downcast::<Vec<CertificateDer<'static>>>().ok())
    {
        if let Some(leaf) = certs.first() {
            f.server_cert_sha256 = Some(hex::encode(Sha256::digest(leaf.as_ref())));
        }
    }
    let (mut driver, mut send) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
        .await
        .map_err(|e| format!("HTTP/3 setup: {e}"))?;
    let drive = tokio::spawn(async move { std::future::poll_fn(|cx| driver.poll_close(cx)).await });
    let authority = if t.port == 443 {
        t.host.clone()
    } else {
        format!("{}:{}", t.host, t.port)
    };
    let req = Request::get(format!("https://{authority}{}", t.path))
        .header(
            "user-agent",
            concat!("h3-ingress-check/", env!("CARGO_PKG_VERSION")),
        )
        .body(())
        .map_err(|e| e.to_string())?;
    let mut stream = send.send_request(req).await.map_err(|e| e.to_string())?;
    stream.finish().await.map_err(|e| e.to_string())?;
    let resp = stream.recv_response().await.map_err(|e| e.to_string())?;
    f.ttfb_ms = Some(ms(start.elapsed()));
    f.status = Some(resp.status().as_u16());
    f.alt_svc = resp
        .headers()
        .get("alt-svc")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut hasher = Sha256::new();
    while let Some(mut chunk) = stream.recv_data().await.map_err(|e| e.to_string())? {
        while chunk.has_remaining() {
            let c = chunk.chunk();
            hasher.update(c);
            f.body_bytes += c.len() as u64;
            let n = c.len();
            chunk.advance(n);
        }
    }
    f.total_ms = Some(ms(start.elapsed()));
    f.body_sha256 = Some(hex::encode(hasher.finalize()));
    drop(stream);
    drop(send);
    conn.close(0u32.into(), b"done");
    drive.abort();
    endpoint.wait_idle().await;
    Ok(())
}

/// Fetches over HTTP/2 (TCP + TLS) from the same address and port.
async fn fetch_h2(opts: &CheckOptions, t: &Target) -> Fetch {
    let mut f = Fetch {
        protocol: "HTTP/2".into(),
        ..Default::default()
    };
    match tokio::time::timeout(opts.timeout, fetch_h2_inner(opts, t, &mut f)).await {
        Ok(Ok(())) => f.ok = true,
        Ok(Err(e)) => f.error = Some(e),
        Err(_) => f.error = Some(format!("timed out after {:?}", opts.timeout)),
    }
    f
}

async fn fetch_h2_inner(opts: &CheckOptions, t: &Target, f: &mut Fetch) -> Result<(), String> {
    let tls = client_tls(opts, b"h2").map_err(|e| e.to_string())?;
    let start = Instant::now();
    let tcp = tokio::net::TcpStream::connect(t.addr)
        .await
        .map_err(|e| format!("TCP connect: {e}"))?;
    let name = ServerName::try_from(t.host.clone()).map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err("server did not negotiate h2".into());
    }
    if let Some(leaf) = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    {
        f.server_cert_sha256 = Some(hex::encode(Sha256::digest(leaf.as_ref())));
    }
    let (mut sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(8 << 20)
            .initial_connection_window_size(32 << 20)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let authority = if t.port == 443 {
        t.host.clone()
    } else {
        format!("{}:{}", t.host, t.port)
    };
    let req = Request::get(format!("https://{authority}{}", t.path))
        .header(
            "user-agent",
            concat!("h3-ingress-check/", env!("CARGO_PKG_VERSION")),
        )
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    f.ttfb_ms = Some(ms(start.elapsed()));
    f.status = Some(resp.status().as_u16());
    f.alt_svc = resp
        .headers()
        .get("alt-svc")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut body = resp.into_body();
    let mut hasher = Sha256::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| e.to_string())?;
        if let Some(d) = frame.data_ref() {
            hasher.update(d);
            f.body_bytes += d.len() as u64;
        }
    }
    f.total_ms = Some(ms(start.elapsed()));
    f.body_sha256 = Some(hex::encode(hasher.finalize()));
    driver.abort();
    Ok(())
}

pub async fn run(opts: &CheckOptions) -> Result<CheckReport, CheckError> {
    let t = target(opts).await?;
    let h3 = fetch_h3(opts, &t).await;
    let h2 = if opts.compare_h2 {
        Some(fetch_h2(opts, &t).await)
    } else {
        None
    };
    let bodies_match = h2
        .as_ref()
        .map(|h2| h3.ok && h2.ok && h3.status == h2.status && h3.body_sha256 == h2.body_sha256);
    Ok(CheckReport {
        url: opts.url.clone(),
        address: t.addr.to_string(),
        h3,
        h2,
        bodies_match,
    })
}
