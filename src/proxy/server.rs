//! The running data plane, wired together: sockets and endpoints ([`super::quic::endpoint`]), the
//! shared state ([`super::state`]), the admin endpoint and the Alt-Svc probe, the accept loops
//! ([`super::http3::connection`]); then configuration updates applied live until shutdown, and the
//! graceful drain.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn, Level};

use super::admin::AdminPort;
use super::altsvc;
use super::handover::{self, Local, Role, View};
use super::http3::connection;
use super::http3::serving::Generation;
use super::observe::logs;
use super::observe::logs::{limited, Reason};
use super::observe::metrics::{reload, Metrics};
use super::quic::cc::CcStats;
use super::quic::endpoint::{self, Family};
use super::quic::keys::{self, Keys, Origin};
use super::source::ConfigUpdate;
use super::state::Shared;
use super::upstream::Upstream;
use super::ProxyError;
use crate::api::RolloutReport;
use crate::config::ProxyConfig;

/// Handles a caller gets once the proxy is serving (tests, demo).
#[derive(Clone)]
pub struct RunningProxy {
    pub udp_addrs: Vec<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
}

/// What a process does once a newer generation on its host took its port over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenSuperseded {
    /// Standalone: exit when the last connection ends or at the drain deadline.
    Exit,
    /// Kubernetes: drain the same way, then wait for SIGTERM (a container that exits on its
    /// own is restarted by the kubelet).
    AwaitSignal,
}

/// How one process runs besides its configuration.
#[derive(Clone)]
pub struct ServeOptions {
    /// Kubernetes: the listener's keys Secret; takes precedence over `keys.file`.
    pub keys_file: Option<PathBuf>,
    pub when_superseded: WhenSuperseded,
    /// Outranks join order among the generations on a host (the pod template generation).
    pub rank: u64,
    /// Told when the data plane runs, for `h3-ingress probe`.
    pub probe: Option<Arc<super::probe::ProbeState>>,
    /// Who shares the port with whom besides port and addresses (Kubernetes: the listener).
    pub identity: Option<String>,
    /// Whether this process probes the TCP ingress for Alt-Svc, as it changes (Kubernetes:
    /// the pod the listener's status names); `None`: always (a standalone proxy is alone).
    pub alt_svc_prober: Option<tokio::sync::watch::Receiver<bool>>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            keys_file: None,
            when_superseded: WhenSuperseded::Exit,
            rank: 0,
            probe: None,
            identity: None,
            alt_svc_prober: None,
        }
    }
}

/// Waits for `f` unless `shutdown` comes first.
async fn until<T>(
    shutdown: &CancellationToken,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        t = f => Some(t),
        _ = shutdown.cancelled() => None,
    }
}

/// Runs the data plane on `initial` until `shutdown` fires (or, standalone, until a newer
/// process on the host has taken the port over and this one has drained), applying
/// `updates` live, then drains.
pub async fn serve(
    initial: ProxyConfig,
    updates: mpsc::Receiver<ConfigUpdate>,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
    mut opts: ServeOptions,
) -> Result<(), ProxyError> {
    let metrics = Metrics::new();
    let cc_stats = CcStats::new();
    let upstream = Upstream::new(&initial.upstream, &initial.hosts, metrics.upstream())?;
    let listen = initial.listen.clone();
    let spec = handover::Spec::new(
        &listen,
        opts.identity.as_deref(),
        initial.metrics_address,
        opts.rank,
    );
    let mut handover = handover::start(spec);
    let Some(joined) = until(&shutdown, handover.joined()).await else {
        return Ok(());
    };
    let joined = joined.map_err(|e| ProxyError::Handover(e.to_string()))?;
    let keys_path = opts.keys_file.as_deref().or(initial.keys_file.as_deref());
    let keys = load_keys(keys_path, joined.secret)?;
    handover.tell(Local::Secret(keys.secret().to_vec()));
    metrics.follow_config(&initial);
    let first = Generation {
        id: 1,
        config: initial,
        upstream,
    };
    let mut shared = Shared::new(first, metrics, cc_stats, listen.port, vec![]);
    if let Some(p) = opts.alt_svc_prober.take() {
        shared.alt_svc_prober = p;
    }
    let shared = Arc::new(shared);
    publish(&shared, &handover.view.borrow());
    if let Some(p) = &opts.probe {
        p.set(shared.clone());
    }
    let mut admin = AdminPort::new(shared.clone(), shutdown.clone());
    if let Some(l) = joined.admin {
        admin.set_listener(l);
    }
    try_bind_admin(&mut admin, &shared, &handover)?;
    tokio::spawn(altsvc::probe_loop(shared.clone(), shutdown.clone()));
    tokio::spawn(logs::report_suppressed(shutdown.clone()));
    let Some(sockets) = wait_sockets(&mut handover, &mut admin, &shared, &shutdown).await? else {
        return Ok(());
    };
    let unbound = handover.view.borrow().unbound.clone();
    let why = |addr: SocketAddr| {
        let known = unbound.iter().find(|(a, _)| a.ip() == addr.ip());
        known.map_or_else(
            || "the process that created the port's sockets could not bind it".to_string(),
            |(_, e)| e.clone(),
        )
    };
    let bound = endpoint::configure_all(sockets, &listen, &shared.serving.metrics, why)?;
    shared.set_sockets(bound.reports);
    let id = endpoint::Identity {
        keys: &keys,
        slot: joined.slot,
        guard: &shared.serving.guard,
    };
    let current = shared.serving.current.load_full();
    let families = endpoint::endpoints(
        bound.sockets,
        &current.config,
        &shared.serving.metrics,
        &shared.cc_stats,
        id,
    )?;
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    for f in &families {
        let (ep, s) = (f.endpoint.clone(), shared.serving.clone());
        tokio::spawn(connection::accept_loop(
            ep,
            f.gate.clone(),
            f.name,
            s,
            tracker.clone(),
            stop.clone(),
        ));
    }
    if let Some(tx) = ready {
        let _ = tx.send(RunningProxy {
            udp_addrs: families.iter().map(|f| f.addr).collect(),
            admin_addr: admin
                .local_addr()
                .unwrap_or(shared.serving.current.load().config.metrics_address),
            shared: shared.clone(),
        });
    }
    let mut run = Running {
        shared: &shared,
        families: &families,
        handover: &handover,
        admin: &mut admin,
        tracker: &tracker,
        marker: keys.marker(),
        when_superseded: opts.when_superseded,
    };
    match run.follow(updates, &shutdown).await {
        End::Signal => {
            handover.tell(Local::Terminating);
            drain_and_close(&shared, &families, tracker, stop).await
        }
        End::Superseded => close(&families, tracker, stop).await,
    }
    Ok(())
}

/// Shows what the coordination says in `/status` and the metrics.
fn publish(shared: &Shared, v: &View) {
    let m = &shared.serving.metrics;
    m.rollout_generations.set(v.generations as i64);
    m.rollout_newest.set(i64::from(v.role == Role::Newest));
    shared.set_rollout(RolloutReport {
        role: v.role.as_str().to_string(),
        slot: v.slot.map(|s| s as u32),
        generation: v.generation,
        generations: v.generations as u32,
        coordinating: v.hub,
        solo: v.solo,
        waiting: v.waiting.clone().unwrap_or_default(),
    });
}

/// Binds the admin listener unless this process has one (from the hand-over or an earlier
/// attempt). A port held by a socket without SO_REUSEPORT (h3-ingress 0.1.0) is tried again
/// on the next call; any other error is fatal, as it always was.
fn try_bind_admin(
    admin: &mut AdminPort,
    shared: &Shared,
    handover: &handover::Handle,
) -> Result<(), ProxyError> {
    try_bind_admin_with(admin, shared, &handover.tx())
}

/// This process's UDP sockets, once it has them; meanwhile `/status` says what it waits for.
async fn wait_sockets(
    handover: &mut handover::Handle,
    admin: &mut AdminPort,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Result<Option<Vec<UdpSocket>>, ProxyError> {
    let mut view = handover.view.clone();
    let tell = handover.tx();
    let sockets = handover.sockets();
    tokio::pin!(sockets);
    let mut tick = tokio::time::interval(handover::RETRY);
    // The admin endpoint says why meanwhile, when this process is the one to answer it.
    let admin_role = |admin: &mut AdminPort, v: &View| match v.role {
        Role::Newest => admin.resume(),
        _ => admin.pause(),
    };
    admin_role(admin, &view.borrow_and_update());
    loop {
        tokio::select! {
            s = &mut sockets => {
                let why = view.borrow().waiting.clone();
                return match (s, why) {
                    (Ok(s), _) => Ok(Some(s)),
                    (Err(_), Some(why)) => Err(endpoint::EndpointError::NoSockets(why).into()),
                    (Err(e), None) => Err(ProxyError::Handover(e.to_string())),
                };
            }
            _ = view.changed() => {
                let v = view.borrow_and_update().clone();
                publish(shared, &v);
                admin_role(admin, &v);
            }
            _ = tick.tick() => try_bind_admin_with(admin, shared, &tell)?,
            _ = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Why [`Running::follow`] returned.
enum End {
    /// SIGTERM or SIGINT.
    Signal,
    /// Standalone, superseded, and drained (or past the drain deadline).
    Superseded,
}

/// The running process: configuration updates, its role among the generations on the host,
/// its readiness.
struct Running<'a> {
    shared: &'a Arc<Shared>,
    families: &'a [Family],
    handover: &'a handover::Handle,
    admin: &'a mut AdminPort,
    tracker: &'a TaskTracker,
    marker: u16,
    when_superseded: WhenSuperseded,
}

/// How often the running process looks at its readiness and its drain.
const TICK: Duration = Duration::from_millis(100);

impl Running<'_> {
    /// Applies updates and role changes until a signal, or (standalone) until it has drained
    /// for a newer process.
    async fn follow(
        &mut self,
        mut updates: mpsc::Receiver<ConfigUpdate>,
        shutdown: &CancellationToken,
    ) -> End {
        let mut updates_open = true;
        let mut view = self.handover.view.clone();
        let mut view_open = true;
        let mut told_ready = false;
        let mut superseded: Option<Instant> = None;
        let mut closed_at_deadline = false;
        let mut tick = tokio::time::interval(TICK);
        let mut lines = logs::CauseLog::new(logs::WINDOW);
        self.role(&view.borrow_and_update(), &mut superseded);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return End::Signal,
                u = updates.recv(), if updates_open => match u {
                    Some(ConfigUpdate::Apply(next)) => {
                        let _ = apply(self.shared, self.families, *next, &mut lines);
                    }
                    Some(ConfigUpdate::Invalid(why)) => reject(self.shared, &why, &mut lines),
                    None => updates_open = false,
                },
                c = view.changed(), if view_open => match c {
                    Ok(()) => self.role(&view.borrow_and_update(), &mut superseded),
                    Err(_) => view_open = false,
                },
                _ = tick.tick() => {
                    let tell = self.handover.tx();
                    if let Err(e) = try_bind_admin_with(self.admin, self.shared, &tell) {
                        error!("{e}");
                    }
                }
            }
            if !told_ready && self.shared.is_ready() {
                told_ready = true;
                info!("ready: taking new connections once the processes sharing the port agree");
                self.handover.tell(Local::Ready {
                    marker: self.marker,
                });
            }
            let Some(since) = superseded else { continue };
            let drain = self.drain_timeout();
            let idle = self.tracker.is_empty();
            if self.when_superseded == WhenSuperseded::Exit && (idle || since.elapsed() >= drain) {
                info!(
                    connections = self.tracker.len(),
                    "superseded and drained: exiting"
                );
                return End::Superseded;
            }
            if !closed_at_deadline && since.elapsed() >= drain && !idle {
                closed_at_deadline = true;
                warn!(connections = self.tracker.len(), "drain deadline reached; closing the remaining connections, then waiting for SIGTERM");
                self.shared.serving.close_connections();
            }
        }
    }

    fn drain_timeout(&self) -> Duration {
        Duration::from_secs(
            self.shared
                .serving
                .current
                .load()
                .config
                .http
                .drain_timeout_seconds as u64,
        )
    }

    /// Acts on the role the coordination gives this process.
    fn role(&mut self, v: &View, superseded: &mut Option<Instant>) {
        publish(self.shared, v);
        match v.role {
            Role::Newest => {
                if superseded.take().is_some() {
                    limited!(
                        Level::INFO,
                        Reason::Resumed,
                        "the newer process is gone: taking new connections again"
                    );
                }
                self.shared
                    .serving
                    .superseded
                    .store(false, Ordering::Relaxed);
                self.admin.resume();
            }
            Role::Superseded if superseded.is_none() => {
                *superseded = Some(Instant::now());
                self.admin.pause();
                self.shared
                    .serving
                    .superseded
                    .store(true, Ordering::Relaxed);
                self.shared.serving.drain_connections();
                limited!(
                    Level::INFO,
                    Reason::Superseded,
                    connections = self.tracker.len(),
                    drain_timeout = ?self.drain_timeout(),
                    "superseded by a newer process on this host: GOAWAY sent, draining"
                );
            }
            Role::Superseded => {}
            Role::Pending => self.admin.pause(),
        }
    }
}

/// Counts a configuration update that cannot apply; a source that keeps sending the same
/// invalid update gets one line a minute.
fn reject(shared: &Shared, why: &str, lines: &mut logs::CauseLog) {
    let m = &shared.serving.metrics;
    m.config_reloads.with_label_values(&[reload::INVALID]).inc();
    if let Some(held) = lines.allow(why, std::time::Instant::now()) {
        error!(
            earlier_unlogged = held,
            "configuration update rejected, still serving the previous one: {why}"
        );
    }
}

/// What [`apply`] did with an update.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// Serving it as generation `id`; `restart_required` lists what it could not change.
    Live {
        id: u64,
        restart_required: Vec<String>,
    },
    /// Not applied (counted as invalid): the text says why.
    Rejected(String),
}

/// Applies a new configuration to the running endpoints without touching connections.
/// Changes that need new sockets are refused (counted, logged and listed in `/status`) and
/// the rest applies. While thousands of hosts load, updates come every second: `lines`
/// keeps each kind of line to one a minute.
pub fn apply(
    shared: &Arc<Shared>,
    families: &[Family],
    mut next: ProxyConfig,
    lines: &mut logs::CauseLog,
) -> Applied {
    let m = &shared.serving.metrics;
    let old = shared.serving.current.load_full();
    let refused = old.config.restart_required_changes(&next);
    if !refused.is_empty() {
        // A reload that silently kept the old sockets is how a dual-stack socket without DF
        // survived in the field (docs/field-reports.md, "000 dual-stack socket without DF").
        // We keep them too (they are bound), but say so loudly, count it and show it in
        // /status until a restart.
        let changes = refused.join(", ");
        if let Some(held) = lines.allow(&changes, std::time::Instant::now()) {
            error!(
                earlier_unlogged = held,
                "configuration changes need new sockets and were NOT applied; restart the \
                 proxy (in Kubernetes the operator rolls the pods) to apply: {changes}"
            );
        }
        m.config_reloads
            .with_label_values(&[reload::RESTART_REQUIRED])
            .inc();
        shared.require_restart(refused.clone());
        next.listen = old.config.listen.clone();
        next.metrics_address = old.config.metrics_address;
    }
    // servedCertificate: the successor remembers the leaves this reload replaces.
    let upstream = match old.upstream.successor(&next.upstream, &next.hosts) {
        Ok(u) => u,
        Err(e) => return rejected(shared, e.into(), lines),
    };
    let gen = Arc::new(Generation {
        id: shared.next_generation_id(),
        config: next,
        upstream,
    });
    if let Err(e) = endpoint::reconfigure(families, &gen.config, m, &shared.cc_stats) {
        return rejected(shared, e.into(), lines);
    }
    m.follow_config(&gen.config);
    shared.serving.access.set_enabled(gen.config.access_log);
    shared
        .serving
        .budget
        .resize(gen.config.limits.buffered_request_bytes);
    let id = gen.id;
    let hosts = gen.config.hosts.len();
    if let Some(held) = lines.allow("configuration applied live", std::time::Instant::now()) {
        info!(
            generation = id,
            hosts,
            earlier_unlogged = held,
            "configuration applied live"
        );
    }
    shared.serving.current.store(gen);
    m.config_reloads.with_label_values(&[reload::APPLIED]).inc();
    altsvc::probe_soon(shared);
    Applied::Live {
        id,
        restart_required: refused,
    }
}

fn rejected(shared: &Shared, e: ProxyError, lines: &mut logs::CauseLog) -> Applied {
    let why = e.to_string();
    reject(shared, &why, lines);
    Applied::Rejected(why)
}

/// Refuses new connections, sends GOAWAY on the open ones, lets in-flight requests finish
/// (up to `http.drainTimeoutSeconds`), then closes the endpoints.
async fn drain_and_close(
    shared: &Shared,
    families: &[Family],
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    shared.draining.store(true, Ordering::Relaxed);
    let drain_timeout = Duration::from_secs(
        shared
            .serving
            .current
            .load()
            .config
            .http
            .drain_timeout_seconds as u64,
    );
    info!(
        connections = tracker.len(),
        ?drain_timeout,
        "shutting down: refusing new connections, GOAWAY sent, draining in-flight requests"
    );
    for f in families {
        f.endpoint.set_server_config(None);
    }
    stop.cancel();
    shared.serving.drain_connections();
    tracker.close();
    if tokio::time::timeout(drain_timeout, tracker.wait())
        .await
        .is_err()
    {
        warn!(
            connections = tracker.len(),
            "drain timeout reached; closing the remaining connections"
        );
    }
    close(families, tracker, stop).await;
}

/// Closes the endpoints (and whatever connection is still open).
async fn close(families: &[Family], tracker: TaskTracker, stop: CancellationToken) {
    stop.cancel();
    tracker.close();
    for f in families {
        f.endpoint.close(0u32.into(), b"server shutting down");
    }
    for f in families {
        let _ = tokio::time::timeout(Duration::from_secs(2), f.endpoint.wait_idle()).await;
    }
    info!("shut down");
}

/// The endpoint keys, with one line saying where they come from; the warning when they are
/// random is the one users without a keys file see. Without a file, the secret of the
/// process this one took the port over from (`inherited`) makes both one endpoint.
fn load_keys(path: Option<&Path>, inherited: Option<Vec<u8>>) -> Result<Keys, ProxyError> {
    let keys = match (path, inherited) {
        (None, Some(secret)) => keys::derive(&secret, Origin::Inherited),
        (path, _) => keys::load(path)?,
    };
    match &keys.origin {
        Origin::Ephemeral => warn!(
            "keys.file is not set: the stateless-reset, connection-ID and Retry-token keys are \
             random for this process, so after a restart its clients hang until their idle \
             timeout instead of being reset, and Retry tokens do not validate on other \
             processes of this listener"
        ),
        Origin::Inherited => info!(
            "QUIC endpoint keys taken over from the process that held the port (keys.file is \
             not set)"
        ),
        Origin::Generated(p) => info!(file = %p.display(), "QUIC endpoint keys generated"),
        Origin::File(p) => {
            info!(file = %p.display(), "QUIC endpoint keys loaded");
            if keys::mode(p).is_some_and(keys::readable_by_others) {
                warn!(file = %p.display(), "the keys file is readable by any user");
            }
        }
    }
    Ok(keys)
}

/// [`try_bind_admin`] with the coordinator's channel.
fn try_bind_admin_with(
    admin: &mut AdminPort,
    shared: &Shared,
    tell: &mpsc::UnboundedSender<Local>,
) -> Result<(), ProxyError> {
    if admin.has_listener() {
        return Ok(());
    }
    let addr = shared.serving.current.load().config.metrics_address;
    match crate::config::bind::bind_admin_shared(addr) {
        Ok((listener, bound)) => {
            let at = listener.local_addr().unwrap_or(bound);
            info!(admin_addr = %at, "metrics and health endpoint: /metrics /healthz /readyz /status");
            if let Ok(fd) = listener.as_fd().try_clone_to_owned() {
                let _ = tell.send(Local::Admin(fd));
            }
            admin.set_listener(listener);
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
            if logs::LOG.allow(logs::Reason::Handover) {
                warn!(%addr, error = %e, "metrics endpoint not bound yet (held by a process without SO_REUSEPORT?); retrying");
            }
            Ok(())
        }
        Err(source) => Err(ProxyError::Admin { addr, source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FileConfig;
    use crate::config::{self, HostEntry, HostTable};
    use crate::proxy::observe::metrics::UpstreamMetrics;
    use crate::proxy::state::NotReady;
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    fn config(port: u16, hosts: &[&str]) -> ProxyConfig {
        let yaml = format!("port: {port}\nupstream: {{address: '127.0.0.1:8443'}}\n");
        let file: FileConfig = serde_norway::from_str(&yaml).unwrap();
        let mut table = HostTable::default();
        for h in hosts {
            let ck = rcgen::generate_simple_self_signed(vec![h.to_string()]).unwrap();
            let key =
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
            let now = config::file::unix_now();
            table.insert(HostEntry::from_der(h, vec![ck.cert.der().clone()], key, now).unwrap());
        }
        config::build(file.listener_settings(), &[], table, "").unwrap()
    }

    fn shared(c: ProxyConfig) -> Arc<Shared> {
        let upstream =
            Upstream::new(&c.upstream, &c.hosts, UpstreamMetrics::unregistered()).unwrap();
        let first = Generation {
            id: 1,
            config: c,
            upstream,
        };
        Arc::new(Shared::new(
            first,
            Metrics::new(),
            CcStats::new(),
            443,
            vec![],
        ))
    }

    fn reloads(s: &Shared, result: &str) -> u64 {
        s.serving
            .metrics
            .config_reloads
            .with_label_values(&[result])
            .get()
    }

    #[tokio::test]
    async fn a_live_update_swaps_the_generation_and_keeps_the_sockets() {
        let s = shared(config(443, &["a.test", "b.test"]));
        let mut lines = logs::CauseLog::new(logs::WINDOW);
        let live = apply(&s, &[], config(443, &["a.test"]), &mut lines);
        assert_eq!(
            live,
            Applied::Live {
                id: 2,
                restart_required: vec![]
            }
        );
        let gen = s.serving.current.load();
        assert_eq!((gen.id, gen.config.hosts.len()), (2, 1));
        assert_eq!(s.serving.metrics.hosts.get(), 1);

        // A new port needs new sockets: refused, the rest applies, /status says so.
        let Applied::Live {
            id: 3,
            restart_required,
        } = apply(&s, &[], config(8443, &["a.test", "b.test"]), &mut lines)
        else {
            panic!("expected generation 3")
        };
        assert!(
            restart_required[0].starts_with("port "),
            "{restart_required:?}"
        );
        let gen = s.serving.current.load();
        assert_eq!((gen.config.listen.port, gen.config.hosts.len()), (443, 2));
        let status = s.status_report(|_, _| None, 0);
        assert_eq!(status.restart_required, restart_required);
        assert_eq!(status.config_generation, 3);
        assert_eq!(reloads(&s, "applied"), 2);
        assert_eq!(reloads(&s, "restart_required"), 1);

        // An update a source found invalid is counted and changes nothing.
        reject(
            &s,
            "upstream.address: \"nope\" is not host:port",
            &mut lines,
        );
        assert_eq!(reloads(&s, "invalid"), 1);
        assert_eq!(s.serving.current.load().id, 3);

        // No socket in this test, so not ready; a drain says so first.
        assert_eq!(s.readiness(), Err(NotReady::NoSocket));
        s.draining.store(true, Ordering::Relaxed);
        assert_eq!(s.readiness(), Err(NotReady::Draining));
        // Superseded (draining or not), a newer process serves the node: ready.
        s.serving.superseded.store(true, Ordering::Relaxed);
        assert_eq!(s.readiness(), Ok(()));
    }
}
