//! Prometheus metrics, registered explicitly on one registry (no globals).
//!
//! Names carry the `h3_ingress_` prefix and their unit; labels are bounded: `host` only takes
//! configured host names (or `other`), never a client address or a path. Per-host series
//! ([`PerHost`]) exist only for hosts that got a request or an Alt-Svc probe, go when the
//! host leaves the configuration, and lose their `host` label altogether with
//! `metrics.hostLabel: false`; no histogram has a host label.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use std::collections::HashMap;
use std::sync::Mutex;

use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use super::procnet::{HostCounters, SocketInodes, SocketTables, UdpHostCounters};
use super::window::RecentCounter;

pub const FAMILY_IPV4: &str = "ipv4";
pub const FAMILY_IPV6: &str = "ipv6";

/// The `family` label of an address.
pub fn family_of(addr: &std::net::SocketAddr) -> &'static str {
    if addr.is_ipv6() {
        FAMILY_IPV6
    } else {
        FAMILY_IPV4
    }
}

/// `host` label for requests whose `:authority` is not a configured host.
pub const OTHER_HOST: &str = "other";

/// Upstream error kinds (`kind` label).
/// `leaf` of `h3_ingress_upstream_certificate_grace_total`: which other leaf than the one we
/// serve the upstream presented and was accepted.
pub mod renewal_leaf {
    pub const PREVIOUS: &str = "previous";
    pub const NEXT: &str = "next";
    pub const ALL: [&str; 2] = [PREVIOUS, NEXT];
}

/// What the lanes export: requests holding a place now, and lanes opened.
#[derive(Clone)]
pub struct LaneMetrics {
    pub in_flight: IntGauge,
    pub opened: IntCounter,
}

#[cfg(test)]
impl LaneMetrics {
    /// Metrics registered nowhere, for lanes nobody scrapes.
    pub fn unregistered() -> Self {
        Self {
            in_flight: IntGauge::new("in_flight", "-").expect("valid gauge"),
            opened: IntCounter::new("opened", "-").expect("valid counter"),
        }
    }
}

pub mod upstream_error {
    pub const CONNECT: &str = "connect";
    pub const TLS: &str = "tls";
    pub const TIMEOUT: &str = "timeout";
    pub const RESET: &str = "reset";
    pub const PROTOCOL: &str = "protocol";
    /// Every kind, exported as 0 from the start so dashboards and alerts see the series.
    pub const ALL: [&str; 5] = [CONNECT, TLS, TIMEOUT, RESET, PROTOCOL];
}

/// How a lookup of the upstream's name ended (`result` label of
/// `h3_ingress_upstream_resolutions_total`).
pub mod resolution {
    pub const OK: &str = "ok";
    pub const FAILED: &str = "failed";
    pub const ALL: [&str; 2] = [OK, FAILED];
}

/// Handshake results (`result` label): how each connection attempt ended. `refused` and
/// `retry` never started a handshake.
pub mod handshake {
    pub const OK: &str = "ok";
    pub const UNKNOWN_SNI: &str = "unknown_sni";
    pub const FAILED: &str = "failed";
    pub const TIMEOUT: &str = "timeout";
    pub const REFUSED: &str = "refused";
    pub const RETRY: &str = "retry";
    pub const ALL: [&str; 6] = [OK, UNKNOWN_SNI, FAILED, TIMEOUT, REFUSED, RETRY];
}

/// Why a request was answered without reaching the upstream (`reason` label).
pub mod rejected {
    pub const MALFORMED: &str = "malformed";
    pub const MISDIRECTED: &str = "misdirected";
    pub const HEADERS_TOO_LARGE: &str = "headers_too_large";
    pub const CONTENT_LENGTH: &str = "content_length_mismatch";
    /// Refused with 503 because the buffered-request budget was exhausted.
    pub const OVERLOADED: &str = "overloaded";
    /// Opened after the connection's GOAWAY: refused unprocessed (H3_REQUEST_REJECTED), the
    /// client may retry it on a new connection.
    pub const AFTER_GOAWAY: &str = "after_goaway";
    /// Every reason, exported as 0 from the start.
    pub const ALL: [&str; 6] = [
        MALFORMED,
        MISDIRECTED,
        HEADERS_TOO_LARGE,
        CONTENT_LENGTH,
        OVERLOADED,
        AFTER_GOAWAY,
    ];
}

/// What became of a configuration update (`result` label of `config_reloads_total`).
pub mod reload {
    pub const APPLIED: &str = "applied";
    pub const INVALID: &str = "invalid";
    pub const RESTART_REQUIRED: &str = "restart_required";
    /// Every result, exported as 0 from the start.
    pub const ALL: [&str; 3] = [APPLIED, INVALID, RESTART_REQUIRED];
}

/// Which limit acted (`limit` label of `h3_ingress_limits_total`): one value per limit, each
/// initialised to 0. docs/reliability.md lists the setting behind each.
pub mod limit {
    /// A HEADERS frame (or trailers) declared longer than `http.maxFieldSectionSizeBytes`.
    pub const HEADERS_FRAME: &str = "headers_frame";
    /// Another frame (SETTINGS, GOAWAY, ...) longer than `http.maxControlFrameBytes`.
    pub const CONTROL_FRAME: &str = "control_frame";
    pub const REQUEST_HEADERS_TIMEOUT: &str = "request_headers_timeout";
    pub const REQUEST_BODY_IDLE_TIMEOUT: &str = "request_body_idle_timeout";
    pub const RESPONSE_TIMEOUT: &str = "response_timeout";
    pub const RESPONSE_BODY_IDLE_TIMEOUT: &str = "response_body_idle_timeout";
    /// `limits.bufferedRequestBytes`, the process-wide budget, was exhausted.
    pub const BUFFERED_REQUEST_BYTES: &str = "buffered_request_bytes";
    pub const BUFFERED_REQUEST_BYTES_PER_CONNECTION: &str = "buffered_request_bytes_per_connection";
    pub const BUFFERED_REQUEST_BYTES_PER_STREAM: &str = "buffered_request_bytes_per_stream";
    // Connections and addresses.
    /// A Retry sent to make an unvalidated address prove itself.
    pub const RETRY: &str = "retry";
    pub const HALF_OPEN: &str = "half_open";
    pub const HALF_OPEN_PER_SOURCE: &str = "half_open_per_source";
    pub const CONNECTIONS: &str = "connections";
    pub const CONNECTIONS_PER_SOURCE: &str = "connections_per_source";
    pub const HANDSHAKE_RATE: &str = "handshake_rate";
    pub const HANDSHAKE_TIMEOUT: &str = "handshake_timeout";
    /// GOAWAY sent because a connection reached `http.maxConnectionAgeSeconds`.
    pub const CONNECTION_AGE: &str = "connection_age";
    /// A datagram to an unvalidated address withheld to stay within 3x what it sent.
    pub const AMPLIFICATION: &str = "amplification";
    /// An Initial dropped because too many sources were awaiting a decision.
    pub const INITIAL_BACKLOG: &str = "initial_backlog";
    /// A client's first Initial dropped at the socket while the accept loop was behind or past
    /// the rate of first Initials.
    pub const INITIAL_SHED: &str = "initial_shed";

    pub const ALL: &[&str] = &[
        HEADERS_FRAME,
        CONTROL_FRAME,
        REQUEST_HEADERS_TIMEOUT,
        REQUEST_BODY_IDLE_TIMEOUT,
        RESPONSE_TIMEOUT,
        RESPONSE_BODY_IDLE_TIMEOUT,
        BUFFERED_REQUEST_BYTES,
        BUFFERED_REQUEST_BYTES_PER_CONNECTION,
        BUFFERED_REQUEST_BYTES_PER_STREAM,
        RETRY,
        HALF_OPEN,
        HALF_OPEN_PER_SOURCE,
        CONNECTIONS,
        CONNECTIONS_PER_SOURCE,
        HANDSHAKE_RATE,
        HANDSHAKE_TIMEOUT,
        CONNECTION_AGE,
        AMPLIFICATION,
        INITIAL_BACKLOG,
        INITIAL_SHED,
    ];
}

pub struct Metrics {
    registry: Registry,
    pub limits: IntCounterVec,
    pub buffered_request_bytes: IntGauge,
    pub upstream_requests: IntGauge,
    pub upstream_connections: IntGauge,
    pub upstream_lanes_opened: IntCounter,
    pub upstream_certificate_grace: IntCounterVec,
    pub upstream_resolutions: IntCounterVec,
    pub access_log_dropped: IntCounter,
    /// Requests, certificate expiry and Alt-Svc per host.
    pub per_host: Arc<PerHost>,
    pub request_duration: Histogram,
    pub upstream_errors: IntCounterVec,
    pub rejected_requests: IntCounterVec,
    pub active_connections: IntGaugeVec,
    pub handshakes: IntCounterVec,
    pub half_open_connections: IntGauge,
    pub body_bytes: IntCounterVec,
    pub connection_rtt: Histogram,
    pub connection_path_mtu: Histogram,
    pub connection_lost_packets: IntCounter,
    pub connection_sent_packets: IntCounter,
    pub connection_congestion_events: IntCounter,
    pub connection_black_holes: IntCounter,
    pub handshake_losses_forgiven: IntCounter,
    pub random_losses_tolerated: IntCounter,
    pub slow_start_delay_exits: IntCounter,
    pub socket_receive_buffer: IntGaugeVec,
    pub socket_receive_buffer_requested: IntGaugeVec,
    pub socket_send_buffer: IntGaugeVec,
    pub socket_send_buffer_requested: IntGaugeVec,
    pub socket_bound: IntGaugeVec,
    pub gso_max_segments: IntGaugeVec,
    pub gso_enabled: IntGaugeVec,
    pub hosts: IntGauge,
    pub config_reloads: IntCounterVec,
    pub rollout_generations: IntGauge,
    pub rollout_newest: IntGauge,
    /// Our sockets' inodes per family, read by the /proc collector at scrape time.
    pub udp_sockets: SocketInodes,
}

/// One metric's name, help text, labels and (histograms) buckets: the table every metric is
/// registered from, so a name is written once.
pub struct Spec {
    pub name: &'static str,
    pub help: &'static str,
    pub labels: &'static [&'static str],
    pub buckets: &'static [f64],
}

const fn spec(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Spec {
    Spec {
        name,
        help,
        labels,
        buckets: &[],
    }
}

const fn histogram(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
) -> Spec {
    Spec {
        name,
        help,
        labels,
        buckets,
    }
}

/// Every metric the proxy exports.
pub mod specs {
    use super::{histogram, spec, Spec};

    pub(super) const HOST: &[&str] = &["host"];
    const FAMILY: &[&str] = &["family"];

    pub const BUILD_INFO: Spec = spec(
        "h3_ingress_build_info",
        "Always 1; the labels name the build: the crate version and the git commit.",
        &["version", "commit"],
    );
    // Requests.
    pub const REQUESTS: Spec = spec(
        "h3_ingress_requests_total",
        "HTTP/3 requests answered, by configured host, status class and client address family.",
        &["host", "status_class", "family"],
    );
    pub const REQUEST_DURATION: Spec = histogram(
        "h3_ingress_request_duration_seconds",
        "Time from request headers to the end of the response body, for configured hosts (no host label: 16 series per host would dominate a scrape).",
        &[],
        &[
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ],
    );
    pub const UPSTREAM_ERRORS: Spec = spec(
        "h3_ingress_upstream_errors_total",
        "Requests that failed at the TCP ingress, by kind (connect, tls, timeout, reset, protocol).",
        &["kind"],
    );
    pub const REJECTED_REQUESTS: Spec = spec(
        "h3_ingress_rejected_requests_total",
        "Requests answered without reaching the upstream, by reason.",
        &["reason"],
    );
    pub const LIMITS: Spec = spec(
        "h3_ingress_limits_total",
        "Times a protective limit acted (a frame refused, a timeout fired, the request budget was exhausted, a connection attempt retried or refused, a datagram withheld), by limit.",
        &["limit"],
    );
    pub const BUFFERED_REQUEST_BYTES: Spec = spec(
        "h3_ingress_buffered_request_bytes",
        "Request bytes (header sections, read-ahead bodies) currently held against limits.bufferedRequestBytes.",
        &[],
    );
    pub const UPSTREAM_REQUESTS: Spec = spec(
        "h3_ingress_upstream_requests",
        "Requests holding a place on an upstream connection now (from sending the request to the end of its response).",
        &[],
    );
    pub const HEAP_BYTES: Spec = spec(
        "h3_ingress_heap_bytes",
        crate::memory::HEAP_BYTES_HELP,
        &["state"],
    );
    pub const UPSTREAM_CONNECTIONS: Spec = spec(
        "h3_ingress_upstream_connections",
        "Connections open to the TCP ingress (in use or idle in the pool; an idle one closes after 30 to 60 s).",
        &[],
    );
    pub const UPSTREAM_LANES_OPENED: Spec = spec(
        "h3_ingress_upstream_lanes_opened_total",
        "Upstream client lanes opened: each carries at most upstream.maxStreamsPerConnection concurrent requests on its own connections, so more than one per configuration means requests beyond one HTTP/2 connection's streams (with proxyProtocol, each client connection has its own lanes).",
        &[],
    );
    pub const UPSTREAM_CERTIFICATE_GRACE: Spec = spec(
        "h3_ingress_upstream_certificate_grace_total",
        "TLS handshakes with the TCP ingress accepted under upstream.verify: servedCertificate with another leaf than the one served, while a certificate renewal reaches both sides: the leaf this proxy served before its switch (previous) or the renewal it has not loaded yet (next).",
        &["leaf"],
    );
    pub const UPSTREAM_RESOLUTIONS: Spec = spec(
        "h3_ingress_upstream_resolutions_total",
        "Lookups of the upstream's name (and of hosts' own upstreams) by result (ok, failed): one when a configuration is applied, then at most one per name every 30 s or after a connect to every address failed; IP literals are never looked up.",
        &["result"],
    );
    pub const ACCESS_LOG_DROPPED: Spec = spec(
        "h3_ingress_access_log_dropped_total",
        "Access-log lines dropped because the queue to the writer was full (accessLog.enabled; the request itself is never held up).",
        &[],
    );
    pub const BODY_BYTES: Spec = spec(
        "h3_ingress_body_bytes_total",
        "Request (upload) and response (download) body bytes proxied.",
        &["direction"],
    );
    // Connections.
    pub const ACTIVE_CONNECTIONS: Spec = spec(
        "h3_ingress_active_connections",
        "Open QUIC connections by address family.",
        FAMILY,
    );
    pub const HANDSHAKES: Spec = spec(
        "h3_ingress_handshakes_total",
        "QUIC connection attempts by result (ok, unknown_sni, failed, timeout; refused and retry started no handshake).",
        &["result"],
    );
    pub const HALF_OPEN_CONNECTIONS: Spec = spec(
        "h3_ingress_half_open_connections",
        "QUIC handshakes in progress.",
        &[],
    );
    pub const CONNECTION_RTT: Spec = histogram(
        "h3_ingress_connection_rtt_seconds",
        "Smoothed RTT of QUIC connections, observed when they close.",
        &[],
        &[
            0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
        ],
    );
    pub const CONNECTION_PATH_MTU: Spec = histogram(
        "h3_ingress_connection_path_mtu_bytes",
        "UDP payload size path-MTU discovery settled on, observed when connections close.",
        &[],
        &[
            1200.0, 1252.0, 1280.0, 1350.0, 1400.0, 1452.0, 1472.0, 4000.0, 9000.0,
        ],
    );
    pub const LOST_PACKETS: Spec = spec(
        "h3_ingress_connection_lost_packets_total",
        "Packets QUIC declared lost, summed over closed connections.",
        &[],
    );
    pub const SENT_PACKETS: Spec = spec(
        "h3_ingress_connection_sent_packets_total",
        "Packets sent, summed over closed connections.",
        &[],
    );
    pub const CONGESTION_EVENTS: Spec = spec(
        "h3_ingress_connection_congestion_events_total",
        "Congestion events (window reductions), summed over closed connections.",
        &[],
    );
    pub const BLACK_HOLES: Spec = spec(
        "h3_ingress_connection_mtu_black_holes_total",
        "Path-MTU black holes detected (probes lost without ICMP), summed over closed connections.",
        &[],
    );
    pub const HANDSHAKE_LOSSES_FORGIVEN: Spec = spec(
        "h3_ingress_congestion_handshake_losses_forgiven_total",
        "Losses of the handshake flight that cubic-hs did not treat as congestion.",
        &[],
    );
    pub const RANDOM_LOSSES_TOLERATED: Spec = spec(
        "h3_ingress_congestion_random_losses_tolerated_total",
        "Losses that cubic-hs-lt read as random (no queueing delay, low loss rate), not as congestion.",
        &[],
    );
    pub const SLOW_START_DELAY_EXITS: Spec = spec(
        "h3_ingress_congestion_slow_start_delay_exits_total",
        "Initial slow starts that HyStart++ ended on a rising round-trip time, before any loss.",
        &[],
    );
    // Sockets.
    pub const RECEIVE_BUFFER: Spec = spec(
        "h3_ingress_udp_socket_receive_buffer_bytes",
        "Effective SO_RCVBUF of our UDP socket as read back from the kernel.",
        FAMILY,
    );
    pub const RECEIVE_BUFFER_REQUESTED: Spec = spec(
        "h3_ingress_udp_socket_receive_buffer_requested_bytes",
        "SO_RCVBUF we asked for (the kernel reports double what it grants).",
        FAMILY,
    );
    pub const SEND_BUFFER: Spec = spec(
        "h3_ingress_udp_socket_send_buffer_bytes",
        "Effective SO_SNDBUF of our UDP socket as read back from the kernel.",
        FAMILY,
    );
    pub const SEND_BUFFER_REQUESTED: Spec = spec(
        "h3_ingress_udp_socket_send_buffer_requested_bytes",
        "SO_SNDBUF we asked for.",
        FAMILY,
    );
    pub const SOCKET_BOUND: Spec = spec(
        "h3_ingress_udp_socket_bound",
        "1 when the family's UDP socket is bound.",
        FAMILY,
    );
    pub const GSO_MAX_SEGMENTS: Spec = spec(
        "h3_ingress_udp_gso_max_segments",
        "Datagrams per sendmsg the kernel accepts through UDP GSO (1 = no GSO).",
        FAMILY,
    );
    pub const GSO_ENABLED: Spec = spec(
        "h3_ingress_udp_gso_enabled",
        "1 when UDP GSO is in use on the socket.",
        FAMILY,
    );
    // The kernel's UDP counters, read from /proc at scrape time.
    pub const HOST_RECEIVE_BUFFER_ERRORS: Spec = spec(
        "h3_ingress_udp_host_receive_buffer_errors_total",
        "Host-wide UDP RcvbufErrors (datagrams dropped because a socket receive buffer was full), from /proc/net/snmp and snmp6.",
        FAMILY,
    );
    pub const HOST_SEND_BUFFER_ERRORS: Spec = spec(
        "h3_ingress_udp_host_send_buffer_errors_total",
        "Host-wide UDP SndbufErrors, from /proc/net/snmp and snmp6.",
        FAMILY,
    );
    pub const HOST_IN_ERRORS: Spec = spec(
        "h3_ingress_udp_host_in_errors_total",
        "Host-wide UDP InErrors, from /proc/net/snmp and snmp6.",
        FAMILY,
    );
    pub const SOCKET_DROPS: Spec = spec(
        "h3_ingress_udp_socket_drops_total",
        "Datagrams the kernel dropped on our own UDP socket (/proc/net/udp drops column).",
        FAMILY,
    );
    // Configuration.
    pub const HOSTS: Spec = spec("h3_ingress_hosts", "Hosts with a loaded certificate.", &[]);
    pub const CERTIFICATE_EXPIRY: Spec = spec(
        "h3_ingress_certificate_expiry_timestamp_seconds",
        "notAfter of the certificate served for a host (for hosts that got a request or an Alt-Svc probe).",
        HOST,
    );
    pub const CERTIFICATE_EARLIEST_EXPIRY: Spec = spec(
        "h3_ingress_certificate_earliest_expiry_timestamp_seconds",
        "The earliest notAfter among the certificates served (absent without hosts).",
        &[],
    );
    pub const CONFIG_RELOADS: Spec = spec(
        "h3_ingress_config_reloads_total",
        "Configuration updates by result (applied, invalid, restart_required).",
        &["result"],
    );
    pub const ALT_SVC_ADVERTISED: Spec = spec(
        "h3_ingress_alt_svc_advertised",
        "1 when the TCP ingress answers the host with Alt-Svc h3 for our port, 0 when not (for probed hosts).",
        HOST,
    );
    pub const ALT_SVC_HOSTS: Spec = spec(
        "h3_ingress_alt_svc_hosts",
        "Configured hosts by the result of their last Alt-Svc probe (advertised, missing: not advertised or the probe failed).",
        &["result"],
    );
    // Rollouts on a host.
    pub const ROLLOUT_GENERATIONS: Spec = spec(
        "h3_ingress_rollout_generations",
        "Process generations sharing this process's UDP port on its host, itself included.",
        &[],
    );
    pub const ROLLOUT_NEWEST: Spec = spec(
        "h3_ingress_rollout_newest",
        "1 when this process takes the new connections of its host's port, 0 while it waits or drains for a newer one.",
        &[],
    );
}

/// Registers metrics from their [`Spec`]s on one registry.
struct Registrar<'a>(&'a Registry);

impl Registrar<'_> {
    fn register<M: prometheus::core::Collector + Clone + 'static>(&self, m: M) -> M {
        self.0
            .register(Box::new(m.clone()))
            .expect("metric registers once");
        m
    }

    fn register_collector(&self, c: impl prometheus::core::Collector + 'static) {
        self.0
            .register(Box::new(c))
            .expect("collector registers once");
    }

    fn opts(s: &Spec) -> Opts {
        Opts::new(s.name, s.help)
    }

    fn hopts(s: &Spec) -> HistogramOpts {
        HistogramOpts::new(s.name, s.help).buckets(s.buckets.to_vec())
    }

    fn counter(&self, s: &Spec) -> IntCounter {
        self.register(IntCounter::with_opts(Self::opts(s)).expect("valid counter"))
    }

    fn counter_vec(&self, s: &Spec) -> IntCounterVec {
        self.register(IntCounterVec::new(Self::opts(s), s.labels).expect("valid counter"))
    }

    fn gauge(&self, s: &Spec) -> IntGauge {
        self.register(IntGauge::with_opts(Self::opts(s)).expect("valid gauge"))
    }

    fn gauge_vec(&self, s: &Spec) -> IntGaugeVec {
        self.register(IntGaugeVec::new(Self::opts(s), s.labels).expect("valid gauge"))
    }

    fn histogram(&self, s: &Spec) -> Histogram {
        self.register(Histogram::with_opts(Self::hopts(s)).expect("valid histogram"))
    }

    fn per_host(&self) -> Arc<PerHost> {
        let p = Arc::new(PerHost::new());
        self.register_collector(PerHostCollector(p.clone()));
        p
    }
}

/// What an upstream exports: its lanes' metrics, and the handshakes its `servedCertificate`
/// verifier accepted with a replaced or renewed leaf.
#[derive(Clone)]
pub struct UpstreamMetrics {
    pub lanes: LaneMetrics,
    pub certificate_grace: prometheus::IntCounterVec,
    pub connections: IntGauge,
    pub resolutions: IntCounterVec,
}

#[cfg(test)]
impl UpstreamMetrics {
    /// Metrics registered nowhere, for upstreams nobody scrapes.
    pub fn unregistered() -> Self {
        let opts = prometheus::Opts::new("grace", "-");
        Self {
            lanes: LaneMetrics::unregistered(),
            certificate_grace: prometheus::IntCounterVec::new(opts, &["leaf"])
                .expect("valid counter"),
            connections: IntGauge::new("connections", "-").expect("valid gauge"),
            resolutions: IntCounterVec::new(prometheus::Opts::new("resolutions", "-"), &["result"])
                .expect("valid counter"),
        }
    }
}

impl Metrics {
    /// The upstream lanes' share of these metrics.
    pub fn lanes(&self) -> LaneMetrics {
        LaneMetrics {
            in_flight: self.upstream_requests.clone(),
            opened: self.upstream_lanes_opened.clone(),
        }
    }

    /// The upstream's share: its lanes', and the certificate grace counter.
    pub fn upstream(&self) -> UpstreamMetrics {
        UpstreamMetrics {
            lanes: self.lanes(),
            certificate_grace: self.upstream_certificate_grace.clone(),
            connections: self.upstream_connections.clone(),
            resolutions: self.upstream_resolutions.clone(),
        }
    }

    pub fn new() -> Arc<Self> {
        use specs::*;
        let registry = Registry::new();
        let r = Registrar(&registry);
        let udp_sockets = SocketInodes::default();
        r.register_collector(UdpProcCollector::new(udp_sockets.clone()));
        r.register_collector(crate::memory::HeapCollector::new(HEAP_BYTES.name));
        r.register_collector(crate::fds::FdCollector::new(
            crate::fds::PROXY_ACCEPT_ERRORS,
        ));
        r.gauge_vec(&BUILD_INFO)
            .with_label_values(&[crate::version::VERSION, crate::version::COMMIT])
            .set(1);
        let limits = r.counter_vec(&LIMITS);
        for l in limit::ALL {
            limits.with_label_values(&[l]);
        }
        let m = Metrics {
            limits,
            buffered_request_bytes: r.gauge(&BUFFERED_REQUEST_BYTES),
            upstream_requests: r.gauge(&UPSTREAM_REQUESTS),
            upstream_connections: r.gauge(&UPSTREAM_CONNECTIONS),
            upstream_lanes_opened: r.counter(&UPSTREAM_LANES_OPENED),
            upstream_certificate_grace: r.counter_vec(&UPSTREAM_CERTIFICATE_GRACE),
            upstream_resolutions: r.counter_vec(&UPSTREAM_RESOLUTIONS),
            access_log_dropped: r.counter(&ACCESS_LOG_DROPPED),
            per_host: r.per_host(),
            request_duration: r.histogram(&REQUEST_DURATION),
            upstream_errors: r.counter_vec(&UPSTREAM_ERRORS),
            rejected_requests: r.counter_vec(&REJECTED_REQUESTS),
            body_bytes: r.counter_vec(&BODY_BYTES),
            active_connections: r.gauge_vec(&ACTIVE_CONNECTIONS),
            handshakes: r.counter_vec(&HANDSHAKES),
            half_open_connections: r.gauge(&HALF_OPEN_CONNECTIONS),
            connection_rtt: r.histogram(&CONNECTION_RTT),
            connection_path_mtu: r.histogram(&CONNECTION_PATH_MTU),
            connection_lost_packets: r.counter(&LOST_PACKETS),
            connection_sent_packets: r.counter(&SENT_PACKETS),
            connection_congestion_events: r.counter(&CONGESTION_EVENTS),
            connection_black_holes: r.counter(&BLACK_HOLES),
            handshake_losses_forgiven: r.counter(&HANDSHAKE_LOSSES_FORGIVEN),
            random_losses_tolerated: r.counter(&RANDOM_LOSSES_TOLERATED),
            slow_start_delay_exits: r.counter(&SLOW_START_DELAY_EXITS),
            socket_receive_buffer: r.gauge_vec(&RECEIVE_BUFFER),
            socket_receive_buffer_requested: r.gauge_vec(&RECEIVE_BUFFER_REQUESTED),
            socket_send_buffer: r.gauge_vec(&SEND_BUFFER),
            socket_send_buffer_requested: r.gauge_vec(&SEND_BUFFER_REQUESTED),
            socket_bound: r.gauge_vec(&SOCKET_BOUND),
            gso_max_segments: r.gauge_vec(&GSO_MAX_SEGMENTS),
            gso_enabled: r.gauge_vec(&GSO_ENABLED),
            hosts: r.gauge(&HOSTS),
            config_reloads: r.counter_vec(&CONFIG_RELOADS),
            rollout_generations: r.gauge(&ROLLOUT_GENERATIONS),
            rollout_newest: r.gauge(&ROLLOUT_NEWEST),
            udp_sockets,
            registry,
        };
        // Known label values start at 0: a series that appears only with its first event
        // leaves rate() and the dashboard empty until then, and absent() alerts guessing.
        for kind in upstream_error::ALL {
            m.upstream_errors.with_label_values(&[kind]);
        }
        for leaf in renewal_leaf::ALL {
            m.upstream_certificate_grace.with_label_values(&[leaf]);
        }
        for result in resolution::ALL {
            m.upstream_resolutions.with_label_values(&[result]);
        }
        for reason in rejected::ALL {
            m.rejected_requests.with_label_values(&[reason]);
        }
        for result in reload::ALL {
            m.config_reloads.with_label_values(&[result]);
        }
        for result in handshake::ALL {
            m.handshakes.with_label_values(&[result]);
        }
        Arc::new(m)
    }

    /// Follows a newly applied configuration: the host count, the `metrics.hostLabel`
    /// setting, and the per-host series of hosts that left (retired, so totals without the
    /// host label never fall).
    pub fn follow_config(&self, config: &crate::config::ProxyConfig) {
        self.hosts.set(config.hosts.len() as i64);
        self.per_host
            .follow(&config.hosts, config.metrics_host_label);
    }

    /// Counts one action of the limit `l` (a [`limit`] value).
    pub fn limit(&self, l: &str) {
        self.limits.with_label_values(&[l]).inc();
    }

    /// The text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail on valid families");
        String::from_utf8(buf).expect("exposition is UTF-8")
    }
}

/// HTTP status classes and client address families: the indexes of a host's request
/// counters, so counting a request allocates nothing.
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];
const FAMILIES: [&str; 2] = [FAMILY_IPV4, FAMILY_IPV6];

type RequestCounts = [[u64; FAMILIES.len()]; STATUS_CLASSES.len()];

fn family_index(family: &str) -> usize {
    usize::from(family == FAMILY_IPV6)
}

/// What is known of one host that got a request or a probe.
#[derive(Debug, Default, Clone)]
pub struct HostCounts {
    requests: RequestCounts,
    recent: RecentCounter,
    /// notAfter of its certificate, while it is configured.
    expiry: Option<i64>,
    /// Its last Alt-Svc probe.
    alt_svc: Option<bool>,
}

impl HostCounts {
    pub fn requests(&self) -> u64 {
        self.requests.iter().flatten().sum()
    }

    /// Requests in the last [`super::window::WINDOW_MINUTES`] minutes.
    pub fn recent(&self, now_minute: u64) -> u64 {
        self.recent.sum(now_minute)
    }
}

#[derive(Debug)]
struct PerHostState {
    host_label: bool,
    /// Hosts with series, by the name of their configured entry (or [`OTHER_HOST`]).
    hosts: HashMap<String, HostCounts>,
    /// Requests of hosts no longer configured: a total without the host label never falls.
    retired: RequestCounts,
    /// The configured hosts' earliest notAfter; `None` without hosts.
    earliest_expiry: Option<i64>,
}

/// The per-host series: kept here rather than in label vectors so that they are created only
/// when a host first gets a request or a probe, removed when it leaves the configuration, and
/// exported with or without the `host` label as `metrics.hostLabel` says, switchable live.
/// A request costs one lock and one map lookup, no allocation after the host's first.
#[derive(Debug)]
pub struct PerHost {
    state: Mutex<PerHostState>,
}

impl PerHost {
    fn new() -> Self {
        PerHost {
            state: Mutex::new(PerHostState {
                host_label: true,
                hosts: HashMap::new(),
                retired: RequestCounts::default(),
                earliest_expiry: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PerHostState> {
        self.state.lock().expect("per-host metrics lock")
    }

    /// Counts one answered request for `host` (a configured entry's name, or
    /// [`OTHER_HOST`]), whose certificate expires at `expiry`.
    pub fn count_request(&self, host: &str, expiry: Option<i64>, status: u16, family: &str) {
        let class = class_index(status);
        let mut s = self.lock();
        let h = match s.hosts.get_mut(host) {
            Some(h) => h,
            None => s.hosts.entry(host.to_string()).or_default(),
        };
        h.requests[class][family_index(family)] += 1;
        h.recent.add(super::window::current_minute());
        if expiry.is_some() {
            h.expiry = expiry;
        }
    }

    /// Records the Alt-Svc probe of a configured `host` whose certificate expires at `expiry`.
    pub fn probed(&self, host: &str, expiry: i64, advertised: bool) {
        let mut s = self.lock();
        let h = s.hosts.entry(host.to_string()).or_default();
        h.alt_svc = Some(advertised);
        h.expiry = Some(expiry);
    }

    /// Drops what probes recorded (this process no longer probes): a host known only from a
    /// probe loses its series, the others keep their request counts.
    pub fn forget_probes(&self) {
        let mut s = self.lock();
        s.hosts.retain(|_, h| {
            h.alt_svc = None;
            h.requests() > 0
        });
    }

    /// Keeps the series of the hosts `hosts` still serves (their expiry updated: a rotated
    /// certificate), retires the others, and applies `host_label`.
    pub fn follow(&self, hosts: &crate::config::HostTable, host_label: bool) {
        let mut s = self.lock();
        s.host_label = host_label;
        s.earliest_expiry = hosts.iter().map(|h| h.not_after).min();
        let mut retired = s.retired;
        s.hosts.retain(|name, c| {
            if name == OTHER_HOST {
                return true;
            }
            match hosts.get(name) {
                Some(entry) => {
                    c.expiry = Some(entry.not_after);
                    true
                }
                None => {
                    for (r, n) in retired
                        .iter_mut()
                        .flatten()
                        .zip(c.requests.iter().flatten())
                    {
                        *r += n;
                    }
                    false
                }
            }
        });
        s.retired = retired;
    }

    /// Every request counted since start, retired hosts and [`OTHER_HOST`] included.
    pub fn requests_total(&self) -> u64 {
        let s = self.lock();
        s.retired.iter().flatten().sum::<u64>()
            + s.hosts.values().map(HostCounts::requests).sum::<u64>()
    }

    /// What is known of `host`, if it has series.
    pub fn host(&self, host: &str) -> Option<HostCounts> {
        self.lock().hosts.get(host).cloned()
    }

    /// Hosts with series now (what one scrape carries per host).
    pub fn hosts_with_series(&self) -> usize {
        self.lock().hosts.len()
    }
}

/// Renders [`PerHost`] at scrape time.
pub struct PerHostCollector(Arc<PerHost>);

/// Its families, in the order of its `descs`.
const PER_HOST_SPECS: [&Spec; 5] = [
    &specs::REQUESTS,
    &specs::CERTIFICATE_EXPIRY,
    &specs::CERTIFICATE_EARLIEST_EXPIRY,
    &specs::ALT_SVC_ADVERTISED,
    &specs::ALT_SVC_HOSTS,
];

fn label(name: &str, value: &str) -> LabelPair {
    let mut lp = LabelPair::default();
    lp.set_name(name.into());
    lp.set_value(value.into());
    lp
}

fn family(spec: &Spec, kind: MetricType, metrics: Vec<Metric>) -> MetricFamily {
    let mut mf = MetricFamily::default();
    mf.set_name(spec.name.to_string());
    mf.set_help(spec.help.to_string());
    mf.set_field_type(kind);
    mf.set_metric(metrics);
    mf
}

fn counter_metric(labels: Vec<LabelPair>, v: u64) -> Metric {
    let mut c = Counter::default();
    c.set_value(v as f64);
    let mut m = Metric::default();
    m.set_label(labels);
    m.set_counter(c);
    m
}

fn gauge_metric(labels: Vec<LabelPair>, v: i64) -> Metric {
    let mut g = Gauge::default();
    g.set_value(v as f64);
    let mut m = Metric::default();
    m.set_label(labels);
    m.set_gauge(g);
    m
}

/// `requests_total` samples: per host and only the (class, family) pairs seen, or without
/// the host label every pair, from 0.
fn request_samples(s: &PerHostState) -> Vec<Metric> {
    let pairs = |counts: &RequestCounts| {
        let mut out = Vec::new();
        for (c, class) in STATUS_CLASSES.iter().enumerate() {
            for (f, family) in FAMILIES.iter().enumerate() {
                out.push((*class, *family, counts[c][f]));
            }
        }
        out
    };
    if !s.host_label {
        let mut total = s.retired;
        for h in s.hosts.values() {
            for (t, n) in total.iter_mut().flatten().zip(h.requests.iter().flatten()) {
                *t += n;
            }
        }
        return pairs(&total)
            .into_iter()
            .map(|(class, family, n)| {
                counter_metric(
                    vec![label("family", family), label("status_class", class)],
                    n,
                )
            })
            .collect();
    }
    let mut out = Vec::new();
    for (host, h) in &s.hosts {
        for (class, family, n) in pairs(&h.requests) {
            if n > 0 {
                // In name order, as the registry's own vectors write them.
                let labels = vec![
                    label("family", family),
                    label("host", host),
                    label("status_class", class),
                ];
                out.push(counter_metric(labels, n));
            }
        }
    }
    out
}

impl Collector for PerHostCollector {
    fn desc(&self) -> Vec<&Desc> {
        static DESCS: std::sync::OnceLock<Vec<Desc>> = std::sync::OnceLock::new();
        DESCS
            .get_or_init(|| PER_HOST_SPECS.iter().map(|s| desc_of(s)).collect())
            .iter()
            .collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = self.0.lock();
        let mut expiry = Vec::new();
        let mut alt_svc = Vec::new();
        let (mut advertised, mut missing) = (0, 0);
        for (host, h) in &s.hosts {
            if let Some(t) = h.expiry {
                expiry.push(gauge_metric(vec![label("host", host)], t));
            }
            if let Some(a) = h.alt_svc {
                alt_svc.push(gauge_metric(vec![label("host", host)], i64::from(a)));
                *(if a { &mut advertised } else { &mut missing }) += 1;
            }
        }
        if !s.host_label {
            expiry.clear();
            alt_svc.clear();
        }
        let alt_svc_hosts = [("advertised", advertised), ("missing", missing)]
            .into_iter()
            .map(|(r, n)| gauge_metric(vec![label("result", r)], n))
            .collect();
        let earliest = s
            .earliest_expiry
            .map(|t| gauge_metric(vec![], t))
            .into_iter()
            .collect();
        vec![
            family(PER_HOST_SPECS[0], MetricType::COUNTER, request_samples(&s)),
            family(PER_HOST_SPECS[1], MetricType::GAUGE, expiry),
            family(PER_HOST_SPECS[2], MetricType::GAUGE, earliest),
            family(PER_HOST_SPECS[3], MetricType::GAUGE, alt_svc),
            family(PER_HOST_SPECS[4], MetricType::GAUGE, alt_svc_hosts),
        ]
    }
}

fn desc_of(s: &Spec) -> Desc {
    let labels = s.labels.iter().map(|l| l.to_string()).collect();
    Desc::new(s.name.into(), s.help.into(), labels, Default::default())
        .expect("valid metric description")
}

/// The index of a status's class (`1xx` ... `5xx`) in [`STATUS_CLASSES`]; anything beyond
/// 599 counts as `5xx`.
fn class_index(status: u16) -> usize {
    usize::from(status / 100).clamp(1, STATUS_CLASSES.len()) - 1
}

/// Reads /proc at scrape time so the exported values are the kernel's, not a copy.
struct UdpProcCollector {
    descs: Vec<Desc>,
    sockets: SocketInodes,
}

/// The collector's families, in the order of its `descs`.
const PROC_SPECS: [&Spec; 4] = [
    &specs::HOST_RECEIVE_BUFFER_ERRORS,
    &specs::HOST_SEND_BUFFER_ERRORS,
    &specs::HOST_IN_ERRORS,
    &specs::SOCKET_DROPS,
];

impl UdpProcCollector {
    fn new(sockets: SocketInodes) -> Self {
        Self {
            descs: PROC_SPECS.iter().map(|s| desc_of(s)).collect(),
            sockets,
        }
    }
}

fn counter_family(spec: &Spec, samples: Vec<(&str, u64)>) -> MetricFamily {
    let metrics = samples
        .into_iter()
        .map(|(f, v)| counter_metric(vec![label("family", f)], v))
        .collect();
    family(spec, MetricType::COUNTER, metrics)
}

impl Collector for UdpProcCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let host = HostCounters::read();
        let per_family = |f: fn(&UdpHostCounters) -> u64| -> Vec<(&str, u64)> {
            [(FAMILY_IPV4, host.ipv4), (FAMILY_IPV6, host.ipv6)]
                .into_iter()
                .filter_map(|(family, c)| Some((family, f(&c?))))
                .collect()
        };
        let tables = SocketTables::read();
        let sockets = self.sockets.lock().expect("socket list lock").clone();
        let drops: Vec<(&str, u64)> = sockets
            .into_iter()
            .filter_map(|(family, inode)| {
                Some((family, tables.drops(family == FAMILY_IPV6, inode)?))
            })
            .collect();
        let mut out = vec![
            counter_family(PROC_SPECS[0], per_family(|c| c.receive_buffer_errors)),
            counter_family(PROC_SPECS[1], per_family(|c| c.send_buffer_errors)),
            counter_family(PROC_SPECS[2], per_family(|c| c.in_errors)),
        ];
        if !drops.is_empty() {
            out.push(counter_family(PROC_SPECS[3], drops));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::observe::procnet::parse_snmp;

    #[test]
    fn live_proc_values_are_exported() {
        let m = Metrics::new();
        let text = m.render();
        let snmp = parse_snmp(&std::fs::read_to_string("/proc/net/snmp").unwrap()).unwrap();
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("h3_ingress_udp_host_receive_buffer_errors_total{family=\"ipv4\"}")
            })
            .expect("exported");
        let v: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        // Another process may add drops between the two reads; never fewer.
        assert!(
            v <= parse_snmp(&std::fs::read_to_string("/proc/net/snmp").unwrap())
                .unwrap()
                .receive_buffer_errors
        );
        assert!(v >= snmp.receive_buffer_errors);
        let build = format!(
            "h3_ingress_build_info{{commit=\"{}\",version=\"{}\"}} 1",
            crate::version::COMMIT,
            crate::version::VERSION
        );
        assert!(text.contains(&build), "{build} in {text}");
    }

    #[test]
    fn the_dashboard_series_exist_at_zero_before_their_first_event() {
        let text = Metrics::new().render();
        let series = upstream_error::ALL
            .iter()
            .map(|k| format!("h3_ingress_upstream_errors_total{{kind=\"{k}\"}} 0"))
            .chain(
                rejected::ALL
                    .iter()
                    .map(|r| format!("h3_ingress_rejected_requests_total{{reason=\"{r}\"}} 0")),
            )
            .chain(
                reload::ALL
                    .iter()
                    .map(|r| format!("h3_ingress_config_reloads_total{{result=\"{r}\"}} 0")),
            );
        for line in series {
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
    }

    #[test]
    fn every_metric_is_registered_with_its_spec() {
        let m = Metrics::new();
        let hosts = table(1);
        m.follow_config_hosts(&hosts, true);
        // Give every per-host family one series so the exposition lists it.
        m.per_host
            .count_request("h0.test", Some(7), 200, FAMILY_IPV4);
        m.per_host.probed("h0.test", 7, true);
        m.request_duration.observe(0.1);
        let text = m.render();
        for (s, kind) in [
            (&specs::REQUESTS, "counter"),
            (&specs::REQUEST_DURATION, "histogram"),
            (&specs::CONNECTION_RTT, "histogram"),
            (&specs::LOST_PACKETS, "counter"),
            (&specs::HOSTS, "gauge"),
            (&specs::CERTIFICATE_EXPIRY, "gauge"),
            (&specs::CERTIFICATE_EARLIEST_EXPIRY, "gauge"),
            (&specs::ALT_SVC_ADVERTISED, "gauge"),
            (&specs::ALT_SVC_HOSTS, "gauge"),
            (&specs::ROLLOUT_NEWEST, "gauge"),
            (&specs::ROLLOUT_GENERATIONS, "gauge"),
        ] {
            assert!(
                text.contains(&format!(
                    "# HELP {} {}\n# TYPE {} {kind}",
                    s.name, s.help, s.name
                )),
                "{}: {text}",
                s.name
            );
        }
        assert!(text.contains("h3_ingress_request_duration_seconds_bucket{le=\"60\"} 1"));
        assert!(text.contains(
            "h3_ingress_requests_total{family=\"ipv4\",host=\"h0.test\",status_class=\"2xx\"} 1"
        ));
        assert!(
            text.contains("h3_ingress_certificate_expiry_timestamp_seconds{host=\"h0.test\"} 7")
        );
        assert!(text.contains("h3_ingress_alt_svc_hosts{result=\"advertised\"} 1"));
        assert!(!text.contains("gro"), "{text}");
    }

    #[test]
    fn a_pod_that_stops_probing_drops_the_probe_series_and_keeps_its_requests() {
        let m = Metrics::new();
        m.follow_config_hosts(&table(2), true);
        m.per_host
            .count_request("h0.test", Some(7), 200, FAMILY_IPV4);
        m.per_host.probed("h0.test", 7, true);
        m.per_host.probed("h1.test", 7, false);
        m.per_host.forget_probes();
        let text = m.render();
        assert!(!text.contains("h3_ingress_alt_svc_advertised{"), "{text}");
        assert!(!text.contains("host=\"h1.test\""), "probed only: {text}");
        assert!(text.contains(
            "h3_ingress_requests_total{family=\"ipv4\",host=\"h0.test\",status_class=\"2xx\"} 1"
        ));
        assert!(text.contains("h3_ingress_alt_svc_hosts{result=\"advertised\"} 0"));
        assert!(text.contains("h3_ingress_alt_svc_hosts{result=\"missing\"} 0"));
    }

    /// `n` hosts `h0.test`... sharing one certificate (building them costs no key parsing).
    fn table(n: usize) -> crate::config::HostTable {
        let ck = rcgen::generate_simple_self_signed(vec!["*.test".to_string()]).unwrap();
        let cert = crate::config::Certificate::from_pem(
            ck.cert.pem().as_bytes(),
            ck.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let mut t = crate::config::HostTable::default();
        for i in 0..n {
            t.insert(cert.entry(format!("h{i}.test")));
        }
        t
    }

    impl Metrics {
        fn follow_config_hosts(&self, hosts: &crate::config::HostTable, host_label: bool) {
            self.hosts.set(hosts.len() as i64);
            self.per_host.follow(hosts, host_label);
        }
    }

    /// Sample lines of the exposition whose name starts with `prefix`.
    fn samples(text: &str, prefix: &str) -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn per_host_series_appear_with_traffic_and_leave_with_the_host() {
        let m = Metrics::new();
        let hosts = table(3);
        m.follow_config_hosts(&hosts, true);
        let text = m.render();
        // Configured, but no request and no probe yet: no per-host series.
        assert!(
            samples(&text, "h3_ingress_requests_total").is_empty(),
            "{text}"
        );
        assert!(samples(&text, "h3_ingress_certificate_expiry_timestamp").is_empty());
        let earliest = hosts.iter().map(|h| h.not_after).min().unwrap();
        assert_eq!(
            samples(&text, "h3_ingress_certificate_earliest_expiry"),
            [format!(
                "h3_ingress_certificate_earliest_expiry_timestamp_seconds {earliest}"
            )]
        );
        m.per_host
            .count_request("h1.test", Some(earliest), 200, FAMILY_IPV6);
        m.per_host
            .count_request("h1.test", Some(earliest), 503, FAMILY_IPV6);
        m.per_host.count_request(OTHER_HOST, None, 421, FAMILY_IPV4);
        let text = m.render();
        assert_eq!(
            samples(&text, "h3_ingress_requests_total").len(),
            3,
            "{text}"
        );
        assert_eq!(
            samples(&text, "h3_ingress_certificate_expiry_timestamp").len(),
            1
        );
        assert_eq!(m.per_host.host("h1.test").unwrap().requests(), 2);

        // h1 leaves: its series go, its requests stay in the total.
        let mut fewer = crate::config::HostTable::default();
        for h in hosts.iter().filter(|h| h.name != "h1.test") {
            fewer.insert(crate::config::HostEntry {
                name: h.name.clone(),
                certified_key: h.certified_key.clone(),
                not_after: h.not_after,
                leaf_sha256: h.leaf_sha256.clone(),
                upstream: None,
                source: String::new(),
                secret: None,
                timeouts: Default::default(),
                replaced: None,
            });
        }
        m.follow_config_hosts(&fewer, true);
        let text = m.render();
        assert_eq!(
            samples(&text, "h3_ingress_requests_total"),
            ["h3_ingress_requests_total{family=\"ipv4\",host=\"other\",status_class=\"4xx\"} 1"]
        );
        assert_eq!(m.per_host.requests_total(), 3);

        // Without the host label: every class and family from 0, summed over hosts, the
        // retired ones included; no per-host gauge.
        m.follow_config_hosts(&fewer, false);
        let text = m.render();
        assert!(!text.contains("host=\""), "{text}");
        let requests = samples(&text, "h3_ingress_requests_total");
        assert_eq!(requests.len(), STATUS_CLASSES.len() * FAMILIES.len());
        assert!(requests.contains(
            &"h3_ingress_requests_total{family=\"ipv6\",status_class=\"5xx\"} 1".to_string()
        ));
        assert!(requests.contains(
            &"h3_ingress_requests_total{family=\"ipv4\",status_class=\"4xx\"} 1".to_string()
        ));
    }

    /// The budget: one scrape at 10,000 hosts, each with a request and an Alt-Svc
    /// probe, stays under 50,000 series with defaults. Prints the counts.
    #[test]
    fn one_scrape_at_ten_thousand_hosts_stays_within_the_series_budget() {
        const HOSTS: usize = 10_000;
        let hosts = table(HOSTS);
        let series = |host_label: bool, probe: bool| {
            let m = Metrics::new();
            m.follow_config_hosts(&hosts, host_label);
            for h in hosts.iter() {
                m.per_host
                    .count_request(&h.name, Some(h.not_after), 200, FAMILY_IPV4);
                m.request_duration.observe(0.05);
                if probe {
                    m.per_host.probed(&h.name, h.not_after, false);
                }
            }
            m.render()
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .count()
        };
        let (requests_only, probed, no_label) =
            (series(true, false), series(true, true), series(false, true));
        println!(
            "series per scrape at {HOSTS} hosts, a request to each: {requests_only}; \
             every host also probed: {probed}; metrics.hostLabel=false: {no_label}"
        );
        assert!(probed <= 50_000, "{probed}");
        assert!(
            probed >= 3 * HOSTS,
            "every host has its three series: {probed}"
        );
        assert!(no_label < 300, "{no_label}");
    }

    #[test]
    fn status_classes() {
        let class = |s| STATUS_CLASSES[class_index(s)];
        assert_eq!(class(200), "2xx");
        assert_eq!(class(421), "4xx");
        assert_eq!(class(502), "5xx");
        assert_eq!(class(999), "5xx");
        assert_eq!(class(100), "1xx");
    }
}
