//! What the data plane answers on the shared admin endpoint ([`crate::admin`]): ready when a
//! socket is bound and a host loaded and not draining; its metrics; the `/status` document
//! with the kernel's current drop counters (compact JSON whose size does not grow with the
//! hosts), and `/hosts`, every host with where it comes from, its Alt-Svc probe and requests.

use std::sync::Arc;

use super::observe::metrics::FAMILY_IPV6;
use super::observe::procnet::{HostCounters, SocketTables};
use super::state::Shared;
use crate::admin::AdminSource;

/// The proxy's [`AdminSource`].
pub struct ProxyAdmin(pub Arc<Shared>);

impl AdminSource for ProxyAdmin {
    fn readiness(&self) -> Result<(), String> {
        self.0.readiness().map_err(|r| self.0.not_ready_text(r))
    }

    fn metrics(&self) -> String {
        sync_cc_counters(&self.0);
        self.0.serving.metrics.render()
    }

    fn status(&self) -> Option<String> {
        let tables = SocketTables::read();
        let host = HostCounters::read();
        let host_rcv = [host.ipv4, host.ipv6]
            .iter()
            .flatten()
            .map(|c| c.receive_buffer_errors)
            .sum();
        let drops = |family: &str, inode| tables.drops(family == FAMILY_IPV6, inode);
        let report = self.0.status_report(drops, host_rcv);
        Some(serde_json::to_string(&report).expect("status serialises"))
    }

    fn hosts(&self) -> Option<String> {
        let hosts = self.0.hosts_report();
        Some(serde_json::to_string(&hosts).expect("hosts serialise"))
    }
}

/// The congestion controllers count into atomics; mirror them into the registry on scrape.
fn sync_cc_counters(shared: &Shared) {
    let stats = &shared.cc_stats;
    let metrics = &shared.serving.metrics;
    for (total, counter) in [
        (
            stats.handshake_losses_forgiven(),
            &metrics.handshake_losses_forgiven,
        ),
        (
            stats.random_losses_tolerated(),
            &metrics.random_losses_tolerated,
        ),
        (
            stats.slow_start_delay_exits(),
            &metrics.slow_start_delay_exits,
        ),
    ] {
        let seen = counter.get();
        if total > seen {
            counter.inc_by(total - seen);
        }
    }
}

/// The data plane's admin listener, served only while this process takes the new connections
/// of its host's port: during a rollout both generations hold the same listening socket (the
/// newer one gets a copy in the hand-over), the older stops accepting when superseded and
/// the newer starts, so connections wait in the shared backlog and none is refused.
pub struct AdminPort {
    listener: Option<std::net::TcpListener>,
    source: Arc<ProxyAdmin>,
    shutdown: tokio_util::sync::CancellationToken,
    serving: Option<tokio_util::sync::CancellationToken>,
}

impl AdminPort {
    pub fn new(shared: Arc<Shared>, shutdown: tokio_util::sync::CancellationToken) -> Self {
        AdminPort {
            listener: None,
            source: Arc::new(ProxyAdmin(shared)),
            shutdown,
            serving: None,
        }
    }

    /// The listener to serve from now on (the pause state is kept).
    pub fn set_listener(&mut self, l: std::net::TcpListener) {
        let serving = self.serving.is_some();
        self.pause();
        self.listener = Some(l);
        if serving {
            self.resume();
        }
    }

    pub fn has_listener(&self) -> bool {
        self.listener.is_some()
    }

    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Accepts connections (again).
    pub fn resume(&mut self) {
        if self.serving.is_some() {
            return;
        }
        let Some(l) = &self.listener else {
            // Not bound yet: served once it is.
            self.serving = Some(self.shutdown.child_token());
            return;
        };
        let token = self.shutdown.child_token();
        let copy = l.try_clone().and_then(tokio::net::TcpListener::from_std);
        match copy {
            Ok(l) => {
                let source: Arc<dyn crate::admin::AdminSource> = self.source.clone();
                tokio::spawn(crate::admin::serve(l, source, token.clone()));
            }
            Err(e) => tracing::warn!(error = %e, "admin listener unusable"),
        }
        self.serving = Some(token);
    }

    /// Stops accepting; the listening socket stays open (connections queue for whoever
    /// accepts next).
    pub fn pause(&mut self) {
        if let Some(t) = self.serving.take() {
            t.cancel();
        }
    }
}
