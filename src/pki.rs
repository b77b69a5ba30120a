//! Certificate checks, written once for every side of the product: the crypto provider, the
//! verifier that accepts any server certificate but checks handshake signatures, and the
//! chain check (a leaf, its intermediates, trust anchors, a time: a path for server
//! authentication) with the name check. The operator judges Secrets with it (whether a chain
//! reaches the public roots), the data plane judges an upstream's renewed leaf with it, and
//! `check` and the upstream's `insecure` mode use the verifier. Pure: no I/O, the anchors and
//! the time come in as arguments.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The rustls provider used everywhere (ring).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The path webpki builds from `leaf` through `intermediates` to one of `anchors`, valid for
/// server authentication at `now`.
pub fn server_path<'p>(
    leaf: &'p webpki::EndEntityCert<'p>,
    anchors: &'p [TrustAnchor<'_>],
    intermediates: &'p [CertificateDer<'p>],
    now: UnixTime,
) -> Result<webpki::VerifiedPath<'p>, webpki::Error> {
    leaf.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        anchors,
        intermediates,
        now,
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
}

/// Whether `leaf` names `host`; a `*.` wildcard host is checked with a name the wildcard
/// covers, so a certificate for the wildcard (or for that name) passes.
pub fn names_host(leaf: &webpki::EndEntityCert<'_>, host: &str) -> bool {
    let probe = match host.strip_prefix("*.") {
        Some(parent) => format!("h3-ingress-name-check.{parent}"),
        None => host.to_string(),
    };
    ServerName::try_from(probe.as_str())
        .is_ok_and(|name| leaf.verify_is_valid_for_subject_name(&name).is_ok())
}

/// Accepts any server certificate but still checks the handshake signatures against it.
/// For `upstream.verify: insecure`, `check --insecure`, the served-certificate verifier's
/// signatures, and tests that compare the served certificate themselves.
#[derive(Debug)]
pub struct AnyServerCertificate(Arc<rustls::crypto::CryptoProvider>);

impl AnyServerCertificate {
    pub fn new() -> Arc<Self> {
        Arc::new(Self(provider()))
    }
}

impl ServerCertVerifier for AnyServerCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
