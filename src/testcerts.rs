//! Certificates for unit tests: roots, intermediates and server leaves with chosen validity
//! around one fixed test time, so that chain and renewal checks are tested against the same
//! kind of PKI. Compiled only for tests.

use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Test time: 2027-01-15 (Unix seconds). CAs are valid from ten days before it for a year.
pub const NOW: i64 = 1_800_000_000;
pub const DAY: i64 = 86_400;

/// A self-signed certificate and key for `names`, PEM: the simplest certificate a host can be
/// served with (not a chain; [`Ca`] makes those).
pub fn self_signed(names: &[&str]) -> (String, String) {
    let ck =
        rcgen::generate_simple_self_signed(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    (ck.cert.pem(), ck.signing_key.serialize_pem())
}

/// Valid from `from` to `to` (Unix seconds).
fn validity(p: &mut CertificateParams, from: i64, to: i64) {
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    p.not_before = epoch + Duration::from_secs(from as u64);
    p.not_after = epoch + Duration::from_secs(to as u64);
}

/// A certificate authority: a root, or an intermediate signed by another `Ca`.
pub struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    /// A self-signed root named `cn` (two roots of one name differ only in their keys).
    pub fn root(cn: &str) -> Self {
        Self::build(cn, None)
    }

    /// An intermediate named `cn`, signed by `issuer`.
    pub fn intermediate(cn: &str, issuer: &Ca) -> Self {
        Self::build(cn, Some(issuer))
    }

    fn build(cn: &str, issuer: Option<&Ca>) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut p, NOW - 10 * DAY, NOW + 365 * DAY);
        let key = KeyPair::generate().unwrap();
        Ca(match issuer {
            None => CertifiedIssuer::self_signed(p, key).unwrap(),
            Some(i) => CertifiedIssuer::signed_by(p, key, &i.0).unwrap(),
        })
    }

    pub fn der(&self) -> CertificateDer<'static> {
        self.0.der().clone()
    }

    pub fn pem(&self) -> String {
        self.0.pem()
    }

    /// A server leaf for `names` (the first is its common name), valid from `from` for 30 days.
    pub fn leaf(&self, names: &[&str], from: i64) -> CertificateDer<'static> {
        self.leaf_with_key(names, from, from + 30 * DAY).0
    }

    /// A server leaf for `names` valid from `from` to `to`, with its private key.
    pub fn leaf_with_key(
        &self,
        names: &[&str],
        from: i64,
        to: i64,
    ) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let (cert, key) = self.signed_leaf(names, from, to);
        let key = PrivatePkcs8KeyDer::from(key.serialize_der());
        (cert.der().clone(), PrivateKeyDer::Pkcs8(key))
    }

    /// The same leaf as PEM, as a Secret's `tls.crt` holds it.
    pub fn leaf_pem(&self, names: &[&str], from: i64, to: i64) -> String {
        self.signed_leaf(names, from, to).0.pem()
    }

    fn signed_leaf(&self, names: &[&str], from: i64, to: i64) -> (rcgen::Certificate, KeyPair) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut p = CertificateParams::new(names.clone()).unwrap();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name
            .push(DnType::CommonName, names[0].clone());
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut p, from, to);
        let key = KeyPair::generate().unwrap();
        (p.signed_by(&key, &self.0).unwrap(), key)
    }
}
