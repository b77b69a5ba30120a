//! Host resolution: which hosts a listener serves, from the Kubernetes objects the operator
//! watches, and why each other wanted host is not served. Pure: the caller owns the watches
//! and the Secret cache; nothing here does I/O.
//!
//! An annotation change walks this folder in one direction: [`ingress`] (or [`gateway`] for
//! HTTPRoutes and Gateways) turns the objects into [`WantedHost`]s, [`wanted_for_listener`]
//! gathers them for one listener, and [`resolve`] judges each against its certificate. The
//! operator then hands the served hosts to the data plane as certificate mirrors
//! (`operator::mirrors`); the data plane never reads these objects.
//!
//! - [`wanted`]: what a listener is asked to serve, before any Secret is read
//! - [`ingress`]: Ingress rules (annotations, classes, `spec.tls`)
//! - [`owners`]: which Ingress of the class a host's certificate comes from, annotated or not
//! - [`gateway`]: Gateway API rules (attachment, hostnames, ReferenceGrants)
//! - [`resolve`]: certificates, conflicts and the per-host reports
//! - [`roots`]: whether a certificate chains to a public web root
//! - [`policy`]: what the TCP ingress does for a host that HTTP/3 must carry (timeouts) or
//!   respect (client-address rules, client certificates), read by [`sources`] from
//!   annotations and HTTPRoutes and by [`traefik`] from Middlewares and TLSOptions

pub mod gateway;
pub mod ingress;
pub mod owners;
pub mod policy;
pub mod resolve;
pub mod roots;
pub mod sources;
pub mod traefik;
pub mod wanted;

#[cfg(test)]
pub(crate) mod fixtures;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::networking::v1::Ingress;

pub use gateway::GatewayObjects;
pub use resolve::{Certificates, ResolvedHosts, ServedHost};
pub use traefik::TraefikObjects;
pub use wanted::{CertSource, WantedHost};

use crate::api::gateway::HTTPRoute;
use crate::api::{HostOrigin, Http3Listener, SecretRef};
use gateway::wanted_from_gateway_api;
use ingress::{ingress_class, ingress_key, own_hosts, selected_ingresses, targets_listener};
use owners::{wanted_hosts, TlsOwners};
use policy::{HostPolicy, Policies};
use resolve::normalized;

/// What a listener wants, and where else it looked.
#[derive(Debug, Default)]
pub struct Wanted {
    pub hosts: Vec<WantedHost>,
    /// `namespace/name` of the Ingresses (annotated or not) whose `spec.tls` decided the
    /// certificate of a host another Ingress asked for ([`owners`]).
    pub certificate_ingresses: BTreeSet<String>,
}

/// Everything a listener wants to serve ([`gather_wanted`]).
pub fn wanted_for_listener<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> Vec<WantedHost> {
    gather_wanted(listener, ingresses, gateway_api).hosts
}

/// Everything a listener wants to serve: its own `spec.hosts` first, then the selected
/// Ingresses' hosts, then the Gateway API's (an Ingress keeps a host it had before a route
/// asked for it, which is what a user migrating one object at a time expects). An Ingress's
/// host gets the certificate the TCP ingress serves it with, from whichever Ingress of the
/// class owns it ([`owners`]).
pub fn gather_wanted<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> Wanted {
    let all: Vec<&Ingress> = ingresses.into_iter().collect();
    let selected = selected_ingresses(listener, all.iter().copied());
    let classes: BTreeSet<Option<&str>> = selected.iter().map(|i| ingress_class(i)).collect();
    let owners = if selected.is_empty() {
        TlsOwners::default()
    } else {
        TlsOwners::new(all.iter().copied(), &classes)
    };
    let mut certificate_ingresses = BTreeSet::new();
    let mut out: Vec<WantedHost> = listener
        .spec
        .hosts
        .iter()
        .map(|h| WantedHost {
            name: h.name.clone(),
            origin: HostOrigin::default(),
            cert: CertSource::Secret(h.secret_ref.clone()),
        })
        .collect();
    for ing in selected {
        out.extend(wanted_hosts(ing, &owners, &mut certificate_ingresses));
    }
    out.extend(wanted_from_gateway_api(listener, gateway_api));
    Wanted {
        hosts: out,
        certificate_ingresses,
    }
}

/// The Secrets a listener needs, i.e. the only ones the data plane may read.
pub fn referenced_secrets<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> BTreeSet<SecretRef> {
    wanted_for_listener(listener, ingresses, gateway_api)
        .into_iter()
        .filter_map(|w| match w.cert {
            CertSource::Secret(s) => Some(s),
            CertSource::NoTls(_) | CertSource::Refused { .. } => None,
        })
        .collect()
}
/// The policies of a listener's wanted hosts, and the objects they were read from.
#[derive(Debug, Clone)]
pub struct PolicyScan {
    pub policies: Policies,
    /// `namespace/name` of every Ingress that gave a wanted host policy (its change concerns
    /// the listener even when it is not switched on for HTTP/3).
    pub ingresses: BTreeSet<String>,
    /// The Traefik names and keys looked up (`super::traefik::Demands::looked_up`).
    pub traefik: BTreeSet<String>,
}

/// The policy of every wanted host, from every source the TCP ingress merges for it: the
/// Ingresses of the listener's class naming it (switched on for HTTP/3 or not: the controller
/// serves their paths under the same name), those targeting the listener, and the HTTPRoutes
/// of its Gateway API hosts. `traefik_classes`: the IngressClasses whose controller is
/// Traefik's (their Ingresses get Traefik's default TLSOption).
pub fn policies_for_listener<'a>(
    listener: &Http3Listener,
    wanted: &[WantedHost],
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
    traefik: &TraefikObjects,
    traefik_classes: &BTreeSet<String>,
) -> PolicyScan {
    let names: BTreeSet<String> = wanted.iter().map(|w| normalized(&w.name)).collect();
    let index = traefik::Index::new(traefik);
    let mut by_host: BTreeMap<String, HostPolicy> = BTreeMap::new();
    let mut scan_ingresses = BTreeSet::new();
    let mut looked_up = BTreeSet::new();
    let name = listener.metadata.name.as_deref().unwrap_or_default();
    let class = listener.spec.ingress_class_name.as_deref();
    for ing in ingresses {
        let same_class = class.is_some() && ingress_class(ing) == class;
        if ing.metadata.deletion_timestamp.is_some()
            || !(same_class || targets_listener(ing, name, class))
        {
            continue;
        }
        let hosts: Vec<String> = own_hosts(ing)
            .iter()
            .map(|h| normalized(h))
            .filter(|h| names.contains(h))
            .collect();
        if hosts.is_empty() {
            continue;
        }
        let on_traefik = ingress_class(ing).is_some_and(|c| traefik_classes.contains(c));
        let (source, seen) = sources::ingress_policy(ing, &index, on_traefik);
        looked_up.extend(seen);
        scan_ingresses.insert(ingress_key(ing));
        for h in hosts {
            by_host.entry(h).or_default().add(&source);
        }
    }
    let routes: HashMap<String, &HTTPRoute> = gateway_api
        .routes
        .iter()
        .map(|r| (gateway::object_key(&r.metadata), r.as_ref()))
        .collect();
    let mut route_sources: HashMap<&str, Vec<policy::SourcePolicy>> = HashMap::new();
    for w in wanted {
        let Some(key) = w.origin.http_route.as_deref() else {
            continue;
        };
        let Some(route) = routes.get(key) else {
            continue;
        };
        let sources = route_sources.entry(key).or_insert_with(|| {
            let (s, seen) = sources::route_policy(route, &index);
            looked_up.extend(seen);
            s
        });
        let host = by_host.entry(normalized(&w.name)).or_default();
        for s in sources.iter() {
            host.add(s);
        }
    }
    PolicyScan {
        policies: Policies {
            by_host,
            ..Policies::none(listener)
        },
        ingresses: scan_ingresses,
        traefik: looked_up,
    }
}

/// Resolves every wanted host against its policy (without Traefik objects) and the Secrets'
/// certificates. Pure: `now_unix` decides expiry.
pub fn resolve_hosts<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress> + Clone,
    gateway_api: &GatewayObjects,
    certificates: &dyn Certificates,
    now_unix: i64,
) -> ResolvedHosts {
    let wanted = wanted_for_listener(listener, ingresses.clone(), gateway_api);
    let scan = policies_for_listener(
        listener,
        &wanted,
        ingresses,
        gateway_api,
        &TraefikObjects::default(),
        &BTreeSet::new(),
    );
    resolve::resolve_wanted(wanted, &scan.policies, certificates, now_unix)
}

#[cfg(test)]
mod tests;
