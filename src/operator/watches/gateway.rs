//! The operator's watches of the Gateway API kinds it reads (Gateway, HTTPRoute,
//! ReferenceGrant), kept in caches that host resolution ([`crate::operator::hosts::gateway`])
//! reads.
//!
//! The Gateway API is optional: on a cluster without its CRDs (or where RBAC does not let us
//! read them) the kinds count as empty, so Ingresses keep working, and this is logged once per
//! kind. The watches keep retrying with kube's backoff (at most 30 s apart), so CRDs installed
//! later are picked up without a restart.
//!
//! kube's backoff starts over after every successful item, and a watcher announces each new
//! list attempt with an `Init` event before the list fails, so on a 404 the default backoff
//! would retry about once a second forever (three kinds, every data plane pod). The watches
//! here keep `Init` away from the backoff, so it grows to its 30 s ceiling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::info;

use super::filter::{ChangeFilter, LAST_APPLIED};
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

/// Whether a watch error means the kind is not served to us at all: no CRD (404) or no RBAC
/// grant (403). Anything else is a passing API server problem.
pub fn is_unavailable(e: &watcher::Error) -> bool {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.as_ref(),
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return false,
    };
    matches!(status.code, 403 | 404) || status.is_not_found() || status.is_forbidden()
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
    synced: [Arc<AtomicBool>; 3],
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for GatewayApiWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl GatewayApiWatch {
    /// Starts the three cluster-wide watches; `on_change` runs after every relevant change and
    /// once each kind is known (listed, or found not served).
    pub fn start(client: &Client, on_change: OnChange) -> Self {
        let synced: [Arc<AtomicBool>; 3] = Default::default();
        let (gateways, g) = follow(
            Api::<Gateway>::all(client.clone()),
            (gateway_key, gateway_change),
            "Gateway",
            synced[0].clone(),
            on_change.clone(),
        );
        let (routes, r) = follow(
            Api::<HTTPRoute>::all(client.clone()),
            (route_key, route_change),
            "HTTPRoute",
            synced[1].clone(),
            on_change.clone(),
        );
        let (grants, rg) = follow(
            Api::<ReferenceGrant>::all(client.clone()),
            (grant_key, grant_change),
            "ReferenceGrant",
            synced[2].clone(),
            on_change,
        );
        Self {
            gateways,
            routes,
            grants,
            synced,
            tasks: vec![g, r, rg],
        }
    }

    /// Whether every kind has been listed once or found not served.
    pub fn synced(&self) -> bool {
        self.synced.iter().all(|f| f.load(Ordering::Acquire))
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

/// What [`follow`] compares (a hash of what the resolution reads) and reports of an object.
type Describe<K> = (fn(&K) -> u64, fn(&K) -> GatewayChange);

/// A reflector for one kind whose changes (per `key`) call `on_change` with what `describe`
/// says of the object; a kind that is not served counts as synced and empty, logged once
/// until it becomes available. Cached objects lose their managed fields and
/// last-applied-configuration annotation, which nothing here reads.
fn follow<K>(
    api: Api<K>,
    (key, describe): Describe<K>,
    what: &'static str,
    synced: Arc<AtomicBool>,
    on_change: OnChange,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store::<K>();
    let events = watcher(api, watcher::Config::default().any_semantic()).map(|ev| {
        ev.map(|e| {
            e.modify(|o| {
                o.meta_mut().managed_fields = None;
                if let Some(a) = o.meta_mut().annotations.as_mut() {
                    a.remove(LAST_APPLIED);
                }
            })
        })
    });
    let stream = reflector::reflector(writer, events)
        .filter(|ev| futures_util::future::ready(!matches!(ev, Ok(watcher::Event::Init))))
        .backoff(watcher::DefaultBackoff::default());
    let task = tokio::spawn(async move {
        let mut stream = Box::pin(stream);
        let mut filter = ChangeFilter::new(key);
        let mut unavailable = false;
        let log = super::filter::ErrorLog::default();
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    let done = matches!(ev, watcher::Event::InitDone);
                    if done && std::mem::take(&mut unavailable) {
                        info!(kind = what, "Gateway API kind is served now; reading it");
                    }
                    if let Some(o) = filter.accept(ev) {
                        on_change(describe(&o));
                    }
                    if done {
                        synced.store(true, Ordering::Release);
                        on_change(GatewayChange::Synced);
                    }
                }
                Err(e) if is_unavailable(&e) => {
                    if !unavailable {
                        info!(kind = what, error = %e,
                            "Gateway API kind not served (CRDs not installed, or no RBAC to read it): \
                             only Ingresses and spec.hosts are served; retrying in the background");
                        unavailable = true;
                    }
                    if !synced.swap(true, Ordering::AcqRel) {
                        on_change(GatewayChange::Synced);
                    }
                }
                Err(e) => log.warn(what, &e),
            }
        }
    });
    (store, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn missing_crds_and_rbac_mean_unavailable_other_errors_do_not() {
        assert!(is_unavailable(&watcher::Error::InitialListFailed(api(404))));
        assert!(is_unavailable(&watcher::Error::InitialListFailed(api(403))));
        assert!(is_unavailable(&watcher::Error::WatchStartFailed(api(404))));
        assert!(!is_unavailable(&watcher::Error::InitialListFailed(api(
            500
        ))));
        assert!(!is_unavailable(&watcher::Error::WatchError(Box::new(
            Status {
                code: 410,
                ..Default::default()
            }
        ))));
        assert!(!is_unavailable(&watcher::Error::NoResourceVersion));
    }

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
