//! The client side: every HTTP/3 request goes to the existing TCP ingress over hyper.
//!
//! TLS uses the request's host as SNI so the ingress picks the right virtual host; h2 when
//! the ingress offers it, else HTTP/1.1. Connections are pooled per host in lanes of at most
//! `upstream.maxStreamsPerConnection` requests (`lanes.rs`), except with PROXY protocol,
//! where each QUIC connection gets its own upstream connections (the header names one
//! client).

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http_body_util::combinators::BoxBody;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

use super::lanes::{LaneMetrics, Lanes, Lease};
use super::logs::{limited, Reason};
use super::metrics::UpstreamMetrics;
use super::renewal::{Presented, Renewals};

use crate::api::UpstreamVerify;
use crate::config::{HostTable, UpstreamConfig};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type UpstreamBody = BoxBody<Bytes, BoxError>;

/// Why connecting to the upstream failed; mapped to 502/504 and to metric kinds.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connecting to {addr}: {source}")]
    Connect { addr: String, source: io::Error },
    #[error("connecting to {0} timed out")]
    Timeout(String),
    #[error("TLS with {host} at {addr}: {source}")]
    Tls {
        host: String,
        addr: String,
        source: io::Error,
    },
    #[error("request URI has no host")]
    NoHost,
    #[error("resolving {addr}: {source}")]
    Resolve { addr: String, source: io::Error },
}

/// The byte stream to the upstream, plain or TLS, counted in `h3_ingress_upstream_connections`
/// while it lives.
pub enum UpstreamStream {
    Plain(TcpStream, OpenConnection),
    Tls(Box<TlsStream<TcpStream>>, OpenConnection),
}

/// One open upstream connection in the gauge, from its connect until hyper drops it.
pub struct OpenConnection(prometheus::IntGauge);

impl OpenConnection {
    fn new(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        OpenConnection(gauge.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        match self {
            UpstreamStream::Plain(..) => Connected::new(),
            UpstreamStream::Tls(s, _) => {
                if s.get_ref().1.alpn_protocol() == Some(b"h2") {
                    Connected::new().negotiated_h2()
                } else {
                    Connected::new()
                }
            }
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s, _) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s, _) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s, _) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s, _) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s, _) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s, _) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s, _) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s, _) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s, _) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s, _) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s, _) => s.is_write_vectored(),
            UpstreamStream::Tls(s, _) => s.is_write_vectored(),
        }
    }
}

/// Source and destination of a client, for a PROXY protocol v2 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyAddrs {
    pub client: SocketAddr,
    pub local: SocketAddr,
}

/// Encodes a PROXY protocol v2 header (command PROXY, transport STREAM: the upstream sees a
/// byte stream per request exchange, and nginx only accepts STREAM).
pub fn proxy_v2_header(a: ProxyAddrs) -> Vec<u8> {
    let mut out = Vec::with_capacity(52);
    out.extend_from_slice(b"\r\n\r\n\0\r\nQUIT\n");
    out.push(0x21); // version 2, PROXY
    let client = super::request::canonical_ip(a.client);
    let local = super::request::canonical_ip(a.local);
    match (client, local) {
        (IpAddr::V4(c), IpAddr::V4(l)) => {
            out.push(0x11);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&c.octets());
            out.extend_from_slice(&l.octets());
        }
        (c, l) => {
            let v6 = |ip: IpAddr| match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            out.push(0x21);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(c).octets());
            out.extend_from_slice(&v6(l).octets());
        }
    }
    out.extend_from_slice(&a.client.port().to_be_bytes());
    out.extend_from_slice(&a.local.port().to_be_bytes());
    out
}

struct ConnectorInner {
    address: String,
    /// The hosts, when some have their own upstream (`HostEntry::upstream`).
    routes: Option<Arc<HostTable>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    connect_timeout: Duration,
    proxy: Option<ProxyAddrs>,
    open: prometheus::IntGauge,
}

/// Connects to the configured upstream address, or the host's own one (a Gateway run by its
/// own proxy); the URI host is otherwise only used as SNI (and, by the pool, as the key).
#[derive(Clone)]
pub struct Connector {
    inner: Arc<ConnectorInner>,
}

impl tower::Service<Uri> for Connector {
    type Response = TokioIo<UpstreamStream>;
    type Error = ConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, ConnectError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let inner = self.inner.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or(ConnectError::NoHost)?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let deadline = tokio::time::Instant::now() + inner.connect_timeout;
            let addr = inner.address_for(&host);
            let work = async {
                let tcp = connect_tcp(&addr).await?;
                let _ = tcp.set_nodelay(true);
                let mut tcp = tcp;
                if let Some(p) = inner.proxy {
                    tcp.write_all(&proxy_v2_header(p)).await.map_err(|source| {
                        ConnectError::Connect {
                            addr: addr.clone(),
                            source,
                        }
                    })?;
                }
                match &inner.tls {
                    None => Ok(UpstreamStream::Plain(tcp, OpenConnection::new(&inner.open))),
                    Some(cfg) => {
                        let name =
                            ServerName::try_from(host.clone()).map_err(|e| ConnectError::Tls {
                                host: host.clone(),
                                addr: addr.clone(),
                                source: io::Error::new(io::ErrorKind::InvalidInput, e),
                            })?;
                        let tls = tokio_rustls::TlsConnector::from(cfg.clone())
                            .connect(name, tcp)
                            .await
                            .map_err(|source| ConnectError::Tls {
                                host: host.clone(),
                                addr: addr.clone(),
                                source,
                            })?;
                        let open = OpenConnection::new(&inner.open);
                        Ok(UpstreamStream::Tls(Box::new(tls), open))
                    }
                }
            };
            match tokio::time::timeout_at(deadline, work).await {
                Ok(r) => r.map(TokioIo::new),
                Err(_) => Err(ConnectError::Timeout(addr)),
            }
        })
    }
}

impl ConnectorInner {
    fn address_for(&self, host: &str) -> String {
        let own = self
            .routes
            .as_ref()
            .and_then(|r| r.lookup(host)?.upstream.as_ref());
        match own {
            Some(a) => a.to_string(),
            None => self.address.clone(),
        }
    }
}

/// The hosts to consult for a per-host upstream: `None` (no lookup per connection) when no
/// host has one.
fn routes(hosts: &HostTable) -> Option<Arc<HostTable>> {
    hosts
        .iter()
        .any(|h| h.upstream.is_some())
        .then(|| Arc::new(hosts.clone()))
}

async fn connect_tcp(addr: &str) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
        .await
        .map_err(|source| ConnectError::Resolve {
            addr: addr.to_string(),
            source,
        })?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no addresses");
    for a in addrs {
        match TcpStream::connect(a).await {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(ConnectError::Connect {
        addr: addr.to_string(),
        source: last,
    })
}

/// `servedCertificate`: the upstream must present exactly the leaf we serve for that host,
/// which proves the request reaches the ingress that owns the name without trusting any CA;
/// while a certificate is renewed, the leaf it replaced or its renewal ([`Renewals`]).
#[derive(Debug)]
struct ServedCertificateVerifier {
    hosts: HostTable,
    renewals: Arc<Renewals>,
    grace: Duration,
    /// Handshake signatures are checked exactly as for any certificate.
    signatures: Arc<super::tls::AnyServerCertificate>,
}

impl ServerCertVerifier for ServedCertificateVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let name = match server_name {
            ServerName::DnsName(d) => d.as_ref().to_string(),
            other => {
                return Err(rustls::Error::General(format!(
                    "no served certificate for {other:?}"
                )))
            }
        };
        let Some(entry) = self.hosts.lookup(&name) else {
            return Err(rustls::Error::General(format!(
                "no served certificate for {name}"
            )));
        };
        if entry.leaf().as_ref() == end_entity.as_ref() {
            return Ok(ServerCertVerified::assertion());
        }
        let theirs = Presented {
            leaf: end_entity,
            intermediates,
            server_name,
            now,
        };
        let ours = &entry.certified_key.cert;
        let renewal = self.renewals.judge(&entry.name, ours, &theirs, self.grace);
        if let Some(leaf) = renewal {
            self.renewals
                .accepted
                .with_label_values(&[leaf.as_str()])
                .inc();
            limited!(
                tracing::Level::INFO,
                Reason::UpstreamRenewal,
                host = name,
                leaf = leaf.as_str(),
                "upstream presented the {} certificate for {name}, accepted while the renewal \
                 reaches both sides (upstream.servedCertificateGraceSeconds)",
                leaf.as_str()
            );
            Ok(ServerCertVerified::assertion())
        } else {
            limited!(
                tracing::Level::WARN,
                Reason::UpstreamCertificate,
                host = name,
                "upstream presented a different certificate than the one we serve for {name} \
                 (upstream.verify: servedCertificate)"
            );
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.signatures.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.signatures.supported_verify_schemes()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamSetupError {
    #[error("TLS client configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("no usable CA certificates in the system trust store (upstream.verify: system)")]
    NoSystemRoots,
}

/// TLS client configuration for the upstream, per verification mode; `renewals` serves
/// `servedCertificate`.
pub fn client_tls(
    config: &UpstreamConfig,
    hosts: &HostTable,
    renewals: &Arc<Renewals>,
) -> Result<Arc<rustls::ClientConfig>, UpstreamSetupError> {
    let provider = super::tls::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut cfg = match config.verify {
        UpstreamVerify::ServedCertificate => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServedCertificateVerifier {
                hosts: hosts.clone(),
                renewals: renewals.clone(),
                grace: config.served_certificate_grace,
                signatures: super::tls::AnyServerCertificate::new(),
            }))
            .with_no_client_auth(),
        UpstreamVerify::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(super::tls::AnyServerCertificate::new())
            .with_no_client_auth(),
        UpstreamVerify::System => {
            let mut roots = rustls::RootCertStore::empty();
            let loaded = rustls_native_certs::load_native_certs();
            for c in loaded.certs {
                let _ = roots.add(c);
            }
            if roots.is_empty() {
                return Err(UpstreamSetupError::NoSystemRoots);
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The h2 window of one upstream stream: what a response whose client does not read can hold
/// in this process. 512 KiB is a brake on no hop inside a cluster (512 MB/s per request at
/// 1 ms RTT, above what one QUIC stream carries). On loopback 256 KiB cost the proxy 10 % and
/// nginx a quarter more CPU per byte than 4 MiB did; 1 MiB saved the proxy nothing more.
const UPSTREAM_STREAM_WINDOW: u32 = 512 * 1024;

/// How long an idle upstream connection is kept for its host; evicted within twice that.
/// Each host has its own (SNI), so a burst over many hosts (a monitor checking every one)
/// leaves one connection per host, held this long (after a request to each of 10,000 hosts
/// the data plane was at 184-197 MiB while they were open, 92 MiB once they had closed).
/// 30 s keeps a connection across a page's requests and a visitor's next click; nginx keeps
/// its own side 75 s, HAProxy purges idle server connections within seconds.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

type PooledClient = Client<Connector, UpstreamBody>;

/// A request's place on an upstream connection, held until the request ends.
pub type UpstreamLease = Lease<PooledClient>;

/// A pooled hyper client for one configuration generation.
#[derive(Clone)]
pub struct Upstream {
    lanes: Arc<Lanes<PooledClient>>,
    config: Arc<UpstreamConfig>,
    routes: Option<Arc<HostTable>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The hosts this generation serves, to tell the next one which leaves changed.
    hosts: HostTable,
    /// Shared with every later generation (see [`Upstream::successor`]).
    renewals: Arc<Renewals>,
    metrics: UpstreamMetrics,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("address", &self.config.address.to_string())
            .finish()
    }
}

/// A lane's client. Its connection window covers every stream's window, so streams whose
/// clients stop reading cannot use up the connection's window and stall the other requests.
fn build_client(connector: Connector, streams: u32) -> PooledClient {
    Client::builder(TokioExecutor::new())
        // Without a timer the pool never evicts: an idle connection stays until the same host
        // asks for one again, so every host that ever had a request kept its connections
        // (10,000 hosts: 10,000 sockets and 280 MB, tests/dataplane_scale.rs).
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(UPSTREAM_IDLE_TIMEOUT)
        .pool_max_idle_per_host(64)
        // Fixed windows, not adaptive: hyper's adaptive window replaces these with the
        // 64 KiB default and grows from there, which made every new upstream connection stall
        // for window updates at loopback speed.
        .http2_initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
        .http2_initial_connection_window_size(UPSTREAM_STREAM_WINDOW * streams)
        .build(connector)
}

fn lanes(connector: Connector, streams: u32, metrics: LaneMetrics) -> Arc<Lanes<PooledClient>> {
    Arc::new(Lanes::new(streams as usize, metrics, move || {
        build_client(connector.clone(), streams)
    }))
}

impl Upstream {
    /// The first generation's upstream.
    pub fn new(
        config: &UpstreamConfig,
        hosts: &HostTable,
        metrics: UpstreamMetrics,
    ) -> Result<Self, UpstreamSetupError> {
        let renewals = Renewals::new(metrics.certificate_grace.clone());
        Self::build(config, hosts, metrics, renewals)
    }

    /// The upstream of the generation that replaces this one: it remembers the leaves this
    /// one served that `hosts` changes, so `servedCertificate` still accepts them for the grace
    /// period while the TCP ingress catches up.
    pub fn successor(
        &self,
        config: &UpstreamConfig,
        hosts: &HostTable,
    ) -> Result<Self, UpstreamSetupError> {
        let now = UnixTime::now().as_secs() as i64;
        self.renewals.switched(&self.hosts, hosts, now);
        Self::build(config, hosts, self.metrics.clone(), self.renewals.clone())
    }

    fn build(
        config: &UpstreamConfig,
        hosts: &HostTable,
        metrics: UpstreamMetrics,
        renewals: Arc<Renewals>,
    ) -> Result<Self, UpstreamSetupError> {
        let tls = if config.tls {
            Some(client_tls(config, hosts, &renewals)?)
        } else {
            None
        };
        let routes = routes(hosts);
        let connector = Connector {
            inner: Arc::new(ConnectorInner {
                address: config.address.to_string(),
                routes: routes.clone(),
                tls: tls.clone(),
                connect_timeout: config.connect_timeout,
                proxy: None,
                open: metrics.connections.clone(),
            }),
        };
        Ok(Self {
            lanes: lanes(
                connector,
                config.max_streams_per_connection,
                metrics.lanes.clone(),
            ),
            config: Arc::new(config.clone()),
            routes,
            tls,
            hosts: hosts.clone(),
            renewals,
            metrics,
        })
    }

    /// The client to use for one QUIC connection: shared, or its own with PROXY protocol.
    pub fn for_connection(&self, client: SocketAddr, local: SocketAddr) -> Upstream {
        if !self.config.proxy_protocol {
            return self.clone();
        }
        let connector = Connector {
            inner: Arc::new(ConnectorInner {
                address: self.config.address.to_string(),
                routes: self.routes.clone(),
                tls: self.tls.clone(),
                connect_timeout: self.config.connect_timeout,
                proxy: Some(ProxyAddrs { client, local }),
                open: self.metrics.connections.clone(),
            }),
        };
        Upstream {
            lanes: lanes(
                connector,
                self.config.max_streams_per_connection,
                self.lanes.metrics().clone(),
            ),
            config: self.config.clone(),
            routes: self.routes.clone(),
            tls: self.tls.clone(),
            hosts: self.hosts.clone(),
            renewals: self.renewals.clone(),
            metrics: self.metrics.clone(),
        }
    }

    pub fn scheme(&self) -> &'static str {
        if self.config.tls {
            "https"
        } else {
            "http"
        }
    }

    /// Sends a request; the error says which status the client should get. The response
    /// timeout runs from `body_sent` (the upstream has read the whole request body), so an
    /// upload of any length gets its full time for the answer. Keep the lease until the
    /// response body is done: it is the request's place on its upstream connection.
    pub async fn send(
        &self,
        req: http::Request<UpstreamBody>,
        body_sent: CancellationToken,
    ) -> Result<(http::Response<hyper::body::Incoming>, UpstreamLease), UpstreamError> {
        let limit = self.config.response_timeout;
        let deadline = async {
            body_sent.cancelled().await;
            tokio::time::sleep(limit).await;
        };
        let lease = self.lanes.lease();
        let response = lease.client().request(req);
        tokio::select! {
            r = response => r.map(|r| (r, lease)).map_err(classify),
            _ = deadline => Err(UpstreamError::Timeout(limit)),
        }
    }

    /// How long the response body may make no progress.
    pub fn body_idle_timeout(&self) -> Duration {
        self.config.response_body_idle_timeout
    }
}

/// Upstream failures as the client sees them.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("connecting to the upstream timed out: {0}")]
    ConnectTimeout(String),
    #[error("upstream refused the connection: {0}")]
    Connect(String),
    #[error("TLS with the upstream failed: {0}")]
    Tls(String),
    #[error("upstream reset or closed the connection: {0}")]
    Reset(String),
    #[error("upstream protocol error: {0}")]
    Protocol(String),
}

impl UpstreamError {
    /// 504 for time-outs, 502 for everything else (RFC 9110 15.6.3 and 15.6.5).
    pub fn status(&self) -> http::StatusCode {
        match self {
            UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) => {
                http::StatusCode::GATEWAY_TIMEOUT
            }
            _ => http::StatusCode::BAD_GATEWAY,
        }
    }

    pub fn metric_kind(&self) -> &'static str {
        use super::metrics::upstream_error as k;
        match self {
            UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) => k::TIMEOUT,
            UpstreamError::Connect(_) => k::CONNECT,
            UpstreamError::Tls(_) => k::TLS,
            UpstreamError::Reset(_) => k::RESET,
            UpstreamError::Protocol(_) => k::PROTOCOL,
        }
    }
}

fn classify(e: hyper_util::client::legacy::Error) -> UpstreamError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return match c {
                ConnectError::Timeout(_) => UpstreamError::ConnectTimeout(c.to_string()),
                ConnectError::Tls { .. } => UpstreamError::Tls(c.to_string()),
                _ => UpstreamError::Connect(c.to_string()),
            };
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return UpstreamError::Reset(h.to_string());
            }
        }
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionAborted
            ) {
                return UpstreamError::Reset(io.to_string());
            }
        }
        source = s.source();
    }
    if e.is_connect() {
        UpstreamError::Connect(format!("{e:?}"))
    } else {
        UpstreamError::Protocol(format!("{e}: {:?}", std::error::Error::source(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_v2_ipv4_header_layout() {
        let h = proxy_v2_header(ProxyAddrs {
            client: "192.0.2.1:5000".parse().unwrap(),
            local: "[::ffff:198.51.100.2]:443".parse().unwrap(),
        });
        assert_eq!(&h[..12], b"\r\n\r\n\0\r\nQUIT\n");
        assert_eq!(h[12], 0x21);
        assert_eq!(h[13], 0x11);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 12);
        assert_eq!(&h[16..20], &[192, 0, 2, 1]);
        assert_eq!(&h[20..24], &[198, 51, 100, 2]);
        assert_eq!(u16::from_be_bytes([h[24], h[25]]), 5000);
        assert_eq!(u16::from_be_bytes([h[26], h[27]]), 443);
        assert_eq!(h.len(), 28);
    }

    #[test]
    fn proxy_v2_ipv6_header_layout() {
        let h = proxy_v2_header(ProxyAddrs {
            client: "[2001:db8::1]:5000".parse().unwrap(),
            local: "[2001:db8::2]:443".parse().unwrap(),
        });
        assert_eq!(h[13], 0x21);
        assert_eq!(u16::from_be_bytes([h[14], h[15]]), 36);
        assert_eq!(h.len(), 16 + 36);
    }

    #[tokio::test]
    async fn a_lane_holds_max_streams_per_connection_requests() {
        let config = UpstreamConfig {
            address: crate::config::parse_host_port("127.0.0.1:9").unwrap(),
            tls: false,
            verify: UpstreamVerify::ServedCertificate,
            proxy_protocol: false,
            max_streams_per_connection: 2,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            response_body_idle_timeout: Duration::from_secs(1),
            served_certificate_grace: Duration::ZERO,
        };
        let metrics = UpstreamMetrics::unregistered();
        let upstream = Upstream::new(&config, &HostTable::default(), metrics.clone()).unwrap();
        let metrics = metrics.lanes;
        let held: Vec<_> = (0..5).map(|_| upstream.lanes.lease()).collect();
        assert_eq!(upstream.lanes.count(), 3, "2 + 2 + 1");
        assert_eq!(metrics.in_flight.get(), 5);
        drop(held);
        assert_eq!(metrics.in_flight.get(), 0);
    }

    /// A plain HTTP server answering every request with `body`.
    async fn answering(body: &'static str) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        let b = http_body_util::Full::new(Bytes::from_static(body.as_bytes()));
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(b))
                    });
                    let io = TokioIo::new(s);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A host with its own upstream (a Gateway run by its own proxy) is connected there, over
    /// real sockets; the others, wildcards included, go to the configuration's upstream.
    #[tokio::test]
    async fn a_host_with_its_own_upstream_is_sent_there() {
        use http_body_util::{BodyExt, Empty};
        let (shared, own) = (answering("shared").await, answering("own").await);
        let ck = rcgen::generate_simple_self_signed(vec!["*.test".to_string()]).unwrap();
        let cert = crate::config::Certificate::from_pem(
            ck.cert.pem().as_bytes(),
            ck.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let mut hosts = HostTable::default();
        let mut gw = cert.entry("gw.test".into());
        gw.upstream = Some(crate::config::parse_host_port(&own.to_string()).unwrap());
        hosts.insert(gw);
        hosts.insert(cert.entry("*.test".into()));
        let config = UpstreamConfig {
            address: crate::config::parse_host_port(&shared.to_string()).unwrap(),
            tls: false,
            verify: UpstreamVerify::ServedCertificate,
            proxy_protocol: false,
            max_streams_per_connection: 100,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            response_body_idle_timeout: Duration::from_secs(5),
            served_certificate_grace: Duration::ZERO,
        };
        let metrics = UpstreamMetrics::unregistered();
        let upstream = Upstream::new(&config, &hosts, metrics.clone()).unwrap();
        for (host, want) in [("gw.test", "own"), ("a.test", "shared")] {
            let req = http::Request::get(format!("http://{host}/"))
                .body(Empty::new().map_err(|never| match never {}).boxed())
                .unwrap();
            let sent = CancellationToken::new();
            sent.cancel();
            let (resp, _lease) = upstream.send(req, sent).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, want.as_bytes(), "{host}");
        }
        // One pooled connection per host, counted until the pool closes them.
        assert_eq!(metrics.connections.get(), 2);
        drop(upstream);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while metrics.connections.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.connections.get(), 0, "closed with the pool");
        // Without any host of its own, no table is kept for the connector.
        assert!(routes(&HostTable::default()).is_none());
    }

    #[test]
    fn error_statuses() {
        assert_eq!(UpstreamError::Timeout(Duration::from_secs(1)).status(), 504);
        assert_eq!(UpstreamError::Connect("x".into()).status(), 502);
        assert_eq!(UpstreamError::Reset("x".into()).status(), 502);
    }
}
