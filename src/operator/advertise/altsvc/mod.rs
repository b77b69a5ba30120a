//! `spec.advertise.altSvc`: the TCP ingress made to send `Alt-Svc` for the hosts the listener
//! serves, and `Alt-Svc: clear` for those it stops serving. Only Traefik has a declarative,
//! per-router way to add a response header that the operator can own outright (a `headers`
//! Middleware); ingress-nginx and F5 NGINX IC need snippets, and an HTTPRoute's filters sit in
//! its rules, an atomic list the operator would take from its author. Those keep the recipe.
//!
//! One Middleware per Ingress (not per host): Traefik attaches Middlewares to every router of
//! an Ingress alike, so its header says `h3` only when every host of the Ingress is served.
//! Health-gating flips the Middleware's value and never the Ingress's list, so Traefik's
//! routers keep a Middleware that exists, and a user who lists the Middleware in their own
//! `router.middlewares` gets the same gating.
//!
//! [`plan`] is pure: from the Ingresses, the Middlewares the cache holds and the served hosts
//! it decides every write; [`apply`] carries them out.

pub mod apply;
pub mod listener;
pub mod sweep;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::altsvc::header_value;
use crate::api::traefik::Middleware;
use crate::api::{AltSvcAdvertiseStatus, MAX_ADVERTISE_HOSTS};
use crate::operator::hosts::ingress::{ingress_key, own_hosts};
use crate::operator::hosts::policy::keys::TRAEFIK_ROUTER_MIDDLEWARES;
use crate::operator::hosts::resolve::normalized;
use crate::operator::hosts::traefik::{alt_svc_middleware, alt_svc_reference};
use crate::operator::labels;

/// The header, and the value that withdraws every alternative (RFC 7838 section 3).
pub const HEADER: &str = "Alt-Svc";
pub const CLEAR: &str = "clear";
/// The field manager of the one Ingress field the operator may own: its own entry in an
/// absent `router.middlewares`. Distinct from the operator's, so giving it up touches nothing
/// else.
pub const FIELD_MANAGER: &str = "h3-ingress-alt-svc";
/// An Ingress the listener serves hosts of.
pub struct Managed<'a> {
    pub ingress: &'a Ingress,
    /// Its class is Traefik's.
    pub traefik: bool,
}

/// One Middleware to write: `Alt-Svc: value`, owned by the Ingress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MiddlewareWrite {
    pub namespace: String,
    pub name: String,
    pub value: String,
    pub ingress: String,
    pub ingress_uid: String,
}

/// An object by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

/// Every write one reconcile makes, in the order [`apply`] makes them: Middlewares before
/// the Ingresses that name them, Middlewares deleted after the Ingress let go of them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub middlewares: Vec<MiddlewareWrite>,
    /// Ingresses to give `router.middlewares: <reference>` (the annotation is absent).
    pub annotate: Vec<(Key, String)>,
    /// Ingresses whose `router.middlewares` is the operator's alone and no longer wanted.
    pub release: Vec<Key>,
    /// The operator's Middlewares that no router names any more.
    pub delete: Vec<Key>,
    pub status: Option<AltSvcAdvertiseStatus>,
}

impl Plan {
    /// Whether it makes no API call.
    pub fn is_empty(&self) -> bool {
        self.middlewares.is_empty()
            && self.annotate.is_empty()
            && self.release.is_empty()
            && self.delete.is_empty()
    }
}

/// What the plan reads.
pub struct Inputs<'a> {
    /// `spec.advertise.altSvc` is set.
    pub enabled: bool,
    pub port: u16,
    pub max_age: u32,
    /// Served hosts (normalized): [`super::dns::listener::served`].
    pub served: &'a BTreeSet<String>,
    /// The Ingresses that asked for the listener's hosts.
    pub managed: Vec<Managed<'a>>,
    /// Other Ingresses of the listener's class or targeting it: the ones the operator may
    /// have managed before (annotation removed, `altSvc` switched off).
    pub others: Vec<&'a Ingress>,
    /// The Middlewares the cache holds in the namespaces concerned, by key.
    pub middlewares: &'a BTreeMap<Key, &'a Middleware>,
    /// Served hosts no Traefik Ingress carries.
    pub unmanaged: Vec<String>,
}

impl Key {
    pub fn of(m: &ObjectMeta) -> Key {
        Key {
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
        }
    }

    /// The operator's Middleware for this Ingress.
    fn middleware(&self) -> Key {
        Key {
            namespace: self.namespace.clone(),
            name: alt_svc_middleware(&self.name),
        }
    }
}

impl MiddlewareWrite {
    /// The operator's Middleware for `ing`, saying `value`.
    fn for_ingress(ing: &Ingress, value: &str) -> Self {
        let key = Key::of(&ing.metadata);
        MiddlewareWrite {
            name: alt_svc_middleware(&key.name),
            namespace: key.namespace,
            value: value.to_string(),
            ingress: key.name,
            ingress_uid: ing.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

fn router_middlewares(ing: &Ingress) -> Option<&str> {
    let a = ing.metadata.annotations.as_ref()?;
    a.get(TRAEFIK_ROUTER_MIDDLEWARES).map(String::as_str)
}

/// The header value the Middleware holds now, if the operator's Middleware exists.
fn current(mw: Option<&&Middleware>) -> Option<String> {
    let h = mw?.spec.headers.as_ref()?;
    Some(
        h.custom_response_headers
            .get(HEADER)
            .cloned()
            .unwrap_or_default(),
    )
}

/// Every write for the listener; `plan` of an unchanged world is empty (no API call at rest).
pub fn plan(inputs: &Inputs) -> Plan {
    let mut p = Plan::default();
    let mut status = AltSvcAdvertiseStatus::default();
    let mut needs = Vec::new();
    let mut wanted = BTreeSet::new();
    let advertised = header_value(inputs.port, inputs.max_age);
    for m in inputs
        .managed
        .iter()
        .filter(|m| inputs.enabled && m.traefik)
    {
        let key = Key::of(&m.ingress.metadata);
        wanted.insert(key.clone());
        let hosts = own_hosts(m.ingress);
        let all_served =
            !hosts.is_empty() && hosts.iter().all(|h| inputs.served.contains(&normalized(h)));
        let value = if all_served { &advertised } else { CLEAR };
        if all_served {
            status.advertised += 1;
        } else {
            status.withdrawn += 1;
        }
        if current(inputs.middlewares.get(&key.middleware())).as_deref() != Some(value) {
            p.middlewares
                .push(MiddlewareWrite::for_ingress(m.ingress, value));
        }
        let own = alt_svc_reference(&key.namespace, &key.name);
        match router_middlewares(m.ingress).map(str::trim) {
            None | Some("") => p.annotate.push((key, own)),
            Some(list) if list.split(',').any(|r| r.trim() == own) => {}
            Some(_) => needs.push(format!("{}: {own}", ingress_key(m.ingress))),
        }
    }
    for ing in inputs.others.iter().copied() {
        settle(ing, &wanted, inputs.middlewares, &mut p);
    }
    if inputs.enabled {
        let (kept, omitted) = bounded(needs, inputs.unmanaged.clone());
        status.needs_reference = kept.0;
        status.unmanaged = kept.1;
        status.omitted = omitted;
        p.status = Some(status);
    }
    p
}

/// An Ingress no longer managed: its Middleware says `clear` while a router names it, the
/// operator's own annotation goes, and the Middleware goes once nothing names it.
fn settle(ing: &Ingress, wanted: &BTreeSet<Key>, mws: &BTreeMap<Key, &Middleware>, p: &mut Plan) {
    let key = Key::of(&ing.metadata);
    if wanted.contains(&key) {
        return;
    }
    let own = alt_svc_reference(&key.namespace, &key.name);
    let mw_key = key.middleware();
    let list = router_middlewares(ing).map(str::trim).unwrap_or_default();
    if list.split(',').any(|r| r.trim() == own) {
        // Still named (the user's own list keeps it for good): it stays, withdrawn.
        if current(mws.get(&mw_key)).as_deref() != Some(CLEAR) {
            p.middlewares.push(MiddlewareWrite::for_ingress(ing, CLEAR));
        }
        if list == own {
            p.release.push(key);
        }
    } else if mws.contains_key(&mw_key) {
        p.delete.push(mw_key);
    }
}

/// The writes that withdraw what this operator (`operator_ns`) keeps for listeners that are
/// gone (`exists` says which are there): each such Middleware's Ingress is settled as if no
/// listener wanted it. A deleted listener is never reconciled again, and `helm uninstall`
/// removes every listener's data plane: without this their Ingresses would keep sending
/// `Alt-Svc: h3` with nothing serving it.
pub fn orphans<'a>(
    middlewares: impl IntoIterator<Item = &'a Middleware>,
    ingresses: &BTreeMap<Key, &Ingress>,
    operator_ns: &str,
    exists: impl Fn(&str) -> bool,
) -> BTreeMap<String, Plan> {
    let mut plans: BTreeMap<String, Plan> = BTreeMap::new();
    for m in middlewares {
        let label = |k: &str| (m.metadata.labels.as_ref()).and_then(|l| l.get(k)).cloned();
        let ours = label(labels::OPERATOR_NAMESPACE).as_deref() == Some(operator_ns);
        let listener = label(labels::INSTANCE).unwrap_or_default();
        if !ours || exists(&listener) {
            continue;
        }
        let key = Key::of(&m.metadata);
        let owner = (m.metadata.owner_references.iter().flatten())
            .find(|o| o.kind == "Ingress")
            .map(|o| Key {
                namespace: key.namespace.clone(),
                name: o.name.clone(),
            });
        let Some(ing) = owner.and_then(|o| ingresses.get(&o)) else {
            // Its Ingress is gone: the garbage collector takes the Middleware.
            continue;
        };
        let mws = BTreeMap::from([(key, m)]);
        settle(
            ing,
            &BTreeSet::new(),
            &mws,
            plans.entry(listener).or_default(),
        );
    }
    plans.retain(|_, p| !p.is_empty());
    plans
}

/// At most [`MAX_ADVERTISE_HOSTS`] names in each list, and how many were left out.
fn bounded(mut a: Vec<String>, mut b: Vec<String>) -> ((Vec<String>, Vec<String>), i64) {
    a.sort();
    b.sort();
    b.dedup();
    let omitted =
        a.len().saturating_sub(MAX_ADVERTISE_HOSTS) + b.len().saturating_sub(MAX_ADVERTISE_HOSTS);
    a.truncate(MAX_ADVERTISE_HOSTS);
    b.truncate(MAX_ADVERTISE_HOSTS);
    ((a, b), omitted as i64)
}

#[cfg(test)]
mod tests;
