//! `h3-ingress uninstall`: the chart's pre-delete hook. It stops this installation's operator
//! and removes everything the operator made, so that after `helm uninstall` no DaemonSet keeps
//! holding the listeners' UDP port on every node with nothing to serve (the hosts namespace
//! with the certificate mirrors goes with the release).
//!
//! In order: scale the operator's Deployment to 0 and wait for its pods to be gone (nothing may
//! re-apply what follows); withdraw the Alt-Svc its listeners had the TCP ingress send
//! (`spec.advertise.altSvc`: its Middlewares say `clear`, its own `router.middlewares` entries
//! go, then the Middlewares no router names); delete this operator's DaemonSets, ServiceAccounts and Services (its
//! namespace), Roles, RoleBindings and mirrors (its hosts namespace), and ClusterRoles and
//! ClusterRoleBindings labelled with its namespace (or, from before release-scoped names, bound
//! to its ServiceAccounts only); write `Ready=False`/`NoController` on the listeners with its
//! controller name unless another running operator has that name; delete its Lease, so other
//! operators see at once that it is gone; wait for the data plane pods to exit. Another
//! installation's objects are never listed where they could be deleted: namespaced kinds are
//! read in this installation's namespaces only. The listeners' keys Secrets stay (the listener
//! owns them; the operator may not delete Secrets in its namespace).

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use super::advertise::altsvc::sweep::withdraw_release;
use super::ownership::{self, legacy_binding_here, made_here};
use super::watches::owned_selector;
use super::{status, FIELD_MANAGER};
use crate::api::{reasons, Http3Listener};

/// How long the operator's pods get to stop after the scale to 0 (their grace is 30 s).
pub const OPERATOR_STOP_WAIT: Duration = Duration::from_secs(90);
/// How often the waits look.
const POLL: Duration = Duration::from_secs(2);

#[derive(clap::Args, Debug, Clone)]
pub struct UninstallArgs {
    /// The operator's namespace (its data plane's too).
    #[arg(long, env = "POD_NAMESPACE", default_value = "h3-ingress")]
    pub namespace: String,
    /// The certificate mirrors' namespace. Default: `<namespace>-hosts`.
    #[arg(long, env = "H3_INGRESS_HOSTS_NAMESPACE")]
    pub hosts_namespace: Option<String>,
    /// The operator's controller name: its listeners are told that it is gone.
    #[arg(
        long,
        env = "H3_INGRESS_CONTROLLER_NAME",
        default_value = crate::api::DEFAULT_CONTROLLER_NAME
    )]
    pub controller_name: String,
    /// The operator's Deployment, scaled to 0 first.
    #[arg(long)]
    pub operator_deployment: String,
    /// The operator's Lease, deleted once its data plane is.
    #[arg(long, default_value = "h3-ingress-operator")]
    pub lease_name: String,
    /// How long to wait for the data plane pods to exit (they drain first).
    #[arg(long, default_value_t = 120)]
    pub wait_seconds: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UninstallError {
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("{action} {what}: {source}")]
    Api {
        action: &'static str,
        what: String,
        #[source]
        source: kube::Error,
    },
}

fn api_error(
    action: &'static str,
    what: impl Into<String>,
) -> impl FnOnce(kube::Error) -> UninstallError {
    let what = what.into();
    move |source| UninstallError::Api {
        action,
        what,
        source,
    }
}

/// Runs the hook; every step is logged with what it found.
pub async fn run(args: &UninstallArgs) -> Result<(), UninstallError> {
    let client = Client::try_default()
        .await
        .map_err(UninstallError::Client)?;
    let ns = args.namespace.as_str();
    let hosts = args
        .hosts_namespace
        .clone()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| format!("{ns}-hosts"));
    stop_operator(&client, ns, &args.operator_deployment).await?;
    // Before the data planes go: no TCP ingress may keep sending Alt-Svc: h3 for them.
    let withdrawn = withdraw_release(&client, ns)
        .await
        .map_err(api_error("withdrawing", "the Alt-Svc Middlewares"))?;
    tracing::info!(
        api_calls = withdrawn,
        "Alt-Svc withdrawn from the Ingresses this operator managed"
    );
    let mut deleted = 0;
    deleted += delete_listed::<DaemonSet>(&client, ns).await?;
    deleted += delete_listed::<ServiceAccount>(&client, ns).await?;
    deleted += delete_listed::<Service>(&client, ns).await?;
    deleted += delete_listed::<Role>(&client, &hosts).await?;
    deleted += delete_listed::<RoleBinding>(&client, &hosts).await?;
    deleted += delete_listed::<Secret>(&client, &hosts).await?;
    deleted += delete_cluster_rbac(&client, ns).await?;
    tracing::info!(objects = deleted, namespace = %ns, hosts_namespace = %hosts, "deleted the data planes this operator made");
    let told = tell_listeners(&client, ns, &args.controller_name).await?;
    tracing::info!(listeners = told, controller_name = %args.controller_name, "listeners told that no operator runs them");
    match Api::<Lease>::namespaced(client.clone(), ns)
        .delete(&args.lease_name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            return Err(api_error(
                "deleting",
                format!("Lease {ns}/{}", args.lease_name),
            )(e))
        }
    }
    let wait = Duration::from_secs(args.wait_seconds);
    let left = wait_for_pods(&client, ns, &owned_selector(), wait).await?;
    if left > 0 {
        tracing::warn!(
            pods = left,
            waited_s = args.wait_seconds,
            "data plane pods still draining; they exit on their own"
        );
    } else {
        tracing::info!("every data plane pod has exited: no node's port is held any more");
    }
    Ok(())
}

/// Scales the operator to 0 replicas and waits (bounded) until none of its pods is left, so
/// nothing re-applies what the hook deletes. A Deployment already gone is fine.
async fn stop_operator(client: &Client, ns: &str, name: &str) -> Result<(), UninstallError> {
    let api = Api::<Deployment>::namespaced(client.clone(), ns);
    let Some(dep) = api
        .get_opt(name)
        .await
        .map_err(api_error("reading", format!("Deployment {ns}/{name}")))?
    else {
        tracing::info!(deployment = %name, "no operator Deployment: nothing to stop");
        return Ok(());
    };
    let selector = dep
        .spec
        .selector
        .match_labels
        .as_ref()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    api.patch_scale(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .map_err(api_error("scaling to 0", format!("Deployment {ns}/{name}")))?;
    if selector.is_empty() {
        return Ok(());
    }
    let left = wait_for_pods(client, ns, &selector, OPERATOR_STOP_WAIT).await?;
    if left > 0 {
        tracing::warn!(
            pods = left,
            "the operator's pods did not stop in time; going on"
        );
    } else {
        tracing::info!(deployment = %name, "the operator is stopped");
    }
    Ok(())
}

/// Waits until no pod matches `selector` in `ns`, at most `wait`; returns how many are left.
async fn wait_for_pods(
    client: &Client,
    ns: &str,
    selector: &str,
    wait: Duration,
) -> Result<usize, UninstallError> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let pods = api
            .list(&ListParams::default().labels(selector))
            .await
            .map_err(api_error("listing", format!("pods {selector} in {ns}")))?;
        let left = pods.items.len();
        if left == 0 || tokio::time::Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Deletes every object of kind `K` the operator labelled (`watches::owned_selector`) in `ns`.
async fn delete_listed<K>(client: &Client, ns: &str) -> Result<usize, UninstallError>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let kind = K::kind(&()).into_owned();
    let api = Api::<K>::namespaced(client.clone(), ns);
    let list = api
        .list_metadata(&ListParams::default().labels(&owned_selector()))
        .await
        .map_err(api_error("listing", format!("{kind} in {ns}")))?;
    let mut n = 0;
    for o in list.items {
        let name = o.name_any();
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => n += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_error("deleting", format!("{kind} {ns}/{name}"))(e)),
        }
    }
    Ok(n)
}

/// Deletes the ClusterRoleBindings and ClusterRoles this operator made: labelled with its
/// namespace, or (before release-scoped names) a binding of its ServiceAccounts only and the
/// ClusterRole of the same name.
async fn delete_cluster_rbac(client: &Client, ns: &str) -> Result<usize, UninstallError> {
    let lp = ListParams::default().labels(&owned_selector());
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    let roles = Api::<ClusterRole>::all(client.clone());
    let mut names = Vec::new();
    for b in bindings
        .list(&lp)
        .await
        .map_err(api_error("listing", "ClusterRoleBindings"))?
        .items
    {
        if made_here(b.labels(), ns) || legacy_binding_here(&b, ns) {
            names.push(b.name_any());
        }
    }
    for r in roles
        .list_metadata(&lp)
        .await
        .map_err(api_error("listing", "ClusterRoles"))?
        .items
    {
        if made_here(r.labels(), ns) && !names.contains(&r.name_any()) {
            names.push(r.name_any());
        }
    }
    let mut n = 0;
    for name in &names {
        for r in [
            bindings
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
            roles
                .delete(name, &DeleteParams::background())
                .await
                .map(|_| ()),
        ] {
            match r {
                Ok(()) => n += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(api_error(
                        "deleting",
                        format!("ClusterRole(Binding) {name}"),
                    )(e))
                }
            }
        }
    }
    Ok(n)
}

/// Writes `Ready=False`/`NoController` on every listener with `controller_name`, unless another
/// running operator has that name (it runs them now). Returns how many were written.
async fn tell_listeners(
    client: &Client,
    ns: &str,
    controller_name: &str,
) -> Result<usize, UninstallError> {
    let leases = Api::<Lease>::all(client.clone())
        .list(&ListParams::default().labels(&super::watches::operator_lease_selector()))
        .await
        .map_err(api_error("listing", "operator Leases"))?;
    let regs: Vec<_> = leases.items.iter().map(ownership::registration).collect();
    let mut running = ownership::running(&regs, Timestamp::now());
    running.remove(ns);
    if running.values().any(|n| n == controller_name) {
        tracing::info!(%controller_name, "another running operator has this controller name: its listeners are its now");
        return Ok(0);
    }
    let api = Api::<Http3Listener>::all(client.clone());
    let listeners = api
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing", "Http3Listeners"))?;
    let mut n = 0;
    for l in listeners.items {
        if ownership::wanted(&l) != controller_name || l.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let message = format!(
            "the operator with controller name {controller_name:?} (namespace {ns}) was \
             uninstalled and removed this listener's data plane; install an operator with this \
             name, or set spec.controllerName to a running one's"
        );
        let next = status::refused(
            l.status.as_ref(),
            l.metadata.generation,
            reasons::NO_CONTROLLER,
            message,
            Timestamp::now(),
        );
        let patch = serde_json::json!({
            "apiVersion": Http3Listener::api_version(&()),
            "kind": Http3Listener::kind(&()),
            "status": next,
        });
        api.patch_status(
            &l.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(api_error(
            "writing the status of",
            format!("Http3Listener {}", l.name_any()),
        ))?;
        n += 1;
    }
    Ok(n)
}
