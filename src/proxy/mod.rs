//! The data plane: UDP sockets, TLS, QUIC, the HTTP/3 -> TCP ingress request path, metrics.

pub mod cc;
pub mod metrics;
