//! Telling browsers that a host speaks HTTP/3, only while it does: DNS HTTPS records
//! ([`dns`]) and the TCP ingress's own `Alt-Svc` ([`altsvc`]).

pub mod altsvc;
pub mod dns;
