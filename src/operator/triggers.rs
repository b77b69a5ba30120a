//! Which listeners a change concerns, so a change reconciles only them: an Ingress change
//! concerns the listeners it targets now and those it gave hosts to at their last reconcile
//! (so removing the annotation is noticed); a Secret change, the listeners serving hosts with
//! it; a Gateway API change, the listeners of its class and those it gave hosts to. With many
//! listeners, one object's edit no longer re-resolves every listener's hosts. Pure.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::context::Memory;
use super::hosts::ingress::{ingress_key, targets_listener, with_default_class};
use super::watches::gateway::GatewayChange;
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
    let now = listeners
        .iter()
        .filter(|l| {
            ing.metadata.deletion_timestamp.is_none()
                && targets_listener(&ing, &name(l), l.spec.ingress_class_name.as_deref())
        })
        .map(|l| name(l));
    let before = memory
        .iter()
        .filter(|(_, m)| m.ingresses.contains(&key))
        .map(|(l, _)| l.clone());
    sorted(now.chain(before).collect())
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
