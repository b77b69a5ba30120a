//! Which listeners a change concerns, so a change reconciles only them: an Ingress change
//! concerns the listeners it targets now and those it gave hosts, a host's certificate or
//! policy to at their last reconcile (so removing an annotation is noticed); when it carries
//! policy annotations, the listeners of its class (it may now hold back a host they serve);
//! and, annotated or not, those that want a host it names with `spec.tls` (it may now own
//! that host's certificate, `hosts::owners`); a Secret change, the listeners serving hosts
//! with it; a Gateway API change, the listeners of its class and those it gave hosts to; a
//! Traefik Middleware or TLSOption change, the listeners whose hosts' policy looked it up by
//! one of its names. With many listeners, one object's edit no longer re-resolves every
//! listener's hosts. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::context::Memory;
use super::hosts::ingress::{ingress_class, ingress_key, targets_listener, with_default_class};
use super::hosts::owners::{has_tls, rule_hosts};
use super::hosts::sources::has_policy_annotations;
use super::watches::gateway::GatewayChange;
use super::watches::traefik::TraefikChange;
use crate::api::{Http3Listener, SecretRef};

fn name(l: &Http3Listener) -> String {
    l.metadata.name.clone().unwrap_or_default()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v.dedup();
    v
}

/// The listeners an Ingress change concerns.
pub fn ingress_listeners(
    ing: &Ingress,
    default_class: Option<&str>,
    listeners: &[Arc<Http3Listener>],
    memory: &BTreeMap<String, Memory>,
) -> Vec<String> {
    let key = ingress_key(ing);
    let ing = with_default_class(&[Arc::new(ing.clone())], default_class)
        .pop()
        .expect("one in, one out");
    let policy = has_policy_annotations(&ing);
    let now = listeners
        .iter()
        .filter(|l| {
            let class = l.spec.ingress_class_name.as_deref();
            ing.metadata.deletion_timestamp.is_none()
                && (targets_listener(&ing, &name(l), class)
                    || (policy && class.is_some() && ingress_class(&ing) == class))
        })
        .map(|l| name(l));
    let before = memory
        .iter()
        .filter(|(_, m)| m.ingresses.contains(&key))
        .map(|(l, _)| l.clone());
    let hosts: Vec<String> = if has_tls(&ing) && ing.metadata.deletion_timestamp.is_none() {
        rule_hosts(&ing).collect()
    } else {
        Vec::new()
    };
    let naming = memory
        .iter()
        .filter(|(_, m)| hosts.iter().any(|h| m.ingress_hosts.contains(h)))
        .map(|(l, _)| l.clone());
    sorted(now.chain(before).chain(naming).collect())
}

/// The listeners a Traefik change concerns: those whose policy looked up one of the names
/// the object answers to (found or not: a new Middleware may be one a host waits for), and,
/// when a kind's availability changed, every listener that looked anything up.
pub fn traefik_listeners(change: &TraefikChange, memory: &BTreeMap<String, Memory>) -> Vec<String> {
    memory
        .iter()
        .filter(|(_, m)| match change {
            TraefikChange::Object { names } => names.iter().any(|n| m.traefik.contains(n)),
            TraefikChange::Synced => !m.traefik.is_empty(),
        })
        .map(|(l, _)| l.clone())
        .collect()
}

/// The listeners serving hosts with a Secret.
pub fn secret_listeners(r: &SecretRef, memory: &BTreeMap<String, Memory>) -> Vec<String> {
    memory
        .iter()
        .filter(|(_, m)| m.secrets.contains(r))
        .map(|(l, _)| l.clone())
        .collect()
}

/// The listeners a Gateway API change concerns. `class_of` gives a Gateway's class
/// (`namespace/name`), for the Gateways a route attaches to.
pub fn gateway_listeners(
    change: &GatewayChange,
    class_of: impl Fn(&str) -> Option<String>,
    listeners: &[Arc<Http3Listener>],
    memory: &BTreeMap<String, Memory>,
) -> Vec<String> {
    let of_class = |class: &str| {
        listeners
            .iter()
            .filter(|l| l.spec.gateway_class_name.as_deref() == Some(class))
            .map(|l| name(l))
            .collect::<Vec<_>>()
    };
    let using = |pred: &dyn Fn(&Memory) -> bool| {
        memory
            .iter()
            .filter(|(_, m)| pred(m))
            .map(|(l, _)| l.clone())
            .collect::<Vec<_>>()
    };
    let out = match change {
        GatewayChange::Gateway { key, class } => {
            let mut v = of_class(class);
            v.extend(using(&|m| m.gateways.contains(key)));
            v
        }
        GatewayChange::Route { key, parents } => {
            let mut v = using(&|m| {
                m.routes.contains(key) || parents.iter().any(|p| m.gateways.contains(p))
            });
            for p in parents {
                if let Some(class) = class_of(p) {
                    v.extend(of_class(&class));
                }
            }
            v
        }
        // A grant can permit any Gateway's certificate; a new kind can give any listener of
        // a Gateway class hosts.
        GatewayChange::Grant | GatewayChange::Synced => listeners
            .iter()
            .filter(|l| l.spec.gateway_class_name.is_some())
            .map(|l| name(l))
            .collect(),
    };
    sorted(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::annotations;
    use crate::api::Http3ListenerSpec;
    use k8s_openapi::api::networking::v1::IngressSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn listener(name: &str, class: Option<&str>, gw_class: Option<&str>) -> Arc<Http3Listener> {
        let spec: Http3ListenerSpec =
            serde_json::from_value(serde_json::json!({"upstream": {"address": "a:1"}})).unwrap();
        let mut l = Http3Listener::new(name, spec);
        l.spec.ingress_class_name = class.map(str::to_string);
        l.spec.gateway_class_name = gw_class.map(str::to_string);
        Arc::new(l)
    }

    fn ingress(class: Option<&str>, enabled: bool) -> Ingress {
        Ingress {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("web".into()),
                annotations: enabled.then(|| {
                    [(annotations::ENABLED.to_string(), "true".to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                ingress_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn an_ingress_concerns_its_listener_now_and_the_one_it_served_before() {
        let ls = [
            listener("a", Some("nginx"), None),
            listener("b", Some("other"), None),
        ];
        let mut memory = BTreeMap::new();
        assert_eq!(
            ingress_listeners(&ingress(Some("nginx"), true), None, &ls, &memory),
            ["a"]
        );
        // Not enabled and served by nobody before: concerns nobody.
        assert!(ingress_listeners(&ingress(Some("nginx"), false), None, &ls, &memory).is_empty());
        // The annotation was removed: the listener that served it must drop its hosts.
        memory.insert(
            "a".to_string(),
            Memory {
                ingresses: ["shop/web".to_string()].into_iter().collect(),
                ..Default::default()
            },
        );
        assert_eq!(
            ingress_listeners(&ingress(Some("nginx"), false), None, &ls, &memory),
            ["a"]
        );
        // Without a class it belongs to the default class.
        assert_eq!(
            ingress_listeners(&ingress(None, true), Some("other"), &ls, &BTreeMap::new()),
            ["b"]
        );
    }

    /// An Ingress nobody annotated may still own a wanted host's certificate: it concerns
    /// the listeners that want a host it names with `spec.tls`, and only those.
    #[test]
    fn an_unannotated_ingress_concerns_the_listeners_wanting_a_host_it_names_with_tls() {
        let ls = [listener("a", Some("nginx"), None)];
        let memory: BTreeMap<String, Memory> = [(
            "a".to_string(),
            Memory {
                ingress_hosts: ["shop.example.com".to_string()].into_iter().collect(),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect();
        let naming = |host: &str, tls: bool| {
            let mut i = ingress(Some("nginx"), false);
            let spec = i.spec.as_mut().unwrap();
            spec.rules = Some(vec![k8s_openapi::api::networking::v1::IngressRule {
                host: Some(host.into()),
                http: None,
            }]);
            spec.tls = tls.then(|| vec![Default::default()]);
            i
        };
        assert_eq!(
            ingress_listeners(&naming("Shop.example.com", true), None, &ls, &memory),
            ["a"]
        );
        assert!(
            ingress_listeners(&naming("other.example.com", true), None, &ls, &memory).is_empty()
        );
        // Without spec.tls it claims no certificate (and if it owned one before, its key is
        // remembered in `ingresses`).
        assert!(
            ingress_listeners(&naming("shop.example.com", false), None, &ls, &memory).is_empty()
        );
    }

    #[test]
    fn an_ingress_with_policy_concerns_the_listeners_of_its_class_even_when_not_switched_on() {
        let ls = [
            listener("a", Some("nginx"), None),
            listener("b", Some("other"), None),
        ];
        let mut guarded = ingress(Some("nginx"), false);
        guarded.metadata.annotations = Some(
            [(
                "nginx.ingress.kubernetes.io/whitelist-source-range".to_string(),
                "10.0.0.0/8".to_string(),
            )]
            .into_iter()
            .collect(),
        );
        assert_eq!(
            ingress_listeners(&guarded, None, &ls, &BTreeMap::new()),
            ["a"]
        );
        // Without policy annotations an Ingress not switched on concerns nobody.
        assert!(
            ingress_listeners(&ingress(Some("nginx"), false), None, &ls, &BTreeMap::new())
                .is_empty()
        );
    }

    #[test]
    fn a_traefik_change_concerns_the_listeners_that_looked_one_of_its_names_up() {
        let memory: BTreeMap<String, Memory> = [
            (
                "a".to_string(),
                Memory {
                    traefik: ["id shop-allow".to_string()].into_iter().collect(),
                    ..Default::default()
                },
            ),
            (
                "b".to_string(),
                Memory {
                    traefik: ["tls default".to_string()].into_iter().collect(),
                    ..Default::default()
                },
            ),
            ("c".to_string(), Memory::default()),
        ]
        .into_iter()
        .collect();
        let changed = |names: &[&str]| TraefikChange::Object {
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        assert_eq!(
            traefik_listeners(
                &changed(&["shop/allow", "id shop-allow", "id shop_allow"]),
                &memory
            ),
            ["a"]
        );
        assert_eq!(
            traefik_listeners(&changed(&["tls default"]), &memory),
            ["b"]
        );
        assert!(traefik_listeners(&changed(&["shop/other"]), &memory).is_empty());
        assert_eq!(
            traefik_listeners(&TraefikChange::Synced, &memory),
            ["a", "b"]
        );
    }

    #[test]
    fn gateway_changes_concern_listeners_of_their_class_and_users() {
        let ls = [
            listener("a", None, Some("gw")),
            listener("b", Some("nginx"), None),
        ];
        let memory: BTreeMap<String, Memory> = [(
            "b".to_string(),
            Memory {
                gateways: ["infra/old".to_string()].into_iter().collect(),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect();
        let gw = |key: &str, class: &str| GatewayChange::Gateway {
            key: key.into(),
            class: class.into(),
        };
        let none = |_: &str| None;
        assert_eq!(
            gateway_listeners(&gw("infra/g", "gw"), none, &ls, &memory),
            ["a"]
        );
        assert!(gateway_listeners(&gw("infra/g", "other"), none, &ls, &memory).is_empty());
        assert_eq!(
            gateway_listeners(&gw("infra/old", "other"), none, &ls, &memory),
            ["b"]
        );
        let route = GatewayChange::Route {
            key: "apps/r".into(),
            parents: vec!["infra/g".into()],
        };
        let class_of = |k: &str| (k == "infra/g").then(|| "gw".to_string());
        assert_eq!(gateway_listeners(&route, class_of, &ls, &memory), ["a"]);
        assert!(gateway_listeners(&route, none, &ls, &memory).is_empty());
        assert_eq!(
            gateway_listeners(&GatewayChange::Grant, none, &ls, &memory),
            ["a"]
        );
        let r = SecretRef {
            namespace: "shop".into(),
            name: "tls".into(),
        };
        assert!(secret_listeners(&r, &memory).is_empty());
    }
}
