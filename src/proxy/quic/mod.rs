//! The QUIC layer: UDP sockets to quinn endpoints, and what the endpoint decides before a
//! connection is HTTP/3.
//!
//! - [`socket`]: one IPv4 and one IPv6-only UDP socket with DF and the buffers they were
//!   granted; [`endpoint`]: a quinn endpoint on each, and its server configuration
//! - [`transport`]: flow control, path MTU and the congestion controller ([`cc`]) per
//!   connection
//! - [`tls`]: certificates chosen by SNI from the host table
//! - [`admission`]: Retry or refusal at a cap for each attempt; [`amplification`]: replies to
//!   unvalidated addresses held to 3x at the socket ([`header`] reads the datagrams' long
//!   headers for it)
//! - [`shed`]: first Initials dropped at the socket while the accept loop is behind or past
//!   their rate, so a client answering a Retry finds room in quinn's queue
//! - [`keys`], [`cid`]: the endpoint's identity (reset, Retry and connection-ID keys) and the
//!   process slot in every connection ID, so restarts and rollouts keep connections
//!
//! Nothing here knows HTTP/3, the upstream or the shared state of a running proxy.

pub mod admission;
pub mod amplification;
pub mod cc;
pub mod cid;
pub mod endpoint;
pub mod header;
pub mod keys;
pub mod shed;
pub mod socket;
pub mod tls;
pub mod transport;
