//! What the running proxy's tasks share: what its connections serve ([`Serving`], the current
//! configuration generation among it), what each socket reported when it was bound, the
//! rollout and the Alt-Svc probe results; and the two documents built from them: `/status`,
//! whose size does not grow with the hosts, and `/hosts`, one entry per host.
//!
//! The server, the admin endpoint, the probe and the Alt-Svc prober use it; the connections
//! and requests see only [`Serving`]. It reads nothing from the kernel: the `/status` document
//! takes the kernel's counters as arguments.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::http3::serving::{Generation, Serving};
use super::observe::metrics::Metrics;
use super::observe::window::current_minute;
use super::quic::cc::CcStats;
use super::quic::endpoint::SocketEntry;
use crate::api::{host_states, reasons, HostReport, RolloutReport, SocketReport, StatusReport};

/// What the Alt-Svc probe last saw for a host, and when.
#[derive(Debug, Clone)]
pub struct AltSvcProbe {
    pub advertised: bool,
    /// Why the probe could not ask the TCP ingress (then `advertised` is false).
    pub failure: Option<String>,
    pub at: Instant,
}

impl AltSvcProbe {
    /// What `/hosts` and the log say about this probe of `host`: nothing when the header is
    /// there, else why not or how to add it. Computed when asked, so no text is kept per host.
    pub fn message(&self, host: &str, port: u16, max_age: u32) -> String {
        match (&self.failure, self.advertised) {
            (Some(why), _) => format!("probing the TCP ingress failed: {why}"),
            (None, true) => String::new(),
            // No controller: the data plane cannot tell which one the ingress is.
            (None, false) => crate::api::altsvc::advice(None, host, port, max_age),
        }
    }
}

/// Why the proxy should not receive traffic, the `/readyz` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    Draining,
    NoHost,
    NoSocket,
}

impl NotReady {
    pub fn as_str(self) -> &'static str {
        match self {
            NotReady::Draining => "draining",
            NotReady::NoHost => "no host loaded",
            NotReady::NoSocket => "no UDP socket bound",
        }
    }
}

pub struct Shared {
    /// What the connections and requests read (the current generation among it).
    pub serving: Arc<Serving>,
    pub cc_stats: Arc<CcStats>,
    sockets: Mutex<Vec<SocketEntry>>,
    rollout: Mutex<Option<RolloutReport>>,
    restart_required: Mutex<Vec<String>>,
    /// By configured host name; pruned to the configured hosts by the probe.
    pub alt_svc_probes: Mutex<HashMap<String, AltSvcProbe>>,
    pub draining: AtomicBool,
    generations: AtomicU64,
    /// Wakes the Alt-Svc probe early (after a configuration change).
    pub probe_now: tokio::sync::Notify,
    /// Whether this process probes for Alt-Svc (one pod per listener does): true unless the
    /// Kubernetes source says another pod is the prober.
    pub alt_svc_prober: tokio::sync::watch::Receiver<bool>,
}

impl Shared {
    /// The state of a proxy serving `first` on `port` with `sockets`.
    pub fn new(
        first: Generation,
        metrics: Arc<Metrics>,
        cc_stats: Arc<CcStats>,
        port: u16,
        sockets: Vec<SocketEntry>,
    ) -> Self {
        let id = first.id;
        Self {
            serving: Arc::new(Serving::new(first, metrics, port)),
            cc_stats,
            sockets: Mutex::new(sockets),
            rollout: Mutex::new(None),
            restart_required: Mutex::new(Vec::new()),
            alt_svc_probes: Mutex::new(HashMap::new()),
            draining: AtomicBool::new(false),
            generations: AtomicU64::new(id),
            probe_now: tokio::sync::Notify::new(),
            alt_svc_prober: tokio::sync::watch::channel(true).1,
        }
    }

    /// The id the next configuration generation gets.
    pub fn next_generation_id(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Records changes that only a restart can apply; `/status` lists them until then.
    pub fn require_restart(&self, changes: Vec<String>) {
        let mut r = self.restart_required.lock().expect("restart lock");
        for c in changes {
            if !r.contains(&c) {
                r.push(c);
            }
        }
    }

    /// What each socket reported when it was bound (or failed to).
    pub fn set_sockets(&self, sockets: Vec<SocketEntry>) {
        *self.sockets.lock().expect("socket lock") = sockets;
    }

    pub fn set_rollout(&self, r: RolloutReport) {
        *self.rollout.lock().expect("rollout lock") = Some(r);
    }

    pub fn rollout(&self) -> Option<RolloutReport> {
        self.rollout.lock().expect("rollout lock").clone()
    }

    /// Ready: at least one socket bound and at least one host loaded, and not draining; or
    /// superseded, whatever else: a newer process on this host takes the new connections, so
    /// the node is served. The kubelet probes both pods of a surge roll at the same shared
    /// admin socket, and the DaemonSet controller counts a node by its oldest pod, so a
    /// superseded process that answered "not ready" (in the moment before it stops accepting
    /// there, or on its own admin port when the port changed) would mark the node unserved
    /// for its whole drain.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let bound = self
            .sockets
            .lock()
            .expect("socket lock")
            .iter()
            .any(|(r, _)| r.bound);
        if self.serving.superseded.load(Ordering::Relaxed) {
            Ok(())
        } else if self.draining.load(Ordering::Relaxed) {
            Err(NotReady::Draining)
        } else if self.serving.current.load().config.hosts.is_empty() {
            Err(NotReady::NoHost)
        } else if !bound {
            Err(NotReady::NoSocket)
        } else {
            Ok(())
        }
    }

    /// Why the process is not ready, in words: the reason, and what it waits for.
    pub fn not_ready_text(&self, r: NotReady) -> String {
        match (r, self.rollout().map(|r| r.waiting)) {
            (NotReady::NoSocket, Some(w)) if !w.is_empty() => format!("{}: {w}", r.as_str()),
            _ => r.as_str().to_string(),
        }
    }

    pub fn is_ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// The `/status` document. `socket_drops(family, inode)` and `host_receive_buffer_errors`
    /// are the kernel's counters, read by the caller. Its size does not depend on the number
    /// of hosts (the mirror report lists a bounded number of failures).
    pub fn status_report(
        &self,
        socket_drops: impl Fn(&str, u64) -> Option<u64>,
        host_receive_buffer_errors: u64,
    ) -> StatusReport {
        let gen = self.serving.current.load();
        let sockets: Vec<SocketReport> = self
            .sockets
            .lock()
            .expect("socket lock")
            .iter()
            .map(|(r, inode)| {
                let mut r = r.clone();
                if r.bound {
                    r.drops = socket_drops(&r.family, *inode).unwrap_or(0);
                }
                r
            })
            .collect();
        StatusReport {
            version: crate::version::BUILD.to_string(),
            port: self.serving.port,
            udp_drops: sockets.iter().map(|s| s.drops).sum(),
            sockets,
            hosts_loaded: gen.config.hosts.len() as u64,
            mirrors: gen.config.mirrors.clone(),
            udp_host_receive_buffer_errors: host_receive_buffer_errors,
            requests_total: self.serving.metrics.per_host.requests_total(),
            config_generation: gen.id,
            restart_required: self.restart_required.lock().expect("restart lock").clone(),
            rollout: self.rollout(),
        }
    }

    /// The `/hosts` document: every loaded host (where it comes from, its Alt-Svc probe,
    /// its requests), then every host that could not be loaded, with why.
    pub fn hosts_report(&self) -> Vec<HostReport> {
        let gen = self.serving.current.load();
        let config = &gen.config;
        let probes = self.alt_svc_probes.lock().expect("probe lock");
        let now = current_minute();
        let mut out = Vec::with_capacity(config.hosts.len() + config.host_reports.len());
        for h in config.hosts.iter() {
            let mut r = HostReport {
                name: h.name.clone(),
                state: host_states::SERVING.to_string(),
                reason: reasons::SERVING.to_string(),
                secret: h.secret.as_deref().map(str::to_string),
                source: h.source.clone(),
                ..Default::default()
            };
            if let Some(c) = self.serving.metrics.per_host.host(&h.name) {
                r.requests = c.requests();
                r.requests_last5m = c.recent(now);
            }
            if let Some(p) = probes.get(&h.name) {
                r.alt_svc_advertised = Some(p.advertised);
                r.alt_svc_message = p.message(&h.name, self.serving.port, config.alt_svc_max_age);
            }
            out.push(r);
        }
        let failed = config.host_reports.iter();
        out.extend(failed.filter(|r| r.state != host_states::SERVING).cloned());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::mirrors::{self, tests as m};
    use crate::config::ProxyConfig;
    use crate::proxy::observe::metrics::UpstreamMetrics;
    use crate::proxy::quic::cc::CcStats;
    use crate::proxy::upstream::Upstream;

    fn shared(config: ProxyConfig) -> Shared {
        let upstream = Upstream::new(
            &config.upstream,
            &config.hosts,
            UpstreamMetrics::unregistered(),
        )
        .unwrap();
        let first = Generation {
            id: 1,
            config,
            upstream,
        };
        Shared::new(first, Metrics::new(), CcStats::new(), 443, vec![])
    }

    #[test]
    fn status_stays_small_and_hosts_lists_every_host() {
        let set = m::set(vec![
            m::input("m1", "1", &["a.test"], &["a.test"]),
            m::input("m2", "1", &["b.test"], &["b.test", "c.test"]),
        ]);
        let s = shared(mirrors::build(&m::listener(), &set, m::now()).unwrap());
        s.serving.metrics.per_host.count_request(
            "a.test",
            None,
            200,
            crate::proxy::observe::metrics::FAMILY_IPV4,
        );

        let status = s.status_report(|_, _| None, 0);
        assert_eq!(status.hosts_loaded, 2);
        assert_eq!(status.requests_total, 1);
        let r = status.mirrors.as_ref().unwrap();
        assert_eq!((r.count, r.failed_count), (2, 1));
        assert_eq!(r.digest, mirrors::digest(&set));

        let hosts = s.hosts_report();
        let view: Vec<(&str, &str, u64)> = hosts
            .iter()
            .map(|h| (h.name.as_str(), h.state.as_str(), h.requests))
            .collect();
        assert_eq!(
            view,
            [
                ("a.test", "Serving", 1),
                ("b.test", "Serving", 0),
                ("c.test", "NotServing", 0)
            ]
        );
        assert_eq!(hosts[0].secret.as_deref(), Some("shop/m1-tls"));
        assert_eq!(hosts[0].source, "Ingress shop/m1");
        assert_eq!(hosts[2].reason, reasons::CERTIFICATE_DOES_NOT_MATCH_HOST);
        assert_eq!(hosts[2].mirror, "m2");
    }
}
