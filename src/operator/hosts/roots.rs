//! Whether a host's certificate chain verifies against a set of trust anchors.
//!
//! Chrome negotiates QUIC only with certificates that chain to a publicly trusted root: with
//! a private CA it refuses the handshake and stays on HTTP/2, even when that CA is trusted on
//! the machine (Firefox and Safari may still use HTTP/3). The operator asks this once per
//! Secret version with [`PUBLIC_ROOTS`], so the status can say which hosts Chrome will not
//! use HTTP/3 for. A chain that does not verify is not always private: a Secret holding only
//! the leaf (its intermediate missing, as some issuers and manual installs leave it) cannot
//! be judged here, while a browser that has or fetches the intermediate may accept it; that
//! is [`Roots::Incomplete`]. Pure: the anchors and the time come in as arguments.

use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, TrustAnchor, UnixTime};

use crate::pki;

/// The public web roots (Mozilla's root program, as the `webpki-roots` crate ships it): the
/// nearest stand-in for Chrome's own list that needs no I/O.
pub const PUBLIC_ROOTS: &[TrustAnchor<'static>] = webpki_roots::TLS_SERVER_ROOTS;

/// Whether `cert_pem` (the leaf, then the intermediates, as in a Secret's `tls.crt`) is a
/// chain from one of `anchors` that is valid for server authentication at `now_unix` and
/// names `host` (a `*.` wildcard host is checked with a name the wildcard covers). Anything
/// that does not parse does not verify.
pub fn chain_verifies(
    cert_pem: &[u8],
    host: &str,
    anchors: &[TrustAnchor<'_>],
    now_unix: i64,
) -> bool {
    let Ok(chain) = CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>() else {
        return false;
    };
    let Some((leaf, intermediates)) = chain.split_first() else {
        return false;
    };
    let Ok(ee) = webpki::EndEntityCert::try_from(leaf) else {
        return false;
    };
    let Ok(secs) = u64::try_from(now_unix) else {
        return false;
    };
    let now = UnixTime::since_unix_epoch(Duration::from_secs(secs));
    pki::server_path(&ee, anchors, intermediates, now).is_ok() && pki::names_host(&ee, host)
}

/// What a Secret's chain (`tls.crt`) says about the trust anchors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roots {
    /// It verifies against the anchors ([`chain_verifies`]).
    Public,
    /// It does not, though it is complete: the leaf is self-signed, or its issuer is in the
    /// Secret (an intermediate, whose own issuer clients are expected to hold) or among the
    /// anchors by name. A private CA, or a chain that fails for another reason.
    Private,
    /// The leaf's issuer is neither in the Secret nor among the anchors: the chain lacks its
    /// intermediate, so whether it reaches an anchor cannot be told here. h3-ingress sends what
    /// the Secret holds, as the TCP ingress does, so a client without the intermediate fails
    /// over HTTP/3 as over TCP; browsers that have or fetch it may accept it.
    Incomplete,
}

impl Roots {
    /// `Some(true)` public, `Some(false)` private, `None` unknown (incomplete), as host reports
    /// carry it.
    pub fn verdict(self) -> Option<bool> {
        match self {
            Roots::Public => Some(true),
            Roots::Private => Some(false),
            Roots::Incomplete => None,
        }
    }
}

/// Judges `cert_pem` for `host` against `anchors` at `now_unix`: [`Roots::Public`] when it
/// verifies, else [`Roots::Incomplete`] when the leaf's issuer is missing, else
/// [`Roots::Private`]. Anything that does not parse is private (it does not verify, and is
/// not a chain one could complete).
pub fn judge(cert_pem: &[u8], host: &str, anchors: &[TrustAnchor<'_>], now_unix: i64) -> Roots {
    if chain_verifies(cert_pem, host, anchors, now_unix) {
        Roots::Public
    } else if leaf_issuer_missing(cert_pem, anchors) {
        Roots::Incomplete
    } else {
        Roots::Private
    }
}

/// [`judge`] against the public web roots.
pub fn public_roots(cert_pem: &[u8], host: &str, now_unix: i64) -> Roots {
    judge(cert_pem, host, PUBLIC_ROOTS, now_unix)
}

/// Whether the first certificate of `cert_pem` (the leaf) was issued by a name that is neither
/// its own, nor the subject of another certificate there, nor an anchor's subject.
fn leaf_issuer_missing(cert_pem: &[u8], anchors: &[TrustAnchor<'_>]) -> bool {
    let Ok(ders) = CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>() else {
        return false;
    };
    let mut parsed = Vec::with_capacity(ders.len());
    for der in &ders {
        match x509_parser::parse_x509_certificate(der.as_ref()) {
            Ok((_, c)) => parsed.push(c),
            Err(_) => return false,
        }
    }
    let Some((leaf, rest)) = parsed.split_first() else {
        return false;
    };
    let issuer = leaf.issuer().as_raw();
    if leaf.subject().as_raw() == issuer || rest.iter().any(|c| c.subject().as_raw() == issuer) {
        return false;
    }
    // Anchors carry the subject Name's content, without the SEQUENCE header.
    let issuer_content = der_content(issuer);
    !anchors
        .iter()
        .any(|a| Some(a.subject.as_ref()) == issuer_content)
}

/// The content of one DER element (its tag and length left out); `None` when malformed.
fn der_content(tlv: &[u8]) -> Option<&[u8]> {
    let first = *tlv.get(1)?;
    let (header, len) = if first < 0x80 {
        (2, usize::from(first))
    } else {
        let n = usize::from(first & 0x7f);
        let bytes = tlv.get(2..2 + n).filter(|_| (1..=4).contains(&n))?;
        let len = bytes.iter().fold(0usize, |l, b| (l << 8) | usize::from(*b));
        (2 + n, len)
    };
    tlv.get(header..header.checked_add(len)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testcerts::{Ca, DAY, NOW};

    /// A leaf for `names` signed by `issuer`, valid from ten days before NOW for 90 days.
    fn leaf_pem(names: &[&str], issuer: &Ca) -> String {
        issuer.leaf_pem(names, NOW - 10 * DAY, NOW + 80 * DAY)
    }

    fn anchor(ca: &Ca) -> TrustAnchor<'static> {
        webpki::anchor_from_trusted_cert(&ca.der())
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_chain_verifies_against_its_own_root_only() {
        let root = Ca::root("Test Root");
        let leaf = leaf_pem(&["a.example.com"], &root);
        let ours = [anchor(&root)];
        assert!(chain_verifies(leaf.as_bytes(), "a.example.com", &ours, NOW));
        // The same private-CA chain against the public web roots: Chrome's case.
        assert!(!chain_verifies(
            leaf.as_bytes(),
            "a.example.com",
            PUBLIC_ROOTS,
            NOW
        ));
        assert_eq!(
            public_roots(leaf.as_bytes(), "a.example.com", NOW),
            Roots::Incomplete,
            "a leaf alone: its issuer could be a public intermediate left out"
        );
        let other = [anchor(&Ca::root("Test Root"))];
        assert!(!chain_verifies(
            leaf.as_bytes(),
            "a.example.com",
            &other,
            NOW
        ));
    }

    #[test]
    fn intermediates_come_from_the_pem_and_name_and_time_count() {
        let root = Ca::root("Test Root");
        let middle = Ca::intermediate("Test Intermediate", &root);
        let ours = [anchor(&root)];
        let leaf = leaf_pem(&["*.apps.example.com"], &middle);
        let chain = format!("{leaf}{}", middle.pem());
        assert!(chain_verifies(
            chain.as_bytes(),
            "*.apps.example.com",
            &ours,
            NOW
        ));
        assert!(chain_verifies(
            chain.as_bytes(),
            "x.apps.example.com",
            &ours,
            NOW
        ));
        assert!(
            !chain_verifies(leaf.as_bytes(), "*.apps.example.com", &ours, NOW),
            "no intermediate"
        );
        assert!(!chain_verifies(
            chain.as_bytes(),
            "apps.example.com",
            &ours,
            NOW
        ));
        assert!(!chain_verifies(
            chain.as_bytes(),
            "x.apps.example.com",
            &ours,
            NOW + 100 * DAY
        ));
        assert!(!chain_verifies(
            chain.as_bytes(),
            "x.apps.example.com",
            &ours,
            -1
        ));
    }

    #[test]
    fn self_signed_and_garbage_are_private() {
        let (cert, _) = crate::testcerts::self_signed(&["a.example.com"]);
        assert_eq!(
            public_roots(cert.as_bytes(), "a.example.com", NOW),
            Roots::Private
        );
        assert_eq!(public_roots(b"junk", "a.example.com", NOW), Roots::Private);
        assert_eq!(public_roots(b"", "a.example.com", NOW), Roots::Private);
        assert!(!PUBLIC_ROOTS.is_empty());
    }

    /// A leaf whose intermediate the Secret lacks is unknown, not private: the same chain with
    /// the intermediate verifies where its root is an anchor, and is private where it is not.
    #[test]
    fn a_leaf_without_its_intermediate_is_incomplete_not_private() {
        let root = Ca::root("Test Root");
        let middle = Ca::intermediate("Test Intermediate", &root);
        let leaf = leaf_pem(&["a.example.com"], &middle);
        let chain = format!("{leaf}{}", middle.pem());
        let ours = [anchor(&root)];
        let host = "a.example.com";
        assert_eq!(judge(leaf.as_bytes(), host, &ours, NOW), Roots::Incomplete);
        assert_eq!(judge(chain.as_bytes(), host, &ours, NOW), Roots::Public);
        // Against the public roots: the complete private chain is private, the leaf alone
        // unknown.
        assert_eq!(public_roots(chain.as_bytes(), host, NOW), Roots::Private);
        assert_eq!(public_roots(leaf.as_bytes(), host, NOW), Roots::Incomplete);
        assert_eq!(Roots::Incomplete.verdict(), None);
        // With the root too (some Secrets carry it): complete, still private.
        let full = format!("{chain}{}", root.pem());
        assert_eq!(public_roots(full.as_bytes(), host, NOW), Roots::Private);
        // A leaf with some other certificate after it is as incomplete as the leaf alone.
        let unrelated = Ca::root("Unrelated");
        let wrong = format!("{leaf}{}", unrelated.pem());
        assert_eq!(public_roots(wrong.as_bytes(), host, NOW), Roots::Incomplete);
        // Issued by an anchor's name (a leaf signed by a root directly) and still not
        // verifying (another key of that name): complete, so private.
        let direct = leaf_pem(&["a.example.com"], &root);
        let impostor = [anchor(&Ca::root("Test Root"))];
        assert_eq!(
            judge(direct.as_bytes(), host, &impostor, NOW),
            Roots::Private
        );
        assert_eq!(judge(direct.as_bytes(), host, &ours, NOW), Roots::Public);
    }

    #[test]
    fn der_content_reads_short_and_long_lengths() {
        assert_eq!(der_content(&[0x30, 2, 7, 8]), Some(&[7u8, 8][..]));
        let long: Vec<u8> = [0x30, 0x81, 200].into_iter().chain([1u8; 200]).collect();
        assert_eq!(der_content(&long).map(<[u8]>::len), Some(200));
        assert_eq!(der_content(&[0x30, 5, 1]), None, "truncated");
        assert_eq!(der_content(&[0x30]), None);
    }
}
