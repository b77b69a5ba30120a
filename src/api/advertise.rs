//! `spec.advertise` of the `Http3Listener`: telling browsers that the listener's hosts speak
//! HTTP/3, only while they do. `advertise.dns` keeps a DNS HTTPS record (RFC 9460,
//! `alpn="h3,h2"`) for every host the listener serves in the user's zones, by RFC 2136
//! dynamic update signed with TSIG; `status.advertise.dns` says what is published and where.
//! `advertise.altSvc` makes the TCP ingress itself send `Alt-Svc` for the hosts served, where
//! it has a declarative per-router header (Traefik's `headers` Middleware), and `Alt-Svc:
//! clear` while they are not; `status.advertise.altSvc` counts them and names the Ingresses
//! that need the user's hand.
//! Kubernetes-only (the standalone file has no operator to publish anything).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds;

/// Short, so that resolvers forget a withdrawn record within a minute of its deletion.
pub const DEFAULT_DNS_TTL_SECONDS: u32 = 60;

fn default_ttl() -> u32 {
    DEFAULT_DNS_TTL_SECONDS
}

/// What the listener advertises besides the data plane's own `Alt-Svc`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AdvertiseSettings {
    /// DNS HTTPS records for the served hosts; none published when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsAdvertise>,
    /// `Alt-Svc` sent by the TCP ingress for the served hosts; not managed when absent (the
    /// status then gives a recipe per host, as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_svc: Option<AltSvcAdvertise>,
}

/// Managed `Alt-Svc` on the TCP side. For each Ingress of a Traefik IngressClass whose hosts
/// the listener serves, the operator keeps a `headers` Middleware of its own in the Ingress's
/// namespace (`h3-ingress-alt-svc-<ingress>`, owned by the Ingress): `Alt-Svc: h3=":PORT";
/// ma=MAX_AGE` while every host of the Ingress is served, `Alt-Svc: clear` otherwise. It adds
/// the Middleware to the Ingress's `traefik.ingress.kubernetes.io/router.middlewares` only
/// when that annotation is absent (with a field manager of its own, never forcing); an
/// Ingress that lists its own Middlewares keeps them, and the status names the reference for
/// the user to add to the list. HTTPRoutes and other controllers get the recipe.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AltSvcAdvertise {}

/// An authoritative DNS server that takes RFC 2136 updates signed with a TSIG key, and the
/// zones on it where the served hosts get their HTTPS record. Records the operator did not
/// create are never changed: beside each record it keeps a TXT record at
/// `_h3-ingress.HOST` naming the operator and the listener, and changes only those.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct DnsAdvertise {
    /// `host:port` of the server (its TCP port: updates go over TCP), e.g. `ns1.example.com:53`.
    pub server: String,
    /// The zones the records go in (`example.com`); a host goes in the longest zone that
    /// contains it, and a host in none is reported, not published.
    #[schemars(length(min = 1, max = 16))]
    pub zones: Vec<String>,
    /// The name of the TSIG key, as the server's configuration names it.
    pub tsig_key_name: String,
    /// The Secret (in the operator's namespace) holding the key's secret, base64 as
    /// `tsig-keygen` and `keymgr` print it.
    pub tsig_secret_ref: TsigSecretRef,
    /// The key's algorithm.
    #[serde(default)]
    pub algorithm: TsigAlgorithm,
    /// TTL of the records: how long resolvers may keep sending clients to HTTP/3 after a
    /// host stops being served.
    #[serde(default = "default_ttl")]
    #[schemars(range(min = bounds::DNS_TTL_SECONDS.min, max = bounds::DNS_TTL_SECONDS.max))]
    pub ttl_seconds: u32,
}

/// A key of a Secret in the operator's namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub struct TsigSecretRef {
    pub name: String,
    /// The data key holding the secret.
    pub key: String,
}

/// TSIG algorithms (RFC 8945); HMAC-SHA256 is what `tsig-keygen` and `keymgr` make.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TsigAlgorithm {
    #[default]
    #[serde(rename = "hmac-sha256")]
    HmacSha256,
    #[serde(rename = "hmac-sha384")]
    HmacSha384,
    #[serde(rename = "hmac-sha512")]
    HmacSha512,
}

impl TsigAlgorithm {
    pub fn as_str(self) -> &'static str {
        match self {
            TsigAlgorithm::HmacSha256 => "hmac-sha256",
            TsigAlgorithm::HmacSha384 => "hmac-sha384",
            TsigAlgorithm::HmacSha512 => "hmac-sha512",
        }
    }
}

/// Hosts `status.advertise.dns` names in each of its lists; the rest are counted.
pub const MAX_ADVERTISE_HOSTS: usize = 20;

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AdvertiseStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsAdvertiseStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_svc: Option<AltSvcAdvertiseStatus>,
}

/// What the TCP ingress is made to send. Counts, and at most [`MAX_ADVERTISE_HOSTS`] names
/// per list.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AltSvcAdvertiseStatus {
    /// Ingresses whose Middleware sends `Alt-Svc: h3` (all their hosts served).
    pub advertised: i64,
    /// Ingresses whose Middleware sends `Alt-Svc: clear` (some host of theirs not served).
    pub withdrawn: i64,
    /// `namespace/name: reference` of Ingresses whose own `router.middlewares` does not list
    /// the operator's Middleware: add the reference to the list.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub needs_reference: Vec<String>,
    /// Served hosts whose TCP ingress the operator cannot make send the header (HTTPRoutes,
    /// Ingresses of other controllers): their host status keeps the recipe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmanaged: Vec<String>,
    /// Names the two lists leave out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub omitted: i64,
    /// The last error applying the Middlewares or Ingresses, retried on the next reconcile.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// What the operator keeps in the zones for this listener. Its size does not grow with the
/// hosts: counts, and at most [`MAX_ADVERTISE_HOSTS`] names per list.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DnsAdvertiseStatus {
    /// The server updates go to.
    pub server: String,
    pub zones: Vec<String>,
    /// Served hosts whose HTTPS record is in their zone.
    pub published: i64,
    /// Hosts left alone because their zone holds a record the operator did not make.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    /// Served hosts in none of the zones.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_zones: Vec<String>,
    /// Conflicting and outside hosts the two lists leave out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hosts_omitted: i64,
    /// When the zones last took a change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_update_time: Option<Time>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}
