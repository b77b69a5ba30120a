//! Hosts from the Gateway API: annotated HTTPRoutes (through the Gateway listeners they attach
//! to) and annotated Gateways (all their HTTPS listeners), each with the certificate the
//! Gateway listener terminates TLS with. Pure: the caller owns the watches.
//!
//! The rules follow the Gateway API specification where it decides something:
//! - a route attaches through `spec.parentRefs` (group/kind default to a Gateway, namespace to
//!   the route's; `sectionName` and `port` narrow the Gateway's listeners; the listener's
//!   `allowedRoutes` must admit the route's namespace and kind);
//! - the route counts only once its parent accepted it (`status.parents[]` with the same
//!   parentRef and `Accepted=True`), written by the gateway's own controller;
//! - served names are the intersection of the listener's `hostname` and the route's
//!   `hostnames`, where `*.example.com` is a suffix match (`a.b.example.com` too);
//! - a `certificateRefs` Secret in another namespace needs a ReferenceGrant in the Secret's
//!   namespace from kind Gateway (group `gateway.networking.k8s.io`) in the Gateway's namespace
//!   to kind Secret (core group), naming the Secret or no name at all.
//!
//! Where the data plane differs: its host table, like TLS certificates, lets a wildcard cover
//! one label, so a served `*.example.com` answers `a.example.com` but not `a.b.example.com`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::wanted::{CertSource, WantedHost};
use crate::api::gateway::{
    Gateway, GatewayListener, HTTPRoute, ObjectReference, ParentReference, ReferenceGrant, GROUP,
};
use crate::api::HostOrigin;
use crate::api::{annotations, reasons, Http3Listener, SecretRef};

/// The `name` of the status entry of a route that attaches without naming any host.
pub const NO_HOSTNAME: &str = "(no hostname)";

/// The Gateway API objects the watches have seen; empty where the CRDs are not installed.
#[derive(Debug, Clone, Default)]
pub struct GatewayObjects {
    pub gateways: Vec<Arc<Gateway>>,
    pub routes: Vec<Arc<HTTPRoute>>,
    pub grants: Vec<Arc<ReferenceGrant>>,
}

/// `namespace/name` of a Gateway API object.
pub fn object_key(meta: &ObjectMeta) -> String {
    key(meta)
}

fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

fn annotation<'a>(meta: &'a ObjectMeta, name: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(name))
        .map(|s| s.trim())
}

fn enabled(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_none()
        && annotation(meta, annotations::ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// `h3-ingress.dev/listener`, when set and not empty.
fn named_listener(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, annotations::LISTENER).filter(|s| !s.is_empty())
}

/// Whether a Gateway's class is the listener's `gatewayClassName`.
fn class_matches(listener: &Http3Listener, gw: &Gateway) -> bool {
    listener.spec.gateway_class_name.as_deref() == Some(gw.spec.gateway_class_name.as_str())
}

fn is_wildcard(h: &str) -> bool {
    h.starts_with("*.")
}

/// Whether `host` (a name or a wildcard) falls under the wildcard `pattern`: Gateway API
/// wildcards are suffix matches, so `*.example.com` takes `a.b.example.com` and
/// `*.b.example.com`, never `example.com`.
fn under_wildcard(pattern: &str, host: &str) -> bool {
    let suffix = &pattern[1..];
    host.len() > suffix.len() && host.ends_with(suffix)
}

/// The name both a listener hostname and a route hostname accept, if any: the more specific
/// of the two.
fn intersect_one(listener: &str, route: &str) -> Option<String> {
    let (l, r) = (listener.to_ascii_lowercase(), route.to_ascii_lowercase());
    match (is_wildcard(&l), is_wildcard(&r)) {
        (false, false) => (l == r).then_some(l),
        (true, false) => under_wildcard(&l, &r).then_some(r),
        (false, true) => under_wildcard(&r, &l).then_some(l),
        (true, true) if l == r || under_wildcard(&r, &l) => Some(l),
        (true, true) => under_wildcard(&l, &r).then_some(r),
    }
}

/// The names a route serves through a listener. A listener without a hostname takes the
/// route's names; a route without hostnames takes the listener's; with neither, the route
/// matches every name and there is no name h3-ingress could pick a certificate for.
pub fn intersect_hostnames(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let listener = listener.map(str::trim).filter(|h| !h.is_empty());
    let route: Vec<&str> = route
        .iter()
        .map(|h| h.trim())
        .filter(|h| !h.is_empty())
        .collect();
    let mut out: Vec<String> = Vec::new();
    let mut add = |h: String| {
        if !out.contains(&h) {
            out.push(h);
        }
    };
    match (listener, route.is_empty()) {
        (None, _) => route.iter().for_each(|r| add(r.to_ascii_lowercase())),
        (Some(l), true) => add(l.to_ascii_lowercase()),
        (Some(l), false) => route
            .iter()
            .filter_map(|r| intersect_one(l, r))
            .for_each(&mut add),
    }
    out
}

/// `spec.parentRefs[]` normalised: group, kind and namespace filled with their defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Parent {
    group: String,
    kind: String,
    namespace: String,
    name: String,
    section: Option<String>,
    port: Option<i32>,
}

impl Parent {
    fn of(p: &ParentReference, route_ns: &str) -> Self {
        Parent {
            group: p.group.clone().unwrap_or_else(|| GROUP.to_string()),
            kind: p.kind.clone().unwrap_or_else(|| "Gateway".to_string()),
            namespace: p.namespace.clone().unwrap_or_else(|| route_ns.to_string()),
            name: p.name.clone(),
            section: p.section_name.clone().filter(|s| !s.is_empty()),
            port: p.port,
        }
    }

    fn is_gateway(&self) -> bool {
        self.group == GROUP && self.kind == "Gateway"
    }
}

/// Whether the gateway's controller accepted the route for this parent.
fn accepted(route: &HTTPRoute, parent: &Parent, route_ns: &str) -> bool {
    route.status.as_ref().is_some_and(|s| {
        s.parents.iter().any(|p| {
            Parent::of(&p.parent_ref, route_ns) == *parent
                && p.conditions
                    .iter()
                    .any(|c| c.type_ == "Accepted" && c.status == "True")
        })
    })
}

/// Whether a Gateway listener takes HTTPRoutes from `route_ns`. `Selector` needs the
/// namespace's labels, which h3-ingress does not watch; the gateway's controller evaluated
/// it before accepting the route, so acceptance stands for it.
fn admits(l: &GatewayListener, gw_ns: &str, route_ns: &str) -> bool {
    let allowed = l.allowed_routes.as_ref();
    let from = allowed
        .and_then(|a| a.namespaces.as_ref())
        .and_then(|n| n.from.as_deref())
        .unwrap_or("Same");
    let ns_ok = match from {
        "All" | "Selector" => true,
        "Same" => gw_ns == route_ns,
        _ => false,
    };
    let kind_ok = match allowed.and_then(|a| a.kinds.as_ref()) {
        None => true,
        Some(kinds) => kinds
            .iter()
            .any(|k| k.kind == "HTTPRoute" && k.group.as_deref().is_none_or(|g| g == GROUP)),
    };
    ns_ok && kind_ok
}

/// Whether a ReferenceGrant in `secret_ns` lets Gateways in `gw_ns` use Secret `name`.
pub fn grant_permits(
    grants: &[Arc<ReferenceGrant>],
    gw_ns: &str,
    secret_ns: &str,
    name: &str,
) -> bool {
    grants
        .iter()
        .filter(|g| g.metadata.namespace.as_deref() == Some(secret_ns))
        .any(|g| {
            let from = g
                .spec
                .from
                .iter()
                .any(|f| f.group == GROUP && f.kind == "Gateway" && f.namespace == gw_ns);
            let to = g.spec.to.iter().any(|t| {
                t.group.is_empty()
                    && t.kind == "Secret"
                    && t.name.as_deref().is_none_or(|n| n.is_empty() || n == name)
            });
            from && to
        })
}

fn refused(reason: &'static str, message: String, secret: Option<SecretRef>) -> CertSource {
    CertSource::Refused {
        reason,
        message,
        secret,
    }
}

fn secret_of(r: &ObjectReference, gw_ns: &str) -> SecretRef {
    SecretRef {
        namespace: r.namespace.clone().unwrap_or_else(|| gw_ns.to_string()),
        name: r.name.clone(),
    }
}

/// The certificate a Gateway listener terminates TLS with, or why there is none to serve.
pub fn listener_cert(
    gw: &Gateway,
    l: &GatewayListener,
    grants: &[Arc<ReferenceGrant>],
) -> CertSource {
    let gw_key = key(&gw.metadata);
    let gw_ns = gw.metadata.namespace.as_deref().unwrap_or_default();
    let mode = l
        .tls
        .as_ref()
        .and_then(|t| t.mode.as_deref())
        .unwrap_or("Terminate");
    if !l.protocol.eq_ignore_ascii_case("HTTPS") || mode != "Terminate" {
        return refused(
            reasons::LISTENER_NOT_HTTPS,
            format!(
                "listener {} of Gateway {gw_key} is protocol {} (tls.mode {mode}); HTTP/3 needs \
                 protocol HTTPS with tls.mode Terminate",
                l.name, l.protocol
            ),
            None,
        );
    }
    let Some(r) = l.tls.as_ref().and_then(|t| t.certificate_refs.first()) else {
        return refused(
            reasons::SECRET_NOT_FOUND,
            format!(
                "listener {} of Gateway {gw_key} has no tls.certificateRefs",
                l.name
            ),
            None,
        );
    };
    let secret = secret_of(r, gw_ns);
    let core_secret = r.group.as_deref().unwrap_or("").is_empty()
        && r.kind.as_deref().unwrap_or("Secret") == "Secret";
    if !core_secret {
        return refused(
            reasons::SECRET_NOT_FOUND,
            format!(
                "listener {} of Gateway {gw_key} refers to a {}/{} certificate; h3-ingress \
                 reads only core Secrets",
                l.name,
                r.group.as_deref().unwrap_or(""),
                r.kind.as_deref().unwrap_or("")
            ),
            None,
        );
    }
    if secret.namespace != gw_ns && !grant_permits(grants, gw_ns, &secret.namespace, &secret.name) {
        return refused(
            reasons::REF_NOT_PERMITTED,
            format!(
                "listener {} of Gateway {gw_key} refers to Secret {}/{} in another namespace, \
                 and no ReferenceGrant in {} permits Gateways from {gw_ns}",
                l.name, secret.namespace, secret.name, secret.namespace
            ),
            Some(secret),
        );
    }
    CertSource::Secret(secret)
}

/// Creation time, then `namespace/name`: older objects win host conflicts.
fn age_key(meta: &ObjectMeta) -> (Option<i64>, String) {
    (
        meta.creation_timestamp.as_ref().map(|t| t.0.as_second()),
        key(meta),
    )
}

fn find_gateway<'a>(gateways: &'a [Arc<Gateway>], ns: &str, name: &str) -> Option<&'a Gateway> {
    gateways.iter().map(|g| g.as_ref()).find(|g| {
        g.metadata.namespace.as_deref() == Some(ns) && g.metadata.name.as_deref() == Some(name)
    })
}

/// The `h3-ingress.dev/hosts` list of an object, lowercased and deduplicated.
fn narrowed(meta: &ObjectMeta) -> Option<Vec<String>> {
    annotation(meta, annotations::HOSTS).map(|list| {
        let mut out: Vec<String> = Vec::new();
        for h in list.split(',').map(|h| h.trim().to_ascii_lowercase()) {
            if !h.is_empty() && !out.contains(&h) {
                out.push(h);
            }
        }
        out
    })
}

/// Applies `h3-ingress.dev/hosts`: keeps the listed names (a listed name under a served
/// wildcard is served with that wildcard's certificate), and reports listed names the object
/// does not have.
fn narrow(meta: &ObjectMeta, found: Vec<WantedHost>, what: &str) -> Vec<WantedHost> {
    let Some(list) = narrowed(meta) else {
        return found;
    };
    let mut out = Vec::new();
    for want in list {
        let exact: Vec<&WantedHost> = found.iter().filter(|w| w.name == want).collect();
        let covering = || -> Vec<&WantedHost> {
            found
                .iter()
                .filter(|w| is_wildcard(&w.name) && under_wildcard(&w.name, &want))
                .collect()
        };
        let matched = if exact.is_empty() { covering() } else { exact };
        if matched.is_empty() {
            out.push(WantedHost {
                name: want.clone(),
                origin: found.first().map(|w| w.origin.clone()).unwrap_or_default(),
                cert: refused(
                    reasons::ROUTE_NOT_ACCEPTED,
                    format!(
                        "{want} is listed in {} but is not a hostname of {what} on any \
                         attached Gateway listener",
                        annotations::HOSTS
                    ),
                    None,
                ),
            });
        }
        out.extend(matched.into_iter().map(|w| WantedHost {
            name: want.clone(),
            ..w.clone()
        }));
    }
    out
}

/// Per name, one entry: the first with a certificate, else the first refusal. A route that
/// attaches to a Gateway's HTTP and HTTPS listeners is served through the HTTPS one, not
/// reported as refused by the HTTP one.
fn best_per_name(found: Vec<WantedHost>) -> Vec<WantedHost> {
    let mut order: Vec<String> = Vec::new();
    let mut best: BTreeMap<String, WantedHost> = BTreeMap::new();
    for w in found {
        match best.get(&w.name) {
            None => {
                order.push(w.name.clone());
                best.insert(w.name.clone(), w);
            }
            Some(prev) => {
                let prev_ok = matches!(prev.cert, CertSource::Secret(_));
                if !prev_ok && matches!(w.cert, CertSource::Secret(_)) {
                    best.insert(w.name.clone(), w);
                }
            }
        }
    }
    order.into_iter().filter_map(|n| best.remove(&n)).collect()
}

/// The hosts one HTTPRoute asks this listener to serve, with their certificates or why not.
/// Parents of another class (without `h3-ingress.dev/listener`) are someone else's.
pub fn route_hosts(
    listener: &Http3Listener,
    route: &HTTPRoute,
    objs: &GatewayObjects,
) -> Vec<WantedHost> {
    let listener_name = listener.metadata.name.as_deref().unwrap_or_default();
    let named = named_listener(&route.metadata);
    if !enabled(&route.metadata) || named.is_some_and(|n| n != listener_name) {
        return Vec::new();
    }
    let route_key = key(&route.metadata);
    let route_ns = route.metadata.namespace.as_deref().unwrap_or_default();
    let mut found: Vec<WantedHost> = Vec::new();
    for parent in route
        .spec
        .parent_refs
        .iter()
        .map(|p| Parent::of(p, route_ns))
    {
        if !parent.is_gateway() {
            continue;
        }
        let gw_key = format!("{}/{}", parent.namespace, parent.name);
        let Some(gw) = find_gateway(&objs.gateways, &parent.namespace, &parent.name) else {
            if named.is_some() {
                found.extend(unattached(
                    route,
                    &route_key,
                    &gw_key,
                    "-",
                    format!("Gateway {gw_key} not found"),
                ));
            }
            continue;
        };
        if named.is_none() && !class_matches(listener, gw) {
            continue;
        }
        found.extend(through_gateway(route, &route_key, &parent, gw, objs));
    }
    narrow(
        &route.metadata,
        best_per_name(found),
        &format!("HTTPRoute {route_key}"),
    )
}

/// The route's names through each listener of `gw` that `parent` selects and that admits it.
fn through_gateway(
    route: &HTTPRoute,
    route_key: &str,
    parent: &Parent,
    gw: &Gateway,
    objs: &GatewayObjects,
) -> Vec<WantedHost> {
    let gw_key = key(&gw.metadata);
    let route_ns = route.metadata.namespace.as_deref().unwrap_or_default();
    let gw_ns = gw.metadata.namespace.as_deref().unwrap_or_default();
    let is_accepted = accepted(route, parent, route_ns);
    let mut out = Vec::new();
    let mut any_listener = false;
    for l in &gw.spec.listeners {
        let selected = parent.section.as_ref().is_none_or(|s| *s == l.name)
            && parent.port.is_none_or(|p| p == l.port);
        if !selected || !admits(l, gw_ns, route_ns) {
            continue;
        }
        any_listener = true;
        let origin =
            HostOrigin::gateway(Some(route_key.to_string()), gw_key.clone(), l.name.clone());
        for name in intersect_hostnames(l.hostname.as_deref(), &route.spec.hostnames) {
            let cert = if is_accepted {
                listener_cert(gw, l, &objs.grants)
            } else {
                refused(
                    reasons::ROUTE_NOT_ACCEPTED,
                    format!(
                        "Gateway {gw_key} has not accepted HTTPRoute {route_key} (no Accepted=True \
                         in its status.parents for this parentRef)"
                    ),
                    None,
                )
            };
            out.push(WantedHost {
                name,
                origin: origin.clone(),
                cert,
            });
        }
    }
    if out.is_empty() {
        let why = if any_listener && route.spec.hostnames.is_empty() {
            format!(
                "neither HTTPRoute {route_key} nor the listeners of Gateway {gw_key} it attaches \
                 to name a hostname, so there is no host to serve a certificate for"
            )
        } else if any_listener {
            format!("no hostname of HTTPRoute {route_key} matches a listener of Gateway {gw_key}")
        } else {
            format!(
                "no listener of Gateway {gw_key} matches the parentRef (sectionName {}, port {}) \
                 and admits HTTPRoutes from namespace {route_ns}",
                parent.section.as_deref().unwrap_or("-"),
                parent
                    .port
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into())
            )
        };
        let section = parent.section.as_deref().unwrap_or("-");
        return unattached(route, route_key, &gw_key, section, why);
    }
    out
}

/// RouteNotAccepted entries for a route that does not attach: one per hostname it names, or
/// one for the route itself when it names none.
fn unattached(
    route: &HTTPRoute,
    route_key: &str,
    gw_key: &str,
    section: &str,
    why: String,
) -> Vec<WantedHost> {
    let mut names: Vec<String> = route
        .spec
        .hostnames
        .iter()
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect();
    if names.is_empty() {
        // Nothing to name the entry by: the route names no host, the listener neither.
        names.push(NO_HOSTNAME.to_string());
    }
    names
        .into_iter()
        .map(|name| WantedHost {
            name,
            origin: HostOrigin::gateway(
                Some(route_key.to_string()),
                gw_key.to_string(),
                section.to_string(),
            ),
            cert: refused(reasons::ROUTE_NOT_ACCEPTED, why.clone(), None),
        })
        .collect()
}

/// The hosts an annotated Gateway asks this listener to serve: the hostname of each of its
/// HTTPS listeners (listeners without a hostname name no host; HTTP listeners carry none of
/// the certificates HTTP/3 needs, so they are skipped, not refused).
pub fn gateway_hosts(
    listener: &Http3Listener,
    gw: &Gateway,
    objs: &GatewayObjects,
) -> Vec<WantedHost> {
    let listener_name = listener.metadata.name.as_deref().unwrap_or_default();
    if !enabled(&gw.metadata) {
        return Vec::new();
    }
    let ours = match named_listener(&gw.metadata) {
        Some(n) => n == listener_name,
        None => class_matches(listener, gw),
    };
    if !ours {
        return Vec::new();
    }
    let gw_key = key(&gw.metadata);
    let found = gw
        .spec
        .listeners
        .iter()
        .filter(|l| l.protocol.eq_ignore_ascii_case("HTTPS"))
        .filter_map(|l| {
            let name = l
                .hostname
                .as_deref()
                .map(str::trim)
                .filter(|h| !h.is_empty())?;
            Some(WantedHost {
                name: name.to_ascii_lowercase(),
                origin: HostOrigin::gateway(None, gw_key.clone(), l.name.clone()),
                cert: listener_cert(gw, l, &objs.grants),
            })
        })
        .collect();
    narrow(
        &gw.metadata,
        best_per_name(found),
        &format!("Gateway {gw_key}"),
    )
}

/// Every Gateway API host a listener wants: HTTPRoutes oldest first, then annotated Gateways
/// oldest first (so on a conflict the older object keeps the host, as with Ingresses).
pub fn wanted_from_gateway_api(listener: &Http3Listener, objs: &GatewayObjects) -> Vec<WantedHost> {
    let mut routes: Vec<&HTTPRoute> = objs.routes.iter().map(|r| r.as_ref()).collect();
    routes.sort_by_key(|r| age_key(&r.metadata));
    let mut gateways: Vec<&Gateway> = objs
        .gateways
        .iter()
        .map(|g| g.as_ref())
        .filter(|g| g.metadata.deletion_timestamp.is_none())
        .collect();
    gateways.sort_by_key(|g| age_key(&g.metadata));
    let mut out: Vec<WantedHost> = Vec::new();
    for r in routes {
        out.extend(route_hosts(listener, r, objs));
    }
    for g in gateways {
        out.extend(gateway_hosts(listener, g, objs));
    }
    out
}

/// Where to forward the hosts that come through listener `section` of Gateway `gateway`
/// (`namespace/name`): the listener's `gatewayUpstreams` entry for it, else the first address
/// the Gateway's controller reports (`status.addresses`) with the Gateway listener's port;
/// `None` (the listener's `upstream.address`) when the Gateway has neither.
pub fn gateway_upstream(
    listener: &Http3Listener,
    gateways: &[Arc<Gateway>],
    gateway: &str,
    section: &str,
) -> Option<String> {
    let (ns, name) = gateway.split_once('/')?;
    if let Some(o) = listener
        .spec
        .gateway_upstreams
        .iter()
        .find(|o| o.namespace == ns && o.name == name)
    {
        return Some(o.address.clone());
    }
    let gw = find_gateway(gateways, ns, name)?;
    let address = gw.status.as_ref()?.addresses.first()?.value.clone();
    let port = gw.spec.listeners.iter().find(|l| l.name == section)?.port;
    // An IPv6 literal needs brackets in host:port.
    let host = if address.contains(':') && !address.starts_with('[') {
        format!("[{address}]")
    } else {
        address
    };
    Some(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::gateway::{GatewaySpec, HTTPRouteSpec, ReferenceGrantSpec};
    use crate::api::{host_states, HostReport};
    use crate::operator::hosts::fixtures::{listener, now, tls_secret};
    use crate::operator::hosts::resolve::{ResolvedHosts, SecretMap};
    use crate::operator::hosts::{referenced_secrets, resolve_hosts};
    use k8s_openapi::api::networking::v1::Ingress;
    use serde_json::json;

    fn gw(ns: &str, name: &str, class: &str, listeners: serde_json::Value) -> Arc<Gateway> {
        Arc::new(Gateway {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            spec: GatewaySpec {
                gateway_class_name: class.into(),
                listeners: serde_json::from_value(listeners).unwrap(),
            },
            status: None,
        })
    }

    #[test]
    fn each_gateway_is_forwarded_to_its_own_address_unless_overridden() {
        let mut l = listener("public", None);
        let mut g = (*https_gateway()).clone();
        // No address reported: the listener's upstream.address (None here).
        assert_eq!(
            gateway_upstream(&l, &[Arc::new(g.clone())], "infra/gw", "https"),
            None
        );
        g.status = Some(crate::api::gateway::GatewayStatus {
            addresses: serde_json::from_value(json!([{"type": "IPAddress", "value": "fd00::7"},
                {"value": "10.0.0.7"}]))
            .unwrap(),
        });
        let gws = [Arc::new(g)];
        assert_eq!(
            gateway_upstream(&l, &gws, "infra/gw", "https").as_deref(),
            Some("[fd00::7]:443")
        );
        // An unknown section or Gateway: nothing to say.
        assert_eq!(gateway_upstream(&l, &gws, "infra/gw", "other"), None);
        assert_eq!(gateway_upstream(&l, &gws, "infra/none", "https"), None);
        l.spec.gateway_upstreams = serde_json::from_value(
            json!([{"namespace": "infra", "name": "gw", "address": "envoy-gw.infra.svc:8443"}]),
        )
        .unwrap();
        assert_eq!(
            gateway_upstream(&l, &gws, "infra/gw", "https").as_deref(),
            Some("envoy-gw.infra.svc:8443")
        );
    }

    /// A Gateway `infra/gw` of class `gw` with one HTTPS listener `https` for `*.example.com`
    /// terminating with Secret `infra/wild`.
    fn https_gateway() -> Arc<Gateway> {
        gw(
            "infra",
            "gw",
            "gw",
            json!([{"name": "https", "port": 443, "protocol": "HTTPS",
                "hostname": "*.example.com",
                "tls": {"certificateRefs": [{"name": "wild"}]},
                "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        )
    }

    fn annotated(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    struct Route {
        ns: &'static str,
        name: &'static str,
        ann: Vec<(&'static str, &'static str)>,
        hostnames: Vec<&'static str>,
        parents: serde_json::Value,
        /// parentRefs that the gateway's controller accepted.
        accepted: serde_json::Value,
    }

    impl Default for Route {
        fn default() -> Self {
            Route {
                ns: "apps",
                name: "web",
                ann: vec![(annotations::ENABLED, "true")],
                hostnames: vec!["a.example.com"],
                parents: json!([{"name": "gw", "namespace": "infra"}]),
                accepted: json!([{"name": "gw", "namespace": "infra"}]),
            }
        }
    }

    impl Route {
        fn build(self) -> Arc<HTTPRoute> {
            let parents: Vec<serde_json::Value> = self
                .accepted
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    json!({"parentRef": p, "controllerName": "example.com/gateway",
                        "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                            "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
                })
                .collect();
            Arc::new(HTTPRoute {
                metadata: ObjectMeta {
                    namespace: Some(self.ns.into()),
                    name: Some(self.name.into()),
                    annotations: annotated(&self.ann),
                    ..Default::default()
                },
                spec: HTTPRouteSpec {
                    parent_refs: serde_json::from_value(self.parents).unwrap(),
                    hostnames: self.hostnames.iter().map(|h| h.to_string()).collect(),
                    rules: Vec::new(),
                },
                status: Some(serde_json::from_value(json!({ "parents": parents })).unwrap()),
            })
        }
    }

    fn grant(ns: &str, from: serde_json::Value, to: serde_json::Value) -> Arc<ReferenceGrant> {
        Arc::new(ReferenceGrant {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some("grant".into()),
                ..Default::default()
            },
            spec: ReferenceGrantSpec {
                from: serde_json::from_value(from).unwrap(),
                to: serde_json::from_value(to).unwrap(),
            },
        })
    }

    fn secrets(list: &[(&str, &str, &[&str])]) -> SecretMap {
        list.iter()
            .map(|(ns, name, hosts)| tls_secret(ns, name, hosts))
            .collect()
    }

    fn resolve(objs: &GatewayObjects, secrets: &SecretMap) -> ResolvedHosts {
        let l = listener("public", None);
        let mut l = l;
        l.spec.gateway_class_name = Some("gw".into());
        resolve_hosts(&l, std::iter::empty::<&Ingress>(), objs, secrets, now())
    }

    fn the(r: &ResolvedHosts, name: &str) -> HostReport {
        let all: Vec<&HostReport> = r.reports.iter().filter(|h| h.name == name).collect();
        assert_eq!(all.len(), 1, "{name}: {:?}", r.reports);
        all[0].clone()
    }

    fn objs(
        gateways: Vec<Arc<Gateway>>,
        routes: Vec<Arc<HTTPRoute>>,
        grants: Vec<Arc<ReferenceGrant>>,
    ) -> GatewayObjects {
        GatewayObjects {
            gateways,
            routes,
            grants,
        }
    }

    #[test]
    fn hostname_intersection_follows_the_gateway_api() {
        let i = |l: Option<&str>, r: &[&str]| {
            intersect_hostnames(l, &r.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(
            i(Some("a.example.com"), &["A.example.com"]),
            ["a.example.com"]
        );
        assert!(i(Some("a.example.com"), &["b.example.com"]).is_empty());
        // Listener wildcard: a suffix match over any number of labels, never the apex.
        assert_eq!(
            i(
                Some("*.example.com"),
                &[
                    "a.example.com",
                    "x.y.example.com",
                    "example.com",
                    "a.other.org"
                ]
            ),
            ["a.example.com", "x.y.example.com"]
        );
        // Route wildcard over a listener name: the listener's name.
        assert_eq!(
            i(Some("a.example.com"), &["*.example.com"]),
            ["a.example.com"]
        );
        assert!(i(Some("example.com"), &["*.example.com"]).is_empty());
        // Two wildcards: the more specific one, either way round.
        assert_eq!(
            i(Some("*.example.com"), &["*.b.example.com"]),
            ["*.b.example.com"]
        );
        assert_eq!(
            i(Some("*.b.example.com"), &["*.example.com"]),
            ["*.b.example.com"]
        );
        assert_eq!(
            i(Some("*.example.com"), &["*.example.com"]),
            ["*.example.com"]
        );
        assert!(i(Some("*.example.com"), &["*.example.org"]).is_empty());
        // Missing on one side: the other side's names; on both: nothing to name.
        assert_eq!(
            i(None, &["a.example.com", "a.example.com"]),
            ["a.example.com"]
        );
        assert_eq!(i(Some("a.example.com"), &[]), ["a.example.com"]);
        assert!(i(None, &[]).is_empty());
    }

    #[test]
    fn an_accepted_annotated_route_is_served_with_the_gateway_listeners_certificate() {
        let o = objs(
            vec![https_gateway()],
            vec![Route::default().build()],
            vec![],
        );
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let r = resolve(&o, &s);
        let h = the(&r, "a.example.com");
        assert_eq!(
            (h.state.as_str(), h.reason.as_str()),
            (host_states::SERVING, reasons::SERVING)
        );
        assert_eq!(h.origin.http_route.as_deref(), Some("apps/web"));
        assert_eq!(h.origin.gateway.as_deref(), Some("infra/gw"));
        assert_eq!(h.origin.gateway_listener.as_deref(), Some("https"));
        assert_eq!(h.secret.as_deref(), Some("infra/wild"));
        assert_eq!(h.origin.ingress, None);
        assert!(r.serves("a.example.com"));
        let mut l = listener("public", None);
        l.spec.gateway_class_name = Some("gw".into());
        let refs: Vec<_> = referenced_secrets(&l, std::iter::empty::<&Ingress>(), &o)
            .into_iter()
            .collect();
        assert_eq!(
            refs,
            [SecretRef {
                namespace: "infra".into(),
                name: "wild".into()
            }]
        );
    }

    #[test]
    fn a_route_is_served_only_once_its_parent_accepted_it_for_the_same_parent_ref() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        for accepted in [
            json!([]),
            json!([{"name": "gw", "namespace": "infra", "sectionName": "other"}]),
            json!([{"name": "gw", "namespace": "elsewhere"}]),
            json!([{"name": "gw"}]),
        ] {
            let route = Route {
                accepted: accepted.clone(),
                ..Default::default()
            }
            .build();
            let r = resolve(&objs(vec![https_gateway()], vec![route], vec![]), &s);
            let h = the(&r, "a.example.com");
            assert_eq!(h.reason, reasons::ROUTE_NOT_ACCEPTED, "{accepted}");
            assert!(
                h.message.contains("has not accepted HTTPRoute apps/web"),
                "{}",
                h.message
            );
            assert!(r.served.is_empty());
        }
        // Accepted=False is not acceptance either.
        let mut route = (*Route::default().build()).clone();
        route.status.as_mut().unwrap().parents[0].conditions[0].status = "False".into();
        let r = resolve(
            &objs(vec![https_gateway()], vec![Arc::new(route)], vec![]),
            &s,
        );
        assert_eq!(the(&r, "a.example.com").reason, reasons::ROUTE_NOT_ACCEPTED);
        // Defaults in the status's parentRef compare equal to explicit values.
        let route = Route {
            parents: json!([{"name": "gw", "namespace": "infra"}]),
            accepted: json!([{"group": GROUP, "kind": "Gateway", "name": "gw", "namespace": "infra"}]),
            ..Default::default()
        };
        let r = resolve(
            &objs(vec![https_gateway()], vec![route.build()], vec![]),
            &s,
        );
        assert_eq!(the(&r, "a.example.com").reason, reasons::SERVING);
    }

    #[test]
    fn listeners_that_do_not_terminate_https_are_refused() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        for (protocol, tls) in [
            ("HTTP", json!(null)),
            (
                "HTTPS",
                json!({"mode": "Passthrough", "certificateRefs": [{"name": "wild"}]}),
            ),
            ("TLS", json!({"mode": "Passthrough"})),
        ] {
            let g = gw(
                "infra",
                "gw",
                "gw",
                json!([{"name": "web", "port": 443, "protocol": protocol, "tls": tls,
                    "allowedRoutes": {"namespaces": {"from": "All"}}}]),
            );
            let r = resolve(&objs(vec![g], vec![Route::default().build()], vec![]), &s);
            let h = the(&r, "a.example.com");
            assert_eq!(h.reason, reasons::LISTENER_NOT_HTTPS, "{protocol} {tls}");
            assert!(
                h.message.contains("listener web of Gateway infra/gw"),
                "{}",
                h.message
            );
        }
    }

    #[test]
    fn a_route_on_the_http_and_https_listeners_is_served_through_https_once() {
        let g = gw(
            "infra",
            "gw",
            "gw",
            json!([
                {"name": "http", "port": 80, "protocol": "HTTP",
                    "allowedRoutes": {"namespaces": {"from": "All"}}},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                    "tls": {"certificateRefs": [{"name": "wild"}]},
                    "allowedRoutes": {"namespaces": {"from": "All"}}}
            ]),
        );
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let r = resolve(
            &objs(vec![g.clone()], vec![Route::default().build()], vec![]),
            &s,
        );
        let h = the(&r, "a.example.com");
        assert_eq!(
            (h.reason.as_str(), h.origin.gateway_listener.as_deref()),
            (reasons::SERVING, Some("https"))
        );
        // sectionName and port pick the listener: the HTTP one only is refused.
        for parent in [
            json!([{"name": "gw", "namespace": "infra", "sectionName": "http"}]),
            json!([{"name": "gw", "namespace": "infra", "port": 80}]),
        ] {
            let route = Route {
                parents: parent.clone(),
                accepted: parent.clone(),
                ..Default::default()
            };
            let r = resolve(&objs(vec![g.clone()], vec![route.build()], vec![]), &s);
            assert_eq!(
                the(&r, "a.example.com").reason,
                reasons::LISTENER_NOT_HTTPS,
                "{parent}"
            );
        }
        let parent = json!([{"name": "gw", "namespace": "infra", "sectionName": "nope"}]);
        let route = Route {
            parents: parent.clone(),
            accepted: parent,
            ..Default::default()
        };
        let r = resolve(&objs(vec![g], vec![route.build()], vec![]), &s);
        let h = the(&r, "a.example.com");
        assert_eq!(h.reason, reasons::ROUTE_NOT_ACCEPTED);
        assert!(h.message.contains("sectionName nope"), "{}", h.message);
    }

    #[test]
    fn allowed_routes_limit_the_namespaces_and_kinds_a_listener_takes() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let with = |allowed: serde_json::Value| {
            gw(
                "infra",
                "gw",
                "gw",
                json!([{"name": "https", "port": 443, "protocol": "HTTPS",
                    "tls": {"certificateRefs": [{"name": "wild"}]}, "allowedRoutes": allowed}]),
            )
        };
        let cases = [
            (json!(null), false),
            (json!({"namespaces": {"from": "Same"}}), false),
            (json!({"namespaces": {"from": "None"}}), false),
            (json!({"namespaces": {"from": "All"}}), true),
            (json!({"namespaces": {"from": "Selector"}}), true),
            (
                json!({"namespaces": {"from": "All"}, "kinds": [{"kind": "GRPCRoute"}]}),
                false,
            ),
            (
                json!({"namespaces": {"from": "All"}, "kinds": [{"kind": "HTTPRoute"}]}),
                true,
            ),
        ];
        for (allowed, served) in cases {
            let r = resolve(
                &objs(
                    vec![with(allowed.clone())],
                    vec![Route::default().build()],
                    vec![],
                ),
                &s,
            );
            let h = the(&r, "a.example.com");
            let want = if served {
                reasons::SERVING
            } else {
                reasons::ROUTE_NOT_ACCEPTED
            };
            assert_eq!(h.reason, want, "{allowed}");
        }
        // Same namespace is the default.
        let same = Route {
            ns: "infra",
            ..Default::default()
        }
        .build();
        let r = resolve(&objs(vec![with(json!(null))], vec![same], vec![]), &s);
        assert_eq!(the(&r, "a.example.com").reason, reasons::SERVING);
    }

    fn cross_ns_gateway() -> Arc<Gateway> {
        gw(
            "infra",
            "gw",
            "gw",
            json!([{"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "a.example.com",
                "tls": {"certificateRefs": [{"name": "shared", "namespace": "certs"}]},
                "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        )
    }

    #[test]
    fn a_certificate_in_another_namespace_needs_a_reference_grant_from_gateways() {
        let s = secrets(&[("certs", "shared", &["a.example.com"])]);
        let from_gw = json!([{"group": GROUP, "kind": "Gateway", "namespace": "infra"}]);
        let to_secret = json!([{"group": "", "kind": "Secret"}]);
        let refused = [
            vec![],
            // In the Gateway's namespace instead of the Secret's.
            vec![grant("infra", from_gw.clone(), to_secret.clone())],
            // From the route's kind or namespace, not the Gateway's.
            vec![grant(
                "certs",
                json!([{"group": GROUP, "kind": "HTTPRoute", "namespace": "infra"}]),
                to_secret.clone(),
            )],
            vec![grant(
                "certs",
                json!([{"group": GROUP, "kind": "Gateway", "namespace": "apps"}]),
                to_secret.clone(),
            )],
            // To another Secret, or to a non-core kind.
            vec![grant(
                "certs",
                from_gw.clone(),
                json!([{"group": "", "kind": "Secret", "name": "other"}]),
            )],
            vec![grant(
                "certs",
                from_gw.clone(),
                json!([{"group": "example.com", "kind": "Secret"}]),
            )],
        ];
        for grants in refused {
            let r = resolve(
                &objs(
                    vec![cross_ns_gateway()],
                    vec![Route::default().build()],
                    grants.clone(),
                ),
                &s,
            );
            let h = the(&r, "a.example.com");
            assert_eq!(h.reason, reasons::REF_NOT_PERMITTED, "{grants:?}");
            assert_eq!(h.secret.as_deref(), Some("certs/shared"));
            assert!(
                h.message
                    .contains("no ReferenceGrant in certs permits Gateways from infra"),
                "{}",
                h.message
            );
            let mut l = listener("public", None);
            l.spec.gateway_class_name = Some("gw".into());
            let o = objs(
                vec![cross_ns_gateway()],
                vec![Route::default().build()],
                grants,
            );
            assert!(
                referenced_secrets(&l, std::iter::empty::<&Ingress>(), &o).is_empty(),
                "never read"
            );
        }
        for to in [
            to_secret,
            json!([{"group": "", "kind": "Secret", "name": "shared"}]),
        ] {
            let grants = vec![grant("certs", from_gw.clone(), to.clone())];
            let r = resolve(
                &objs(
                    vec![cross_ns_gateway()],
                    vec![Route::default().build()],
                    grants,
                ),
                &s,
            );
            assert_eq!(the(&r, "a.example.com").reason, reasons::SERVING, "{to}");
        }
    }

    #[test]
    fn secret_problems_are_reported_as_for_ingresses() {
        let o = objs(
            vec![https_gateway()],
            vec![Route::default().build()],
            vec![],
        );
        let r = resolve(&o, &SecretMap::new());
        let h = the(&r, "a.example.com");
        assert_eq!(h.reason, reasons::SECRET_NOT_FOUND);
        assert_eq!(h.message, "Secret infra/wild not found");
        let r = resolve(&o, &secrets(&[("infra", "wild", &["b.example.com"])]));
        assert_eq!(
            the(&r, "a.example.com").reason,
            reasons::CERTIFICATE_DOES_NOT_MATCH_HOST
        );
        let g = gw(
            "infra",
            "gw",
            "gw",
            json!([{"name": "https", "port": 443, "protocol": "HTTPS",
                "tls": {"certificateRefs": []}, "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        );
        let r = resolve(
            &objs(vec![g], vec![Route::default().build()], vec![]),
            &SecretMap::new(),
        );
        let h = the(&r, "a.example.com");
        assert_eq!(h.reason, reasons::SECRET_NOT_FOUND);
        assert!(
            h.message.contains("no tls.certificateRefs"),
            "{}",
            h.message
        );
    }

    #[test]
    fn the_class_or_the_listener_annotation_selects_and_the_enabled_annotation_switches() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let other_class = gw(
            "infra",
            "gw",
            "other",
            https_gateway()
                .spec
                .listeners
                .iter()
                .map(|l| serde_json::to_value(l).unwrap())
                .collect(),
        );
        type Case = (Arc<Gateway>, Vec<(&'static str, &'static str)>, bool);
        let cases: Vec<Case> = vec![
            (https_gateway(), vec![(annotations::ENABLED, "true")], true),
            (https_gateway(), vec![(annotations::ENABLED, "TRUE")], true),
            (https_gateway(), vec![], false),
            (
                https_gateway(),
                vec![(annotations::ENABLED, "false")],
                false,
            ),
            (
                other_class.clone(),
                vec![(annotations::ENABLED, "true")],
                false,
            ),
            (
                other_class,
                vec![
                    (annotations::ENABLED, "true"),
                    (annotations::LISTENER, "public"),
                ],
                true,
            ),
            (
                https_gateway(),
                vec![
                    (annotations::ENABLED, "true"),
                    (annotations::LISTENER, "internal"),
                ],
                false,
            ),
        ];
        for (g, ann, served) in cases {
            let route = Route {
                ann: ann.clone(),
                ..Default::default()
            }
            .build();
            let r = resolve(&objs(vec![g], vec![route], vec![]), &s);
            assert_eq!(r.serves("a.example.com"), served, "{ann:?}");
            assert_eq!(
                r.reports.len(),
                usize::from(served),
                "{ann:?}: {:?}",
                r.reports
            );
        }
        // A parent that does not exist is reported only when the route names this listener.
        let route = Route {
            ann: vec![(annotations::ENABLED, "true")],
            ..Default::default()
        }
        .build();
        assert!(resolve(&objs(vec![], vec![route], vec![]), &s)
            .reports
            .is_empty());
        let route = Route {
            ann: vec![
                (annotations::ENABLED, "true"),
                (annotations::LISTENER, "public"),
            ],
            ..Default::default()
        }
        .build();
        let r = resolve(&objs(vec![], vec![route], vec![]), &s);
        let h = the(&r, "a.example.com");
        assert_eq!(h.reason, reasons::ROUTE_NOT_ACCEPTED);
        assert_eq!(h.message, "Gateway infra/gw not found");
    }

    #[test]
    fn an_ingress_keeps_a_host_a_route_also_asks_for() {
        use k8s_openapi::api::networking::v1::{IngressSpec, IngressTLS};
        let ing = Ingress {
            metadata: ObjectMeta {
                namespace: Some("default".into()),
                name: Some("old".into()),
                annotations: annotated(&[
                    (annotations::ENABLED, "true"),
                    (annotations::LISTENER, "public"),
                ]),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                tls: Some(vec![IngressTLS {
                    hosts: Some(vec!["a.example.com".into()]),
                    secret_name: Some("a-tls".into()),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = secrets(&[
            ("infra", "wild", &["*.example.com"]),
            ("default", "a-tls", &["a.example.com"]),
        ]);
        let mut l = listener("public", None);
        l.spec.gateway_class_name = Some("gw".into());
        let o = objs(
            vec![https_gateway()],
            vec![Route::default().build()],
            vec![],
        );
        let r = resolve_hosts(&l, [&ing], &o, &s, now());
        let mine: Vec<(Option<String>, Option<String>, String)> = r
            .reports
            .iter()
            .map(|h| {
                (
                    h.origin.ingress.clone(),
                    h.origin.http_route.clone(),
                    h.reason.clone(),
                )
            })
            .collect();
        assert_eq!(
            mine,
            [
                (
                    None,
                    Some("apps/web".into()),
                    reasons::HOST_CONFLICT.to_string()
                ),
                (
                    Some("default/old".into()),
                    None,
                    reasons::SERVING.to_string()
                ),
            ]
        );
        let conflict = &r.reports[0];
        assert_eq!(
            conflict.message,
            "a.example.com is already served from Ingress default/old with Secret default/a-tls"
        );
    }

    #[test]
    fn conflicts_between_routes_go_to_the_older_one_and_name_its_source() {
        let second = gw(
            "infra",
            "gw2",
            "gw",
            json!([{"name": "web", "port": 443, "protocol": "HTTPS", "hostname": "a.example.com",
                "tls": {"certificateRefs": [{"name": "a"}]},
                "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        );
        let set_created = |r: Arc<HTTPRoute>, t: i64| {
            let mut r = (*r).clone();
            r.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::from_second(t).unwrap(),
                ));
            Arc::new(r)
        };
        let older = set_created(
            Route {
                name: "older",
                ..Default::default()
            }
            .build(),
            100,
        );
        let parent = json!([{"name": "gw2", "namespace": "infra"}]);
        let newer = set_created(
            Route {
                name: "newer",
                parents: parent.clone(),
                accepted: parent,
                ..Default::default()
            }
            .build(),
            200,
        );
        let s = secrets(&[
            ("infra", "wild", &["*.example.com"]),
            ("infra", "a", &["a.example.com"]),
        ]);
        let r = resolve(
            &objs(vec![https_gateway(), second], vec![newer, older], vec![]),
            &s,
        );
        let got: Vec<(String, String)> = r
            .reports
            .iter()
            .map(|h| (h.origin.http_route.clone().unwrap(), h.reason.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("apps/newer".to_string(), reasons::HOST_CONFLICT.to_string()),
                ("apps/older".to_string(), reasons::SERVING.to_string()),
            ]
        );
        assert_eq!(
            r.reports[0].message,
            "a.example.com is already served from HTTPRoute apps/older, Gateway infra/gw listener https with Secret infra/wild"
        );
    }

    #[test]
    fn the_hosts_annotation_narrows_a_route_and_a_wildcard_covers_listed_names() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let route = Route {
            ann: vec![
                (annotations::ENABLED, "true"),
                (
                    annotations::HOSTS,
                    "B.example.com, x.y.example.com, nope.example.org",
                ),
            ],
            hostnames: vec!["a.example.com", "b.example.com", "*.y.example.com"],
            ..Default::default()
        }
        .build();
        let r = resolve(&objs(vec![https_gateway()], vec![route], vec![]), &s);
        let names: Vec<(&str, &str)> = r
            .reports
            .iter()
            .map(|h| (h.name.as_str(), h.reason.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("b.example.com", reasons::SERVING),
                ("nope.example.org", reasons::ROUTE_NOT_ACCEPTED),
                // Under the route's *.y.example.com, but the certificate is *.example.com,
                // which covers one label only.
                ("x.y.example.com", reasons::CERTIFICATE_DOES_NOT_MATCH_HOST),
            ]
        );
        assert!(
            r.reports[1]
                .message
                .contains("not a hostname of HTTPRoute apps/web"),
            "{}",
            r.reports[1].message
        );
    }

    #[test]
    fn an_annotated_gateway_serves_its_https_listeners_hostnames() {
        let mut g = (*gw(
            "infra",
            "gw",
            "gw",
            json!([
                {"name": "http", "port": 80, "protocol": "HTTP", "hostname": "plain.example.com"},
                {"name": "https", "port": 443, "protocol": "HTTPS", "hostname": "a.example.com",
                    "tls": {"certificateRefs": [{"name": "a"}]}},
                {"name": "any", "port": 8443, "protocol": "HTTPS",
                    "tls": {"certificateRefs": [{"name": "a"}]}},
                {"name": "cross", "port": 9443, "protocol": "HTTPS", "hostname": "c.example.com",
                    "tls": {"certificateRefs": [{"name": "c", "namespace": "certs"}]}}
            ]),
        ))
        .clone();
        let s = secrets(&[
            ("infra", "a", &["a.example.com"]),
            ("certs", "c", &["c.example.com"]),
        ]);
        let r = resolve(&objs(vec![Arc::new(g.clone())], vec![], vec![]), &s);
        assert!(r.reports.is_empty(), "not annotated");
        g.metadata.annotations = annotated(&[(annotations::ENABLED, "true")]);
        let r = resolve(&objs(vec![Arc::new(g)], vec![], vec![]), &s);
        let got: Vec<(&str, &str, Option<&str>, Option<&str>)> = r
            .reports
            .iter()
            .map(|h| {
                (
                    h.name.as_str(),
                    h.reason.as_str(),
                    h.origin.gateway_listener.as_deref(),
                    h.origin.http_route.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a.example.com", reasons::SERVING, Some("https"), None),
                (
                    "c.example.com",
                    reasons::REF_NOT_PERMITTED,
                    Some("cross"),
                    None
                ),
            ]
        );
    }

    #[test]
    fn a_route_being_deleted_or_without_names_asks_for_nothing_servable() {
        let s = secrets(&[("infra", "wild", &["*.example.com"])]);
        let mut deleting = (*Route::default().build()).clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
            ));
        let r = resolve(
            &objs(vec![https_gateway()], vec![Arc::new(deleting)], vec![]),
            &s,
        );
        assert!(r.reports.is_empty());
        let g = gw(
            "infra",
            "gw",
            "gw",
            json!([{"name": "https", "port": 443, "protocol": "HTTPS",
                "tls": {"certificateRefs": [{"name": "wild"}]},
                "allowedRoutes": {"namespaces": {"from": "All"}}}]),
        );
        let route = Route {
            hostnames: vec![],
            ..Default::default()
        }
        .build();
        let r = resolve(&objs(vec![g], vec![route], vec![]), &s);
        assert!(r.served.is_empty());
        assert_eq!(r.reports.len(), 1);
        assert_eq!(r.reports[0].name, NO_HOSTNAME);
        assert!(
            r.reports[0]
                .message
                .starts_with("neither HTTPRoute apps/web nor"),
            "{}",
            r.reports[0].message
        );
        assert_eq!(r.reports[0].reason, reasons::ROUTE_NOT_ACCEPTED);
        assert_eq!(r.reports[0].state, host_states::NOT_SERVING);
    }
}
