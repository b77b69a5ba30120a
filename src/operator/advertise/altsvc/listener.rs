//! One listener's [`Inputs`], gathered from what a reconcile holds: its host statuses (what is
//! served, and which Ingress asked), the Ingresses cache, Traefik's IngressClasses and the
//! Middlewares cache. Pure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::networking::v1::Ingress;

use super::{plan, Inputs, Key, Managed, Plan};
use crate::api::traefik::Middleware;
use crate::api::{HostStatus, Http3Listener};
use crate::operator::advertise::dns::listener::served;
use crate::operator::hosts::ingress::{ingress_class, ingress_key, targets_listener};
use crate::operator::hosts::resolve::normalized;
use crate::operator::hosts::traefik::ALT_SVC_PREFIX;

/// What the listener's reconcile reads besides the listener.
pub struct World<'a> {
    pub hosts: &'a [HostStatus],
    /// Ready data-plane pods.
    pub ready: i32,
    pub ingresses: &'a [Arc<Ingress>],
    pub traefik_classes: &'a BTreeSet<String>,
    pub middlewares: &'a [Arc<Middleware>],
}

/// The plan for `listener` (empty, with no status, when `advertise.altSvc` is off and nothing
/// of the operator's is left to withdraw).
pub fn plan_for(listener: &Http3Listener, w: &World) -> Plan {
    let spec = &listener.spec;
    let enabled = (spec.advertise.as_ref()).is_some_and(|a| a.alt_svc.is_some());
    let served: BTreeSet<String> = served(w.hosts, w.ready)
        .iter()
        .map(|h| normalized(h))
        .collect();
    let by_key: BTreeMap<String, &Ingress> = w
        .ingresses
        .iter()
        .map(|i| (ingress_key(i), i.as_ref()))
        .collect();
    let on_traefik = |i: &Ingress| ingress_class(i).is_some_and(|c| w.traefik_classes.contains(c));
    let asked: BTreeSet<&str> = w
        .hosts
        .iter()
        .filter_map(|h| h.origin.ingress.as_deref())
        .collect();
    let managed: Vec<Managed> = (asked.iter())
        .filter_map(|k| by_key.get(*k))
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .map(|i| Managed {
            ingress: i,
            traefik: on_traefik(i),
        })
        .collect();
    let unmanaged: Vec<String> = (w.hosts.iter())
        .filter(|h| served.contains(&normalized(&h.name)))
        .filter(|h| {
            let ing = h.origin.ingress.as_deref().and_then(|k| by_key.get(k));
            !ing.is_some_and(|i| on_traefik(i))
        })
        .map(|h| h.name.clone())
        .collect();
    let name = listener.metadata.name.as_deref().unwrap_or_default();
    let class = spec.ingress_class_name.as_deref();
    let others: Vec<&Ingress> = (w.ingresses.iter())
        .map(|i| i.as_ref())
        .filter(|i| {
            class.is_some() && ingress_class(i) == class || targets_listener(i, name, class)
        })
        .collect();
    let namespaces: BTreeSet<&str> = (others.iter())
        .filter_map(|i| i.metadata.namespace.as_deref())
        .collect();
    let middlewares: BTreeMap<Key, &Middleware> = (w.middlewares.iter())
        .filter(|m| (m.metadata.name.as_deref()).is_some_and(|n| n.starts_with(ALT_SVC_PREFIX)))
        .filter(|m| (m.metadata.namespace.as_deref()).is_some_and(|n| namespaces.contains(n)))
        .map(|m| (Key::of(&m.metadata), m.as_ref()))
        .collect();
    plan(&Inputs {
        enabled,
        port: spec.port,
        max_age: spec.alt_svc.max_age_seconds,
        served: &served,
        managed,
        others,
        middlewares: &middlewares,
        unmanaged,
    })
}
