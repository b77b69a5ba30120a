//! Applying a listener's objects and pruning the ones it no longer needs, with every API error
//! kept for the status: which object, and whether RBAC, an admission check or something else
//! refused it ([`blocker`]). Also reads why a DaemonSet cannot create its pods.

use std::collections::BTreeSet;
use std::fmt::Debug;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::context::{Applied, Context};
use super::resources::{self, Desired};
use super::status::Blocker;
use super::watches::owned_by;
use super::FIELD_MANAGER;
use crate::api::reasons;

/// An API call for one object that failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {kind} {object}: {source}")]
pub struct ApplyError {
    /// `applying`, `creating` or `deleting`.
    pub action: &'static str,
    pub kind: String,
    /// `namespace/name`, or `name` for cluster-scoped objects.
    pub object: String,
    #[source]
    pub source: kube::Error,
}

/// What the status says about an API error: RBAC refused (`Forbidden`), an admission webhook
/// or policy refused (`AdmissionDenied`), or anything else the API server answered
/// (`ApplyFailed`). `None` when the API server did not answer at all (no status can be
/// written then either).
pub fn blocker(e: &ApplyError) -> Option<Blocker> {
    let kube::Error::Api(s) = &e.source else {
        return None;
    };
    let m = s.message.as_str();
    let admission = m.contains("admission webhook")
        || m.contains("ValidatingAdmissionPolicy")
        || m.contains("denied request");
    let reason = if admission {
        reasons::ADMISSION_DENIED
    } else if s.code == 403 {
        reasons::FORBIDDEN
    } else {
        reasons::APPLY_FAILED
    };
    Some(Blocker {
        reason,
        message: format!(
            "{} {} {}: {} (HTTP {})",
            e.action, e.kind, e.object, s.message, s.code
        ),
    })
}

fn object_name<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    match obj.meta().namespace.as_deref() {
        Some(ns) => format!("{ns}/{}", obj.meta().name.as_deref().unwrap_or_default()),
        None => obj.meta().name.clone().unwrap_or_default(),
    }
}

async fn apply<K>(api: Api<K>, obj: &K) -> Result<K, ApplyError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
    .map_err(|source| ApplyError {
        action: "applying",
        kind: K::kind(&()).into_owned(),
        object: object_name(obj),
        source,
    })
}

fn namespaced<K>(ctx: &Context, obj: &K) -> Api<K>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    let ns = obj.meta().namespace.as_deref().unwrap_or_default();
    Api::namespaced(ctx.client.clone(), ns)
}

/// The version of an object the applied-hash check compares: its generation where it has one
/// (a DaemonSet's resourceVersion moves with every status write), else its resourceVersion.
fn version_of(m: &ObjectMeta) -> String {
    match m.generation {
        Some(g) => format!("g{g}"),
        None => m.resource_version.clone().unwrap_or_default(),
    }
}

fn cached_version<K>(store: &Store<K>, obj: &impl Resource) -> Option<String>
where
    K: Resource<DynamicType = ()> + Clone,
{
    let m = obj.meta();
    let mut r = ObjectRef::<K>::new(m.name.as_deref().unwrap_or_default());
    if let Some(ns) = &m.namespace {
        r = r.within(ns);
    }
    store.get(&r).map(|o| version_of(o.meta()))
}

/// Applies `obj` unless the operator applied exactly this before and the cached object has
/// not changed since (someone's edit is overwritten on the next reconcile, as before). At
/// steady state a reconcile applies nothing, whatever the number of listeners.
async fn apply_changed<K>(
    ctx: &Context,
    listener: &str,
    api: Api<K>,
    obj: &K,
    cached: Option<String>,
) -> Result<Option<K>, ApplyError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let key = format!("{}/{}", K::kind(&()), object_name(obj));
    let hash = {
        use sha2::Digest;
        let bytes = serde_json::to_vec(obj).expect("objects serialise");
        hex::encode(sha2::Sha256::digest(bytes))
    };
    let unchanged = ctx
        .memory_of(listener)
        .applied
        .get(&key)
        .is_some_and(|a| a.hash == hash && cached.as_deref() == Some(a.version.as_str()));
    if unchanged {
        return Ok(None);
    }
    let applied = apply(api, obj).await?;
    ctx.metrics.applies.inc();
    let version = version_of(applied.meta());
    ctx.remember(listener, |m| {
        m.applied.insert(key, Applied { hash, version });
    });
    Ok(Some(applied))
}

/// Applies every desired object that changed; returns the DaemonSet as the API server has it
/// (with status): the apply's answer, else the cache's.
pub async fn apply_all(
    ctx: &Context,
    listener: &str,
    d: &Desired,
) -> Result<Option<DaemonSet>, ApplyError> {
    let c = &ctx.client;
    let o = &ctx.caches.owned;
    ensure_keys_secret(ctx, &d.keys_secret).await?;
    let sa = &d.service_account;
    let v = cached_version(&o.service_accounts, sa);
    apply_changed(ctx, listener, namespaced::<ServiceAccount>(ctx, sa), sa, v).await?;
    let cr = &d.cluster_role;
    let v = cached_version(&o.cluster_roles, cr);
    apply_changed(ctx, listener, Api::<ClusterRole>::all(c.clone()), cr, v).await?;
    let crb = &d.cluster_role_binding;
    let v = cached_version(&o.cluster_role_bindings, crb);
    apply_changed(
        ctx,
        listener,
        Api::<ClusterRoleBinding>::all(c.clone()),
        crb,
        v,
    )
    .await?;
    for r in &d.roles {
        let v = cached_version(&o.roles, r);
        apply_changed(ctx, listener, namespaced::<Role>(ctx, r), r, v).await?;
    }
    for rb in &d.role_bindings {
        let v = cached_version(&o.role_bindings, rb);
        apply_changed(ctx, listener, namespaced::<RoleBinding>(ctx, rb), rb, v).await?;
    }
    if let Some(svc) = &d.service {
        let v = cached_version(&o.services, svc);
        apply_changed(ctx, listener, namespaced::<Service>(ctx, svc), svc, v).await?;
    }
    let ds = &d.daemon_set;
    let v = cached_version(&o.daemon_sets, ds);
    let applied = apply_changed(ctx, listener, namespaced::<DaemonSet>(ctx, ds), ds, v).await?;
    Ok(applied.or_else(|| {
        let r = ObjectRef::<DaemonSet>::new(&ds.name_any()).within(&ctx.params.namespace);
        o.daemon_sets.get(&r).map(|d| d.as_ref().clone())
    }))
}

/// Creates the listener's keys Secret with fresh random bytes unless it exists; an existing
/// one is never changed (a new key would strand every client of the old one). First, as the
/// DaemonSet's pods cannot start without it.
async fn ensure_keys_secret(ctx: &Context, keys: &Secret) -> Result<(), ApplyError> {
    let api = namespaced::<Secret>(ctx, keys);
    let name = keys.name_any();
    if cached_version(&ctx.caches.owned.keys, keys).is_some() {
        return Ok(());
    }
    let failed = |source| ApplyError {
        action: "creating",
        kind: "Secret".into(),
        object: object_name(keys),
        source,
    };
    if api.get_opt(&name).await.map_err(failed)?.is_some() {
        return Ok(());
    }
    let mut random = [0u8; crate::api::keys::GENERATED_SECRET_BYTES];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut random).map_err(
        |_| {
            failed(kube::Error::Service(Box::new(std::io::Error::other(
                "the system's random number generator failed",
            ))))
        },
    )?;
    let mut secret = keys.clone();
    secret.data = Some(
        [(
            resources::KEYS_SECRET_KEY.to_string(),
            ByteString(random.to_vec()),
        )]
        .into_iter()
        .collect(),
    );
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => {
            tracing::info!(secret = %name, "created the listener's QUIC keys Secret");
            Ok(())
        }
        // Another operator (a leader change) created it first.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(failed(e)),
    }
}

async fn delete<K>(ctx: &Context, ns: &str, name: &str) -> Result<(), ApplyError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    K: Clone + DeserializeOwned + Debug,
{
    let r = Api::<K>::namespaced(ctx.client.clone(), ns)
        .delete(name, &DeleteParams::background())
        .await;
    match r {
        Ok(_) => Ok(()),
        // Gone already: that is what we wanted.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(ApplyError {
            action: "deleting",
            kind: K::kind(&()).into_owned(),
            object: format!("{ns}/{name}"),
            source,
        }),
    }
}

/// Deletes what the listener no longer needs: Roles and RoleBindings outside the hosts
/// namespace (earlier versions made one per namespace of a referenced Secret), and the Service
/// when `spec.service` was removed. Reads
/// the owned-object caches, so it costs an API call only when something is deleted.
/// (Everything else has a fixed name and is replaced in place by the apply.)
pub async fn prune(ctx: &Context, listener: &str, d: &Desired) -> Result<(), ApplyError> {
    let keep: BTreeSet<&str> = d
        .roles
        .iter()
        .filter_map(|r| r.metadata.namespace.as_deref())
        .collect();
    for (ns, name) in owned_by(&ctx.caches.owned.roles, listener) {
        if !keep.contains(ns.as_str()) {
            tracing::info!(%listener, namespace = %ns, "removing the data plane's Secret access");
            delete::<Role>(ctx, &ns, &name).await?;
        }
    }
    for (ns, name) in owned_by(&ctx.caches.owned.role_bindings, listener) {
        if !keep.contains(ns.as_str()) {
            delete::<RoleBinding>(ctx, &ns, &name).await?;
        }
    }
    if d.service.is_none() {
        for (ns, name) in owned_by(&ctx.caches.owned.services, listener) {
            tracing::info!(%listener, service = %name, "removing the Service spec.service no longer asks for");
            delete::<Service>(ctx, &ns, &name).await?;
        }
    }
    Ok(())
}

/// Whether the DaemonSet has fewer pods than nodes to run them: then its `FailedCreate` events
/// say why (Pod Security, quota, a webhook).
pub fn pods_missing(ds: &DaemonSet) -> bool {
    ds.status
        .as_ref()
        .is_some_and(|s| s.current_number_scheduled < s.desired_number_scheduled)
}

/// The message of the newest `FailedCreate` event of the DaemonSet (core/v1 Events, which the
/// DaemonSet controller records), if there is one. Best effort: a failed read is logged and
/// the status then says only that pods are missing.
pub async fn failed_create(ctx: &Context, ds: &DaemonSet) -> Option<String> {
    let ns = ds.namespace().unwrap_or_default();
    let mut fields = format!(
        "involvedObject.kind=DaemonSet,involvedObject.name={},reason=FailedCreate",
        ds.name_any()
    );
    if let Some(uid) = ds.uid() {
        fields.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let events = Api::<Event>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().fields(&fields))
        .await;
    match events {
        Ok(list) => newest_message(list.items),
        Err(e) => {
            tracing::debug!(daemonset = %ds.name_any(), error = %e, "cannot read FailedCreate events");
            None
        }
    }
}

/// The message of the most recent event (by last occurrence, then creation).
pub fn newest_message(events: Vec<Event>) -> Option<String> {
    events
        .into_iter()
        .max_by_key(|e| {
            let last = e
                .series
                .as_ref()
                .and_then(|s| s.last_observed_time.as_ref().map(|t| t.0))
                .or_else(|| e.last_timestamp.as_ref().map(|t| t.0))
                .or_else(|| e.event_time.as_ref().map(|t| t.0));
            (last, e.metadata.creation_timestamp.as_ref().map(|t| t.0))
        })
        .and_then(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::core::Status;

    fn api_error(code: u16, reason: &str, message: &str) -> ApplyError {
        ApplyError {
            action: "applying",
            kind: "DaemonSet".into(),
            object: "h3-ingress/h3-ingress-public".into(),
            source: kube::Error::Api(Box::new(Status {
                code,
                reason: reason.into(),
                message: message.into(),
                ..Status::failure(message, reason)
            })),
        }
    }

    #[test]
    fn api_errors_are_classified_for_the_status() {
        let rbac = api_error(
            403,
            "Forbidden",
            "daemonsets.apps \"h3-ingress-public\" is forbidden: User \"system:serviceaccount:h3-ingress:h3-ingress\" cannot patch resource \"daemonsets\" in API group \"apps\" in the namespace \"h3-ingress\"",
        );
        let b = blocker(&rbac).unwrap();
        assert_eq!(b.reason, reasons::FORBIDDEN);
        assert!(
            b.message
                .starts_with("applying DaemonSet h3-ingress/h3-ingress-public: daemonsets.apps"),
            "{}",
            b.message
        );
        assert!(b.message.ends_with("(HTTP 403)"), "{}", b.message);

        let webhook = api_error(
            403,
            "Forbidden",
            "admission webhook \"validation.gatekeeper.sh\" denied the request: hostNetwork is not allowed",
        );
        assert_eq!(blocker(&webhook).unwrap().reason, reasons::ADMISSION_DENIED);
        let policy = api_error(
            422,
            "Invalid",
            "daemonsets.apps \"h3-ingress-public\" is forbidden: ValidatingAdmissionPolicy 'no-host-network' with binding 'b' denied request: failed expression",
        );
        assert_eq!(blocker(&policy).unwrap().reason, reasons::ADMISSION_DENIED);
        let invalid = api_error(422, "Invalid", "DaemonSet.apps \"x\" is invalid: spec.template.spec.containers[0].image: Required value");
        assert_eq!(blocker(&invalid).unwrap().reason, reasons::APPLY_FAILED);

        let transport = ApplyError {
            action: "applying",
            kind: "DaemonSet".into(),
            object: "x".into(),
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        assert!(blocker(&transport).is_none());
    }

    #[test]
    fn the_newest_failed_create_message_is_chosen() {
        let ev = |msg: &str, last: i64| Event {
            metadata: ObjectMeta {
                creation_timestamp: Some(Time(Timestamp::from_second(1).unwrap())),
                ..Default::default()
            },
            message: Some(msg.into()),
            last_timestamp: Some(Time(Timestamp::from_second(last).unwrap())),
            involved_object: Default::default(),
            ..Default::default()
        };
        assert_eq!(
            newest_message(vec![ev("old", 10), ev("new", 30), ev("mid", 20)]).as_deref(),
            Some("new")
        );
        assert_eq!(newest_message(vec![]), None);
    }
}
