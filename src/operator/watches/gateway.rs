//! The operator's watches of the Gateway API kinds it reads (Gateway, HTTPRoute,
//! ReferenceGrant), kept in caches that host resolution ([`crate::operator::hosts::gateway`])
//! reads. The Gateway API is optional ([`super::optional`]): without its CRDs (or RBAC to read
//! them) the kinds count as empty, so Ingresses keep working.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kube::api::Api;
use kube::runtime::reflector::Store;
use kube::{Client, Resource};
use tokio::task::JoinHandle;

use super::filter::LAST_APPLIED;
use super::optional::{follow, Flags, Kind};
use crate::api::gateway::{Gateway, HTTPRoute, ReferenceGrant};
use crate::operator::hosts::GatewayObjects;

/// What changed, so a consumer can tell which of its listeners it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GatewayChange {
    /// A Gateway (`namespace/name`) of a class.
    Gateway { key: String, class: String },
    /// An HTTPRoute (`namespace/name`) and the Gateways (`namespace/name`) it names.
    Route { key: String, parents: Vec<String> },
    /// A ReferenceGrant (it may permit any Gateway's certificate).
    Grant,
    /// A kind was listed for the first time, or found not served.
    Synced,
}

/// Called whenever a watched object changes in a way the host resolution reads.
pub type OnChange = Arc<dyn Fn(GatewayChange) + Send + Sync>;

fn key_of(m: &kube::api::ObjectMeta) -> String {
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

/// A Gateway's change.
pub fn gateway_change(g: &Gateway) -> GatewayChange {
    GatewayChange::Gateway {
        key: key_of(&g.metadata),
        class: g.spec.gateway_class_name.clone(),
    }
}

/// An HTTPRoute's change, with the Gateways it attaches to (a parentRef's namespace defaults
/// to the route's).
pub fn route_change(r: &HTTPRoute) -> GatewayChange {
    let ns = r.metadata.namespace.as_deref().unwrap_or_default();
    GatewayChange::Route {
        key: key_of(&r.metadata),
        parents: r
            .spec
            .parent_refs
            .iter()
            .map(|p| format!("{}/{}", p.namespace.as_deref().unwrap_or(ns), p.name))
            .collect(),
    }
}

fn grant_change(_: &ReferenceGrant) -> GatewayChange {
    GatewayChange::Grant
}

fn hash_of(v: &impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// What the resolution reads from a Gateway: its spec, annotations and reported addresses
/// (where its hosts are forwarded).
pub fn gateway_key(g: &Gateway) -> u64 {
    let addresses: Vec<&str> = g
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().map(|a| a.value.as_str()))
        .collect();
    hash_of(&(
        g.metadata.generation,
        &g.metadata.annotations,
        g.metadata.deletion_timestamp.is_some(),
        addresses,
    ))
}

/// What the resolution reads from an HTTPRoute: spec, annotations and which parents accepted
/// it (not the rest of its status, which gateway controllers rewrite often).
pub fn route_key(r: &HTTPRoute) -> u64 {
    let accepted: Vec<String> = r
        .status
        .as_ref()
        .map(|s| {
            s.parents
                .iter()
                .map(|p| {
                    let ok = p
                        .conditions
                        .iter()
                        .any(|c| c.type_ == "Accepted" && c.status == "True");
                    format!("{:?}={ok}", p.parent_ref)
                })
                .collect()
        })
        .unwrap_or_default();
    hash_of(&(
        r.metadata.generation,
        &r.metadata.annotations,
        r.metadata.deletion_timestamp.is_some(),
        accepted,
    ))
}

/// What the resolution reads from a ReferenceGrant: its spec.
pub fn grant_key(g: &ReferenceGrant) -> u64 {
    hash_of(&g.metadata.generation)
}

/// The three caches, their first-list flags and the tasks filling them.
pub struct GatewayApiWatch {
    pub gateways: Store<Gateway>,
    pub routes: Store<HTTPRoute>,
    pub grants: Store<ReferenceGrant>,
    flags: [Arc<Flags>; 3],
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for GatewayApiWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// What nothing reads from a cached Gateway API object: managed fields and the
/// last-applied-configuration annotation (the annotations themselves are read).
fn strip<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
    if let Some(a) = o.meta_mut().annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

const ABSENT: &str = "only Ingresses and spec.hosts are served";

impl GatewayApiWatch {
    /// Starts the three cluster-wide watches; `on_change` runs after every relevant change and
    /// once each kind is known (listed, or found not served).
    pub fn start(client: &Client, on_change: OnChange) -> Self {
        let flags: [Arc<Flags>; 3] = Default::default();
        let (gateways, g) = follow(
            Api::<Gateway>::all(client.clone()),
            Kind {
                what: "Gateway",
                absent_means: ABSENT,
                key: gateway_key,
                describe: gateway_change,
                synced: GatewayChange::Synced,
                strip: strip::<Gateway>,
            },
            flags[0].clone(),
            on_change.clone(),
        );
        let (routes, r) = follow(
            Api::<HTTPRoute>::all(client.clone()),
            Kind {
                what: "HTTPRoute",
                absent_means: ABSENT,
                key: route_key,
                describe: route_change,
                synced: GatewayChange::Synced,
                strip: strip::<HTTPRoute>,
            },
            flags[1].clone(),
            on_change.clone(),
        );
        let (grants, rg) = follow(
            Api::<ReferenceGrant>::all(client.clone()),
            Kind {
                what: "ReferenceGrant",
                absent_means: ABSENT,
                key: grant_key,
                describe: grant_change,
                synced: GatewayChange::Synced,
                strip: strip::<ReferenceGrant>,
            },
            flags[2].clone(),
            on_change,
        );
        Self {
            gateways,
            routes,
            grants,
            flags,
            tasks: vec![g, r, rg],
        }
    }

    /// Whether every kind has been listed once or found not served.
    pub fn synced(&self) -> bool {
        self.flags.iter().all(|f| f.synced.load(Ordering::Acquire))
    }

    /// The objects seen so far.
    pub fn objects(&self) -> GatewayObjects {
        GatewayObjects {
            gateways: self.gateways.state(),
            routes: self.routes.state(),
            grants: self.grants.state(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_status_counts_only_for_acceptance() {
        let mut r: HTTPRoute = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "apps", "generation": 1},
            "spec": {"parentRefs": [{"name": "gw"}]},
            "status": {"parents": [{"parentRef": {"name": "gw"}, "controllerName": "x",
                "conditions": [{"type": "Accepted", "status": "True", "reason": "Accepted",
                    "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]}
        }))
        .unwrap();
        let before = route_key(&r);
        let cond = &mut r.status.as_mut().unwrap().parents[0].conditions[0];
        cond.message = "rewritten".into();
        assert_eq!(route_key(&r), before, "a rewritten message does not count");
        r.status.as_mut().unwrap().parents[0].conditions[0].status = "False".into();
        assert_ne!(route_key(&r), before, "losing acceptance counts");
    }
}
