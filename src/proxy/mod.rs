//! The data plane: UDP sockets, TLS, QUIC, the HTTP/3 -> TCP ingress request path, metrics.
//!
//! - [`run`]: `proxy --config` and `proxy --listener`, a source connected to the server
//! - [`source`]: where configurations come from (a file and SIGHUP, or Kubernetes)
//! - [`server`]: the wiring of a running proxy, live updates and the drain
//! - [`state`]: what the running proxy's tasks share (a leaf: it uses none of them)
//! - [`endpoint`], [`socket`], [`transport`], [`cc`], [`tls`]: sockets to QUIC endpoints
//! - [`accept`]: the accept loop and each connection's task; [`admission`] decides on each
//!   attempt (Retry, caps), [`amplification`] keeps replies to unvalidated addresses within
//!   3x, [`keys`] makes the endpoint's identity survive restarts
//! - [`handover`], [`cid`], [`steer`]: process generations sharing the port on a host
//!   (rollouts, restarts): slots, connection IDs that name them, the kernel's
//!   socket-selection program
//! - [`probe`]: what `h3-ingress probe` is answered
//! - [`streams`], [`frames`], [`budget`]: the QUIC streams under h3, frame limits, the
//!   buffered-request budget
//! - [`handler`], [`request`], [`body`], [`upstream`]: one request, phase by phase
//! - [`logs`]: the rate limiter of every log line a client or the upstream can cause
//! - [`memory`]: freed memory handed back to the kernel
//! - [`admin`], [`metrics`], [`procnet`], [`altsvc`], [`window`]: what the proxy reports

pub mod accept;
pub mod admin;
pub mod admission;
pub mod altsvc;
pub mod amplification;
pub mod body;
pub mod budget;
pub mod cc;
pub mod cid;
pub mod endpoint;
pub mod frames;
pub mod handler;
pub mod handover;
pub mod header;
pub mod keys;
pub mod lanes;
pub mod logs;
pub mod metrics;
pub mod probe;
pub mod procnet;
pub mod renewal;
pub mod request;
pub mod run;
pub mod server;
pub mod socket;
pub mod source;
pub mod state;
pub mod steer;
pub mod streams;
pub mod tls;
pub mod transport;
pub mod upstream;
pub mod window;

use std::net::SocketAddr;

pub use server::{serve, RunningProxy, ServeOptions, WhenSuperseded};
pub use source::ConfigUpdate;

/// Why the proxy could not start (or could not build a configuration's endpoints).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("no UDP socket could be bound: {0}")]
    NoSockets(String),
    #[error(transparent)]
    Upstream(#[from] upstream::UpstreamSetupError),
    #[error("TLS server configuration: {0}")]
    Tls(#[from] rustls::Error),
    #[error("creating the QUIC endpoint on {addr}: {source}")]
    Endpoint {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Keys(#[from] keys::KeyError),
    #[error("metrics endpoint {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("sharing the port with other processes on this host: {0}")]
    Handover(String),
}
