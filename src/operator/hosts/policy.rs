//! Per-host policy: what the TCP ingress does for a host that HTTP/3 must carry or respect.
//! Pure: the objects come in, the verdicts go out.
//!
//! Three things are read from an Ingress's annotations (ingress-nginx, F5 NGINX Ingress
//! Controller, HAProxy, Traefik), from the Traefik Middlewares and TLSOptions they name
//! ([`super::traefik`]) and from an HTTPRoute's `timeouts`:
//! - **timeouts**: the host's upstream timeouts, carried in its certificate mirror when they
//!   differ from the listener's ([`Policies::timeouts`]);
//! - **client-address rules** (allowlists, denylists, per-client limits): such a host is held
//!   back (not served over HTTP/3, reason `ClientAddressPolicy`) unless the listener's
//!   `upstream.clientAddress` gets the client's address to the TCP ingress in the form the
//!   rule reads ([`Judges`]); over HTTP/3 the ingress's peer is the node, so without that an
//!   allowlist naming the node's network would admit every client;
//! - **client certificates** and **TLS passthrough**: never servable (the data plane cannot ask
//!   the browser for the certificate the TCP ingress wants, and has none to terminate with).
//!
//! A value that cannot be read (`proxy-read-timeout: "ten"`) is noted and skipped; the host
//! keeps every other setting. A rule that cannot be read holds the host back (fail closed).
//! A host named by several sources (Ingresses of one class are merged by the ingress
//! controllers, paths from each) is held back when any of them holds it back, and gets the
//! largest timeout any of them has.

use std::collections::BTreeMap;

use crate::api::{bounds, reasons, ClientAddressVia, Http3Listener, Upstream};

/// The annotations read, by controller. Their owners name them; h3-ingress only reads them.
pub mod keys {
    /// ingress-nginx (the default `--annotations-prefix`).
    pub const NGINX: &str = "nginx.ingress.kubernetes.io/";
    /// Client-address rules of ingress-nginx (`allowlist-source-range` is the current name of
    /// `whitelist-source-range`; `global-rate-limit` was removed in v1.12, older controllers
    /// have it, keyed by `$remote_addr` unless `global-rate-limit-key` says otherwise).
    pub const NGINX_ADDRESS: &[&str] = &[
        "whitelist-source-range",
        "allowlist-source-range",
        "denylist-source-range",
        "limit-connections",
        "limit-rps",
        "limit-rpm",
        "global-rate-limit",
    ];
    pub const NGINX_GLOBAL_RATE_LIMIT_KEY: &str = "global-rate-limit-key";
    pub const NGINX_AUTH_TLS_SECRET: &str = "auth-tls-secret";
    pub const NGINX_AUTH_TLS_VERIFY_CLIENT: &str = "auth-tls-verify-client";
    pub const NGINX_SSL_PASSTHROUGH: &str = "ssl-passthrough";
    /// Whole seconds (ingress-nginx parses them as integers and ignores anything else).
    pub const NGINX_PROXY_READ_TIMEOUT: &str = "proxy-read-timeout";
    pub const NGINX_PROXY_SEND_TIMEOUT: &str = "proxy-send-timeout";
    pub const NGINX_SNIPPETS: &[&str] = &["configuration-snippet", "server-snippet"];

    /// F5 NGINX Ingress Controller.
    pub const NGINX_ORG: &str = "nginx.org/";
    /// Policy resources (`accessControl` judges the client's address, `ingressMTLS` asks for
    /// a client certificate); h3-ingress does not read Policy objects.
    pub const NGINX_ORG_POLICIES: &str = "policies";
    /// nginx time syntax (`60s`, `1m30s`, a bare number of seconds).
    pub const NGINX_ORG_PROXY_READ_TIMEOUT: &str = "proxy-read-timeout";
    pub const NGINX_ORG_PROXY_SEND_TIMEOUT: &str = "proxy-send-timeout";
    pub const NGINX_ORG_SNIPPETS: &[&str] = &["server-snippets", "location-snippets"];

    /// HAProxy Kubernetes Ingress Controller.
    pub const HAPROXY: &str = "haproxy.org/";
    pub const HAPROXY_ADDRESS: &[&str] = &[
        "allow-list",
        "deny-list",
        "whitelist",
        "blacklist",
        "rate-limit-requests",
    ];

    /// Traefik's Kubernetes Ingress provider: comma-separated Middleware names
    /// (`namespace-name@kubernetescrd`) on the host's router and on its service, and the
    /// router's TLSOption.
    pub const TRAEFIK_ROUTER_MIDDLEWARES: &str = "traefik.ingress.kubernetes.io/router.middlewares";
    pub const TRAEFIK_SERVICE_MIDDLEWARES: &str =
        "traefik.ingress.kubernetes.io/service.middlewares";
    pub const TRAEFIK_ROUTER_TLS_OPTIONS: &str = "traefik.ingress.kubernetes.io/router.tls.options";
    /// The `spec.controller` of Traefik's IngressClasses: their Ingresses get Traefik's
    /// default TLSOption.
    pub const TRAEFIK_CONTROLLER: &str = "traefik.io/ingress-controller";
}

/// One timeout a source asks for, with where it comes from (for the notes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timed {
    pub seconds: u64,
    pub from: String,
}

/// The upstream timeouts one source gives a host; `None`: the controller's default, taken to
/// be the listener's setting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeouts {
    /// To the response headers (`upstream.responseTimeoutSeconds`).
    pub response: Option<Timed>,
    /// Between request body bytes (`http.requestBodyIdleTimeoutSeconds`).
    pub request_body_idle: Option<Timed>,
    /// Between response body bytes (`upstream.responseBodyIdleTimeoutSeconds`).
    pub response_body_idle: Option<Timed>,
}

/// Which address a client-address rule takes as the client's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judges {
    /// The client's address as the ingress works it out from what it trusts (nginx's realip
    /// module, HAProxy's source after its header rules): right once the ingress gets it.
    ClientAddress,
    /// The connection's peer (a Traefik Middleware without `ipStrategy`): the client's only
    /// with the PROXY header.
    Peer,
    /// The n-th `X-Forwarded-For` entry from the right (Traefik `ipStrategy.depth`).
    ForwardedDepth(i64),
    /// The rightmost `X-Forwarded-For` entry outside a set (Traefik `ipStrategy.excludedIPs`).
    ForwardedExcluding,
    /// Not knowable: a Middleware that cannot be read (not found, another provider's, a
    /// plugin, the kind not readable).
    Unknown,
}

/// A rule of the TCP ingress that judges the client's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddressRule {
    /// What it is and where it comes from, as people read it.
    pub what: String,
    pub judges: Judges,
}

/// One source's policy for its hosts (an Ingress, one rule of an HTTPRoute).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourcePolicy {
    pub timeouts: Timeouts,
    pub address: Vec<AddressRule>,
    /// What asks for a client certificate.
    pub client_certificate: Vec<String>,
    /// What hands the TLS connection to the backend.
    pub passthrough: Vec<String>,
    /// Values that could not be read, each naming its annotation; skipped.
    pub notes: Vec<String>,
}

/// A host's policy: every source that names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// Each source's timeouts (a source that sets none still counts: it has the default).
    pub timeouts: Vec<Timeouts>,
    pub address: Vec<AddressRule>,
    pub client_certificate: Vec<String>,
    pub passthrough: Vec<String>,
    pub notes: Vec<String>,
}

fn push_new<T: PartialEq + Clone>(into: &mut Vec<T>, from: &[T]) {
    for x in from {
        if !into.contains(x) {
            into.push(x.clone());
        }
    }
}

impl HostPolicy {
    pub fn add(&mut self, s: &SourcePolicy) {
        self.timeouts.push(s.timeouts.clone());
        push_new(&mut self.address, &s.address);
        push_new(&mut self.client_certificate, &s.client_certificate);
        push_new(&mut self.passthrough, &s.passthrough);
        push_new(&mut self.notes, &s.notes);
    }
}

/// How the client's address reaches the TCP ingress, as the listener's settings say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Passing {
    /// In a PROXY header: the ingress sees the client as the connection's peer.
    ProxyProtocol,
    /// In forwarded headers the ingress is declared to trust.
    TrustedHeaders,
    /// In forwarded headers nobody said the ingress trusts: it judges the node's address.
    UntrustedHeaders,
}

/// The listener's way; the older `upstream.proxyProtocol: true` is the PROXY header too.
pub fn passing(u: &Upstream) -> Passing {
    if u.proxy_protocol || u.client_address.via == ClientAddressVia::ProxyProtocol {
        Passing::ProxyProtocol
    } else if u.client_address.trusted {
        Passing::TrustedHeaders
    } else {
        Passing::UntrustedHeaders
    }
}

/// Where the fixes below are explained.
const DOC: &str = "docs/kubernetes-networking.md";

/// Why a rule judges the wrong address with `passing`, and what to set; `None` when it judges
/// the client's. The rules are Traefik v3.7.13's for Middlewares (`pkg/ip/strategy.go`,
/// `pkg/middlewares/forwardedheaders`): no `ipStrategy` reads the peer; `depth` and
/// `excludedIPs` read `X-Forwarded-For`, which Traefik deletes from senders its entryPoint
/// does not trust, and which over a PROXY-protocol entryPoint comes from the client itself.
pub fn misjudged(j: Judges, p: Passing) -> Option<String> {
    use Judges::*;
    use Passing::*;
    let untrusted = || {
        "the TCP ingress would judge the node's address, not the client's: make it take the \
         address from h3-ingress and set spec.upstream.clientAddress.trusted: true, or use \
         clientAddress.via: ProxyProtocol"
            .to_string()
    };
    match (j, p) {
        (ClientAddress, ProxyProtocol | TrustedHeaders) => None,
        (Peer | Unknown, ProxyProtocol) => None,
        (ForwardedDepth(1) | ForwardedExcluding, TrustedHeaders) => None,
        (ClientAddress, UntrustedHeaders) => Some(untrusted()),
        (Peer, _) => Some(
            "it judges the connection's address (no ipStrategy), which over forwarded headers \
             is the node's even when trusted: set ipStrategy.depth: 1 on it, or use \
             clientAddress.via: ProxyProtocol to an entryPoint with proxyProtocol.trustedIPs"
                .to_string(),
        ),
        (ForwardedDepth(n), _) if n != 1 => Some(format!(
            "ipStrategy.depth: {n} reads an X-Forwarded-For entry the HTTP/3 client wrote \
             itself, or none: set depth: 1"
        )),
        (ForwardedDepth(_) | ForwardedExcluding, ProxyProtocol) => Some(
            "its ipStrategy reads X-Forwarded-For, which Traefik deletes on a PROXY-protocol \
             entryPoint (the client is the peer there, and untrusted): drop the ipStrategy, \
             or use via: ForwardedHeaders with trusted: true"
                .to_string(),
        ),
        (ForwardedDepth(_) | ForwardedExcluding, _) => Some(format!(
            "it reads X-Forwarded-For, which Traefik deletes unless forwardedHeaders.trustedIPs \
             names the nodes: do that and set spec.upstream.clientAddress.trusted: true ({DOC})"
        )),
        (Unknown, _) => Some(
            "h3-ingress cannot read what it judges: use clientAddress.via: ProxyProtocol, or \
             make it readable"
                .to_string(),
        ),
    }
}

/// The reason and message a held-back host gets, or `None` when it can be served.
pub fn hold_back(p: &HostPolicy, passing: Passing) -> Option<(&'static str, String)> {
    let more = |n: usize| {
        if n > 1 {
            format!(" (and {} more)", n - 1)
        } else {
            String::new()
        }
    };
    if let Some(first) = p.passthrough.first() {
        return Some((
            reasons::TLS_PASSTHROUGH,
            format!(
                "{first}: the TCP ingress passes TLS through to the backend, so h3-ingress has \
                 no certificate to serve this host with{}",
                more(p.passthrough.len())
            ),
        ));
    }
    if let Some(first) = p.client_certificate.first() {
        return Some((
            reasons::CLIENT_CERTIFICATE_REQUIRED,
            format!(
                "{first}: the TCP ingress asks for a client certificate, which h3-ingress \
                 cannot ask the browser for and pass on; this host stays on TCP{}",
                more(p.client_certificate.len())
            ),
        ));
    }
    let wrong: Vec<(&AddressRule, String)> = p
        .address
        .iter()
        .filter_map(|r| misjudged(r.judges, passing).map(|why| (r, why)))
        .collect();
    let (rule, why) = wrong.first()?;
    Some((
        reasons::CLIENT_ADDRESS_POLICY,
        format!("{}{}: {why}", rule.what, more(wrong.len())),
    ))
}

/// The listener's own timeouts, which a host's are compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerTimeouts {
    pub response: u32,
    pub request_body_idle: u32,
    pub response_body_idle: u32,
}

impl ListenerTimeouts {
    pub fn of(l: &Http3Listener) -> Self {
        Self {
            response: l.spec.upstream.response_timeout_seconds,
            request_body_idle: l.spec.http.request_body_idle_timeout_seconds,
            response_body_idle: l.spec.upstream.response_body_idle_timeout_seconds,
        }
    }
}

/// The timeouts carried in a host's mirror: only those that differ from the listener's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    pub response: Option<u32>,
    pub request_body_idle: Option<u32>,
    pub response_body_idle: Option<u32>,
}

/// One timeout of a host: the largest any source gives it (a source without one has the
/// listener's), within the setting's bound; `None` when it is the listener's.
fn carry_one(
    values: Vec<Option<&Timed>>,
    listener: u32,
    bound: bounds::Bound,
    notes: &mut Vec<String>,
) -> Option<u32> {
    let top = values
        .into_iter()
        .map(|v| {
            v.map(|t| (t.seconds, Some(t)))
                .unwrap_or((listener.into(), None))
        })
        .max_by_key(|(s, _)| *s)?;
    let seconds = match top {
        (s, Some(t)) if s > bound.max => {
            notes.push(format!(
                "{}: {s} s is above the {} s h3-ingress allows for {}: capped",
                t.from, bound.max, bound.field
            ));
            bound.max
        }
        (s, _) => s.max(bound.min),
    };
    let seconds = u32::try_from(seconds).unwrap_or(u32::MAX);
    (seconds != listener).then_some(seconds)
}

/// Everything resolution needs to judge the listener's hosts.
#[derive(Debug, Clone)]
pub struct Policies {
    /// By host name as served (lowercase, no trailing dot).
    pub by_host: BTreeMap<String, HostPolicy>,
    pub passing: Passing,
    pub listener: ListenerTimeouts,
}

impl Policies {
    /// Policies of nothing, for a listener judged with no objects around.
    pub fn none(l: &Http3Listener) -> Self {
        Self {
            by_host: BTreeMap::new(),
            passing: passing(&l.spec.upstream),
            listener: ListenerTimeouts::of(l),
        }
    }

    pub fn hold_back(&self, host: &str) -> Option<(&'static str, String)> {
        hold_back(self.by_host.get(host)?, self.passing)
    }

    /// The host's carried timeouts and every note on its policy (values not read, capped).
    pub fn timeouts(&self, host: &str) -> (Carried, Vec<String>) {
        let Some(p) = self.by_host.get(host) else {
            return (Carried::default(), Vec::new());
        };
        let mut notes = p.notes.clone();
        let l = self.listener;
        let pick = |f: fn(&Timeouts) -> Option<&Timed>| p.timeouts.iter().map(f).collect();
        let carried = Carried {
            response: carry_one(
                pick(|t| t.response.as_ref()),
                l.response,
                bounds::RESPONSE_TIMEOUT_SECONDS,
                &mut notes,
            ),
            request_body_idle: carry_one(
                pick(|t| t.request_body_idle.as_ref()),
                l.request_body_idle,
                bounds::REQUEST_BODY_IDLE_TIMEOUT_SECONDS,
                &mut notes,
            ),
            response_body_idle: carry_one(
                pick(|t| t.response_body_idle.as_ref()),
                l.response_body_idle,
                bounds::RESPONSE_BODY_IDLE_TIMEOUT_SECONDS,
                &mut notes,
            ),
        };
        (carried, notes)
    }
}

/// A duration in nginx's syntax (`ngx_parse_time`): numbers each followed by a unit (`ms`,
/// `s`, `m`, `h`, `d`, `w`, `M`, `y`; none: seconds), spaces allowed between them. Whole
/// seconds, rounded up.
pub fn nginx_time(text: &str) -> Option<u64> {
    let mut total_ms: u64 = 0;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let ms_per = match &rest[..unit_len] {
            "ms" => 1,
            "" | "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "w" => 604_800_000,
            "M" => 2_592_000_000,
            "y" => 31_536_000_000,
            _ => return None,
        };
        total_ms = total_ms.checked_add(n.checked_mul(ms_per)?)?;
        rest = rest[unit_len..].trim_start();
    }
    Some(total_ms.div_ceil(1000))
}

/// A Gateway API duration (GEP-2257: one to four `<1-5 digits><h|m|s|ms>` parts, `0s` for
/// none), in whole seconds rounded up; `Some(None)` for zero (no timeout).
pub fn gateway_duration(text: &str) -> Option<Option<u64>> {
    let mut rest = text.trim();
    let (mut parts, mut total_ms) = (0, 0u64);
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if !(1..=5).contains(&digits) {
            return None;
        }
        let n: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (ms_per, len) = if rest.starts_with("ms") {
            (1, 2)
        } else {
            match rest.chars().next()? {
                'h' => (3_600_000, 1),
                'm' => (60_000, 1),
                's' => (1_000, 1),
                _ => return None,
            }
        };
        total_ms += n * ms_per;
        rest = &rest[len..];
        parts += 1;
    }
    if !(1..=4).contains(&parts) {
        return None;
    }
    Some((total_ms > 0).then(|| total_ms.div_ceil(1000)))
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
