//! Server TLS for QUIC: TLS 1.3 only, ALPN h3, one certificate per host chosen by SNI,
//! certificate compression on, 0-RTT off.

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use tracing::Level;

use crate::config::HostTable;
use crate::pki::provider;
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::metrics::{handshake, Metrics};

/// Picks the certificate by SNI. An unknown or missing SNI gets no certificate, which fails
/// the handshake: serving another host's certificate would only produce a confusing
/// name-mismatch error in the browser and would leak which hosts live here.
pub struct SniResolver {
    hosts: HostTable,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for SniResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SniResolver")
            .field("hosts", &self.hosts.names().collect::<Vec<_>>())
            .finish()
    }
}

impl SniResolver {
    pub fn new(hosts: HostTable, metrics: Arc<Metrics>) -> Self {
        Self { hosts, metrics }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name();
        if let Some(entry) = sni.and_then(|n| self.hosts.lookup(n)) {
            return Some(entry.certified_key.clone());
        }
        self.metrics
            .handshakes
            .with_label_values(&[handshake::UNKNOWN_SNI])
            .inc();
        match sni {
            Some(name) => limited!(
                Level::WARN,
                Reason::UnknownSni,
                sni = name,
                "refusing QUIC handshake: SNI {name:?} is not a configured host"
            ),
            None => limited!(
                Level::WARN,
                Reason::UnknownSni,
                "refusing QUIC handshake: client sent no SNI"
            ),
        }
        None
    }
}

/// The QUIC server crypto for a set of hosts.
pub fn server_crypto(
    hosts: HostTable,
    metrics: Arc<Metrics>,
) -> Result<Arc<quinn::crypto::rustls::QuicServerConfig>, rustls::Error> {
    let mut tls = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SniResolver::new(hosts, metrics)));
    tls.alpn_protocols = vec![b"h3".to_vec()];
    // 0-RTT requests can be replayed (a login form POSTed twice): off.
    tls.max_early_data_size = 0;
    // RFC 8879: a compressed chain needs fewer datagrams in the first flight, so fewer can
    // be lost (docs/field-reports.md, "004 cwnd pinned after one lost handshake packet").
    // rustls offers brotli and zlib with the features we enable.
    tls.cert_compressors = rustls::compress::default_cert_compressors().to_vec();
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| rustls::Error::General(format!("QUIC TLS config: {e}")))?;
    Ok(Arc::new(quic))
}

#[cfg(test)]
mod tests {
    #[test]
    fn compression_is_available() {
        let c = rustls::compress::default_cert_compressors();
        let algs: Vec<_> = c.iter().map(|c| c.algorithm()).collect();
        assert!(
            algs.contains(&rustls::CertificateCompressionAlgorithm::Brotli),
            "{algs:?}"
        );
        assert!(
            algs.contains(&rustls::CertificateCompressionAlgorithm::Zlib),
            "{algs:?}"
        );
    }
}
