//! Hosts and their certificates, validated once when the configuration is built.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;

use crate::api::reasons;

/// Why a host cannot be served. Each maps to a per-host reason users see in status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("{0:?} is not a valid host name")]
    InvalidName(String),
    #[error("certificate invalid: {0}")]
    CertificateInvalid(String),
    #[error("certificate is not valid for {host} (it names {names})")]
    DoesNotMatchHost { host: String, names: String },
}

impl HostError {
    /// The status reason constant for this error.
    pub fn reason(&self) -> &'static str {
        match self {
            HostError::InvalidName(_) | HostError::CertificateInvalid(_) => {
                reasons::CERTIFICATE_INVALID
            }
            HostError::DoesNotMatchHost { .. } => reasons::CERTIFICATE_DOES_NOT_MATCH_HOST,
        }
    }
}

/// One servable host: its name (lowercase, possibly `*.domain`) and its certified key.
pub struct HostEntry {
    pub name: String,
    /// Shared by every host served with the same certificate ([`Certificate::host`]).
    pub certified_key: Arc<CertifiedKey>,
    /// Seconds since the epoch after which the leaf certificate is no longer valid.
    pub not_after: i64,
    /// SHA-256 of the leaf certificate, hex; lets logs and status tell certificates apart.
    pub leaf_sha256: String,
    /// Where this host's requests go when not to the configuration's upstream (a Gateway
    /// run by its own proxy).
    pub upstream: Option<super::UpstreamAddress>,
    /// Where the host comes from, as people read it (`Ingress shop/web`); may be empty.
    pub source: String,
    /// `namespace/name` of the Secret the certificate comes from, when there is one.
    pub secret: Option<Arc<str>>,
}

impl fmt::Debug for HostEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostEntry")
            .field("name", &self.name)
            .field("not_after", &self.not_after)
            .field("leaf_sha256", &self.leaf_sha256)
            .field("upstream", &self.upstream)
            .finish()
    }
}

impl HostEntry {
    /// Builds a host from PEM text. Pure: `now_unix` is passed in so tests control time.
    pub fn from_pem(
        name: &str,
        cert_pem: &[u8],
        key_pem: &[u8],
        now_unix: i64,
    ) -> Result<HostEntry, HostError> {
        normalize_host_name(name)?;
        Certificate::from_pem(cert_pem, key_pem)?.host(name, now_unix)
    }

    pub fn from_der(
        name: &str,
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        now_unix: i64,
    ) -> Result<HostEntry, HostError> {
        normalize_host_name(name)?;
        Certificate::from_der(chain, key)?.host(name, now_unix)
    }

    /// The leaf certificate we serve (used to verify the upstream in `servedCertificate` mode).
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.certified_key.cert[0]
    }
}

/// A certificate chain with its private key, parsed and checked once. Parsing the key is the
/// expensive part of loading a host (an RSA key costs far more than checking a name), so a
/// certificate that serves several hosts is parsed once and its [`CertifiedKey`] shared.
pub struct Certificate {
    certified_key: Arc<CertifiedKey>,
    not_before: i64,
    not_after: i64,
    leaf_sha256: String,
    /// The names the leaf carries, for [`HostError::DoesNotMatchHost`].
    names: String,
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("not_after", &self.not_after)
            .field("leaf_sha256", &self.leaf_sha256)
            .finish()
    }
}

impl Certificate {
    /// Parses a PEM chain (leaf first) and its PEM private key.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<Certificate, HostError> {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|e| HostError::CertificateInvalid(format!("certificate PEM: {e}")))?;
        if chain.is_empty() {
            return Err(HostError::CertificateInvalid(
                "no CERTIFICATE block in the certificate PEM".into(),
            ));
        }
        let key = PrivateKeyDer::from_pem_slice(key_pem)
            .map_err(|e| HostError::CertificateInvalid(format!("private key PEM: {e}")))?;
        Self::from_der(chain, key)
    }

    /// Checks that the leaf parses and that `key` belongs to it. Validity in time and names
    /// are checked per host ([`Self::host`]), so one parse serves every host and every
    /// later expiry check.
    pub fn from_der(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Certificate, HostError> {
        let leaf = chain
            .first()
            .ok_or_else(|| HostError::CertificateInvalid("empty certificate chain".into()))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| HostError::CertificateInvalid(format!("leaf certificate: {e}")))?;
        let not_after = parsed.validity().not_after.timestamp();
        let not_before = parsed.validity().not_before.timestamp();
        let names = subject_names(&parsed);
        webpki::EndEntityCert::try_from(leaf)
            .map_err(|e| HostError::CertificateInvalid(format!("leaf certificate: {e:?}")))?;
        let signing_key = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| HostError::CertificateInvalid(format!("private key: {e}")))?;
        let certified = CertifiedKey::new(chain, signing_key);
        if let Err(e) = certified.keys_match() {
            return Err(HostError::CertificateInvalid(format!(
                "private key does not belong to the certificate: {e}"
            )));
        }
        let leaf_sha256 = {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(certified.cert[0].as_ref()))
        };
        Ok(Certificate {
            certified_key: Arc::new(certified),
            not_before,
            not_after,
            leaf_sha256,
            names,
        })
    }

    pub fn not_after(&self) -> i64 {
        self.not_after
    }

    pub fn leaf_sha256(&self) -> &str {
        &self.leaf_sha256
    }

    /// Whether the leaf is valid at `now_unix`. Certificates expire without any event, so
    /// this is asked again as time passes; the answer needs no parsing.
    pub fn check_time(&self, now_unix: i64) -> Result<(), HostError> {
        let date = |t: i64| {
            x509_parser::time::ASN1Time::from_timestamp(t)
                .map_or_else(|_| format!("{t} (Unix time)"), |a| a.to_string())
        };
        if now_unix > self.not_after {
            return Err(HostError::CertificateInvalid(format!(
                "expired at {}",
                date(self.not_after)
            )));
        }
        if now_unix < self.not_before {
            return Err(HostError::CertificateInvalid(format!(
                "not valid before {}",
                date(self.not_before)
            )));
        }
        Ok(())
    }

    /// The normalised `name` if the leaf covers it (a wildcard host is checked with a name
    /// the wildcard covers). Independent of time.
    pub fn check_name(&self, name: &str) -> Result<String, HostError> {
        let name = normalize_host_name(name)?;
        let probe = match name.strip_prefix("*.") {
            Some(parent) => format!("h3-ingress-name-check.{parent}"),
            None => name.clone(),
        };
        let server_name = ServerName::try_from(probe.as_str())
            .map_err(|_| HostError::InvalidName(name.clone()))?;
        let ee = webpki::EndEntityCert::try_from(&self.certified_key.cert[0])
            .map_err(|e| HostError::CertificateInvalid(format!("leaf certificate: {e:?}")))?;
        if ee.verify_is_valid_for_subject_name(&server_name).is_err() {
            return Err(HostError::DoesNotMatchHost {
                host: name,
                names: self.names.clone(),
            });
        }
        Ok(name)
    }

    /// `name` served with this certificate at `now_unix`: valid in time, then for the name.
    pub fn host(&self, name: &str, now_unix: i64) -> Result<HostEntry, HostError> {
        self.check_time(now_unix)?;
        let name = self.check_name(name)?;
        Ok(self.entry(name))
    }

    /// A host entry for an already checked, normalised name.
    pub fn entry(&self, name: String) -> HostEntry {
        HostEntry {
            name,
            certified_key: self.certified_key.clone(),
            not_after: self.not_after,
            leaf_sha256: self.leaf_sha256.clone(),
            upstream: None,
            source: String::new(),
            secret: None,
        }
    }
}

fn subject_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> String {
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.to_string());
            }
        }
    }
    if names.is_empty() {
        for cn in cert.subject().iter_common_name() {
            if let Ok(s) = cn.as_str() {
                names.push(format!("CN={s}"));
            }
        }
    }
    if names.is_empty() {
        "no DNS names".into()
    } else {
        names.join(", ")
    }
}

/// Lowercases and checks a host name; `*.example.com` is allowed (one leading label).
pub fn normalize_host_name(name: &str) -> Result<String, HostError> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    let rest = lower.strip_prefix("*.").unwrap_or(&lower);
    if !is_dns_name(rest) || !rest.contains('.') && lower.starts_with("*.") {
        return Err(HostError::InvalidName(name.to_string()));
    }
    Ok(lower)
}

/// RFC 1123 host name: labels of letters, digits and inner hyphens, 1-63 bytes, 253 in all.
pub fn is_dns_name(s: &str) -> bool {
    if s.is_empty() || s.len() > 253 {
        return false;
    }
    s.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
    })
}

/// The wildcard name that would cover `host`: `*.example.com` for `a.example.com`. A wildcard
/// covers exactly one non-empty label, as in certificates (RFC 6125 6.4.3), so `a.b.example.com`
/// and `example.com` are not covered by `*.example.com`. Expects a lowercase name.
pub fn covering_wildcard(host: &str) -> Option<String> {
    let (label, parent) = host.split_once('.')?;
    (!label.is_empty() && label != "*").then(|| format!("*.{parent}"))
}

/// Whether the host name `pattern` (a name or a `*.` wildcard) serves `host`, ignoring case:
/// the same name, or the wildcard that covers it (`covering_wildcard`).
pub fn host_matches(pattern: &str, host: &str) -> bool {
    let (pattern, host) = (pattern.to_ascii_lowercase(), host.to_ascii_lowercase());
    pattern == host || covering_wildcard(&host).is_some_and(|w| w == pattern)
}

/// The hosts a configuration serves, looked up by SNI and by `:authority`.
#[derive(Debug, Clone, Default)]
pub struct HostTable {
    hosts: BTreeMap<String, Arc<HostEntry>>,
}

impl HostTable {
    /// Adds a host; a second entry for the same name is refused (returns false).
    pub fn insert(&mut self, entry: HostEntry) -> bool {
        if self.hosts.contains_key(&entry.name) {
            return false;
        }
        self.hosts.insert(entry.name.clone(), Arc::new(entry));
        true
    }

    /// The entry named exactly `name` (lowercase), wildcards not expanded.
    pub fn get(&self, name: &str) -> Option<&Arc<HostEntry>> {
        self.hosts.get(name)
    }

    /// Exact name first, then the wildcard that covers it ([`host_matches`] as a map lookup).
    pub fn lookup(&self, name: &str) -> Option<&Arc<HostEntry>> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(h) = self.hosts.get(&name) {
            return Some(h);
        }
        self.hosts.get(&covering_wildcard(&name)?)
    }

    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.hosts.keys().map(|s| s.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<HostEntry>> {
        self.hosts.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcerts::self_signed;

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    #[test]
    fn valid_host_loads() {
        let (c, k) = self_signed(&["a.example.com"]);
        let h = HostEntry::from_pem("A.Example.com", c.as_bytes(), k.as_bytes(), now()).unwrap();
        assert_eq!(h.name, "a.example.com");
        assert_eq!(h.leaf_sha256.len(), 64);
    }

    #[test]
    fn wrong_name_is_reported_with_the_names_the_certificate_has() {
        let (c, k) = self_signed(&["a.example.com"]);
        let e =
            HostEntry::from_pem("b.example.com", c.as_bytes(), k.as_bytes(), now()).unwrap_err();
        assert_eq!(e.reason(), reasons::CERTIFICATE_DOES_NOT_MATCH_HOST);
        assert!(e.to_string().contains("a.example.com"), "{e}");
    }

    #[test]
    fn mismatched_key_and_garbage_are_invalid() {
        let (c, _) = self_signed(&["a.example.com"]);
        let (_, other_key) = self_signed(&["a.example.com"]);
        let e = HostEntry::from_pem("a.example.com", c.as_bytes(), other_key.as_bytes(), now())
            .unwrap_err();
        assert_eq!(e.reason(), reasons::CERTIFICATE_INVALID);
        let e = HostEntry::from_pem("a.example.com", b"junk", b"junk", now()).unwrap_err();
        assert_eq!(e.reason(), reasons::CERTIFICATE_INVALID);
    }

    #[test]
    fn expired_certificate_is_invalid() {
        let mut params = rcgen::CertificateParams::new(vec!["a.example.com".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let e = HostEntry::from_pem(
            "a.example.com",
            cert.pem().as_bytes(),
            key.serialize_pem().as_bytes(),
            now(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("expired"), "{e}");
    }

    #[test]
    fn wildcard_lookup_covers_one_label() {
        let (c, k) = self_signed(&["*.example.com"]);
        let mut t = HostTable::default();
        assert!(t.insert(
            HostEntry::from_pem("*.example.com", c.as_bytes(), k.as_bytes(), now()).unwrap()
        ));
        assert!(t.lookup("x.example.com").is_some());
        assert!(t.lookup("X.EXAMPLE.COM.").is_some());
        assert!(t.lookup("a.b.example.com").is_none());
        assert!(t.lookup("example.com").is_none());
    }

    #[test]
    fn wildcards_cover_exactly_one_label() {
        assert!(host_matches("SHOP.example.com", "shop.EXAMPLE.com"));
        assert!(host_matches("*.example.com", "a.example.com"));
        assert!(host_matches("*.Example.com", "A.example.COM"));
        assert!(host_matches("*.example.com", "*.example.com"));
        assert!(!host_matches("*.example.com", "a.b.example.com"));
        assert!(!host_matches("*.example.com", "example.com"));
        assert!(!host_matches("*.example.com", ".example.com"));
        assert!(!host_matches("a.example.com", "b.example.com"));
        assert!(!host_matches("a.example.com", "*.example.com"));
        assert_eq!(
            covering_wildcard("a.example.com").as_deref(),
            Some("*.example.com")
        );
        assert_eq!(covering_wildcard("*.example.com"), None);
        assert_eq!(covering_wildcard("localhost"), None);
    }

    #[test]
    fn names_are_checked() {
        assert!(normalize_host_name("ok-host.example").is_ok());
        assert!(normalize_host_name("-bad.example").is_err());
        assert!(normalize_host_name("bad_host.example").is_err());
        assert!(normalize_host_name("*.com").is_err());
        assert!(normalize_host_name("").is_err());
    }
}
