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
//! - [`gateway`]: Gateway API rules (attachment, hostnames, ReferenceGrants)
//! - [`resolve`]: certificates, conflicts and the per-host reports
//! - [`roots`]: whether a certificate chains to a public web root

pub mod gateway;
pub mod ingress;
pub mod resolve;
pub mod roots;
pub mod wanted;

#[cfg(test)]
pub(crate) mod fixtures;

use std::collections::BTreeSet;

use k8s_openapi::api::networking::v1::Ingress;

pub use gateway::GatewayObjects;
pub use resolve::{Certificates, ResolvedHosts, ServedHost};
pub use wanted::{CertSource, GatewayOrigin, WantedHost};

use crate::api::{Http3Listener, SecretRef};
use gateway::wanted_from_gateway_api;
use ingress::{selected_ingresses, wanted_hosts};

/// Everything a listener wants to serve: its own `spec.hosts` first, then the selected
/// Ingresses' hosts, then the Gateway API's (an Ingress keeps a host it had before a route
/// asked for it, which is what a user migrating one object at a time expects).
pub fn wanted_for_listener<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> Vec<WantedHost> {
    let mut out: Vec<WantedHost> = listener
        .spec
        .hosts
        .iter()
        .map(|h| WantedHost {
            name: h.name.clone(),
            ingress: None,
            gateway: None,
            cert: CertSource::Secret(h.secret_ref.clone()),
        })
        .collect();
    for ing in selected_ingresses(listener, ingresses) {
        out.extend(wanted_hosts(ing));
    }
    out.extend(wanted_from_gateway_api(listener, gateway_api));
    out
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
/// Resolves every wanted host against the Secrets' certificates. Pure: `now_unix` decides
/// expiry.
pub fn resolve_hosts<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
    certificates: &dyn Certificates,
    now_unix: i64,
) -> ResolvedHosts {
    resolve::resolve_wanted(
        wanted_for_listener(listener, ingresses, gateway_api),
        certificates,
        now_unix,
    )
}

#[cfg(test)]
mod tests;
