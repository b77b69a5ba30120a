//! Hosts from Ingresses: which Ingresses a listener serves (the `h3-ingress.dev/*`
//! annotations, the IngressClass and the cluster's default class) and which host each one asks
//! for, with the `spec.tls` Secret that should serve it. Pure: the caller owns the watches.

use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressSpec, IngressTLS};

use super::wanted::{CertSource, WantedHost};
use crate::api::{annotations, HostOrigin, Http3Listener, SecretRef};
use crate::config::host_matches;

/// The pre-`ingressClassName` way of naming the class; controllers still honour it.
pub const LEGACY_INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The annotation that marks the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// `namespace/name` of an Ingress, the form used in status and events.
pub fn ingress_key(ing: &Ingress) -> String {
    format!(
        "{}/{}",
        ing.metadata.namespace.as_deref().unwrap_or_default(),
        ing.metadata.name.as_deref().unwrap_or_default()
    )
}

fn annotation<'a>(ing: &'a Ingress, key: &str) -> Option<&'a str> {
    ing.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(|s| s.trim())
}

/// `h3-ingress.dev/enabled: "true"` (any case). Anything else, including absence, is off.
pub fn is_enabled(ing: &Ingress) -> bool {
    annotation(ing, annotations::ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The Ingress's class: `spec.ingressClassName`, else the legacy annotation.
pub fn ingress_class(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| annotation(ing, LEGACY_INGRESS_CLASS_ANNOTATION))
        .filter(|s| !s.is_empty())
}

/// The cluster's default IngressClass: the one annotated `is-default-class: "true"`. None when
/// there is none, or more than one (Kubernetes then refuses class-less Ingresses, and so do we:
/// guessing would serve an Ingress its TCP ingress may not).
pub fn default_class<'a>(classes: impl IntoIterator<Item = &'a IngressClass>) -> Option<String> {
    let mut defaults = classes.into_iter().filter(|c| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    });
    let first = defaults.next()?;
    match defaults.next() {
        Some(_) => None,
        None => first.metadata.name.clone(),
    }
}

/// The Ingresses as the listeners see them: one without a class (neither `ingressClassName`
/// nor the legacy annotation) belongs to the default class, as the TCP ingress controller of
/// that class treats it (and as Kubernetes's DefaultIngressClass admission writes it into new
/// Ingresses). Only those are copied; every other Ingress is passed through.
pub fn with_default_class(ingresses: &[Arc<Ingress>], default: Option<&str>) -> Vec<Arc<Ingress>> {
    let Some(default) = default else {
        return ingresses.to_vec();
    };
    ingresses
        .iter()
        .map(|i| {
            if ingress_class(i).is_some() {
                return i.clone();
            }
            let mut owned = (**i).clone();
            owned
                .spec
                .get_or_insert_with(IngressSpec::default)
                .ingress_class_name = Some(default.to_string());
            Arc::new(owned)
        })
        .collect()
}

/// Whether an enabled Ingress is served by the listener `listener_name` of class
/// `listener_class`. `h3-ingress.dev/listener` names the listener explicitly and then wins over
/// the class, so one Ingress is never served by two listeners.
pub fn targets_listener(ing: &Ingress, listener_name: &str, listener_class: Option<&str>) -> bool {
    if !is_enabled(ing) {
        return false;
    }
    match annotation(ing, annotations::LISTENER).filter(|s| !s.is_empty()) {
        Some(named) => named == listener_name,
        None => match (listener_class, ingress_class(ing)) {
            (Some(want), Some(have)) => want == have,
            _ => false,
        },
    }
}

/// The hosts an Ingress asks for, with where each one's certificate lives. Pure annotation and
/// `spec.tls` rules; says nothing about whether the Ingress targets a given listener.
pub fn wanted_hosts(ing: &Ingress) -> Vec<WantedHost> {
    let key = ingress_key(ing);
    let ns = ing.metadata.namespace.clone().unwrap_or_default();
    let tls = ing
        .spec
        .as_ref()
        .and_then(|s| s.tls.as_deref())
        .unwrap_or_default();
    let own = own_hosts(ing);
    let narrowed = narrowed_hosts(ing);
    let names = narrowed.clone().unwrap_or_else(|| own.clone());
    names
        .into_iter()
        .map(|name| {
            let cert = if narrowed.is_some() && !own.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
                CertSource::NoTls(format!(
                    "{name} is listed in {} but is not a host of Ingress {key}",
                    annotations::HOSTS
                ))
            } else {
                tls_cert_source(tls, &name, &key, &ns)
            };
            WantedHost {
                name,
                origin: HostOrigin::ingress(key.clone()),
                cert,
            }
        })
        .collect()
}

/// Every host the Ingress names (rules, then `spec.tls`), in first-seen order, once
/// (case-insensitively).
pub fn own_hosts(ing: &Ingress) -> Vec<String> {
    let spec = ing.spec.as_ref();
    let rule_hosts = spec
        .and_then(|s| s.rules.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.host.as_deref());
    let tls_hosts = spec
        .and_then(|s| s.tls.as_deref())
        .unwrap_or_default()
        .iter()
        .flat_map(|t| t.hosts.as_deref().unwrap_or_default())
        .map(|s| s.as_str());
    let mut own: Vec<String> = Vec::new();
    for h in rule_hosts.chain(tls_hosts).map(str::trim) {
        if !h.is_empty() && !own.iter().any(|o| o.eq_ignore_ascii_case(h)) {
            own.push(h.to_string());
        }
    }
    own
}

/// The `h3-ingress.dev/hosts` list, deduplicated; `None` without the annotation.
fn narrowed_hosts(ing: &Ingress) -> Option<Vec<String>> {
    annotation(ing, annotations::HOSTS).map(|list| {
        let mut out: Vec<String> = Vec::new();
        for h in list.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            if !out.iter().any(|o| o.eq_ignore_ascii_case(h)) {
                out.push(h.to_string());
            }
        }
        out
    })
}

/// The Secret of the `spec.tls` entry that covers `name`; an exact entry beats a wildcard
/// entry, as in the TCP ingress controllers.
pub fn tls_cert_source(tls: &[IngressTLS], name: &str, ingress: &str, ns: &str) -> CertSource {
    let covers = |t: &&IngressTLS, matches: &dyn Fn(&str) -> bool| {
        t.hosts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|p| matches(p))
    };
    let entry = tls
        .iter()
        .find(|t| covers(t, &|p| p.eq_ignore_ascii_case(name)))
        .or_else(|| tls.iter().find(|t| covers(t, &|p| host_matches(p, name))));
    match entry {
        None => CertSource::NoTls(format!(
            "{name} has no spec.tls entry in Ingress {ingress}; HTTP/3 needs TLS"
        )),
        Some(t) => match t.secret_name.as_deref().filter(|s| !s.is_empty()) {
            None => CertSource::NoTls(format!(
                "the spec.tls entry for {name} in Ingress {ingress} has no secretName \
                 (the TCP ingress's default certificate is not readable by h3-ingress)"
            )),
            Some(secret) => CertSource::Secret(SecretRef {
                namespace: ns.to_string(),
                name: secret.to_string(),
            }),
        },
    }
}

fn created(ing: &Ingress) -> Option<i64> {
    ing.metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

/// The order the TCP ingress reads Ingresses in: oldest first; equal creation times (a second
/// is the API's resolution) by `namespace/name`, the greater first, as ingress-nginx sorts them.
pub fn tcp_order(a: &Ingress, b: &Ingress) -> std::cmp::Ordering {
    created(a)
        .cmp(&created(b))
        .then_with(|| ingress_key(b).cmp(&ingress_key(a)))
}

/// The Ingresses a listener serves, in [`tcp_order`], so that on a host conflict the Ingress
/// that had the host first keeps it, as ingress-nginx does.
pub fn selected_ingresses<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
) -> Vec<&'a Ingress> {
    let name = listener.metadata.name.as_deref().unwrap_or_default();
    let class = listener.spec.ingress_class_name.as_deref();
    let mut v: Vec<&Ingress> = ingresses
        .into_iter()
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .filter(|i| targets_listener(i, name, class))
        .collect();
    v.sort_by(|a, b| tcp_order(a, b));
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::hosts::fixtures::Ing;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn enabled_annotation_is_off_by_default_and_only_true_turns_it_on() {
        let mut ing = Ing {
            ann: vec![],
            ..Default::default()
        }
        .build();
        assert!(!is_enabled(&ing));
        for (v, want) in [
            ("true", true),
            ("True", true),
            (" true ", true),
            ("yes", false),
            ("false", false),
            ("", false),
        ] {
            ing.metadata.annotations = Some(
                [(annotations::ENABLED.to_string(), v.to_string())]
                    .into_iter()
                    .collect(),
            );
            assert_eq!(is_enabled(&ing), want, "{v:?}");
        }
    }

    #[test]
    fn class_or_listener_annotation_selects_the_listener() {
        let by_class = Ing::default().build();
        assert!(targets_listener(&by_class, "public", Some("nginx")));
        assert!(!targets_listener(&by_class, "public", Some("haproxy")));
        assert!(!targets_listener(&by_class, "public", None));

        let legacy = Ing {
            class: None,
            ann: vec![
                (annotations::ENABLED, "true"),
                (LEGACY_INGRESS_CLASS_ANNOTATION, "nginx"),
            ],
            ..Default::default()
        }
        .build();
        assert_eq!(ingress_class(&legacy), Some("nginx"));
        assert!(targets_listener(&legacy, "public", Some("nginx")));

        // The named listener wins over the class, in both directions.
        let named = Ing {
            ann: vec![
                (annotations::ENABLED, "true"),
                (annotations::LISTENER, "internal"),
            ],
            ..Default::default()
        }
        .build();
        assert!(targets_listener(&named, "internal", None));
        assert!(!targets_listener(&named, "public", Some("nginx")));

        let disabled = Ing {
            ann: vec![(annotations::LISTENER, "internal")],
            ..Default::default()
        }
        .build();
        assert!(!targets_listener(&disabled, "internal", None));
    }

    #[test]
    fn hosts_annotation_narrows_and_unknown_hosts_are_reported() {
        let ing = Ing {
            ann: vec![
                (annotations::ENABLED, "true"),
                (
                    annotations::HOSTS,
                    "b.example.com, C.example.com,,nope.example.com",
                ),
            ],
            rules: vec!["a.example.com", "b.example.com", "c.example.com"],
            tls: vec![(
                vec!["a.example.com", "b.example.com", "c.example.com"],
                Some("web-tls"),
            )],
            ..Default::default()
        }
        .build();
        let w = wanted_hosts(&ing);
        let names: Vec<_> = w.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["b.example.com", "C.example.com", "nope.example.com"]
        );
        assert!(
            matches!(&w[0].cert, CertSource::Secret(s) if s.name == "web-tls" && s.namespace == "default")
        );
        assert!(matches!(&w[1].cert, CertSource::Secret(_)));
        assert!(matches!(&w[2].cert, CertSource::NoTls(m) if m.contains("h3-ingress.dev/hosts")));
    }

    #[test]
    fn tls_entries_map_hosts_to_secrets_exact_before_wildcard() {
        let ing = Ing {
            rules: vec![
                "a.example.com",
                "b.example.com",
                "plain.example.org",
                "x.y.example.com",
            ],
            tls: vec![
                (vec!["*.example.com"], Some("wild")),
                (vec!["a.example.com"], Some("a-tls")),
                (vec!["nosecret.example.com"], None),
            ],
            ..Default::default()
        }
        .build();
        let w = wanted_hosts(&ing);
        let get = |n: &str| w.iter().find(|h| h.name == n).unwrap().cert.clone();
        assert!(matches!(get("a.example.com"), CertSource::Secret(s) if s.name == "a-tls"));
        assert!(matches!(get("b.example.com"), CertSource::Secret(s) if s.name == "wild"));
        assert!(
            matches!(get("plain.example.org"), CertSource::NoTls(m) if m.contains("no spec.tls entry"))
        );
        // A wildcard covers one label only.
        assert!(matches!(get("x.y.example.com"), CertSource::NoTls(_)));
        assert!(
            matches!(get("nosecret.example.com"), CertSource::NoTls(m) if m.contains("no secretName"))
        );
        // The wildcard TLS host itself is wanted too (it appears in spec.tls).
        assert!(matches!(get("*.example.com"), CertSource::Secret(s) if s.name == "wild"));
    }

    fn class(name: &str, default: Option<&str>) -> IngressClass {
        IngressClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: default.map(|v| {
                    [(DEFAULT_CLASS_ANNOTATION.to_string(), v.to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: None,
        }
    }

    #[test]
    fn the_default_class_is_the_one_annotated_and_only_if_it_is_alone() {
        let nginx = class("nginx", Some("true"));
        let other = class("other", None);
        let no = class("no", Some("false"));
        assert_eq!(
            default_class([&nginx, &other, &no]).as_deref(),
            Some("nginx")
        );
        assert_eq!(default_class([&other, &no]), None);
        let second = class("second", Some("True"));
        assert_eq!(
            default_class([&nginx, &second]),
            None,
            "two defaults: ambiguous"
        );
    }
}
