//! Listener settings shared by the standalone YAML file and the `Http3Listener` spec.
//!
//! The same structs are deserialised from a file (`h3-ingress proxy --config`) and from the
//! custom resource, and the fields that hold them are declared once ([`with_listener_settings`]
//! writes them into both `FileConfig` and the spec), so a field has one name, one default,
//! one bound and one meaning everywhere. Defaults
//! are serde defaults, which schemars copies into the CRD schema, so the API server applies the
//! very same values. No type here refuses unknown fields: the file parser refuses them itself
//! and the Kubernetes path reads past them ([`super::unknown`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::bounds;

pub const DEFAULT_PORT: u16 = 443;
pub const DEFAULT_IPV4: &str = "0.0.0.0";
pub const DEFAULT_IPV6: &str = "::";
/// Socket buffers QUIC servers want; the kernel doubles what it grants (see socket(7)).
pub const DEFAULT_BUFFER_BYTES: u32 = 4 * 1024 * 1024;
/// What QUIC stacks (quic-go, the nginx docs) recommend for net.core.rmem_max/wmem_max; the
/// kernel's 208 KB default drops datagrams on fast uploads (docs/field-reports.md, 002).
pub const RECOMMENDED_SYSCTL_BUFFER_MAX: u32 = 7_500_000;
pub const DEFAULT_ALT_SVC_MAX_AGE: u32 = 86_400;
/// Where the Alt-Svc prober sends its `HEAD` unless `altSvc.probePath` says otherwise.
pub const DEFAULT_ALT_SVC_PROBE_PATH: &str = "/";
/// Metrics and health port. Chosen to stay clear of the ports hostNetwork daemons commonly
/// hold on a node: node-exporter 9100, Prometheus 9090, ingress-nginx 10254, kubelet
/// 10248/10250/10255, kube-proxy 10249/10256, Calico 9091, Cilium 9962-9965. `[::]` is one
/// dual-stack socket, so the kubelet's probes reach it on an IPv6-only cluster too; it falls
/// back to `0.0.0.0` on a host without IPv6 (`config::bind`).
pub const DEFAULT_METRICS_ADDRESS: &str = "[::]:9476";

fn default_port() -> u16 {
    DEFAULT_PORT
}
fn default_true() -> bool {
    true
}
fn default_ipv4() -> Option<String> {
    Some(DEFAULT_IPV4.to_string())
}
fn default_ipv6() -> Option<String> {
    Some(DEFAULT_IPV6.to_string())
}
fn default_buffer() -> u32 {
    DEFAULT_BUFFER_BYTES
}
fn default_alt_svc_max_age() -> u32 {
    DEFAULT_ALT_SVC_MAX_AGE
}
fn default_alt_svc_probe_path() -> String {
    DEFAULT_ALT_SVC_PROBE_PATH.to_string()
}
fn default_metrics_address() -> String {
    DEFAULT_METRICS_ADDRESS.to_string()
}

/// The listener-wide settings, borrowed from either the CRD's spec or the standalone file:
/// what the data plane's validation (`config::build`) reads.
#[derive(Debug, Clone, Copy)]
pub struct ListenerSettings<'a> {
    pub port: u16,
    pub addresses: &'a Addresses,
    pub upstream: &'a Upstream,
    pub socket: &'a SocketSettings,
    pub transport: &'a TransportSettings,
    pub alt_svc: &'a AltSvcSettings,
    pub metrics: &'a MetricsSettings,
    pub http: &'a HttpSettings,
    pub address_validation: &'a AddressValidationSettings,
    pub limits: &'a LimitsSettings,
    pub access_log: &'a AccessLogSettings,
}

/// Declares a struct whose first fields are the listener-wide settings: the contract the
/// `Http3Listener` spec and the standalone file share, written here once (names, defaults,
/// bounds, the CRD's descriptions), then the struct's own fields; and its
/// `listener_settings()`, which borrows them as [`ListenerSettings`]. At the call site
/// `default_port`, `bounds` and the settings types must be in scope (serde and schemars
/// resolve their paths there).
macro_rules! with_listener_settings {
    ($(#[$meta:meta])* pub struct $name:ident { $($rest:tt)* }) => {
        $(#[$meta])*
        pub struct $name {
            /// UDP port the QUIC sockets bind on every node.
            #[serde(default = "default_port")]
            #[schemars(range(min = bounds::PORT.min, max = bounds::PORT.max))]
            pub port: u16,
            #[serde(default)]
            pub addresses: Addresses,
            pub upstream: Upstream,
            #[serde(default)]
            pub socket: SocketSettings,
            #[serde(default)]
            pub transport: TransportSettings,
            #[serde(default)]
            pub alt_svc: AltSvcSettings,
            #[serde(default)]
            pub metrics: MetricsSettings,
            #[serde(default)]
            pub http: HttpSettings,
            #[serde(default)]
            pub address_validation: AddressValidationSettings,
            #[serde(default)]
            pub limits: LimitsSettings,
            #[serde(default)]
            pub access_log: AccessLogSettings,
            $($rest)*
        }

        impl $name {
            /// Its listener-wide settings, borrowed.
            pub fn listener_settings(&self) -> $crate::api::ListenerSettings<'_> {
                $crate::api::ListenerSettings {
                    port: self.port,
                    addresses: &self.addresses,
                    upstream: &self.upstream,
                    socket: &self.socket,
                    transport: &self.transport,
                    alt_svc: &self.alt_svc,
                    metrics: &self.metrics,
                    http: &self.http,
                    address_validation: &self.address_validation,
                    limits: &self.limits,
                    access_log: &self.access_log,
                }
            }
        }
    };
}
pub(crate) use with_listener_settings;

/// Which local addresses get a UDP socket. One socket per family, never a dual-stack socket:
/// an AF_INET6 socket that also carries IPv4 cannot set Don't Fragment on its IPv4 datagrams,
/// so oversized QUIC packets get fragmented and networks that drop fragments lose them.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Addresses {
    /// IPv4 address of the AF_INET socket; `null` runs without IPv4.
    #[serde(default = "default_ipv4")]
    pub ipv4: Option<String>,
    /// IPv6 address of the AF_INET6 (IPV6_V6ONLY) socket; `null` runs without IPv6.
    #[serde(default = "default_ipv6")]
    pub ipv6: Option<String>,
}

impl Default for Addresses {
    fn default() -> Self {
        Self {
            ipv4: default_ipv4(),
            ipv6: default_ipv6(),
        }
    }
}

/// How the proxy checks the certificate of the TCP ingress it forwards to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum UpstreamVerify {
    /// The upstream must present exactly the certificate this proxy serves for the request's host.
    #[default]
    ServedCertificate,
    /// The upstream certificate must chain to the system trust store and match the host.
    System,
    /// No verification (lab use only).
    Insecure,
}

fn default_connect_timeout() -> u32 {
    5
}
fn default_response_timeout() -> u32 {
    60
}
pub const DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS: u32 = 60;
fn default_response_body_idle_timeout() -> u32 {
    DEFAULT_RESPONSE_BODY_IDLE_TIMEOUT_SECONDS
}
/// At or below the stream limits the ingresses announce by default (nginx and the
/// controllers built on it 128, HAProxy 100).
pub const DEFAULT_MAX_STREAMS_PER_CONNECTION: u32 = 100;
fn default_max_streams_per_connection() -> u32 {
    DEFAULT_MAX_STREAMS_PER_CONNECTION
}
/// Covers how far apart the TCP ingress and the data plane pick up a renewed Secret (each
/// watches it; both normally within seconds) with room for an ingress that reloads slowly.
pub const DEFAULT_SERVED_CERTIFICATE_GRACE_SECONDS: u32 = 300;
fn default_served_certificate_grace() -> u32 {
    DEFAULT_SERVED_CERTIFICATE_GRACE_SECONDS
}

/// How the TCP ingress is told the client's address.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClientAddressVia {
    /// `X-Forwarded-For`, `Forwarded` and `X-Real-IP` on every request (the TCP ingress must
    /// trust them from this proxy's address: nginx `set_real_ip_from` + `real_ip_header`,
    /// ingress-nginx `use-forwarded-headers`, Traefik `forwardedHeaders.trustedIPs`).
    #[default]
    ForwardedHeaders,
    /// A PROXY protocol v2 header opening each upstream connection (one set of upstream
    /// connections per client connection), to `proxyProtocolAddress`.
    ProxyProtocol,
}

impl ClientAddressVia {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientAddressVia::ForwardedHeaders => "ForwardedHeaders",
            ClientAddressVia::ProxyProtocol => "ProxyProtocol",
        }
    }
}

/// What becomes of an `X-Forwarded-For` (and `Forwarded`) the client sent itself.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClientForwardedFor {
    /// Ours only: the client's address alone. The default, because an ingress that trusts
    /// every hop (ingress-nginx's `proxy-real-ip-cidr` is `0.0.0.0/0` by default, with
    /// `real_ip_recursive on`) would otherwise take an address the client wrote itself.
    #[default]
    Replace,
    /// The client's list with its address appended: safe only where the ingress trusts
    /// exactly this proxy's addresses (or takes the rightmost entry).
    Append,
}

impl ClientForwardedFor {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientForwardedFor::Replace => "Replace",
            ClientForwardedFor::Append => "Append",
        }
    }
}

/// How the client's address reaches the TCP ingress, and whether the ingress trusts it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.via == 'ProxyProtocol' || self.proxyProtocolAddress == ''",
    "message": "upstream.clientAddress.proxyProtocolAddress needs via: ProxyProtocol"
}]))]
pub struct ClientAddress {
    /// `ForwardedHeaders` (default) or `ProxyProtocol`.
    #[serde(default)]
    pub via: ClientAddressVia,
    /// With `ProxyProtocol`: `host:port` of a second port of the TCP ingress that only this
    /// proxy uses and that expects PROXY protocol (an nginx `listen ... proxy_protocol`, a
    /// Traefik entryPoint with `proxyProtocol.trustedIPs`), so direct TCP clients are
    /// untouched. Empty: `upstream.address`.
    #[serde(default)]
    pub proxy_protocol_address: String,
    /// The TCP ingress takes the client's address from what this proxy sends (it trusts
    /// this proxy's addresses for it). A declaration the operator relies on: hosts whose
    /// TCP-side rules depend on the client's address are served over HTTP/3 only when it is
    /// true or `via` is `ProxyProtocol`.
    #[serde(default)]
    pub trusted: bool,
    /// `Replace` (default) or `Append`: what happens to a client's own `X-Forwarded-For`.
    #[serde(default)]
    pub client_forwarded_for: ClientForwardedFor,
}

/// The existing TCP ingress every request is forwarded to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
// The API server checks these after defaulting, as `config::build` does for the file.
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.tls || self.verify == 'servedCertificate'",
    "message": "upstream.verify needs upstream.tls: true"
}, {
    "rule": "!self.proxyProtocol || !has(self.clientAddress) || self.clientAddress.proxyProtocolAddress == ''",
    "message": "upstream.proxyProtocol sends PROXY to upstream.address; with upstream.clientAddress.proxyProtocolAddress leave it false"
}]))]
pub struct Upstream {
    /// `host:port` of the TCP ingress, for example `127.0.0.1:443`.
    pub address: String,
    /// Speak TLS to the upstream, with SNI set to the request's host.
    #[serde(default = "default_true")]
    pub tls: bool,
    /// How the upstream's certificate is verified.
    #[serde(default)]
    pub verify: UpstreamVerify,
    /// Send a PROXY protocol v2 header on a per-client upstream connection to `address`:
    /// the same as `clientAddress.via: ProxyProtocol` without a `proxyProtocolAddress`.
    /// Discouraged for nginx-based ingresses, which switch PROXY protocol on for every
    /// client of the port; give them a second port with `clientAddress` instead.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// How the TCP ingress learns the client's address.
    #[serde(default)]
    pub client_address: ClientAddress,
    /// Requests one connection to the upstream carries at once; further requests open
    /// another connection. At most the upstream's HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS, or
    /// requests past it wait for other requests to end.
    #[serde(default = "default_max_streams_per_connection")]
    #[schemars(range(min = bounds::MAX_STREAMS_PER_CONNECTION.min, max = bounds::MAX_STREAMS_PER_CONNECTION.max))]
    pub max_streams_per_connection: u32,
    /// Seconds to wait for the TCP (and TLS) connection to the upstream.
    #[serde(default = "default_connect_timeout")]
    #[schemars(range(min = bounds::CONNECT_TIMEOUT_SECONDS.min, max = bounds::CONNECT_TIMEOUT_SECONDS.max))]
    pub connect_timeout_seconds: u32,
    /// Seconds to wait for the upstream's response headers, counted from the end of the
    /// request body (an upload may take longer); answered with 504 when exceeded.
    #[serde(default = "default_response_timeout")]
    #[schemars(range(min = bounds::RESPONSE_TIMEOUT_SECONDS.min, max = bounds::RESPONSE_TIMEOUT_SECONDS.max))]
    pub response_timeout_seconds: u32,
    /// Seconds the upstream may send no response body bytes before the client's stream is
    /// reset and the upstream request dropped.
    #[serde(default = "default_response_body_idle_timeout")]
    #[schemars(range(min = bounds::RESPONSE_BODY_IDLE_TIMEOUT_SECONDS.min, max = bounds::RESPONSE_BODY_IDLE_TIMEOUT_SECONDS.max))]
    pub response_body_idle_timeout_seconds: u32,
    /// With `verify: servedCertificate`, while a host's certificate is being renewed: for this
    /// many seconds after this proxy switched to a new certificate the upstream may still
    /// present the one it replaced, and for this many seconds after the upstream first presents
    /// a renewed certificate (the same names from the same issuer, issued after ours) that
    /// this proxy has not loaded yet, the upstream is accepted with it. 0: only the exact
    /// certificate this proxy serves.
    #[serde(default = "default_served_certificate_grace")]
    #[schemars(range(min = bounds::SERVED_CERTIFICATE_GRACE_SECONDS.min, max = bounds::SERVED_CERTIFICATE_GRACE_SECONDS.max))]
    pub served_certificate_grace_seconds: u32,
}

/// UDP socket buffers. The usual kernel default of 208 KB drops datagrams on fast uploads.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SocketSettings {
    /// Requested SO_RCVBUF in bytes; the effective size is read back and exported.
    #[serde(default = "default_buffer")]
    #[schemars(range(min = bounds::RECEIVE_BUFFER_BYTES.min, max = bounds::RECEIVE_BUFFER_BYTES.max))]
    pub receive_buffer_bytes: u32,
    /// Requested SO_SNDBUF in bytes.
    #[serde(default = "default_buffer")]
    #[schemars(range(min = bounds::SEND_BUFFER_BYTES.min, max = bounds::SEND_BUFFER_BYTES.max))]
    pub send_buffer_bytes: u32,
    /// Use SO_RCVBUFFORCE/SO_SNDBUFFORCE to exceed net.core.rmem_max/wmem_max (needs CAP_NET_ADMIN).
    #[serde(default)]
    pub force_buffers: bool,
}

impl Default for SocketSettings {
    fn default() -> Self {
        Self {
            receive_buffer_bytes: DEFAULT_BUFFER_BYTES,
            send_buffer_bytes: DEFAULT_BUFFER_BYTES,
            force_buffers: false,
        }
    }
}

/// Congestion controller of the QUIC connections.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CongestionControl {
    /// CUBIC that forgives one loss of the handshake flight, which would otherwise leave the
    /// congestion window small for the whole connection.
    #[serde(rename = "cubic-hs")]
    CubicHs,
    /// The default: cubic-hs that also does not read random loss (no queueing delay, at most
    /// 5 % of recent packets) as congestion while its delivery rate still grows; once the pipe
    /// is full every loss counts, as for TCP. As fast as cubic-hs on clean paths, several times
    /// faster with random loss (lossy radio links), and a TCP-like share beside TCP CUBIC.
    #[default]
    #[serde(rename = "cubic-hs-lt")]
    CubicHsLt,
    /// quinn's stock CUBIC.
    #[serde(rename = "cubic")]
    Cubic,
    /// quinn's NewReno.
    #[serde(rename = "newreno")]
    NewReno,
    /// quinn's (experimental) BBR.
    #[serde(rename = "bbr")]
    Bbr,
}

impl CongestionControl {
    pub fn as_str(self) -> &'static str {
        match self {
            CongestionControl::CubicHs => "cubic-hs",
            CongestionControl::CubicHsLt => "cubic-hs-lt",
            CongestionControl::Cubic => "cubic",
            CongestionControl::NewReno => "newreno",
            CongestionControl::Bbr => "bbr",
        }
    }
}

pub const DEFAULT_STREAM_RECEIVE_WINDOW: u64 = 2 * 1024 * 1024;
pub const DEFAULT_CONNECTION_RECEIVE_WINDOW: u64 = 16 * 1024 * 1024;
pub const DEFAULT_SEND_WINDOW: u64 = 16 * 1024 * 1024;
/// 32 packets (38 KB at the 1200-byte initial MTU), paced over the first round trip: the
/// initial window Google's QUIC shipped for years. RFC 9002's 10 leaves HTTP/3 no faster
/// than HTTP/2 on long paths (lab S1, 200 ms, 1 MB: 0.98x h2 with 10, 0.79x with 32).
pub const DEFAULT_INITIAL_WINDOW_PACKETS: u32 = 32;
pub const DEFAULT_IDLE_TIMEOUT_SECONDS: u32 = 30;
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;
/// A handshake takes one or two round trips; ten seconds covers the slowest real path (and a
/// lost flight or two) while a client that never finishes holds its state no longer.
pub const DEFAULT_HANDSHAKE_TIMEOUT_SECONDS: u32 = 10;

fn default_stream_window() -> u64 {
    DEFAULT_STREAM_RECEIVE_WINDOW
}
fn default_connection_window() -> u64 {
    DEFAULT_CONNECTION_RECEIVE_WINDOW
}
fn default_send_window() -> u64 {
    DEFAULT_SEND_WINDOW
}
fn default_initial_window_packets() -> u32 {
    DEFAULT_INITIAL_WINDOW_PACKETS
}
fn default_idle_timeout() -> u32 {
    DEFAULT_IDLE_TIMEOUT_SECONDS
}
fn default_max_streams() -> u32 {
    DEFAULT_MAX_CONCURRENT_STREAMS
}
fn default_handshake_timeout() -> u32 {
    DEFAULT_HANDSHAKE_TIMEOUT_SECONDS
}

/// QUIC transport parameters. The default windows allow megabytes in flight per stream; a
/// 64 KB window would cap a download at 64 KB per round trip (1.3 MB/s at 50 ms).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.connectionReceiveWindowBytes >= self.streamReceiveWindowBytes",
    "message": "transport.connectionReceiveWindowBytes must not be smaller than transport.streamReceiveWindowBytes"
}]))]
pub struct TransportSettings {
    /// Congestion controller: `cubic-hs-lt` (default), `cubic-hs`, `cubic`, `newreno` or `bbr`.
    #[serde(default)]
    pub congestion_control: CongestionControl,
    /// Initial congestion window in packets of the initial MTU (1200 bytes), paced. Default 32;
    /// RFC 9002 suggests 10.
    #[serde(default = "default_initial_window_packets")]
    #[schemars(range(min = bounds::INITIAL_WINDOW_PACKETS.min, max = bounds::INITIAL_WINDOW_PACKETS.max))]
    pub initial_window_packets: u32,
    /// How much a client may send on one stream before we read it (at least 1 MiB).
    #[serde(default = "default_stream_window")]
    #[schemars(range(min = bounds::STREAM_RECEIVE_WINDOW_BYTES.min, max = bounds::STREAM_RECEIVE_WINDOW_BYTES.max))]
    pub stream_receive_window_bytes: u64,
    /// How much a client may send on all streams of a connection.
    #[serde(default = "default_connection_window")]
    #[schemars(range(min = bounds::CONNECTION_RECEIVE_WINDOW_BYTES.min, max = bounds::CONNECTION_RECEIVE_WINDOW_BYTES.max))]
    pub connection_receive_window_bytes: u64,
    /// How much unacknowledged data we buffer per connection for sending.
    #[serde(default = "default_send_window")]
    #[schemars(range(min = bounds::SEND_WINDOW_BYTES.min, max = bounds::SEND_WINDOW_BYTES.max))]
    pub send_window_bytes: u64,
    /// Upper bound for path-MTU discovery (UDP payload bytes). Absent: derived from the
    /// largest interface MTU of the host minus IP and UDP headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = bounds::MAX_UDP_PAYLOAD_BYTES.min, max = bounds::MAX_UDP_PAYLOAD_BYTES.max))]
    pub max_udp_payload_bytes: Option<u16>,
    /// Close a connection after this many seconds with no request in flight (GOAWAY, then
    /// CONNECTION_CLOSE "idle timeout"); while a request waits, PINGs every third of it keep
    /// the connection open for clients that send none.
    #[serde(default = "default_idle_timeout")]
    #[schemars(range(min = bounds::IDLE_TIMEOUT_SECONDS.min, max = bounds::IDLE_TIMEOUT_SECONDS.max))]
    pub idle_timeout_seconds: u32,
    /// Concurrent request streams a client may open.
    #[serde(default = "default_max_streams")]
    #[schemars(range(min = bounds::MAX_CONCURRENT_STREAMS.min, max = bounds::MAX_CONCURRENT_STREAMS.max))]
    pub max_concurrent_streams: u32,
    /// Close a connection whose handshake has not completed after this many seconds.
    #[serde(default = "default_handshake_timeout")]
    #[schemars(range(min = bounds::HANDSHAKE_TIMEOUT_SECONDS.min, max = bounds::HANDSHAKE_TIMEOUT_SECONDS.max))]
    pub handshake_timeout_seconds: u32,
}

impl Default for TransportSettings {
    fn default() -> Self {
        Self {
            congestion_control: CongestionControl::default(),
            initial_window_packets: DEFAULT_INITIAL_WINDOW_PACKETS,
            stream_receive_window_bytes: DEFAULT_STREAM_RECEIVE_WINDOW,
            connection_receive_window_bytes: DEFAULT_CONNECTION_RECEIVE_WINDOW,
            send_window_bytes: DEFAULT_SEND_WINDOW,
            max_udp_payload_bytes: None,
            idle_timeout_seconds: DEFAULT_IDLE_TIMEOUT_SECONDS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            handshake_timeout_seconds: DEFAULT_HANDSHAKE_TIMEOUT_SECONDS,
        }
    }
}

/// The `Alt-Svc` header added to h3 responses that lack one, and the probe that asks the
/// TCP ingress whether it sends one.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AltSvcSettings {
    /// `ma=` of the advertised `h3` alternative, in seconds.
    #[serde(default = "default_alt_svc_max_age")]
    pub max_age_seconds: u32,
    /// Path (and query) of the `HEAD` request one data-plane pod per listener sends each host
    /// through the TCP ingress, at most every 5 minutes, with the user agent
    /// `h3-ingress-alt-svc-probe/VERSION`: point it at a cheap page where `/` is an
    /// application's login redirect or an expensive render.
    #[serde(default = "default_alt_svc_probe_path")]
    #[schemars(length(min = 1, max = bounds::MAX_ALT_SVC_PROBE_PATH_BYTES), regex(pattern = r"^/[!-~]*$"))]
    pub probe_path: String,
}

impl Default for AltSvcSettings {
    fn default() -> Self {
        Self {
            max_age_seconds: DEFAULT_ALT_SVC_MAX_AGE,
            probe_path: default_alt_svc_probe_path(),
        }
    }
}

/// The access log of the HTTP/3 side.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AccessLogSettings {
    /// One JSON line per request on standard output. Off by default.
    #[serde(default)]
    pub enabled: bool,
}

/// Prometheus metrics, `/healthz`, `/readyz` and `/status`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MetricsSettings {
    /// `ip:port` of the metrics and health endpoint.
    #[serde(default = "default_metrics_address")]
    pub address: String,
    /// Whether per-host series (`requests_total`, `certificate_expiry_timestamp_seconds`,
    /// `alt_svc_advertised`) carry a `host` label. `false` drops the label altogether: requests
    /// are counted per status class and family only, and the per-host gauges are left out,
    /// for Prometheus servers that cannot afford a few series per host.
    #[serde(default = "default_true")]
    pub host_label: bool,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self {
            address: default_metrics_address(),
            host_label: true,
        }
    }
}

pub const DEFAULT_MAX_FIELD_SECTION_SIZE: u32 = 64 * 1024;
pub const DEFAULT_DRAIN_TIMEOUT_SECONDS: u32 = 30;
pub const DEFAULT_REQUEST_HEADERS_TIMEOUT_SECONDS: u32 = 10;
pub const DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS: u32 = 30;
pub const DEFAULT_MAX_CONTROL_FRAME_BYTES: u32 = 16 * 1024;

fn default_field_section() -> u32 {
    DEFAULT_MAX_FIELD_SECTION_SIZE
}
fn default_drain() -> u32 {
    DEFAULT_DRAIN_TIMEOUT_SECONDS
}
fn default_headers_timeout() -> u32 {
    DEFAULT_REQUEST_HEADERS_TIMEOUT_SECONDS
}
fn default_body_idle_timeout() -> u32 {
    DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS
}
fn default_control_frame() -> u32 {
    DEFAULT_MAX_CONTROL_FRAME_BYTES
}

/// HTTP/3 request handling.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HttpSettings {
    /// SETTINGS_MAX_FIELD_SECTION_SIZE advertised to clients and enforced on requests. A
    /// HEADERS frame longer than this is refused before it is read (H3_EXCESSIVE_LOAD).
    #[serde(default = "default_field_section")]
    #[schemars(range(min = bounds::MAX_FIELD_SECTION_SIZE_BYTES.min, max = bounds::MAX_FIELD_SECTION_SIZE_BYTES.max))]
    pub max_field_section_size_bytes: u32,
    /// On SIGTERM, in-flight requests get this long to finish before connections close.
    #[serde(default = "default_drain")]
    #[schemars(range(min = bounds::DRAIN_TIMEOUT_SECONDS.min, max = bounds::DRAIN_TIMEOUT_SECONDS.max))]
    pub drain_timeout_seconds: u32,
    /// A request stream must deliver its complete header section within this many seconds
    /// of opening, else it is reset with H3_REQUEST_REJECTED.
    #[serde(default = "default_headers_timeout")]
    #[schemars(range(min = bounds::REQUEST_HEADERS_TIMEOUT_SECONDS.min, max = bounds::REQUEST_HEADERS_TIMEOUT_SECONDS.max))]
    pub request_headers_timeout_seconds: u32,
    /// A request body that makes no progress for this many seconds is cut: 408 when no
    /// response has started, else the stream is reset.
    #[serde(default = "default_body_idle_timeout")]
    #[schemars(range(min = bounds::REQUEST_BODY_IDLE_TIMEOUT_SECONDS.min, max = bounds::REQUEST_BODY_IDLE_TIMEOUT_SECONDS.max))]
    pub request_body_idle_timeout_seconds: u32,
    /// Longest frame other than DATA and HEADERS (SETTINGS, GOAWAY, ...) read from a client;
    /// a longer one on the control stream closes the connection with H3_EXCESSIVE_LOAD.
    #[serde(default = "default_control_frame")]
    #[schemars(range(min = bounds::MAX_CONTROL_FRAME_BYTES.min, max = bounds::MAX_CONTROL_FRAME_BYTES.max))]
    pub max_control_frame_bytes: u32,
    /// After this many seconds (minus up to 10 % jitter) a connection gets GOAWAY; its
    /// requests in flight get `drainTimeoutSeconds` to finish, then it closes. 0: no limit.
    #[serde(default)]
    #[schemars(range(min = bounds::MAX_CONNECTION_AGE_SECONDS.min, max = bounds::MAX_CONNECTION_AGE_SECONDS.max))]
    pub max_connection_age_seconds: u32,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            max_field_section_size_bytes: DEFAULT_MAX_FIELD_SECTION_SIZE,
            drain_timeout_seconds: DEFAULT_DRAIN_TIMEOUT_SECONDS,
            max_connection_age_seconds: 0,
            request_headers_timeout_seconds: DEFAULT_REQUEST_HEADERS_TIMEOUT_SECONDS,
            request_body_idle_timeout_seconds: DEFAULT_REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
            max_control_frame_bytes: DEFAULT_MAX_CONTROL_FRAME_BYTES,
        }
    }
}

pub const DEFAULT_BUFFERED_REQUEST_BYTES: u64 = 64 * 1024 * 1024;
pub const DEFAULT_BUFFERED_REQUEST_BYTES_PER_CONNECTION: u64 = 4 * 1024 * 1024;
/// One maximal header section (64 KiB) plus one read-ahead body (64 KiB).
pub const DEFAULT_BUFFERED_REQUEST_BYTES_PER_STREAM: u64 = 128 * 1024;

fn default_buffered() -> u64 {
    DEFAULT_BUFFERED_REQUEST_BYTES
}
fn default_buffered_per_connection() -> u64 {
    DEFAULT_BUFFERED_REQUEST_BYTES_PER_CONNECTION
}
fn default_buffered_per_stream() -> u64 {
    DEFAULT_BUFFERED_REQUEST_BYTES_PER_STREAM
}

/// Resource limits that protect the process from hostile clients.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.bufferedRequestBytesPerConnection <= self.bufferedRequestBytes && self.bufferedRequestBytesPerStream <= self.bufferedRequestBytesPerConnection",
    "message": "limits: bufferedRequestBytesPerStream <= bufferedRequestBytesPerConnection <= bufferedRequestBytes"
}]))]
pub struct LimitsSettings {
    /// Bytes of request data (header sections, read-ahead bodies) the whole process may hold;
    /// when exhausted, new requests get 503 and their stream is refused.
    #[serde(default = "default_buffered")]
    #[schemars(range(min = bounds::BUFFERED_REQUEST_BYTES.min, max = bounds::BUFFERED_REQUEST_BYTES.max))]
    pub buffered_request_bytes: u64,
    /// The share of one QUIC connection.
    #[serde(default = "default_buffered_per_connection")]
    #[schemars(range(min = bounds::BUFFERED_REQUEST_BYTES_PER_CONNECTION.min, max = bounds::BUFFERED_REQUEST_BYTES_PER_CONNECTION.max))]
    pub buffered_request_bytes_per_connection: u64,
    /// The share of one request; at least `http.maxFieldSectionSizeBytes`.
    #[serde(default = "default_buffered_per_stream")]
    #[schemars(range(min = bounds::BUFFERED_REQUEST_BYTES_PER_STREAM.min, max = bounds::BUFFERED_REQUEST_BYTES_PER_STREAM.max))]
    pub buffered_request_bytes_per_stream: u64,
    // Connections: an attempt above one of these caps is refused at once (CONNECTION_REFUSED)
    // instead of queued; one from an address not yet validated gets a Retry instead, so a
    // spoofer cannot get someone else's address refused (unless addressValidation.mode is
    // never).
    /// Handshakes in progress, all sources together.
    #[serde(default = "default_half_open")]
    #[schemars(range(min = bounds::HALF_OPEN_CONNECTIONS.min, max = bounds::HALF_OPEN_CONNECTIONS.max))]
    pub half_open_connections: u32,
    /// Handshakes in progress from one source (an IPv4 address or IPv6 prefix).
    #[serde(default = "default_half_open_per_source")]
    #[schemars(range(min = bounds::HALF_OPEN_CONNECTIONS_PER_SOURCE.min, max = bounds::HALF_OPEN_CONNECTIONS_PER_SOURCE.max))]
    pub half_open_connections_per_source: u32,
    /// Connections (established and in handshake), all sources together.
    #[serde(default = "default_connections")]
    #[schemars(range(min = bounds::CONNECTIONS.min, max = bounds::CONNECTIONS.max))]
    pub connections: u32,
    /// Connections from one source.
    #[serde(default = "default_connections_per_source")]
    #[schemars(range(min = bounds::CONNECTIONS_PER_SOURCE.min, max = bounds::CONNECTIONS_PER_SOURCE.max))]
    pub connections_per_source: u32,
    /// Handshakes started per second (a token bucket holding one second's worth).
    #[serde(default = "default_handshakes_per_second")]
    #[schemars(range(min = bounds::HANDSHAKES_PER_SECOND.min, max = bounds::HANDSHAKES_PER_SECOND.max))]
    pub handshakes_per_second: u32,
    /// An IPv4 source is its address masked to this many bits.
    #[serde(default = "default_prefix_ipv4")]
    #[schemars(range(min = bounds::SOURCE_PREFIX_LENGTH_IPV4.min, max = bounds::SOURCE_PREFIX_LENGTH_IPV4.max))]
    pub source_prefix_length_ipv4: u8,
    /// An IPv6 source is its address masked to this many bits.
    #[serde(default = "default_prefix_ipv6")]
    #[schemars(range(min = bounds::SOURCE_PREFIX_LENGTH_IPV6.min, max = bounds::SOURCE_PREFIX_LENGTH_IPV6.max))]
    pub source_prefix_length_ipv6: u8,
}

impl Default for LimitsSettings {
    fn default() -> Self {
        Self {
            buffered_request_bytes: DEFAULT_BUFFERED_REQUEST_BYTES,
            buffered_request_bytes_per_connection: DEFAULT_BUFFERED_REQUEST_BYTES_PER_CONNECTION,
            buffered_request_bytes_per_stream: DEFAULT_BUFFERED_REQUEST_BYTES_PER_STREAM,
            half_open_connections: DEFAULT_HALF_OPEN_CONNECTIONS,
            half_open_connections_per_source: DEFAULT_HALF_OPEN_CONNECTIONS_PER_SOURCE,
            connections: DEFAULT_CONNECTIONS,
            connections_per_source: DEFAULT_CONNECTIONS_PER_SOURCE,
            handshakes_per_second: DEFAULT_HANDSHAKES_PER_SECOND,
            source_prefix_length_ipv4: DEFAULT_SOURCE_PREFIX_LENGTH_IPV4,
            source_prefix_length_ipv6: DEFAULT_SOURCE_PREFIX_LENGTH_IPV6,
        }
    }
}

/// When a connection attempt must first prove it owns its source address (a QUIC Retry,
/// one extra round trip) before the proxy spends a handshake on it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub enum AddressValidationMode {
    /// Retry unvalidated addresses while more than `halfOpenThreshold` handshakes are in
    /// progress: no extra round trip normally, no state for spoofed sources under a flood.
    #[default]
    Auto,
    /// Retry every unvalidated address.
    Always,
    /// Never Retry; the `limits` still refuse attempts above their caps.
    Never,
}

impl AddressValidationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AddressValidationMode::Auto => "auto",
            AddressValidationMode::Always => "always",
            AddressValidationMode::Never => "never",
        }
    }
}

/// picoquic's default; quic-go uses 128. Below it a handshake costs no extra round trip.
pub const DEFAULT_HALF_OPEN_THRESHOLD: u32 = 64;

fn default_half_open_threshold() -> u32 {
    DEFAULT_HALF_OPEN_THRESHOLD
}

/// Address validation (QUIC Retry) of new connections.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AddressValidationSettings {
    /// `auto` (default), `always` or `never`.
    #[serde(default)]
    pub mode: AddressValidationMode,
    /// In `auto` mode, unvalidated addresses get a Retry while at least this many handshakes
    /// are in progress. Must be below `limits.halfOpenConnections`.
    #[serde(default = "default_half_open_threshold")]
    #[schemars(range(min = bounds::HALF_OPEN_THRESHOLD.min, max = bounds::HALF_OPEN_THRESHOLD.max))]
    pub half_open_threshold: u32,
}

impl Default for AddressValidationSettings {
    fn default() -> Self {
        Self {
            mode: AddressValidationMode::default(),
            half_open_threshold: DEFAULT_HALF_OPEN_THRESHOLD,
        }
    }
}

pub const DEFAULT_HALF_OPEN_CONNECTIONS: u32 = 1000;
pub const DEFAULT_HALF_OPEN_CONNECTIONS_PER_SOURCE: u32 = 32;
/// An idle connection holds about 60 KB (1000 held from one client took the proxy from 14 to
/// 71 MB RSS); 4096 of them fit the operator's default memory limit, which counts them.
pub const DEFAULT_CONNECTIONS: u32 = 4096;
/// Generous for carrier-grade NAT, where thousands of users share one IPv4 address.
pub const DEFAULT_CONNECTIONS_PER_SOURCE: u32 = 1000;
pub const DEFAULT_HANDSHAKES_PER_SECOND: u32 = 500;
pub const DEFAULT_SOURCE_PREFIX_LENGTH_IPV4: u8 = 32;
/// One subscriber usually gets a whole /64 (or more), so a /128 cap would be no cap.
pub const DEFAULT_SOURCE_PREFIX_LENGTH_IPV6: u8 = 64;

fn default_half_open() -> u32 {
    DEFAULT_HALF_OPEN_CONNECTIONS
}
fn default_half_open_per_source() -> u32 {
    DEFAULT_HALF_OPEN_CONNECTIONS_PER_SOURCE
}
fn default_connections() -> u32 {
    DEFAULT_CONNECTIONS
}
fn default_connections_per_source() -> u32 {
    DEFAULT_CONNECTIONS_PER_SOURCE
}
fn default_handshakes_per_second() -> u32 {
    DEFAULT_HANDSHAKES_PER_SECOND
}
fn default_prefix_ipv4() -> u8 {
    DEFAULT_SOURCE_PREFIX_LENGTH_IPV4
}
fn default_prefix_ipv6() -> u8 {
    DEFAULT_SOURCE_PREFIX_LENGTH_IPV6
}

/// Where the proxy's QUIC keys come from (standalone file only; in Kubernetes the operator
/// mounts a per-listener Secret and passes `--keys-file`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct KeysSettings {
    /// File with at least 32 secret bytes from which the stateless-reset, connection-ID and
    /// Retry-token keys are derived; created with 64 random bytes (mode 0600) if missing.
    /// Every process of one listener should read the same file. Unset: random keys per process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// A host served from certificate files (standalone mode).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileHost {
    /// Host name (SNI and `:authority`), e.g. `a.example.com` or `*.example.com`.
    pub name: String,
    /// PEM certificate chain, leaf first.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: String,
}

with_listener_settings! {
    /// The standalone configuration file of `h3-ingress proxy --config FILE`.
    #[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
    #[serde(rename_all = "camelCase")]
    pub struct FileConfig {
        #[serde(default)]
        pub keys: KeysSettings,
        #[serde(default)]
        pub hosts: Vec<FileHost>,
    }
}
