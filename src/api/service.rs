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

/// Default `spec.rollout.maxSurge`: a new pod starts beside the old one on a tenth of the
/// nodes at a time (at least one; the DaemonSet controller rounds up). Both share the UDP
/// port (SO_REUSEPORT) and the old one keeps its connections until they end, so a surge
/// costs nothing but the new pod's resources while both run.
pub const DEFAULT_MAX_SURGE: &str = "10%";

fn default_max_surge() -> IntOrString {
    IntOrString::String(DEFAULT_MAX_SURGE.to_string())
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(0)
}

/// How a change that needs new sockets replaces the data plane pods.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "type(self.maxSurge) == int ? self.maxSurge >= 0 : self.maxSurge.matches('^(100|[1-9]?[0-9])%$')",
        "message": "rollout.maxSurge must be a number of pods >= 0 or a percentage from 0% to 100%"
    },
    {
        "rule": "type(self.maxUnavailable) == int ? self.maxUnavailable >= 0 : self.maxUnavailable.matches('^(100|[1-9]?[0-9])%$')",
        "message": "rollout.maxUnavailable must be a number of pods >= 0 or a percentage from 0% to 100%"
    },
    {
        "rule": "!((type(self.maxSurge) == int ? self.maxSurge == 0 : self.maxSurge == '0%') && (type(self.maxUnavailable) == int ? self.maxUnavailable == 0 : self.maxUnavailable == '0%'))",
        "message": "rollout.maxSurge and rollout.maxUnavailable cannot both be 0"
    }
]))]
pub struct Rollout {
    /// Nodes where a new pod starts beside the old one at once: a number or a percentage of
    /// the nodes (`10%`, the default). The new pod takes the new connections when it is
    /// ready; the old one drains and is deleted. 0 replaces pods without surging (what a
    /// roll from h3-ingress 0.1.0, whose sockets cannot be shared, needs once).
    #[serde(default = "default_max_surge")]
    pub max_surge: IntOrString,
    /// Pods stopped before their replacement is ready, at once: a number or a percentage
    /// (0, the default: nodes keep serving throughout a roll).
    #[serde(default = "default_max_unavailable")]
    pub max_unavailable: IntOrString,
}

impl Default for Rollout {
    fn default() -> Self {
        Self {
            max_surge: default_max_surge(),
            max_unavailable: default_max_unavailable(),
        }
    }
}

/// Whether a count or percentage is zero.
fn is_zero(v: &IntOrString) -> bool {
    match v {
        IntOrString::Int(n) => *n == 0,
        IntOrString::String(s) => s == "0%",
    }
}

/// Why one rollout field is not usable (`field` names it).
fn check_count(field: &str, v: &IntOrString) -> Result<(), String> {
    let ok = match v {
        IntOrString::Int(n) => *n >= 0,
        IntOrString::String(s) => s
            .strip_suffix('%')
            .and_then(|n| n.parse::<u8>().ok())
            .is_some_and(|n| n <= 100 && (n.to_string().len() + 1 == s.len())),
    };
    if ok {
        return Ok(());
    }
    let shown = match v {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => format!("{s:?}"),
    };
    Err(format!(
        "rollout.{field}: {shown} is not a number of pods >= 0 or a percentage from 0% to 100%"
    ))
}

/// Why `rollout.maxUnavailable` is not usable; the CRD's CEL rule refuses the same values.
pub fn check_max_unavailable(v: &IntOrString) -> Result<(), String> {
    check_count("maxUnavailable", v)
}

/// Why `spec.rollout` is not usable: each field, and both at 0 (the CRD's CEL rules refuse
/// the same).
pub fn check_rollout(r: &Rollout) -> Result<(), String> {
    check_count("maxSurge", &r.max_surge)?;
    check_max_unavailable(&r.max_unavailable)?;
    if is_zero(&r.max_surge) && is_zero(&r.max_unavailable) {
        return Err("rollout.maxSurge and rollout.maxUnavailable cannot both be 0".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rollout(surge: IntOrString, unavailable: IntOrString) -> Rollout {
        Rollout {
            max_surge: surge,
            max_unavailable: unavailable,
        }
    }

    #[test]
    fn rollout_fields_accept_counts_and_percentages_but_not_both_zero() {
        let s = |v: &str| IntOrString::String(v.into());
        for (surge, unavailable) in [
            (s("10%"), IntOrString::Int(0)),
            (IntOrString::Int(1), IntOrString::Int(0)),
            (IntOrString::Int(0), s("10%")),
            (s("0%"), IntOrString::Int(1)),
            (s("100%"), s("100%")),
            (IntOrString::Int(25), s("1%")),
        ] {
            let r = rollout(surge, unavailable);
            assert_eq!(check_rollout(&r), Ok(()), "{r:?}");
        }
        for (surge, unavailable, field) in [
            (IntOrString::Int(-1), IntOrString::Int(0), "maxSurge"),
            (s("05%"), IntOrString::Int(0), "maxSurge"),
            (s("101%"), IntOrString::Int(0), "maxSurge"),
            (s("10"), IntOrString::Int(0), "maxSurge"),
            (s("1"), IntOrString::Int(1), "maxSurge"),
            (IntOrString::Int(1), s("ten%"), "maxUnavailable"),
            (IntOrString::Int(1), IntOrString::Int(-3), "maxUnavailable"),
        ] {
            let e = check_rollout(&rollout(surge, unavailable)).unwrap_err();
            assert!(e.starts_with(&format!("rollout.{field}: ")), "{e}");
        }
        for (surge, unavailable) in [
            (IntOrString::Int(0), IntOrString::Int(0)),
            (s("0%"), IntOrString::Int(0)),
            (IntOrString::Int(0), s("0%")),
        ] {
            let e = check_rollout(&rollout(surge, unavailable)).unwrap_err();
            assert!(e.contains("cannot both be 0"), "{e}");
        }
    }

    #[test]
    fn defaults_are_a_local_load_balancer_and_a_ten_percent_surge() {
        let s: ListenerService = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(s, ListenerService::default());
        assert_eq!(s.type_, ServiceType::LoadBalancer);
        assert_eq!(s.external_traffic_policy, TrafficPolicy::Local);
        let r: Rollout = serde_json::from_value(serde_json::json!({})).unwrap();
        assert_eq!(r.max_surge, IntOrString::String("10%".into()));
        assert_eq!(r.max_unavailable, IntOrString::Int(0));
        assert_eq!(r, Rollout::default());
        let ip: ListenerService =
            serde_json::from_value(serde_json::json!({"loadBalancerIP": "192.0.2.10"})).unwrap();
        assert_eq!(ip.load_balancer_ip.as_deref(), Some("192.0.2.10"));
    }
}
