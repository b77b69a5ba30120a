//! The HTTP/3 layer: each QUIC connection from handshake to close, and each request on it.
//!
//! - [`connection`]: the accept loop and the task of one connection (handshake, HTTP/3
//!   set-up, its requests); [`lifecycle`]: when it sends GOAWAY and when it closes (drain,
//!   maximum age, a superseded process's strays), as a pure state machine
//! - [`streams`], [`frames`], [`budget`]: the QUIC streams under h3, frame limits read from
//!   frame headers, the buffered-request budget
//! - [`handler`], [`request`], [`body`]: one request, phase by phase: validation and the
//!   headers sent upstream, then the body pumps both ways
//! - [`serving`]: what every connection and request shares (the current configuration
//!   generation, metrics, budget, caps, the drain and close tokens)
//!
//! Requests go to the TCP ingress through [`super::upstream`].

pub mod body;
pub mod budget;
pub mod connection;
pub mod frames;
pub mod handler;
pub mod lifecycle;
pub mod request;
pub mod serving;
pub mod streams;
