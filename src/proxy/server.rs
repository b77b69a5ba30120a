//! The running data plane: sockets, one quinn endpoint per family, the accept loops, live
//! configuration updates and the graceful drain.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::HeaderValue;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::cc::{self, CcStats};
use super::handler::{self, ConnCtx};
use super::metrics::{handshake, Metrics, FAMILY_IPV6};
use super::upstream::{Upstream, UpstreamSetupError};
use super::window::{current_minute, RecentCounter};
use super::{admin, request, socket, tls, transport};
use crate::api::{SocketReport, StatusReport};
use crate::config::ProxyConfig;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no UDP socket could be bound: {0}")]
    NoSockets(String),
    #[error(transparent)]
    Upstream(#[from] UpstreamSetupError),
    #[error("TLS server configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("creating the QUIC endpoint on {addr}: {source}")]
    Endpoint {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics endpoint {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A configuration change delivered to the running proxy.
#[derive(Debug)]
pub enum ConfigUpdate {
    Apply(Box<ProxyConfig>),
    /// A reload that failed validation; counted and logged, the running config stays.
    Invalid(String),
}

/// Everything one configuration implies for requests; swapped atomically on reload.
pub struct Generation {
    pub id: u64,
    pub config: ProxyConfig,
    pub upstream: Upstream,
}

/// What the Alt-Svc probe last saw for a host.
#[derive(Debug, Clone)]
pub struct AltSvcProbe {
    pub advertised: bool,
    pub message: String,
}

pub struct Shared {
    pub current: ArcSwap<Generation>,
    pub metrics: Arc<Metrics>,
    pub cc_stats: Arc<CcStats>,
    /// The UDP port actually bound (differs from the config only when it asked for 0).
    pub port: u16,
    sockets: Mutex<Vec<(SocketReport, u64)>>,
    restart_required: Mutex<Vec<String>>,
    pub alt_svc_probes: Mutex<BTreeMap<String, AltSvcProbe>>,
    requests_by_host: Mutex<HashMap<String, (u64, RecentCounter)>>,
    pub draining: AtomicBool,
    generations: AtomicU64,
    pub probe_now: tokio::sync::Notify,
}

impl Shared {
    pub fn alt_svc_value(&self, gen: &Generation) -> HeaderValue {
        request::alt_svc_value(self.port, gen.config.alt_svc_max_age)
    }

    pub fn count_request(&self, host: &str) {
        let mut counts = self.requests_by_host.lock().expect("request count lock");
        let (total, recent) = counts.entry(host.to_string()).or_default();
        *total += 1;
        recent.add(current_minute());
    }

    /// Ready: at least one socket bound and at least one host loaded, and not draining.
    pub fn is_ready(&self) -> bool {
        let bound = self
            .sockets
            .lock()
            .expect("sockets lock")
            .iter()
            .any(|(r, _)| r.bound);
        bound
            && !self.current.load().config.hosts.is_empty()
            && !self.draining.load(Ordering::Relaxed)
    }

    /// The `/status` document.
    pub fn status_report(&self) -> StatusReport {
        let gen = self.current.load();
        let udp = std::fs::read_to_string("/proc/net/udp").unwrap_or_default();
        let udp6 = std::fs::read_to_string("/proc/net/udp6").unwrap_or_default();
        let sockets: Vec<SocketReport> = self
            .sockets
            .lock()
            .expect("sockets lock")
            .iter()
            .map(|(r, inode)| {
                let mut r = r.clone();
                if r.bound {
                    let text = if r.family == FAMILY_IPV6 { &udp6 } else { &udp };
                    r.drops = super::metrics::parse_udp_socket_drops(text, *inode).unwrap_or(0);
                }
                r
            })
            .collect();
        let host_rcv = ["/proc/net/snmp", "/proc/net/snmp6"]
            .iter()
            .zip([
                super::metrics::parse_snmp as fn(&str) -> Option<_>,
                super::metrics::parse_snmp6,
            ])
            .filter_map(|(f, parse)| parse(&std::fs::read_to_string(f).ok()?))
            .map(|c| c.receive_buffer_errors)
            .sum();
        let counts = self
            .requests_by_host
            .lock()
            .expect("request count lock")
            .clone();
        let probes = self.alt_svc_probes.lock().expect("probe lock").clone();
        let hosts = gen
            .config
            .host_reports
            .iter()
            .map(|h| {
                let mut h = h.clone();
                if let Some((total, recent)) = counts.get(&h.name) {
                    h.requests = *total;
                    h.requests_last5m = recent.sum(current_minute());
                }
                if let Some(p) = probes.get(&h.name) {
                    h.alt_svc_advertised = Some(p.advertised);
                    h.alt_svc_message = p.message.clone();
                }
                h
            })
            .collect();
        StatusReport {
            version: env!("CARGO_PKG_VERSION").to_string(),
            port: self.port,
            udp_drops: sockets.iter().map(|s| s.drops).sum(),
            sockets,
            hosts,
            udp_host_receive_buffer_errors: host_rcv,
            requests_total: counts.values().map(|(total, _)| total).sum(),
            config_generation: gen.id,
            restart_required: self.restart_required.lock().expect("restart lock").clone(),
        }
    }
}

/// Handles a caller gets once the proxy is serving (tests, demo).
#[derive(Clone)]
pub struct RunningProxy {
    pub udp_addrs: Vec<SocketAddr>,
    pub admin_addr: SocketAddr,
    pub shared: Arc<Shared>,
}

struct Family {
    name: &'static str,
    endpoint: quinn::Endpoint,
    max_udp_payload: u16,
}

fn server_config(
    gen: &Generation,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
    max_udp_payload: u16,
) -> Result<quinn::ServerConfig, ProxyError> {
    let crypto = tls::server_crypto(gen.config.hosts.clone(), metrics.clone())?;
    let t = &gen.config.transport;
    let iw = t.initial_window_packets as u64 * transport::INITIAL_MTU as u64;
    let factory = cc::factory(t.congestion_control, iw, cc_stats.clone());
    let mut sc = quinn::ServerConfig::with_crypto(crypto);
    sc.transport_config(Arc::new(transport::transport_config(
        t,
        max_udp_payload,
        factory,
    )));
    // Clients may migrate (Wi-Fi to mobile); keep allowing it.
    sc.migration(true);
    Ok(sc)
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

/// Runs the data plane until `shutdown` fires, then drains.
pub async fn serve(
    initial: ProxyConfig,
    mut updates: mpsc::Receiver<ConfigUpdate>,
    shutdown: CancellationToken,
    ready: Option<oneshot::Sender<RunningProxy>>,
) -> Result<(), ProxyError> {
    let metrics = Metrics::new();
    let cc_stats = CcStats::new();

    // Sockets first: everything else is pointless without them.
    let mut listen = initial.listen.clone();
    let mut bound = Vec::new();
    let mut reports = Vec::new();
    for addr in socket::addresses(&initial.listen) {
        let addr = SocketAddr::new(addr.ip(), listen.port);
        let family = if addr.is_ipv6() { "ipv6" } else { "ipv4" };
        match socket::bind(addr, &listen) {
            Ok(b) => {
                let r = &b.report;
                info!(
                    family = r.family,
                    address = %r.address,
                    receive_buffer_effective = r.receive_buffer_effective_bytes,
                    receive_buffer_requested = r.receive_buffer_requested_bytes,
                    send_buffer_effective = r.send_buffer_effective_bytes,
                    send_buffer_requested = r.send_buffer_requested_bytes,
                    gso_segments = r.gso_segments,
                    "UDP socket bound (separate socket per family; DF set; v6only on IPv6)"
                );
                if let Some(w) = socket::clamp_warning(r) {
                    warn!("{w}");
                }
                if let Some(w) = &b.force_refused {
                    warn!(family = r.family, "socket.forceBuffers: {w}");
                }
                let f = [b.family];
                metrics.socket_bound.with_label_values(&f).set(1);
                metrics
                    .socket_receive_buffer
                    .with_label_values(&f)
                    .set(r.receive_buffer_effective_bytes as i64);
                metrics
                    .socket_receive_buffer_requested
                    .with_label_values(&f)
                    .set(r.receive_buffer_requested_bytes as i64);
                metrics
                    .socket_send_buffer
                    .with_label_values(&f)
                    .set(r.send_buffer_effective_bytes as i64);
                metrics
                    .socket_send_buffer_requested
                    .with_label_values(&f)
                    .set(r.send_buffer_requested_bytes as i64);
                metrics
                    .gso_max_segments
                    .with_label_values(&f)
                    .set(r.gso_segments as i64);
                metrics
                    .gso_enabled
                    .with_label_values(&f)
                    .set((r.gso_segments > 1) as i64);
                metrics
                    .udp_sockets
                    .lock()
                    .expect("socket list lock")
                    .push((b.family, b.inode));
                if listen.port == 0 {
                    // Tests ask for any port; both families must still share one.
                    listen.port = b.socket.local_addr().map(|a| a.port()).unwrap_or(0);
                }
                reports.push((b.report.clone(), b.inode));
                bound.push(b);
            }
            Err(e) => {
                error!(family, error = %e, "UDP socket not bound; this family is not served");
                metrics.socket_bound.with_label_values(&[family]).set(0);
                reports.push((
                    SocketReport {
                        family: family.to_string(),
                        address: addr.to_string(),
                        bound: false,
                        error: e.to_string(),
                        ..Default::default()
                    },
                    0,
                ));
            }
        }
    }
    if bound.is_empty() {
        let why: Vec<String> = reports.iter().map(|(r, _)| r.error.clone()).collect();
        return Err(ProxyError::NoSockets(why.join("; ")));
    }

    let upstream = Upstream::new(&initial.upstream, &initial.hosts)?;
    export_host_metrics(&metrics, &initial);
    let gen = Arc::new(Generation {
        id: 1,
        config: initial,
        upstream,
    });
    let shared = Arc::new(Shared {
        current: ArcSwap::new(gen.clone()),
        metrics: metrics.clone(),
        cc_stats: cc_stats.clone(),
        port: listen.port,
        sockets: Mutex::new(reports),
        restart_required: Mutex::new(Vec::new()),
        alt_svc_probes: Mutex::new(BTreeMap::new()),
        requests_by_host: Mutex::new(HashMap::new()),
        draining: AtomicBool::new(false),
        generations: AtomicU64::new(1),
        probe_now: tokio::sync::Notify::new(),
    });

    let interface_mtu = transport::largest_interface_mtu();
    let mut families = Vec::new();
    let mut udp_addrs = Vec::new();
    for b in bound {
        let ipv6 = b.family == FAMILY_IPV6;
        let max_udp_payload =
            transport::max_udp_payload(&gen.config.transport, ipv6, interface_mtu);
        let sc = server_config(&gen, &metrics, &cc_stats, max_udp_payload)?;
        let addr = b
            .socket
            .local_addr()
            .map_err(|source| ProxyError::Endpoint {
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
        let endpoint = quinn::Endpoint::new(
            quinn::EndpointConfig::default(),
            Some(sc),
            b.socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(|source| ProxyError::Endpoint { addr, source })?;
        info!(family = b.family, %addr, max_udp_payload, "QUIC endpoint serving");
        udp_addrs.push(addr);
        families.push(Family {
            name: b.family,
            endpoint,
            max_udp_payload,
        });
    }

    let admin_listener = tokio::net::TcpListener::bind(gen.config.metrics_address)
        .await
        .map_err(|source| ProxyError::Admin {
            addr: gen.config.metrics_address,
            source,
        })?;
    let admin_addr = admin_listener
        .local_addr()
        .unwrap_or(gen.config.metrics_address);
    info!(%admin_addr, "metrics and health endpoint: /metrics /healthz /readyz /status");
    tokio::spawn(admin::serve(
        admin_listener,
        shared.clone(),
        shutdown.clone(),
    ));
    tokio::spawn(super::altsvc::probe_loop(shared.clone(), shutdown.clone()));

    let tracker = TaskTracker::new();
    let drain = CancellationToken::new();
    for f in &families {
        tokio::spawn(accept_loop(
            f.endpoint.clone(),
            f.name,
            shared.clone(),
            tracker.clone(),
            drain.clone(),
        ));
    }
    if let Some(tx) = ready {
        let _ = tx.send(RunningProxy {
            udp_addrs,
            admin_addr,
            shared: shared.clone(),
        });
    }

    let mut updates_open = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            u = updates.recv(), if updates_open => match u {
                Some(ConfigUpdate::Apply(next)) => apply(&shared, &families, *next),
                Some(ConfigUpdate::Invalid(why)) => {
                    metrics.config_reloads.with_label_values(&["invalid"]).inc();
                    error!("configuration update rejected, still serving the previous one: {why}");
                }
                None => updates_open = false,
            },
        }
    }

    // Drain: refuse new connections, GOAWAY on the open ones, let in-flight requests finish.
    shared.draining.store(true, Ordering::Relaxed);
    let drain_timeout =
        Duration::from_secs(shared.current.load().config.http.drain_timeout_seconds as u64);
    info!(
        connections = tracker.len(),
        ?drain_timeout,
        "shutting down: refusing new connections, GOAWAY sent, draining in-flight requests"
    );
    for f in &families {
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
    for f in &families {
        f.endpoint.close(0u32.into(), b"server shutting down");
    }
    for f in &families {
        let _ = tokio::time::timeout(Duration::from_secs(2), f.endpoint.wait_idle()).await;
    }
    info!("shut down");
    Ok(())
}

/// Applies a new configuration to the running endpoints without touching connections.
fn apply(shared: &Arc<Shared>, families: &[Family], mut next: ProxyConfig) {
    let m = &shared.metrics;
    let old = shared.current.load_full();
    let refused = old.config.restart_required_changes(&next);
    if !refused.is_empty() {
        // Seed 000: a reload that silently kept the old sockets. We keep them too (they are
        // bound), but say so loudly, count it and show it in /status until a restart.
        error!(
            changes = ?refused,
            "configuration changes need new sockets and were NOT applied; restart the proxy \
             (in Kubernetes the operator rolls the pods) to apply: {}",
            refused.join(", ")
        );
        m.config_reloads
            .with_label_values(&["restart_required"])
            .inc();
        let mut r = shared.restart_required.lock().expect("restart lock");
        for c in refused {
            if !r.contains(&c) {
                r.push(c);
            }
        }
        next.listen = old.config.listen.clone();
        next.metrics_address = old.config.metrics_address;
    }
    let upstream = match Upstream::new(&next.upstream, &next.hosts) {
        Ok(u) => u,
        Err(e) => {
            m.config_reloads.with_label_values(&["invalid"]).inc();
            error!(error = %e, "configuration update not applied");
            return;
        }
    };
    let id = shared.generations.fetch_add(1, Ordering::Relaxed) + 1;
    let gen = Arc::new(Generation {
        id,
        config: next,
        upstream,
    });
    let mut configs = Vec::new();
    for f in families {
        match server_config(&gen, m, &shared.cc_stats, f.max_udp_payload) {
            Ok(sc) => configs.push(sc),
            Err(e) => {
                m.config_reloads.with_label_values(&["invalid"]).inc();
                error!(error = %e, "configuration update not applied");
                return;
            }
        }
    }
    for (f, sc) in families.iter().zip(configs) {
        // New handshakes use the new certificates; open connections keep theirs.
        f.endpoint.set_server_config(Some(sc));
    }
    export_host_metrics(m, &gen.config);
    let hosts: Vec<&str> = gen.config.hosts.names().collect();
    info!(generation = id, ?hosts, "configuration applied live");
    shared.current.store(gen);
    m.config_reloads.with_label_values(&["applied"]).inc();
    super::altsvc::probe_soon(shared);
}

async fn accept_loop(
    endpoint: quinn::Endpoint,
    family: &'static str,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    drain: CancellationToken,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = drain.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        let span = info_span!("conn", client = %incoming.remote_address(), family);
        tracker.spawn(connection(incoming, family, shared.clone(), drain.clone()).instrument(span));
    }
}

/// Decrements the active-connection gauge however the connection ends.
struct ActiveGuard(prometheus::IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn handshake_result(e: &quinn::ConnectionError) -> Option<&'static str> {
    match e {
        quinn::ConnectionError::TimedOut => Some(handshake::TIMEOUT),
        // The SNI resolver has already counted (and logged) an unknown name.
        quinn::ConnectionError::TransportError(t) if t.reason.contains("no server certificate") => {
            None
        }
        _ => Some(handshake::FAILED),
    }
}

async fn connection(
    incoming: quinn::Incoming,
    family: &'static str,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    let m = shared.metrics.clone();
    let remote = incoming.remote_address();
    let local_port = shared.port;
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            // quinn processes the ClientHello here, so TLS failures (unknown SNI) land here.
            if let Some(result) = handshake_result(&e) {
                m.handshakes.with_label_values(&[result]).inc();
            }
            debug!(error = %e, "handshake failed");
            return;
        }
    };
    let conn = match connecting.await {
        Ok(c) => c,
        Err(e) => {
            if let Some(result) = handshake_result(&e) {
                m.handshakes.with_label_values(&[result]).inc();
            }
            debug!(error = %e, "handshake failed");
            return;
        }
    };
    m.handshakes.with_label_values(&[handshake::OK]).inc();
    let sni = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(|s| s.to_ascii_lowercase());
    let gauge = m.active_connections.with_label_values(&[family]);
    gauge.inc();
    let _active = ActiveGuard(gauge);
    let local_ip = conn
        .local_ip()
        .unwrap_or_else(|| std::net::Ipv4Addr::UNSPECIFIED.into());
    let ctx = Arc::new(ConnCtx {
        shared: shared.clone(),
        family,
        remote,
        local: SocketAddr::new(local_ip, local_port),
        sni,
        upstream_cache: Mutex::new(None),
    });
    debug!(sni = ?ctx.sni, "connection established");

    let max_field = shared
        .current
        .load()
        .config
        .http
        .max_field_section_size_bytes as u64;
    let built = h3::server::builder()
        .max_field_section_size(max_field)
        .build::<_, Bytes>(h3_quinn::Connection::new(conn.clone()))
        .await;
    let mut h3conn = match built {
        Ok(c) => c,
        Err(e) => {
            debug!(error = %e, "HTTP/3 setup failed");
            record_stats(&conn, &m);
            return;
        }
    };

    let mut requests = JoinSet::new();
    let mut goaway_sent = false;
    // Responses finished during the drain may still sit unacknowledged in quinn's send
    // buffer; closing the connection then would cut them off.
    let mut wait_for_client_close = false;
    loop {
        tokio::select! {
            _ = drain.cancelled(), if !goaway_sent => {
                goaway_sent = true;
                if let Err(e) = h3conn.shutdown(0).await {
                    debug!(error = %e, "sending GOAWAY failed");
                }
                if requests.is_empty() {
                    break;
                }
                wait_for_client_close = true;
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {
                if goaway_sent && requests.is_empty() {
                    break;
                }
            }
            r = h3conn.accept() => match r {
                Ok(Some(resolver)) => {
                    requests.spawn(handler::handle(resolver, ctx.clone()).in_current_span());
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
            }
        }
    }
    // Requests already accepted finish (the drain deadline bounds this from outside);
    // dropping the h3 connection closes it with H3_NO_ERROR.
    while requests.join_next().await.is_some() {}
    if wait_for_client_close {
        // The client closes once it has everything (GOAWAY told it to); the global drain
        // deadline closes the endpoint if it never does.
        debug!("drain: responses complete, waiting for the client to close");
        let _ = h3conn.accept().await;
        conn.closed().await;
    }
    drop(h3conn);
    record_stats(&conn, &m);
}

/// Per-connection transport statistics, exported when the connection ends.
fn record_stats(conn: &quinn::Connection, m: &Metrics) {
    let s = conn.stats();
    m.connection_rtt.observe(s.path.rtt.as_secs_f64());
    m.connection_path_mtu.observe(s.path.current_mtu as f64);
    m.connection_lost_packets.inc_by(s.path.lost_packets);
    m.connection_sent_packets.inc_by(s.path.sent_packets);
    // quinn counts every loss event; cubic-hs knows which ones really reduced the window.
    let counters = cc::connection_counters(conn.congestion_state());
    let events = counters.map_or(s.path.congestion_events, |c| c.congestion_events);
    m.connection_congestion_events.inc_by(events);
    m.connection_black_holes.inc_by(s.path.black_holes_detected);
    debug!(
        rtt_ms = s.path.rtt.as_millis() as u64,
        mtu = s.path.current_mtu,
        lost = s.path.lost_packets,
        sent = s.path.sent_packets,
        congestion_events = events,
        forgiven = counters.map_or(0, |c| c.handshake_losses_forgiven),
        tolerated = counters.map_or(0, |c| c.random_losses_tolerated),
        cwnd = s.path.cwnd,
        "connection closed"
    );
}
