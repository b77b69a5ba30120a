//! DNS HTTPS records (RFC 9460) for the hosts a listener serves, kept in the user's zone by
//! RFC 2136 dynamic update signed with TSIG.
//!
//! - [`wire`]: names, records and UPDATE messages; what is read of an answer
//! - [`tsig`]: signing requests and checking answers
//! - [`plan`]: the changes that make a zone hold exactly our records, guarded by ownership
//! - [`client`]: one signed update over TCP, and what came of it; reads over TCP
//! - [`publish`]: a listener's records kept in its zones (the I/O around the plan)
//! - [`listener`]: what a listener's spec and status mean for its records, and its condition
//! - [`task`]: one task per listener running its publisher, fed by the reconciles

pub mod client;
pub mod listener;
pub mod plan;
pub mod publish;
pub mod task;
pub mod tsig;
pub mod wire;
