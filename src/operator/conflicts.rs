//! Host ports two listeners cannot share on a node. Every data plane pod holds its UDP port and
//! its metrics port on the node (hostNetwork, hostPort); a second listener with the same port on
//! the same nodes would leave its pods Pending ("0 of N ready") or, worse, take nodes from the
//! first one. The operator admits listeners oldest first and refuses the later one of a clash
//! with `Ready=False`, reason `PortConflict`. Pure.
//!
//! "The same nodes" is decided conservatively from the node selectors alone: two listeners may
//! share a node unless one label key is selected with different values by both. Tolerations
//! only widen where a pod may go, so they never prove two listeners apart.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;

use super::resources::{node_selector, validate};
use crate::api::Http3Listener;

/// One port a data plane pod holds on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostPort {
    pub protocol: &'static str,
    pub port: u16,
    /// The spec field the port comes from, as the message names it.
    pub field: &'static str,
}

/// The later listener of a clash, told why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Name of the listener that keeps the port.
    pub other: String,
    pub port: HostPort,
}

impl Conflict {
    pub fn message(&self) -> String {
        format!(
            "{} port {} ({}) is already held by Http3Listener {:?}, created earlier, whose pods \
             can run on the same nodes (no node label is selected with different values by \
             both); this listener's DaemonSet is not applied until it gets another port or a \
             node selector that keeps the two apart",
            self.port.protocol, self.port.port, self.port.field, self.other
        )
    }
}

/// The ports a listener's pods hold on their nodes; `None` when its spec is invalid (it runs
/// nothing, so it claims nothing).
pub fn host_ports(l: &Http3Listener) -> Option<Vec<HostPort>> {
    let c = validate(l).ok()?;
    Some(vec![
        HostPort {
            protocol: "UDP",
            port: c.listen.port,
            field: "spec.port",
        },
        HostPort {
            protocol: "TCP",
            port: c.metrics_address.port(),
            field: "spec.metrics.address",
        },
    ])
}

/// Whether two node selectors can both match one node: always, unless some key is required
/// with different values by both.
pub fn may_share_nodes(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k).is_none_or(|w| w == v))
}

fn age_key(l: &Http3Listener) -> (Option<i64>, String) {
    (
        l.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_duration().as_nanos() as i64),
        l.name_any(),
    )
}

/// Admits the listeners oldest first (by creation time, then name) and returns the clash that
/// keeps `me` out, if any. A listener refused this way claims no port, so a third one is
/// compared only with the listeners that really run. `me` replaces its own (possibly older)
/// copy in `all`.
pub fn port_conflict(me: &Http3Listener, all: &[Arc<Http3Listener>]) -> Option<Conflict> {
    let name = me.name_any();
    let mut sorted: Vec<&Http3Listener> = all
        .iter()
        .map(|l| l.as_ref())
        .filter(|l| l.name_any() != name)
        .chain(std::iter::once(me))
        .filter(|l| l.metadata.deletion_timestamp.is_none())
        .collect();
    sorted.sort_by_key(|l| age_key(l));

    let mut admitted: Vec<(&Http3Listener, BTreeMap<String, String>, Vec<HostPort>)> = Vec::new();
    for l in sorted {
        let Some(ports) = host_ports(l) else { continue };
        let selector = node_selector(l);
        let clash = admitted.iter().find_map(|(other, other_sel, other_ports)| {
            if !may_share_nodes(&selector, other_sel) {
                return None;
            }
            ports
                .iter()
                .find(|p| {
                    other_ports
                        .iter()
                        .any(|o| o.protocol == p.protocol && o.port == p.port)
                })
                .map(|p| Conflict {
                    other: other.name_any(),
                    port: *p,
                })
        });
        if l.name_any() == name {
            return clash;
        }
        if clash.is_none() {
            admitted.push((l, selector, ports));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::resources::tests::listener;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn at(name: &str, created: i64, spec: serde_json::Value) -> Arc<Http3Listener> {
        let mut l = listener(name, spec);
        l.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        Arc::new(l)
    }

    fn spec(port: u16, metrics: &str, selector: serde_json::Value) -> serde_json::Value {
        serde_json::json!({
            "port": port,
            "upstream": {"address": "ingress:443"},
            "metrics": {"address": metrics},
            "nodeSelector": selector,
        })
    }

    #[test]
    fn selectors_overlap_unless_a_shared_key_differs() {
        let m =
            |v: serde_json::Value| serde_json::from_value::<BTreeMap<String, String>>(v).unwrap();
        let pool_a = m(serde_json::json!({"pool": "a"}));
        let pool_b = m(serde_json::json!({"pool": "b"}));
        let edge = m(serde_json::json!({"edge": "true"}));
        assert!(!may_share_nodes(&pool_a, &pool_b));
        assert!(
            may_share_nodes(&pool_a, &edge),
            "different keys can match one node"
        );
        assert!(may_share_nodes(&pool_a, &BTreeMap::new()));
        assert!(may_share_nodes(&pool_a, &pool_a));
    }

    #[test]
    fn the_later_listener_loses_and_names_the_earlier_one_and_the_port() {
        let any = serde_json::json!({});
        let first = at("first", 100, spec(443, "0.0.0.0:9476", any.clone()));
        // Other UDP port, same metrics port: clashes on TCP 9476.
        let second = at("second", 200, spec(8443, "0.0.0.0:9476", any.clone()));
        let all = vec![first.clone(), second.clone()];
        assert_eq!(port_conflict(&first, &all), None);
        let c = port_conflict(&second, &all).unwrap();
        assert_eq!(c.other, "first");
        assert_eq!((c.port.protocol, c.port.port), ("TCP", 9476));
        assert!(
            c.message().contains(
                "TCP port 9476 (spec.metrics.address) is already held by Http3Listener \"first\""
            ),
            "{}",
            c.message()
        );

        // Same UDP port, other metrics port.
        let third = at("third", 300, spec(443, "0.0.0.0:9477", any.clone()));
        let c = port_conflict(&third, &[first.clone(), third.clone()]).unwrap();
        assert_eq!(
            (c.port.protocol, c.port.port, c.port.field),
            ("UDP", 443, "spec.port")
        );

        // Disjoint node pools share every port.
        let a = at(
            "a",
            100,
            spec(443, "0.0.0.0:9476", serde_json::json!({"pool": "a"})),
        );
        let b = at(
            "b",
            200,
            spec(443, "0.0.0.0:9476", serde_json::json!({"pool": "b"})),
        );
        assert_eq!(port_conflict(&b, &[a, b.clone()]), None);
    }

    #[test]
    fn ties_go_by_name_refused_and_invalid_listeners_claim_nothing_and_deleted_ones_free_ports() {
        let any = serde_json::json!({});
        let x = at("x", 100, spec(443, "0.0.0.0:9476", any.clone()));
        let y = at("y", 100, spec(443, "0.0.0.0:9477", any.clone()));
        // y loses to x on UDP 443 (same age, x sorts first); z only clashes with y on 9477,
        // and y does not run, so z is admitted.
        let z = at("z", 300, spec(8443, "0.0.0.0:9477", any.clone()));
        let all = vec![z.clone(), y.clone(), x.clone()];
        assert_eq!(port_conflict(&y, &all).unwrap().other, "x");
        assert_eq!(port_conflict(&z, &all), None);

        let mut broken = spec(443, "0.0.0.0:9476", any.clone());
        broken["upstream"]["address"] = "no-port".into();
        let invalid = at("invalid", 1, broken);
        let late = at("late", 500, spec(443, "0.0.0.0:9476", any.clone()));
        assert_eq!(port_conflict(&late, &[invalid, late.clone()]), None);

        let mut gone = (*x).clone();
        gone.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(900).unwrap()));
        assert_eq!(port_conflict(&y, &[Arc::new(gone), y.clone()]), None);
    }

    #[test]
    fn the_fresh_copy_of_the_listener_wins_over_the_cached_one() {
        let any = serde_json::json!({});
        let first = at("first", 100, spec(443, "0.0.0.0:9476", any.clone()));
        let cached = at("second", 200, spec(443, "0.0.0.0:9477", any.clone()));
        // The user just moved "second" to another port; the store still has the old spec.
        let moved = at("second", 200, spec(8443, "0.0.0.0:9477", any));
        assert_eq!(port_conflict(&moved, &[first, cached]), None);
    }
}
