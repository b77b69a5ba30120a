//! Every wanted host resolved against its Secret's certificate: served (with the Secret that
//! serves it) or not (with the reason and message the status shows). One name is served from
//! one Secret; the first source to ask for it keeps it. Pure: `now_unix` decides expiry, and
//! the certificates are judged through [`Certificates`], which the operator answers from a
//! cache that parses each Secret once per resourceVersion.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

use super::policy::{Carried, Policies};
use super::wanted::{CertSource, WantedHost};
use crate::api::{host_states, reasons, HostOrigin, HostReport, SecretRef};
use crate::config::{normalize_host_name, HostEntry, HostError};

/// Keys of a `kubernetes.io/tls` Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";

/// Secrets by `(namespace, name)`, as the caller fetched or watched them.
pub type SecretMap = BTreeMap<(String, String), Secret>;

/// A host that can be served, with the Secret whose certificate serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedHost {
    /// Normalised: lowercase, no trailing dot; possibly `*.domain`.
    pub name: String,
    pub secret: SecretRef,
    /// The Ingress, or the HTTPRoute and Gateway listener, it comes from.
    pub origin: HostOrigin,
    /// Its own upstream timeouts, where they differ from the listener's.
    pub timeouts: Carried,
}

/// Served hosts plus a report for every wanted host (served or not, with the reason).
#[derive(Debug, Clone, Default)]
pub struct ResolvedHosts {
    /// In the order they won their names.
    pub served: Vec<ServedHost>,
    /// Sorted by host name, then Ingress, so equal inputs give equal status.
    pub reports: Vec<HostReport>,
}

impl ResolvedHosts {
    /// Whether `name` (as served, e.g. `*.b.example.com`) is served.
    pub fn serves(&self, name: &str) -> bool {
        self.served.iter().any(|h| h.name == name)
    }

    /// The served hosts grouped by Secret, each group in serving order.
    pub fn by_secret(&self) -> BTreeMap<&SecretRef, Vec<&ServedHost>> {
        let mut out: BTreeMap<&SecretRef, Vec<&ServedHost>> = BTreeMap::new();
        for h in &self.served {
            out.entry(&h.secret).or_default().push(h);
        }
        out
    }
}

/// What resolving learns of a certificate that can serve a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Servable {
    /// Whether its chain verifies against the public web roots ([`super::roots`]): Chrome
    /// uses HTTP/3 only then.
    pub public_roots: super::roots::Roots,
    /// Set when the certificate is the last good one of a Secret that cannot be read now:
    /// the host's message, saying why.
    pub stale: Option<String>,
}

/// Whether a Secret's certificate can serve a host: what resolving needs from Secrets.
/// The operator answers from a cache that parses each Secret once per resourceVersion;
/// [`SecretMap`] answers by parsing (tests, tools).
pub trait Certificates {
    /// `Ok` when `host` can be served with the certificate of `secret` at `now_unix`; else a
    /// reason from `api::reasons` and the message for the status.
    fn check(
        &self,
        secret: &SecretRef,
        host: &str,
        now_unix: i64,
    ) -> Result<Servable, (&'static str, String)>;
}

impl Certificates for SecretMap {
    fn check(
        &self,
        sref: &SecretRef,
        host: &str,
        now_unix: i64,
    ) -> Result<Servable, (&'static str, String)> {
        let Some(secret) = self.get(&(sref.namespace.clone(), sref.name.clone())) else {
            return Err(secret_not_found(sref));
        };
        let (cert, key) = tls_pair(secret).ok_or_else(|| missing_keys(sref))?;
        check_pem(sref, host, cert, key, now_unix)?;
        Ok(Servable {
            public_roots: super::roots::public_roots(cert, host, now_unix),
            stale: None,
        })
    }
}

/// The reason a missing Secret gives.
pub fn secret_not_found(sref: &SecretRef) -> (&'static str, String) {
    (
        reasons::SECRET_NOT_FOUND,
        format!("Secret {} not found", secret_key(sref)),
    )
}

/// The reason a Secret without `tls.crt` and `tls.key` gives.
pub fn missing_keys(sref: &SecretRef) -> (&'static str, String) {
    (
        reasons::CERTIFICATE_INVALID,
        format!(
            "Secret {} has no {TLS_CERT_KEY} and {TLS_KEY_KEY}",
            secret_key(sref)
        ),
    )
}

/// `tls.crt` and `tls.key` of a Secret, when it has both.
pub fn tls_pair(secret: &Secret) -> Option<(&[u8], &[u8])> {
    let data = secret.data.as_ref()?;
    let field = |k: &str| data.get(k).map(|b| b.0.as_slice());
    Some((field(TLS_CERT_KEY)?, field(TLS_KEY_KEY)?))
}

/// Parses and checks a certificate and key for `host`, as the data plane would load them.
pub fn check_pem(
    sref: &SecretRef,
    host: &str,
    cert: &[u8],
    key: &[u8],
    now_unix: i64,
) -> Result<(), (&'static str, String)> {
    HostEntry::from_pem(host, cert, key, now_unix)
        .map(|_| ())
        .map_err(|e| host_error(sref, e))
}

/// The reason and message of a certificate the data plane could not serve a host with.
pub fn host_error(sref: &SecretRef, e: HostError) -> (&'static str, String) {
    (e.reason(), format!("Secret {}: {e}", secret_key(sref)))
}

fn not_serving(
    w: &WantedHost,
    secret: Option<&SecretRef>,
    reason: &str,
    msg: String,
) -> HostReport {
    HostReport {
        state: host_states::NOT_SERVING.to_string(),
        reason: reason.to_string(),
        message: msg,
        secret: secret.map(secret_key),
        ..report_of(w)
    }
}

/// A report naming the host and where it came from; state and reason still empty.
fn report_of(w: &WantedHost) -> HostReport {
    HostReport {
        name: normalized(&w.name),
        origin: w.origin.clone(),
        ..Default::default()
    }
}

/// A host name as served and as policies are keyed: lowercase, no trailing dot.
pub fn normalized(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `namespace/name`, the form status and events use.
pub fn secret_key(s: &SecretRef) -> String {
    format!("{}/{}", s.namespace, s.name)
}

/// Resolves wanted hosts against their policies and the Secrets' certificates, in the order
/// given (the first to ask for a name keeps it). A host its policy holds back is not served
/// from any source: the TCP ingress merges the sources of one name, so one held-back source
/// covers paths every other one would open.
pub fn resolve_wanted(
    wanted: Vec<WantedHost>,
    policies: &Policies,
    certificates: &dyn Certificates,
    now_unix: i64,
) -> ResolvedHosts {
    let mut served: Vec<ServedHost> = Vec::new();
    let mut reports: Vec<HostReport> = Vec::new();
    // name -> (source text, secret) of the entry that won the name.
    let mut owners: BTreeMap<String, (String, Option<SecretRef>)> = BTreeMap::new();

    for w in wanted {
        let lower = normalized(&w.name);
        let sref = match &w.cert {
            CertSource::NoTls(msg) => {
                reports.push(not_serving(&w, None, reasons::NO_TLS, msg.clone()));
                continue;
            }
            CertSource::Refused {
                reason,
                message,
                secret,
            } => {
                reports.push(not_serving(&w, secret.as_ref(), reason, message.clone()));
                continue;
            }
            CertSource::Secret(s) => s,
        };
        if let Some((owner, owner_secret)) = owners.get(&lower) {
            // The same host from the same Secret twice is harmless (one entry serves both);
            // with a different Secret we could serve only one certificate, so say which.
            if owner_secret.as_ref() != Some(sref) {
                reports.push(not_serving(
                    &w,
                    Some(sref),
                    reasons::HOST_CONFLICT,
                    format!(
                        "{lower} is already served from {owner} with Secret {}",
                        owner_secret
                            .as_ref()
                            .map(secret_key)
                            .unwrap_or_else(|| "-".into())
                    ),
                ));
            }
            continue;
        }
        // A broken certificate still claims the name: a later source with another Secret
        // would silently take over a host its owner is fixing.
        owners.insert(lower.clone(), (w.origin.text(), Some(sref.clone())));
        if let Err(e) = normalize_host_name(&w.name) {
            reports.push(not_serving(&w, Some(sref), e.reason(), e.to_string()));
            continue;
        }
        if let Some((reason, message)) = policies.hold_back(&lower) {
            reports.push(not_serving(&w, Some(sref), reason, message));
            continue;
        }
        match certificates.check(sref, &lower, now_unix) {
            Ok(servable) => {
                let (timeouts, notes) = policies.timeouts(&lower);
                // The last good certificate of a Secret that cannot be read now says so;
                // else what of its policy is not carried, for Degraded and an event.
                let (reason, message) = match servable.stale {
                    Some(why) => (reasons::SECRET_UNREADABLE, why),
                    None => (reasons::SERVING, notes.join("; ")),
                };
                reports.push(HostReport {
                    state: host_states::SERVING.to_string(),
                    reason: reason.to_string(),
                    message,
                    secret: Some(secret_key(sref)),
                    public_roots: servable.public_roots.verdict(),
                    ..report_of(&w)
                });
                served.push(ServedHost {
                    name: lower,
                    secret: sref.clone(),
                    origin: w.origin.clone(),
                    timeouts,
                });
            }
            Err((reason, message)) => reports.push(not_serving(&w, Some(sref), reason, message)),
        }
    }
    reports.sort_by(|a, b| report_order(a).cmp(&report_order(b)));
    ResolvedHosts { served, reports }
}

fn report_order(h: &HostReport) -> (&str, &HostOrigin) {
    (&h.name, &h.origin)
}
