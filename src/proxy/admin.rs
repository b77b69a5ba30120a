//! What the data plane answers on the shared admin endpoint ([`crate::admin`]): ready when a
//! socket is bound and a host loaded and not draining; its metrics; the `/status` document
//! with the kernel's current drop counters (compact JSON whose size does not grow with the
//! hosts), and `/hosts`, every host with where it comes from, its Alt-Svc probe and requests.

use std::sync::Arc;

use super::metrics::FAMILY_IPV6;
use super::procnet::{HostCounters, SocketTables};
use super::state::Shared;
use crate::admin::AdminSource;

/// The proxy's [`AdminSource`].
pub struct ProxyAdmin(pub Arc<Shared>);

impl AdminSource for ProxyAdmin {
    fn readiness(&self) -> Result<(), String> {
        self.0.readiness().map_err(|r| r.as_str().to_string())
    }

    fn metrics(&self) -> String {
        sync_cc_counters(&self.0);
        self.0.metrics.render()
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
    let metrics = &shared.metrics;
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
