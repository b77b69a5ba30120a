//! The operator's I/O shell: a kube-runtime Controller over `Http3Listener`s that applies the
//! objects [`super::resources`] builds, reads the pods' `/status`, and writes the status
//! [`super::status`] computes and the events [`super::events`] plans. Only the Lease holder
//! writes; a standby replica keeps its caches warm and does nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{future, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::Ingress;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::ByteString;
use kube::api::{Api, DeleteParams, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::events::{self, PlannedEvent, Target};
use super::metrics::{results, AdminState, OperatorMetrics};
use super::reports::{status_address, HttpReportFetcher, ReportFetcher};
use super::resources::{self, label_selector, Desired, Params};
use super::status::{self, PodReport};
use super::{leader, FIELD_MANAGER};
use crate::api::altsvc::{controller_of, IngressController};
use crate::api::{Http3Listener, Http3ListenerStatus, SecretRef};
use crate::config::kube::{
    ingress_key, referenced_secrets, resolve_hosts, ResolvedHosts, SecretMap,
};

/// How often a listener is reconciled without any change, to refresh the pods' reports.
pub const REQUEUE: Duration = Duration::from_secs(60);
/// Retry delay after a failed reconciliation.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Kubernetes limits an event note to 1 kB.
const MAX_NOTE: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot build a Kubernetes client (no kubeconfig and not in a cluster?): {0}")]
    Client(#[source] kube::Error),
    #[error(
        "the Http3Listener CRD is not installed or not readable (kubectl apply -f crds/): {0}"
    )]
    CrdMissing(#[source] kube::Error),
    #[error("admin endpoint {0}: {1}")]
    Admin(SocketAddr, #[source] std::io::Error),
    #[error("installing the signal handlers: {0}")]
    Signals(#[source] std::io::Error),
    #[error("the Ingress cache never filled")]
    IngressCache,
}

/// Everything a reconciliation needs; shared by all of them.
pub struct Context {
    pub client: Client,
    pub params: Params,
    /// All Ingresses, kept by a reflector the controller polls.
    pub ingresses: Store<Ingress>,
    pub leader: watch::Receiver<bool>,
    pub reports: Arc<dyn ReportFetcher>,
    pub recorder: Recorder,
    pub metrics: Arc<OperatorMetrics>,
    /// Secrets each listener references, so a Secret change re-reconciles only when it matters.
    pub secret_interest: Mutex<BTreeMap<String, BTreeSet<SecretRef>>>,
}

impl Context {
    pub fn new(
        client: Client,
        params: Params,
        ingresses: Store<Ingress>,
        leader: watch::Receiver<bool>,
        reports: Arc<dyn ReportFetcher>,
        reporter: Reporter,
        metrics: Arc<OperatorMetrics>,
    ) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            params,
            ingresses,
            leader,
            reports,
            metrics,
            secret_interest: Mutex::new(BTreeMap::new()),
        }
    }

    /// Whether some listener references this Secret.
    pub fn wants_secret(&self, namespace: &str, name: &str) -> bool {
        let interest = self.secret_interest.lock().expect("not poisoned");
        interest.values().any(|set| {
            set.iter()
                .any(|s| s.namespace == namespace && s.name == name)
        })
    }
}

/// Whether a change to this Ingress can affect some listener: it carries one of our
/// annotations, or a listener's status lists it (so removing the annotation is noticed).
pub fn ingress_is_relevant(ing: &Ingress, listeners: &[Arc<Http3Listener>]) -> bool {
    let ours = ing
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.keys().any(|k| k.starts_with("h3-ingress.dev/")));
    if ours {
        return true;
    }
    let key = ingress_key(ing);
    listeners.iter().any(|l| {
        l.status
            .as_ref()
            .is_some_and(|s| s.hosts.iter().any(|h| h.ingress.as_deref() == Some(&key)))
    })
}

async fn apply<K>(api: &Api<K>, obj: &K) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(obj),
    )
    .await
}

/// Applies every desired object; returns the DaemonSet as the API server has it (with status).
async fn apply_all(ctx: &Context, d: &Desired) -> Result<DaemonSet, kube::Error> {
    let c = &ctx.client;
    let ns = ctx.params.namespace.as_str();
    apply(
        &Api::<ServiceAccount>::namespaced(c.clone(), ns),
        &d.service_account,
    )
    .await?;
    apply(&Api::<ClusterRole>::all(c.clone()), &d.cluster_role).await?;
    apply(
        &Api::<ClusterRoleBinding>::all(c.clone()),
        &d.cluster_role_binding,
    )
    .await?;
    for r in &d.roles {
        let rns = r.metadata.namespace.as_deref().unwrap_or_default();
        apply(&Api::<Role>::namespaced(c.clone(), rns), r).await?;
    }
    for rb in &d.role_bindings {
        let rns = rb.metadata.namespace.as_deref().unwrap_or_default();
        apply(&Api::<RoleBinding>::namespaced(c.clone(), rns), rb).await?;
    }
    apply(&Api::<DaemonSet>::namespaced(c.clone(), ns), &d.daemon_set).await
}

/// Creates the listener's keys Secret with fresh random bytes unless it exists; an existing
/// one is never changed (a new key would strand every client of the old one).
async fn ensure_keys_secret(ctx: &Context, d: &Desired) -> Result<(), kube::Error> {
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &ctx.params.namespace);
    let name = d.keys_secret.name_any();
    if api.get_opt(&name).await?.is_some() {
        return Ok(());
    }
    let random = crate::proxy::keys::random_secret()
        .map_err(|e| kube::Error::Service(Box::new(std::io::Error::other(e.to_string()))))?;
    let mut secret = d.keys_secret.clone();
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
        Err(e) => Err(e),
    }
}

fn ignore_not_found<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Deletes the Roles and RoleBindings of namespaces whose Secrets are no longer referenced.
/// (Everything else has a fixed name and is replaced in place by the apply.)
async fn prune(ctx: &Context, listener: &str, d: &Desired) -> Result<(), kube::Error> {
    let lp = ListParams::default().labels(&label_selector(listener));
    let keep: BTreeSet<&str> = d
        .roles
        .iter()
        .filter_map(|r| r.metadata.namespace.as_deref())
        .collect();
    let c = &ctx.client;
    for r in Api::<Role>::all(c.clone()).list(&lp).await? {
        let ns = r.namespace().unwrap_or_default();
        if !keep.contains(ns.as_str()) {
            tracing::info!(%listener, namespace = %ns, "removing the data plane's Secret access");
            ignore_not_found(
                Api::<Role>::namespaced(c.clone(), &ns)
                    .delete(&r.name_any(), &DeleteParams::background())
                    .await,
            )?;
        }
    }
    for rb in Api::<RoleBinding>::all(c.clone()).list(&lp).await? {
        let ns = rb.namespace().unwrap_or_default();
        if !keep.contains(ns.as_str()) {
            ignore_not_found(
                Api::<RoleBinding>::namespaced(c.clone(), &ns)
                    .delete(&rb.name_any(), &DeleteParams::background())
                    .await,
            )?;
        }
    }
    Ok(())
}

async fn fetch_secrets(
    ctx: &Context,
    refs: &BTreeSet<SecretRef>,
) -> Result<SecretMap, kube::Error> {
    let mut out = SecretMap::new();
    for r in refs {
        let api = Api::<Secret>::namespaced(ctx.client.clone(), &r.namespace);
        if let Some(s) = api.get_opt(&r.name).await? {
            out.insert((r.namespace.clone(), r.name.clone()), s);
        }
    }
    Ok(out)
}

async fn pod_reports(
    ctx: &Context,
    listener: &str,
    metrics: SocketAddr,
) -> Result<Vec<PodReport>, kube::Error> {
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ctx.params.namespace)
        .list(&ListParams::default().labels(&label_selector(listener)))
        .await?;
    let mut pods: Vec<Pod> = pods
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    let fetches = pods.iter().map(|p| {
        let name = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
        let reports = ctx.reports.clone();
        async move {
            let report = match ip {
                None => Err("pod has no IP yet".to_string()),
                Some(ip) => match status_address(&ip, metrics) {
                    Ok(addr) => reports.fetch(addr).await,
                    Err(e) => Err(e),
                },
            };
            PodReport {
                pod: name,
                node,
                report,
            }
        }
    });
    let out = future::join_all(fetches).await;
    for r in &out {
        if let Err(e) = &r.report {
            ctx.metrics.pod_report_errors.inc();
            tracing::debug!(pod = %r.pod, error = %e, "cannot read /status");
        }
    }
    Ok(out)
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_NOTE {
        let mut end = MAX_NOTE - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

async fn publish(ctx: &Context, listener: &Http3Listener, planned: Vec<PlannedEvent>) {
    for ev in planned {
        let reference = match &ev.target {
            Target::Listener => listener.object_ref(&()),
            Target::Ingress(key) => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                match ctx.ingresses.get(&ObjectRef::new(name).within(ns)) {
                    Some(ing) => ing.object_ref(&()),
                    // Deleted meanwhile: the listener's event says it all.
                    None => continue,
                }
            }
        };
        let type_ = if ev.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let event = KubeEvent {
            type_,
            reason: ev.reason.clone(),
            note: Some(truncate(ev.note.clone())),
            action: events::ACTION.to_string(),
            secondary: None,
        };
        match ctx.recorder.publish(&event, &reference).await {
            Ok(()) => ctx
                .metrics
                .events
                .with_label_values(&[if ev.warning { "Warning" } else { "Normal" }])
                .inc(),
            // Events are best effort: a missing one must not block the status.
            Err(e) => tracing::warn!(error = %e, reason = %ev.reason, "cannot publish event"),
        }
    }
}

/// The leader's reconciliation: apply the data plane, read its pods, write the status.
async fn reconcile_as_leader(listener: &Http3Listener, ctx: &Context) -> Result<Action, Error> {
    let name = listener.name_any();
    let ingresses = ctx.ingresses.state();
    let refs = referenced_secrets(listener, ingresses.iter().map(|i| i.as_ref()));
    ctx.secret_interest
        .lock()
        .expect("not poisoned")
        .insert(name.clone(), refs.clone());
    let secrets = fetch_secrets(ctx, &refs).await?;
    let now = Timestamp::now();
    let resolved = resolve_hosts(
        listener,
        ingresses.iter().map(|i| i.as_ref()),
        &secrets,
        now.as_second(),
    );

    let (spec_error, ds_status, pods) = match resources::desired(listener, &refs, &ctx.params) {
        Ok(d) => {
            ensure_keys_secret(ctx, &d).await?;
            let ds = apply_all(ctx, &d).await?;
            prune(ctx, &name, &d).await?;
            let metrics = resources::validate(listener)
                .map(|c| c.metrics_address)
                .expect("desired() validated the spec");
            let pods = pod_reports(ctx, &name, metrics).await?;
            (None, ds.status, pods)
        }
        Err(e) => {
            // Leave the running data plane alone: it keeps serving its last good config.
            tracing::warn!(listener = %name, error = %e, "invalid listener");
            (Some(e.to_string()), None, Vec::new())
        }
    };

    let controllers = ingress_controllers(&ingresses, &resolved);
    let next = status::aggregate(&status::Inputs {
        controllers: &controllers,
        alt_svc_max_age: listener.spec.alt_svc.max_age_seconds,
        generation: listener.metadata.generation,
        port: listener.spec.port,
        spec_error,
        hosts: &resolved.reports,
        daemon_set: ds_status.as_ref(),
        pods: &pods,
        previous: listener.status.as_ref(),
        now,
    });
    write_status(ctx, listener, next).await?;
    Ok(Action::requeue(REQUEUE))
}

/// The TCP ingress controller of every Ingress that has a host of this listener, where its
/// annotations say, so the Alt-Svc advice can name the one line to add.
fn ingress_controllers(
    ingresses: &[Arc<Ingress>],
    resolved: &ResolvedHosts,
) -> BTreeMap<String, IngressController> {
    let listed: BTreeSet<&str> = resolved
        .reports
        .iter()
        .filter_map(|h| h.ingress.as_deref())
        .collect();
    ingresses
        .iter()
        .map(|i| (ingress_key(i), i))
        .filter(|(key, _)| listed.contains(key.as_str()))
        .filter_map(|(key, i)| controller_of(i).map(|c| (key, c)))
        .collect()
}

/// Patches the status when it changed (timestamps aside) and publishes the events the change
/// deserves; an unchanged status makes no API call.
async fn write_status(
    ctx: &Context,
    listener: &Http3Listener,
    next: Http3ListenerStatus,
) -> Result<(), Error> {
    let previous = listener.status.as_ref();
    if !status::needs_write(previous, &next) {
        return Ok(());
    }
    let patch = serde_json::json!({
        "apiVersion": Http3Listener::api_version(&()),
        "kind": Http3Listener::kind(&()),
        "status": next,
    });
    Api::<Http3Listener>::all(ctx.client.clone())
        .patch_status(
            &listener.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await?;
    ctx.metrics.status_writes.inc();
    publish(ctx, listener, events::plan(previous, &next)).await;
    Ok(())
}

/// One reconciliation. A replica that does not hold the Lease makes no API call at all.
pub async fn reconcile(listener: Arc<Http3Listener>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !*ctx.leader.borrow() {
        ctx.metrics
            .reconciles
            .with_label_values(&[results::STANDBY])
            .inc();
        // Becoming leader re-reconciles every listener (see `run`).
        return Ok(Action::await_change());
    }
    if listener.metadata.deletion_timestamp.is_some() {
        // Being deleted (foreground): the garbage collector is removing what we made;
        // applying it again would fight it.
        return Ok(Action::await_change());
    }
    let _timer = ctx.metrics.reconcile_seconds.start_timer();
    let result = reconcile_as_leader(&listener, &ctx).await;
    let label = if result.is_ok() {
        results::OK
    } else {
        results::ERROR
    };
    ctx.metrics.reconciles.with_label_values(&[label]).inc();
    result
}

pub fn error_policy(listener: Arc<Http3Listener>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(listener = %listener.name_any(), %error, "reconcile failed");
    Action::requeue(ERROR_REQUEUE)
}

/// Command-line options of `h3-ingress operator`.
#[derive(Debug, Clone)]
pub struct Options {
    pub namespace: String,
    pub leader_election: bool,
    pub lease_name: String,
    pub data_plane_image: String,
    pub admin_address: SocketAddr,
}

fn identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "h3-ingress-operator".to_string());
    // Unique even if two processes share a pod name (e.g. a restarted container).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{base}_{:08x}{:04x}", nanos, std::process::id() & 0xffff)
}

/// Runs the operator until SIGTERM/SIGINT.
pub async fn run(opts: Options) -> Result<(), Error> {
    let admin = tokio::net::TcpListener::bind(opts.admin_address)
        .await
        .map_err(|e| Error::Admin(opts.admin_address, e))?;
    let client = Client::try_default().await.map_err(Error::Client)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    crate::lifecycle::cancel_on_shutdown_signals(shutdown.clone()).map_err(Error::Signals)?;
    run_with(
        client,
        opts,
        Some(admin),
        Arc::new(HttpReportFetcher::default()),
        shutdown,
    )
    .await
}

/// The operator with its client, admin socket, report source and shutdown supplied, so the
/// whole wiring can run against a mock API server in tests.
pub async fn run_with(
    client: Client,
    opts: Options,
    admin: Option<tokio::net::TcpListener>,
    reports: Arc<dyn ReportFetcher>,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), Error> {
    let metrics = OperatorMetrics::new();
    let ready = Arc::new(AtomicBool::new(false));
    if let Some(admin) = admin {
        tokio::spawn(crate::admin::serve(
            admin,
            Arc::new(AdminState {
                metrics: metrics.clone(),
                ready: ready.clone(),
            }),
            shutdown.clone(),
        ));
    }

    let listeners = Api::<Http3Listener>::all(client.clone());
    listeners
        .list(&ListParams::default().limit(1))
        .await
        .map_err(Error::CrdMissing)?;

    let id = identity();
    let (leader_rx, election) = start_election(&client, &opts, &id, &shutdown);
    tokio::spawn(export_leadership(leader_rx.clone(), metrics.clone()));
    let (ingress_store, ingress_writer) = reflector::store::<Ingress>();
    tokio::spawn(ready_once_filled(ingress_store.clone(), ready));

    let ctx = Arc::new(Context::new(
        client.clone(),
        Params {
            namespace: opts.namespace.clone(),
            default_image: opts.data_plane_image.clone(),
        },
        ingress_store,
        leader_rx.clone(),
        reports,
        Reporter {
            controller: FIELD_MANAGER.to_string(),
            instance: Some(id.clone()),
        },
        metrics,
    ));

    let controller = Controller::new(listeners, watcher::Config::default());
    let ingress_trigger = ingress_trigger(&client, ingress_writer, controller.store());
    let secret_trigger = secret_trigger(&client, ctx.clone());
    let leader_trigger = tokio_stream_from_watch(leader_rx)
        .filter_map(|is_leader| future::ready(is_leader.then_some(())));

    tracing::info!(
        namespace = %opts.namespace,
        leader_election = opts.leader_election,
        identity = %id,
        "operator starting"
    );
    controller
        .owns(
            Api::<DaemonSet>::namespaced(client.clone(), &opts.namespace),
            watcher::Config::default().labels(&format!(
                "{}={}",
                super::labels::MANAGED_BY,
                super::labels::MANAGED_BY_VALUE
            )),
        )
        .reconcile_all_on(ingress_trigger)
        .reconcile_all_on(secret_trigger)
        .reconcile_all_on(leader_trigger)
        .with_config(kube::runtime::controller::Config::default().debounce(Duration::from_secs(1)))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx)
        .for_each(|r| {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller");
            }
            future::ready(())
        })
        .await;

    shutdown.cancel();
    if let Some(h) = election {
        let _ = h.await;
    }
    Ok(())
}

/// Leadership as a watch flag: from the Lease election when it is on (the task is returned so
/// shutdown can wait for it to release the Lease), else always the leader.
fn start_election(
    client: &Client,
    opts: &Options,
    id: &str,
    shutdown: &CancellationToken,
) -> (watch::Receiver<bool>, Option<JoinHandle<()>>) {
    let (leader_tx, leader_rx) = watch::channel(!opts.leader_election);
    if !opts.leader_election {
        return (leader_rx, None);
    }
    let cfg = leader::LeaseConfig::new(&opts.namespace, &opts.lease_name, id);
    let token = shutdown.clone();
    let election = tokio::spawn(leader::run(client.clone(), cfg, leader_tx, async move {
        token.cancelled().await
    }));
    (leader_rx, Some(election))
}

/// Keeps the leader gauge equal to the leadership flag.
async fn export_leadership(mut rx: watch::Receiver<bool>, metrics: Arc<OperatorMetrics>) {
    loop {
        metrics.leader.set(i64::from(*rx.borrow_and_update()));
        if rx.changed().await.is_err() {
            break;
        }
    }
}

/// Readiness waits for the Ingress cache: before it is filled every listener would look as if
/// no Ingress wanted it.
async fn ready_once_filled(store: Store<Ingress>, ready: Arc<AtomicBool>) {
    if store.wait_until_ready().await.is_ok() {
        ready.store(true, Ordering::Relaxed);
    }
}

/// Fills the Ingress cache and reconciles every listener when an Ingress that matters to one
/// of them changes ([`ingress_is_relevant`]).
fn ingress_trigger(
    client: &Client,
    writer: reflector::store::Writer<Ingress>,
    listeners: Store<Http3Listener>,
) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    let ingresses = watcher(
        Api::<Ingress>::all(client.clone()),
        watcher::Config::default(),
    );
    reflector::reflector(writer, ingresses)
        .default_backoff()
        .touched_objects()
        .filter_map(move |r| {
            let relevant = match r {
                Ok(ing) => ingress_is_relevant(&ing, &listeners.state()),
                Err(e) => {
                    tracing::warn!(error = %e, "Ingress watch");
                    false
                }
            };
            future::ready(relevant.then_some(()))
        })
}

/// Reconciles every listener when a Secret some listener references changes. Only metadata
/// is watched: the operator never needs the key material of Secrets it does not use.
fn secret_trigger(
    client: &Client,
    ctx: Arc<Context>,
) -> impl futures_util::Stream<Item = ()> + Send + 'static {
    watcher(
        Api::<PartialObjectMeta<Secret>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .touched_objects()
    .filter_map(move |r| {
        let relevant = match r {
            Ok(s) => ctx.wants_secret(
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "Secret watch");
                false
            }
        };
        future::ready(relevant.then_some(()))
    })
}

/// The leadership flag as a stream of values (the current one first).
fn tokio_stream_from_watch(
    rx: watch::Receiver<bool>,
) -> impl futures_util::Stream<Item = bool> + Send {
    futures_util::stream::unfold((rx, true), |(mut rx, first)| async move {
        if !first && rx.changed().await.is_err() {
            return None;
        }
        let v = *rx.borrow_and_update();
        Some((v, (rx, false)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{annotations, HostStatus, Http3ListenerSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ingress(annotations: &[(&str, &str)]) -> Ingress {
        Ingress {
            metadata: ObjectMeta {
                namespace: Some("shop".into()),
                name: Some("web".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn ingress_relevance() {
        let spec: Http3ListenerSpec =
            serde_json::from_value(serde_json::json!({"upstream": {"address": "a:1"}})).unwrap();
        let mut l = Http3Listener::new("public", spec);
        let none: Vec<Arc<Http3Listener>> = vec![Arc::new(l.clone())];
        assert!(ingress_is_relevant(
            &ingress(&[(annotations::ENABLED, "true")]),
            &none
        ));
        assert!(ingress_is_relevant(
            &ingress(&[(annotations::HOSTS, "a")]),
            &none
        ));
        assert!(!ingress_is_relevant(&ingress(&[("other/x", "y")]), &none));
        l.status = Some(Http3ListenerStatus {
            hosts: vec![HostStatus {
                name: "a.example.com".into(),
                ingress: Some("shop/web".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        // The annotation was removed: still relevant, the listener must drop the host.
        assert!(ingress_is_relevant(&ingress(&[]), &[Arc::new(l)]));
    }

    #[test]
    fn notes_are_cut_at_a_char_boundary() {
        let s = truncate("é".repeat(800));
        assert!(s.len() <= MAX_NOTE && s.ends_with("..."), "{}", s.len());
        assert_eq!(truncate("short".into()), "short");
    }

    #[tokio::test]
    async fn leadership_stream_starts_with_the_current_value() {
        let (tx, rx) = watch::channel(false);
        let mut s = Box::pin(tokio_stream_from_watch(rx));
        assert_eq!(s.next().await, Some(false));
        tx.send_replace(true);
        assert_eq!(s.next().await, Some(true));
        drop(tx);
        assert_eq!(s.next().await, None);
    }
}
