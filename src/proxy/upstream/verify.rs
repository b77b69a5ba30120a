//! How the upstream's certificate is checked (`upstream.verify`): `servedCertificate` (the
//! leaf we serve for the host, or its renewal while the grace lasts), `system` (the system's
//! roots) or `insecure`.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use super::renewal::{Presented, Renewals};
use crate::api::UpstreamVerify;
use crate::config::{HostTable, UpstreamConfig};
use crate::proxy::observe::logs::{limited, Reason};

/// `servedCertificate`: the upstream must present exactly the leaf we serve for that host,
/// which proves the request reaches the ingress that owns the name without trusting any CA;
/// while a certificate is renewed, the leaf it replaced or its renewal ([`Renewals`]).
#[derive(Debug)]
struct ServedCertificateVerifier {
    hosts: HostTable,
    renewals: Arc<Renewals>,
    grace: Duration,
    /// Handshake signatures are checked exactly as for any certificate.
    signatures: Arc<crate::pki::AnyServerCertificate>,
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
    let provider = crate::pki::provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let mut cfg = match config.verify {
        UpstreamVerify::ServedCertificate => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ServedCertificateVerifier {
                hosts: hosts.clone(),
                renewals: renewals.clone(),
                grace: config.served_certificate_grace,
                signatures: crate::pki::AnyServerCertificate::new(),
            }))
            .with_no_client_auth(),
        UpstreamVerify::Insecure => builder
            .dangerous()
            .with_custom_certificate_verifier(crate::pki::AnyServerCertificate::new())
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
