//! `Http3Listener.status` from what the operator knows (the resolved hosts, the mirrors it
//! wrote, the DaemonSet) and what the pods report on `/status`. Pure: time comes in as an
//! argument. Its size does not grow with the hosts: counts per state and reason, and the
//! first hosts not served ([`bounded`]); `kubectl h3-ingress status` reads the pods for the
//! per-host view.
//!
//! [`aggregate`] gathers the `Facts` once, then asks one function per condition
//! (`ready`, `sockets_bound`, `buffers_applied`, `degraded`, `public_roots`) and one
//! per status part.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use k8s_openapi::api::apps::v1::DaemonSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::hosts::policy::{passing, Passing};
use super::podstate::ContainerTrouble;
use super::text;
use crate::api::{
    conditions, host_states, reasons, HostCount, HostReport, HostStatus, Http3ListenerStatus,
    MirrorFailure, NodesStatus, StatusReport, UdpStatus, Upstream, MAX_STATUS_HOSTS,
    RECOMMENDED_SYSCTL_BUFFER_MAX,
};

/// TTL of the suggested DNS HTTPS record: one hour, as in the record of docs/field-reports.md
/// (002). It bounds how long resolvers keep pointing clients at HTTP/3 after a host stops
/// serving it.
pub const DNS_RECORD_TTL: u32 = 3600;
/// How many items a condition message lists before "and N more".
const MESSAGE_ITEMS: usize = 5;
/// At most this many characters of a host's message go into the status.
pub const MAX_HOST_MESSAGE: usize = 300;
/// Counters (`udp.drops`) that changed alone are written at most this often
/// (seconds): each status write is a watch event for every operator replica and every data
/// plane pod, and a busy listener's counters change on every reconcile.
pub const COUNTERS_REFRESH_SECONDS: i64 = 60;
/// How long `Degraded` says that a data plane container exited (seconds).
pub const RECENT_EXIT_SECONDS: i64 = 600;

/// What stops the listener before any pod is asked: a reason from `api::reasons` and the
/// message, e.g. `InvalidSpec`, `PortConflict`, or an API error while applying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    pub reason: &'static str,
    pub message: String,
}

/// What one data plane pod answered on `/status`.
#[derive(Debug, Clone, PartialEq)]
pub struct PodReport {
    pub pod: String,
    pub node: Option<String>,
    /// The pod's `Ready` condition (its readiness probe, as the kubelet last saw it).
    pub ready: bool,
    /// The report, or why it could not be read.
    pub report: Result<StatusReport, String>,
    /// What the kubelet says about the container when it is not simply running
    /// ([`container_trouble`](super::podstate::container_trouble)): said in `Ready` while the
    /// pod is not ready, and in `Degraded` for [`RECENT_EXIT_SECONDS`] after it exited.
    pub trouble: Option<ContainerTrouble>,
}

impl PodReport {
    fn label(&self) -> String {
        match &self.node {
            Some(n) => format!("{} on {n}", self.pod),
            None => self.pod.clone(),
        }
    }
}

/// Everything the status is computed from.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    pub generation: Option<i64>,
    pub port: u16,
    /// Why the listener cannot be run or applied, if it cannot.
    pub blocker: Option<Blocker>,
    /// The message of the DaemonSet's latest `FailedCreate` event, read only while it has
    /// fewer pods than nodes to run them.
    pub failed_create: Option<String>,
    /// The operator's own view of every wanted host ([`super::hosts::resolve_hosts`]).
    pub hosts: &'a [HostReport],
    pub daemon_set: Option<&'a DaemonSetStatus>,
    pub pods: &'a [PodReport],
    /// The status currently stored, for transition times and UDP drop growth.
    pub previous: Option<&'a Http3ListenerStatus>,
    /// The mirrors as written; `None` when they could not be (the blocker says why).
    pub mirrors: Option<MirrorView<'a>>,
    /// How the clients' addresses reach the TCP ingress (`ClientAddress`).
    pub client_address: ClientAddressView,
    /// Where the data plane may run, in words
    /// ([`placement::describe`](super::placement::describe)): said when no node does.
    pub placement: String,
    pub now: Timestamp,
}

/// What the `ClientAddress` condition says: the listener's way, and where the PROXY header
/// goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAddressView {
    pub passing: Passing,
    pub proxy_to: String,
}

impl ClientAddressView {
    pub fn of(u: &Upstream) -> Self {
        let own = &u.client_address.proxy_protocol_address;
        Self {
            passing: passing(u),
            proxy_to: if own.is_empty() {
                u.address.clone()
            } else {
                own.clone()
            },
        }
    }
}

/// The DNS HTTPS record (RFC 9460) that lets a first visit use HTTP/3 without Alt-Svc.
pub fn dns_https_record(host: &str, port: u16) -> String {
    let port = if port == 443 {
        String::new()
    } else {
        format!(" port={port}")
    };
    format!("{host}. {DNS_RECORD_TTL} IN HTTPS 1 . alpn=\"h3,h2\"{port}")
}

fn list(items: &[String]) -> String {
    if items.len() <= MESSAGE_ITEMS {
        items.join("; ")
    } else {
        format!(
            "{}; and {} more",
            items[..MESSAGE_ITEMS].join("; "),
            items.len() - MESSAGE_ITEMS
        )
    }
}

fn condition(
    type_: &str,
    ok: Option<bool>,
    reason: &str,
    message: String,
    inp: &Inputs,
) -> Condition {
    condition_at(type_, ok, reason, message, inp.generation, inp.now)
}

/// A condition as every condition of the status is written (`Unknown` for `None`).
pub fn condition_at(
    type_: &str,
    ok: Option<bool>,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: match ok {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: Time(now),
    }
}

fn reports<'a>(inp: &'a Inputs) -> Vec<(&'a PodReport, &'a StatusReport)> {
    inp.pods
        .iter()
        .filter_map(|p| p.report.as_ref().ok().map(|r| (p, r)))
        .collect()
}

fn no_reports_message(inp: &Inputs) -> String {
    let errors: Vec<String> = inp
        .pods
        .iter()
        .filter_map(|p| {
            p.report
                .as_ref()
                .err()
                .map(|e| format!("{}: {e}", p.label()))
        })
        .collect();
    if inp.pods.is_empty() {
        "no data plane pod is running".to_string()
    } else {
        format!("no data plane pod answered /status ({})", list(&errors))
    }
}

/// What the operator wrote to the hosts namespace for this listener (`api::mirror`), to tell
/// whether each pod serves it.
#[derive(Debug, Clone)]
pub struct MirrorView<'a> {
    /// `api::mirror::digest` of the mirrors as written: what an up-to-date pod reports.
    pub digest: &'a str,
    /// The resourceVersion of every mirror as written.
    pub versions: &'a BTreeMap<String, String>,
    /// The mirror of every served host.
    pub mirror_of: &'a BTreeMap<String, String>,
    /// The mirrors (name -> resourceVersion) every answering pod had applied the last time
    /// all of them were up to date: a host whose mirror is unchanged since is served even
    /// while the pods load another one.
    pub last_synced: &'a BTreeMap<String, String>,
    /// The hosts `Serving` at the previous reconcile. One of them whose mirror changed since
    /// the last sync (a renewed certificate, a host added next to it) is still served, from
    /// the version the pods have, until they apply the new one: it stays `Serving`, so a
    /// routine renewal neither flips `Ready` nor costs status writes and warnings.
    pub served_before: &'a BTreeSet<String>,
}

/// Whether a pod applied exactly the mirrors the operator wrote.
fn up_to_date(r: &StatusReport, m: &MirrorView) -> bool {
    r.mirrors
        .as_ref()
        .is_some_and(|x| x.synced && x.digest == m.digest)
}

/// Whether every pod that answered has applied the operator's mirrors (false with no answer).
pub fn pods_up_to_date(inp: &Inputs) -> bool {
    let ok = reports(inp);
    match &inp.mirrors {
        Some(m) => !ok.is_empty() && ok.iter().all(|(_, r)| up_to_date(r, m)),
        None => false,
    }
}

/// A pod's word that it could not serve `host` (from its mirror's failures).
fn pod_failure<'a>(
    ok: &[(&'a PodReport, &'a StatusReport)],
    host: &str,
    mirror: Option<&str>,
) -> Option<(&'a PodReport, &'a MirrorFailure)> {
    ok.iter().find_map(|(p, r)| {
        let m = r.mirrors.as_ref()?;
        m.failed
            .iter()
            .find(|f| match &f.host {
                Some(h) => h == host,
                None => Some(f.mirror.as_str()) == mirror,
            })
            .map(|f| (*p, f))
    })
}

/// One host's status: what the operator resolved, corrected by what the pods serve.
fn host_status(
    inp: &Inputs,
    ok: &[(&PodReport, &StatusReport)],
    wanted: &HostReport,
) -> HostStatus {
    let mut h = HostStatus {
        name: wanted.name.clone(),
        origin: wanted.origin.clone(),
        secret: wanted.secret.clone(),
        state: wanted.state.clone(),
        reason: wanted.reason.clone(),
        message: cut(&wanted.message),
        alt_svc_advertised: None,
        dns_https_record: String::new(),
    };
    if wanted.state != host_states::SERVING {
        return h;
    }
    let pending = |h: &mut HostStatus, message: String| {
        h.state = host_states::NOT_SERVING.to_string();
        h.reason = reasons::CONFIG_PENDING.to_string();
        h.message = cut(&message);
    };
    let Some(m) = &inp.mirrors else {
        pending(
            &mut h,
            "the certificate mirrors are not written yet".to_string(),
        );
        return h;
    };
    if ok.is_empty() {
        pending(&mut h, no_reports_message(inp));
        return h;
    }
    let mirror = m.mirror_of.get(&wanted.name).map(String::as_str);
    if let Some((p, f)) = pod_failure(ok, &wanted.name, mirror) {
        // A pod disagrees with the operator (it cannot load the certificate): its word wins.
        h.state = host_states::NOT_SERVING.to_string();
        h.reason = f.reason.clone();
        h.message = cut(&format!("{}: {}", p.label(), f.message));
        return h;
    }
    let behind = ok.iter().filter(|(_, r)| !up_to_date(r, m)).count();
    let unchanged = mirror.is_some_and(|name| {
        m.last_synced.get(name).is_some() && m.last_synced.get(name) == m.versions.get(name)
    });
    let reloading = mirror.is_some_and(|name| m.last_synced.contains_key(name))
        && m.served_before.contains(&wanted.name);
    if behind > 0 && !unchanged && !reloading {
        pending(
            &mut h,
            format!("not loaded yet by {behind} of {} data plane pods", ok.len()),
        );
        return h;
    }
    // Served: with the operator's reason (`Serving`, or `SecretUnreadable` for the last
    // good certificate of a Secret that cannot be read now) and its message.
    h.state = host_states::SERVING.to_string();
    h
}

/// Status messages come from certificates and users' objects: cut so a status stays bounded.
fn cut(s: &str) -> String {
    text::cut(s, MAX_HOST_MESSAGE)
}

/// Every wanted host's status (unbounded: the caller keeps it in memory for events, and
/// [`aggregate`] writes only counts and the first hosts not served).
pub fn host_statuses(inp: &Inputs) -> Vec<HostStatus> {
    let ok = reports(inp);
    inp.hosts.iter().map(|w| host_status(inp, &ok, w)).collect()
}

/// What every condition is decided from, gathered once per [`aggregate`].
struct Facts<'a> {
    inp: &'a Inputs<'a>,
    /// The pods that answered, with their reports.
    ok: Vec<(&'a PodReport, &'a StatusReport)>,
    /// Distinct host names wanted, and those of them served.
    wanted: BTreeSet<&'a str>,
    serving: BTreeSet<&'a str>,
    /// `name (reason)` of every host entry not served.
    not_serving: Vec<String>,
    /// `name: note` of every served host whose policy has a value not carried.
    policy_notes: Vec<String>,
    /// Hosts not served for their client-address policy.
    address_held: BTreeSet<&'a str>,
    /// Hosts served with the last good certificate of a Secret that cannot be read now, and
    /// the message of the first.
    last_good: (Vec<String>, Option<&'a str>),
    /// `pod: family address: error` of every socket that did not bind.
    bind_failures: Vec<String>,
    nodes: NodesStatus,
    /// Summed over the pods that answered; `None` (unknown, not zero) when none did.
    udp: Option<UdpStatus>,
    /// Hosts the operator can serve whose certificate was judged against the public web
    /// roots, and those of them it does not chain to. From the operator's view, not the
    /// pods': the verdict is the certificate's, and must not flap while pods load it.
    judged: BTreeSet<&'a str>,
    private_roots: BTreeSet<&'a str>,
    /// Servable hosts whose Secret's chain lacks the leaf's issuer: no verdict
    /// (`roots::Roots::Incomplete`, the only servable host without one).
    incomplete_chains: BTreeSet<&'a str>,
}

impl<'a> Facts<'a> {
    fn new(inp: &'a Inputs<'a>, hosts: &'a [HostStatus]) -> Self {
        let ok = reports(inp);
        Facts {
            wanted: hosts.iter().map(|h| h.name.as_str()).collect(),
            serving: hosts
                .iter()
                .filter(|h| h.state == host_states::SERVING)
                .map(|h| h.name.as_str())
                .collect(),
            not_serving: hosts
                .iter()
                .filter(|h| h.state != host_states::SERVING)
                .map(|h| format!("{} ({})", h.name, h.reason))
                .collect(),
            policy_notes: hosts
                .iter()
                .filter(|h| h.reason == reasons::SERVING && !h.message.is_empty())
                .map(|h| format!("{}: {}", h.name, h.message))
                .collect(),
            address_held: hosts
                .iter()
                .filter(|h| h.reason == reasons::CLIENT_ADDRESS_POLICY)
                .map(|h| h.name.as_str())
                .collect(),
            last_good: last_good(hosts),
            bind_failures: bind_failures(&ok),
            nodes: nodes(inp.daemon_set, inp.pods),
            udp: udp(&ok),
            judged: judged_hosts(inp.hosts, |_| true),
            private_roots: judged_hosts(inp.hosts, |public| !public),
            incomplete_chains: (inp.hosts.iter())
                .filter(|h| h.state == host_states::SERVING && h.public_roots.is_none())
                .map(|h| h.name.as_str())
                .collect(),
            ok,
            inp,
        }
    }
}

fn last_good(hosts: &[HostStatus]) -> (Vec<String>, Option<&str>) {
    let stale: Vec<&HostStatus> = hosts
        .iter()
        .filter(|h| h.state == host_states::SERVING && h.reason == reasons::SECRET_UNREADABLE)
        .collect();
    let first = stale.first().map(|h| h.message.as_str());
    (stale.iter().map(|h| h.name.clone()).collect(), first)
}

/// Servable hosts whose certificate verdict is known and passes `keep`.
fn judged_hosts(hosts: &[HostReport], keep: impl Fn(bool) -> bool) -> BTreeSet<&str> {
    hosts
        .iter()
        .filter(|h| h.state == host_states::SERVING)
        .filter(|h| h.public_roots.is_some_and(&keep))
        .map(|h| h.name.as_str())
        .collect()
}

/// Nodes that should run the data plane, and nodes it serves. The DaemonSet's `numberReady`
/// counts each node by its oldest pod; in a surge roll that is the old pod, which may call
/// itself not ready while it drains (data planes of earlier versions did once superseded)
/// though the new pod beside it serves the node. So a node also counts when any of its pods
/// that is not being deleted is Ready.
fn nodes(daemon_set: Option<&DaemonSetStatus>, pods: &[PodReport]) -> NodesStatus {
    let (desired, counted) = daemon_set
        .map(|s| (s.desired_number_scheduled, s.number_ready))
        .unwrap_or((0, 0));
    let mut served: Vec<&str> = pods
        .iter()
        .filter(|p| p.ready)
        .filter_map(|p| p.node.as_deref())
        .collect();
    served.sort_unstable();
    served.dedup();
    let by_pods = i32::try_from(served.len()).unwrap_or(i32::MAX);
    let ready = counted.max(by_pods).min(desired);
    NodesStatus {
        desired,
        ready,
        summary: format!("{ready}/{desired}"),
    }
}

fn udp(ok: &[(&PodReport, &StatusReport)]) -> Option<UdpStatus> {
    if ok.is_empty() {
        return None;
    }
    let bound = || {
        ok.iter()
            .flat_map(|(_, r)| r.sockets.iter())
            .filter(|s| s.bound)
    };
    Some(UdpStatus {
        drops: ok.iter().map(|(_, r)| r.udp_drops as i64).sum(),
        min_receive_buffer_bytes: bound()
            .map(|s| s.receive_buffer_effective_bytes as i64)
            .min(),
        clamped: bound().any(|s| s.clamped),
    })
}

fn bind_failures(ok: &[(&PodReport, &StatusReport)]) -> Vec<String> {
    ok.iter()
        .flat_map(|(p, r)| {
            r.sockets
                .iter()
                .filter(|s| !s.bound)
                .map(move |s| format!("{}: {} {}: {}", p.label(), s.family, s.address, s.error))
        })
        .collect()
}

/// The socket conditions are Unknown until some pod answers: no report proves nothing either way.
fn unknown_without_reports(f: &Facts, type_: &str) -> Option<Condition> {
    f.ok.is_empty().then(|| {
        let msg = no_reports_message(f.inp);
        condition(type_, None, reasons::NO_REPORTS, msg, f.inp)
    })
}

/// `SocketsBound`: every pod that answered bound every socket it was asked for.
fn sockets_bound(f: &Facts) -> Condition {
    let (inp, type_) = (f.inp, conditions::SOCKETS_BOUND);
    if let Some(unknown) = unknown_without_reports(f, type_) {
        return unknown;
    }
    if !f.bind_failures.is_empty() {
        let msg = list(&f.bind_failures);
        return condition(type_, Some(false), reasons::BIND_FAILED, msg, inp);
    }
    let families: BTreeSet<&str> =
        f.ok.iter()
            .flat_map(|(_, r)| r.sockets.iter().filter(|s| s.bound))
            .map(|s| s.family.as_str())
            .collect();
    let msg = format!(
        "UDP port {} bound for {} on {} pods",
        inp.port,
        families.into_iter().collect::<Vec<_>>().join(" and "),
        f.ok.len()
    );
    condition(type_, Some(true), reasons::BOUND, msg, inp)
}

/// `BuffersApplied`: the kernel granted the socket buffers we asked for, on every pod.
fn buffers_applied(f: &Facts) -> Condition {
    let (inp, type_) = (f.inp, conditions::BUFFERS_APPLIED);
    if let Some(unknown) = unknown_without_reports(f, type_) {
        return unknown;
    }
    let clamped: Vec<String> =
        f.ok.iter()
            .flat_map(|(p, r)| {
                r.sockets
                    .iter()
                    .filter(|s| s.bound && s.clamped)
                    .map(move |s| {
                        format!(
                        "{}: {} receive buffer {} bytes, send buffer {} bytes (requested {}/{})",
                        p.label(),
                        s.family,
                        s.receive_buffer_effective_bytes,
                        s.send_buffer_effective_bytes,
                        s.receive_buffer_requested_bytes,
                        s.send_buffer_requested_bytes
                    )
                    })
            })
            .collect();
    if clamped.is_empty() {
        let smallest = f.udp.as_ref().and_then(|u| u.min_receive_buffer_bytes);
        let msg = format!(
            "smallest effective receive buffer {} bytes",
            smallest.unwrap_or_default()
        );
        return condition(type_, Some(true), reasons::APPLIED, msg, inp);
    }
    let msg = format!(
        "the kernel granted less than requested: {}. Raise net.core.rmem_max and \
         net.core.wmem_max to at least {RECOMMENDED_SYSCTL_BUFFER_MAX} on these nodes, or set \
         spec.tuneNodeBufferLimits: true, or spec.socket.forceBuffers: true",
        list(&clamped)
    );
    condition(type_, Some(false), reasons::CLAMPED, msg, inp)
}

/// `Ready`: the first blocker in the order a user has to fix them, else how many hosts serve.
fn ready(f: &Facts) -> Condition {
    let inp = f.inp;
    let (ok, reason, message) = ready_verdict(f);
    condition(conditions::READY, Some(ok), reason, message, inp)
}

/// Pods the DaemonSet should have but has not created, with the reason it gave.
fn pods_not_created(inp: &Inputs) -> Option<String> {
    let ds = inp.daemon_set?;
    let missing = ds.desired_number_scheduled - ds.current_number_scheduled;
    let why = inp.failed_create.as_deref()?;
    (missing > 0).then(|| {
        format!(
            "{missing} of {} data plane pods not created: {why}",
            ds.desired_number_scheduled
        )
    })
}

fn ready_verdict(f: &Facts) -> (bool, &'static str, String) {
    let NodesStatus { desired, ready, .. } = f.nodes;
    if let Some(b) = &f.inp.blocker {
        return (false, b.reason, b.message.clone());
    }
    if let Some(msg) = pods_not_created(f.inp) {
        return (false, reasons::PODS_NOT_CREATED, msg);
    }
    if f.wanted.is_empty() {
        let msg = "no Ingress of this listener's class, and no HTTPRoute or Gateway of its \
                   gatewayClassName (or naming it in h3-ingress.dev/listener), has \
                   h3-ingress.dev/enabled: \"true\", and spec.hosts is empty";
        return (false, reasons::NO_HOSTS, msg.to_string());
    }
    if desired == 0 {
        // A DaemonSet its controller has not seen yet also says 0: right after every
        // `kubectl apply` of a listener, when the hint below would send users astray.
        let counted = f
            .inp
            .daemon_set
            .is_some_and(|d| d.observed_generation.is_some());
        let msg = if counted {
            format!(
                "no node runs the data plane: none is {}; `kubectl get nodes -L \
                 kubernetes.io/arch` shows each node's architecture",
                f.inp.placement
            )
        } else {
            "the DaemonSet controller has not scheduled the data plane yet".to_string()
        };
        return (false, reasons::PODS_NOT_READY, msg);
    }
    if ready < desired {
        let mut msg = format!("{ready} of {desired} data plane pods ready");
        let troubles: Vec<String> = f
            .inp
            .pods
            .iter()
            .filter(|p| !p.ready)
            .filter_map(|p| Some(format!("{}: {}", p.label(), p.trouble.as_ref()?.describe())))
            .collect();
        if !troubles.is_empty() {
            let _ = write!(msg, "; {}", list(&troubles));
        }
        return (false, reasons::PODS_NOT_READY, msg);
    }
    if f.ok.is_empty() {
        return (false, reasons::NO_REPORTS, no_reports_message(f.inp));
    }
    if !f.bind_failures.is_empty() {
        return (false, reasons::BIND_FAILED, list(&f.bind_failures));
    }
    let (serving, wanted) = (f.serving.len(), f.wanted.len());
    if serving == 0 {
        return (false, reasons::NO_HOSTS_SERVING, list(&f.not_serving));
    }
    if serving < wanted {
        let msg = format!(
            "{serving} of {wanted} hosts served; not served: {}",
            list(&f.not_serving)
        );
        return (true, reasons::SOME_HOSTS_SERVING, msg);
    }
    let msg = format!("{serving} hosts served by {ready} pods");
    (true, reasons::ALL_HOSTS_SERVING, msg)
}

/// `Degraded`: serving, but not as it should. Every problem is said; the first names the reason.
fn degraded(f: &Facts) -> Condition {
    let problems: Vec<(&str, String)> = [
        hosts_not_serving(f),
        policy_values_ignored(f),
        last_good_certificates(f),
        udp_drops_growing(f),
        rollout_pending(f),
        recent_exits(f),
    ]
    .into_iter()
    .flatten()
    .collect();
    let inp = f.inp;
    match problems.first() {
        None => condition(
            conditions::DEGRADED,
            Some(false),
            reasons::AS_EXPECTED,
            String::new(),
            inp,
        ),
        Some((reason, _)) => {
            let messages: Vec<&str> = problems.iter().map(|(_, m)| m.as_str()).collect();
            let msg = messages.join(". ");
            condition(conditions::DEGRADED, Some(true), reason, msg, inp)
        }
    }
}

fn hosts_not_serving(f: &Facts) -> Option<(&'static str, String)> {
    (!f.not_serving.is_empty()).then(|| {
        (
            reasons::SOME_HOSTS_NOT_SERVING,
            format!("not served: {}", list(&f.not_serving)),
        )
    })
}

/// Served hosts whose TCP-side policy has a value h3-ingress could not carry.
fn policy_values_ignored(f: &Facts) -> Option<(&'static str, String)> {
    (!f.policy_notes.is_empty()).then(|| {
        (
            reasons::POLICY_VALUE_IGNORED,
            format!(
                "served without part of their TCP-side policy: {}",
                list(&f.policy_notes)
            ),
        )
    })
}

/// `ClientAddress`: whether the TCP ingress gets each client's address, how, and how many
/// hosts are held back because it does not (or not in the form their rules read).
fn client_address(f: &Facts) -> Condition {
    let inp = f.inp;
    let held = match f.address_held.len() {
        0 => String::new(),
        n => format!(
            "; {n} hosts not served for a client-address rule it would misjudge              ({}, see status.hosts)",
            reasons::CLIENT_ADDRESS_POLICY
        ),
    };
    let (ok, reason, message) = match inp.client_address.passing {
        Passing::ProxyProtocol => (
            true,
            reasons::PROXY_PROTOCOL,
            format!(
                "in a PROXY protocol v2 header to {}",
                inp.client_address.proxy_to
            ),
        ),
        Passing::TrustedHeaders => (
            true,
            reasons::TRUSTED_FORWARDED_HEADERS,
            "in X-Forwarded-For, Forwarded and X-Real-IP, which the TCP ingress is declared to              trust (clientAddress.trusted)"
                .to_string(),
        ),
        Passing::UntrustedHeaders => (
            false,
            reasons::UNTRUSTED_FORWARDED_HEADERS,
            "the TCP ingress sees the node's address for HTTP/3 requests (in its allowlists,              limits and logs): set spec.upstream.clientAddress (docs/kubernetes-networking.md)"
                .to_string(),
        ),
    };
    let message = format!("{message}{held}");
    condition(conditions::CLIENT_ADDRESS, Some(ok), reason, message, inp)
}

/// Hosts served with the last good certificate of a Secret that cannot be read: they stay
/// up, but a renewal or a revocation in that Secret does not reach them until it can.
fn last_good_certificates(f: &Facts) -> Option<(&'static str, String)> {
    let (names, first) = (&f.last_good.0, f.last_good.1?);
    Some((
        reasons::SECRET_UNREADABLE,
        format!(
            "{} hosts keep the last good certificate of a Secret that cannot be read ({}); {first}",
            names.len(),
            list(names)
        ),
    ))
}

/// Drops that grew since the stored status. Pods count drops since they started, so a
/// smaller sum means pods restarted, not that nothing was dropped.
fn udp_drops_growing(f: &Facts) -> Option<(&'static str, String)> {
    let now = f.udp.as_ref()?;
    let before = f.inp.previous?.udp.as_ref()?.drops;
    (now.drops > before).then(|| {
        (
            reasons::UDP_DROPS,
            format!(
                "{} UDP datagrams dropped since the last check (receive buffers too small or \
                 the data plane too slow); smallest effective receive buffer {} bytes",
                now.drops - before,
                now.min_receive_buffer_bytes.unwrap_or_default()
            ),
        )
    })
}

/// Data plane containers that exited (killed for memory, crashed, failed their liveness
/// probe) in the last [`RECENT_EXIT_SECONDS`]: the kubelet restarts them within seconds, so
/// without this the only trace would be a restart count on the pod.
fn recent_exits(f: &Facts) -> Option<(&'static str, String)> {
    let now = f.inp.now.as_second();
    let exited: Vec<String> = f
        .inp
        .pods
        .iter()
        .filter_map(|p| {
            let t = p.trouble.as_ref()?;
            let finished = t.last_exit.as_ref()?.finished?.as_second();
            (now - finished <= RECENT_EXIT_SECONDS)
                .then(|| format!("{}: {}", p.label(), t.describe()))
        })
        .collect();
    (!exited.is_empty()).then(|| {
        (
            reasons::CONTAINER_EXITED,
            format!(
                "data plane containers exited in the last {} minutes: {}",
                RECENT_EXIT_SECONDS / 60,
                list(&exited)
            ),
        )
    })
}

/// Pods that refused a change needing new sockets and wait for the DaemonSet to replace them.
fn rollout_pending(f: &Facts) -> Option<(&'static str, String)> {
    let pending: Vec<String> =
        f.ok.iter()
            .filter(|(_, r)| !r.restart_required.is_empty())
            .map(|(p, r)| format!("{}: {}", p.label(), r.restart_required.join(", ")))
            .collect();
    (!pending.is_empty()).then(|| {
        (
            reasons::ROLLOUT_PENDING,
            format!(
                "pods still run old socket settings until the DaemonSet replaces them: {}",
                list(&pending)
            ),
        )
    })
}

/// Where the [`public_roots`] message starts naming hosts; [`private_roots_named`] reads them.
const NAMED: &str = "; e.g. ";
/// How the [`public_roots`] message counts the hosts it does not name.
const MORE: &str = " and ";

/// What the [`public_roots`] message says of hosts whose Secret lacks the intermediate;
/// [`incomplete_chains_counted`] looks for it.
const INCOMPLETE: &str = "hold an incomplete chain";

/// `{NAMED}a, b, c{MORE}N more`: the first [`MESSAGE_ITEMS`] of `names` and how many others.
fn named(names: &[&str]) -> String {
    let mut out = format!(
        "{NAMED}{}",
        names[..names.len().min(MESSAGE_ITEMS)].join(", ")
    );
    if names.len() > MESSAGE_ITEMS {
        let _ = write!(out, "{MORE}{} more", names.len() - MESSAGE_ITEMS);
    }
    out
}

/// `PublicRoots`: every servable host's certificate chains to a public web root. Chrome uses
/// QUIC only then; with a private CA it stays on HTTP/2 even where that CA is trusted, while
/// Firefox and Safari may use HTTP/3. A Secret holding the leaf without its intermediate is
/// unknown, not private: browsers that have or fetch the intermediate may accept it. A note
/// for people: Ready and Degraded ignore it.
fn public_roots(f: &Facts) -> Condition {
    let (inp, type_) = (f.inp, conditions::PUBLIC_ROOTS);
    let (judged, incomplete) = (f.judged.len(), f.incomplete_chains.len());
    if judged + incomplete == 0 {
        let msg = "no served host's certificate has been judged yet".to_string();
        return condition(type_, None, reasons::NO_CERTIFICATES, msg, inp);
    }
    let incomplete_note = |of: &str| {
        format!(
            "the Secrets of {incomplete}{of} hosts {INCOMPLETE} (the leaf without the \
             intermediate that issued it), so whether they reach a public web root is unknown: \
             browsers that have or fetch the intermediate may accept them, and h3-ingress sends \
             what the Secret holds, so a client without it fails over HTTP/3 as over TCP"
        )
    };
    let private: Vec<&str> = f.private_roots.iter().copied().collect();
    if private.is_empty() && incomplete == 0 {
        let msg = format!("all {judged} hosts have certificates that chain to a public web root");
        return condition(type_, Some(true), reasons::ALL_PUBLICLY_TRUSTED, msg, inp);
    }
    if private.is_empty() {
        let names: Vec<&str> = f.incomplete_chains.iter().copied().collect();
        let of = format!(" of {}", judged + incomplete);
        let msg = format!("{}{}", incomplete_note(&of), named(&names));
        return condition(type_, None, reasons::INCOMPLETE_CHAIN, msg, inp);
    }
    let (what, them) = if private.len() == 1 {
        ("has a certificate that does", "it")
    } else {
        ("have certificates that do", "them")
    };
    let mut msg = format!(
        "{} of {judged} hosts {what} not chain to a public web root: Chrome will not use HTTP/3 for \
         {them} (Firefox and Safari may)",
        private.len(),
    );
    if incomplete > 0 {
        let _ = write!(msg, "; {}", incomplete_note(" other"));
    }
    msg.push_str(&named(&private));
    condition(type_, Some(false), reasons::PRIVATE_ROOTS, msg, inp)
}

/// Whether a `PublicRoots` condition counts hosts whose Secret's chain is incomplete (their
/// verdict unknown; it names them only when no host is private).
pub fn incomplete_chains_counted(c: &Condition) -> bool {
    c.type_ == conditions::PUBLIC_ROOTS && c.message.contains(INCOMPLETE)
}

/// The hosts a `PublicRoots` condition names as not chaining to a public web root, and
/// whether it has more it does not name (it names at most five, so the status stays small).
pub fn private_roots_named(c: &Condition) -> (Vec<&str>, bool) {
    if c.type_ != conditions::PUBLIC_ROOTS || c.reason != reasons::PRIVATE_ROOTS {
        return (Vec::new(), false);
    }
    let Some((_, named)) = c.message.split_once(NAMED) else {
        return (Vec::new(), true);
    };
    let (names, more) = match named.split_once(MORE) {
        Some((names, _)) => (names, true),
        None => (named, false),
    };
    (names.split(", ").filter(|n| !n.is_empty()).collect(), more)
}

/// Hosts by state and reason, and the first [`MAX_STATUS_HOSTS`] not served (in name order)
/// with how many more there are: the status stays the same size whatever the number of hosts.
pub fn bounded(hosts: &[HostStatus]) -> (Vec<HostCount>, Vec<HostStatus>, i64) {
    let mut counts: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for h in hosts {
        *counts
            .entry((h.state.as_str(), h.reason.as_str()))
            .or_default() += 1;
    }
    let counts = counts
        .into_iter()
        .map(|((state, reason), count)| HostCount {
            state: state.to_string(),
            reason: reason.to_string(),
            count,
        })
        .collect();
    let not_serving = hosts.iter().filter(|h| h.state != host_states::SERVING);
    let listed: Vec<HostStatus> = not_serving
        .clone()
        .take(MAX_STATUS_HOSTS)
        .cloned()
        .collect();
    let omitted = (not_serving.count() - listed.len()) as i64;
    (counts, listed, omitted)
}

/// Computes the status from every host's status ([`host_statuses`]). Transition times are
/// carried over from `previous` for conditions whose status did not change.
pub fn aggregate(inp: &Inputs, hosts: &[HostStatus]) -> Http3ListenerStatus {
    let f = Facts::new(inp, hosts);
    let conditions = vec![
        ready(&f),
        sockets_bound(&f),
        buffers_applied(&f),
        degraded(&f),
        public_roots(&f),
        client_address(&f),
    ];
    let hosts_summary = Some(format!("{}/{}", f.serving.len(), f.wanted.len()));
    let Facts { nodes, udp, .. } = f;
    let counters_time = udp.is_some().then_some(Time(inp.now));
    let (host_counts, listed, hosts_omitted) = bounded(hosts);
    let mut status = Http3ListenerStatus {
        observed_generation: inp.generation,
        conditions,
        hosts_summary,
        host_counts,
        hosts: listed,
        hosts_omitted,
        nodes: Some(nodes),
        udp,
        counters_time,
        alt_svc_prober: alt_svc_prober(inp),
        ..Default::default()
    };
    carry_transition_times(inp.previous, &mut status);
    status
}

/// The data-plane pod that probes the TCP ingress for Alt-Svc: the one named before while it
/// is ready and answers (a new name costs every host a probe), else the first such pod by
/// name; none while no pod is.
fn alt_svc_prober(inp: &Inputs) -> Option<String> {
    let mut able: Vec<&str> = inp
        .pods
        .iter()
        .filter(|p| p.ready && p.report.is_ok())
        .map(|p| p.pod.as_str())
        .collect();
    let previous = inp.previous.and_then(|s| s.alt_svc_prober.as_deref());
    if let Some(p) = previous.filter(|p| able.contains(p)) {
        return Some(p.to_string());
    }
    able.sort_unstable();
    able.first().map(|p| p.to_string())
}

/// The status of a listener that no operator runs, or that two claim (`operator::ownership`),
/// written by exactly one operator: `Ready=False` with the reason and nothing else (nobody
/// reads its pods). Applied under the one field manager, it replaces every field the previous
/// owner wrote, so no stale pod or host count stays beside the reason.
pub fn refused(
    previous: Option<&Http3ListenerStatus>,
    generation: Option<i64>,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Http3ListenerStatus {
    let mut status = Http3ListenerStatus {
        observed_generation: generation,
        conditions: vec![Condition {
            type_: conditions::READY.to_string(),
            status: "False".to_string(),
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }],
        ..Default::default()
    };
    carry_transition_times(previous, &mut status);
    status
}

/// Keeps `lastTransitionTime` of conditions whose status is unchanged (API conventions: it
/// moves only when the status does).
pub fn carry_transition_times(
    previous: Option<&Http3ListenerStatus>,
    next: &mut Http3ListenerStatus,
) {
    let Some(prev) = previous else { return };
    for c in &mut next.conditions {
        if let Some(p) = prev.conditions.iter().find(|p| p.type_ == c.type_) {
            if p.status == c.status {
                c.last_transition_time = p.last_transition_time.clone();
            }
        }
    }
}

fn without_times(s: &Http3ListenerStatus) -> Http3ListenerStatus {
    let mut s = s.clone();
    for c in &mut s.conditions {
        c.last_transition_time = Time(Timestamp::UNIX_EPOCH);
    }
    s.counters_time = None;
    s
}

/// The status without its counters (and times): what must be written as soon as it changes.
fn without_counters(s: &Http3ListenerStatus) -> Http3ListenerStatus {
    let mut s = without_times(s);
    if let Some(u) = &mut s.udp {
        u.drops = 0;
    }
    s
}

/// Whether to write `next` over what is stored. Any change but the counters' is written at
/// once; counters that changed alone wait until the stored ones are
/// [`COUNTERS_REFRESH_SECONDS`] old, so steady traffic costs one status write a minute.
pub fn needs_write(stored: Option<&Http3ListenerStatus>, next: &Http3ListenerStatus) -> bool {
    let Some(s) = stored else { return true };
    if without_counters(s) != without_counters(next) {
        return true;
    }
    if without_times(s) == without_times(next) {
        return false;
    }
    match (&s.counters_time, &next.counters_time) {
        (Some(then), Some(now)) => {
            now.0.as_second() - then.0.as_second() >= COUNTERS_REFRESH_SECONDS
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MirrorReport, SocketReport};
    use crate::operator::podstate::LastExit;
    use std::sync::LazyLock;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    fn want(name: &str, state: &str, reason: &str) -> HostReport {
        HostReport {
            name: name.into(),
            state: state.into(),
            reason: reason.into(),
            origin: crate::api::HostOrigin::ingress("default/web"),
            secret: Some("default/web-tls".into()),
            ..Default::default()
        }
    }

    fn socket(family: &str, clamped: bool) -> SocketReport {
        SocketReport {
            family: family.into(),
            address: if family == "ipv4" {
                "0.0.0.0:443"
            } else {
                "[::]:443"
            }
            .into(),
            bound: true,
            receive_buffer_requested_bytes: 4_194_304,
            receive_buffer_effective_bytes: if clamped { 425_984 } else { 8_388_608 },
            send_buffer_requested_bytes: 4_194_304,
            send_buffer_effective_bytes: if clamped { 425_984 } else { 8_388_608 },
            clamped,
            gso_segments: 64,
            ..Default::default()
        }
    }

    /// The mirrors as the operator wrote them: one per test host, digest "D".
    static VERSIONS: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
        [("m-a", "2"), ("m-b", "1")]
            .iter()
            .map(|(m, v)| (m.to_string(), v.to_string()))
            .collect()
    });
    static MIRROR_OF: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
        [("a.example.com", "m-a"), ("b.example.com", "m-b")]
            .iter()
            .map(|(h, m)| (h.to_string(), m.to_string()))
            .collect()
    });
    static NOTHING: BTreeMap<String, String> = BTreeMap::new();
    static NONE_SERVED: BTreeSet<String> = BTreeSet::new();

    fn view(last_synced: &'static BTreeMap<String, String>) -> MirrorView<'static> {
        MirrorView {
            digest: "D",
            versions: &VERSIONS,
            mirror_of: &MIRROR_OF,
            last_synced,
            served_before: &NONE_SERVED,
        }
    }

    /// A pod that applied the mirrors with `digest` ("D": up to date).
    fn pod(name: &str, digest: &str, sockets: Vec<SocketReport>, drops: u64) -> PodReport {
        PodReport {
            pod: name.into(),
            node: Some(format!("node-{name}")),
            ready: true,
            report: Ok(StatusReport {
                version: "0.1.0".into(),
                port: 443,
                sockets,
                mirrors: Some(MirrorReport {
                    synced: true,
                    count: 2,
                    digest: digest.into(),
                    ..Default::default()
                }),
                udp_drops: drops,
                ..Default::default()
            }),
            trouble: None,
        }
    }

    fn ds(desired: i32, ready: i32) -> DaemonSetStatus {
        DaemonSetStatus {
            desired_number_scheduled: desired,
            number_ready: ready,
            ..Default::default()
        }
    }

    fn cond<'a>(s: &'a Http3ListenerStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    fn inputs<'a>(
        hosts: &'a [HostReport],
        d: Option<&'a DaemonSetStatus>,
        pods: &'a [PodReport],
        previous: Option<&'a Http3ListenerStatus>,
        now: i64,
    ) -> Inputs<'a> {
        Inputs {
            generation: Some(3),
            port: 443,
            blocker: None,
            failed_create: None,
            hosts,
            daemon_set: d,
            pods,
            previous,
            mirrors: Some(view(&NOTHING)),
            client_address: ClientAddressView {
                passing: Passing::UntrustedHeaders,
                proxy_to: "127.0.0.1:443".into(),
            },
            placement: "a Linux node of architecture arm64 (...)".into(),
            now: t(now),
        }
    }

    fn agg(inp: &Inputs) -> Http3ListenerStatus {
        aggregate(inp, &host_statuses(inp))
    }

    fn states(inp: &Inputs) -> Vec<(String, String)> {
        host_statuses(inp)
            .into_iter()
            .map(|h| (h.state, h.reason))
            .collect()
    }

    #[test]
    fn no_scheduled_pods_blame_the_node_selector_only_once_the_daemon_set_was_counted() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let ready_message = |d: Option<&DaemonSetStatus>| {
            cond(&agg(&inputs(&hosts, d, &[], None, 1000)), conditions::READY)
                .message
                .clone()
        };
        let fresh = ds(0, 0);
        assert_eq!(
            ready_message(Some(&fresh)),
            "the DaemonSet controller has not scheduled the data plane yet"
        );
        assert_eq!(ready_message(None), ready_message(Some(&fresh)));
        let counted = DaemonSetStatus {
            observed_generation: Some(1),
            ..ds(0, 0)
        };
        assert_eq!(
            ready_message(Some(&counted)),
            "no node runs the data plane: none is a Linux node of architecture arm64 (...); \
             `kubectl get nodes -L kubernetes.io/arch` shows each node's architecture"
        );
    }

    #[test]
    fn one_ready_pod_probes_alt_svc_and_keeps_the_job_while_it_stays_ready() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(3, 3);
        let prober = |pods: &[PodReport], previous: Option<&str>| {
            let before = previous.map(|p| Http3ListenerStatus {
                alt_svc_prober: Some(p.to_string()),
                ..Default::default()
            });
            agg(&inputs(&hosts, Some(&d), pods, before.as_ref(), 1)).alt_svc_prober
        };
        let up = |name: &str| pod(name, "D", vec![socket("ipv4", false)], 0);
        let all = [up("p3"), up("p1"), up("p2")];
        assert_eq!(prober(&all, None).as_deref(), Some("p1"), "first by name");
        assert_eq!(prober(&all, Some("p2")).as_deref(), Some("p2"), "kept");
        let unready = PodReport {
            ready: false,
            ..up("p2")
        };
        let silent = PodReport {
            report: Err("timed out".into()),
            ..up("p1")
        };
        let pods = [up("p3"), silent, unready];
        assert_eq!(
            prober(&pods, Some("p2")).as_deref(),
            Some("p3"),
            "handed on"
        );
        assert_eq!(prober(&pods[1..], Some("p2")), None, "no pod able");
        assert_eq!(prober(&[], None), None);
    }

    #[test]
    fn hosts_serve_once_every_answering_pod_applied_the_mirrors() {
        let hosts = [
            want("a.example.com", "Serving", reasons::SERVING),
            want("b.example.com", "Serving", reasons::SERVING),
        ];
        let d = ds(2, 2);
        let sockets = || vec![socket("ipv4", false)];
        let synced = [pod("p1", "D", sockets(), 0), pod("p2", "D", sockets(), 0)];
        let inp = inputs(&hosts, Some(&d), &synced, None, 1);
        assert!(pods_up_to_date(&inp));
        assert!(states(&inp).iter().all(|(s, _)| s == "Serving"));

        // One pod still has an older set: every host whose mirror changed since the pods
        // were last in sync is pending; with no record of that, all of them are.
        let behind = [pod("p1", "D", sockets(), 0), pod("p2", "old", sockets(), 0)];
        let inp = inputs(&hosts, Some(&d), &behind, None, 1);
        assert!(!pods_up_to_date(&inp));
        let h = host_statuses(&inp);
        assert_eq!(h[0].reason, reasons::CONFIG_PENDING);
        assert_eq!(h[0].message, "not loaded yet by 1 of 2 data plane pods");
        // b's mirror is unchanged since the last sync: still served while a's loads.
        static B_ONLY: LazyLock<BTreeMap<String, String>> = LazyLock::new(|| {
            [
                ("m-a".to_string(), "1".to_string()),
                ("m-b".to_string(), "1".to_string()),
            ]
            .into_iter()
            .collect()
        });
        let mut inp = inputs(&hosts, Some(&d), &behind, None, 1);
        inp.mirrors = Some(view(&B_ONLY));
        let st = states(&inp);
        assert_eq!(st[0].1, reasons::CONFIG_PENDING);
        assert_eq!(st[1].1, reasons::SERVING);
        // a was served from m-a at version 1, which the pods still have (its certificate was
        // renewed): still served while they load version 2.
        static A_SERVED: LazyLock<BTreeSet<String>> =
            LazyLock::new(|| ["a.example.com".to_string()].into_iter().collect());
        let mut renewed = view(&B_ONLY);
        renewed.served_before = &A_SERVED;
        inp.mirrors = Some(renewed.clone());
        assert!(states(&inp).iter().all(|(_, r)| r == reasons::SERVING));
        // Served before, but from a mirror the pods never had: pending.
        renewed.last_synced = &NOTHING;
        inp.mirrors = Some(renewed);
        assert_eq!(states(&inp)[0].1, reasons::CONFIG_PENDING);

        // No pod answers: pending, with the reason.
        let silent = [PodReport {
            pod: "p1".into(),
            node: None,
            ready: false,
            report: Err("connection refused".into()),
            trouble: None,
        }];
        let inp = inputs(&hosts, Some(&d), &silent, None, 1);
        assert!(!pods_up_to_date(&inp));
        assert_eq!(
            host_statuses(&inp)[0].message,
            "no data plane pod answered /status (p1: connection refused)"
        );
        // Mirrors not written (a blocker): pending.
        let mut inp = inputs(&hosts, Some(&d), &synced, None, 1);
        inp.mirrors = None;
        assert_eq!(states(&inp)[0].1, reasons::CONFIG_PENDING);
    }

    #[test]
    fn a_pod_that_cannot_serve_a_host_overrides_the_operator() {
        let hosts = [
            want("a.example.com", "Serving", reasons::SERVING),
            want("b.example.com", "Serving", reasons::SERVING),
        ];
        let mut p = pod("p1", "D", vec![socket("ipv4", false)], 0);
        if let Ok(r) = &mut p.report {
            let m = r.mirrors.as_mut().unwrap();
            m.failed.push(MirrorFailure {
                mirror: "m-b".into(),
                source: "default/web-tls".into(),
                host: None,
                reason: reasons::CERTIFICATE_INVALID.into(),
                message: "private key PEM: no key".into(),
            });
            m.failed_count = 1;
        }
        let d = ds(1, 1);
        let pods = [p];
        let inp = inputs(&hosts, Some(&d), &pods, None, 1);
        let h = host_statuses(&inp);
        assert_eq!(h[0].state, "Serving");
        assert_eq!(h[1].reason, reasons::CERTIFICATE_INVALID);
        assert_eq!(h[1].message, "p1 on node-p1: private key PEM: no key");
    }

    #[test]
    fn healthy_listener_is_ready_with_counts_and_buffers() {
        let hosts = [
            want("a.example.com", "Serving", reasons::SERVING),
            want("b.example.com", "Serving", reasons::SERVING),
        ];
        let both = || vec![socket("ipv4", false), socket("ipv6", false)];
        let pods = [pod("p1", "D", both(), 0), pod("p2", "D", both(), 0)];
        let d = ds(2, 2);
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1000));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(s.hosts_summary.as_deref(), Some("2/2"));
        assert_eq!(s.nodes.as_ref().unwrap().summary, "2/2");
        let ready = cond(&s, conditions::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", reasons::ALL_HOSTS_SERVING)
        );
        assert_eq!(ready.observed_generation, Some(3));
        assert_eq!(
            cond(&s, conditions::SOCKETS_BOUND).message,
            "UDP port 443 bound for ipv4 and ipv6 on 2 pods"
        );
        assert_eq!(cond(&s, conditions::BUFFERS_APPLIED).status, "True");
        assert_eq!(cond(&s, conditions::DEGRADED).status, "False");
        assert!(s.hosts.is_empty(), "served hosts are counted, not listed");
        assert_eq!(
            s.host_counts,
            [HostCount {
                state: "Serving".into(),
                reason: "Serving".into(),
                count: 2
            }]
        );
        let udp = s.udp.unwrap();
        assert_eq!(
            (udp.drops, udp.min_receive_buffer_bytes, udp.clamped),
            (0, Some(8_388_608), false)
        );
    }

    #[test]
    fn clamped_buffers_bind_failures_and_pending_hosts_are_explained() {
        let hosts = [
            want("a.example.com", "Serving", reasons::SERVING),
            want("gone.example.com", "NotServing", reasons::SECRET_NOT_FOUND),
        ];
        let mut bad = socket("ipv6", false);
        bad.bound = false;
        bad.error = "Address already in use".into();
        let pods = [pod("p1", "old", vec![socket("ipv4", true), bad], 0)];
        let d = ds(1, 1);
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1000));
        let b = cond(&s, conditions::BUFFERS_APPLIED);
        assert_eq!(
            (b.status.as_str(), b.reason.as_str()),
            ("False", reasons::CLAMPED)
        );
        assert!(
            b.message
                .contains("p1 on node-p1: ipv4 receive buffer 425984 bytes"),
            "{}",
            b.message
        );
        assert!(b.message.contains("7500000"), "{}", b.message);
        let sb = cond(&s, conditions::SOCKETS_BOUND);
        assert_eq!(
            (sb.status.as_str(), sb.reason.as_str()),
            ("False", reasons::BIND_FAILED)
        );
        assert_eq!(
            sb.message,
            "p1 on node-p1: ipv6 [::]:443: Address already in use"
        );
        assert_eq!(cond(&s, conditions::READY).reason, reasons::BIND_FAILED);
        assert_eq!(s.hosts[0].reason, reasons::CONFIG_PENDING);
        assert_eq!(s.hosts[1].reason, reasons::SECRET_NOT_FOUND);
        assert_eq!(s.hosts_summary.as_deref(), Some("0/2"));
        let deg = cond(&s, conditions::DEGRADED);
        assert_eq!(
            (deg.status.as_str(), deg.reason.as_str()),
            ("True", reasons::SOME_HOSTS_NOT_SERVING)
        );
        assert!(
            deg.message.contains("gone.example.com (SecretNotFound)"),
            "{}",
            deg.message
        );
        assert!(s.udp.unwrap().clamped);
    }

    #[test]
    fn troubled_pods_are_named_in_ready_and_recent_exits_in_degraded() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d21 = ds(2, 1);
        // A pod the kubelet keeps killing: its words are in the message, a ready pod's not.
        let exit = |at: i64| LastExit {
            reason: "OOMKilled".into(),
            exit_code: 137,
            finished: Some(t(at)),
        };
        let mut oom = pod("p2", "D", vec![], 0);
        oom.ready = false;
        oom.trouble = Some(ContainerTrouble {
            waiting: None,
            last_exit: Some(exit(0)),
            restarts: 2,
        });
        let mut restarted_ready = pod("p1", "D", vec![], 0);
        restarted_ready.trouble = Some(ContainerTrouble {
            waiting: None,
            last_exit: Some(exit(-RECENT_EXIT_SECONDS - 1)),
            restarts: 1,
        });
        let s = agg(&inputs(
            &hosts,
            Some(&d21),
            &[restarted_ready, oom],
            None,
            1,
        ));
        assert_eq!(
            cond(&s, conditions::READY).message,
            "1 of 2 data plane pods ready; p2 on node-p2: last exit: OOMKilled (exit code \
             137) at 1970-01-01T00:00:00Z, 2 restarts"
        );
        // Degraded names the exit of the last ten minutes, not the older one.
        let d = cond(&s, conditions::DEGRADED);
        assert_eq!(
            (d.status.as_str(), d.reason.as_str()),
            ("True", reasons::CONTAINER_EXITED)
        );
        assert!(
            d.message.contains("p2 on node-p2: last exit: OOMKilled"),
            "{}",
            d.message
        );
        assert!(!d.message.contains("p1"), "{}", d.message);
    }

    #[test]
    fn a_refused_listener_says_only_why_and_keeps_its_transition_time() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(2, 2);
        let mut i = inputs(&hosts, Some(&d), &[], None, 1000);
        i.generation = Some(4);
        let running = agg(&i);
        assert!(running.nodes.is_some() && running.hosts_summary.is_some());
        let first = refused(
            Some(&running),
            Some(4),
            reasons::NO_CONTROLLER,
            "nobody".into(),
            Timestamp::from_second(2000).unwrap(),
        );
        assert_eq!(first.conditions.len(), 1);
        let c = &first.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Ready", "False", "NoController")
        );
        assert_eq!(
            (first.observed_generation, c.observed_generation),
            (Some(4), Some(4))
        );
        assert!(first.nodes.is_none() && first.hosts_summary.is_none() && first.udp.is_none());
        let again = refused(
            Some(&first),
            Some(4),
            reasons::NO_CONTROLLER,
            "nobody".into(),
            Timestamp::from_second(3000).unwrap(),
        );
        assert_eq!(again, first, "nothing moved: no write");
        assert!(!needs_write(Some(&first), &again));
    }

    #[test]
    fn ready_explains_each_blocker_in_order() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let ok_pod = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let (d11, d21) = (ds(1, 1), ds(2, 1));
        let mut i = inputs(&hosts, Some(&d11), &ok_pod, None, 1);
        i.blocker = Some(Blocker {
            reason: reasons::INVALID_SPEC,
            message: "spec.upstream.address: \"x\" is not host:port (no port)".into(),
        });
        assert_eq!(
            cond(&agg(&i), conditions::READY).reason,
            reasons::INVALID_SPEC
        );

        let none: [HostReport; 0] = [];
        let s = agg(&inputs(&none, Some(&d11), &ok_pod, None, 1));
        assert_eq!(cond(&s, conditions::READY).reason, reasons::NO_HOSTS);
        assert_eq!(s.hosts_summary.as_deref(), Some("0/0"));

        let s = agg(&inputs(&hosts, Some(&d21), &ok_pod, None, 1));
        let r = cond(&s, conditions::READY);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (reasons::PODS_NOT_READY, "1 of 2 data plane pods ready")
        );
        let s = agg(&inputs(&hosts, None, &ok_pod, None, 1));
        assert_eq!(cond(&s, conditions::READY).reason, reasons::PODS_NOT_READY);
        // A surge roll: the DaemonSet counts the old, draining pod of the second node, but
        // the new pod beside it is Ready, so both nodes are served.
        let rolling = [pod("p1", "D", vec![], 0), pod("p2", "D", vec![], 0)];
        let s = agg(&inputs(&hosts, Some(&d21), &rolling, None, 1));
        assert_eq!(s.nodes.as_ref().map(|n| n.summary.as_str()), Some("2/2"));
        let mut unready = rolling.clone();
        unready[1].ready = false;
        let s = agg(&inputs(&hosts, Some(&d21), &unready, None, 1));
        assert_eq!(s.nodes.as_ref().map(|n| n.summary.as_str()), Some("1/2"));

        let unreachable = [PodReport {
            pod: "p1".into(),
            node: None,
            ready: false,
            report: Err("connection refused".into()),
            trouble: None,
        }];
        let s = agg(&inputs(&hosts, Some(&d11), &unreachable, None, 1));
        let r = cond(&s, conditions::READY);
        assert_eq!(r.reason, reasons::NO_REPORTS);
        assert_eq!(
            r.message,
            "no data plane pod answered /status (p1: connection refused)"
        );
        assert_eq!(cond(&s, conditions::SOCKETS_BOUND).status, "Unknown");
        assert_eq!(cond(&s, conditions::BUFFERS_APPLIED).status, "Unknown");
        assert!(s.udp.is_none(), "unknown, not zero");

        let two = [
            want("a.example.com", "Serving", reasons::SERVING),
            want("b.example.com", "NotServing", reasons::NO_TLS),
        ];
        let s = agg(&inputs(&two, Some(&d11), &ok_pod, None, 1));
        let r = cond(&s, conditions::READY);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("True", reasons::SOME_HOSTS_SERVING)
        );
        assert!(
            r.message
                .starts_with("1 of 2 hosts served; not served: b.example.com (NoTLS)"),
            "{}",
            r.message
        );
        let behind = [pod("p1", "old", vec![socket("ipv4", false)], 0)];
        let s = agg(&inputs(&hosts, Some(&d11), &behind, None, 1));
        assert_eq!(
            cond(&s, conditions::READY).reason,
            reasons::NO_HOSTS_SERVING
        );
    }

    #[test]
    fn the_status_stays_small_at_ten_thousand_hosts() {
        let long = "x".repeat(5000);
        let hosts: Vec<HostReport> = (0..10_000)
            .map(|i| {
                let mut h = if i % 2 == 0 {
                    want(&format!("h{i:05}.example.com"), "Serving", reasons::SERVING)
                } else {
                    want(
                        &format!("h{i:05}.example.com"),
                        "NotServing",
                        reasons::NO_TLS,
                    )
                };
                h.message = long.clone();
                h
            })
            .collect();
        let d = ds(2, 2);
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1));
        assert_eq!(s.hosts.len(), MAX_STATUS_HOSTS);
        assert_eq!(s.hosts_omitted, 5000 - MAX_STATUS_HOSTS as i64);
        assert_eq!(s.hosts_summary.as_deref(), Some("5000/10000"));
        let bytes = serde_json::to_vec(&s).unwrap().len();
        assert!(bytes <= 64 * 1024, "{bytes} bytes");
        assert!(s.hosts.iter().all(|h| h.message.len() <= MAX_HOST_MESSAGE));
    }

    /// A served host whose certificate was judged: `public` says whether it chains to a
    /// public web root.
    fn judged(name: &str, public: bool) -> HostReport {
        HostReport {
            public_roots: Some(public),
            ..want(name, "Serving", reasons::SERVING)
        }
    }

    #[test]
    fn public_roots_names_a_few_private_hosts_counts_the_rest_and_leaves_ready_alone() {
        let d = ds(1, 1);
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let public = [judged("a.example.com", true), judged("b.example.com", true)];
        let s = agg(&inputs(&public, Some(&d), &pods, None, 1000));
        let c = cond(&s, conditions::PUBLIC_ROOTS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "True",
                reasons::ALL_PUBLICLY_TRUSTED,
                "all 2 hosts have certificates that chain to a public web root"
            )
        );
        assert_eq!(private_roots_named(c), (vec![], false));

        let mixed = [
            judged("a.example.com", true),
            judged("b.example.com", false),
            want("c.example.com", "NotServing", reasons::SECRET_NOT_FOUND),
        ];
        let s = agg(&inputs(&mixed, Some(&d), &pods, Some(&s), 2000));
        let c = cond(&s, conditions::PUBLIC_ROOTS);
        println!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "False",
                reasons::PRIVATE_ROOTS,
                "1 of 2 hosts has a certificate that does not chain to a public web root: \
                 Chrome will not use HTTP/3 for it (Firefox and Safari may); e.g. b.example.com"
            )
        );
        assert_eq!(c.last_transition_time.0, t(2000));
        assert_eq!(private_roots_named(c), (vec!["b.example.com"], false));
        let ready = cond(&s, conditions::READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", reasons::SOME_HOSTS_SERVING),
            "the certificates' roots are not Ready's business"
        );
        assert!(!cond(&s, conditions::DEGRADED)
            .message
            .contains("public web root"));

        // Unchanged verdict later: no new transition time, nothing to write.
        let again = agg(&inputs(&mixed, Some(&d), &pods, Some(&s), 3000));
        let c = cond(&again, conditions::PUBLIC_ROOTS);
        assert_eq!(c.last_transition_time.0, t(2000));
        assert!(!needs_write(Some(&s), &again));

        // No verdict (nothing served, or a view without one): Unknown, not True.
        let none = [want(
            "c.example.com",
            "NotServing",
            reasons::SECRET_NOT_FOUND,
        )];
        let c = agg(&inputs(&none, Some(&d), &pods, None, 1));
        assert_eq!(cond(&c, conditions::PUBLIC_ROOTS).status, "Unknown");
        assert_eq!(
            cond(&c, conditions::PUBLIC_ROOTS).reason,
            reasons::NO_CERTIFICATES
        );
    }

    /// A served host without a verdict is one whose Secret lacks the leaf's intermediate
    /// (`roots::Roots::Incomplete`): unknown, never counted as private.
    #[test]
    fn public_roots_says_an_incomplete_chain_is_unknown_not_private() {
        let d = ds(1, 1);
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let leaf_only = want("l.example.com", "Serving", reasons::SERVING);
        let hosts = [judged("a.example.com", true), leaf_only.clone()];
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1));
        let c = cond(&s, conditions::PUBLIC_ROOTS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            (
                "Unknown",
                reasons::INCOMPLETE_CHAIN,
                "the Secrets of 1 of 2 hosts hold an incomplete chain (the leaf without the \
                 intermediate that issued it), so whether they reach a public web root is \
                 unknown: browsers that have or fetch the intermediate may accept them, and \
                 h3-ingress sends what the Secret holds, so a client without it fails over \
                 HTTP/3 as over TCP; e.g. l.example.com"
            )
        );
        assert!(incomplete_chains_counted(c));
        assert_eq!(private_roots_named(c), (vec![], false));
        // Beside a private host: False for the private one, which alone is named; the
        // incomplete one is counted.
        let hosts = [judged("p.example.com", false), leaf_only];
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1));
        let c = cond(&s, conditions::PUBLIC_ROOTS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::PRIVATE_ROOTS)
        );
        assert!(
            c.message.starts_with(
                "1 of 1 hosts has a certificate that does not chain to a public web root: \
                 Chrome will not use HTTP/3 for it (Firefox and Safari may); the Secrets of 1 \
                 other hosts hold an incomplete chain"
            ),
            "{}",
            c.message
        );
        assert_eq!(private_roots_named(c), (vec!["p.example.com"], false));
        assert!(incomplete_chains_counted(c));
    }

    #[test]
    fn public_roots_stays_one_short_condition_at_ten_thousand_hosts() {
        let hosts: Vec<HostReport> = (0..10_000)
            .map(|i| judged(&format!("h{i:05}.example.com"), i % 10 != 0))
            .collect();
        let d = ds(1, 1);
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let s = agg(&inputs(&hosts, Some(&d), &pods, None, 1));
        let c = cond(&s, conditions::PUBLIC_ROOTS);
        println!("{}={} ({}): {}", c.type_, c.status, c.reason, c.message);
        assert_eq!(
            c.message,
            "1000 of 10000 hosts have certificates that do not chain to a public web root: \
             Chrome will not use HTTP/3 for them (Firefox and Safari may); e.g. \
             h00000.example.com, h00010.example.com, h00020.example.com, h00030.example.com, \
             h00040.example.com and 995 more"
        );
        let (named, more) = private_roots_named(c);
        assert_eq!((named.len(), more), (5, true));
        assert_eq!(named[4], "h00040.example.com");
    }

    #[test]
    fn udp_drops_degrade_only_while_they_grow_and_restarts_do_not_count() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(1, 1);
        let p = |drops| [pod("p1", "D", vec![socket("ipv4", false)], drops)];
        let first = agg(&inputs(&hosts, Some(&d), &p(284), None, 1));
        assert_eq!(
            cond(&first, conditions::DEGRADED).status,
            "False",
            "no baseline yet"
        );
        let grown = agg(&inputs(&hosts, Some(&d), &p(300), Some(&first), 2));
        let deg = cond(&grown, conditions::DEGRADED);
        assert_eq!(
            (deg.status.as_str(), deg.reason.as_str()),
            ("True", reasons::UDP_DROPS)
        );
        assert!(
            deg.message.starts_with("16 UDP datagrams dropped"),
            "{}",
            deg.message
        );
        let restarted = agg(&inputs(&hosts, Some(&d), &p(3), Some(&grown), 3));
        assert_eq!(cond(&restarted, conditions::DEGRADED).status, "False");
    }

    #[test]
    fn restart_required_reports_mean_a_rollout_is_pending() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(1, 1);
        let mut p = pod("p1", "D", vec![socket("ipv4", false)], 0);
        if let Ok(r) = &mut p.report {
            r.restart_required = vec!["port 443 -> 8443".into()];
        }
        let s = agg(&inputs(&hosts, Some(&d), &[p], None, 1));
        let deg = cond(&s, conditions::DEGRADED);
        assert_eq!(deg.reason, reasons::ROLLOUT_PENDING);
        assert!(
            deg.message.contains("p1 on node-p1: port 443 -> 8443"),
            "{}",
            deg.message
        );
    }

    #[test]
    fn transition_times_move_only_with_status_and_unchanged_status_is_not_rewritten() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(1, 1);
        let ok = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let first = agg(&inputs(&hosts, Some(&d), &ok, None, 1000));
        let again = agg(&inputs(&hosts, Some(&d), &ok, Some(&first), 2000));
        assert_eq!(
            cond(&again, conditions::READY).last_transition_time.0,
            t(1000)
        );
        assert!(
            !needs_write(Some(&first), &again),
            "same status later is no change"
        );
        let d2 = ds(2, 1);
        let worse = agg(&inputs(&hosts, Some(&d2), &ok, Some(&again), 3000));
        assert_eq!(
            cond(&worse, conditions::READY).last_transition_time.0,
            t(3000)
        );
        assert_eq!(
            cond(&worse, conditions::SOCKETS_BOUND)
                .last_transition_time
                .0,
            t(1000)
        );
        assert!(needs_write(Some(&again), &worse));
        assert!(needs_write(None, &again));
        let more = [pod(
            "p1",
            "D",
            vec![socket("ipv4", false), socket("ipv6", false)],
            0,
        )];
        let msg = agg(&inputs(&hosts, Some(&d), &more, Some(&again), 4000));
        assert_eq!(
            cond(&msg, conditions::SOCKETS_BOUND).last_transition_time.0,
            t(1000)
        );
        assert!(needs_write(Some(&again), &msg));
    }

    #[test]
    fn counters_alone_are_written_at_most_once_a_minute() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let d = ds(1, 1);
        let busy = |drops: u64| [pod("p1", "D", vec![socket("ipv4", false)], drops)];
        let first = agg(&inputs(&hosts, Some(&d), &busy(0), None, 1000));
        assert_eq!(first.counters_time.as_ref().unwrap().0, t(1000));
        // Drops that stay put are no change; a new counters time alone waits a minute.
        let soon = agg(&inputs(&hosts, Some(&d), &busy(0), Some(&first), 1059));
        assert!(!needs_write(Some(&first), &soon));
        let d2 = ds(2, 1);
        let worse = agg(&inputs(&hosts, Some(&d2), &busy(0), Some(&first), 1001));
        assert!(needs_write(Some(&first), &worse));
        let dropping = agg(&inputs(&hosts, Some(&d), &busy(7), Some(&first), 1001));
        assert_eq!(
            cond(&dropping, conditions::DEGRADED).reason,
            reasons::UDP_DROPS
        );
        assert!(needs_write(Some(&first), &dropping));
        let none = agg(&inputs(&hosts, Some(&d), &[], None, 1000));
        assert!(none.udp.is_none() && none.counters_time.is_none());
    }

    #[test]
    fn blockers_and_pods_the_daemon_set_cannot_create_make_ready_false() {
        let hosts = [want("a.example.com", "Serving", reasons::SERVING)];
        let mut i = inputs(&hosts, None, &[], None, 1);
        i.blocker = Some(Blocker {
            reason: reasons::FORBIDDEN,
            message: "applying DaemonSet h3-ingress/h3-ingress-public: forbidden".into(),
        });
        let r = agg(&i);
        let c = cond(&r, conditions::READY);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::FORBIDDEN)
        );

        let mut d = ds(2, 0);
        d.current_number_scheduled = 0;
        let msg = "Error creating: pods \"h3-ingress-public-x\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostNetwork=true)";
        let mut i = inputs(&hosts, Some(&d), &[], None, 1);
        i.failed_create = Some(msg.into());
        let s = agg(&i);
        let r = cond(&s, conditions::READY);
        assert_eq!(
            (r.status.as_str(), r.reason.as_str()),
            ("False", reasons::PODS_NOT_CREATED)
        );
        assert_eq!(
            r.message,
            format!("2 of 2 data plane pods not created: {msg}")
        );
        d.current_number_scheduled = 2;
        let mut i = inputs(&hosts, Some(&d), &[], None, 1);
        i.failed_create = Some(msg.into());
        assert_eq!(
            cond(&agg(&i), conditions::READY).reason,
            reasons::PODS_NOT_READY
        );
    }

    #[test]
    fn client_address_says_how_the_address_travels_and_counts_the_hosts_held_back() {
        let held = HostReport {
            message: "nginx.ingress.kubernetes.io/whitelist-source-range: ...".into(),
            ..want(
                "b.example.com",
                host_states::NOT_SERVING,
                reasons::CLIENT_ADDRESS_POLICY,
            )
        };
        let hosts = [want("a.example.com", "Serving", reasons::SERVING), held];
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let d = ds(1, 1);
        let mut i = inputs(&hosts, Some(&d), &pods, None, 1000);
        let s = agg(&i);
        let c = cond(&s, conditions::CLIENT_ADDRESS);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reasons::UNTRUSTED_FORWARDED_HEADERS)
        );
        assert!(c.message.contains("; 1 hosts not served"), "{}", c.message);
        // A note: Ready still counts the other host as served.
        assert_eq!(cond(&s, conditions::READY).status, "True");
        i.client_address = ClientAddressView {
            passing: Passing::ProxyProtocol,
            proxy_to: "127.0.0.1:8443".into(),
        };
        let c = cond(&agg(&i), conditions::CLIENT_ADDRESS).clone();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::PROXY_PROTOCOL)
        );
        assert!(c
            .message
            .starts_with("in a PROXY protocol v2 header to 127.0.0.1:8443"));
        let view = ClientAddressView::of(
            &serde_json::from_value(serde_json::json!({
            "address": "127.0.0.1:443", "proxyProtocol": true}))
            .unwrap(),
        );
        assert_eq!(view.proxy_to, "127.0.0.1:443");
    }

    #[test]
    fn a_served_host_with_a_policy_value_not_carried_degrades_the_listener() {
        let noted = HostReport {
            message: "nginx.ingress.kubernetes.io/proxy-read-timeout: \"ten\" ...".into(),
            ..want("a.example.com", "Serving", reasons::SERVING)
        };
        let hosts = [noted];
        let pods = [pod("p1", "D", vec![socket("ipv4", false)], 0)];
        let d = ds(1, 1);
        let i = inputs(&hosts, Some(&d), &pods, None, 1000);
        let statuses = host_statuses(&i);
        assert_eq!(statuses[0].state, host_states::SERVING);
        assert!(statuses[0].message.contains("proxy-read-timeout"));
        let s = aggregate(&i, &statuses);
        let c = cond(&s, conditions::DEGRADED);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::POLICY_VALUE_IGNORED)
        );
        assert!(c
            .message
            .contains("a.example.com: nginx.ingress.kubernetes.io/proxy-read-timeout"));
        assert!(
            s.hosts.is_empty(),
            "served hosts stay out of the bounded list"
        );
    }
}
