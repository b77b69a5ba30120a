//! Traefik Middlewares and TLSOptions as the per-host policy reads them ([`super::policy`]):
//! found by the names routers give them, followed through chains, and reduced to the
//! client-address rules and client-certificate demands they make. Pure.
//!
//! Names, as Traefik v3.7.13 builds them (`pkg/provider/kubernetes/crd/name_builder.go`): a
//! Middleware of the Kubernetes CRD provider is `<id>@kubernetescrd`, where `<id>` is
//! `namespace-name` with every run of characters other than letters and digits made one `-`
//! (the legacy scheme) or `namespace_name` (with `safeNaming`); a TLSOption's id is
//! `namespace-name` unchanged, or `default` for the one named `default`. An Ingress's
//! `router.middlewares` lists such names; an HTTPRoute's `ExtensionRef` filter and a chain
//! entry name a Middleware by namespace and name.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::policy::{AddressRule, Judges};
use crate::api::traefik::{
    IpStrategy, Middleware, SourceLimited, TLSOption, CRD_PROVIDER, DEFAULT_TLS_OPTION,
};

/// How deep a chain of chains is followed; deeper is refused by Traefik's own limits long
/// before, and a cycle stops at it too.
pub const MAX_CHAIN_DEPTH: usize = 10;

/// The Traefik objects the watches have seen.
#[derive(Debug, Clone, Default)]
pub struct TraefikObjects {
    pub middlewares: Vec<Arc<Middleware>>,
    pub tls_options: Vec<Arc<TLSOption>>,
    /// Whether the kinds are served and readable; without them a named Middleware cannot be
    /// judged (and is taken to judge an unknown address).
    pub readable: bool,
}

fn ns_name(meta: &kube::api::ObjectMeta) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Traefik's `provider.Normalize`: runs of characters other than letters and digits become
/// one `-`, none at either end.
pub fn normalize(name: &str) -> String {
    name.split(|c: char| !c.is_alphanumeric())
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// Prefix of the Middlewares the operator keeps for `spec.advertise.altSvc`
/// (`operator::advertise::altsvc`); the Ingress's name follows.
pub const ALT_SVC_PREFIX: &str = "h3-ingress-alt-svc-";
/// Longest Kubernetes object name.
const MAX_NAME: usize = 253;

/// The operator's Alt-Svc Middleware for the Ingress `name` (a name too long for the prefix
/// is cut and given a hash of the whole, so two long names stay apart).
pub fn alt_svc_middleware(name: &str) -> String {
    let full = format!("{ALT_SVC_PREFIX}{name}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(name, &mut h);
    let hash = std::hash::Hasher::finish(&h);
    let mut cut = full[..MAX_NAME - 17].to_string();
    while cut.ends_with(['.', '-']) {
        cut.pop();
    }
    format!("{cut}-{hash:016x}")
}

/// How a router names the operator's Alt-Svc Middleware for Ingress `namespace/name`
/// (Traefik's default naming; with `safeNaming` it is `namespace_middleware@kubernetescrd`,
/// which the user adds).
pub fn alt_svc_reference(namespace: &str, name: &str) -> String {
    let id = normalize(&format!("{namespace}-{}", alt_svc_middleware(name)));
    format!("{id}@{CRD_PROVIDER}")
}

/// The ids a Middleware is known by: legacy and safe naming.
pub fn middleware_ids(namespace: &str, name: &str) -> [String; 2] {
    [
        normalize(&format!("{namespace}-{name}")),
        format!("{namespace}_{name}"),
    ]
}

/// The ids a TLSOption is known by.
pub fn tls_option_ids(namespace: &str, name: &str) -> Vec<String> {
    if name == DEFAULT_TLS_OPTION {
        return vec![DEFAULT_TLS_OPTION.to_string()];
    }
    vec![format!("{namespace}-{name}"), format!("{namespace}_{name}")]
}

/// The id of a name a router gives, when it is the CRD provider's; `None` for another
/// provider's (`@file`) or an unqualified name (the Ingress provider's own, which has no
/// Middlewares).
pub fn crd_id(reference: &str) -> Option<&str> {
    let (id, provider) = reference.trim().rsplit_once('@')?;
    (provider == CRD_PROVIDER && !id.is_empty()).then_some(id)
}

/// The objects indexed for one resolution.
pub struct Index<'a> {
    objects: &'a TraefikObjects,
    by_id: HashMap<String, Vec<&'a Middleware>>,
    by_key: HashMap<(String, String), &'a Middleware>,
    tls_by_id: HashMap<String, Vec<&'a TLSOption>>,
}

/// What a router's Middlewares and TLSOption demand, and the objects (`Kind ns/name`) and
/// ids they were found by, for the triggers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Demands {
    pub address: Vec<AddressRule>,
    pub client_certificate: Vec<String>,
    /// Middleware and TLSOption ids and `ns/name` keys looked up (found or not).
    pub looked_up: BTreeSet<String>,
}

impl<'a> Index<'a> {
    pub fn new(objects: &'a TraefikObjects) -> Self {
        let mut by_id: HashMap<String, Vec<&Middleware>> = HashMap::new();
        let mut by_key = HashMap::new();
        for m in &objects.middlewares {
            let (ns, name) = ns_name(&m.metadata);
            for id in middleware_ids(&ns, &name) {
                by_id.entry(id).or_default().push(m);
            }
            by_key.insert((ns, name), m.as_ref());
        }
        let mut tls_by_id: HashMap<String, Vec<&TLSOption>> = HashMap::new();
        for t in &objects.tls_options {
            let (ns, name) = ns_name(&t.metadata);
            for id in tls_option_ids(&ns, &name) {
                tls_by_id.entry(id).or_default().push(t);
            }
        }
        Self {
            objects,
            by_id,
            by_key,
            tls_by_id,
        }
    }

    /// The rules of the Middlewares a router names (`ns-name@kubernetescrd`, ...), `by`
    /// saying who names them (`router.middlewares of Ingress shop/web`).
    pub fn by_names(&self, names: &str, by: &str, out: &mut Demands) {
        for reference in names.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            self.by_name(reference, by, out, 0);
        }
    }

    /// Whether a router's reference names a Middleware the cache holds.
    pub fn knows(&self, reference: &str) -> bool {
        crd_id(reference).is_some_and(|id| self.by_id.contains_key(id))
    }

    fn by_name(&self, reference: &str, by: &str, out: &mut Demands, depth: usize) {
        let found = crd_id(reference).and_then(|id| {
            out.looked_up.insert(format!("id {id}"));
            self.by_id.get(id)
        });
        match found {
            // Two objects with one legacy id: judge both, Traefik keeps one of them.
            Some(ms) if self.objects.readable => {
                for m in ms {
                    self.rules_of(m, by, out, depth);
                }
            }
            _ => out.address.push(AddressRule {
                what: format!(
                    "Middleware {reference} ({by}) {}",
                    self.why_unread(reference)
                ),
                judges: Judges::Unknown,
            }),
        }
    }

    /// A Middleware named by namespace and name (a chain entry, an HTTPRoute filter).
    pub fn by_key(&self, namespace: &str, name: &str, by: &str, out: &mut Demands) {
        self.by_key_at(namespace, name, by, out, 0);
    }

    fn by_key_at(&self, namespace: &str, name: &str, by: &str, out: &mut Demands, depth: usize) {
        if name.contains('@') {
            return self.by_name(name, by, out, depth);
        }
        out.looked_up.insert(format!("{namespace}/{name}"));
        match self.by_key.get(&(namespace.to_string(), name.to_string())) {
            Some(m) if self.objects.readable => self.rules_of(m, by, out, depth),
            _ => out.address.push(AddressRule {
                what: format!(
                    "Middleware {namespace}/{name} ({by}) {}",
                    if self.objects.readable {
                        "is not found"
                    } else {
                        "cannot be read (Traefik's CRDs not served, or no RBAC)"
                    }
                ),
                judges: Judges::Unknown,
            }),
        }
    }

    fn why_unread(&self, reference: &str) -> &'static str {
        if crd_id(reference).is_none() {
            "is not a Kubernetes object (only @kubernetescrd ones are read)"
        } else if self.objects.readable {
            "is not found"
        } else {
            "cannot be read (Traefik's CRDs not served, or no RBAC)"
        }
    }

    /// The client-address rules of one Middleware, following chains.
    fn rules_of(&self, m: &Middleware, by: &str, out: &mut Demands, depth: usize) {
        let (ns, name) = ns_name(&m.metadata);
        let what = |kind: &str| format!("Middleware {ns}/{name} ({kind}, {by})");
        let spec = &m.spec;
        for (kind, list) in [
            ("ipAllowList", &spec.ip_allow_list),
            ("ipWhiteList", &spec.ip_white_list),
        ] {
            if let Some(l) = list {
                let judges = strategy(l.ip_strategy.as_ref());
                out.address.push(AddressRule {
                    what: what(kind),
                    judges,
                });
            }
        }
        for (kind, limit) in [
            ("rateLimit", &spec.rate_limit),
            ("inFlightReq", &spec.in_flight_req),
        ] {
            if let Some(judges) = limit.as_ref().and_then(limited_by) {
                out.address.push(AddressRule {
                    what: what(kind),
                    judges,
                });
            }
        }
        for plugin in spec.plugin.keys() {
            out.address.push(AddressRule {
                what: what(&format!("plugin {plugin}")),
                judges: Judges::Unknown,
            });
        }
        let Some(chain) = &spec.chain else { return };
        if depth >= MAX_CHAIN_DEPTH {
            out.address.push(AddressRule {
                what: format!("{} is nested deeper than {MAX_CHAIN_DEPTH}", what("chain")),
                judges: Judges::Unknown,
            });
            return;
        }
        let by = format!("in chain {ns}/{name}, {by}");
        for r in &chain.middlewares {
            let child_ns = r.namespace.as_deref().unwrap_or(&ns);
            self.by_key_at(child_ns, &r.name, &by, out, depth + 1);
        }
    }

    /// Whether the TLSOption a router names (or Traefik's default one, for routers of a
    /// Traefik Ingress that name none) asks for a client certificate.
    pub fn tls_option(&self, named: Option<&str>, by: &str, out: &mut Demands) {
        let id = match named.map(str::trim).filter(|n| !n.is_empty()) {
            Some(n) => n.rsplit_once('@').map(|(id, _)| id).unwrap_or(n),
            None => DEFAULT_TLS_OPTION,
        };
        out.looked_up.insert(format!("tls {id}"));
        // Traefik drops the default option when two namespaces define one.
        let found = self
            .tls_by_id
            .get(id)
            .map(Vec::as_slice)
            .unwrap_or_default();
        if id == DEFAULT_TLS_OPTION && found.len() > 1 {
            return;
        }
        for t in found.iter().filter(|t| t.asks_for_client_certificate()) {
            let (ns, name) = ns_name(&t.metadata);
            let kind = t
                .spec
                .client_auth
                .as_ref()
                .map(|c| c.client_auth_type.as_str())
                .unwrap_or_default();
            out.client_certificate.push(format!(
                "TLSOption {ns}/{name} (clientAuthType {kind}, {by})"
            ));
        }
    }
}

/// What an `ipStrategy` takes as the client's address (`IPStrategy.Get`: `depth` first, then
/// `excludedIPs`, else the peer).
pub fn strategy(s: Option<&IpStrategy>) -> Judges {
    match s {
        Some(s) if s.depth > 0 => Judges::ForwardedDepth(s.depth),
        Some(s) if !s.excluded_ips.is_empty() => Judges::ForwardedExcluding,
        _ => Judges::Peer,
    }
}

/// What a rate or in-flight limit groups requests by, when that is an address
/// (`GetSourceExtractor`: no criterion at all means the peer's address; a header or the host
/// is not an address).
fn limited_by(l: &SourceLimited) -> Option<Judges> {
    match &l.source_criterion {
        None => Some(Judges::Peer),
        Some(c) if c.ip_strategy.is_some() => Some(strategy(c.ip_strategy.as_ref())),
        Some(c) if !c.request_header_name.is_empty() || c.request_host => None,
        Some(_) => Some(Judges::Peer),
    }
}
