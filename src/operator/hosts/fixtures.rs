//! Objects for the tests of host resolution: listeners, Ingresses and TLS Secrets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::networking::v1::{Ingress, IngressRule, IngressSpec, IngressTLS};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::ByteString;

use super::gateway::GatewayObjects;
use super::resolve::{ResolvedHosts, TLS_CERT_KEY, TLS_KEY_KEY};
use crate::api::{annotations, Http3Listener, Http3ListenerSpec};

pub(crate) fn none() -> GatewayObjects {
    GatewayObjects::default()
}

pub(crate) fn now() -> i64 {
    crate::config::file::unix_now()
}

pub(crate) fn listener(name: &str, class: Option<&str>) -> Http3Listener {
    let spec: Http3ListenerSpec = serde_json::from_value(serde_json::json!({
        "upstream": {"address": "ingress-nginx.ingress:443"}
    }))
    .unwrap();
    let mut l = Http3Listener::new(name, spec);
    l.spec.ingress_class_name = class.map(str::to_string);
    l
}

pub(crate) struct Ing {
    pub ns: &'static str,
    pub name: &'static str,
    pub class: Option<&'static str>,
    pub ann: Vec<(&'static str, &'static str)>,
    pub rules: Vec<&'static str>,
    pub tls: Vec<(Vec<&'static str>, Option<&'static str>)>,
    pub created: i64,
}

impl Default for Ing {
    fn default() -> Self {
        Ing {
            ns: "default",
            name: "web",
            class: Some("nginx"),
            ann: vec![(annotations::ENABLED, "true")],
            rules: vec![],
            tls: vec![],
            created: 1_700_000_000,
        }
    }
}

impl Ing {
    pub(crate) fn build(self) -> Ingress {
        Ingress {
            metadata: ObjectMeta {
                namespace: Some(self.ns.into()),
                name: Some(self.name.into()),
                annotations: Some(
                    self.ann
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(self.created).unwrap(),
                )),
                ..Default::default()
            },
            spec: Some(IngressSpec {
                ingress_class_name: self.class.map(str::to_string),
                rules: Some(
                    self.rules
                        .iter()
                        .map(|h| IngressRule {
                            host: Some(h.to_string()),
                            http: None,
                        })
                        .collect(),
                ),
                tls: Some(
                    self.tls
                        .iter()
                        .map(|(hosts, secret)| IngressTLS {
                            hosts: Some(hosts.iter().map(|s| s.to_string()).collect()),
                            secret_name: secret.map(str::to_string),
                        })
                        .collect(),
                ),
                default_backend: None,
            }),
            status: None,
        }
    }
}

pub(crate) fn tls_secret(ns: &str, name: &str, hosts: &[&str]) -> ((String, String), Secret) {
    let (c, k) = crate::testcerts::self_signed(hosts);
    let mut data = BTreeMap::new();
    data.insert(TLS_CERT_KEY.to_string(), ByteString(c.into_bytes()));
    data.insert(TLS_KEY_KEY.to_string(), ByteString(k.into_bytes()));
    (
        (ns.to_string(), name.to_string()),
        Secret {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                ..Default::default()
            },
            data: Some(data),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        },
    )
}

pub(crate) fn by_name(r: &ResolvedHosts, name: &str) -> Vec<(String, String)> {
    r.reports
        .iter()
        .filter(|h| h.name == name)
        .map(|h| (h.state.clone(), h.reason.clone()))
        .collect()
}
