//! The operator's I/O shell: a kube-runtime Controller over `Http3Listener`s that applies the
//! objects [`super::resources`] builds, reads the pods' `/status`, and writes the status
//! [`super::status`] computes and the events [`super::events`] plans. Only the Lease holder
//! writes; a standby replica keeps its caches warm and does nothing else.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{future, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::apply::{self, ApplyError};
use super::events::{self, PlannedEvent, Target};
use super::metrics::{results, AdminState, OperatorMetrics};
use super::reports::{status_address, HttpReportFetcher, ReportFetcher};
use super::resources::{self, label_selector, Params, PodDefaults};
use super::status::{self, Blocker, PodReport};
use super::watches::{self, OwnedStores};
use super::{conflicts, leader, FIELD_MANAGER};
use crate::api::altsvc::{controller_of, IngressController};
use crate::api::gateway::{Gateway, HTTPRoute};
use crate::api::{reasons, Http3Listener, Http3ListenerStatus, SecretRef};
use crate::config::gateway::GatewayObjects;
use crate::config::kube::{
    default_class, ingress_key, referenced_secrets, resolve_hosts, with_default_class,
    ResolvedHosts, SecretMap,
};
use crate::gateway_api::GatewayApiWatch;

/// How often a listener is reconciled without any change, to refresh the pods' reports.
pub const REQUEUE: Duration = Duration::from_secs(60);
/// Retry delay after a failed reconciliation.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Delay while running pods have not loaded a host the operator resolved yet. Nothing tells
/// the operator when they have (they load it from their own watches within seconds), so
/// without a prompt look `kubectl get h3l` would show the host pending for a whole
/// [`REQUEUE`] after an Ingress was annotated, or still refused (the pods' earlier word) after
/// a ReferenceGrant permitted its Secret.
pub const SETTLE_REQUEUE: Duration = Duration::from_secs(3);
/// Prompt looks in a row per listener, so a pod that never loads a host does not keep the
/// operator busy (it then shows what the pods say, and looks every [`REQUEUE`]).
pub const SETTLE_ATTEMPTS: u32 = 20;
/// Kubernetes limits an event note to 1 kB.
const MAX_NOTE: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Written to the status too (`Ready=False`), unless the API server did not answer.
    #[error("{0}")]
    Apply(#[from] ApplyError),
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

/// The operator's caches: what reconciles read instead of asking the API server.
#[derive(Clone)]
pub struct Caches {
    /// All Ingresses, kept by a reflector the controller polls.
    pub ingresses: Store<Ingress>,
    /// All listeners (the controller's own store), for port conflicts between them.
    pub listeners: Store<Http3Listener>,
    /// All IngressClasses: which one is the default.
    pub classes: Store<IngressClass>,
    /// The Roles, RoleBindings and Services the operator made, for pruning.
    pub owned: OwnedStores,
    /// Gateways, HTTPRoutes and ReferenceGrants; `None` leaves the Gateway API out entirely.
    pub gateway_api: Option<Arc<GatewayApiWatch>>,
}

/// Everything a reconciliation needs; shared by all of them.
pub struct Context {
    pub client: Client,
    pub params: Params,
    pub pod_defaults: PodDefaults,
    pub ingresses: Store<Ingress>,
    pub listeners: Store<Http3Listener>,
    pub classes: Store<IngressClass>,
    pub owned: OwnedStores,
    pub gateway_api: Option<Arc<GatewayApiWatch>>,
    pub leader: watch::Receiver<bool>,
    pub reports: Arc<dyn ReportFetcher>,
    pub recorder: Recorder,
    pub metrics: Arc<OperatorMetrics>,
    /// Secrets each listener references, so a Secret change re-reconciles only when it matters.
    pub secret_interest: Mutex<BTreeMap<String, BTreeSet<SecretRef>>>,
    /// Prompt looks in a row per listener whose pods are still loading a host.
    pub settling: Mutex<BTreeMap<String, u32>>,
    /// Version skew: the served CRD against this binary's schema (`operator::crd`).
    pub crd: Arc<super::crd::CrdCheck>,
}

impl Context {
    pub fn new(
        client: Client,
        params: Params,
        caches: Caches,
        leader: watch::Receiver<bool>,
        reports: Arc<dyn ReportFetcher>,
        reporter: Reporter,
        metrics: Arc<OperatorMetrics>,
    ) -> Self {
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            params,
            pod_defaults: PodDefaults::default(),
            ingresses: caches.ingresses,
            listeners: caches.listeners,
            classes: caches.classes,
            owned: caches.owned,
            gateway_api: caches.gateway_api,
            leader,
            reports,
            metrics,
            secret_interest: Mutex::new(BTreeMap::new()),
            settling: Mutex::new(BTreeMap::new()),
            crd: super::crd::CrdCheck::disabled(),
        }
    }

    /// The check of the served CRD whose verdict the status carries as `CRDCurrent`.
    pub fn with_crd_check(mut self, crd: Arc<super::crd::CrdCheck>) -> Self {
        self.crd = crd;
        self
    }

    /// What goes into every data plane pod besides the listener's spec.
    pub fn with_pod_defaults(mut self, pod: PodDefaults) -> Self {
        self.pod_defaults = pod;
        self
    }

    /// Every Ingress as the listeners see it: one without a class belongs to the default
    /// IngressClass (the data plane counts them the same way).
    pub fn ingresses(&self) -> Vec<Arc<Ingress>> {
        let classes = self.classes.state();
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        with_default_class(&self.ingresses.state(), default.as_deref())
    }

    /// The Gateway API objects seen so far (none without the Gateway API).
    pub fn gateway_objects(&self) -> GatewayObjects {
        self.gateway_api
            .as_ref()
            .map(|g| g.objects())
            .unwrap_or_default()
    }

    /// Whether the Gateway API kinds have been listed (or found not served) once; before
    /// that every route's host would look unwanted.
    pub fn gateway_api_synced(&self) -> bool {
        self.gateway_api.as_ref().is_none_or(|g| g.synced())
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
            Target::HttpRoute(key) => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let found = ctx
                    .gateway_api
                    .as_ref()
                    .and_then(|g| g.routes.get(&ObjectRef::<HTTPRoute>::new(name).within(ns)));
                match found {
                    Some(r) => r.object_ref(&()),
                    None => continue,
                }
            }
            Target::Gateway(key) => {
                let (ns, name) = key.split_once('/').unwrap_or(("", key));
                let found = ctx
                    .gateway_api
                    .as_ref()
                    .and_then(|g| g.gateways.get(&ObjectRef::<Gateway>::new(name).within(ns)));
                match found {
                    Some(gw) => gw.object_ref(&()),
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

/// What the reconcile found out about the data plane, for the status.
#[derive(Default)]
struct Observed {
    blocker: Option<Blocker>,
    daemon_set: Option<DaemonSetStatus>,
    pods: Vec<PodReport>,
    failed_create: Option<String>,
    /// An apply or prune that failed: reported in the status, then returned as the error.
    failure: Option<ApplyError>,
}

impl Observed {
    fn blocked(reason: &'static str, message: String) -> Self {
        Self {
            blocker: Some(Blocker { reason, message }),
            ..Default::default()
        }
    }
}

/// Applies the data plane unless the spec is invalid or its ports are taken, prunes what it
/// no longer needs, and reads its pods. API errors the API server answered become a blocker
/// in the status; only an unreachable API server is returned as an error.
async fn observe_data_plane(
    listener: &Http3Listener,
    refs: &BTreeSet<SecretRef>,
    ctx: &Context,
) -> Result<Observed, Error> {
    let name = listener.name_any();
    let d = match resources::desired(listener, refs, &ctx.params, &ctx.pod_defaults) {
        Ok(d) => d,
        Err(e) => {
            // Leave the running data plane alone: it keeps serving its last good config.
            tracing::warn!(listener = %name, error = %e, "invalid listener");
            return Ok(Observed::blocked(reasons::INVALID_SPEC, e.to_string()));
        }
    };
    if let Some(c) = conflicts::port_conflict(listener, &ctx.listeners.state()) {
        // Nothing is applied, and a DaemonSet this listener already runs is left alone: the
        // operator never takes a serving data plane down over another object's edit.
        tracing::warn!(listener = %name, other = %c.other, port = c.port.port, "port conflict");
        return Ok(Observed::blocked(reasons::PORT_CONFLICT, c.message()));
    }
    let applied = match apply::apply_all(ctx, &d).await {
        Ok(ds) => apply::prune(ctx, &name, &d).await.map(|()| ds),
        Err(e) => Err(e),
    };
    let ds = match applied {
        Ok(ds) => ds,
        Err(e) => {
            let Some(blocker) = apply::blocker(&e) else {
                return Err(e.into());
            };
            tracing::warn!(listener = %name, error = %e, "apply failed");
            return Ok(Observed {
                blocker: Some(blocker),
                failure: Some(e),
                ..Default::default()
            });
        }
    };
    let metrics = resources::validate(listener)
        .map(|c| c.metrics_address)
        .expect("desired() validated the spec");
    let pods = pod_reports(ctx, &name, metrics).await?;
    let failed_create = if apply::pods_missing(&ds) {
        apply::failed_create(ctx, &ds).await
    } else {
        None
    };
    Ok(Observed {
        daemon_set: ds.status,
        pods,
        failed_create,
        ..Default::default()
    })
}

/// The leader's reconciliation: apply the data plane, read its pods, write the status.
async fn reconcile_as_leader(listener: &Http3Listener, ctx: &Context) -> Result<Action, Error> {
    let name = listener.name_any();
    if !ctx.gateway_api_synced() || ctx.crd.pending() {
        // Its first lists are on the way; the sync itself triggers every listener again.
        // (Likewise the first verdict on the served CRD, operator::crd.)
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let ingresses = ctx.ingresses();
    let gateway_api = ctx.gateway_objects();
    let refs = referenced_secrets(listener, ingresses.iter().map(|i| i.as_ref()), &gateway_api);
    ctx.secret_interest
        .lock()
        .expect("not poisoned")
        .insert(name.clone(), refs.clone());
    let secrets = fetch_secrets(ctx, &refs).await?;
    let now = Timestamp::now();
    let resolved = resolve_hosts(
        listener,
        ingresses.iter().map(|i| i.as_ref()),
        &gateway_api,
        &secrets,
        now.as_second(),
    );
    let observed = observe_data_plane(listener, &refs, ctx).await?;

    let controllers = ingress_controllers(&ingresses, &resolved);
    let inputs = status::Inputs {
        controllers: &controllers,
        alt_svc_max_age: listener.spec.alt_svc.max_age_seconds,
        generation: listener.metadata.generation,
        port: listener.spec.port,
        blocker: observed.blocker,
        failed_create: observed.failed_create,
        hosts: &resolved.reports,
        daemon_set: observed.daemon_set.as_ref(),
        pods: &observed.pods,
        previous: listener.status.as_ref(),
        now,
    };
    let mut next = status::aggregate(&inputs);
    // Version skew: the CRDCurrent condition (operator::crd).
    let (crd, previous) = (ctx.crd.verdict(), listener.status.as_ref());
    super::crd::set_condition(&mut next, crd.as_ref(), previous, now, inputs.generation);
    let loading = status::hosts_loading(&inputs);
    write_status(ctx, listener, next).await?;
    match observed.failure {
        // Said in the status; retried on the error policy's schedule.
        Some(e) => Err(e.into()),
        None => Ok(Action::requeue(next_look(ctx, &name, loading))),
    }
}

/// When to look at a listener again: promptly while its pods load a host, up to
/// [`SETTLE_ATTEMPTS`] times in a row, else after [`REQUEUE`].
fn next_look(ctx: &Context, listener: &str, loading: bool) -> Duration {
    let mut settling = ctx.settling.lock().expect("not poisoned");
    if !loading {
        settling.remove(listener);
        return REQUEUE;
    }
    let looks = settling.entry(listener.to_string()).or_insert(0);
    *looks += 1;
    if *looks <= SETTLE_ATTEMPTS {
        SETTLE_REQUEUE
    } else {
        REQUEUE
    }
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
    // Version skew: fields a newer CRD added are read past, and said once.
    crate::skew::note_unknown_fields(&listener);
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
    /// Image pull secrets and the tune container's image for every data plane pod.
    pub pod_defaults: PodDefaults,
    /// Version skew: apply this operator's CRD over an older served one (`operator::crd`).
    pub crd_upgrade: bool,
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
    let (admin, _) =
        crate::admin::bind(opts.admin_address).map_err(|e| Error::Admin(opts.admin_address, e))?;
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
    let (listener_store, listener_writer) = reflector::store::<Http3Listener>();
    let (class_store, class_writer) = reflector::store::<IngressClass>();
    let (owned, _owned_watches) = OwnedStores::start(&client, &opts.namespace);
    let (gateway_tx, gateway_rx) = mpsc::unbounded_channel();
    // Version skew: the served CRD's check; its changes reconcile all, as Gateway API syncs do.
    let crd = super::crd::watch(&client, opts.crd_upgrade, &leader_rx, &metrics, &gateway_tx);
    let gateway_api = Arc::new(GatewayApiWatch::start(
        &client,
        Arc::new(move || {
            let _ = gateway_tx.send(());
        }),
    ));
    tokio::spawn(ready_once_filled(
        ingress_store.clone(),
        owned.clone(),
        ready,
    ));

    let ctx = Arc::new(
        Context::new(
            client.clone(),
            Params {
                namespace: opts.namespace.clone(),
                default_image: opts.data_plane_image.clone(),
            },
            Caches {
                ingresses: ingress_store,
                listeners: listener_store.clone(),
                classes: class_store,
                owned,
                gateway_api: Some(gateway_api),
            },
            leader_rx.clone(),
            reports,
            Reporter {
                controller: FIELD_MANAGER.to_string(),
                instance: Some(id.clone()),
            },
            metrics,
        )
        .with_pod_defaults(opts.pod_defaults.clone())
        .with_crd_check(crd),
    );

    tracing::info!(
        namespace = %opts.namespace,
        leader_election = opts.leader_election,
        identity = %id,
        "operator starting"
    );
    let (any_listener_tx, any_listener_rx) = mpsc::unbounded_channel();
    let controller = Controller::for_stream(
        watches::listener_changes(&client, listener_writer, any_listener_tx),
        listener_store.clone(),
    )
    .watches_stream(
        watches::daemon_set_changes(&client, &opts.namespace),
        watches::owning_listeners,
    )
    .reconcile_all_on(watches::ingress_trigger(
        &client,
        ingress_writer,
        listener_store,
    ))
    .reconcile_all_on(watches::secret_trigger(&client, ctx.clone()))
    .reconcile_all_on(watches::class_trigger(&client, class_writer))
    .reconcile_all_on(stream_from_channel(any_listener_rx))
    .reconcile_all_on(stream_from_channel(gateway_rx))
    .reconcile_all_on(
        tokio_stream_from_watch(leader_rx)
            .filter_map(|is_leader| future::ready(is_leader.then_some(()))),
    );
    controller
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

/// A channel's messages as a stream (it ends when every sender is gone).
fn stream_from_channel(
    rx: mpsc::UnboundedReceiver<()>,
) -> impl futures_util::Stream<Item = ()> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
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

/// Readiness waits for the Ingress cache (before it is filled every listener would look as if
/// no Ingress wanted it) and the owned-object caches (pruning reads them).
async fn ready_once_filled(store: Store<Ingress>, owned: OwnedStores, ready: Arc<AtomicBool>) {
    if store.wait_until_ready().await.is_ok() && owned.wait_until_ready().await {
        ready.store(true, Ordering::Relaxed);
    }
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
