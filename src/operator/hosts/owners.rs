//! Which Ingress a host's certificate comes from, as the TCP ingress decides it: among every
//! Ingress of the class, annotated for HTTP/3 or not. A host served over HTTP/3 must present
//! the certificate the TCP ingress presents for it (the same clients reach both, and
//! `upstream.verify: servedCertificate` compares them), so the annotation only says which
//! hosts to serve, never which certificate.
//!
//! ingress-nginx builds one server per host from its Ingresses sorted oldest first (equal
//! creation times: by `namespace/name`, in reverse), canaries left out, and takes the
//! certificate from the first Ingress whose rules name the host and that has a `spec.tls`
//! section: its entry for the host (an exact name first; then ingress-nginx tries the
//! section's Secrets for one whose certificate covers the host, where h3-ingress takes a
//! wildcard entry that covers it), or its default certificate when that section has none. An Ingress without `spec.tls` does not
//! claim the certificate. [`TlsOwners`] is that first Ingress per class and host; an Ingress
//! that asks for a host another one owns gets the owner's Secret ([`wanted_hosts`]), or no
//! HTTP/3 when the owner leaves the host to the TCP ingress's default certificate, which
//! h3-ingress cannot read. A canary Ingress asking for a host no other Ingress owns gets no
//! HTTP/3 either: its own `spec.tls` is not used. F5 NGINX Ingress Controller lets the oldest
//! Ingress of a host win it whole; where that one has a `spec.tls` section, the two agree.
//! Pure.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::networking::v1::Ingress;

use super::ingress::{
    ingress_class, ingress_key, own_hosts, tcp_order, tls_cert_source, wanted_hosts as asked,
};
use super::wanted::{CertSource, WantedHost};

/// ingress-nginx's canary mark: a canary Ingress adds a backend to a host another Ingress
/// defines, never its certificate.
pub const CANARY_ANNOTATION: &str = "nginx.ingress.kubernetes.io/canary";

fn is_canary(ing: &Ingress) -> bool {
    ing.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CANARY_ANNOTATION))
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// The hosts an Ingress's rules name, lowercase (a server exists only for those).
pub fn rule_hosts(ing: &Ingress) -> impl Iterator<Item = String> + '_ {
    ing.spec
        .as_ref()
        .and_then(|s| s.rules.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.host.as_deref())
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
}

/// Whether an Ingress has a `spec.tls` section (any entry): then it claims the certificate of
/// the hosts its rules name, if it is their oldest.
pub fn has_tls(ing: &Ingress) -> bool {
    ing.spec
        .as_ref()
        .and_then(|s| s.tls.as_deref())
        .is_some_and(|t| !t.is_empty())
}

/// Per Ingress class and host (lowercase): the Ingress whose `spec.tls` decides its
/// certificate.
#[derive(Default)]
pub struct TlsOwners<'a> {
    by_class: HashMap<Option<String>, HashMap<String, &'a Ingress>>,
}

impl<'a> TlsOwners<'a> {
    /// The owners among `ingresses` for the given classes only (`None`: Ingresses without a
    /// class), so a listener's reconcile indexes no more than the classes it serves.
    pub fn new<'c>(
        ingresses: impl IntoIterator<Item = &'a Ingress>,
        classes: &BTreeSet<Option<&'c str>>,
    ) -> Self {
        let mut by_class: HashMap<Option<String>, HashMap<String, &'a Ingress>> = HashMap::new();
        for ing in ingresses {
            let class = ingress_class(ing);
            if !classes.contains(&class)
                || ing.metadata.deletion_timestamp.is_some()
                || is_canary(ing)
                || !has_tls(ing)
            {
                continue;
            }
            let hosts = by_class.entry(class.map(str::to_string)).or_default();
            for host in rule_hosts(ing) {
                let owner = hosts.entry(host).or_insert(ing);
                if tcp_order(ing, owner).is_lt() {
                    *owner = ing;
                }
            }
        }
        Self { by_class }
    }

    /// The Ingress of `class` whose certificate the TCP ingress serves `host` with.
    pub fn owner(&self, class: Option<&str>, host: &str) -> Option<&'a Ingress> {
        let hosts = self.by_class.get(&class.map(str::to_string))?;
        hosts.get(&host.to_ascii_lowercase()).copied()
    }
}

/// The hosts an Ingress asks for ([`super::ingress::wanted_hosts`]), each with the Secret the
/// TCP ingress serves it with: its owner's when another Ingress of the class owns it. The
/// owners used (`namespace/name`) are added to `owners_used`: a change to one concerns the
/// listener.
pub fn wanted_hosts(
    ing: &Ingress,
    owners: &TlsOwners,
    owners_used: &mut BTreeSet<String>,
) -> Vec<WantedHost> {
    let key = ingress_key(ing);
    let own = own_hosts(ing);
    let class = ingress_class(ing);
    let mut out = asked(ing);
    for w in &mut out {
        if !own.iter().any(|o| o.eq_ignore_ascii_case(&w.name)) {
            continue; // listed in h3-ingress.dev/hosts, not a host of the Ingress: said so
        }
        let Some(owner) = owners.owner(class, &w.name) else {
            if is_canary(ing) {
                w.cert = CertSource::NoTls(format!(
                    "Ingress {key} is a canary ({CANARY_ANNOTATION}), whose spec.tls the TCP \
                     ingress does not use, and no other Ingress of its class names {} with a \
                     spec.tls section",
                    w.name
                ));
            }
            continue;
        };
        let owner_key = ingress_key(owner);
        if owner_key == key {
            continue;
        }
        let tls = owner
            .spec
            .as_ref()
            .and_then(|s| s.tls.as_deref())
            .unwrap_or_default();
        let ns = owner.metadata.namespace.as_deref().unwrap_or_default();
        w.cert = match tls_cert_source(tls, &w.name, &owner_key, ns) {
            CertSource::NoTls(why) => CertSource::NoTls(format!(
                "the TCP ingress takes the certificate of {} from Ingress {owner_key}, the \
                 oldest of its class that names it with a spec.tls section: {why}",
                w.name
            )),
            from_owner => from_owner,
        };
        owners_used.insert(owner_key);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::annotations;
    use crate::operator::hosts::fixtures::{listener, none, Ing};
    use crate::operator::hosts::gather_wanted;

    const HOST: &str = "shop.example.com";

    /// The annotated Ingress: `shop/web`, created at 200, with its own Secret `web-tls`.
    fn annotated() -> Ing {
        Ing {
            ns: "shop",
            name: "web",
            rules: vec![HOST],
            tls: vec![(vec![HOST], Some("web-tls"))],
            created: 200,
            ..Default::default()
        }
    }

    /// An Ingress of the same class nobody annotated, naming the host.
    fn other(name: &'static str, created: i64, secret: Option<&'static str>) -> Ing {
        Ing {
            ns: "legacy",
            name,
            ann: vec![],
            rules: vec![HOST],
            tls: vec![(vec![HOST], secret)],
            created,
            ..Default::default()
        }
    }

    fn cert_of(ingresses: &[&Ingress]) -> CertSource {
        let l = listener("public", Some("nginx"));
        let w = gather_wanted(&l, ingresses.iter().copied(), &none());
        assert_eq!(w.hosts.len(), 1, "{:?}", w.hosts);
        assert_eq!(w.hosts[0].origin.ingress.as_deref(), Some("shop/web"));
        w.hosts[0].cert.clone()
    }

    fn secret(ns: &str, name: &str) -> CertSource {
        CertSource::Secret(crate::api::SecretRef {
            namespace: ns.into(),
            name: name.into(),
        })
    }

    #[test]
    fn an_older_unannotated_ingress_with_tls_decides_the_certificate() {
        let web = annotated().build();
        let old = other("old", 100, Some("old-tls")).build();
        assert_eq!(cert_of(&[&web, &old]), secret("legacy", "old-tls"));
        // A newer one does not.
        let young = other("young", 300, Some("young-tls")).build();
        assert_eq!(cert_of(&[&young, &web]), secret("shop", "web-tls"));
        // Annotated too, the older one serves both with its Secret: one name, one certificate.
        let mut old_on = other("old", 100, Some("old-tls"));
        old_on.ann = vec![(annotations::ENABLED, "true")];
        let l = listener("public", Some("nginx"));
        let w = gather_wanted(&l, [&web, &old_on.build()], &none());
        let certs: Vec<_> = w.hosts.iter().map(|h| h.cert.clone()).collect();
        assert_eq!(
            certs,
            [secret("legacy", "old-tls"), secret("legacy", "old-tls")]
        );
        assert_eq!(
            w.certificate_ingresses.into_iter().collect::<Vec<_>>(),
            ["legacy/old"]
        );
    }

    #[test]
    fn only_an_ingress_of_the_class_with_a_tls_section_naming_the_host_in_its_rules_owns_it() {
        let web = annotated().build();
        let mut no_tls = other("no-tls", 100, None);
        no_tls.tls = vec![];
        let mut other_class = other("haproxy", 100, Some("haproxy-tls"));
        other_class.class = Some("haproxy");
        let mut canary = other("canary", 100, Some("canary-tls"));
        canary.ann = vec![(CANARY_ANNOTATION, "true")];
        let mut tls_only = other("tls-only", 100, Some("tls-only"));
        tls_only.rules = vec!["elsewhere.example.com"];
        let mut deleting = other("deleting", 100, Some("deleting-tls")).build();
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        for ing in [
            no_tls.build(),
            other_class.build(),
            canary.build(),
            tls_only.build(),
            deleting,
        ] {
            assert_eq!(
                cert_of(&[&ing, &web]),
                secret("shop", "web-tls"),
                "{}",
                ingress_key(&ing)
            );
        }
    }

    #[test]
    fn an_owner_without_a_secret_for_the_host_leaves_it_to_the_default_certificate() {
        let web = annotated().build();
        let old = other("old", 100, None).build();
        let CertSource::NoTls(why) = cert_of(&[&web, &old]) else {
            panic!("the TCP ingress serves its default certificate");
        };
        assert!(why.contains("from Ingress legacy/old"), "{why}");
        assert!(why.contains("no secretName"), "{why}");
        // A spec.tls section with no entry for the host claims it too.
        let mut elsewhere = other("old", 100, Some("other-tls"));
        elsewhere.tls = vec![(vec!["other.example.com"], Some("other-tls"))];
        let CertSource::NoTls(why) = cert_of(&[&web, &elsewhere.build()]) else {
            panic!("the TCP ingress serves its default certificate");
        };
        assert!(
            why.contains("no spec.tls entry in Ingress legacy/old"),
            "{why}"
        );
    }

    #[test]
    fn equal_creation_times_go_to_the_greater_namespace_and_name_first() {
        let web = annotated().build();
        let a = other("a", 100, Some("a-tls")).build();
        let b = other("b", 100, Some("b-tls")).build();
        assert_eq!(cert_of(&[&web, &a, &b]), secret("legacy", "b-tls"));
        assert_eq!(cert_of(&[&b, &a, &web]), secret("legacy", "b-tls"));
    }

    #[test]
    fn a_canary_gets_its_primarys_certificate_or_none() {
        let mut canary = annotated();
        canary.ann.push((CANARY_ANNOTATION, "true"));
        let canary = canary.build();
        let primary = other("primary", 300, Some("primary-tls")).build();
        assert_eq!(
            cert_of(&[&canary, &primary]),
            secret("legacy", "primary-tls")
        );
        let CertSource::NoTls(why) = cert_of(&[&canary]) else {
            panic!("a canary's own spec.tls is not served by the TCP ingress");
        };
        assert!(why.contains("canary"), "{why}");
    }

    #[test]
    fn hosts_outside_the_ingress_keep_their_reason() {
        let mut web = annotated();
        web.ann.push((annotations::HOSTS, "nope.example.com"));
        let mut old = other("old", 100, Some("old-tls"));
        old.rules = vec!["nope.example.com"];
        let l = listener("public", Some("nginx"));
        let w = gather_wanted(&l, [&web.build(), &old.build()], &none());
        assert!(
            matches!(&w.hosts[0].cert, CertSource::NoTls(m) if m.contains(annotations::HOSTS)),
            "{:?}",
            w.hosts
        );
        assert!(w.certificate_ingresses.is_empty());
    }

    /// The owner is remembered, so a change to it reconciles the listener.
    #[test]
    fn the_owner_used_is_reported() {
        let l = listener("public", Some("nginx"));
        let web = annotated().build();
        let old = other("old", 100, Some("old-tls")).build();
        let w = gather_wanted(&l, [&web, &old], &none());
        assert_eq!(
            w.certificate_ingresses.into_iter().collect::<Vec<_>>(),
            ["legacy/old"]
        );
        let w = gather_wanted(&l, [&web], &none());
        assert!(w.certificate_ingresses.is_empty());
    }
}
