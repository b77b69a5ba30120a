//! Whether a host's certificate chain verifies against a set of trust anchors.
//!
//! Chrome negotiates QUIC only with certificates that chain to a publicly trusted root: with
//! a private CA it refuses the handshake and stays on HTTP/2, even when that CA is trusted on
//! the machine (Firefox and Safari may still use HTTP/3). The operator asks this once per
//! Secret version with [`PUBLIC_ROOTS`], so the status can say which hosts Chrome will not
//! use HTTP/3 for. Pure: the anchors and the time come in as arguments.

use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};

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
    let chained = ee
        .verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            anchors,
            intermediates,
            now,
            webpki::KeyUsage::server_auth(),
            None,
            None,
        )
        .is_ok();
    let probe = match host.strip_prefix("*.") {
        Some(parent) => format!("h3-ingress-name-check.{parent}"),
        None => host.to_string(),
    };
    let named = ServerName::try_from(probe.as_str())
        .is_ok_and(|name| ee.verify_is_valid_for_subject_name(&name).is_ok());
    chained && named
}

/// [`chain_verifies`] against the public web roots.
pub fn publicly_trusted(cert_pem: &[u8], host: &str, now_unix: i64) -> bool {
    chain_verifies(cert_pem, host, PUBLIC_ROOTS, now_unix)
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
        assert!(!publicly_trusted(leaf.as_bytes(), "a.example.com", NOW));
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
    fn self_signed_and_garbage_are_not_trusted() {
        let (cert, _) = crate::testcerts::self_signed(&["a.example.com"]);
        assert!(!publicly_trusted(cert.as_bytes(), "a.example.com", NOW));
        assert!(!publicly_trusted(b"junk", "a.example.com", NOW));
        assert!(!publicly_trusted(b"", "a.example.com", NOW));
        assert!(!PUBLIC_ROOTS.is_empty());
    }
}
