//! `spec.service` and `spec.rollout` of the `Http3Listener`: how UDP reaches the data plane from
//! outside the nodes, and how fast a change rolls over the nodes. Kubernetes-only settings, so
//! they are not part of [`super::settings`] (the standalone file has no use for them).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kind of the per-listener Service.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ServiceType {
    /// A cloud or MetalLB load balancer with a UDP port (and TCP too with `includeTcp`).
    #[default]
    LoadBalancer,
    /// A port on every node, for an external UDP load balancer that forwards to the nodes.
    NodePort,
}

impl ServiceType {
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::LoadBalancer => "LoadBalancer",
            ServiceType::NodePort => "NodePort",
        }
    }
}

/// Which nodes a load balancer may send a datagram to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TrafficPolicy {
    /// Only to nodes with a ready data plane pod, keeping the client's address (the data
    /// plane sees real clients and no datagram crosses a second node).
    #[default]
    Local,
    /// Any node, which forwards (and SNATs) to a ready pod. MetalLB shares an IP between two
    /// Services only when both use `Cluster` (or select the very same pods).
    Cluster,
}

impl TrafficPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficPolicy::Local => "Local",
            TrafficPolicy::Cluster => "Cluster",
        }
    }
}

/// IP families of the Service (`spec.ipFamilyPolicy` of a Kubernetes Service).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpFamilyPolicy {
    SingleStack,
    PreferDualStack,
    RequireDualStack,
}

impl IpFamilyPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            IpFamilyPolicy::SingleStack => "SingleStack",
            IpFamilyPolicy::PreferDualStack => "PreferDualStack",
            IpFamilyPolicy::RequireDualStack => "RequireDualStack",
        }
    }
}

fn default_true() -> bool {
    true
}

/// A Service in front of the listener's data plane pods, owned by the listener (removed with
/// it, or when this field is removed). Its UDP port is `spec.port`, so the `Alt-Svc: h3=":PORT"`
/// the data plane advertises names the port clients reach through it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.type == 'LoadBalancer' || (!has(self.loadBalancerClass) && !has(self.loadBalancerIP))",
    "message": "service.loadBalancerClass and service.loadBalancerIP need service.type: LoadBalancer"
}]))]
pub struct ListenerService {
    /// `LoadBalancer` (default) or `NodePort`.
    #[serde(rename = "type", default)]
    pub type_: ServiceType,
    /// `Local` (default) or `Cluster`.
    #[serde(default)]
    pub external_traffic_policy: TrafficPolicy,
    /// Copied onto the Service, e.g. `metallb.universe.tf/allow-shared-ip` or a cloud's load
    /// balancer annotations (to share the TCP ingress's IP or pick a UDP-capable balancer).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// `spec.loadBalancerClass` of the Service (LoadBalancer only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_class: Option<String>,
    /// `spec.loadBalancerIP` of the Service (LoadBalancer only; deprecated by Kubernetes but
    /// still how some clouds pick a reserved address; MetalLB prefers its annotation).
    #[serde(
        default,
        rename = "loadBalancerIP",
        skip_serializing_if = "Option::is_none"
    )]
    pub load_balancer_ip: Option<String>,
    /// Fixed node port of the UDP port; the cluster picks one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub node_port: Option<u16>,
    /// Also forward TCP `spec.port` to the same nodes: one mixed-protocol load balancer for
    /// both, when the TCP ingress listens on the nodes' own port (hostNetwork) on these nodes.
    #[serde(default)]
    pub include_tcp: bool,
    /// `SingleStack`, `PreferDualStack` or `RequireDualStack`; the cluster's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_family_policy: Option<IpFamilyPolicy>,
    /// `spec.allocateLoadBalancerNodePorts`; some load balancers (MetalLB in L2 mode, cloud
    /// balancers that route to pod IPs) do not need node ports.
    #[serde(default = "default_true")]
    pub allocate_load_balancer_node_ports: bool,
}

impl Default for ListenerService {
    fn default() -> Self {
        Self {
            type_: ServiceType::default(),
            external_traffic_policy: TrafficPolicy::default(),
            annotations: BTreeMap::new(),
            load_balancer_class: None,
            load_balancer_ip: None,
            node_port: None,
            include_tcp: false,
            ip_family_policy: None,
            allocate_load_balancer_node_ports: true,
        }
    }
}

/// Default `spec.rollout.maxUnavailable`: a tenth of the nodes at a time (at least one; the
/// DaemonSet controller rounds up). A node whose pod restarts loses HTTP/3 for a few seconds
/// and its clients fall back to TCP, so a 100-node pool rolls in ten steps, not a hundred.
pub const DEFAULT_MAX_UNAVAILABLE: &str = "10%";

fn default_max_unavailable() -> IntOrString {
    IntOrString::String(DEFAULT_MAX_UNAVAILABLE.to_string())
}

/// How a change that needs new sockets replaces the data plane pods.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "type(self.maxUnavailable) == int ? self.maxUnavailable >= 1 : self.maxUnavailable.matches('^(100|[1-9][0-9]?)%$')",
    "message": "rollout.maxUnavailable must be a number of pods >= 1 or a percentage from 1% to 100%"
}]))]
pub struct Rollout {
    /// Pods replaced at once: a number (at least 1) or a percentage of the nodes (`10%`, the
    /// default). Pods never surge: two pods of one listener cannot share a node's UDP port.
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: IntOrString,
}

impl Default for Rollout {
    fn default() -> Self {
        Self {
            max_unavailable: default_max_unavailable(),
        }
    }
}

/// Why `rollout.maxUnavailable` is not usable; the CRD's CEL rule refuses the same values.
pub fn check_max_unavailable(v: &IntOrString) -> Result<(), String> {
    let ok = match v {
        IntOrString::Int(n) => *n >= 1,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|n| n.parse::<u8>().ok())
            .is_some_and(|n| (1..=100).contains(&n) && !s.starts_with('0')),
    };
    if ok {
        Ok(())
    } else {
        let shown = match v {
            IntOrString::Int(n) => n.to_string(),
            IntOrString::String(s) => format!("{s:?}"),
        };
        Err(format!(
            "rollout.maxUnavailable: {shown} is not a number of pods >= 1 or a percentage from 1% to 100%"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unavailable_accepts_counts_and_percentages_only() {
        for good in [
            IntOrString::Int(1),
            IntOrString::Int(25),
            IntOrString::String("1%".into()),
            IntOrString::String("10%".into()),
            IntOrString::String("100%".into()),
        ] {
            assert_eq!(check_max_unavailable(&good), Ok(()), "{good:?}");
        }
        for bad in [
            IntOrString::Int(0),
            IntOrString::Int(-1),
            IntOrString::String("0%".into()),
            IntOrString::String("05%".into()),
            IntOrString::String("101%".into()),
            IntOrString::String("10".into()),
            IntOrString::String("ten%".into()),
        ] {
            let e = check_max_unavailable(&bad).unwrap_err();
            assert!(e.starts_with("rollout.maxUnavailable: "), "{e}");
        }
    }

    #[test]
    fn defaults_are_a_local_load_balancer_and_ten_percent() {
        let s: ListenerService = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(s, ListenerService::default());
        assert_eq!(s.type_, ServiceType::LoadBalancer);
        assert_eq!(s.external_traffic_policy, TrafficPolicy::Local);
        let r: Rollout = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(r.max_unavailable, IntOrString::String("10%".into()));
        let ip: ListenerService =
            serde_json::from_value(serde_json::json!({"loadBalancerIP": "192.0.2.10"})).unwrap();
        assert_eq!(ip.load_balancer_ip.as_deref(), Some("192.0.2.10"));
    }
}
