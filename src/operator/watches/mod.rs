//! The operator's watches and which of their events are worth a reconcile.
//!
//! A reconcile writes the listener's status and applies its objects; the watch events those
//! writes cause must not start another reconcile, or a listener under traffic reconciles
//! itself in a loop. So every trigger passes an object only when what the reconcile reads from
//! it changed ([`ChangeFilter`], with one key function per kind): the listener's spec
//! (`metadata.generation`), a DaemonSet's scheduling and readiness counts, an Ingress's spec
//! and annotations. Deletions always pass.
//!
//! The objects the operator prunes (Roles, RoleBindings, Services) are kept in metadata-only
//! caches ([`OwnedStores`]), so a reconcile lists nothing cluster-wide.

use std::sync::Arc;

use futures_util::{future, FutureExt, Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub mod filter;
pub mod gateway;

use super::labels;
use crate::api::Http3Listener;
pub use filter::{changes, hash_of, ChangeFilter};

/// What a reconcile reads from a listener: its spec, and whether it is being deleted. Status,
/// labels and annotations (and so every status write of ours) do not count.
pub fn listener_key(l: &Http3Listener) -> u64 {
    hash_of(&(
        l.metadata.generation,
        l.metadata.deletion_timestamp.is_some(),
    ))
}

/// What a reconcile reads from its DaemonSet: whether the spec was seen, and how many pods
/// are scheduled, ready, updated and unavailable. Heartbeat-like status rewrites do not count.
pub fn daemon_set_key(ds: &DaemonSet) -> u64 {
    let s = ds.status.as_ref();
    hash_of(&(
        ds.metadata.generation,
        s.and_then(|s| s.observed_generation),
        s.map(|s| {
            (
                s.desired_number_scheduled,
                s.current_number_scheduled,
                s.number_ready,
                s.number_misscheduled,
                s.updated_number_scheduled,
                s.number_unavailable,
            )
        }),
    ))
}

/// What a reconcile reads from an Ingress: its spec (`generation`) and its annotations (our
/// switch, the legacy class, the TCP ingress's own). Its status (load balancer addresses,
/// which the TCP ingress controller rewrites) does not count.
pub fn ingress_key(i: &Ingress) -> u64 {
    hash_of(&(
        i.metadata.generation,
        i.metadata.annotations.as_ref(),
        i.metadata.deletion_timestamp.is_some(),
    ))
}

/// What a reconcile reads from an IngressClass: whether it is the default (an annotation).
pub fn class_key(c: &IngressClass) -> u64 {
    hash_of(&c.metadata.annotations.as_ref())
}

/// Labels on every data plane object the operator makes, for its owned-object watches.
pub fn owned_selector() -> String {
    format!(
        "{}={},{}={}",
        labels::MANAGED_BY,
        labels::MANAGED_BY_VALUE,
        labels::COMPONENT,
        labels::COMPONENT_DATA_PLANE
    )
}

/// Listener spec changes and deletions, kept in `writer`'s store on the way. Each one also
/// sends on `any_changed`: another listener may now win or lose a port (see `conflicts`).
pub fn listener_changes(
    client: &Client,
    writer: reflector::store::Writer<Http3Listener>,
    any_changed: mpsc::UnboundedSender<()>,
) -> impl Stream<Item = Result<Http3Listener, watcher::Error>> + Send + 'static {
    let events = watcher(
        Api::<Http3Listener>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer);
    changes(events, listener_key).inspect(move |r| {
        if r.is_ok() {
            let _ = any_changed.send(());
        }
    })
}

/// The operator's DaemonSets (in its namespace), when their scheduling or readiness changes.
pub fn daemon_set_changes(
    client: &Client,
    namespace: &str,
    writer: reflector::store::Writer<DaemonSet>,
) -> impl Stream<Item = Result<DaemonSet, watcher::Error>> + Send + 'static {
    let events = watcher(
        Api::<DaemonSet>::namespaced(client.clone(), namespace),
        watcher::Config::default().labels(&owned_selector()),
    )
    .map_ok(|ev| ev.modify(strip))
    .default_backoff()
    .reflect(writer);
    changes(events, daemon_set_key)
}

/// The listeners that own a DaemonSet. `Controller::owns` cannot be used: it looks a
/// cluster-scoped owner up in the child's namespace, finds nothing, and never reconciles.
pub fn owning_listeners(ds: DaemonSet) -> Vec<ObjectRef<Http3Listener>> {
    let (api_version, kind) = (Http3Listener::api_version(&()), Http3Listener::kind(&()));
    ds.metadata
        .owner_references
        .unwrap_or_default()
        .into_iter()
        .filter(|o| o.api_version == api_version && o.kind == kind)
        .map(|o| ObjectRef::new(&o.name))
        .collect()
}

/// Drops what no reconcile reads from a cached object: managed fields and the
/// last-applied-configuration annotation (a whole copy of the object).
pub fn strip<K: Resource>(o: &mut K) {
    o.meta_mut().managed_fields = None;
    if let Some(a) = o.meta_mut().annotations.as_mut() {
        a.remove(filter::LAST_APPLIED);
    }
}

/// Fills the Ingress cache (stripped) and yields every Ingress whose spec or annotations
/// changed (a status rewrite by the TCP ingress controller is not a change). Which listeners
/// it concerns is the caller's decision.
pub fn ingress_changes(
    client: &Client,
    writer: reflector::store::Writer<Ingress>,
) -> impl Stream<Item = Ingress> + Send + 'static {
    let log = filter::ErrorLog::default();
    let events = watcher(
        Api::<Ingress>::all(client.clone()),
        watcher::Config::default().any_semantic(),
    )
    .map_ok(|ev| ev.modify(strip))
    .default_backoff()
    .reflect(writer);
    changes(events, ingress_key).filter_map(move |r| {
        future::ready(match r {
            Ok(ing) => Some(ing),
            Err(e) => {
                log.warn("Ingress", &e);
                None
            }
        })
    })
}

/// Fills the IngressClass cache and fires when a class is added, removed, or its annotations
/// (the default-class mark) change: Ingresses without a class may change hands.
pub fn class_trigger(
    client: &Client,
    writer: reflector::store::Writer<IngressClass>,
) -> impl Stream<Item = ()> + Send + 'static {
    let log = filter::ErrorLog::default();
    let events = watcher(
        Api::<IngressClass>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .reflect(writer);
    changes(events, class_key).filter_map(move |r| {
        if let Err(e) = &r {
            log.warn("IngressClass", e);
        }
        future::ready(r.is_ok().then_some(()))
    })
}

/// Fills the data plane pod cache (their names, nodes and IPs are all a reconcile reads).
pub fn pod_cache(client: &Client, namespace: &str) -> (Store<Pod>, JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let log = filter::ErrorLog::default();
    let events = watcher(
        Api::<Pod>::namespaced(client.clone(), namespace),
        watcher::Config::default().labels(&owned_selector()),
    )
    .map_ok(|ev| {
        ev.modify(|p| {
            strip(p);
            if let Some(spec) = p.spec.as_mut() {
                let node = spec.node_name.take();
                *spec = PodSpec {
                    node_name: node,
                    ..Default::default()
                };
            }
        })
    })
    .default_backoff()
    .reflect(writer);
    let task = tokio::spawn(async move {
        let mut events = Box::pin(events);
        while let Some(ev) = events.next().await {
            if let Err(e) = ev {
                log.warn("Pod", &e);
            }
        }
    });
    (store, task)
}

/// The objects the operator makes, cached by label-selected watches so a reconcile reads them
/// instead of asking: metadata only (what pruning and the applied-hash check need), except the
/// DaemonSets, whose status the listener's status reports. Roles and RoleBindings are watched
/// cluster-wide because earlier versions made one per namespace of a referenced Secret, which
/// pruning removes.
#[derive(Clone)]
pub struct OwnedStores {
    pub roles: Store<PartialObjectMeta<Role>>,
    pub role_bindings: Store<PartialObjectMeta<RoleBinding>>,
    pub services: Store<PartialObjectMeta<Service>>,
    pub service_accounts: Store<PartialObjectMeta<ServiceAccount>>,
    pub cluster_roles: Store<PartialObjectMeta<ClusterRole>>,
    pub cluster_role_bindings: Store<PartialObjectMeta<ClusterRoleBinding>>,
    /// The listeners' QUIC keys Secrets (the operator's namespace).
    pub keys: Store<PartialObjectMeta<Secret>>,
    /// The certificate mirrors (the hosts namespace).
    pub mirrors: Store<PartialObjectMeta<Secret>>,
    pub daemon_sets: Store<DaemonSet>,
}

/// Aborts the cache watches when the operator stops.
pub struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Fills `writer` from a label-selected watch of `api`, logging failures at most once per
/// cause and minute (a 403 or 404 repeats on every backoff step).
fn drive<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    log: Arc<filter::ErrorLog>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    let kind = K::kind(&()).into_owned();
    // Stripped like every other cache: the mirrors are written by server-side apply, so each
    // one's metadata carries a managedFields entry (a JSON tree of every label, annotation
    // and data key) that no reconcile reads. At 10,000 mirrors, with the Secret watch below
    // leaving their namespace out, the operator's live heap went from 143 to 89 MiB.
    let events = watcher(api, watcher::Config::default().labels(&owned_selector()))
        .map_ok(|ev| ev.modify(strip))
        .default_backoff()
        .reflect(writer);
    tokio::spawn(async move {
        let mut events = Box::pin(events);
        while let Some(ev) = events.next().await {
            if let Err(e) = ev {
                log.warn(&kind, &e);
            }
        }
    })
}

fn cache<K>(api: Api<K>, log: &Arc<filter::ErrorLog>) -> (Store<K>, JoinHandle<()>)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K: Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    (store, drive(api, writer, log.clone()))
}

impl OwnedStores {
    /// Starts the watches (the operator's namespace `namespace`, the mirrors' `hosts`); they
    /// stop when the returned [`Tasks`] is dropped. The DaemonSet store is filled by the
    /// controller's DaemonSet trigger ([`daemon_set_changes`]).
    pub fn start(
        client: &Client,
        namespace: &str,
        hosts: &str,
        daemon_sets: &Store<DaemonSet>,
    ) -> (Self, Tasks) {
        let c = || client.clone();
        let log = Arc::new(filter::ErrorLog::default());
        let (roles, t1) = cache(Api::<PartialObjectMeta<Role>>::all(c()), &log);
        let (role_bindings, t2) = cache(Api::<PartialObjectMeta<RoleBinding>>::all(c()), &log);
        let (services, t3) = cache(Api::namespaced(c(), namespace), &log);
        let (service_accounts, t4) = cache(Api::namespaced(c(), namespace), &log);
        let (cluster_roles, t5) = cache(Api::all(c()), &log);
        let (cluster_role_bindings, t6) = cache(Api::all(c()), &log);
        let (keys, t7) = cache(Api::namespaced(c(), namespace), &log);
        let (mirrors, t8) = cache(Api::namespaced(c(), hosts), &log);
        (
            Self {
                roles,
                role_bindings,
                services,
                service_accounts,
                cluster_roles,
                cluster_role_bindings,
                keys,
                mirrors,
                daemon_sets: daemon_sets.clone(),
            },
            Tasks(vec![t1, t2, t3, t4, t5, t6, t7, t8]),
        )
    }

    /// The caches that have not listed yet, by kind.
    pub fn pending(&self) -> Vec<&'static str> {
        let stores = [
            ("Role", listed(&self.roles)),
            ("RoleBinding", listed(&self.role_bindings)),
            ("Service", listed(&self.services)),
            ("ServiceAccount", listed(&self.service_accounts)),
            ("ClusterRole", listed(&self.cluster_roles)),
            ("ClusterRoleBinding", listed(&self.cluster_role_bindings)),
            ("Secret (keys)", listed(&self.keys)),
            ("Secret (mirrors)", listed(&self.mirrors)),
            ("DaemonSet", listed(&self.daemon_sets)),
        ];
        stores
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(n, _)| *n)
            .collect()
    }
}

/// Whether a cache has listed once (never waits).
pub fn listed<K>(store: &Store<K>) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|r| r.is_ok())
}

/// `(namespace, name)` of the cached objects made for `listener`.
pub fn owned_by<K>(store: &Store<PartialObjectMeta<K>>, listener: &str) -> Vec<(String, String)>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let mut out: Vec<(String, String)> = store
        .state()
        .iter()
        .filter(|o| {
            o.labels().get(labels::INSTANCE).map(String::as_str) == Some(listener)
                && o.metadata.deletion_timestamp.is_none()
        })
        .map(|o| (o.namespace().unwrap_or_default(), o.name_any()))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::DaemonSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn listener(generation: i64, status_hosts: &str) -> Http3Listener {
        let spec =
            serde_json::from_value(serde_json::json!({"upstream": {"address": "a:1"}})).unwrap();
        let mut l = Http3Listener::new("public", spec);
        l.metadata.uid = Some("u1".into());
        l.metadata.generation = Some(generation);
        l.status = Some(crate::api::Http3ListenerStatus {
            hosts_summary: Some(status_hosts.into()),
            ..Default::default()
        });
        l
    }

    fn names(out: Vec<Option<Http3Listener>>) -> Vec<Option<i64>> {
        out.into_iter()
            .map(|o| o.and_then(|l| l.metadata.generation))
            .collect()
    }

    #[test]
    fn our_own_status_writes_do_not_trigger_and_spec_changes_and_deletes_do() {
        let mut f = ChangeFilter::new(listener_key);
        let out = vec![
            f.accept(watcher::Event::Init),
            f.accept(watcher::Event::InitApply(listener(1, "0/0"))),
            f.accept(watcher::Event::InitDone),
            // Status writes (ours): same generation.
            f.accept(watcher::Event::Apply(listener(1, "1/1"))),
            f.accept(watcher::Event::Apply(listener(1, "1/2"))),
            // A spec edit.
            f.accept(watcher::Event::Apply(listener(2, "1/2"))),
            // Deleted: passes although nothing we hash changed.
            f.accept(watcher::Event::Delete(listener(2, "1/2"))),
            // Recreated with the same generation: new object, passes.
            f.accept(watcher::Event::Apply(listener(2, "0/0"))),
        ];
        assert_eq!(
            names(out),
            [None, Some(1), None, None, None, Some(2), Some(2), Some(2)]
        );
    }

    #[test]
    fn a_relist_passes_only_what_changed_and_forgets_what_is_gone() {
        let mut f = ChangeFilter::new(listener_key);
        let mut other = listener(1, "");
        other.metadata.name = Some("other".into());
        other.metadata.uid = Some("u2".into());
        assert!(f.accept(watcher::Event::Apply(listener(1, ""))).is_some());
        assert!(f.accept(watcher::Event::Apply(other.clone())).is_some());
        // The watch restarts; "other" was deleted meanwhile, "public" is unchanged.
        f.accept(watcher::Event::Init);
        assert!(f
            .accept(watcher::Event::InitApply(listener(1, "x")))
            .is_none());
        f.accept(watcher::Event::InitDone);
        assert_eq!(f.remembered(), 1, "the vanished object is forgotten");
        // If it comes back it is new again.
        assert!(f.accept(watcher::Event::Apply(other)).is_some());
    }

    fn ds(generation: i64, desired: i32, ready: i32, rv: &str) -> DaemonSet {
        DaemonSet {
            metadata: ObjectMeta {
                name: Some("h3-ingress-public".into()),
                namespace: Some("h3-ingress".into()),
                uid: Some("d1".into()),
                generation: Some(generation),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            status: Some(DaemonSetStatus {
                desired_number_scheduled: desired,
                current_number_scheduled: desired,
                number_ready: ready,
                observed_generation: Some(generation),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn daemon_sets_trigger_on_readiness_and_spec_not_on_rewrites() {
        let mut f = ChangeFilter::new(daemon_set_key);
        assert!(f.accept(watcher::Event::Apply(ds(1, 2, 1, "1"))).is_some());
        // Our own apply of an unchanged spec, or a status rewrite with the same counts.
        assert!(f.accept(watcher::Event::Apply(ds(1, 2, 1, "2"))).is_none());
        assert!(f.accept(watcher::Event::Apply(ds(1, 2, 2, "3"))).is_some());
        assert!(f.accept(watcher::Event::Apply(ds(2, 2, 2, "4"))).is_some());
        assert!(f.accept(watcher::Event::Delete(ds(2, 2, 2, "5"))).is_some());
    }

    #[test]
    fn a_daemon_set_maps_to_its_cluster_scoped_listener() {
        let mut d = ds(1, 1, 1, "1");
        d.metadata.owner_references = Some(
            serde_json::from_value(serde_json::json!([
                {"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener", "name": "public", "uid": "u1"},
                {"apiVersion": "apps/v1", "kind": "Deployment", "name": "other", "uid": "u2"}
            ]))
            .unwrap(),
        );
        let refs = owning_listeners(d);
        assert_eq!(refs, [ObjectRef::<Http3Listener>::new("public")]);
        assert_eq!(refs[0].namespace, None, "the listener is cluster-scoped");
    }

    #[test]
    fn ingresses_trigger_on_spec_and_annotations_not_on_status() {
        let ing = |generation: i64, ann: &str, lb: &str| Ingress {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("i1".into()),
                generation: Some(generation),
                annotations: Some(
                    [("h3-ingress.dev/enabled".to_string(), ann.to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            status: Some(
                serde_json::from_value(
                    serde_json::json!({"loadBalancer": {"ingress": [{"ip": lb}]}}),
                )
                .unwrap(),
            ),
            ..Default::default()
        };
        let mut f = ChangeFilter::new(ingress_key);
        assert!(f
            .accept(watcher::Event::Apply(ing(1, "true", "192.0.2.1")))
            .is_some());
        assert!(f
            .accept(watcher::Event::Apply(ing(1, "true", "192.0.2.2")))
            .is_none());
        assert!(f
            .accept(watcher::Event::Apply(ing(1, "false", "192.0.2.2")))
            .is_some());
        assert!(f
            .accept(watcher::Event::Apply(ing(2, "false", "192.0.2.2")))
            .is_some());
    }

    #[test]
    fn owned_objects_are_found_by_listener_label() {
        let (store, mut writer) = reflector::store::<PartialObjectMeta<Role>>();
        let role = |ns: &str, listener: &str| PartialObjectMeta::<Role> {
            metadata: ObjectMeta {
                name: Some(format!("h3-ingress-data-plane-{listener}")),
                namespace: Some(ns.into()),
                labels: Some(
                    [(labels::INSTANCE.to_string(), listener.to_string())]
                        .into_iter()
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        };
        for r in [
            role("shop", "public"),
            role("old", "public"),
            role("shop", "other"),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(r));
        }
        assert_eq!(
            owned_by(&store, "public"),
            [
                (
                    "old".to_string(),
                    "h3-ingress-data-plane-public".to_string()
                ),
                (
                    "shop".to_string(),
                    "h3-ingress-data-plane-public".to_string()
                )
            ]
        );
    }
}
