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
//!   name moments ago. A process started after the switch did not see it: in Kubernetes the
//!   operator writes the replaced leaf and the time of the switch into the certificate mirror
//!   with the new certificate ([`Renewals::recall`]), so it knows the leaf all the same, for
//!   the grace counted from then; standalone, a restart forgets it.
//! - **next**: a renewal this proxy has not loaded yet (the ingress switched first), for the
//!   grace period after the ingress first presented it. A leaf counts as the renewal of ours
//!   only if it names exactly the same DNS names, is issued after ours (a later notBefore),
//!   is valid now for the host and for server authentication, and chains to the same root as
//!   ours: webpki builds its path, through the intermediates the ingress sent and ours, to
//!   that root as the only trust anchor. Public CAs issue renewals from whichever of their
//!   intermediates they pick (Let's Encrypt: R10 or R11, E5 or E6, at random), so the issuer
//!   of the next leaf is often not the issuer of ours; its root is. Our root is what webpki
//!   builds our own leaf's path to, with the public web roots and the self-signed
//!   certificates of either chain as anchors; when it finds none (a private CA whose root
//!   neither chain carries), the anchor is the highest certificate of either chain that our
//!   own leaf verifies under, so a renewal must come through that certificate (for a chain of
//!   leaf and issuer only: from our very issuer). Every anchor is one our own leaf chains to,
//!   so a certificate another CA made, whatever its names, never passes: the only leaves let
//!   through are ones our own PKI issued for our own names, newer than ours (for a public
//!   ACME CA that means someone proved control of those names; for a private one, someone
//!   allowed to use it), where `verify: system` would trust any of ~150 CAs for the name.
//!   With a leaf-only Secret from a root CA and no chain from the ingress, no next leaf can be
//!   recognised and only the previous one is.
//!
//! Anything else is refused as before, and so is either leaf once its grace has passed.
//! Memory is bounded: one previous leaf per host, [`NEXT_CAP`] sightings of next leaves.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::IntCounterVec;
use rustls::pki_types::{CertificateDer, ServerName, TrustAnchor, UnixTime};
use sha2::{Digest, Sha256};

use crate::config::{HostTable, Replaced};

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

    /// Learns, for every host of `table` whose entry names the leaf its certificate replaced
    /// (its certificate mirror, written with the new certificate, says which and when), that
    /// leaf as its previous one, unless this process saw the switch itself: how a data plane
    /// started after a renewal still accepts the replaced leaf for the rest of the grace.
    pub fn recall(&self, table: &HostTable) {
        let mut previous = self.previous.lock().expect("not poisoned");
        for entry in table.iter() {
            let Some(r) = &entry.replaced else {
                continue;
            };
            if r.leaf.as_slice() != entry.leaf().as_ref() {
                previous
                    .entry(entry.name.clone())
                    .or_insert_with(|| Replaced::clone(r));
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
        let roots = webpki_roots::TLS_SERVER_ROOTS;
        is_renewal(ours, presented, intermediates, server_name, now, roots).ok()?;
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
    #[error("our own leaf chains to no root or certificate at hand")]
    OurRootUnknown,
    #[error("does not chain to our root")]
    NotUnderOurRoot,
    #[error("not valid for the host now")]
    Invalid,
}

/// Whether `presented` is a renewal of the leaf `ours[0]` (see the module's doc); our root is
/// found among `known_roots` (the public web roots) and the self-signed certificates of either
/// chain. Pure.
pub fn is_renewal(
    ours: &[CertificateDer<'_>],
    presented: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    server_name: &ServerName<'_>,
    now: UnixTime,
    known_roots: &[TrustAnchor<'_>],
) -> Result<(), NotRenewal> {
    let ours_leaf = ours.first().ok_or(NotRenewal::Unparsable)?;
    let (ours_from, ours_names, _) = parse(ours_leaf)?;
    let (theirs_from, theirs_names, _) = parse(presented)?;
    if theirs_from <= ours_from {
        return Err(NotRenewal::NotNewer);
    }
    if ours_names.is_empty() || theirs_names != ours_names {
        return Err(NotRenewal::OtherNames);
    }
    let pool: Vec<CertificateDer<'_>> = ours[1..].iter().chain(intermediates).cloned().collect();
    let root = our_root(ours_leaf, &pool, now, known_roots)?;
    let ee = webpki::EndEntityCert::try_from(presented).map_err(|_| NotRenewal::Unparsable)?;
    crate::pki::server_path(&ee, std::slice::from_ref(&root), &pool, now).map_err(|e| match e {
        webpki::Error::UnknownIssuer
        | webpki::Error::InvalidSignatureForPublicKey
        | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_)
        | webpki::Error::UnsupportedSignatureAlgorithmContext(_) => NotRenewal::NotUnderOurRoot,
        _ => NotRenewal::Invalid,
    })?;
    ee.verify_is_valid_for_subject_name(server_name)
        .map_err(|_| NotRenewal::Invalid)
}

/// notBefore, DNS names and whether the certificate is self-signed (issuer = subject).
fn parse(c: &CertificateDer<'_>) -> Result<(i64, Vec<String>, bool), NotRenewal> {
    let (_, p) =
        x509_parser::parse_x509_certificate(c.as_ref()).map_err(|_| NotRenewal::Unparsable)?;
    let from = p.validity().not_before.timestamp();
    let self_signed = p.issuer().as_raw() == p.subject().as_raw();
    Ok((from, dns_names(&p), self_signed))
}

/// The anchor our own `leaf` chains to through `pool`: the root webpki builds its path to
/// (among `known_roots` and the self-signed certificates of `pool`), else the highest
/// certificate of `pool` it verifies under.
fn our_root(
    leaf: &CertificateDer<'_>,
    pool: &[CertificateDer<'_>],
    now: UnixTime,
    known_roots: &[TrustAnchor<'_>],
) -> Result<TrustAnchor<'static>, NotRenewal> {
    let ee = webpki::EndEntityCert::try_from(leaf).map_err(|_| NotRenewal::Unparsable)?;
    let path_to = |anchors: &[TrustAnchor<'_>]| {
        crate::pki::server_path(&ee, anchors, pool, now)
            .ok()
            .map(|path| {
                (
                    path.intermediate_certificates().count(),
                    path.anchor().to_owned(),
                )
            })
    };
    let mut roots: Vec<TrustAnchor<'_>> = pool
        .iter()
        .filter(|c| parse(c).is_ok_and(|(_, _, self_signed)| self_signed))
        .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
        .collect();
    roots.extend(known_roots.iter().cloned());
    if let Some((_, root)) = path_to(&roots) {
        return Ok(root);
    }
    pool.iter()
        .filter_map(|c| webpki::anchor_from_trusted_cert(c).ok())
        .filter_map(|a| path_to(std::slice::from_ref(&a)))
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, anchor)| anchor)
        .ok_or(NotRenewal::OurRootUnknown)
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

    fn anchor(ca: &Ca) -> TrustAnchor<'static> {
        webpki::anchor_from_trusted_cert(&ca.der())
            .unwrap()
            .to_owned()
    }

    #[test]
    fn a_renewal_is_a_newer_leaf_for_the_same_names_from_our_root() {
        let ca = Ca::root("h3i CA");
        let ours = ca.leaf(&["a.test", "www.a.test"], NOW - DAY);
        let next = ca.leaf(&["www.a.test", "a.test"], NOW - 60);
        let host = name("a.test");
        let check =
            |ours: &[CertificateDer<'_>], p: &CertificateDer<'_>, inter: &[CertificateDer<'_>]| {
                is_renewal(ours, p, inter, &host, now(NOW), &[])
            };
        // Our root from our chain, or from the chain the upstream sends.
        assert_eq!(check(&[ours.clone(), ca.der()], &next, &[]), Ok(()));
        assert_eq!(
            check(std::slice::from_ref(&ours), &next, &[ca.der()]),
            Ok(())
        );
        assert_eq!(
            check(std::slice::from_ref(&ours), &next, &[]),
            Err(NotRenewal::OurRootUnknown)
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
            &[],
        );
        assert_eq!(other_host, Err(NotRenewal::Invalid));
    }

    /// A public CA issues each renewal from one of its intermediates at random (Let's Encrypt:
    /// R10 or R11): a renewal from the other intermediate under our root passes, both ways,
    /// with the root a known (public) root or in either chain; one from an intermediate of the
    /// same name under another root never does.
    #[test]
    fn a_renewal_from_another_intermediate_of_our_root_passes() {
        let root = Ca::root("ISRG Root X1 (test)");
        let (r10, r11) = (
            Ca::intermediate("R10", &root),
            Ca::intermediate("R11", &root),
        );
        let host = name("a.test");
        let check = |ours: &[CertificateDer<'_>],
                     p: &CertificateDer<'_>,
                     inter: &[CertificateDer<'_>],
                     roots: &[TrustAnchor<'_>]| {
            is_renewal(ours, p, inter, &host, now(NOW), roots)
        };
        let public = [anchor(&root)];
        for (from, to) in [(&r10, &r11), (&r11, &r10)] {
            let ours = from.leaf(&["a.test"], NOW - DAY);
            let next = to.leaf(&["a.test"], NOW - 60);
            // As Let's Encrypt serves them: leaf and intermediate, the root in the trust store.
            let chain = [ours.clone(), from.der()];
            assert_eq!(check(&chain, &next, &[to.der()], &public), Ok(()));
            // The root in a chain instead (ours, or the upstream's).
            let full = [ours.clone(), from.der(), root.der()];
            assert_eq!(check(&full, &next, &[to.der()], &[]), Ok(()));
            assert_eq!(check(&chain, &next, &[to.der(), root.der()], &[]), Ok(()));
            // The new intermediate must be presented: nothing else connects the leaf.
            assert_eq!(
                check(&chain, &next, &[], &public),
                Err(NotRenewal::NotUnderOurRoot)
            );
            // Without the root anywhere, the highest certificate of ours is the anchor, and
            // only a renewal through it passes.
            assert_eq!(
                check(&chain, &next, &[to.der()], &[]),
                Err(NotRenewal::NotUnderOurRoot)
            );
            let same = from.leaf(&["a.test"], NOW - 60);
            assert_eq!(check(&chain, &same, &[], &[]), Ok(()));
        }
        // An "R11" under another root, sent with that root: never ours.
        let (other_root, ours) = (Ca::root("Other Root"), r10.leaf(&["a.test"], NOW - DAY));
        let fake = Ca::intermediate("R11", &other_root);
        let theirs = fake.leaf(&["a.test"], NOW - 60);
        for inter in [vec![fake.der()], vec![fake.der(), other_root.der()]] {
            let v = check(&[ours.clone(), r10.der()], &theirs, &inter, &public);
            assert_eq!(v, Err(NotRenewal::NotUnderOurRoot));
        }
        // Our root trusted, but the upstream's chain is another root's: still not ours.
        let both = [anchor(&root), anchor(&other_root)];
        let v = check(&[ours.clone(), r10.der()], &theirs, &[fake.der()], &both);
        assert_eq!(v, Err(NotRenewal::NotUnderOurRoot));
    }

    #[test]
    fn a_foreign_issuer_never_passes_even_under_our_issuers_name() {
        let ca = Ca::root("h3i CA");
        let ours = ca.leaf(&["a.test"], NOW - DAY);
        let host = name("a.test");
        // Same issuer name, another key: the forged CA's leaf does not chain to ours, and the
        // forged CA sent along does not verify our leaf, so it is never taken as our root.
        let forged = Ca::root("h3i CA");
        let theirs = forged.leaf(&["a.test"], NOW - 60);
        let verdict = |inter: &[CertificateDer<'_>]| {
            is_renewal(
                &[ours.clone(), ca.der()],
                &theirs,
                inter,
                &host,
                now(NOW),
                &[],
            )
        };
        assert_eq!(verdict(&[]), Err(NotRenewal::NotUnderOurRoot));
        assert_eq!(verdict(&[forged.der()]), Err(NotRenewal::NotUnderOurRoot));
        assert_eq!(
            is_renewal(
                std::slice::from_ref(&ours),
                &theirs,
                &[forged.der()],
                &host,
                now(NOW),
                &[anchor(&forged)],
            ),
            Err(NotRenewal::OurRootUnknown)
        );
        // Another issuer name altogether.
        let other = Ca::root("other CA").leaf(&["a.test"], NOW - 60);
        assert_eq!(
            is_renewal(&[ours, ca.der()], &other, &[], &host, now(NOW), &[]),
            Err(NotRenewal::NotUnderOurRoot)
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
        let (t1, t2) = (table(&l1, k1), table(&l2, k2.clone_key()));
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

        // A process started after the switch learns l1 from the mirror, with its time.
        let mut e = HostEntry::from_der("a.test", vec![l2.clone(), ca.der()], k2, NOW).unwrap();
        e.replaced = Some(Arc::new(Replaced {
            leaf: l1.to_vec(),
            at: NOW,
        }));
        let mut t2 = HostTable::default();
        assert!(t2.insert(e));
        let fresh = Renewals::new(IntCounterVec::new(Opts::new("g", "-"), &["leaf"]).unwrap());
        assert_eq!(
            judge(&fresh, &t2, &l1, NOW + 10, grace),
            None,
            "not recalled yet"
        );
        fresh.recall(&t2);
        assert_eq!(
            judge(&fresh, &t2, &l1, NOW + 300, grace),
            Some(Leaf::Previous)
        );
        assert_eq!(
            judge(&fresh, &t2, &l1, NOW + 301, grace),
            None,
            "grace over"
        );
        // What this process saw itself stays: recalling does not replace it.
        let seen = Renewals::new(IntCounterVec::new(Opts::new("g", "-"), &["leaf"]).unwrap());
        seen.switched(&t1, &t2, NOW + 100);
        seen.recall(&t2);
        assert_eq!(
            judge(&seen, &t2, &l1, NOW + 350, grace),
            Some(Leaf::Previous)
        );
    }
}
