//! The one validated, in-memory configuration of the data plane.
//!
//! It is built by pure functions, either from the standalone YAML file ([`mod@file`]) or from the
//! listener and the certificate mirrors the operator writes ([`mirrors`]); the data plane never
//! knows which. Validation happens here, once, at the edge: everything downstream takes a
//! [`ProxyConfig`] and trusts it. Which hosts a listener serves is decided before, by the
//! operator (`operator::hosts`); nothing here reads an Ingress or a Gateway.

pub mod bind;
pub mod file;
mod hosts;
pub mod mirrors;

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

pub use hosts::{
    host_matches, normalize_host_name, Certificate, HostEntry, HostError, HostTable, HostTimeouts,
    Replaced,
};

use crate::api::bounds::{self, Bound};
use crate::api::unknown::UnknownValue;
use crate::api::{
    AddressValidationSettings, Addresses, ClientAddressVia, ClientForwardedFor, HostReport,
    HttpSettings, LimitsSettings, ListenerSettings, MetricsSettings, MirrorReport, SocketSettings,
    TransportSettings, Upstream, UpstreamVerify,
};

/// One validation problem: the field path (`upstream.address`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one configuration, so a user fixes them in one go.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    pub errors: Vec<FieldError>,
}

impl ConfigError {
    pub fn single(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            errors: vec![FieldError {
                path: path.into(),
                message: message.into(),
            }],
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines: Vec<String> = self.errors.iter().map(|e| e.to_string()).collect();
        write!(f, "{}", lines.join("; "))
    }
}

/// The sockets: changing any of these needs new sockets, hence a restart (or a rolled pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenConfig {
    pub port: u16,
    pub ipv4: Option<Ipv4Addr>,
    pub ipv6: Option<Ipv6Addr>,
    pub receive_buffer_bytes: u32,
    pub send_buffer_bytes: u32,
    pub force_buffers: bool,
}

/// Where the upstream lives: a literal address or a DNS name, plus the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamAddress {
    pub host: String,
    pub port: u16,
}

impl fmt::Display for UpstreamAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    pub address: UpstreamAddress,
    pub tls: bool,
    pub verify: UpstreamVerify,
    /// Where the client's connections go with a PROXY protocol v2 header naming the client:
    /// `upstream.clientAddress.proxyProtocolAddress`, or `upstream.address` with
    /// `upstream.proxyProtocol` (or `via: ProxyProtocol` without an address). `None`: the
    /// forwarding headers alone tell the client's address.
    pub proxy_protocol: Option<UpstreamAddress>,
    /// What becomes of a client's own `X-Forwarded-For` and `Forwarded`.
    pub forwarded_for: ClientForwardedFor,
    /// Requests per upstream connection (a lane's cap).
    pub max_streams_per_connection: u32,
    pub connect_timeout: Duration,
    /// Counted from the end of the request body.
    pub response_timeout: Duration,
    pub response_body_idle_timeout: Duration,
    /// `servedCertificate`: how long a replaced or a renewed leaf is accepted (0: never).
    pub served_certificate_grace: Duration,
}

/// The validated configuration the data plane runs.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: ListenConfig,
    pub metrics_address: SocketAddr,
    pub upstream: UpstreamConfig,
    pub transport: TransportSettings,
    pub http: HttpSettings,
    pub address_validation: AddressValidationSettings,
    pub limits: LimitsSettings,
    /// `keys.file` of the standalone file, resolved against the file's directory (Kubernetes
    /// mode gets its key file from `proxy --keys-file` instead).
    pub keys_file: Option<PathBuf>,
    pub alt_svc_max_age: u32,
    /// `altSvc.probePath`: what the Alt-Svc prober asks each host for.
    pub alt_svc_probe_path: http::uri::PathAndQuery,
    pub hosts: HostTable,
    /// `metrics.hostLabel`: whether per-host metric series carry the host's name.
    pub metrics_host_label: bool,
    /// `accessLog.enabled`: one JSON line per request on standard output.
    pub access_log: bool,
    /// Hosts that were wanted but cannot be served, with the reason (`/hosts` lists them
    /// after the hosts of `hosts`). A report whose state is `Serving` repeats a host of
    /// `hosts` and is skipped there.
    pub host_reports: Vec<HostReport>,
    /// Kubernetes mode: what this configuration applies of the listener's certificate
    /// mirrors, for `/status`.
    pub mirrors: Option<MirrorReport>,
}

impl ProxyConfig {
    /// Fields that differ between `self` (running) and `next` but cannot be applied to bound
    /// sockets. A reload must refuse them loudly: silently keeping the old sockets would leave
    /// the user believing, say, a new buffer size or address family is in effect.
    pub fn restart_required_changes(&self, next: &ProxyConfig) -> Vec<String> {
        let (a, b) = (&self.listen, &next.listen);
        let mut changed = Vec::new();
        if a.port != b.port {
            changed.push(format!("port {} -> {}", a.port, b.port));
        }
        if a.ipv4 != b.ipv4 {
            changed.push(format!("addresses.ipv4 {:?} -> {:?}", a.ipv4, b.ipv4));
        }
        if a.ipv6 != b.ipv6 {
            changed.push(format!("addresses.ipv6 {:?} -> {:?}", a.ipv6, b.ipv6));
        }
        if a.receive_buffer_bytes != b.receive_buffer_bytes {
            changed.push(format!(
                "socket.receiveBufferBytes {} -> {}",
                a.receive_buffer_bytes, b.receive_buffer_bytes
            ));
        }
        if a.send_buffer_bytes != b.send_buffer_bytes {
            changed.push(format!(
                "socket.sendBufferBytes {} -> {}",
                a.send_buffer_bytes, b.send_buffer_bytes
            ));
        }
        if a.force_buffers != b.force_buffers {
            changed.push(format!(
                "socket.forceBuffers {} -> {}",
                a.force_buffers, b.force_buffers
            ));
        }
        if self.keys_file != next.keys_file {
            // The keys are the endpoint's identity (reset tokens, connection IDs): a new key
            // needs a new endpoint.
            changed.push(format!(
                "keys.file {:?} -> {:?}",
                self.keys_file, next.keys_file
            ));
        }
        if self.metrics_address != next.metrics_address {
            changed.push(format!(
                "metrics.address {} -> {}",
                self.metrics_address, next.metrics_address
            ));
        }
        changed
    }
}

/// One field error per enum value this binary does not know, under `prefix` (`"spec"`).
pub fn unknown_value_errors(values: &[UnknownValue], prefix: &str) -> Vec<FieldError> {
    let mut errs = Errors::new(prefix);
    for v in values {
        errs.push(&v.path, v.message());
    }
    errs.list
}

/// Collects field errors under a path prefix (`""` for the file, `"spec"` for the CRD).
struct Errors {
    prefix: String,
    list: Vec<FieldError>,
}

impl Errors {
    fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            list: Vec::new(),
        }
    }

    fn push(&mut self, field: &str, message: impl Into<String>) {
        let path = if self.prefix.is_empty() {
            field.to_string()
        } else {
            format!("{}.{}", self.prefix, field)
        };
        self.list.push(FieldError {
            path,
            message: message.into(),
        });
    }

    /// The range check of a numeric field, from the same [`Bound`] the CRD schema carries.
    fn check(&mut self, bound: Bound, value: impl Into<u64>) {
        let value = value.into();
        if !bound.contains(value) {
            let Bound { field, min, max } = bound;
            self.push(field, format!("{value} is outside {min}..={max}"));
        }
    }
}

/// Validates the listener-wide settings and combines them with already-validated hosts.
/// Pure: no file, socket or API access. Every section is checked, so one error report lists
/// every problem.
pub fn build(
    settings: ListenerSettings<'_>,
    unknown_values: &[UnknownValue],
    hosts: HostTable,
    prefix: &str,
) -> Result<ProxyConfig, ConfigError> {
    let mut errs = Errors::new(prefix);
    errs.list = unknown_value_errors(unknown_values, prefix);
    errs.check(bounds::PORT, settings.port);
    let (ipv4, ipv6) = addresses(settings.addresses, &mut errs);
    let upstream = upstream(settings.upstream, &mut errs);
    socket(settings.socket, &mut errs);
    transport(settings.transport, &mut errs);
    http(settings.http, &mut errs);
    connections(settings.address_validation, settings.limits, &mut errs);
    limits(settings.limits, settings.http, &mut errs);
    let metrics_address = metrics_address(settings.metrics, &mut errs);
    let probe_path = probe_path(&settings.alt_svc.probe_path, &mut errs);

    if !errs.list.is_empty() {
        return Err(ConfigError { errors: errs.list });
    }
    let (Some(upstream), Some(metrics_address), Some(alt_svc_probe_path)) =
        (upstream, metrics_address, probe_path)
    else {
        unreachable!("every None above pushed an error");
    };
    let socket = settings.socket;
    Ok(ProxyConfig {
        listen: ListenConfig {
            port: settings.port,
            ipv4,
            ipv6,
            receive_buffer_bytes: socket.receive_buffer_bytes,
            send_buffer_bytes: socket.send_buffer_bytes,
            force_buffers: socket.force_buffers,
        },
        metrics_address,
        upstream,
        transport: settings.transport.clone(),
        http: settings.http.clone(),
        address_validation: settings.address_validation.clone(),
        limits: settings.limits.clone(),
        keys_file: None,
        alt_svc_max_age: settings.alt_svc.max_age_seconds,
        alt_svc_probe_path,
        metrics_host_label: settings.metrics.host_label,
        access_log: settings.access_log.enabled,
        host_reports: Vec::new(),
        mirrors: None,
        hosts,
    })
}

/// `socket`: the buffer sizes requested for both sockets.
fn socket(s: &SocketSettings, errs: &mut Errors) {
    errs.check(bounds::RECEIVE_BUFFER_BYTES, s.receive_buffer_bytes);
    errs.check(bounds::SEND_BUFFER_BYTES, s.send_buffer_bytes);
}

/// `addresses`: one address per family, `null` for a family that stays off.
fn addresses(a: &Addresses, errs: &mut Errors) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let ipv4 = a.ipv4.as_deref().and_then(|s| match s.parse::<Ipv4Addr>() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push("addresses.ipv4", format!("{s:?} is not an IPv4 address"));
            None
        }
    });
    let ipv6 = a.ipv6.as_deref().and_then(|s| {
        match s
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<Ipv6Addr>()
        {
            // A mapped address would carry IPv4 on an AF_INET6 socket, which cannot set
            // Don't Fragment on IPv4 datagrams; IPv4 gets its own socket instead.
            Ok(a) if a.to_ipv4_mapped().is_some() => {
                errs.push(
                    "addresses.ipv6",
                    format!("{s:?} is an IPv4-mapped address; put IPv4 in addresses.ipv4"),
                );
                None
            }
            Ok(a) => Some(a),
            Err(_) => {
                errs.push("addresses.ipv6", format!("{s:?} is not an IPv6 address"));
                None
            }
        }
    });
    if a.ipv4.is_none() && a.ipv6.is_none() {
        errs.push(
            "addresses",
            "ipv4 and ipv6 are both null; at least one family must be enabled",
        );
    }
    (ipv4, ipv6)
}

/// `upstream`: the TCP ingress every request goes to.
fn upstream(u: &Upstream, errs: &mut Errors) -> Option<UpstreamConfig> {
    let address = match parse_host_port(&u.address) {
        Ok(a) => Some(a),
        Err(why) => {
            errs.push(
                "upstream.address",
                format!("{:?} is not host:port ({why})", u.address),
            );
            None
        }
    };
    if !u.tls && u.verify != UpstreamVerify::ServedCertificate {
        // `verify` has no meaning without TLS; accept the default silently but reject an
        // explicit non-default so a user does not believe verification happens.
        errs.push(
            "upstream.verify",
            format!("{:?} needs upstream.tls: true", u.verify),
        );
    }
    errs.check(bounds::CONNECT_TIMEOUT_SECONDS, u.connect_timeout_seconds);
    errs.check(bounds::RESPONSE_TIMEOUT_SECONDS, u.response_timeout_seconds);
    errs.check(
        bounds::MAX_STREAMS_PER_CONNECTION,
        u.max_streams_per_connection,
    );
    errs.check(
        bounds::RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
        u.response_body_idle_timeout_seconds,
    );
    errs.check(
        bounds::SERVED_CERTIFICATE_GRACE_SECONDS,
        u.served_certificate_grace_seconds,
    );
    let proxy_protocol = proxy_protocol_target(u, address.as_ref(), errs);
    Some(UpstreamConfig {
        address: address?,
        tls: u.tls,
        verify: u.verify,
        proxy_protocol,
        forwarded_for: u.client_address.client_forwarded_for,
        max_streams_per_connection: u.max_streams_per_connection,
        connect_timeout: Duration::from_secs(u.connect_timeout_seconds.into()),
        response_timeout: Duration::from_secs(u.response_timeout_seconds.into()),
        response_body_idle_timeout: Duration::from_secs(
            u.response_body_idle_timeout_seconds.into(),
        ),
        served_certificate_grace: Duration::from_secs(u.served_certificate_grace_seconds.into()),
    })
}

/// `upstream.clientAddress` and `upstream.proxyProtocol`: where a PROXY protocol header goes,
/// if anywhere.
fn proxy_protocol_target(
    u: &Upstream,
    address: Option<&UpstreamAddress>,
    errs: &mut Errors,
) -> Option<UpstreamAddress> {
    const FIELD: &str = "upstream.clientAddress.proxyProtocolAddress";
    let c = &u.client_address;
    let second = c.proxy_protocol_address.trim();
    if second.is_empty() {
        let on = u.proxy_protocol || c.via == ClientAddressVia::ProxyProtocol;
        return address.filter(|_| on).cloned();
    }
    if c.via != ClientAddressVia::ProxyProtocol {
        errs.push(
            FIELD,
            format!(
                "{second:?} needs upstream.clientAddress.via: ProxyProtocol (it is {})",
                c.via.as_str()
            ),
        );
        return None;
    }
    if u.proxy_protocol {
        errs.push(
            "upstream.proxyProtocol",
            format!(
                "true sends PROXY protocol to upstream.address; with {FIELD} set, leave it false"
            ),
        );
    }
    match parse_host_port(second) {
        Ok(a) => Some(a),
        Err(why) => {
            errs.push(FIELD, format!("{second:?} is not host:port ({why})"));
            None
        }
    }
}

/// `transport`: QUIC windows, timeouts and limits.
fn transport(t: &TransportSettings, errs: &mut Errors) {
    errs.check(bounds::INITIAL_WINDOW_PACKETS, t.initial_window_packets);
    errs.check(
        bounds::STREAM_RECEIVE_WINDOW_BYTES,
        t.stream_receive_window_bytes,
    );
    errs.check(
        bounds::CONNECTION_RECEIVE_WINDOW_BYTES,
        t.connection_receive_window_bytes,
    );
    if t.connection_receive_window_bytes < t.stream_receive_window_bytes {
        errs.push(
            "transport.connectionReceiveWindowBytes",
            format!(
                "{} is smaller than transport.streamReceiveWindowBytes ({})",
                t.connection_receive_window_bytes, t.stream_receive_window_bytes
            ),
        );
    }
    errs.check(bounds::SEND_WINDOW_BYTES, t.send_window_bytes);
    if let Some(m) = t.max_udp_payload_bytes {
        errs.check(bounds::MAX_UDP_PAYLOAD_BYTES, m);
    }
    errs.check(bounds::IDLE_TIMEOUT_SECONDS, t.idle_timeout_seconds);
    errs.check(bounds::MAX_CONCURRENT_STREAMS, t.max_concurrent_streams);
    errs.check(
        bounds::HANDSHAKE_TIMEOUT_SECONDS,
        t.handshake_timeout_seconds,
    );
}

/// `http`: request handling limits.
fn http(h: &HttpSettings, errs: &mut Errors) {
    errs.check(
        bounds::MAX_FIELD_SECTION_SIZE_BYTES,
        h.max_field_section_size_bytes,
    );
    errs.check(bounds::DRAIN_TIMEOUT_SECONDS, h.drain_timeout_seconds);
    errs.check(
        bounds::REQUEST_HEADERS_TIMEOUT_SECONDS,
        h.request_headers_timeout_seconds,
    );
    errs.check(
        bounds::REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
        h.request_body_idle_timeout_seconds,
    );
    errs.check(bounds::MAX_CONTROL_FRAME_BYTES, h.max_control_frame_bytes);
    errs.check(
        bounds::MAX_CONNECTION_AGE_SECONDS,
        h.max_connection_age_seconds,
    );
}

/// `limits`: the buffered-request budget and its shares, which must nest.
fn limits(l: &LimitsSettings, h: &HttpSettings, errs: &mut Errors) {
    errs.check(bounds::BUFFERED_REQUEST_BYTES, l.buffered_request_bytes);
    errs.check(
        bounds::BUFFERED_REQUEST_BYTES_PER_CONNECTION,
        l.buffered_request_bytes_per_connection,
    );
    errs.check(
        bounds::BUFFERED_REQUEST_BYTES_PER_STREAM,
        l.buffered_request_bytes_per_stream,
    );
    if l.buffered_request_bytes_per_connection > l.buffered_request_bytes {
        errs.push(
            bounds::BUFFERED_REQUEST_BYTES_PER_CONNECTION.field,
            format!(
                "{} is larger than limits.bufferedRequestBytes ({})",
                l.buffered_request_bytes_per_connection, l.buffered_request_bytes
            ),
        );
    }
    if l.buffered_request_bytes_per_stream > l.buffered_request_bytes_per_connection {
        errs.push(
            bounds::BUFFERED_REQUEST_BYTES_PER_STREAM.field,
            format!(
                "{} is larger than limits.bufferedRequestBytesPerConnection ({})",
                l.buffered_request_bytes_per_stream, l.buffered_request_bytes_per_connection
            ),
        );
    }
    // A header section the proxy advertises it accepts must fit the share of its stream.
    if l.buffered_request_bytes_per_stream < u64::from(h.max_field_section_size_bytes) {
        errs.push(
            bounds::BUFFERED_REQUEST_BYTES_PER_STREAM.field,
            format!(
                "{} is smaller than http.maxFieldSectionSizeBytes ({})",
                l.buffered_request_bytes_per_stream, h.max_field_section_size_bytes
            ),
        );
    }
}

/// `addressValidation` and the connection caps of `limits`: who may start a handshake, and
/// how many may run.
fn connections(v: &AddressValidationSettings, l: &LimitsSettings, errs: &mut Errors) {
    errs.check(bounds::HALF_OPEN_THRESHOLD, v.half_open_threshold);
    errs.check(bounds::HALF_OPEN_CONNECTIONS, l.half_open_connections);
    errs.check(
        bounds::HALF_OPEN_CONNECTIONS_PER_SOURCE,
        l.half_open_connections_per_source,
    );
    errs.check(bounds::CONNECTIONS, l.connections);
    errs.check(bounds::CONNECTIONS_PER_SOURCE, l.connections_per_source);
    errs.check(bounds::HANDSHAKES_PER_SECOND, l.handshakes_per_second);
    errs.check(
        bounds::SOURCE_PREFIX_LENGTH_IPV4,
        l.source_prefix_length_ipv4,
    );
    errs.check(
        bounds::SOURCE_PREFIX_LENGTH_IPV6,
        l.source_prefix_length_ipv6,
    );
    // At or above the cap, spoofed sources would fill every half-open slot before a Retry
    // is ever sent, and validated clients would be refused.
    if v.half_open_threshold >= l.half_open_connections {
        errs.push(
            "addressValidation.halfOpenThreshold",
            format!(
                "{} must be below limits.halfOpenConnections ({})",
                v.half_open_threshold, l.half_open_connections
            ),
        );
    }
}

/// `metrics.address`: where metrics, health and `/status` are served.
fn metrics_address(m: &MetricsSettings, errs: &mut Errors) -> Option<SocketAddr> {
    match m.address.parse::<SocketAddr>() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push("metrics.address", format!("{:?} is not ip:port", m.address));
            None
        }
    }
}

/// `altSvc.probePath`: an absolute path (with a query if wanted) of printable ASCII, as the
/// CRD's pattern says, so the file and a spec written before the pattern get the same answer.
fn probe_path(p: &str, errs: &mut Errors) -> Option<http::uri::PathAndQuery> {
    const FIELD: &str = "altSvc.probePath";
    let max = bounds::MAX_ALT_SVC_PROBE_PATH_BYTES;
    if p.len() > max {
        errs.push(FIELD, format!("{} bytes is longer than {max}", p.len()));
        return None;
    }
    let printable = p.bytes().all(|b| b.is_ascii_graphic());
    match p.parse::<http::uri::PathAndQuery>() {
        Ok(pq) if p.starts_with('/') && printable => Some(pq),
        _ => {
            let shown: String = p.chars().take(80).collect();
            errs.push(
                FIELD,
                format!("{shown:?} is not an absolute path such as /healthz"),
            );
            None
        }
    }
}

/// Parses `host:port`, `ip:port` or `[ipv6]:port`.
pub fn parse_host_port(s: &str) -> Result<UpstreamAddress, &'static str> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        if sa.port() == 0 {
            return Err("port 0");
        }
        return Ok(UpstreamAddress {
            host: sa.ip().to_string(),
            port: sa.port(),
        });
    }
    let (host, port) = s.rsplit_once(':').ok_or("no port")?;
    let port: u16 = port.parse().map_err(|_| "port is not a number 1-65535")?;
    if port == 0 {
        return Err("port 0");
    }
    if host.is_empty() {
        return Err("empty host");
    }
    if host.contains(':') || host.starts_with('[') {
        return Err("IPv6 literals need brackets: [::1]:443");
    }
    if !hosts::is_dns_name(host) {
        return Err("host is neither an IP address nor a DNS name");
    }
    Ok(UpstreamAddress {
        host: host.to_ascii_lowercase(),
        port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{FileConfig, Http3ListenerSpec};

    fn file(yaml: &str) -> FileConfig {
        file::parse(yaml).expect("parses")
    }

    /// An enum value a newer CRD added makes that listener invalid, naming the field and what
    /// this binary knows; the file refuses the same value while parsing, naming the field.
    #[test]
    fn unknown_enum_values_are_field_errors() {
        let spec: Http3ListenerSpec = serde_json::from_value(serde_json::json!({
            "upstream": {"address": "10.0.0.1:443", "verify": "pinned"},
            "transport": {"congestionControl": "l4s"},
        }))
        .unwrap();
        let errors = messages(build(
            spec.listener_settings(),
            spec.unknown_values.values(),
            HostTable::default(),
            "spec",
        ));
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "spec.transport.congestionControl: \"l4s\" is not a value this h3-ingress knows \
                 (it knows cubic-hs, cubic-hs-lt, cubic, newreno, bbr)"
            ),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("spec.upstream.verify: \"pinned\""),
            "{errors:?}"
        );
        let e = file::parse(
            "upstream: {address: '1.2.3.4:443'}\ntransport: {congestionControl: l4s}\n",
        )
        .unwrap_err();
        assert_eq!(e.errors[0].path, "transport.congestionControl");
        assert!(e.errors[0].message.contains("unknown variant `l4s`"), "{e}");
    }

    fn messages(r: Result<ProxyConfig, ConfigError>) -> Vec<String> {
        r.unwrap_err()
            .errors
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    #[test]
    fn defaults_match_the_documented_values() {
        let f = file("upstream: {address: '127.0.0.1:443'}");
        let c = build(f.listener_settings(), &[], HostTable::default(), "").unwrap();
        assert_eq!(c.listen.port, 443);
        assert_eq!(c.listen.ipv4, Some(Ipv4Addr::UNSPECIFIED));
        assert_eq!(c.listen.ipv6, Some(Ipv6Addr::UNSPECIFIED));
        assert_eq!(c.listen.receive_buffer_bytes, 4_194_304);
        assert_eq!(c.listen.send_buffer_bytes, 4_194_304);
        assert!(!c.listen.force_buffers);
        assert!(c.upstream.tls);
        assert_eq!(c.upstream.verify, UpstreamVerify::ServedCertificate);
        assert_eq!(c.upstream.proxy_protocol, None);
        assert_eq!(c.upstream.forwarded_for, ClientForwardedFor::Replace);
        assert_eq!(c.alt_svc_max_age, 86_400);
        assert_eq!(c.alt_svc_probe_path.as_str(), "/");
        assert_eq!(c.metrics_address.port(), 9476);
        assert!(c.transport.stream_receive_window_bytes >= 1 << 20);
        assert!(c.transport.connection_receive_window_bytes >= 16 << 20);
        assert_eq!(c.transport.idle_timeout_seconds, 30);
        assert_eq!(c.http.max_field_section_size_bytes, 65_536);
        assert_eq!(c.http.drain_timeout_seconds, 30);
    }

    #[test]
    fn probe_path_is_an_absolute_printable_path_named_in_its_error() {
        let ok =
            file("upstream: {address: 'ingress:443'}\naltSvc: {probePath: '/healthz?probe=1'}");
        let c = build(ok.listener_settings(), &[], HostTable::default(), "").unwrap();
        assert_eq!(c.alt_svc_probe_path.as_str(), "/healthz?probe=1");
        let long = format!("/{}", "a".repeat(bounds::MAX_ALT_SVC_PROBE_PATH_BYTES));
        for bad in ["healthz", "/a b", "http://x/", long.as_str()] {
            let f = file(&format!(
                "upstream: {{address: 'ingress:443'}}\naltSvc: {{probePath: '{bad}'}}"
            ));
            let e = build(f.listener_settings(), &[], HostTable::default(), "spec").unwrap_err();
            assert_eq!(e.errors.len(), 1, "{bad}: {e}");
            assert_eq!(e.errors[0].path, "spec.altSvc.probePath", "{bad}");
        }
    }

    #[test]
    fn null_family_disables_it() {
        let f = file("upstream: {address: 'ingress:443'}\naddresses: {ipv6: null}");
        let c = build(f.listener_settings(), &[], HostTable::default(), "").unwrap();
        assert_eq!(c.listen.ipv4, Some(Ipv4Addr::UNSPECIFIED));
        assert_eq!(c.listen.ipv6, None);
        assert_eq!(c.upstream.address.host, "ingress");
    }

    #[test]
    fn both_families_null_is_an_error() {
        let f = file("upstream: {address: '127.0.0.1:443'}\naddresses: {ipv4: null, ipv6: null}");
        let m = messages(build(f.listener_settings(), &[], HostTable::default(), ""));
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("addresses: "), "{m:?}");
    }

    #[test]
    fn errors_name_the_field_and_the_value() {
        let f = file(
            "upstream: {address: foo}\naddresses: {ipv4: '::1', ipv6: '1.2.3.4'}\nmetrics: {address: nope}\nsocket: {receiveBufferBytes: 10}",
        );
        let m = messages(build(f.listener_settings(), &[], HostTable::default(), ""));
        for want in [
            "upstream.address: \"foo\" is not host:port (no port)",
            "addresses.ipv4: \"::1\" is not an IPv4 address",
            "addresses.ipv6: \"1.2.3.4\" is not an IPv6 address",
            "metrics.address: \"nope\" is not ip:port",
            "socket.receiveBufferBytes: 10 is outside 65536..=1073741824",
        ] {
            assert!(m.contains(&want.to_string()), "{want}: {m:?}");
        }
    }

    #[test]
    fn crd_paths_carry_the_spec_prefix() {
        let f = file("upstream: {address: 'x:0'}");
        let m = messages(build(
            f.listener_settings(),
            &[],
            HostTable::default(),
            "spec",
        ));
        assert!(m[0].starts_with("spec.upstream.address: \"x:0\""), "{m:?}");
    }

    #[test]
    fn mapped_ipv6_is_refused() {
        let f = file("upstream: {address: '127.0.0.1:443'}\naddresses: {ipv6: '::ffff:1.2.3.4'}");
        let m = messages(build(f.listener_settings(), &[], HostTable::default(), ""));
        assert!(m[0].contains("IPv4-mapped"), "{m:?}");
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(parse_host_port("127.0.0.1:443").unwrap().host, "127.0.0.1");
        assert_eq!(parse_host_port("[::1]:8443").unwrap().port, 8443);
        assert_eq!(
            parse_host_port("Ingress.Example:443").unwrap().host,
            "ingress.example"
        );
        assert!(parse_host_port("::1:443").is_err());
        assert!(parse_host_port("foo").is_err());
        assert!(parse_host_port("foo:99999").is_err());
        assert!(parse_host_port(":443").is_err());
        assert!(parse_host_port("bad_host!:443").is_err());
    }

    #[test]
    fn restart_changes_are_listed() {
        let a = file("upstream: {address: '127.0.0.1:443'}");
        let b = file("upstream: {address: '127.0.0.1:443'}\nport: 8443\nsocket: {receiveBufferBytes: 212992}");
        let ca = build(a.listener_settings(), &[], HostTable::default(), "").unwrap();
        let cb = build(b.listener_settings(), &[], HostTable::default(), "").unwrap();
        let changes = ca.restart_required_changes(&cb);
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(changes[0].starts_with("port 443 -> 8443"));
        assert!(ca.restart_required_changes(&ca.clone()).is_empty());
    }

    /// The range check follows each bound of `api::bounds`: its ends pass, one beyond fails
    /// with the bound's field and limits.
    #[test]
    fn every_bound_is_checked_at_both_ends() {
        // `advertise.*` is the operator's alone (no data-plane file field): its bounds are
        // checked by `operator::advertise::dns::listener` and its tests.
        for b in crate::api::bounds::ALL
            .iter()
            .filter(|b| !b.field.starts_with("advertise."))
        {
            let outside = |value: u64| -> Option<Vec<String>> {
                let mut v = serde_json::json!({"upstream": {"address": "127.0.0.1:443"}});
                let target = b.field.split('.').fold(&mut v, |v, name| &mut v[name]);
                *target = value.into();
                // A value the field's type cannot hold never reaches the check.
                let f: FileConfig = serde_json::from_value(v).ok()?;
                let errors = match build(f.listener_settings(), &[], HostTable::default(), "") {
                    Ok(_) => Vec::new(),
                    Err(e) => e.errors,
                };
                Some(
                    errors
                        .into_iter()
                        .filter(|e| e.path == b.field && e.message.contains("is outside"))
                        .map(|e| e.message)
                        .collect(),
                )
            };
            assert_eq!(outside(b.min), Some(vec![]), "{}", b.field);
            assert_eq!(outside(b.max), Some(vec![]), "{}", b.field);
            let want = |v: u64| vec![format!("{v} is outside {}..={}", b.min, b.max)];
            if b.min > 0 {
                assert_eq!(outside(b.min - 1), Some(want(b.min - 1)), "{}", b.field);
            }
            if let Some(errors) = outside(b.max + 1) {
                assert_eq!(errors, want(b.max + 1), "{}", b.field);
            }
        }
    }

    #[test]
    fn the_proxy_protocol_target_follows_the_client_address_settings() {
        let target = |upstream: &str| {
            let f = file(&format!("upstream: {upstream}"));
            build(f.listener_settings(), &[], HostTable::default(), "")
                .map(|c| c.upstream.proxy_protocol.map(|a| a.to_string()))
        };
        let main = "address: '127.0.0.1:443'";
        assert_eq!(target(&format!("{{{main}}}")), Ok(None));
        assert_eq!(
            target(&format!("{{{main}, proxyProtocol: true}}")),
            Ok(Some("127.0.0.1:443".into())),
            "the legacy switch: the main address"
        );
        assert_eq!(
            target(&format!(
                "{{{main}, clientAddress: {{via: ProxyProtocol}}}}"
            )),
            Ok(Some("127.0.0.1:443".into()))
        );
        assert_eq!(
            target(&format!(
                "{{{main}, clientAddress: {{via: ProxyProtocol, proxyProtocolAddress: 'ingress:8443'}}}}"
            )),
            Ok(Some("ingress:8443".into())),
            "a second port"
        );
        let f = file(&format!(
            "upstream: {{{main}, clientAddress: {{via: ProxyProtocol, clientForwardedFor: Append}}}}"
        ));
        let c = build(f.listener_settings(), &[], HostTable::default(), "").unwrap();
        assert_eq!(c.upstream.forwarded_for, ClientForwardedFor::Append);
    }

    #[test]
    fn client_address_errors_name_their_field() {
        let f = file(
            "upstream: {address: '127.0.0.1:443', proxyProtocol: true, clientAddress: {via: ProxyProtocol, proxyProtocolAddress: 'pp:99999'}}",
        );
        let m = messages(build(
            f.listener_settings(),
            &[],
            HostTable::default(),
            "spec",
        ));
        assert_eq!(
            m,
            [
                "spec.upstream.proxyProtocol: true sends PROXY protocol to upstream.address; with upstream.clientAddress.proxyProtocolAddress set, leave it false",
                "spec.upstream.clientAddress.proxyProtocolAddress: \"pp:99999\" is not host:port (port is not a number 1-65535)",
            ]
        );
        let f = file("upstream: {address: '127.0.0.1:443', clientAddress: {proxyProtocolAddress: 'pp:8443'}}");
        let m = messages(build(f.listener_settings(), &[], HostTable::default(), ""));
        assert_eq!(
            m,
            ["upstream.clientAddress.proxyProtocolAddress: \"pp:8443\" needs upstream.clientAddress.via: ProxyProtocol (it is ForwardedHeaders)"]
        );
        let e =
            file::parse("upstream: {address: 'a:1', clientAddress: {via: Headers}}").unwrap_err();
        assert_eq!(e.errors[0].path, "upstream.clientAddress.via");
        let e =
            file::parse("upstream: {address: 'a:1', clientAddress: {clientForwardedFor: append}}")
                .unwrap_err();
        assert_eq!(
            e.errors[0].path,
            "upstream.clientAddress.clientForwardedFor"
        );
    }

    #[test]
    fn window_relation_is_checked() {
        let f = file(
            "upstream: {address: '127.0.0.1:443'}\ntransport: {streamReceiveWindowBytes: 8388608, connectionReceiveWindowBytes: 4194304}",
        );
        let m = messages(build(f.listener_settings(), &[], HostTable::default(), ""));
        assert!(
            m[0].starts_with("transport.connectionReceiveWindowBytes: 4194304 is smaller"),
            "{m:?}"
        );
    }
}
