//! DNS HTTPS records (RFC 9460) for the hosts a listener serves, kept in the user's zone by
//! RFC 2136 dynamic update signed with TSIG.
//!
//! - [`wire`]: names, records and UPDATE messages; what is read of an answer
//! - [`tsig`]: signing requests and checking answers
//! - [`client`]: one signed update over TCP, and what came of it

pub mod client;
pub mod tsig;
pub mod wire;
