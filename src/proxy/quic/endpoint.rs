//! Sockets to QUIC endpoints: this process's UDP socket of each configured address family
//! (set up with its own settings, logged and exported with what the kernel really granted),
//! one quinn endpoint on each, and the quinn server configuration a configuration generation
//! implies.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;

use quinn::crypto::HandshakeTokenKey;
use tracing::{error, info, warn};

use super::amplification::{Guard, GuardedSocket};
use super::cc::CcStats;
use super::keys::Keys;
use super::shed::{Gate, SheddingSocket, MAX_INCOMING};
use super::socket::{self, BoundSocket};
use super::tls;
use super::transport;
use crate::api::SocketReport;
use crate::config::ListenConfig;
use crate::config::ProxyConfig;
use crate::proxy::observe::metrics::{limit, Metrics, FAMILY_IPV6};

/// One address family's endpoint.
pub struct Family {
    pub name: &'static str,
    pub addr: SocketAddr,
    pub endpoint: quinn::Endpoint,
    /// Upper bound of path-MTU discovery on this family; fixed for the endpoint's lifetime.
    pub max_udp_payload: u16,
    /// Seals Retry tokens; the same for every configuration generation (and, with a keys
    /// file, every process of the listener).
    pub token_key: Arc<dyn HandshakeTokenKey>,
    /// What the socket sheds and the accept loop decides ([`super::shed`]).
    pub gate: Arc<Gate>,
}

/// Datagrams quinn buffers for one attempt before it is decided (a ClientHello spanning a few
/// datagrams, 0-RTT that we refuse anyway); quinn's default is 10 MB.
pub const INCOMING_BUFFER_BYTES: u64 = 64 * 1024;
/// The same, all attempts together; quinn's default is 100 MB.
pub const INCOMING_BUFFER_TOTAL_BYTES: u64 = 8 * 1024 * 1024;

/// Why this process's endpoints could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("no UDP socket could be bound: {0}")]
    NoSockets(String),
    #[error("TLS server configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("creating the QUIC endpoint on {addr}: {source}")]
    Create {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A socket as reported when it was bound (or failed to), with its inode (0 when unbound) to
/// find its drop counter.
pub type SocketEntry = (SocketReport, u64);

/// The outcome of setting up this process's sockets.
pub struct Bound {
    pub sockets: Vec<BoundSocket>,
    /// One entry per configured address, bound or not, for `/status`.
    pub reports: Vec<SocketEntry>,
}

/// Sets up this process's own sockets (bound by it or by the process that handed the port
/// over, see [`crate::proxy::handover`]) with its own settings, and reports every configured
/// address: those without a socket are reported unbound, with `why` of the address.
pub fn configure_all(
    sockets: Vec<UdpSocket>,
    listen: &ListenConfig,
    metrics: &Metrics,
    why: impl Fn(SocketAddr) -> String,
) -> Result<Bound, EndpointError> {
    let mut bound = Vec::new();
    let mut reports = Vec::new();
    for s in sockets {
        let addr = s.local_addr().ok();
        match socket::configure(s, listen) {
            Ok(b) => {
                record_bound(&b, metrics);
                reports.push((b.report.clone(), b.inode));
                bound.push(b);
            }
            Err(e) => {
                let addr = addr.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
                reports.push(record_unbound(addr, &e.to_string(), metrics));
            }
        }
    }
    for addr in socket::addresses(listen) {
        let family = crate::proxy::observe::metrics::family_of(&addr);
        if !reports.iter().any(|(r, _)| r.family == family) {
            reports.push(record_unbound(addr, &why(addr), metrics));
        }
    }
    if bound.is_empty() {
        let why: Vec<String> = reports.iter().map(|(r, _)| r.error.clone()).collect();
        return Err(EndpointError::NoSockets(why.join("; ")));
    }
    Ok(Bound {
        sockets: bound,
        reports,
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

fn record_unbound(addr: SocketAddr, e: &str, metrics: &Metrics) -> SocketEntry {
    let family = crate::proxy::observe::metrics::family_of(&addr);
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

/// The quinn server configuration of `config` for one family: TLS for its hosts, the whole
/// transport (flow control, path MTU, congestion controller), the Retry token key and the
/// bounds of quinn's queue of undecided attempts.
pub fn server_config(
    config: &ProxyConfig,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
    max_udp_payload: u16,
    token_key: Arc<dyn HandshakeTokenKey>,
) -> Result<quinn::ServerConfig, EndpointError> {
    let crypto = tls::server_crypto(config.hosts.clone(), metrics.clone())?;
    let transport =
        transport::transport_config(&config.transport, max_udp_payload, cc_stats.clone());
    let mut sc = quinn::ServerConfig::new(crypto, token_key);
    sc.transport_config(Arc::new(transport));
    sc.max_incoming(MAX_INCOMING);
    sc.incoming_buffer_size(INCOMING_BUFFER_BYTES);
    sc.incoming_buffer_size_total(INCOMING_BUFFER_TOTAL_BYTES);
    // Clients may migrate (Wi-Fi to mobile); keep allowing it.
    sc.migration(true);
    Ok(sc)
}

/// What every endpoint of a proxy shares: its keys, its slot among the processes sharing
/// the port (in every connection ID) and the amplification ledger.
pub struct Identity<'a> {
    pub keys: &'a Keys,
    pub slot: usize,
    pub guard: &'a Arc<Guard>,
}

/// A quinn endpoint on each bound socket, serving `config`, with the identity of `id`, its sends
/// to unvalidated addresses held to 3x by the guard, and first Initials shed at the socket while
/// its accept loop is behind or past their rate ([`super::shed`]).
pub fn endpoints(
    sockets: Vec<BoundSocket>,
    config: &ProxyConfig,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
    id: Identity<'_>,
) -> Result<Vec<Family>, EndpointError> {
    let interface_mtu = transport::largest_interface_mtu();
    let mut families = Vec::new();
    for b in sockets {
        let ipv6 = b.family == FAMILY_IPV6;
        let max_udp_payload = transport::max_udp_payload(&config.transport, ipv6, interface_mtu);
        let token_key = id.keys.token_key();
        let sc = server_config(
            config,
            metrics,
            cc_stats,
            max_udp_payload,
            token_key.clone(),
        )?;
        let addr = b
            .socket
            .local_addr()
            .map_err(|source| EndpointError::Create {
                addr: SocketAddr::from(([0, 0, 0, 0], 0)),
                source,
            })?;
        let endpoint_error = |source| EndpointError::Create { addr, source };
        let runtime: Arc<dyn quinn::Runtime> = Arc::new(quinn::TokioRuntime);
        let socket = runtime.wrap_udp_socket(b.socket).map_err(endpoint_error)?;
        let shed = metrics.limits.with_label_values(&[limit::INITIAL_SHED]);
        let gate = Gate::new(shed);
        let socket = SheddingSocket::new(socket, gate.clone(), id.keys.cids(id.slot));
        let socket = GuardedSocket::new(socket, id.guard.clone());
        let endpoint = quinn::Endpoint::new_with_abstract_socket(
            id.keys.endpoint_config(id.slot),
            Some(sc),
            socket,
            runtime,
        )
        .map_err(endpoint_error)?;
        info!(family = b.family, %addr, max_udp_payload, "QUIC endpoint serving");
        families.push(Family {
            name: b.family,
            addr,
            endpoint,
            max_udp_payload,
            token_key,
            gate,
        });
    }
    Ok(families)
}

/// Installs `config` on every endpoint, or on none if one cannot be built.
/// New handshakes use it; open connections keep the one they started with.
pub fn reconfigure(
    families: &[Family],
    config: &ProxyConfig,
    metrics: &Arc<Metrics>,
    cc_stats: &Arc<CcStats>,
) -> Result<(), EndpointError> {
    let configs = families
        .iter()
        .map(|f| {
            server_config(
                config,
                metrics,
                cc_stats,
                f.max_udp_payload,
                f.token_key.clone(),
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    for (f, sc) in families.iter().zip(configs) {
        f.endpoint.set_server_config(Some(sc));
    }
    Ok(())
}
