//! The operator's wiring: its caches and their watches, the triggers that decide which
//! listener to reconcile when something changes ([`super::triggers`]), leader election, the
//! admin endpoint, and the kube-runtime Controller running [`super::controller::reconcile`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{future, stream, Stream, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, ListParams};
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::{Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::advertise::dns::task::{Advertisers, KubeKeys, Timing};
use super::context::{Caches, Context};
use super::controller::{error_policy, reconcile, Error};
use super::hosts::ingress::default_class;
use super::metrics::{AdminState, OperatorMetrics};
use super::reports::{HttpReportFetcher, ReportFetcher};
use super::resources::{Params, PodDefaults};
use super::secrets::SourceSecrets;
use super::watches::gateway::{GatewayApiWatch, GatewayChange};
use super::watches::traefik::{TraefikChange, TraefikWatch};
use super::watches::{self, OwnedStores};
use super::{leader, triggers, FIELD_MANAGER};
use crate::api::gateway::Gateway;
use crate::api::{Http3Listener, SecretRef};

/// How long the Controller gathers triggers for one listener before it reconciles it. Short:
/// every advertisement change waits for it (a pod that became ready, one that went), and a
/// burst of triggers is gathered anyway while a reconcile of that listener runs (kube-rs runs
/// one at a time per object and queues one more).
pub const DEBOUNCE: Duration = Duration::from_millis(250);

/// Command-line options of `h3-ingress operator`.
#[derive(Debug, Clone)]
pub struct Options {
    pub namespace: String,
    pub leader_election: bool,
    pub lease_name: String,
    pub data_plane_image: String,
    /// Where the certificate mirrors go.
    pub hosts_namespace: String,
    pub admin_address: SocketAddr,
    /// Image pull secrets and the tune container's image for every data plane pod.
    pub pod_defaults: PodDefaults,
    /// Version skew: apply this operator's CRD over an older served one (`operator::crd`).
    pub crd_upgrade: bool,
    /// The listeners this operator runs are those with this `spec.controllerName`.
    pub controller_name: String,
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
    shutdown: CancellationToken,
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
    Api::<Http3Listener>::all(client.clone())
        .list(&ListParams::default().limit(1))
        .await
        .map_err(Error::CrdMissing)?;

    let id = identity();
    let (leader_rx, election) = start_election(&client, &opts, &id, &shutdown);
    tokio::spawn(export_leadership(leader_rx.clone(), metrics.clone()));
    let (w, _tasks) = Wiring::start(&client, &opts);
    let (gateway_tx, gateway_rx) = mpsc::unbounded_channel();
    // Version skew: the served CRD's check; a new verdict reconciles every listener.
    let (crd_tx, crd_rx) = mpsc::unbounded_channel();
    let crd = super::crd::watch(&client, opts.crd_upgrade, &leader_rx, &metrics, &crd_tx);
    let gateway_api = Arc::new(GatewayApiWatch::start(
        &client,
        Arc::new(move |change| {
            let _ = gateway_tx.send(change);
        }),
    ));
    let (leases, lease_task) = watches::operator_leases(&client);
    let (traefik_tx, traefik_rx) = mpsc::unbounded_channel();
    let traefik = Arc::new(TraefikWatch::start(
        &client,
        Arc::new(move |change| {
            let _ = traefik_tx.send(change);
        }),
    ));
    let (advertise, advertise_rx) = advertisers(&client, &opts.namespace, &metrics);
    let caches = Caches {
        leases,
        ingresses: w.ingress_store.clone(),
        listeners: w.listener_store.clone(),
        classes: w.class_store.clone(),
        owned: w.owned.clone(),
        gateway_api: Some(gateway_api),
        traefik: Some(traefik),
        pods: w.pods.clone(),
        secrets: w.secrets.clone(),
    };
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            Params {
                namespace: opts.namespace.clone(),
                default_image: opts.data_plane_image.clone(),
                hosts_namespace: opts.hosts_namespace.clone(),
            },
            caches,
            leader_rx.clone(),
            reports,
            Reporter {
                controller: FIELD_MANAGER.to_string(),
                instance: Some(id.clone()),
            },
            metrics,
        )
        .with_pod_defaults(opts.pod_defaults.clone())
        .with_crd_check(crd)
        .with_controller_name(&opts.controller_name)
        .with_advertisers(advertise),
    );
    tokio::spawn(ready_once_filled(ctx.clone(), ready));
    tokio::spawn(super::advertise::altsvc::sweep::run(
        ctx.clone(),
        shutdown.clone(),
    ));
    // The first lists and Secret reads of a large cluster are a burst the allocator keeps.
    tokio::spawn(crate::memory::trim_periodically(shutdown.clone()));
    tracing::info!(
        namespace = %opts.namespace,
        hosts_namespace = %opts.hosts_namespace,
        leader_election = opts.leader_election,
        controller_name = %opts.controller_name,
        identity = %id,
        "operator starting"
    );
    let triggers = Triggers {
        gateway_rx,
        traefik_rx,
        crd_rx,
        leader_rx,
        advertise_rx,
    };
    controller(&client, &opts, w, triggers, ctx.clone())
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
    lease_task.abort();
    let _ = election.await;
    Ok(())
}

/// The caches the controller's watches fill, with the writers and streams not yet polled.
struct Wiring {
    ingress_store: Store<Ingress>,
    ingress_writer: reflector::store::Writer<Ingress>,
    listener_store: Store<Http3Listener>,
    listener_writer: reflector::store::Writer<Http3Listener>,
    class_store: Store<IngressClass>,
    class_writer: reflector::store::Writer<IngressClass>,
    ds_writer: reflector::store::Writer<DaemonSet>,
    owned: OwnedStores,
    pods: Store<k8s_openapi::api::core::v1::Pod>,
    secrets: SourceSecrets,
    secret_changes: std::pin::Pin<Box<dyn Stream<Item = SecretRef> + Send>>,
}

impl Wiring {
    fn start(client: &Client, opts: &Options) -> (Self, (watches::Tasks, JoinHandle<()>)) {
        let (ingress_store, ingress_writer) = reflector::store::<Ingress>();
        let (listener_store, listener_writer) = reflector::store::<Http3Listener>();
        let (class_store, class_writer) = reflector::store::<IngressClass>();
        let (ds_store, ds_writer) = reflector::store::<DaemonSet>();
        let (owned, owned_tasks) =
            OwnedStores::start(client, &opts.namespace, &opts.hosts_namespace, &ds_store);
        let (pods, pod_task) = watches::pod_cache(client, &opts.namespace);
        let (secrets, secret_events) = SourceSecrets::watch(client, &opts.hosts_namespace);
        let log = super::watches::filter::ErrorLog::default();
        let secret_changes = secret_events
            .filter_map(move |r| {
                future::ready(match r {
                    Ok(m) => Some(SecretRef {
                        namespace: m.namespace().unwrap_or_default(),
                        name: m.name_any(),
                    }),
                    Err(e) => {
                        log.warn("Secret", &e);
                        None
                    }
                })
            })
            .boxed();
        let tasks = (owned_tasks, pod_task);
        let w = Wiring {
            ingress_store,
            ingress_writer,
            listener_store,
            listener_writer,
            class_store,
            class_writer,
            ds_writer,
            owned,
            pods,
            secrets,
            secret_changes,
        };
        (w, tasks)
    }
}

/// The channels the Controller's triggers read besides the watches.
struct Triggers {
    gateway_rx: mpsc::UnboundedReceiver<GatewayChange>,
    traefik_rx: mpsc::UnboundedReceiver<TraefikChange>,
    /// The served CRD's verdict changed.
    crd_rx: mpsc::UnboundedReceiver<()>,
    leader_rx: watch::Receiver<bool>,
    /// A listener's DNS task has news for its status.
    advertise_rx: mpsc::UnboundedReceiver<String>,
}

/// The Controller with every trigger: a listener's own changes; its DaemonSet's; Ingress,
/// Secret and Gateway API changes mapped to the listeners they concern; IngressClass changes
/// (the default class), any listener's spec change (ports may change hands), a new verdict on
/// the served CRD, a change of the running operators and becoming leader reconcile every
/// listener.
fn controller(
    client: &Client,
    opts: &Options,
    w: Wiring,
    t: Triggers,
    ctx: Arc<Context>,
) -> Controller<Http3Listener> {
    let Triggers {
        gateway_rx,
        traefik_rx,
        crd_rx,
        leader_rx,
        advertise_rx,
    } = t;
    let (any_listener_tx, any_listener_rx) = mpsc::unbounded_channel();
    let refs = |names: Vec<String>| stream::iter(names.into_iter().map(|n| ObjectRef::new(&n)));
    let c = ctx.clone();
    let ingresses = watches::ingress_changes(client, w.ingress_writer).flat_map(move |ing| {
        let classes = c.caches.classes.state();
        let default = default_class(classes.iter().map(|c| c.as_ref()));
        let listeners = c.caches.listeners.state();
        // Computed under the lock, not on a copy: thousands of Ingress events arrive while a
        // cluster's hosts are created, and the memory holds every host's status.
        let memory = c.memory.lock().expect("not poisoned");
        refs(triggers::ingress_listeners(
            &ing,
            default.as_deref(),
            &listeners,
            &memory,
        ))
    });
    let c = ctx.clone();
    let secrets = w.secret_changes.flat_map(move |r| {
        let memory = c.memory.lock().expect("not poisoned");
        refs(triggers::secret_listeners(&r, &memory))
    });
    let c = ctx.clone();
    let gateways = stream_from_channel(gateway_rx).flat_map(move |change| {
        let listeners = c.caches.listeners.state();
        let class_of = |key: &str| {
            let (ns, name) = key.split_once('/')?;
            let gw = c.caches.gateway_api.as_ref()?;
            let found = gw
                .gateways
                .get(&ObjectRef::<Gateway>::new(name).within(ns))?;
            Some(found.spec.gateway_class_name.clone())
        };
        let memory = c.memory.lock().expect("not poisoned");
        refs(triggers::gateway_listeners(
            &change, class_of, &listeners, &memory,
        ))
    });
    let c = ctx.clone();
    let traefik = stream_from_channel(traefik_rx).flat_map(move |change| {
        c.metrics.set_traefik_objects(&c.traefik_objects());
        let memory = c.memory.lock().expect("not poisoned");
        refs(triggers::traefik_listeners(&change, &memory))
    });
    Controller::for_stream(
        watches::listener_changes(client, w.listener_writer, any_listener_tx),
        w.listener_store,
    )
    .watches_stream(
        watches::daemon_set_changes(client, &opts.namespace, w.ds_writer),
        watches::owning_listeners,
    )
    .reconcile_on(ingresses)
    .reconcile_on(secrets)
    .reconcile_on(gateways)
    .reconcile_on(traefik)
    .reconcile_on(stream_from_channel(advertise_rx).map(|n| ObjectRef::new(&n)))
    .reconcile_all_on(watches::class_trigger(client, w.class_writer))
    .reconcile_all_on(stream_from_channel(any_listener_rx))
    .reconcile_all_on(stream_from_channel(crd_rx))
    .reconcile_all_on(registry_changes(ctx.clone()))
    .reconcile_all_on(
        tokio_stream_from_watch(leader_rx)
            .filter_map(|is_leader| future::ready(is_leader.then_some(()))),
    )
    .with_config(kube::runtime::controller::Config::default().debounce(DEBOUNCE))
}

/// How often the running operators are looked at: an operator's Lease that expires sends no
/// event of its own.
const REGISTRY_POLL: Duration = Duration::from_secs(5);

/// Fires when the running operators or their controller names change (one started, stopped or
/// was renamed): every listener may have changed hands (`operator::ownership`).
fn registry_changes(ctx: Arc<Context>) -> impl futures_util::Stream<Item = ()> + Send {
    stream::unfold((ctx, None), |(ctx, mut last)| async move {
        loop {
            tokio::time::sleep(REGISTRY_POLL).await;
            if !watches::listed(&ctx.caches.leases) {
                continue;
            }
            let now = ctx.running_operators();
            if last.as_ref() == Some(&now) {
                continue;
            }
            let changed = last.is_some();
            if changed {
                tracing::info!(operators = ?now, "the running operators changed");
            }
            last = Some(now);
            if changed {
                return Some(((), (ctx, last)));
            }
        }
    })
}

/// How often readiness looks at the caches, and how often it names those still empty.
const CACHE_POLL: Duration = Duration::from_millis(100);
const CACHE_WAIT_LOG: Duration = Duration::from_secs(30);

/// A channel's messages as a stream (it ends when every sender is gone).
fn stream_from_channel<T: Send + 'static>(
    rx: mpsc::UnboundedReceiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|v| (v, rx)) })
}

/// Leadership as a watch flag: from the Lease election when it is on, else always the leader.
/// The Lease is kept either way (it registers this operator, `operator::ownership`); the task
/// is returned so shutdown can wait for it to release the Lease.
fn start_election(
    client: &Client,
    opts: &Options,
    id: &str,
    shutdown: &CancellationToken,
) -> (watch::Receiver<bool>, JoinHandle<()>) {
    let (leader_tx, leader_rx) = watch::channel(!opts.leader_election);
    let cfg =
        leader::LeaseConfig::new(&opts.namespace, &opts.lease_name, id, &opts.controller_name);
    let token = shutdown.clone();
    let election = tokio::spawn(leader::run(
        client.clone(),
        cfg,
        opts.leader_election,
        leader_tx,
        async move { token.cancelled().await },
    ));
    (leader_rx, election)
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

/// Readiness, and reconciles, wait for every cache: before the Ingress or Secret caches are
/// filled every host would look unwanted or its Secret missing, and the reconcile would
/// delete the mirrors the running data plane serves. A cache that takes long is named in a
/// warning (once per `CACHE_WAIT_LOG`), so an unready replica says what it waits for.
async fn ready_once_filled(ctx: Arc<Context>, ready: Arc<AtomicBool>) {
    let start = tokio::time::Instant::now();
    let mut logged = start;
    loop {
        let pending = ctx.pending_caches();
        if pending.is_empty() {
            tracing::info!(
                elapsed_ms = start.elapsed().as_millis() as u64,
                "caches filled: ready"
            );
            ctx.caches_ready.store(true, Ordering::Release);
            ready.store(true, Ordering::Relaxed);
            return;
        }
        if logged.elapsed() >= CACHE_WAIT_LOG {
            logged = tokio::time::Instant::now();
            tracing::warn!(waiting_s = start.elapsed().as_secs(), caches = ?pending, "caches not filled yet: not ready");
        }
        tokio::time::sleep(CACHE_POLL).await;
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

/// The listeners' DNS publishing tasks, and the names of the listeners whose task's state
/// changed: each asks for its listener's reconcile (the status says it).
fn advertisers(
    client: &Client,
    namespace: &str,
    metrics: &OperatorMetrics,
) -> (Arc<Advertisers>, mpsc::UnboundedReceiver<String>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let advertise = Arc::new(Advertisers::new(
        Arc::new(KubeKeys {
            client: client.clone(),
            namespace: namespace.to_string(),
        }),
        Arc::new(move |listener: &str| {
            let _ = tx.send(listener.to_string());
        }),
        FIELD_MANAGER,
        Timing::default(),
        metrics.dns.clone(),
    ));
    (advertise, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

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
