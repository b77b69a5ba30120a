//! The data plane: UDP sockets, TLS, QUIC, the HTTP/3 -> TCP ingress request path, metrics.
//!
//! Layers, each using only the ones below it:
//! - [`observe`]: metrics, the log rate limiter, the kernel's UDP counters
//! - [`quic`]: sockets, endpoints, transport and congestion control, TLS, admission and the
//!   amplification guard, keys and connection IDs
//! - [`handover`]: process generations sharing the port on a host (rollouts, restarts), with
//!   the kernel's socket-selection program
//! - [`upstream`]: the TCP ingress: connections, their certificate checks, lanes, renewals
//! - [`http3`]: each connection's task and lifecycle, the streams under h3, each request
//!
//! At the top, what wires them together and reads the shared state:
//! - [`run`]: `proxy --config` and `proxy --listener`, a source connected to the server
//! - [`source`]: where configurations come from (a file and SIGHUP, or Kubernetes)
//! - [`server`]: the wiring of a running proxy, live updates and the drain
//! - [`state`]: what the running proxy's tasks share
//! - [`admin`], [`probe`], [`altsvc`]: the admin endpoint's documents, what `h3-ingress probe`
//!   is answered, the Alt-Svc prober

pub mod admin;
pub mod altsvc;
pub mod handover;
pub mod http3;
pub mod observe;
pub mod probe;
pub mod quic;
pub mod run;
pub mod server;
pub mod source;
pub mod state;
pub mod upstream;

use std::net::SocketAddr;

pub use server::{serve, RunningProxy, ServeOptions, WhenSuperseded};
pub use source::ConfigUpdate;

/// Why the proxy could not start (or could not build a configuration's endpoints).
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Endpoint(#[from] quic::endpoint::EndpointError),
    #[error(transparent)]
    Upstream(#[from] upstream::UpstreamSetupError),
    #[error(transparent)]
    Keys(#[from] quic::keys::KeyError),
    #[error("metrics endpoint {addr}: {source}")]
    Admin {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("sharing the port with other processes on this host: {0}")]
    Handover(String),
}
