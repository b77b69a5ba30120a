//! The client side: every HTTP/3 request goes to the existing TCP ingress over hyper.
//!
//! TLS uses the request's host as SNI so the ingress picks the right virtual host; h2 when
//! the ingress offers it, else HTTP/1.1. Connections are pooled per host in lanes of at most
//! `upstream.maxStreamsPerConnection` requests ([`lanes`]), except with PROXY protocol,
//! where each QUIC connection gets its own upstream connections (the header names one
//! client).
//!
//! - [`connect`]: TCP, the PROXY header and TLS to the ingress
//! - [`resolve`]: the upstream's name, resolved once per configuration (and when it moved)
//! - [`verify`]: the upstream's certificate (`upstream.verify`), with [`renewal`]'s grace
//! - [`pool`]: the client of one configuration generation, in [`lanes`]

pub mod connect;
pub mod lanes;
pub mod pool;
pub mod renewal;
pub mod resolve;
pub mod retained;
pub mod verify;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;

pub use connect::{canonical_ip, proxy_v2_header, ConnectError, ProxyAddrs};
pub use pool::{Upstream, UpstreamError, UpstreamLease};
pub use verify::{client_tls, UpstreamSetupError};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type UpstreamBody = BoxBody<Bytes, BoxError>;

/// An empty request body.
pub fn empty_body() -> UpstreamBody {
    use http_body_util::BodyExt;
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}
