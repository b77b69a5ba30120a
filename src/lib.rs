//! h3-ingress: HTTP/3 in front of an existing TCP ingress.
//!
//! - [`api`]: the `Http3Listener` CRD and shared settings types (no I/O)
//! - [`admin`]: the `/healthz` `/readyz` `/metrics` `/status` endpoint of proxy and operator
//! - [`probe`]: `h3-ingress probe`, the kubelet's live/ready/startup questions over a socket
//!   in the pod's own `/tmp`
//! - [`fds`]: the file descriptor limit raised at start, counted, and accept loops that
//!   pause instead of spinning when it is reached
//! - [`lifecycle`], [`logging`]: SIGTERM/SIGINT to a shutdown token, SIGHUP to reload
//!   requests; log output and its default filter
//! - [`config`]: the one validated configuration, built from a file or from Kubernetes objects
//! - [`proxy`]: the data plane (sockets, TLS, QUIC, HTTP/3 -> TCP ingress, metrics)
//! - [`operator`]: the Kubernetes controller
//! - [`check`]: an HTTP/3 + HTTP/2 client that proves h3 really runs
//! - [`demo`]: everything on localhost with no cluster and no files
//! - [`plugin`]: `kubectl h3-ingress` (this binary installed as `kubectl-h3_ingress`)
//! - [`skew`]: reading listeners a newer CRD wrote; [`version`]: what this build is

pub mod admin;
pub mod api;
pub mod check;
pub mod config;
pub mod demo;
pub mod fds;
pub mod lifecycle;
pub mod logging;
pub mod memory;
pub mod operator;
pub mod pki;
pub mod plugin;
pub mod probe;
pub mod proxy;
pub mod skew;
#[cfg(test)]
mod testcerts;
pub mod version;
