//! Sockets to QUIC endpoints: one UDP socket per configured address family (logged and
//! exported with what the kernel really granted), one quinn endpoint on each, and the quinn
//! server configuration a configuration generation implies.

use std::net::SocketAddr;
use std::sync::Arc;

use tracing::{error, info, warn};

use super::cc::CcStats;
use super::metrics::{Metrics, FAMILY_IPV6};
use super::socket::{self, BoundSocket, SocketError};
use super::state::{Generation, SocketEntry};
use super::{tls, transport, ProxyError};
use crate::api::SocketReport;
use crate::config::ListenConfig;

/// One address family's endpoint.
pub struct Family {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub endpoint: quinn::Endpoint,
    /// Upper bound of path-MTU discovery on this family; fixed for the endpoint's lifetime.
    pub max_udp_payload: u16,
}

/// The outcome of binding every configured address.
pub struct Bound {
    pub sockets: Vec<BoundSocket>,
    /// One entry per configured address, bound or not, for `/status`.
    pub reports: Vec<SocketEntry>,
    /// The port every socket shares (the kernel's choice when the configuration said 0).
    pub port: u16,
}

/// Binds a socket per configured address. A family that fails is reported and left out;
/// only when none binds is it an error.
pub fn bind_all(listen: &ListenConfig, metrics: &Metrics) -> Result<Bound, ProxyError> {
    let mut listen = listen.clone();
    let mut sockets = Vec::new();
    let mut reports = Vec::new();
    for addr in socket::addresses(&listen) {
        let addr = SocketAddr::new(addr.ip(), listen.port);
        match socket::bind(addr, &listen) {
            Ok(b) => {
                record_bound(&b, metrics);
                if listen.port == 0 {
                    // Tests ask for any port; both families must still share one.
                    listen.port = b.socket.local_addr().map(|a| a.port()).unwrap_or(0);
                }
                reports.push((b.report.clone(), b.inode));
                sockets.push(b);
            }
            Err(e) => reports.push(record_unbound(addr, &e, metrics)),
        }
    }
    if sockets.is_empty() {
        let why: Vec<String> = reports.iter().map(|(r, _)| r.error.clone()).collect();
        return Err(ProxyError::NoSockets(why.join("; ")));
    }
    Ok(Bound {
        sockets,
        reports,
        port: listen.port,
    })
}

/// Logs and exports what the kernel granted a bound socket.
fn record_bound(b: &BoundSocket, metrics: &Metrics) {
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
    let set = |g: &prometheus::IntGaugeVec, v: u64| g.with_label_values(&f).set(v as i64);
    set(&metrics.socket_bound, 1);
    set(
        &metrics.socket_receive_buffer,
        r.receive_buffer_effective_bytes,
    );
    set(
        &metrics.socket_receive_buffer_requested,
        r.receive_buffer_requested_bytes,
    );
    set(&metrics.socket_send_buffer, r.send_buffer_effective_bytes);
    set(
        &metrics.socket_send_buffer_requested,
        r.send_buffer_requested_bytes,
    );
    set(&metrics.gso_max_segments, r.gso_segments);
    set(&metrics.gso_enabled, u64::from(r.gso_segments > 1));
    metrics
        .udp_sockets
        .lock()
        .expect("socket list lock")
        .push((b.family, b.inode));
}

fn record_unbound(addr: SocketAddr, e: &SocketError, metrics: &Metrics) -> SocketEntry {
    let family = if addr.is_ipv6() { "ipv6" } else { "ipv4" };
    error!(family, error = %e, "UDP socket not bound; this family is not served");
    metrics.socket_bound.with_label_values(&[family]).set(0);
    let report = SocketReport {
        family: family.to_string(),
        address: addr.to_string(),
        bound: false,
        error: e.to_string(),
        ..Default::default()
    };
    (report, 0)
}

/// The quinn server configuration of `gen` for one family: TLS for its hosts and the whole
/// transport (flow control, path MTU, congestion controller).
pub fn server_config(
    gen: &Generation,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
    max_udp_payload: u16,
) -> Result<quinn::ServerConfig, ProxyError> {
    let crypto = tls::server_crypto(gen.config.hosts.clone(), metrics.clone())?;
    let transport =
        transport::transport_config(&gen.config.transport, max_udp_payload, cc_stats.clone());
    let mut sc = quinn::ServerConfig::with_crypto(crypto);
    sc.transport_config(Arc::new(transport));
    // Clients may migrate (Wi-Fi to mobile); keep allowing it.
    sc.migration(true);
    Ok(sc)
}

/// A quinn endpoint on each bound socket, serving `gen`.
pub fn endpoints(
    sockets: Vec<BoundSocket>,
    gen: &Generation,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
) -> Result<Vec<Family>, ProxyError> {
    let interface_mtu = transport::largest_interface_mtu();
    let mut families = Vec::new();
    for b in sockets {
        let ipv6 = b.family == FAMILY_IPV6;
        let max_udp_payload =
            transport::max_udp_payload(&gen.config.transport, ipv6, interface_mtu);
        let sc = server_config(gen, metrics, cc_stats, max_udp_payload)?;
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
        families.push(Family {
            name: b.family,
            addr,
            endpoint,
            max_udp_payload,
        });
    }
    Ok(families)
}

/// Installs `gen`'s configuration on every endpoint, or on none if one cannot be built.
/// New handshakes use it; open connections keep the one they started with.
pub fn reconfigure(
    families: &[Family],
    gen: &Generation,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
) -> Result<(), ProxyError> {
    let configs = families
        .iter()
        .map(|f| server_config(gen, metrics, cc_stats, f.max_udp_payload))
        .collect::<Result<Vec<_>, _>>()?;
    for (f, sc) in families.iter().zip(configs) {
        f.endpoint.set_server_config(Some(sc));
    }
    Ok(())
}
