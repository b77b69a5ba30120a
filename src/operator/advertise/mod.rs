//! Telling browsers that a host speaks HTTP/3, only while it does: DNS HTTPS records
//! ([`dns`]).

pub mod dns;
