//! What the data plane reports, and the one rate limiter of what it logs.
//!
//! - [`metrics`]: every Prometheus series, registered explicitly, label values known up front
//! - [`logs`]: the rate limiter of every log line a client or the upstream can cause
//! - [`procnet`]: the kernel's UDP counters for our sockets (`/proc/net/snmp`, `udp`, `udp6`)
//! - [`window`]: the per-minute window of recent requests
//!
//! The lowest layer: it imports nothing else of the data plane.

pub mod logs;
pub mod metrics;
pub mod procnet;
pub mod window;
