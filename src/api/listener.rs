//! The `Http3Listener` custom resource (group `h3-ingress.dev`, version `v1alpha1`).

// kube's printcolumn(...) repeats `type_ = ...` per column, which clippy mistakes for a
// duplicated attribute.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::advertise::{AdvertiseSettings, AdvertiseStatus};
use super::origin::HostOrigin;
use super::service::{ListenerService, Rollout};
use super::settings::with_listener_settings;
use super::settings::{
    AccessLogSettings, AddressValidationSettings, AltSvcSettings, HttpSettings, LimitsSettings,
    MetricsSettings, SocketSettings, TransportSettings, Upstream,
};
use super::unknown::{collect_unknown_fields, UnknownFields, UnknownValues};
use super::{bounds, Addresses};

fn default_controller_name() -> String {
    super::DEFAULT_CONTROLLER_NAME.to_string()
}

fn default_port() -> u16 {
    super::settings::DEFAULT_PORT
}

with_listener_settings! {
    /// An HTTP/3 (QUIC) listener run by a hostNetwork DaemonSet in front of an existing TCP ingress.
    ///
    /// Cluster-scoped because it owns a UDP port on every selected node.
    #[derive(CustomResource, Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
    #[kube(
        group = "h3-ingress.dev",
        version = "v1alpha1",
        kind = "Http3Listener",
        shortname = "h3l",
        status = "Http3ListenerStatus",
        derive = "PartialEq",
        doc = "An HTTP/3 listener that proxies to the cluster's existing TCP ingress",
        printcolumn(name = "Port", type_ = "integer", json_path = ".spec.port"),
        printcolumn(
            name = "Hosts",
            type_ = "string",
            json_path = ".status.hostsSummary",
            description = "hosts served / hosts wanted"
        ),
        printcolumn(
            name = "Pods",
            type_ = "string",
            json_path = ".status.nodes.summary",
            description = "data plane pods ready / desired"
        ),
        printcolumn(
            name = "Ready",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Ready\")].status",
            description = "the Ready condition"
        ),
        printcolumn(
            name = "Reason",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
            priority = "1",
            description = "why Ready is what it is"
        ),
        printcolumn(
            name = "Controller",
            type_ = "string",
            json_path = ".spec.controllerName",
            priority = "1",
            description = "the operator that runs it (spec.controllerName)"
        ),
        printcolumn(
            name = "UDP-Drops",
            type_ = "integer",
            json_path = ".status.udp.drops",
            description = "UDP datagrams the kernel dropped on our sockets, summed over pods"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )]
    // `remote = "Self"`: the derived (de)serialisers become inherent functions, which
    // `collect_unknown_fields!` wraps to record the fields a newer CRD adds (`api::unknown`).
    #[serde(rename_all = "camelCase", remote = "Self")]
    // The API server checks this after defaulting, as `config::build` does for the file.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self.addressValidation.halfOpenThreshold < self.limits.halfOpenConnections",
        "message": "addressValidation.halfOpenThreshold must be below limits.halfOpenConnections"
    }]))]
    pub struct Http3ListenerSpec {
        /// The operator that runs this listener: the one started with this `--controller-name`
        /// (the chart's `controllerName`), as an IngressClass names its controller. An operator
        /// reconciles only its own listeners; a name no running operator has, or one that two
        /// operators have, is refused in the status (`Ready=False`, `NoController` or
        /// `ControllerConflict`). Changing it hands the listener over: the new operator starts its
        /// data plane, and the old one removes its own once the new one's pods are ready.
        #[serde(default = "default_controller_name")]
        #[schemars(regex(pattern = super::CONTROLLER_NAME_PATTERN), length(min = 3, max = 253))]
        pub controller_name: String,
        /// Ingresses of this class (with annotation `h3-ingress.dev/enabled: "true"`) are served.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub ingress_class_name: Option<String>,
        /// HTTPRoutes (annotated `h3-ingress.dev/enabled: "true"`) attached to Gateways of this
        /// class, and Gateways of this class annotated the same way, are served.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub gateway_class_name: Option<String>,
        /// Hosts not defined by an Ingress, each with its TLS Secret.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub hosts: Vec<ListenerHost>,
        /// Nodes that run the data plane (normally the ingress node pool).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        pub node_selector: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub tolerations: Vec<Toleration>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub resources: Option<ResourceRequirements>,
        /// Data plane image; defaults to the operator's own image.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub image: Option<String>,
        /// Run a privileged init container that raises net.core.rmem_max/wmem_max to 7500000
        /// on each node, so the requested socket buffers are granted. Off by default; status
        /// reports clamped buffers either way.
        #[serde(default)]
        pub tune_node_buffer_limits: bool,
        /// Image of the init container `tuneNodeBufferLimits` adds (it needs `sh`, `cat` and `[`);
        /// defaults to the operator's `--tune-image` (`busybox:1.36.1`). Pin it by digest
        /// (`busybox@sha256:...`) where tags may move.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub tune_image: Option<String>,
        /// A Service that brings UDP to the data plane from outside the nodes; none by default
        /// (clients reach the nodes' own addresses).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub service: Option<ListenerService>,
        #[serde(default)]
        pub rollout: Rollout,
        /// Where to forward the hosts of a Gateway (`gatewayClassName`) instead of the address its
        /// controller reports in `status.addresses` (the port is the Gateway listener's). A Gateway
        /// with neither gets `upstream.address`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pub gateway_upstreams: Vec<GatewayUpstream>,
        /// DNS HTTPS records for the served hosts, kept only while they are served; off when
        /// absent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pub advertise: Option<AdvertiseSettings>,
        /// Fields of the served object this binary does not know (never serialised).
        #[serde(skip)]
        #[schemars(skip)]
        pub unknown_fields: UnknownFields,
        /// Values of its enums this binary does not know, taken out while parsing (never
        /// serialised); validation refuses a spec that has any.
        #[serde(skip)]
        #[schemars(skip)]
        pub unknown_values: UnknownValues,
    }
}

/// The upstream of one Gateway's hosts.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayUpstream {
    pub namespace: String,
    pub name: String,
    /// `host:port` of the proxy that serves this Gateway.
    pub address: String,
}

collect_unknown_fields!(Http3ListenerSpec, values: spec_schema());

/// This binary's schema of the spec, as its CRD publishes it: where [`UnknownValues`] are
/// found.
fn spec_schema() -> &'static serde_json::Value {
    static SCHEMA: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    SCHEMA.get_or_init(|| {
        use kube::CustomResourceExt;
        let crd = Http3Listener::crd();
        let root = super::schema::schema_of(&crd).expect("the CRD has a schema");
        root["properties"]["spec"].clone()
    })
}

/// A host served with the certificate of a TLS Secret.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ListenerHost {
    pub name: String,
    pub secret_ref: SecretRef,
}

#[derive(
    Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", remote = "Self")]
pub struct Http3ListenerStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, `SocketsBound`, `BuffersApplied`, `Degraded` (see `api::conditions`), one
    /// per type (a map keyed by type, so server-side apply merges them by type).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// "serving/wanted", for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts_summary: Option<String>,
    /// Wanted hosts by state and reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["state", "reason"]))]
    pub host_counts: Vec<HostCount>,
    /// Hosts not served, in name order, at most `MAX_STATUS_HOSTS` of them (served hosts are
    /// counted, not listed: `kubectl h3-ingress status` shows every host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<HostStatus>,
    /// Hosts not served that `hosts` leaves out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hosts_omitted: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodesStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp: Option<UdpStatus>,
    /// When `udp.drops` was read from the pods. Counters alone are rewritten at most once a
    /// minute, so a busy listener does not write its status on every reconcile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters_time: Option<Time>,
    /// What `spec.advertise` keeps published, and where.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<AdvertiseStatus>,
    /// The one data-plane pod (by name) that probes the TCP ingress for each host's Alt-Svc
    /// and exports the per-host facts; the others leave it alone. The operator names a ready
    /// pod and keeps it while it stays ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_svc_prober: Option<String>,
    /// Fields of the served status this binary does not know (never serialised).
    #[serde(skip)]
    #[schemars(skip)]
    pub unknown_fields: UnknownFields,
}

collect_unknown_fields!(Http3ListenerStatus);

impl Http3Listener {
    /// Every field of this listener's spec and status that this binary does not know, as
    /// `spec.upstream.futureSetting`.
    pub fn unknown_fields(&self) -> Vec<String> {
        let spec = self.spec.unknown_fields.paths().iter();
        let status = self.status.iter().flat_map(|s| s.unknown_fields.paths());
        spec.map(|p| format!("spec.{p}"))
            .chain(status.map(|p| format!("status.{p}")))
            .collect()
    }

    /// The values of this listener's spec that this binary does not know (paths from the
    /// spec: `transport.congestionControl`).
    pub fn unknown_values(&self) -> &[super::unknown::UnknownValue] {
        self.spec.unknown_values.values()
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostStatus {
    pub name: String,
    /// The Ingress, or the HTTPRoute and Gateway listener, that asked for this host.
    #[serde(flatten)]
    pub origin: HostOrigin,
    /// `namespace/name` of the TLS Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// `Serving` or `NotServing`.
    pub state: String,
    /// Machine-readable reason (see `api::reasons`).
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Whether the TCP ingress answers this host with `Alt-Svc: h3=":PORT"`; unknown until probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_svc_advertised: Option<bool>,
    /// The DNS HTTPS record to publish so first visits can use HTTP/3 (RFC 9460).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dns_https_record: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodesStatus {
    pub desired: i32,
    pub ready: i32,
    /// "ready/desired", for `kubectl get`.
    pub summary: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UdpStatus {
    /// Datagrams dropped on the data plane's own sockets, summed over pods.
    pub drops: i64,
    /// Smallest effective SO_RCVBUF over pods and families.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_receive_buffer_bytes: Option<i64>,
    /// Whether any pod got less buffer than requested.
    #[serde(default)]
    pub clamped: bool,
}

/// How many wanted hosts are in one state for one reason.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostCount {
    pub state: String,
    pub reason: String,
    pub count: i64,
}

/// Not-served hosts listed in a listener's status; the rest are counted in `hostsOmitted`.
/// 50 entries of a few hundred bytes keep the object far below etcd's 1.5 MiB limit.
pub const MAX_STATUS_HOSTS: usize = 50;

fn is_zero(n: &i64) -> bool {
    *n == 0
}
