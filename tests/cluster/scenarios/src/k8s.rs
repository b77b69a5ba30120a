//! The API server through kube with the product's own types: server-side apply, get, patch and
//! delete of objects, a listener's conditions, and the events about an object.

use std::fmt::Debug;

use h3_ingress::api::Http3Listener;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::Result;

/// A scenario's typed handles on the API server: `ns::<K>(namespace)` and `all::<K>()` from
/// its one client, written once for every scenario.
pub trait Apis {
    fn client(&self) -> &Client;

    fn ns<K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        &self,
        ns: &str,
    ) -> Api<K> {
        Api::namespaced(self.client().clone(), ns)
    }

    fn all<K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>>(
        &self,
    ) -> Api<K> {
        Api::all(self.client().clone())
    }
}

/// Kubernetes' own `Ready` condition of pods and nodes, not the listener's (that one is
/// `h3_ingress::api::conditions::READY`).
pub const KUBE_READY: &str = "Ready"; // kubernetes' own

/// The field manager of every apply the scenarios make.
pub const MANAGER: &str = "h3i-scenarios";

/// Server-side apply of `object` (a full manifest, `apiVersion` and `kind` included), forced.
pub async fn apply<K>(api: &Api<K>, name: &str, object: &Value) -> Result<K>
where
    K: Clone + DeserializeOwned + Debug,
{
    let pp = PatchParams::apply(MANAGER).force();
    Ok(api.patch(name, &pp, &Patch::Apply(object)).await?)
}

/// Applies a `kubernetes.io/dockerconfigjson` Secret `name` in the Api's namespace holding
/// `user`'s credentials for `registry` (what `kubectl create secret docker-registry` makes).
pub async fn pull_secret(
    api: &Api<Secret>,
    name: &str,
    registry: &str,
    user: &str,
    password: &str,
) -> Result<Secret> {
    let auth = crate::pods::base64(format!("{user}:{password}").as_bytes());
    let config = serde_json::json!({"auths": {registry: {"username": user, "password": password, "auth": auth}}});
    let data = crate::pods::base64(config.to_string().as_bytes());
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": api.namespace()},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": data}});
    apply(api, name, &secret).await
}

/// Creates an object; an existing one of that name fails.
pub async fn create<K>(api: &Api<K>, object: &K) -> Result<K>
where
    K: Clone + DeserializeOwned + Serialize + Debug,
{
    Ok(api.create(&PostParams::default(), object).await?)
}

/// The object, or `None` when it does not exist.
pub async fn get<K>(api: &Api<K>, name: &str) -> Result<Option<K>>
where
    K: Clone + DeserializeOwned + Debug,
{
    Ok(api.get_opt(name).await?)
}

/// Whether the object exists.
pub async fn exists<K>(api: &Api<K>, name: &str) -> Result<bool>
where
    K: Clone + DeserializeOwned + Debug,
{
    Ok(get(api, name).await?.is_some())
}

/// A JSON merge patch.
pub async fn merge<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<K>
where
    K: Clone + DeserializeOwned + Debug,
{
    Ok(api
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?)
}

/// Deletes the object (background propagation); a missing one is not an error.
pub async fn delete<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The objects whose labels match `selector` (`k=v,k2=v2`).
pub async fn list<K>(api: &Api<K>, selector: &str) -> Result<Vec<K>>
where
    K: Clone + DeserializeOwned + Debug,
{
    Ok(api
        .list(&ListParams::default().labels(selector))
        .await?
        .items)
}

/// The names of the objects whose labels match `selector`.
pub async fn names<K>(api: &Api<K>, selector: &str) -> Result<Vec<String>>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    Ok(list(api, selector)
        .await?
        .iter()
        .map(|o| o.name_any())
        .collect())
}

/// The listener's condition of this type (`h3_ingress::api::conditions`), if it has one.
pub async fn condition(client: &Client, listener: &str, type_: &str) -> Result<Option<Condition>> {
    let api: Api<Http3Listener> = Api::all(client.clone());
    let l = api.get_opt(listener).await?;
    Ok(l.and_then(|l| l.status)
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_)))
}

/// Whether the listener's condition has this status and reason.
pub async fn condition_is(
    client: &Client,
    listener: &str,
    type_: &str,
    status: &str,
    reason: &str,
) -> Result<bool> {
    Ok(condition(client, listener, type_)
        .await?
        .is_some_and(|c| c.status == status && c.reason == reason))
}

/// Events about the object of this kind and UID, in every namespace; `type_` and `reason`
/// narrow them when given.
pub async fn events(
    client: &Client,
    kind: &str,
    uid: &str,
    type_: Option<&str>,
    reason: Option<&str>,
) -> Result<Vec<Event>> {
    let mut fields = format!("involvedObject.kind={kind},involvedObject.uid={uid}");
    if let Some(t) = type_ {
        fields += &format!(",type={t}");
    }
    if let Some(r) = reason {
        fields += &format!(",reason={r}");
    }
    let api: Api<Event> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().fields(&fields))
        .await?
        .items)
}

/// `TYPE REASON: message` of an event.
pub fn event_line(e: &Event) -> String {
    format!(
        "{} {}: {}",
        e.type_.as_deref().unwrap_or(""),
        e.reason.as_deref().unwrap_or(""),
        e.message.as_deref().unwrap_or("")
    )
}

/// The `Kind/name/uid` of the object's controller owner reference, or `""`.
pub fn controller_of<K: Resource>(object: &K) -> String {
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true))
        .map(|r| format!("{}/{}/{}", r.kind, r.name, r.uid))
        .unwrap_or_default()
}
