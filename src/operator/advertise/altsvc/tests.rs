//! The Alt-Svc plan: what is written for served and unserved hosts, what is left to the user,
//! and that an unchanged world makes no call.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::*;
use crate::operator::hosts::fixtures::Ing;
use crate::operator::hosts::traefik::ALT_SVC_PREFIX;

const H3: &str = "h3=\":443\"; ma=86400";

fn ingress(
    name: &'static str,
    hosts: Vec<&'static str>,
    middlewares: Option<&'static str>,
) -> Ingress {
    let mut ann = vec![(crate::api::annotations::ENABLED, "true")];
    if let Some(m) = middlewares {
        ann.push((TRAEFIK_ROUTER_MIDDLEWARES, m));
    }
    let mut i = Ing {
        ns: "shop",
        name,
        class: Some("traefik"),
        ann,
        rules: hosts,
        ..Ing::default()
    }
    .build();
    i.metadata.uid = Some(format!("uid-{name}"));
    i
}

fn mw(name: &str, value: &str) -> Arc<Middleware> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "shop", "name": name},
            "spec": {"headers": {"customResponseHeaders": {"Alt-Svc": value}}}
        }))
        .unwrap(),
    )
}

struct World {
    enabled: bool,
    served: Vec<&'static str>,
    managed: Vec<(Ingress, bool)>,
    others: Vec<Ingress>,
    middlewares: Vec<Arc<Middleware>>,
    unmanaged: Vec<String>,
}

impl World {
    fn new(managed: Vec<Ingress>, served: Vec<&'static str>) -> Self {
        World {
            enabled: true,
            served,
            others: managed.clone(),
            managed: managed.into_iter().map(|i| (i, true)).collect(),
            middlewares: vec![],
            unmanaged: vec![],
        }
    }

    fn plan(&self) -> Plan {
        let served: BTreeSet<String> = self.served.iter().map(|s| s.to_string()).collect();
        let middlewares: BTreeMap<Key, &Middleware> = (self.middlewares.iter())
            .map(|m| {
                let k = Key {
                    namespace: "shop".into(),
                    name: m.metadata.name.clone().unwrap(),
                };
                (k, m.as_ref())
            })
            .collect();
        plan(&Inputs {
            enabled: self.enabled,
            port: 443,
            max_age: 86400,
            served: &served,
            managed: (self.managed.iter())
                .map(|(i, t)| Managed {
                    ingress: i,
                    traefik: *t,
                })
                .collect(),
            others: self.others.iter().collect(),
            middlewares: &middlewares,
            unmanaged: self.unmanaged.clone(),
        })
    }
}

fn key(name: &str) -> Key {
    Key {
        namespace: "shop".into(),
        name: name.into(),
    }
}

#[test]
fn a_served_ingress_gets_its_middleware_then_the_annotation_and_at_rest_nothing() {
    let w = World::new(
        vec![ingress("web", vec!["a.example.com"], None)],
        vec!["a.example.com"],
    );
    let p = w.plan();
    assert_eq!(p.middlewares.len(), 1);
    assert_eq!(p.middlewares[0].name, "h3-ingress-alt-svc-web");
    assert_eq!(p.middlewares[0].value, H3);
    assert_eq!(p.middlewares[0].ingress_uid, "uid-web");
    let own = "shop-h3-ingress-alt-svc-web@kubernetescrd";
    assert_eq!(p.annotate, vec![(key("web"), own.to_string())]);
    assert_eq!(p.status.as_ref().unwrap().advertised, 1);
    // The same world once written: no call at all.
    let done = World {
        middlewares: vec![mw("h3-ingress-alt-svc-web", H3)],
        ..World::new(
            vec![ingress(
                "web",
                vec!["a.example.com"],
                Some("shop-h3-ingress-alt-svc-web@kubernetescrd"),
            )],
            vec!["a.example.com"],
        )
    };
    let p = done.plan();
    assert!(p.middlewares.is_empty() && p.annotate.is_empty(), "{p:?}");
    assert!(p.release.is_empty() && p.delete.is_empty(), "{p:?}");
}

#[test]
fn one_host_not_served_withdraws_the_whole_ingress() {
    let w = World {
        middlewares: vec![mw("h3-ingress-alt-svc-web", H3)],
        ..World::new(
            vec![ingress("web", vec!["a.example.com", "b.example.com"], None)],
            vec!["a.example.com"],
        )
    };
    let p = w.plan();
    assert_eq!(p.middlewares[0].value, CLEAR);
    let s = p.status.unwrap();
    assert_eq!((s.advertised, s.withdrawn), (0, 1));
}

#[test]
fn the_users_own_middlewares_are_left_alone_and_the_reference_is_named() {
    let theirs = ingress(
        "web",
        vec!["a.example.com"],
        Some("shop-auth@kubernetescrd"),
    );
    let p = World::new(vec![theirs], vec!["a.example.com"]).plan();
    assert!(p.annotate.is_empty());
    assert_eq!(
        p.middlewares.len(),
        1,
        "the Middleware is ready for the user to name"
    );
    assert_eq!(
        p.status.unwrap().needs_reference,
        vec!["shop/web: shop-h3-ingress-alt-svc-web@kubernetescrd".to_string()]
    );
    let listed = ingress(
        "web",
        vec!["a.example.com"],
        Some("shop-auth@kubernetescrd, shop-h3-ingress-alt-svc-web@kubernetescrd"),
    );
    let p = World::new(vec![listed], vec!["a.example.com"]).plan();
    assert!(p.annotate.is_empty());
    assert!(p.status.unwrap().needs_reference.is_empty());
}

#[test]
fn an_ingress_let_go_is_cleared_released_then_its_middleware_deleted() {
    let own = "shop-h3-ingress-alt-svc-web@kubernetescrd";
    // Annotation removed (no longer managed), the operator's own reference still there.
    let w = World {
        managed: vec![],
        others: vec![ingress("web", vec!["a.example.com"], Some(own))],
        middlewares: vec![mw("h3-ingress-alt-svc-web", H3)],
        ..World::new(vec![], vec![])
    };
    let p = w.plan();
    assert_eq!(p.middlewares[0].value, CLEAR);
    assert_eq!(p.release, vec![key("web")]);
    assert!(p.delete.is_empty(), "deleted only once no router names it");
    // Released: nothing names it any more.
    let w = World {
        others: vec![ingress("web", vec!["a.example.com"], None)],
        ..w
    };
    let p = w.plan();
    assert_eq!(p.delete, vec![key("h3-ingress-alt-svc-web")]);
    assert!(p.middlewares.is_empty() && p.release.is_empty());
    // The user's own list names it: kept, withdrawn, never released or deleted.
    let w = World {
        others: vec![ingress(
            "web",
            vec!["a.example.com"],
            Some("shop-auth@kubernetescrd,shop-h3-ingress-alt-svc-web@kubernetescrd"),
        )],
        ..w
    };
    let p = w.plan();
    assert_eq!(p.middlewares[0].value, CLEAR);
    assert!(p.release.is_empty() && p.delete.is_empty());
}

#[test]
fn switched_off_or_not_traefik_writes_nothing_new() {
    let mut w = World::new(
        vec![ingress("web", vec!["a.example.com"], None)],
        vec!["a.example.com"],
    );
    w.enabled = false;
    let p = w.plan();
    assert_eq!(p, Plan::default());
    let mut w = World::new(
        vec![ingress("web", vec!["a.example.com"], None)],
        vec!["a.example.com"],
    );
    w.managed[0].1 = false;
    w.unmanaged = vec!["a.example.com".into()];
    let p = w.plan();
    assert!(p.middlewares.is_empty() && p.annotate.is_empty());
    assert_eq!(
        p.status.unwrap().unmanaged,
        vec!["a.example.com".to_string()]
    );
}

#[test]
fn long_ingress_names_give_distinct_valid_middleware_names() {
    let a = "a".repeat(250);
    let b = format!("{}b", "a".repeat(249));
    let (ma, mb) = (alt_svc_middleware(&a), alt_svc_middleware(&b));
    assert!(ma.len() <= 253 && mb.len() <= 253);
    assert_ne!(ma, mb);
    assert!(ma.starts_with(ALT_SVC_PREFIX));
}

fn labelled(name: &str, listener: &str, operator_ns: &str, ingress: &str) -> Middleware {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "shop", "name": name,
            "labels": {labels::MANAGED_BY: labels::MANAGED_BY_VALUE, labels::INSTANCE: listener,
                labels::OPERATOR_NAMESPACE: operator_ns},
            "ownerReferences": [{"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "name": ingress, "uid": "u"}]},
        "spec": {"headers": {"customResponseHeaders": {"Alt-Svc": H3}}}
    }))
    .unwrap()
}

#[test]
fn a_deleted_listeners_middlewares_are_withdrawn_and_another_releases_never_touched() {
    let own = "shop-h3-ingress-alt-svc-web@kubernetescrd";
    let web = ingress("web", vec!["a.example.com"], Some(own));
    let ingresses = BTreeMap::from([(key("web"), &web)]);
    let mine = labelled("h3-ingress-alt-svc-web", "edge", "h3-ingress", "web");
    // The listener is there: nothing to do.
    let plans = orphans([&mine], &ingresses, "h3-ingress", |l| l == "edge");
    assert!(plans.is_empty());
    // Gone: clear, and the operator's own annotation given up.
    let plans = orphans([&mine], &ingresses, "h3-ingress", |_| false);
    let p = &plans["edge"];
    assert_eq!(p.middlewares[0].value, CLEAR);
    assert_eq!(p.release, vec![key("web")]);
    // Another installation's Middleware (another operator namespace) is its own business.
    let theirs = labelled("h3-ingress-alt-svc-web", "edge", "staging", "web");
    assert!(orphans([&theirs], &ingresses, "h3-ingress", |_| false).is_empty());
    // The Ingress gone: the garbage collector's.
    assert!(orphans([&mine], &BTreeMap::new(), "h3-ingress", |_| false).is_empty());
}

#[test]
fn a_thousand_ingresses_at_rest_make_no_call() {
    const N: usize = 1000;
    let names: Vec<&'static str> = (0..N).map(|i| &*format!("web{i}").leak()).collect();
    let hosts: Vec<&'static str> = (0..N)
        .map(|i| &*format!("h{i}.example.com").leak())
        .collect();
    let refs: Vec<&'static str> = (names.iter())
        .map(|n| &*alt_svc_reference("shop", n).leak())
        .collect();
    let fresh: Vec<Ingress> = (0..N)
        .map(|i| ingress(names[i], vec![hosts[i]], None))
        .collect();
    let first = World::new(fresh, hosts.clone()).plan();
    assert_eq!((first.middlewares.len(), first.annotate.len()), (N, N));
    let done: Vec<Ingress> = (0..N)
        .map(|i| ingress(names[i], vec![hosts[i]], Some(refs[i])))
        .collect();
    let at_rest = World {
        middlewares: names
            .iter()
            .map(|n| mw(&alt_svc_middleware(n), H3))
            .collect(),
        ..World::new(done, hosts.clone())
    };
    let p = at_rest.plan();
    assert!(
        p.is_empty(),
        "{} writes at rest",
        p.middlewares.len() + p.annotate.len()
    );
    assert_eq!(p.status.unwrap().advertised, N as i64);
}
