//! Connections to the TCP ingress: TCP (the listener's upstream, or a host's own), an optional
//! PROXY protocol v2 header naming the client, then TLS with the request's host as SNI; each
//! open connection counted while it lives.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::config::HostTable;

/// Client address as users expect to see it: IPv4 clients as plain IPv4, never `::ffff:`.
pub fn canonical_ip(addr: SocketAddr) -> IpAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

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
    let client = canonical_ip(a.client);
    let local = canonical_ip(a.local);
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

pub(super) struct ConnectorInner {
    pub(super) address: String,
    /// The hosts, when some have their own upstream (`HostEntry::upstream`).
    pub(super) routes: Option<Arc<HostTable>>,
    pub(super) tls: Option<Arc<rustls::ClientConfig>>,
    pub(super) connect_timeout: Duration,
    pub(super) proxy: Option<ProxyAddrs>,
    pub(super) open: prometheus::IntGauge,
}

/// Connects to the configured upstream address, or the host's own one (a Gateway run by its
/// own proxy); the URI host is otherwise only used as SNI (and, by the pool, as the key).
#[derive(Clone)]
pub struct Connector {
    pub(super) inner: Arc<ConnectorInner>,
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
pub(super) fn routes(hosts: &HostTable) -> Option<Arc<HostTable>> {
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
}
