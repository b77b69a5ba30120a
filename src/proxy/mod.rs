//! The data plane: UDP sockets, TLS, QUIC, the HTTP/3 -> TCP ingress request path, metrics.

pub mod admin;
pub mod altsvc;
pub mod cc;
pub mod handler;
pub mod metrics;
pub mod request;
pub mod server;
pub mod socket;
pub mod tls;
pub mod transport;
pub mod upstream;
pub mod window;

pub use server::{serve, ConfigUpdate, ProxyError, RunningProxy};
