//! The few Gateway API types (`gateway.networking.k8s.io`) h3-ingress reads: Gateway and
//! HTTPRoute (v1) and ReferenceGrant (v1beta1), with only the fields the host resolution
//! and the per-host policy use. Serde ignores every other field, so newer Gateway API releases still parse.
//!
//! Why not the community `gateway-api` crate: its current release (0.22) is built on kube 4
//! and k8s-openapi 0.28, while this project is on kube 5 and k8s-openapi 0.29. Two
//! k8s-openapi versions cannot share one `ObjectMeta`/`Resource`, so its types would not work
//! with our client, reflectors or stores. These hand-written types are read-only views;
//! h3-ingress never writes Gateway API objects (their status belongs to the gateway's own
//! controller), so the partial field set cannot drop anything on a write.
//!
//! ReferenceGrant is read as v1beta1: it is the storage version in the standard channel
//! (v1.6.3 serves v1 and v1beta1) and the only version older installs serve.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The API group of every Gateway API kind.
pub const GROUP: &str = "gateway.networking.k8s.io";

/// A Gateway: the listeners (ports, protocols, hostnames, certificates) of a gateway.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "Gateway",
    namespaced,
    schema = "disabled",
    status = "GatewayStatus",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    #[serde(default)]
    pub gateway_class_name: String,
    #[serde(default)]
    pub listeners: Vec<GatewayListener>,
}

/// What a Gateway's controller says of it: only the addresses it receives traffic on (an
/// implementation that runs one proxy per Gateway gives each Gateway its own).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    #[serde(default)]
    pub addresses: Vec<GatewayStatusAddress>,
}

/// One `status.addresses[]` entry: `IPAddress` (the default) or `Hostname`, or an
/// implementation-specific type.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatusAddress {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    pub value: String,
}

/// One `spec.listeners[]` entry of a Gateway.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayListener {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or an implementation-specific protocol.
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (the default) or `Passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default)]
    pub certificate_refs: Vec<ObjectReference>,
}

/// A `SecretObjectReference`: group `""` and kind `Secret` unless given.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<RouteGroupKind>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (the default), `All`, `Selector` or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub kind: String,
}

/// An HTTPRoute: hostnames and the Gateways (and their listener sections) it attaches to.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1",
    kind = "HTTPRoute",
    plural = "httproutes",
    namespaced,
    schema = "disabled",
    status = "RouteStatus",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteSpec {
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Only each rule's timeouts and filters are read (the per-host policy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<HTTPRouteRule>,
}

/// One `spec.rules[]` entry of an HTTPRoute, as far as h3-ingress reads it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HTTPRouteTimeouts>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HTTPRouteFilter>,
}

/// `timeouts` of a rule: Gateway API durations (`10s`, `1m30s`, `500ms`; `0s` disables).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteTimeouts {
    /// From the gateway receiving the request to the end of the response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// One request from the gateway to a backend, until its response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// A rule's filter; only `ExtensionRef` ones are read (a Traefik Middleware, say).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HTTPRouteFilter {
    #[serde(default, rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<LocalObjectReference>,
}

/// A reference to an object in the route's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub kind: String,
    pub name: String,
}

/// `spec.parentRefs[]` and `status.parents[].parentRef`: group and kind default to a
/// Gateway, the namespace to the route's own.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// What a gateway controller says about one parent of a route (`Accepted`, ...).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    pub parent_ref: ParentReference,
    #[serde(default)]
    pub controller_name: String,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A ReferenceGrant: lets objects of the `from` kinds in other namespaces refer to the `to`
/// kinds in the grant's own namespace.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "gateway.networking.k8s.io",
    version = "v1beta1",
    kind = "ReferenceGrant",
    namespaced,
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    #[serde(default)]
    pub from: Vec<GrantFrom>,
    #[serde(default)]
    pub to: Vec<GrantTo>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrantFrom {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GrantTo {
    #[serde(default)]
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn resource_names_match_the_gateway_api_crds() {
        assert_eq!(Gateway::plural(&()), "gateways");
        assert_eq!(HTTPRoute::plural(&()), "httproutes");
        assert_eq!(ReferenceGrant::plural(&()), "referencegrants");
        assert_eq!(HTTPRoute::api_version(&()), "gateway.networking.k8s.io/v1");
        assert_eq!(
            ReferenceGrant::api_version(&()),
            "gateway.networking.k8s.io/v1beta1"
        );
        assert_eq!(Gateway::group(&()), GROUP);
    }

    #[test]
    fn objects_parse_with_unknown_fields_and_defaults() {
        let r: HTTPRoute = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {
                "parentRefs": [{"name": "gw", "sectionName": "https"}],
                "hostnames": ["a.example.com"],
                "rules": [{"backendRefs": [{"name": "web", "port": 80}],
                           "timeouts": {"request": "10m"},
                           "filters": [{"type": "ExtensionRef", "extensionRef":
                               {"group": "traefik.io", "kind": "Middleware", "name": "allow"}},
                               {"type": "RequestHeaderModifier", "requestHeaderModifier": {}}]}]
            },
            "status": {"parents": [{
                "parentRef": {"name": "gw"},
                "controllerName": "example.com/gw",
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }]}
        }))
        .unwrap();
        assert_eq!(r.spec.parent_refs[0].section_name.as_deref(), Some("https"));
        let rule = &r.spec.rules[0];
        assert_eq!(
            rule.timeouts.as_ref().unwrap().request.as_deref(),
            Some("10m")
        );
        assert_eq!(
            rule.filters[0].extension_ref.as_ref().unwrap().name,
            "allow"
        );
        assert_eq!(rule.filters[1].type_, "RequestHeaderModifier");
        assert_eq!(r.status.unwrap().parents[0].conditions[0].type_, "Accepted");
        let g: Gateway = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "gw", "namespace": "infra"},
            "spec": {"gatewayClassName": "nginx", "listeners": [{
                "name": "https", "port": 443, "protocol": "HTTPS", "hostname": "*.example.com",
                "tls": {"certificateRefs": [{"name": "wild"}]},
                "allowedRoutes": {"namespaces": {"from": "All"}}
            }]}
        }))
        .unwrap();
        let l = &g.spec.listeners[0];
        assert_eq!(l.tls.as_ref().unwrap().certificate_refs[0].name, "wild");
        assert_eq!(l.tls.as_ref().unwrap().mode, None);
    }
}
