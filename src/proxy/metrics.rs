//! Prometheus metrics, registered explicitly on one registry (no globals).
//!
//! Names carry the `h3_ingress_` prefix and their unit; labels are bounded: `host` only takes
//! configured host names (or `other`), never a client address or a path.

use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, LabelPair, Metric, MetricFamily, MetricType};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

pub const FAMILY_IPV4: &str = "ipv4";
pub const FAMILY_IPV6: &str = "ipv6";
/// `host` label for requests whose `:authority` is not a configured host.
pub const OTHER_HOST: &str = "other";

/// Upstream error kinds (`kind` label).
pub mod upstream_error {
    pub const CONNECT: &str = "connect";
    pub const TLS: &str = "tls";
    pub const TIMEOUT: &str = "timeout";
    pub const RESET: &str = "reset";
    pub const PROTOCOL: &str = "protocol";
}

/// Handshake results (`result` label).
pub mod handshake {
    pub const OK: &str = "ok";
    pub const UNKNOWN_SNI: &str = "unknown_sni";
    pub const FAILED: &str = "failed";
    pub const TIMEOUT: &str = "timeout";
}

/// Why a request was answered without reaching the upstream (`reason` label).
pub mod rejected {
    pub const MALFORMED: &str = "malformed";
    pub const MISDIRECTED: &str = "misdirected";
    pub const HEADERS_TOO_LARGE: &str = "headers_too_large";
    pub const CONTENT_LENGTH: &str = "content_length_mismatch";
}

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub request_duration: HistogramVec,
    pub upstream_errors: IntCounterVec,
    pub rejected_requests: IntCounterVec,
    pub active_connections: IntGaugeVec,
    pub handshakes: IntCounterVec,
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
    pub gro_segments: IntGaugeVec,
    pub hosts: IntGauge,
    pub certificate_expiry: IntGaugeVec,
    pub config_reloads: IntCounterVec,
    pub alt_svc_advertised: IntGaugeVec,
    /// Our sockets' inodes per family, read by the /proc collector at scrape time.
    pub udp_sockets: Arc<Mutex<Vec<(&'static str, u64)>>>,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let r = &registry;
        macro_rules! reg {
            ($m:expr) => {{
                let m = $m;
                r.register(Box::new(m.clone()))
                    .expect("metric registers once");
                m
            }};
        }
        let udp_sockets = Arc::new(Mutex::new(Vec::new()));
        r.register(Box::new(UdpProcCollector::new(udp_sockets.clone())))
            .expect("udp collector registers once");

        let build_info = IntGaugeVec::new(
            opts(
                "h3_ingress_build_info",
                "Always 1; the version label names the build.",
            ),
            &["version"],
        )
        .unwrap();
        r.register(Box::new(build_info.clone())).unwrap();
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);

        let m = Metrics {
            requests: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_requests_total",
                    "HTTP/3 requests answered, by configured host, status class and client address family."
                ),
                &["host", "status_class", "family"]
            )
            .unwrap()),
            request_duration: reg!(HistogramVec::new(
                HistogramOpts::new(
                    "h3_ingress_request_duration_seconds",
                    "Time from request headers to the end of the response body, by host."
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0
                ]),
                &["host"]
            )
            .unwrap()),
            upstream_errors: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_upstream_errors_total",
                    "Requests that failed at the TCP ingress, by kind (connect, tls, timeout, reset, protocol)."
                ),
                &["kind"]
            )
            .unwrap()),
            rejected_requests: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_rejected_requests_total",
                    "Requests answered without reaching the upstream, by reason."
                ),
                &["reason"]
            )
            .unwrap()),
            active_connections: reg!(IntGaugeVec::new(
                opts("h3_ingress_active_connections", "Open QUIC connections by address family."),
                &["family"]
            )
            .unwrap()),
            handshakes: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_handshakes_total",
                    "QUIC handshakes by result (ok, unknown_sni, failed, timeout)."
                ),
                &["result"]
            )
            .unwrap()),
            body_bytes: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_body_bytes_total",
                    "Request (upload) and response (download) body bytes proxied."
                ),
                &["direction"]
            )
            .unwrap()),
            connection_rtt: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "h3_ingress_connection_rtt_seconds",
                    "Smoothed RTT of QUIC connections, observed when they close."
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0
                ])
            )
            .unwrap()),
            connection_path_mtu: reg!(Histogram::with_opts(
                HistogramOpts::new(
                    "h3_ingress_connection_path_mtu_bytes",
                    "UDP payload size path-MTU discovery settled on, observed when connections close."
                )
                .buckets(vec![
                    1200.0, 1252.0, 1280.0, 1350.0, 1400.0, 1452.0, 1472.0, 4000.0, 9000.0
                ])
            )
            .unwrap()),
            connection_lost_packets: reg!(IntCounter::with_opts(opts(
                "h3_ingress_connection_lost_packets_total",
                "Packets QUIC declared lost, summed over closed connections."
            ))
            .unwrap()),
            connection_sent_packets: reg!(IntCounter::with_opts(opts(
                "h3_ingress_connection_sent_packets_total",
                "Packets sent, summed over closed connections."
            ))
            .unwrap()),
            connection_congestion_events: reg!(IntCounter::with_opts(opts(
                "h3_ingress_connection_congestion_events_total",
                "Congestion events (window reductions), summed over closed connections."
            ))
            .unwrap()),
            connection_black_holes: reg!(IntCounter::with_opts(opts(
                "h3_ingress_connection_mtu_black_holes_total",
                "Path-MTU black holes detected (probes lost without ICMP), summed over closed connections."
            ))
            .unwrap()),
            handshake_losses_forgiven: reg!(IntCounter::with_opts(opts(
                "h3_ingress_congestion_handshake_losses_forgiven_total",
                "Losses of the handshake flight that cubic-hs did not treat as congestion."
            ))
            .unwrap()),
            random_losses_tolerated: reg!(IntCounter::with_opts(opts(
                "h3_ingress_congestion_random_losses_tolerated_total",
                "Losses that cubic-hs-lt read as random (no queueing delay, low loss rate), not as congestion."
            ))
            .unwrap()),
            slow_start_delay_exits: reg!(IntCounter::with_opts(opts(
                "h3_ingress_congestion_slow_start_delay_exits_total",
                "Initial slow starts that HyStart++ ended on a rising round-trip time, before any loss."
            ))
            .unwrap()),
            socket_receive_buffer: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_socket_receive_buffer_bytes",
                    "Effective SO_RCVBUF of our UDP socket as read back from the kernel."
                ),
                &["family"]
            )
            .unwrap()),
            socket_receive_buffer_requested: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_socket_receive_buffer_requested_bytes",
                    "SO_RCVBUF we asked for (the kernel reports double what it grants)."
                ),
                &["family"]
            )
            .unwrap()),
            socket_send_buffer: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_socket_send_buffer_bytes",
                    "Effective SO_SNDBUF of our UDP socket as read back from the kernel."
                ),
                &["family"]
            )
            .unwrap()),
            socket_send_buffer_requested: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_socket_send_buffer_requested_bytes",
                    "SO_SNDBUF we asked for."
                ),
                &["family"]
            )
            .unwrap()),
            socket_bound: reg!(IntGaugeVec::new(
                opts("h3_ingress_udp_socket_bound", "1 when the family's UDP socket is bound."),
                &["family"]
            )
            .unwrap()),
            gso_max_segments: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_gso_max_segments",
                    "Datagrams per sendmsg the kernel accepts through UDP GSO (1 = no GSO)."
                ),
                &["family"]
            )
            .unwrap()),
            gso_enabled: reg!(IntGaugeVec::new(
                opts("h3_ingress_udp_gso_enabled", "1 when UDP GSO is in use on the socket."),
                &["family"]
            )
            .unwrap()),
            gro_segments: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_udp_gro_segments",
                    "Datagrams per recvmsg the socket can take through UDP GRO (1 = no GRO)."
                ),
                &["family"]
            )
            .unwrap()),
            hosts: reg!(IntGauge::with_opts(opts(
                "h3_ingress_hosts",
                "Hosts with a loaded certificate."
            ))
            .unwrap()),
            certificate_expiry: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_certificate_expiry_timestamp_seconds",
                    "notAfter of the certificate served for a host."
                ),
                &["host"]
            )
            .unwrap()),
            config_reloads: reg!(IntCounterVec::new(
                opts(
                    "h3_ingress_config_reloads_total",
                    "Configuration updates by result (applied, invalid, restart_required)."
                ),
                &["result"]
            )
            .unwrap()),
            alt_svc_advertised: reg!(IntGaugeVec::new(
                opts(
                    "h3_ingress_alt_svc_advertised",
                    "1 when the TCP ingress answers the host with Alt-Svc h3 for our port, 0 when not."
                ),
                &["host"]
            )
            .unwrap()),
            udp_sockets,
            registry,
        };
        Arc::new(m)
    }

    /// The text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail on valid families");
        String::from_utf8(buf).expect("exposition is UTF-8")
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// HTTP status class label: `2xx` ... `5xx`.
pub fn status_class(status: u16) -> &'static str {
    match status {
        100..=199 => "1xx",
        200..=299 => "2xx",
        300..=399 => "3xx",
        400..=499 => "4xx",
        _ => "5xx",
    }
}

/// Host-wide UDP counters of one family, from /proc/net/snmp or /proc/net/snmp6.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UdpHostCounters {
    pub receive_buffer_errors: u64,
    pub send_buffer_errors: u64,
    pub in_errors: u64,
}

/// Parses the `Udp:` header/value line pair of /proc/net/snmp.
pub fn parse_snmp(text: &str) -> Option<UdpHostCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let header: Vec<&str> = lines.next()?.split_whitespace().collect();
    let values: Vec<&str> = lines.next()?.split_whitespace().collect();
    let get = |name: &str| -> Option<u64> {
        let i = header.iter().position(|h| *h == name)?;
        values.get(i)?.parse().ok()
    };
    Some(UdpHostCounters {
        receive_buffer_errors: get("RcvbufErrors")?,
        send_buffer_errors: get("SndbufErrors")?,
        in_errors: get("InErrors")?,
    })
}

/// Parses the `Udp6*` lines of /proc/net/snmp6.
pub fn parse_snmp6(text: &str) -> Option<UdpHostCounters> {
    let get = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next()? == name).then(|| it.next()?.parse().ok())?
        })
    };
    Some(UdpHostCounters {
        receive_buffer_errors: get("Udp6RcvbufErrors")?,
        send_buffer_errors: get("Udp6SndbufErrors")?,
        in_errors: get("Udp6InErrors")?,
    })
}

/// Drops of the socket with `inode` in /proc/net/udp or /proc/net/udp6 text.
pub fn parse_udp_socket_drops(text: &str, inode: u64) -> Option<u64> {
    text.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops
        if f.len() >= 13 && f[9].parse::<u64>().ok()? == inode {
            f[12].parse().ok()
        } else {
            None
        }
    })
}

/// Reads /proc at scrape time so the exported values are the kernel's, not a copy.
struct UdpProcCollector {
    descs: Vec<Desc>,
    sockets: Arc<Mutex<Vec<(&'static str, u64)>>>,
}

const HOST_RCVBUF: &str = "h3_ingress_udp_host_receive_buffer_errors_total";
const HOST_SNDBUF: &str = "h3_ingress_udp_host_send_buffer_errors_total";
const HOST_INERR: &str = "h3_ingress_udp_host_in_errors_total";
const SOCKET_DROPS: &str = "h3_ingress_udp_socket_drops_total";

impl UdpProcCollector {
    fn new(sockets: Arc<Mutex<Vec<(&'static str, u64)>>>) -> Self {
        let d = |n: &str, h: &str| {
            Desc::new(
                n.into(),
                h.into(),
                vec!["family".into()],
                Default::default(),
            )
            .unwrap()
        };
        Self {
            descs: vec![
                d(HOST_RCVBUF, "Host-wide UDP RcvbufErrors (datagrams dropped because a socket receive buffer was full), from /proc/net/snmp and snmp6."),
                d(HOST_SNDBUF, "Host-wide UDP SndbufErrors, from /proc/net/snmp and snmp6."),
                d(HOST_INERR, "Host-wide UDP InErrors, from /proc/net/snmp and snmp6."),
                d(SOCKET_DROPS, "Datagrams the kernel dropped on our own UDP socket (/proc/net/udp drops column)."),
            ],
            sockets,
        }
    }
}

fn counter_family(name: &str, help: &str, samples: Vec<(&str, u64)>) -> MetricFamily {
    let mut mf = MetricFamily::default();
    mf.set_name(name.to_string());
    mf.set_help(help.to_string());
    mf.set_field_type(MetricType::COUNTER);
    let metrics = samples
        .into_iter()
        .map(|(family, v)| {
            let mut lp = LabelPair::default();
            lp.set_name("family".into());
            lp.set_value(family.into());
            let mut c = Counter::default();
            c.set_value(v as f64);
            let mut m = Metric::default();
            m.set_label(vec![lp]);
            m.set_counter(c);
            m
        })
        .collect();
    mf.set_metric(metrics);
    mf
}

impl Collector for UdpProcCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let v4 = std::fs::read_to_string("/proc/net/snmp")
            .ok()
            .and_then(|t| parse_snmp(&t));
        let v6 = std::fs::read_to_string("/proc/net/snmp6")
            .ok()
            .and_then(|t| parse_snmp6(&t));
        let mut rcv = Vec::new();
        let mut snd = Vec::new();
        let mut inerr = Vec::new();
        for (family, c) in [(FAMILY_IPV4, v4), (FAMILY_IPV6, v6)] {
            if let Some(c) = c {
                rcv.push((family, c.receive_buffer_errors));
                snd.push((family, c.send_buffer_errors));
                inerr.push((family, c.in_errors));
            }
        }
        let mut drops = Vec::new();
        let sockets = self.sockets.lock().expect("socket list lock").clone();
        for (family, inode) in sockets {
            let file = if family == FAMILY_IPV4 {
                "/proc/net/udp"
            } else {
                "/proc/net/udp6"
            };
            if let Some(d) = std::fs::read_to_string(file)
                .ok()
                .and_then(|t| parse_udp_socket_drops(&t, inode))
            {
                drops.push((family, d));
            }
        }
        let h = |i: usize| self.descs[i].help.clone();
        let mut out = vec![
            counter_family(HOST_RCVBUF, &h(0), rcv),
            counter_family(HOST_SNDBUF, &h(1), snd),
            counter_family(HOST_INERR, &h(2), inerr),
        ];
        if !drops.is_empty() {
            out.push(counter_family(SOCKET_DROPS, &h(3), drops));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\nUdp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 100 2 7 90 5 3 0 0 0\nUdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdpLite: 0 0 0 0 0 0 0 0 0\n";
    const SNMP6: &str = "Udp6InDatagrams                 \t10\nUdp6NoPorts                     \t0\nUdp6InErrors                    \t4\nUdp6OutDatagrams                \t9\nUdp6RcvbufErrors                \t2\nUdp6SndbufErrors                \t1\nUdpLite6InErrors 0\n";
    const UDP: &str = "   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n  753: 00000000:01BB 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 424242 2 0000000000000000 17\n  754: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1111 2 0000000000000000 0\n";

    #[test]
    fn parses_proc_files() {
        assert_eq!(
            parse_snmp(SNMP),
            Some(UdpHostCounters {
                receive_buffer_errors: 5,
                send_buffer_errors: 3,
                in_errors: 7
            })
        );
        assert_eq!(
            parse_snmp6(SNMP6),
            Some(UdpHostCounters {
                receive_buffer_errors: 2,
                send_buffer_errors: 1,
                in_errors: 4
            })
        );
        assert_eq!(parse_udp_socket_drops(UDP, 424242), Some(17));
        assert_eq!(parse_udp_socket_drops(UDP, 1111), Some(0));
        assert_eq!(parse_udp_socket_drops(UDP, 9), None);
    }

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
        assert!(text.contains("h3_ingress_build_info{version="));
    }

    #[test]
    fn status_classes() {
        assert_eq!(status_class(200), "2xx");
        assert_eq!(status_class(421), "4xx");
        assert_eq!(status_class(502), "5xx");
    }
}
