//! What a data plane pod reports on `/status` (JSON) and the operator aggregates into the
//! `Http3Listener` status. Plain data, shared by both sides.

use serde::{Deserialize, Serialize};

/// One UDP socket as bound and configured, read back from the kernel.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SocketReport {
    /// `ipv4` or `ipv6`.
    pub family: String,
    /// Local address the socket is bound to.
    pub address: String,
    pub bound: bool,
    /// Why binding failed, when it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    pub receive_buffer_requested_bytes: u64,
    /// SO_RCVBUF as read back (the kernel reports double the usable size).
    pub receive_buffer_effective_bytes: u64,
    pub send_buffer_requested_bytes: u64,
    pub send_buffer_effective_bytes: u64,
    /// True when the kernel granted less than requested (net.core.rmem_max/wmem_max too low).
    pub clamped: bool,
    /// Segments per sendmsg the kernel accepts (1 = no GSO).
    pub gso_segments: u64,
    /// Datagrams the kernel dropped on this socket (/proc/net/udp `drops`).
    pub drops: u64,
}

/// One host as the data plane sees it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HostReport {
    pub name: String,
    /// `Serving` or `NotServing` (see `api::host_states`).
    pub state: String,
    /// A constant from `api::reasons`.
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The Ingress, or the HTTPRoute and Gateway listener, that asked for the host
    /// (Kubernetes mode).
    #[serde(flatten)]
    pub origin: super::HostOrigin,
    /// `namespace/name` of the Secret, or the certificate file (standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Where the host comes from, as people read it (`Ingress shop/web`): a certificate
    /// mirror's `hosts.json` (Kubernetes mode).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The certificate mirror the host is served from (Kubernetes mode).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mirror: String,
    /// Result of probing the TCP ingress for `Alt-Svc: h3=":PORT"`; None until probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alt_svc_advertised: Option<bool>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub alt_svc_message: String,
    /// Whether the certificate chains to a public web root (Chrome uses HTTP/3 only then);
    /// None where not judged. The operator's view of a served host sets it, except when the
    /// Secret lacks the leaf's intermediate (then it cannot be told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_roots: Option<bool>,
    /// HTTP/3 requests served for this host since start.
    #[serde(default)]
    pub requests: u64,
    /// HTTP/3 requests served for this host in the last five minutes.
    #[serde(default)]
    pub requests_last5m: u64,
}

/// At most this many failures are listed in a [`MirrorReport`]; the rest are only counted,
/// so a report stays small whatever the number of hosts.
pub const MAX_REPORTED_FAILURES: usize = 20;

/// A certificate mirror the pod could not serve from, or one host of it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MirrorFailure {
    /// The mirror Secret's name.
    #[serde(default)]
    pub mirror: String,
    /// `namespace/name` of the Secret it copies.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// The host, when only one host of the mirror failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A constant from `api::reasons`.
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Kubernetes mode: what a pod applied of its listener's certificate mirrors (see
/// `api::mirror`). Sized by [`MAX_REPORTED_FAILURES`], not by the number of hosts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MirrorReport {
    /// Whether the first list of the mirrors is complete and applied.
    #[serde(default)]
    pub synced: bool,
    /// Mirrors in the applied configuration.
    #[serde(default)]
    pub count: u64,
    /// `api::mirror::digest` of the applied mirrors' names and resource versions.
    #[serde(default)]
    pub digest: String,
    #[serde(default)]
    pub failed: Vec<MirrorFailure>,
    /// All failures, listed or not.
    #[serde(default)]
    pub failed_count: u64,
}

/// How this process shares its UDP port with other generations on the host (rollouts,
/// restarts), from `/status`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// `newest` (takes new connections), `superseded` (a newer generation does; this one
    /// drains) or `pending` (not ready yet).
    pub role: String,
    /// The slot in the port's socket group and in every connection ID; none while waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Join order among the processes that shared the port.
    pub generation: u64,
    /// Process generations sharing the port now, this one included.
    pub generations: u32,
    /// This process coordinates the others (holds the hand-over socket).
    pub coordinating: bool,
    /// Started without a hand-over: the process holding the port did not answer.
    pub solo: bool,
    /// Why the process does not serve yet, while it waits (port held, no free slot).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub waiting: String,
}

/// The whole `/status` document of one pod. Its size does not grow with the hosts: the
/// per-host view is `/hosts`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub port: u16,
    #[serde(default)]
    pub sockets: Vec<SocketReport>,
    /// Hosts with a loaded certificate.
    #[serde(default)]
    pub hosts_loaded: u64,
    /// Kubernetes mode only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirrors: Option<MirrorReport>,
    /// Sum of `sockets[].drops`.
    #[serde(default)]
    pub udp_drops: u64,
    /// Host-wide UDP receive-buffer errors (/proc/net/snmp + snmp6).
    #[serde(default)]
    pub udp_host_receive_buffer_errors: u64,
    #[serde(default)]
    pub requests_total: u64,
    /// Increments on every applied configuration.
    #[serde(default)]
    pub config_generation: u64,
    /// Changes the running pod refused because they need new sockets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_required: Vec<String>,
    /// Sharing the port with other generations of the data plane on this host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutReport>,
}
