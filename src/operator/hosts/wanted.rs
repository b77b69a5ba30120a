//! What a listener is asked to serve, before any Secret is read: one [`WantedHost`] per host
//! an Ingress, an HTTPRoute, a Gateway or the listener's own `spec.hosts` names, with where its
//! certificate should come from. Both sources of hosts ([`super::ingress`] for Ingresses,
//! [`super::gateway`] for the Gateway API) produce these, and `spec.hosts` is read where they
//! are gathered ([`super::wanted_for_listener`]); neither source imports the other.

use crate::api::{HostOrigin, SecretRef};

/// Where a wanted host's certificate should come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    Secret(SecretRef),
    /// No usable `spec.tls` entry; the text says why (it becomes the status message).
    NoTls(String),
    /// Not servable for another reason (a Gateway API rule); the Secret, when one is named
    /// but may not be used, is reported too. h3-ingress never reads a refused Secret.
    Refused {
        reason: &'static str,
        message: String,
        secret: Option<SecretRef>,
    },
}

/// One host that an Ingress, an HTTPRoute, a Gateway or the listener's own `spec.hosts` asks
/// to serve over HTTP/3.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedHost {
    /// As written (normalised later, so a bad name is reported, not dropped).
    pub name: String,
    /// The Ingress, or the HTTPRoute and Gateway listener, that asks for it (none for
    /// `spec.hosts`).
    pub origin: HostOrigin,
    pub cert: CertSource,
}
