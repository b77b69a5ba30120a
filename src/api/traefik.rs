//! The two Traefik kinds (`traefik.io/v1alpha1`) h3-ingress reads, with only the fields that
//! tell whether a host's TCP-side policy depends on the client's address or asks for a client
//! certificate: Middleware (`ipAllowList`, the deprecated `ipWhiteList`, `rateLimit`,
//! `inFlightReq`, `chain`, plugins) and TLSOption (`clientAuth`: a Middleware's
//! `passTLSClientCert` only passes on what the TLSOption asked for). Serde
//! ignores every other field, so the operator's cache of them holds little beyond their names,
//! and newer Traefik releases still parse. The one Middleware h3-ingress writes is its own
//! `headers` one (`spec.advertise.altSvc`): `headers.customResponseHeaders` is read and
//! written, and judges no address.
//!
//! The field names and defaults are Traefik v3.7.13's (`pkg/config/dynamic/middlewares.go`,
//! `pkg/provider/kubernetes/crd/traefikio/v1alpha1/{middleware,tlsoption}.go`);
//! `operator::hosts::policy` holds the rules Traefik applies to them.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The API group of Traefik's kinds.
pub const GROUP: &str = "traefik.io";
/// The provider suffix Traefik gives objects of its Kubernetes CRD provider
/// (`namespace-name@kubernetescrd`).
pub const CRD_PROVIDER: &str = "kubernetescrd";

/// A Middleware: one HTTP middleware of Traefik's, attached to routers by name.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "traefik.io",
    version = "v1alpha1",
    kind = "Middleware",
    namespaced,
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct MiddlewareSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_allow_list: Option<IpAllowList>,
    /// Deprecated in Traefik v3, still honoured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_white_list: Option<IpAllowList>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<SourceLimited>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight_req: Option<SourceLimited>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain: Option<Chain>,
    /// Response headers only (the operator's own Alt-Svc Middleware): no address judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
    /// Plugin middlewares by plugin name; what they judge is not knowable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugin: BTreeMap<String, Present>,
}

/// A field whose presence is all that is read: any value parses (a plugin's configuration
/// is free-form, and one object that failed to parse would fail the whole list) and is
/// dropped.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Present {}

impl<'de> Deserialize<'de> for Present {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d).map(|_| Present {})
    }
}

/// `headers`: of its many fields only the custom response headers are kept.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Headers {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom_response_headers: BTreeMap<String, String>,
}

/// `ipAllowList` / `ipWhiteList`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IpAllowList {
    #[serde(default)]
    pub source_range: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_strategy: Option<IpStrategy>,
}

/// Which address Traefik takes as the client's: `depth` counts `X-Forwarded-For` entries
/// from the right, `excludedIPs` skips those from the right; neither: the connection's peer.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IpStrategy {
    #[serde(default)]
    pub depth: i64,
    #[serde(default, rename = "excludedIPs")]
    pub excluded_ips: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6_subnet: Option<i64>,
}

/// `rateLimit` / `inFlightReq`: only the criterion that groups requests is read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceLimited {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_criterion: Option<SourceCriterion>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceCriterion {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_strategy: Option<IpStrategy>,
    #[serde(default)]
    pub request_header_name: String,
    #[serde(default)]
    pub request_host: bool,
}

/// `chain`: other Middlewares, in order; a reference without a namespace means the chain's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Chain {
    #[serde(default)]
    pub middlewares: Vec<MiddlewareRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MiddlewareRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A TLSOption: TLS settings of the routers naming it; a client certificate is asked for
/// unless `clientAuth.clientAuthType` is empty or `NoClientCert`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "traefik.io",
    version = "v1alpha1",
    kind = "TLSOption",
    plural = "tlsoptions",
    namespaced,
    schema = "disabled",
    derive = "Default",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct TLSOptionSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_auth: Option<ClientAuth>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClientAuth {
    #[serde(default)]
    pub client_auth_type: String,
}

/// Traefik's `NoClientCert`: the only client auth type that asks for no certificate.
pub const NO_CLIENT_CERT: &str = "NoClientCert";
/// The TLSOption name Traefik applies to every router that names none.
pub const DEFAULT_TLS_OPTION: &str = "default";

impl TLSOption {
    /// Whether routers with this option ask the client for a certificate.
    pub fn asks_for_client_certificate(&self) -> bool {
        self.spec
            .client_auth
            .as_ref()
            .is_some_and(|c| !c.client_auth_type.is_empty() && c.client_auth_type != NO_CLIENT_CERT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn resource_names_match_traefiks_crds() {
        assert_eq!(Middleware::plural(&()), "middlewares");
        assert_eq!(TLSOption::plural(&()), "tlsoptions");
        assert_eq!(Middleware::api_version(&()), "traefik.io/v1alpha1");
        assert_eq!(TLSOption::group(&()), GROUP);
    }

    #[test]
    fn only_the_fields_read_are_kept() {
        let m: Middleware = serde_json::from_value(serde_json::json!({
            "apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
            "metadata": {"name": "allow", "namespace": "shop"},
            "spec": {
                "ipAllowList": {"sourceRange": ["10.0.0.0/8"],
                    "ipStrategy": {"depth": 1, "excludedIPs": ["10.1.0.0/16"]},
                    "rejectStatusCode": 404},
                "headers": {"customRequestHeaders": {"X-Big": "x".repeat(4096)}},
                "plugin": {"geoblock": {"allowed": ["FR"]}, "odd": ["a", 1]},
                "passTLSClientCert": {"pem": true}
            }
        }))
        .unwrap();
        let a = m.spec.ip_allow_list.as_ref().unwrap();
        assert_eq!(a.source_range, ["10.0.0.0/8"]);
        let s = a.ip_strategy.as_ref().unwrap();
        assert_eq!((s.depth, s.excluded_ips.len()), (1, 1));
        assert!(m.spec.plugin.contains_key("geoblock"));
        // The headers Middleware's 4 KiB are not kept: the cache holds what is read.
        let kept = serde_json::to_string(&m.spec).unwrap();
        assert!(kept.len() < 200, "{kept}");

        let t: TLSOption = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "mtls", "namespace": "shop"},
            "spec": {"minVersion": "VersionTLS12",
                "clientAuth": {"secretNames": ["ca"], "clientAuthType": "RequireAndVerifyClientCert"}}
        }))
        .unwrap();
        assert!(t.asks_for_client_certificate());
        for (kind, asks) in [
            ("NoClientCert", false),
            ("", false),
            ("RequestClientCert", true),
        ] {
            let t = TLSOption {
                spec: TLSOptionSpec {
                    client_auth: Some(ClientAuth {
                        client_auth_type: kind.into(),
                    }),
                },
                ..Default::default()
            };
            assert_eq!(t.asks_for_client_certificate(), asks, "{kind:?}");
        }
    }
}
