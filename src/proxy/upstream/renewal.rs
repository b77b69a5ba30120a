//! `upstream.verify: servedCertificate` while a certificate is renewed.
//!
//! In that mode the TCP ingress must present exactly the leaf this proxy serves for the host.
//! When cert-manager renews a certificate, the ingress and this proxy each load the new Secret
//! on their own, seconds (or, for an ingress that reloads slowly, minutes) apart, and in
//! between every new upstream connection would fail with 502. For
//! `upstream.servedCertificateGraceSeconds` this module accepts two other leaves:
//!
//! - **previous**: the leaf this proxy served for the host until it switched to the current
//!   one, for the grace period after the switch (this proxy switched first). It is a leaf we
//!   served ourselves moments ago, so the ingress presenting it is the ingress that owned the
//!   name moments ago.
//! - **next**: a renewal this proxy has not loaded yet (the ingress switched first), for the
//!   grace period after the ingress first presented it. A leaf counts as the renewal of ours
//!   only if it names exactly the same DNS names, is issued after ours (a later notBefore),
//!   is valid now for the host and for server authentication, and is signed by the very key
//!   that signed ours: the issuer's certificate, taken from our own chain or from the chain
//!   the ingress sent, must first verify our leaf's signature, and then the presented leaf's.
//!   So the only certificates let through are ones our own issuer made for our own names,
//!   newer than ours (for a public ACME CA that means someone proved control of those names;
//!   for a private issuer, someone allowed to use it), where `verify: system` would trust any
//!   of ~150 CAs for the name. When neither chain carries the issuer (a leaf-only Secret from
//!   a root CA), no next leaf can be recognised and only the previous one is.
//!
//! Anything else is refused as before, and so is either leaf once its grace has passed.
//! Memory is bounded: one previous leaf per host, [`NEXT_CAP`] sightings of next leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntCounterVec;
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};
use sha2::{Digest, Sha256};

use crate::config::HostTable;

/// Values of the `leaf` label of `h3_ingress_upstream_certificate_grace_total`.
use crate::proxy::observe::metrics::renewal_leaf as leaf;

/// Renewed leaves the ingress showed before this proxy loaded them, remembered at once.
pub const NEXT_CAP: usize = 1024;
/// Nothing is remembered longer than the largest grace the setting allows.
const FORGET_AFTER_SECS: i64 = crate::api::bounds::SERVED_CERTIFICATE_GRACE_SECONDS.max as i64;

/// Which other leaf was accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaf {
    Previous,
    Next,
}

impl Leaf {
    pub fn as_str(self) -> &'static str {
        match self {
            Leaf::Previous => leaf::PREVIOUS,
            Leaf::Next => leaf::NEXT,
        }
    }
}

#[derive(Debug)]
struct Replaced {
    leaf: Vec<u8>,
    at: i64,
}

/// What the verifiers of every configuration generation share: the leaves hosts served before
/// (a reload builds a new verifier, which must still know them) and the first sighting of each
/// renewed leaf.
#[derive(Debug)]
pub struct Renewals {
    previous: Mutex<HashMap<String, Replaced>>,
    next: Mutex<HashMap<(String, [u8; 32]), i64>>,
    /// Handshakes accepted with another leaf, by `leaf`.
    pub accepted: IntCounterVec,
}

impl Renewals {
    pub fn new(accepted: IntCounterVec) -> Arc<Self> {
        for l in leaf::ALL {
            accepted.with_label_values(&[l]);
        }
        Arc::new(Self {
            previous: Mutex::new(HashMap::new()),
            next: Mutex::new(HashMap::new()),
            accepted,
        })
    }

    /// Notes, at `now` (Unix seconds), every host whose leaf differs between the running table
    /// `old` and the table `new` replacing it, and forgets hosts `new` no longer has.
    pub fn switched(&self, old: &HostTable, new: &HostTable, now: i64) {
        let mut previous = self.previous.lock().expect("not poisoned");
        previous.retain(|name, r| {
            new.lookup(name).is_some_and(|e| &e.name == name) && now - r.at <= FORGET_AFTER_SECS
        });
        for entry in new.iter() {
            let Some(before) = old.lookup(&entry.name).filter(|o| o.name == entry.name) else {
                continue;
            };
            if before.leaf().as_ref() != entry.leaf().as_ref() {
                previous.insert(
                    entry.name.clone(),
                    Replaced {
                        leaf: before.leaf().to_vec(),
                        at: now,
                    },
                );
            }
        }
    }

    /// Whether the upstream's leaf (not ours) may stand in for ours: the leaf `host` served
    /// before, or a renewal of `ours` (our chain, leaf first), within `grace`. Records the first
    /// sighting of a renewal.
    pub fn judge(
        &self,
        host: &str,
        ours: &[CertificateDer<'_>],
        theirs: &Presented<'_>,
        grace: Duration,
    ) -> Option<Leaf> {
        let Presented {
            leaf: presented,
            intermediates,
            server_name,
            now,
        } = *theirs;
        let (secs, grace) = (now.as_secs() as i64, grace.as_secs() as i64);
        if grace == 0 {
            return None;
        }
        let previous = self.previous.lock().expect("not poisoned");
        if previous
            .get(host)
            .is_some_and(|r| r.leaf == presented.as_ref() && secs - r.at <= grace)
        {
            return Some(Leaf::Previous);
        }
        drop(previous);
        is_renewal(ours, presented, intermediates, server_name, now).ok()?;
        let key = (host.to_string(), Sha256::digest(presented.as_ref()).into());
        let mut next = self.next.lock().expect("not poisoned");
        if next.len() >= NEXT_CAP && !next.contains_key(&key) {
            next.retain(|_, first| secs - *first <= FORGET_AFTER_SECS);
            if next.len() >= NEXT_CAP {
                return None;
            }
        }
        let first = *next.entry(key).or_insert(secs);
        (secs - first <= grace).then_some(Leaf::Next)
    }
}

/// What the upstream presented in one handshake.
#[derive(Clone, Copy)]
pub struct Presented<'a> {
    pub leaf: &'a CertificateDer<'a>,
    pub intermediates: &'a [CertificateDer<'a>],
    pub server_name: &'a ServerName<'a>,
    pub now: UnixTime,
}

/// Why a leaf is not a renewal of ours (for tests and logs).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotRenewal {
    #[error("a certificate does not parse")]
    Unparsable,
    #[error("not issued after ours")]
    NotNewer,
    #[error("names other DNS names than ours")]
    OtherNames,
    #[error("another issuer than ours")]
    OtherIssuer,
    #[error("no certificate of our issuer that verifies our leaf")]
    IssuerUnknown,
    #[error("not valid for the host now, or not signed by our issuer")]
    Invalid,
}

/// Whether `presented` is a renewal of the leaf `ours[0]` (see the module's doc). Pure.
pub fn is_renewal(
    ours: &[CertificateDer<'_>],
    presented: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<(), NotRenewal> {
    let ours_leaf = ours.first().ok_or(NotRenewal::Unparsable)?;
    let parse = |c: &CertificateDer<'_>| {
        x509_parser::parse_x509_certificate(c.as_ref())
            .map(|(_, p)| {
                let from = p.validity().not_before.timestamp();
                (from, dns_names(&p), p.issuer().as_raw().to_vec())
            })
            .map_err(|_| NotRenewal::Unparsable)
    };
    let (ours_from, ours_names, ours_issuer) = parse(ours_leaf)?;
    let (theirs_from, theirs_names, theirs_issuer) = parse(presented)?;
    if theirs_from <= ours_from {
        return Err(NotRenewal::NotNewer);
    }
    if ours_names.is_empty() || theirs_names != ours_names {
        return Err(NotRenewal::OtherNames);
    }
    if theirs_issuer != ours_issuer {
        return Err(NotRenewal::OtherIssuer);
    }
    // Our issuer is whichever certificate of either chain verifies our own leaf (webpki checks
    // that its subject is our leaf's issuer, and the signature).
    let issuer = ours[1..]
        .iter()
        .chain(intermediates)
        .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
        .find(|anchor| verify_under(ours_leaf, anchor, now, None).is_ok())
        .ok_or(NotRenewal::IssuerUnknown)?;
    verify_under(presented, &issuer, now, Some(server_name))
}

/// Whether `leaf` is signed by `issuer`, valid at `now` for server authentication, and (when
/// given) valid for `name`.
fn verify_under(
    leaf: &CertificateDer<'_>,
    issuer: &TrustAnchor<'_>,
    now: UnixTime,
    name: Option<&ServerName<'_>>,
) -> Result<(), NotRenewal> {
    let ee = webpki::EndEntityCert::try_from(leaf).map_err(|_| NotRenewal::Unparsable)?;
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        std::slice::from_ref(issuer),
        &[],
        now,
        webpki::KeyUsage::server_auth(),
        None,
        None,
    )
    .map_err(|_| NotRenewal::Invalid)?;
    match name {
        Some(n) => ee
            .verify_is_valid_for_subject_name(n)
            .map_err(|_| NotRenewal::Invalid),
        None => Ok(()),
    }
}

/// The DNS names of a certificate's subjectAltName, lowercased and sorted.
fn dns_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    let mut names: Vec<String> = match cert.subject_alternative_name() {
        Ok(Some(san)) => san
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    };
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HostEntry;
    use crate::testcerts::{Ca, DAY, NOW};
    use prometheus::Opts;
    use rustls::pki_types::PrivateKeyDer;

    fn name(host: &str) -> ServerName<'static> {
        ServerName::try_from(host.to_string()).unwrap()
    }

    fn now(secs: i64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs as u64))
    }

    #[test]
    fn a_renewal_is_a_newer_leaf_for_the_same_names_signed_by_our_issuer() {
        let ca = Ca::root("h3i CA");
        let ours = ca.leaf(&["a.test", "www.a.test"], NOW - DAY);
        let next = ca.leaf(&["www.a.test", "a.test"], NOW - 60);
        let host = name("a.test");
        let check =
            |ours: &[CertificateDer<'_>], p: &CertificateDer<'_>, inter: &[CertificateDer<'_>]| {
                is_renewal(ours, p, inter, &host, now(NOW))
            };
        // Our issuer from our chain, or from the chain the upstream sends.
        assert_eq!(check(&[ours.clone(), ca.der()], &next, &[]), Ok(()));
        assert_eq!(
            check(std::slice::from_ref(&ours), &next, &[ca.der()]),
            Ok(())
        );
        assert_eq!(
            check(std::slice::from_ref(&ours), &next, &[]),
            Err(NotRenewal::IssuerUnknown)
        );
        // Not newer: our own leaf, or an older one.
        let older = ca.leaf(&["a.test", "www.a.test"], NOW - 2 * DAY);
        assert_eq!(
            check(&[ours.clone(), ca.der()], &older, &[]),
            Err(NotRenewal::NotNewer)
        );
        // Other names: fewer, more.
        for names in [&["a.test"][..], &["a.test", "www.a.test", "b.test"][..]] {
            let other = ca.leaf(names, NOW - 60);
            assert_eq!(
                check(&[ours.clone(), ca.der()], &other, &[]),
                Err(NotRenewal::OtherNames)
            );
        }
        // Not valid yet, or expired a second ago.
        let future = ca.leaf(&["a.test", "www.a.test"], NOW + 60);
        assert_eq!(
            check(&[ours.clone(), ca.der()], &future, &[]),
            Err(NotRenewal::Invalid)
        );
        let names = ["a.test", "www.a.test"];
        let (expired, _) = ca.leaf_with_key(&names, NOW - DAY + 1, NOW - 1);
        assert_eq!(
            check(&[ours.clone(), ca.der()], &expired, &[]),
            Err(NotRenewal::Invalid)
        );
        // Valid for the names but not for the host asked for.
        let other_host = is_renewal(
            &[ours.clone(), ca.der()],
            &next,
            &[],
            &name("b.test"),
            now(NOW),
        );
        assert_eq!(other_host, Err(NotRenewal::Invalid));
    }

    #[test]
    fn a_foreign_issuer_never_passes_even_under_our_issuers_name() {
        let ca = Ca::root("h3i CA");
        let ours = ca.leaf(&["a.test"], NOW - DAY);
        let host = name("a.test");
        // Same issuer name, another key: the forged CA's leaf does not verify with ours, and
        // the forged CA sent along does not verify our leaf, so it is never taken as issuer.
        let forged = Ca::root("h3i CA");
        let theirs = forged.leaf(&["a.test"], NOW - 60);
        let verdict = |inter: &[CertificateDer<'_>]| {
            is_renewal(&[ours.clone(), ca.der()], &theirs, inter, &host, now(NOW))
        };
        assert_eq!(verdict(&[]), Err(NotRenewal::Invalid));
        assert_eq!(verdict(&[forged.der()]), Err(NotRenewal::Invalid));
        assert_eq!(
            is_renewal(
                std::slice::from_ref(&ours),
                &theirs,
                &[forged.der()],
                &host,
                now(NOW)
            ),
            Err(NotRenewal::IssuerUnknown)
        );
        // Another issuer name altogether.
        let other = Ca::root("other CA").leaf(&["a.test"], NOW - 60);
        assert_eq!(
            is_renewal(&[ours, ca.der()], &other, &[], &host, now(NOW)),
            Err(NotRenewal::OtherIssuer)
        );
    }

    #[test]
    fn previous_and_next_leaves_pass_only_within_the_grace() {
        let ca = Ca::root("h3i CA");
        let (l1, k1) = ca.leaf_with_key(&["a.test"], NOW - DAY, NOW + 30 * DAY);
        let (l2, k2) = ca.leaf_with_key(&["a.test"], NOW - 60, NOW + 30 * DAY);
        let table = |leaf: &CertificateDer<'static>, key: PrivateKeyDer<'static>| {
            let mut t = HostTable::default();
            let chain = vec![leaf.clone(), ca.der()];
            assert!(t.insert(HostEntry::from_der("a.test", chain, key, NOW).unwrap()));
            t
        };
        let (t1, t2) = (table(&l1, k1), table(&l2, k2));
        let counter = IntCounterVec::new(Opts::new("grace", "-"), &["leaf"]).unwrap();
        let host = name("a.test");
        let grace = Duration::from_secs(300);
        let judge = |r: &Renewals, t: &HostTable, p: &CertificateDer<'_>, at: i64, g: Duration| {
            let ours = &t.lookup("a.test").unwrap().certified_key.cert;
            let theirs = Presented {
                leaf: p,
                intermediates: &[],
                server_name: &host,
                now: now(at),
            };
            r.judge("a.test", ours, &theirs, g)
        };

        // This proxy switched first: the ingress still presents l1.
        let r = Renewals::new(counter.clone());
        r.switched(&t1, &t2, NOW);
        assert_eq!(judge(&r, &t2, &l1, NOW + 300, grace), Some(Leaf::Previous));
        assert_eq!(judge(&r, &t2, &l1, NOW + 301, grace), None, "grace over");
        assert_eq!(
            judge(&r, &t2, &l1, NOW + 1, Duration::ZERO),
            None,
            "grace 0"
        );
        let never_served = ca.leaf(&["a.test"], NOW - 2 * DAY);
        assert_eq!(judge(&r, &t2, &never_served, NOW + 1, grace), None);

        // The ingress switched first: this proxy still serves l1 and sees l2.
        let r = Renewals::new(counter);
        assert_eq!(judge(&r, &t1, &l2, NOW + 10, grace), Some(Leaf::Next));
        assert_eq!(judge(&r, &t1, &l2, NOW + 310, grace), Some(Leaf::Next));
        assert_eq!(
            judge(&r, &t1, &l2, NOW + 311, grace),
            None,
            "300 s after first seen"
        );
        // Switching back (l2 to l1) makes l2 the previous leaf, with a grace of its own.
        r.switched(&t2, &t1, NOW + 400);
        assert_eq!(judge(&r, &t1, &l2, NOW + 401, grace), Some(Leaf::Previous));
        // Hosts the new table lacks are forgotten.
        r.switched(&t1, &HostTable::default(), NOW + 402);
        assert!(r.previous.lock().unwrap().is_empty());
    }
}
