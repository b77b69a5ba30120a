//! One reconciliation of an `Http3Listener` (the I/O shell around pure parts): resolve its hosts
//! from the caches, write the certificate mirrors [`super::mirrors`] plans, apply what
//! [`super::resources`] builds (only what changed), read the pods' `/status`, and write the
//! status [`super::status`] computes and the events [`super::events`] plans. Only the Lease
//! holder writes; a standby replica keeps its caches warm and does nothing else. The wiring
//! is [`super::run`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future;
use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

use super::advertise::altsvc;
use super::advertise::dns::listener as dns;
use super::advertise::dns::task::Desired;
use super::apply::{self, ApplyError};
pub use super::context::{Caches, Context, Memory};
use super::events::{self, PlannedEvent, Target};
use super::hosts::gateway::gateway_upstream;
use super::hosts::resolve::resolve_wanted;
use super::hosts::{gather_wanted, policies_for_listener, PolicyScan, ServedHost, Wanted};
use super::hosts::{CertSource, WantedHost};
use super::metrics::results;
use super::ownership::{self, Ownership};
use super::reports::status_address;
use super::status::{self, Blocker, PodReport};
use super::watches::owned_by;
use super::{conflicts, labels, mirrors, placement, podstate, resources, text, FIELD_MANAGER};
use crate::api::mirror::mirror_name;
use crate::api::{
    conditions, host_states, reasons, AdvertiseStatus, HostStatus, Http3Listener,
    Http3ListenerStatus,
};

/// How often a listener is reconciled without any change, to refresh the pods' reports.
pub const REQUEUE: Duration = Duration::from_secs(60);
/// Retry delay after a failed reconciliation.
pub const ERROR_REQUEUE: Duration = Duration::from_secs(15);
/// Delay while running pods have not loaded a host the operator resolved yet. Nothing tells
/// the operator when they have (they load it from their own watches within seconds), so
/// without a prompt look `kubectl get h3l` would show the host pending for a whole
/// [`REQUEUE`] after an Ingress was annotated, or still refused (the pods' earlier word) after
/// a ReferenceGrant permitted its Secret; and the advertisements (`spec.advertise`), which
/// follow what the status calls served, would wait as long.
pub const SETTLE_REQUEUE: Duration = Duration::from_secs(1);
/// Prompt looks in a row per listener (a minute of them), so a pod that never loads a host
/// does not keep the operator busy (it then shows what the pods say, and looks every
/// [`REQUEUE`]). A look reads the caches and the pods' `/status`, no API call.
pub const SETTLE_ATTEMPTS: u32 = 60;
/// How soon a listener is looked at again while one of its Secrets cannot be read (its
/// hosts keep the last good certificate meanwhile).
pub const UNREADABLE_REQUEUE: Duration = Duration::from_secs(10);
/// How often a reconcile that came before the caches were filled looks again.
pub const CACHE_WAIT: Duration = Duration::from_secs(2);
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

/// Reads `/status` from every data plane pod of the listener (from the pod cache: no API
/// call), through the operator's gate (`reports::STATUS_FAN_OUT`: so many at once, each
/// within its timeout).
async fn pod_reports(ctx: &Context, listener: &str, metrics: SocketAddr) -> Vec<PodReport> {
    let mut pods: Vec<Arc<Pod>> = ctx
        .caches
        .pods
        .state()
        .into_iter()
        .filter(|p| p.labels().get(labels::INSTANCE).map(String::as_str) == Some(listener))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    pods.sort_by_key(|p| p.name_any());
    let fetches = pods.iter().map(|p| {
        let name = p.name_any();
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
        let ready = pod_ready(p);
        let trouble = p
            .status
            .as_ref()
            .and_then(|s| podstate::container_trouble(s, resources::CONTAINER_NAME));
        async move {
            let report = match ip {
                None => Err("pod has no IP yet".to_string()),
                Some(ip) => match status_address(&ip, metrics) {
                    Ok(addr) => ctx.status_gate.fetch(ctx.reports.as_ref(), addr).await,
                    Err(e) => Err(e),
                },
            };
            PodReport {
                pod: name,
                node,
                ready,
                report,
                trouble,
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
    out
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The reference of the cached object `key` (`namespace/name`) names, if it is still cached.
fn cached_ref<K>(store: Option<&Store<K>>, key: &str) -> Option<ObjectReference>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let obj = store?.get(&ObjectRef::new(name).within(ns))?;
    Some(obj.object_ref(&()))
}

async fn publish(ctx: &Context, listener: &Http3Listener, planned: Vec<PlannedEvent>) {
    for ev in planned {
        let gateway_api = ctx.caches.gateway_api.as_deref();
        let found = match &ev.target {
            Target::Listener => Some(listener.object_ref(&())),
            Target::Ingress(key) => cached_ref(Some(&ctx.caches.ingresses), key),
            Target::HttpRoute(key) => cached_ref(gateway_api.map(|g| &g.routes), key),
            Target::Gateway(key) => cached_ref(gateway_api.map(|g| &g.gateways), key),
        };
        // Deleted meanwhile: the listener's event says it all.
        let Some(reference) = found else { continue };
        let type_ = if ev.warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let event = KubeEvent {
            type_,
            reason: ev.reason.clone(),
            note: Some(text::cut(&ev.note, MAX_NOTE)),
            action: events::action(ev.host.as_deref()),
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
    /// The mirrors as written, when they could be.
    mirrors: Option<mirrors::Synced>,
    /// An apply, prune or mirror write that failed: reported in the status, then returned as
    /// the error.
    failure: Option<ApplyError>,
}

impl Observed {
    fn blocked(reason: &'static str, message: String) -> Self {
        Self {
            blocker: Some(Blocker { reason, message }),
            ..Default::default()
        }
    }

    /// A failed apply the API server answered, for the status (with the mirrors already
    /// written, if any); `Err` when it did not answer at all.
    fn failed(e: ApplyError, mirrors: Option<mirrors::Synced>) -> Result<Self, Box<ApplyError>> {
        let Some(blocker) = apply::blocker(&e) else {
            return Err(Box::new(e));
        };
        Ok(Self {
            blocker: Some(blocker),
            failure: Some(e),
            mirrors,
            ..Default::default()
        })
    }
}

/// Applies the data plane and the certificate mirrors unless the spec is invalid or its ports
/// are taken, prunes what it no longer needs, and reads its pods. API errors the API server
/// answered become a blocker in the status; only an unreachable API server is returned as an
/// error.
async fn observe_data_plane(
    listener: &Http3Listener,
    wanted: Vec<mirrors::DesiredMirror>,
    held: &BTreeSet<String>,
    ctx: &Context,
) -> Result<Observed, Error> {
    let name = listener.name_any();
    let mut d = match resources::desired(listener, &ctx.params, &ctx.pod_defaults) {
        Ok(d) => d,
        Err(e) => {
            // Leave the running data plane alone: it keeps serving its last good config.
            tracing::warn!(listener = %name, error = %e, "invalid listener");
            return Ok(Observed::blocked(reasons::INVALID_SPEC, e.to_string()));
        }
    };
    if let Some(c) = conflicts::port_conflict(listener, &ctx.caches.listeners.state()) {
        // Nothing is applied, and a DaemonSet this listener already runs is left alone: the
        // operator never takes a serving data plane down over another object's edit.
        tracing::warn!(listener = %name, other = %c.other, port = c.port.port, "port conflict");
        return Ok(Observed::blocked(reasons::PORT_CONFLICT, c.message()));
    }
    if solo_pods(ctx, &name) {
        resources::without_surge(&mut d.daemon_set, listener);
    }
    // Mirrors first: a new pod that starts with the DaemonSet finds its hosts.
    let synced = match mirrors::sync(ctx, listener, wanted, held).await {
        Ok(s) => s,
        Err(e) => return Observed::failed(e, None).map_err(|e| Error::Apply(*e)),
    };
    ctx.metrics.mirror_writes.inc_by(synced.written as u64);
    ctx.metrics.mirror_deletes.inc_by(synced.deleted as u64);
    let applied = match apply::apply_all(ctx, &name, &d).await {
        Ok(ds) => apply::prune(ctx, &name, &d).await.map(|()| ds),
        Err(e) => Err(e),
    };
    let ds = match applied {
        Ok(ds) => ds,
        Err(e) => return Observed::failed(e, Some(synced)).map_err(|e| Error::Apply(*e)),
    };
    let metrics = resources::validate(listener)
        .map(|c| c.metrics_address)
        .expect("desired() validated the spec");
    let pods = pod_reports(ctx, &name, metrics).await;
    let failed_create = match &ds {
        Some(ds) if apply::pods_missing(ds) => apply::failed_create(ctx, ds).await,
        _ => None,
    };
    Ok(Observed {
        daemon_set: ds.and_then(|d| d.status),
        pods,
        failed_create,
        mirrors: Some(synced),
        ..Default::default()
    })
}

/// Whether some pod of the listener cannot share its port with a new one (it holds the port
/// alone, or runs under another uid): then a roll must not surge
/// ([`resources::without_surge`]).
fn solo_pods(ctx: &Context, listener: &str) -> bool {
    ctx.caches.pods.state().iter().any(|p| {
        p.labels().get(labels::INSTANCE).map(String::as_str) == Some(listener)
            && resources::cannot_share_port(p)
    })
}

/// The hosts a listener wants, their policies, and what its triggers must watch for it.
fn gather(listener: &Http3Listener, ctx: &Context) -> (Vec<WantedHost>, PolicyScan, Memory) {
    let ingresses = ctx.ingresses();
    let gateway_api = ctx.gateway_objects();
    let Wanted {
        hosts: wanted,
        certificate_ingresses,
    } = gather_wanted(listener, ingresses.iter().map(|i| i.as_ref()), &gateway_api);
    let scan = policies_for_listener(
        listener,
        &wanted,
        ingresses.iter().map(|i| i.as_ref()),
        &gateway_api,
        &ctx.traefik_objects(),
        &ctx.traefik_classes(),
    );
    let mut seen = Memory {
        ingresses: scan
            .ingresses
            .union(&certificate_ingresses)
            .cloned()
            .collect(),
        traefik: scan.traefik.clone(),
        ..Default::default()
    };
    for w in &wanted {
        if let CertSource::Secret(s) = &w.cert {
            seen.secrets.insert(s.clone());
        }
        if let Some(i) = &w.origin.ingress {
            seen.ingresses.insert(i.clone());
            seen.ingress_hosts
                .insert(w.name.trim_end_matches('.').to_ascii_lowercase());
        }
        if let Some(g) = &w.origin.gateway {
            seen.gateways.insert(g.clone());
            seen.routes.extend(w.origin.http_route.clone());
        }
    }
    (wanted, scan, seen)
}

/// The leader's reconciliation: resolve the hosts, write the mirrors and apply the data plane,
/// read its pods, write the status.
async fn reconcile_as_leader(listener: &Http3Listener, ctx: &Context) -> Result<Action, Error> {
    let name = listener.name_any();
    if !ctx.caches_ready.load(std::sync::atomic::Ordering::Acquire) {
        // Before the caches are filled every host would look unwanted and the mirrors the
        // data plane serves would be deleted.
        return Ok(Action::requeue(CACHE_WAIT));
    }
    if !ctx.gateway_api_synced() || !ctx.traefik_synced() || ctx.crd.pending() {
        // Its first lists are on the way; the sync itself triggers every listener again.
        // (Likewise the first verdict on the served CRD, operator::crd.)
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    ctx.advertise.withdraw_gone(|n| listener_exists(ctx, n));
    match ctx.ownership(listener) {
        Ownership::Mine => {}
        Ownership::Other { namespace } => return hand_over(listener, &namespace, ctx).await,
        refused => return refuse(listener, &refused, ctx).await,
    }
    let (wanted, scan, seen) = gather(listener, ctx);
    let refs = seen.secrets.clone();
    ctx.remember(&name, |m| {
        m.secrets = seen.secrets;
        m.ingresses = seen.ingresses;
        m.ingress_hosts = seen.ingress_hosts;
        m.gateways = seen.gateways;
        m.routes = seen.routes;
        m.traefik = seen.traefik;
    });
    let secrets = &ctx.caches.secrets;
    let read = secrets
        .refresh(&ctx.client, &refs, &ctx.all_secrets())
        .await;
    ctx.metrics.secret_reads.inc_by(read.read as u64);
    ctx.metrics.secret_read_errors.inc_by(read.failed as u64);
    // A Secret never read since the operator started, whose read fails: its mirror is the
    // only copy of its last good content, so it stays (mirrors::plan).
    let held: BTreeSet<String> = (refs.iter())
        .filter(|r| secrets.never_read(r))
        .map(|r| mirror_name(&name, r))
        .collect();
    let unreadable = refs.iter().any(|r| secrets.unreadable(r));
    let now = Timestamp::now();
    let resolved = resolve_wanted(wanted, &scan.policies, &ctx.caches.secrets, now.as_second());
    let gateways = ctx.gateway_objects().gateways;
    let upstream = |h: &ServedHost| {
        let (gw, section) = (
            h.origin.gateway.as_deref()?,
            h.origin.gateway_listener.as_deref()?,
        );
        gateway_upstream(listener, &gateways, gw, section)
    };
    let secrets = &ctx.caches.secrets;
    let desired = mirrors::desired(
        &name,
        &resolved,
        |s| secrets.pair(s),
        upstream,
        |s| secrets.previous(s),
    );
    let mirror_of: BTreeMap<String, String> = resolved
        .served
        .iter()
        .map(|h| (h.name.clone(), mirror_name(&name, &h.secret)))
        .collect();
    let observed = observe_data_plane(listener, desired, &held, ctx).await?;
    let memory = ctx.memory_of(&name);
    let served_before: BTreeSet<String> = (memory.hosts.iter().flatten())
        .filter(|h| h.state == host_states::SERVING)
        .map(|h| h.name.clone())
        .collect();
    let view = observed.mirrors.as_ref().map(|m| status::MirrorView {
        digest: &m.digest,
        versions: &m.versions,
        mirror_of: &mirror_of,
        last_synced: &memory.last_synced,
        served_before: &served_before,
    });
    let inputs = status::Inputs {
        generation: listener.metadata.generation,
        port: listener.spec.port,
        blocker: observed.blocker,
        failed_create: observed.failed_create,
        hosts: &resolved.reports,
        daemon_set: observed.daemon_set.as_ref(),
        pods: &observed.pods,
        previous: listener.status.as_ref(),
        mirrors: view,
        client_address: status::ClientAddressView::of(&listener.spec.upstream),
        placement: placement::describe(listener, &ctx.pod_defaults.architectures),
        now,
    };
    let hosts = status::host_statuses(&inputs);
    let mut next = status::aggregate(&inputs, &hosts);
    advertise(ctx, listener, &hosts, &mut next, now);
    let alt_svc_failed = advertise_alt_svc(ctx, listener, &hosts, &mut next).await;
    // Version skew: the CRDCurrent condition (operator::crd).
    let (crd, previous) = (ctx.crd.verdict(), listener.status.as_ref());
    super::crd::set_condition(&mut next, crd.as_ref(), previous, now, inputs.generation);
    let up_to_date = status::pods_up_to_date(&inputs);
    ctx.metrics.hosts.set(resolved.reports.len() as i64);
    write_status(ctx, listener, next, memory.hosts.as_deref(), &hosts).await?;
    let synced_now = observed.mirrors.map(|m| m.versions);
    ctx.remember(&name, |m| {
        m.hosts = Some(hosts);
        if let (true, Some(v)) = (up_to_date, synced_now) {
            m.last_synced = v;
        }
    });
    match observed.failure {
        // Said in the status; retried on the error policy's schedule.
        Some(e) => Err(e.into()),
        None => {
            let look = next_look(ctx, &name, !up_to_date);
            Ok(Action::requeue(sooner(look, unreadable, alt_svc_failed)))
        }
    }
}

/// The next look, sooner while a Secret cannot be read (its new content, a renewal, waits for
/// it) or an Alt-Svc write failed.
fn sooner(look: Duration, unreadable: bool, alt_svc_failed: bool) -> Duration {
    let mut next = look;
    if unreadable {
        next = next.min(UNREADABLE_REQUEUE);
    }
    if alt_svc_failed {
        next = next.min(ERROR_REQUEUE);
    }
    next
}

/// How often a listener another operator took over is looked at while its new pods start.
pub const HAND_OVER_WAIT: Duration = Duration::from_secs(5);

/// Whether this operator still has a data plane for `listener` (its DaemonSet, ServiceAccount,
/// hosts-namespace Role or mirrors), from the caches.
fn holds_data_plane(ctx: &Context, listener: &str) -> bool {
    let o = &ctx.caches.owned;
    let ds = resources::data_plane_name(listener);
    o.daemon_sets
        .get(&ObjectRef::new(&ds).within(&ctx.params.namespace))
        .is_some()
        || !owned_by(&o.service_accounts, listener).is_empty()
        || !owned_by(&o.roles, listener).is_empty()
        || !mirrors::existing(&o.mirrors.state(), listener).is_empty()
}

/// A listener another running operator runs: this one forgets it and, once the new owner's
/// pods are ready on every node it selects, removes the data plane it still has for it (a
/// listener handed over, or one two installations of earlier versions both ran), so no node is
/// left without a pod in between and no pod stays holding the port with nothing to serve.
async fn hand_over(listener: &Http3Listener, owner: &str, ctx: &Context) -> Result<Action, Error> {
    let name = listener.name_any();
    ctx.forget(&name);
    if !holds_data_plane(ctx, &name) {
        return Ok(Action::requeue(REQUEUE));
    }
    if !ownership::new_owner_serving(listener) {
        tracing::debug!(listener = %name, %owner, "run by another operator: waiting for its pods before removing ours");
        return Ok(Action::requeue(HAND_OVER_WAIT));
    }
    let mut removed = apply::remove_data_plane(ctx, &name).await?;
    let mirrors = mirrors::sync(ctx, listener, Vec::new(), &BTreeSet::new()).await?;
    ctx.metrics.mirror_deletes.inc_by(mirrors.deleted as u64);
    removed += mirrors.deleted;
    tracing::info!(listener = %name, %owner, objects = removed, "the listener is run by the operator in namespace {owner}, whose pods are ready: removed this operator's data plane of it");
    Ok(Action::requeue(REQUEUE))
}

/// A listener this operator does not run and no single running operator does: its data plane,
/// if it has one, is left as it is (never taken down over a name), and the one operator the
/// ownership rules pick writes why to the status.
async fn refuse(
    listener: &Http3Listener,
    ownership: &Ownership,
    ctx: &Context,
) -> Result<Action, Error> {
    let name = listener.name_any();
    ctx.forget(&name);
    let Some((reason, message)) = ownership.refusal(ownership::wanted(listener)) else {
        return Ok(Action::requeue(REQUEUE));
    };
    let next = status::refused(
        listener.status.as_ref(),
        listener.metadata.generation,
        reason,
        message,
        Timestamp::now(),
    );
    write_status(ctx, listener, next, None, &[]).await?;
    Ok(Action::requeue(REQUEUE))
}

/// Hands the listener's DNS task the hosts it serves, and puts what the task last achieved
/// in the status (`DnsAdvertised`, `status.advertise.dns`). Never waits for the DNS server.
fn advertise(
    ctx: &Context,
    listener: &Http3Listener,
    hosts: &[HostStatus],
    next: &mut Http3ListenerStatus,
    now: Timestamp,
) {
    let name = listener.name_any();
    let spec = listener
        .spec
        .advertise
        .as_ref()
        .and_then(|a| a.dns.as_ref());
    let settings = spec.map(dns::Settings::from_spec);
    let ready = next.nodes.as_ref().map_or(0, |n| n.ready);
    ctx.advertise.feed(
        &name,
        Desired {
            settings: settings.clone().and_then(Result::ok),
            hosts: dns::served(hosts, ready),
            port: listener.spec.port,
        },
    );
    let previous = listener.status.as_ref();
    let had = previous
        .is_some_and(|s| (s.conditions.iter()).any(|c| c.type_ == conditions::DNS_ADVERTISED));
    let state = ctx.advertise.state(&name);
    let Some(((ok, reason, message), dns)) = dns::verdict(settings.as_ref(), state.as_ref(), had)
    else {
        return;
    };
    next.conditions.push(status::condition_at(
        conditions::DNS_ADVERTISED,
        ok,
        reason,
        message,
        listener.metadata.generation,
        now,
    ));
    next.advertise = dns.map(|d| AdvertiseStatus {
        dns: Some(d),
        alt_svc: None,
    });
    status::carry_transition_times(previous, next);
}

/// Longest API error kept in `status.advertise.altSvc.error`.
const MAX_ERROR_BYTES: usize = 512;

/// Makes the TCP ingress send or withdraw `Alt-Svc` (`spec.advertise.altSvc`) for the hosts
/// just found served, and says so in `status.advertise.altSvc`; true when a write failed
/// (retried soon). Serving never waits on it beyond the calls themselves.
async fn advertise_alt_svc(
    ctx: &Context,
    listener: &Http3Listener,
    hosts: &[HostStatus],
    next: &mut Http3ListenerStatus,
) -> bool {
    let traefik = ctx.traefik_objects();
    let world = altsvc::listener::World {
        hosts,
        ready: next.nodes.as_ref().map_or(0, |n| n.ready),
        ingresses: &ctx.ingresses(),
        traefik_classes: &ctx.traefik_classes(),
        middlewares: &traefik.middlewares,
    };
    let plan = altsvc::listener::plan_for(listener, &world);
    let name = listener.name_any();
    let by = altsvc::apply::Writer {
        listener: &name,
        operator_ns: &ctx.params.namespace,
    };
    let applied = altsvc::apply::apply(&ctx.client, by, &plan).await;
    let failed = applied.error.is_some();
    if let Some(mut s) = plan.status {
        s.error = text::cut(&applied.error.unwrap_or_default(), MAX_ERROR_BYTES);
        next.advertise.get_or_insert_with(Default::default).alt_svc = Some(s);
    }
    failed
}

/// When to look at a listener again: promptly while its pods load new mirrors, up to
/// [`SETTLE_ATTEMPTS`] times in a row, else after [`REQUEUE`].
fn next_look(ctx: &Context, listener: &str, loading: bool) -> Duration {
    let mut looks = 0;
    ctx.remember(listener, |m| {
        m.settling = if loading { m.settling + 1 } else { 0 };
        looks = m.settling;
    });
    if loading && looks <= SETTLE_ATTEMPTS {
        SETTLE_REQUEUE
    } else {
        REQUEUE
    }
}

/// Patches the status when it changed (timestamps aside) and publishes the events the change
/// deserves; an unchanged status makes no API call. `remembered` is the hosts as this operator
/// last published them (`Memory::hosts`).
async fn write_status(
    ctx: &Context,
    listener: &Http3Listener,
    next: Http3ListenerStatus,
    remembered: Option<&[HostStatus]>,
    hosts: &[HostStatus],
) -> Result<(), Error> {
    let previous = listener.status.as_ref();
    let before = events::hosts_before(remembered, previous.is_some());
    let planned = events::plan(before, hosts, previous, &next);
    if status::needs_write(previous, &next) {
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
    }
    publish(ctx, listener, planned).await;
    Ok(())
}

/// Whether the listener cache holds `name` (a lookup, not a scan of every listener). A
/// deleted listener is never reconciled again: its DNS records go with the next reconcile of
/// any other one, which asks this of the listeners that publish records.
fn listener_exists(ctx: &Context, name: &str) -> bool {
    ctx.caches
        .listeners
        .get(&kube::runtime::reflector::ObjectRef::new(name))
        .is_some()
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
        // Becoming leader re-reconciles every listener (see `run`); the new leader owns the
        // DNS records now.
        ctx.advertise.stop_all();
        return Ok(Action::await_change());
    }
    if listener.metadata.deletion_timestamp.is_some() {
        // Being deleted (foreground): the garbage collector is removing what we made;
        // applying it again would fight it. Its DNS records go with it.
        ctx.forget(&listener.name_any());
        let name = listener.name_any();
        ctx.advertise
            .withdraw_gone(|n| n != name && listener_exists(&ctx, n));
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
