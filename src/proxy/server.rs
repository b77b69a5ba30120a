//! The running data plane, wired together: sockets and endpoints ([`super::endpoint`]), the
//! shared state ([`super::state`]), the admin endpoint and the Alt-Svc probe, the accept loops
//! ([`super::accept`]); then configuration updates applied live until shutdown, and the
//! graceful drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use super::admin::ProxyAdmin;
use super::cc::CcStats;
use super::endpoint::{self, Family};
use super::keys::{self, Keys, Origin};
use super::metrics::{reload, Metrics};
use super::source::ConfigUpdate;
use super::state::{Generation, Shared};
use super::upstream::Upstream;
use super::{accept, altsvc, logs, ProxyError};
use crate::config::ProxyConfig;

/// Handles a caller gets once the proxy is serving (tests, demo).
#[derive(Clone)]
pub struct RunningProxy {
    pub udp_addrs: Vec<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
}

fn export_host_metrics(metrics: &Metrics, config: &ProxyConfig) {
    metrics.hosts.set(config.hosts.len() as i64);
    metrics.certificate_expiry.reset();
    for h in config.hosts.iter() {
        metrics
            .certificate_expiry
            .with_label_values(&[&h.name])
            .set(h.not_after);
    }
}

/// Runs the data plane on `initial` until `shutdown` fires, applying `updates` live, then
/// drains. `keys_file` (Kubernetes: the listener's Secret) takes precedence over the
/// configuration's `keys.file`.
pub async fn serve(
    initial: ProxyConfig,
    updates: mpsc::Receiver<ConfigUpdate>,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
    keys_file: Option<PathBuf>,
) -> Result<(), ProxyError> {
    let metrics = Metrics::new();
    let cc_stats = CcStats::new();
    // Sockets first: everything else is pointless without them.
    let bound = endpoint::bind_all(&initial.listen, &metrics)?;
    let upstream = Upstream::new(&initial.upstream, &initial.hosts, metrics.upstream())?;
    let keys = load_keys(keys_file.as_deref().or(initial.keys_file.as_deref()))?;
    export_host_metrics(&metrics, &initial);
    let first = Generation {
        id: 1,
        config: initial,
        upstream,
    };
    let shared = Arc::new(Shared::new(
        first,
        metrics,
        cc_stats,
        bound.port,
        bound.reports,
    ));
    let id = endpoint::Identity {
        keys: &keys,
        guard: &shared.guard,
    };
    let families = endpoint::endpoints(
        bound.sockets,
        &shared.current.load(),
        &shared.metrics,
        &shared.cc_stats,
        id,
    )?;
    let admin_addr = start_admin(&shared, &shutdown).await?;
    tokio::spawn(altsvc::probe_loop(shared.clone(), shutdown.clone()));
    tokio::spawn(logs::report_suppressed(shutdown.clone()));

    let tracker = TaskTracker::new();
    let drain = CancellationToken::new();
    for f in &families {
        let (ep, s) = (f.endpoint.clone(), shared.clone());
        tokio::spawn(accept::accept_loop(
            ep,
            f.name,
            s,
            tracker.clone(),
            drain.clone(),
        ));
    }
    if let Some(tx) = ready {
        let _ = tx.send(RunningProxy {
            udp_addrs: families.iter().map(|f| f.addr).collect(),
            admin_addr,
            shared: shared.clone(),
        });
    }
    follow_updates(&shared, &families, updates, &shutdown).await;
    drain_and_close(&shared, &families, tracker, drain).await;
    Ok(())
}

/// The endpoint keys, with one line saying where they come from; the warning when they are
/// random is the one users without a keys file see.
fn load_keys(path: Option<&Path>) -> Result<Keys, ProxyError> {
    let keys = keys::load(path)?;
    match &keys.origin {
        Origin::Ephemeral => warn!(
            "keys.file is not set: the stateless-reset, connection-ID and Retry-token keys are \
             random for this process, so after a restart its clients hang until their idle \
             timeout instead of being reset, and Retry tokens do not validate on other \
             processes of this listener"
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

/// Binds the admin endpoint and serves it until `shutdown`.
async fn start_admin(
    shared: &Arc<Shared>,
    shutdown: &CancellationToken,
) -> Result<SocketAddr, ProxyError> {
    let addr = shared.current.load().config.metrics_address;
    let (listener, bound) =
        crate::admin::bind(addr).map_err(|source| ProxyError::Admin { addr, source })?;
    let admin_addr = listener.local_addr().unwrap_or(bound);
    info!(%admin_addr, "metrics and health endpoint: /metrics /healthz /readyz /status");
    let source = Arc::new(ProxyAdmin(shared.clone()));
    tokio::spawn(crate::admin::serve(listener, source, shutdown.clone()));
    Ok(admin_addr)
}

/// Applies updates as they arrive until `shutdown`.
async fn follow_updates(
    shared: &Arc<Shared>,
    families: &[Family],
    mut updates: mpsc::Receiver<ConfigUpdate>,
    shutdown: &CancellationToken,
) {
    let mut updates_open = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            u = updates.recv(), if updates_open => match u {
                Some(ConfigUpdate::Apply(next)) => {
                    let _ = apply(shared, families, *next);
                }
                Some(ConfigUpdate::Invalid(why)) => reject(shared, &why),
                None => updates_open = false,
            },
        }
    }
}

/// Counts and logs an update that cannot be applied; the running configuration stays.
fn reject(shared: &Shared, why: &str) {
    let m = &shared.metrics;
    m.config_reloads.with_label_values(&[reload::INVALID]).inc();
    error!("configuration update rejected, still serving the previous one: {why}");
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
/// the rest applies.
pub fn apply(shared: &Arc<Shared>, families: &[Family], mut next: ProxyConfig) -> Applied {
    let m = &shared.metrics;
    let old = shared.current.load_full();
    let refused = old.config.restart_required_changes(&next);
    if !refused.is_empty() {
        // A reload that silently kept the old sockets is how a dual-stack socket without DF
        // survived in the field (docs/field-reports.md, "000 dual-stack socket without DF").
        // We keep them too (they are bound), but say so loudly, count it and show it in
        // /status until a restart.
        error!(
            changes = ?refused,
            "configuration changes need new sockets and were NOT applied; restart the proxy \
             (in Kubernetes the operator rolls the pods) to apply: {}",
            refused.join(", ")
        );
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
        Err(e) => return rejected(shared, e.into()),
    };
    let gen = Arc::new(Generation {
        id: shared.next_generation_id(),
        config: next,
        upstream,
    });
    if let Err(e) = endpoint::reconfigure(families, &gen, m, &shared.cc_stats) {
        return rejected(shared, e);
    }
    export_host_metrics(m, &gen.config);
    shared
        .budget
        .resize(gen.config.limits.buffered_request_bytes);
    let hosts: Vec<&str> = gen.config.hosts.names().collect();
    let id = gen.id;
    info!(generation = id, ?hosts, "configuration applied live");
    shared.current.store(gen);
    m.config_reloads.with_label_values(&[reload::APPLIED]).inc();
    altsvc::probe_soon(shared);
    Applied::Live {
        id,
        restart_required: refused,
    }
}

fn rejected(shared: &Shared, e: ProxyError) -> Applied {
    let why = e.to_string();
    reject(shared, &why);
    Applied::Rejected(why)
}

/// Refuses new connections, sends GOAWAY on the open ones, lets in-flight requests finish
/// (up to `http.drainTimeoutSeconds`), then closes the endpoints.
async fn drain_and_close(
    shared: &Shared,
    families: &[Family],
    tracker: TaskTracker,
    drain: CancellationToken,
) {
    shared.draining.store(true, Ordering::Relaxed);
    let drain_timeout =
        Duration::from_secs(shared.current.load().config.http.drain_timeout_seconds as u64);
    info!(
        connections = tracker.len(),
        ?drain_timeout,
        "shutting down: refusing new connections, GOAWAY sent, draining in-flight requests"
    );
    for f in families {
        f.endpoint.set_server_config(None);
    }
    drain.cancel();
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
    for f in families {
        f.endpoint.close(0u32.into(), b"server shutting down");
    }
    for f in families {
        let _ = tokio::time::timeout(Duration::from_secs(2), f.endpoint.wait_idle()).await;
    }
    info!("shut down");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::FileConfig;
    use crate::config::{self, HostEntry, HostTable};
    use crate::proxy::metrics::UpstreamMetrics;
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
        config::build((&file).into(), table, "").unwrap()
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
        s.metrics.config_reloads.with_label_values(&[result]).get()
    }

    #[tokio::test]
    async fn a_live_update_swaps_the_generation_and_keeps_the_sockets() {
        let s = shared(config(443, &["a.test", "b.test"]));
        let live = apply(&s, &[], config(443, &["a.test"]));
        assert_eq!(
            live,
            Applied::Live {
                id: 2,
                restart_required: vec![]
            }
        );
        let gen = s.current.load();
        assert_eq!((gen.id, gen.config.hosts.len()), (2, 1));
        assert_eq!(s.metrics.hosts.get(), 1);

        // A new port needs new sockets: refused, the rest applies, /status says so.
        let Applied::Live {
            id: 3,
            restart_required,
        } = apply(&s, &[], config(8443, &["a.test", "b.test"]))
        else {
            panic!("expected generation 3")
        };
        assert!(
            restart_required[0].starts_with("port "),
            "{restart_required:?}"
        );
        let gen = s.current.load();
        assert_eq!((gen.config.listen.port, gen.config.hosts.len()), (443, 2));
        let status = s.status_report(|_, _| None, 0);
        assert_eq!(status.restart_required, restart_required);
        assert_eq!(status.config_generation, 3);
        assert_eq!(reloads(&s, "applied"), 2);
        assert_eq!(reloads(&s, "restart_required"), 1);

        // An update a source found invalid is counted and changes nothing.
        reject(&s, "upstream.address: \"nope\" is not host:port");
        assert_eq!(reloads(&s, "invalid"), 1);
        assert_eq!(s.current.load().id, 3);

        // No socket in this test, so not ready; a drain says so first.
        assert_eq!(s.readiness(), Err(NotReady::NoSocket));
        s.draining.store(true, Ordering::Relaxed);
        assert_eq!(s.readiness(), Err(NotReady::Draining));
    }
}
