//! Which hosts a listener serves, from Kubernetes objects (an `Http3Listener`, the annotated
//! Ingresses, the annotated HTTPRoutes and Gateways of [`super::gateway`], and the TLS Secrets
//! they reference). Pure: the caller owns the watches.
//!
//! The operator resolves every host here ([`resolve_hosts`]): which Secret serves it, or why it
//! cannot be served. It then hands the served hosts and their certificates to the data plane
//! (`api::mirror`), which never reads these objects itself.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Secret;
use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass, IngressSpec, IngressTLS};

use super::gateway::{wanted_from_gateway_api, GatewayObjects};
pub use super::wanted::{CertSource, GatewayOrigin, WantedHost};
use super::{host_matches, HostEntry, HostError};
use crate::api::{annotations, host_states, reasons, HostReport, Http3Listener, SecretRef};

/// The pre-`ingressClassName` way of naming the class; controllers still honour it.
pub const LEGACY_INGRESS_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
/// The annotation that marks the cluster's default IngressClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";
/// Keys of a `kubernetes.io/tls` Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
pub const TLS_KEY_KEY: &str = "tls.key";

/// Secrets by `(namespace, name)`, as the caller fetched or watched them.
pub type SecretMap = BTreeMap<(String, String), Secret>;

/// `namespace/name` of an Ingress, the form used in status and events.
pub fn ingress_key(ing: &Ingress) -> String {
    format!(
        "{}/{}",
        ing.metadata.namespace.as_deref().unwrap_or_default(),
        ing.metadata.name.as_deref().unwrap_or_default()
    )
}

fn annotation<'a>(ing: &'a Ingress, key: &str) -> Option<&'a str> {
    ing.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(|s| s.trim())
}

/// `h3-ingress.dev/enabled: "true"` (any case). Anything else, including absence, is off.
pub fn is_enabled(ing: &Ingress) -> bool {
    annotation(ing, annotations::ENABLED).is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// The Ingress's class: `spec.ingressClassName`, else the legacy annotation.
pub fn ingress_class(ing: &Ingress) -> Option<&str> {
    ing.spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| annotation(ing, LEGACY_INGRESS_CLASS_ANNOTATION))
        .filter(|s| !s.is_empty())
}

/// The cluster's default IngressClass: the one annotated `is-default-class: "true"`. None when
/// there is none, or more than one (Kubernetes then refuses class-less Ingresses, and so do we:
/// guessing would serve an Ingress its TCP ingress may not).
pub fn default_class<'a>(classes: impl IntoIterator<Item = &'a IngressClass>) -> Option<String> {
    let mut defaults = classes.into_iter().filter(|c| {
        c.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    });
    let first = defaults.next()?;
    match defaults.next() {
        Some(_) => None,
        None => first.metadata.name.clone(),
    }
}

/// The Ingresses as the listeners see them: one without a class (neither `ingressClassName`
/// nor the legacy annotation) belongs to the default class, as the TCP ingress controller of
/// that class treats it (and as Kubernetes's DefaultIngressClass admission writes it into new
/// Ingresses). Only those are copied; every other Ingress is passed through.
pub fn with_default_class(ingresses: &[Arc<Ingress>], default: Option<&str>) -> Vec<Arc<Ingress>> {
    let Some(default) = default else {
        return ingresses.to_vec();
    };
    ingresses
        .iter()
        .map(|i| {
            if ingress_class(i).is_some() {
                return i.clone();
            }
            let mut owned = (**i).clone();
            owned
                .spec
                .get_or_insert_with(IngressSpec::default)
                .ingress_class_name = Some(default.to_string());
            Arc::new(owned)
        })
        .collect()
}

/// Whether an enabled Ingress is served by the listener `listener_name` of class
/// `listener_class`. `h3-ingress.dev/listener` names the listener explicitly and then wins over
/// the class, so one Ingress is never served by two listeners.
pub fn targets_listener(ing: &Ingress, listener_name: &str, listener_class: Option<&str>) -> bool {
    if !is_enabled(ing) {
        return false;
    }
    match annotation(ing, annotations::LISTENER).filter(|s| !s.is_empty()) {
        Some(named) => named == listener_name,
        None => match (listener_class, ingress_class(ing)) {
            (Some(want), Some(have)) => want == have,
            _ => false,
        },
    }
}

/// The hosts an Ingress asks for, with where each one's certificate lives. Pure annotation and
/// `spec.tls` rules; says nothing about whether the Ingress targets a given listener.
pub fn wanted_hosts(ing: &Ingress) -> Vec<WantedHost> {
    let key = ingress_key(ing);
    let ns = ing.metadata.namespace.clone().unwrap_or_default();
    let tls = ing
        .spec
        .as_ref()
        .and_then(|s| s.tls.as_deref())
        .unwrap_or_default();
    let own = own_hosts(ing);
    let narrowed = narrowed_hosts(ing);
    let names = narrowed.clone().unwrap_or_else(|| own.clone());
    names
        .into_iter()
        .map(|name| {
            let cert = if narrowed.is_some() && !own.iter().any(|o| o.eq_ignore_ascii_case(&name)) {
                CertSource::NoTls(format!(
                    "{name} is listed in {} but is not a host of Ingress {key}",
                    annotations::HOSTS
                ))
            } else {
                tls_cert_source(tls, &name, &key, &ns)
            };
            WantedHost {
                name,
                ingress: Some(key.clone()),
                gateway: None,
                cert,
            }
        })
        .collect()
}

/// Every host the Ingress names (rules, then `spec.tls`), in first-seen order, once
/// (case-insensitively).
fn own_hosts(ing: &Ingress) -> Vec<String> {
    let spec = ing.spec.as_ref();
    let rule_hosts = spec
        .and_then(|s| s.rules.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|r| r.host.as_deref());
    let tls_hosts = spec
        .and_then(|s| s.tls.as_deref())
        .unwrap_or_default()
        .iter()
        .flat_map(|t| t.hosts.as_deref().unwrap_or_default())
        .map(|s| s.as_str());
    let mut own: Vec<String> = Vec::new();
    for h in rule_hosts.chain(tls_hosts).map(str::trim) {
        if !h.is_empty() && !own.iter().any(|o| o.eq_ignore_ascii_case(h)) {
            own.push(h.to_string());
        }
    }
    own
}

/// The `h3-ingress.dev/hosts` list, deduplicated; `None` without the annotation.
fn narrowed_hosts(ing: &Ingress) -> Option<Vec<String>> {
    annotation(ing, annotations::HOSTS).map(|list| {
        let mut out: Vec<String> = Vec::new();
        for h in list.split(',').map(str::trim).filter(|h| !h.is_empty()) {
            if !out.iter().any(|o| o.eq_ignore_ascii_case(h)) {
                out.push(h.to_string());
            }
        }
        out
    })
}

/// The Secret of the `spec.tls` entry that covers `name`; an exact entry beats a wildcard
/// entry, as in the TCP ingress controllers.
fn tls_cert_source(tls: &[IngressTLS], name: &str, ingress: &str, ns: &str) -> CertSource {
    let covers = |t: &&IngressTLS, matches: &dyn Fn(&str) -> bool| {
        t.hosts
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|p| matches(p))
    };
    let entry = tls
        .iter()
        .find(|t| covers(t, &|p| p.eq_ignore_ascii_case(name)))
        .or_else(|| tls.iter().find(|t| covers(t, &|p| host_matches(p, name))));
    match entry {
        None => CertSource::NoTls(format!(
            "{name} has no spec.tls entry in Ingress {ingress}; HTTP/3 needs TLS"
        )),
        Some(t) => match t.secret_name.as_deref().filter(|s| !s.is_empty()) {
            None => CertSource::NoTls(format!(
                "the spec.tls entry for {name} in Ingress {ingress} has no secretName \
                 (the TCP ingress's default certificate is not readable by h3-ingress)"
            )),
            Some(secret) => CertSource::Secret(SecretRef {
                namespace: ns.to_string(),
                name: secret.to_string(),
            }),
        },
    }
}

fn creation_key(ing: &Ingress) -> (Option<i64>, String) {
    (
        ing.metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        ingress_key(ing),
    )
}

/// The Ingresses a listener serves, oldest first (ties by `namespace/name`), so that on a host
/// conflict the Ingress that had the host first keeps it, as ingress-nginx does.
pub fn selected_ingresses<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
) -> Vec<&'a Ingress> {
    let name = listener.metadata.name.as_deref().unwrap_or_default();
    let class = listener.spec.ingress_class_name.as_deref();
    let mut v: Vec<&Ingress> = ingresses
        .into_iter()
        .filter(|i| i.metadata.deletion_timestamp.is_none())
        .filter(|i| targets_listener(i, name, class))
        .collect();
    v.sort_by_key(|a| creation_key(a));
    v
}

/// Everything a listener wants to serve: its own `spec.hosts` first, then the selected
/// Ingresses' hosts, then the Gateway API's (an Ingress keeps a host it had before a route
/// asked for it, which is what a user migrating one object at a time expects).
pub fn wanted_for_listener<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> Vec<WantedHost> {
    let mut out: Vec<WantedHost> = listener
        .spec
        .hosts
        .iter()
        .map(|h| WantedHost {
            name: h.name.clone(),
            ingress: None,
            gateway: None,
            cert: CertSource::Secret(h.secret_ref.clone()),
        })
        .collect();
    for ing in selected_ingresses(listener, ingresses) {
        out.extend(wanted_hosts(ing));
    }
    out.extend(wanted_from_gateway_api(listener, gateway_api));
    out
}

/// The Secrets a listener needs, i.e. the only ones the data plane may read.
pub fn referenced_secrets<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
) -> BTreeSet<SecretRef> {
    wanted_for_listener(listener, ingresses, gateway_api)
        .into_iter()
        .filter_map(|w| match w.cert {
            CertSource::Secret(s) => Some(s),
            CertSource::NoTls(_) | CertSource::Refused { .. } => None,
        })
        .collect()
}

/// A host that can be served, with the Secret whose certificate serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServedHost {
    /// Normalised: lowercase, no trailing dot; possibly `*.domain`.
    pub name: String,
    pub secret: SecretRef,
    /// Where it comes from, as people read it (`Ingress shop/web`).
    pub source: String,
    /// `namespace/name` of the Gateway it comes through (Gateway API hosts).
    pub gateway: Option<String>,
    /// The name of that Gateway's listener (section).
    pub gateway_listener: Option<String>,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Servable {
    /// Whether its chain verifies against the public web roots ([`super::roots`]): Chrome
    /// uses HTTP/3 only then.
    pub public_roots: bool,
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
            public_roots: super::roots::publicly_trusted(cert, host, now_unix),
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
    let g = w.gateway.as_ref();
    HostReport {
        name: normalized(&w.name),
        ingress: w.ingress.clone(),
        http_route: g.and_then(|g| g.http_route.clone()),
        gateway: g.map(|g| g.gateway.clone()),
        gateway_listener: g.map(|g| g.listener.clone()),
        ..Default::default()
    }
}

fn normalized(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// `namespace/name`, the form status and events use.
pub fn secret_key(s: &SecretRef) -> String {
    format!("{}/{}", s.namespace, s.name)
}

fn source_text(w: &WantedHost) -> String {
    match (&w.ingress, &w.gateway) {
        (Some(i), _) => format!("Ingress {i}"),
        (None, Some(g)) => g.text(),
        (None, None) => "spec.hosts".to_string(),
    }
}

/// Resolves every wanted host against the Secrets' certificates. Pure: `now_unix` decides
/// expiry.
pub fn resolve_hosts<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
    certificates: &dyn Certificates,
    now_unix: i64,
) -> ResolvedHosts {
    resolve_wanted(
        wanted_for_listener(listener, ingresses, gateway_api),
        certificates,
        now_unix,
    )
}

/// [`resolve_hosts`] of hosts already gathered.
pub fn resolve_wanted(
    wanted: Vec<WantedHost>,
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
        owners.insert(lower.clone(), (source_text(&w), Some(sref.clone())));
        if let Err(e) = super::hosts::normalize_host_name(&w.name) {
            reports.push(not_serving(&w, Some(sref), e.reason(), e.to_string()));
            continue;
        }
        match certificates.check(sref, &lower, now_unix) {
            Ok(servable) => {
                reports.push(HostReport {
                    state: host_states::SERVING.to_string(),
                    reason: reasons::SERVING.to_string(),
                    secret: Some(secret_key(sref)),
                    public_roots: Some(servable.public_roots),
                    ..report_of(&w)
                });
                served.push(ServedHost {
                    name: lower,
                    secret: sref.clone(),
                    source: source_text(&w),
                    gateway: w.gateway.as_ref().map(|g| g.gateway.clone()),
                    gateway_listener: w.gateway.as_ref().map(|g| g.listener.clone()),
                });
            }
            Err((reason, message)) => reports.push(not_serving(&w, Some(sref), reason, message)),
        }
    }
    reports.sort_by(|a, b| report_order(a).cmp(&report_order(b)));
    ResolvedHosts { served, reports }
}

type ReportOrder<'a> = (
    &'a str,
    &'a Option<String>,
    &'a Option<String>,
    &'a Option<String>,
    &'a Option<String>,
);

fn report_order(h: &HostReport) -> ReportOrder<'_> {
    (
        &h.name,
        &h.ingress,
        &h.http_route,
        &h.gateway,
        &h.gateway_listener,
    )
}

/// The data plane's configuration straight from the objects, as the data plane built it before
/// the operator handed it certificate mirrors; kept for the data plane's old source only.
pub fn from_objects<'a>(
    listener: &Http3Listener,
    ingresses: impl IntoIterator<Item = &'a Ingress>,
    gateway_api: &GatewayObjects,
    secrets: &SecretMap,
    now_unix: i64,
) -> Result<super::ProxyConfig, super::ConfigError> {
    let resolved = resolve_hosts(listener, ingresses, gateway_api, secrets, now_unix);
    let mut table = super::HostTable::default();
    for h in &resolved.served {
        let key = (h.secret.namespace.clone(), h.secret.name.clone());
        let pair = secrets.get(&key).and_then(tls_pair);
        if let Some(Ok(entry)) = pair.map(|(c, k)| HostEntry::from_pem(&h.name, c, k, now_unix)) {
            table.insert(entry);
        }
    }
    let mut config = super::build(super::Settings::from(&listener.spec), table, "spec")?;
    config.host_reports = resolved.reports;
    Ok(config)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{Http3ListenerSpec, ListenerHost};
    use k8s_openapi::api::networking::v1::{IngressRule, IngressSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use k8s_openapi::ByteString;

    fn none() -> GatewayObjects {
        GatewayObjects::default()
    }

    pub(crate) fn now() -> i64 {
        super::super::file::unix_now()
    }

    pub(crate) fn listener(name: &str, class: Option<&str>) -> Http3Listener {
        let spec: Http3ListenerSpec = serde_json::from_value(serde_json::json!({
            "upstream": {"address": "ingress-nginx.ingress:443"}
        }))
        .unwrap();
        let mut l = Http3Listener::new(name, spec);
        l.spec.ingress_class_name = class.map(str::to_string);
        l
    }

    struct Ing {
        ns: &'static str,
        name: &'static str,
        class: Option<&'static str>,
        ann: Vec<(&'static str, &'static str)>,
        rules: Vec<&'static str>,
        tls: Vec<(Vec<&'static str>, Option<&'static str>)>,
        created: i64,
    }

    impl Default for Ing {
        fn default() -> Self {
            Ing {
                ns: "default",
                name: "web",
                class: Some("nginx"),
                ann: vec![(annotations::ENABLED, "true")],
                rules: vec![],
                tls: vec![],
                created: 1_700_000_000,
            }
        }
    }

    impl Ing {
        fn build(self) -> Ingress {
            Ingress {
                metadata: ObjectMeta {
                    namespace: Some(self.ns.into()),
                    name: Some(self.name.into()),
                    annotations: Some(
                        self.ann
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_string()))
                            .collect(),
                    ),
                    creation_timestamp: Some(Time(
                        k8s_openapi::jiff::Timestamp::from_second(self.created).unwrap(),
                    )),
                    ..Default::default()
                },
                spec: Some(IngressSpec {
                    ingress_class_name: self.class.map(str::to_string),
                    rules: Some(
                        self.rules
                            .iter()
                            .map(|h| IngressRule {
                                host: Some(h.to_string()),
                                http: None,
                            })
                            .collect(),
                    ),
                    tls: Some(
                        self.tls
                            .iter()
                            .map(|(hosts, secret)| IngressTLS {
                                hosts: Some(hosts.iter().map(|s| s.to_string()).collect()),
                                secret_name: secret.map(str::to_string),
                            })
                            .collect(),
                    ),
                    default_backend: None,
                }),
                status: None,
            }
        }
    }

    pub(crate) fn tls_secret(ns: &str, name: &str, hosts: &[&str]) -> ((String, String), Secret) {
        let (c, k) = crate::config::hosts::tests::self_signed(hosts);
        let mut data = BTreeMap::new();
        data.insert(TLS_CERT_KEY.to_string(), ByteString(c.into_bytes()));
        data.insert(TLS_KEY_KEY.to_string(), ByteString(k.into_bytes()));
        (
            (ns.to_string(), name.to_string()),
            Secret {
                metadata: ObjectMeta {
                    namespace: Some(ns.into()),
                    name: Some(name.into()),
                    ..Default::default()
                },
                data: Some(data),
                type_: Some("kubernetes.io/tls".into()),
                ..Default::default()
            },
        )
    }

    pub(crate) fn by_name(r: &ResolvedHosts, name: &str) -> Vec<(String, String)> {
        r.reports
            .iter()
            .filter(|h| h.name == name)
            .map(|h| (h.state.clone(), h.reason.clone()))
            .collect()
    }

    #[test]
    fn enabled_annotation_is_off_by_default_and_only_true_turns_it_on() {
        let mut ing = Ing {
            ann: vec![],
            ..Default::default()
        }
        .build();
        assert!(!is_enabled(&ing));
        for (v, want) in [
            ("true", true),
            ("True", true),
            (" true ", true),
            ("yes", false),
            ("false", false),
            ("", false),
        ] {
            ing.metadata.annotations = Some(
                [(annotations::ENABLED.to_string(), v.to_string())]
                    .into_iter()
                    .collect(),
            );
            assert_eq!(is_enabled(&ing), want, "{v:?}");
        }
    }

    #[test]
    fn class_or_listener_annotation_selects_the_listener() {
        let by_class = Ing::default().build();
        assert!(targets_listener(&by_class, "public", Some("nginx")));
        assert!(!targets_listener(&by_class, "public", Some("haproxy")));
        assert!(!targets_listener(&by_class, "public", None));

        let legacy = Ing {
            class: None,
            ann: vec![
                (annotations::ENABLED, "true"),
                (LEGACY_INGRESS_CLASS_ANNOTATION, "nginx"),
            ],
            ..Default::default()
        }
        .build();
        assert_eq!(ingress_class(&legacy), Some("nginx"));
        assert!(targets_listener(&legacy, "public", Some("nginx")));

        // The named listener wins over the class, in both directions.
        let named = Ing {
            ann: vec![
                (annotations::ENABLED, "true"),
                (annotations::LISTENER, "internal"),
            ],
            ..Default::default()
        }
        .build();
        assert!(targets_listener(&named, "internal", None));
        assert!(!targets_listener(&named, "public", Some("nginx")));

        let disabled = Ing {
            ann: vec![(annotations::LISTENER, "internal")],
            ..Default::default()
        }
        .build();
        assert!(!targets_listener(&disabled, "internal", None));
    }

    #[test]
    fn hosts_annotation_narrows_and_unknown_hosts_are_reported() {
        let ing = Ing {
            ann: vec![
                (annotations::ENABLED, "true"),
                (
                    annotations::HOSTS,
                    "b.example.com, C.example.com,,nope.example.com",
                ),
            ],
            rules: vec!["a.example.com", "b.example.com", "c.example.com"],
            tls: vec![(
                vec!["a.example.com", "b.example.com", "c.example.com"],
                Some("web-tls"),
            )],
            ..Default::default()
        }
        .build();
        let w = wanted_hosts(&ing);
        let names: Vec<_> = w.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["b.example.com", "C.example.com", "nope.example.com"]
        );
        assert!(
            matches!(&w[0].cert, CertSource::Secret(s) if s.name == "web-tls" && s.namespace == "default")
        );
        assert!(matches!(&w[1].cert, CertSource::Secret(_)));
        assert!(matches!(&w[2].cert, CertSource::NoTls(m) if m.contains("h3-ingress.dev/hosts")));
    }

    #[test]
    fn tls_entries_map_hosts_to_secrets_exact_before_wildcard() {
        let ing = Ing {
            rules: vec![
                "a.example.com",
                "b.example.com",
                "plain.example.org",
                "x.y.example.com",
            ],
            tls: vec![
                (vec!["*.example.com"], Some("wild")),
                (vec!["a.example.com"], Some("a-tls")),
                (vec!["nosecret.example.com"], None),
            ],
            ..Default::default()
        }
        .build();
        let w = wanted_hosts(&ing);
        let get = |n: &str| w.iter().find(|h| h.name == n).unwrap().cert.clone();
        assert!(matches!(get("a.example.com"), CertSource::Secret(s) if s.name == "a-tls"));
        assert!(matches!(get("b.example.com"), CertSource::Secret(s) if s.name == "wild"));
        assert!(
            matches!(get("plain.example.org"), CertSource::NoTls(m) if m.contains("no spec.tls entry"))
        );
        // A wildcard covers one label only.
        assert!(matches!(get("x.y.example.com"), CertSource::NoTls(_)));
        assert!(
            matches!(get("nosecret.example.com"), CertSource::NoTls(m) if m.contains("no secretName"))
        );
        // The wildcard TLS host itself is wanted too (it appears in spec.tls).
        assert!(matches!(get("*.example.com"), CertSource::Secret(s) if s.name == "wild"));
    }

    #[test]
    fn every_reason_is_reported_per_host() {
        let l = listener("public", Some("nginx"));
        let ing = Ing {
            rules: vec![
                "ok.example.com",
                "notls.example.com",
                "missing.example.com",
                "wrong.example.com",
                "broken.example.com",
            ],
            tls: vec![
                (vec!["ok.example.com"], Some("ok")),
                (vec!["missing.example.com"], Some("missing")),
                (vec!["wrong.example.com"], Some("wrong")),
                (vec!["broken.example.com"], Some("broken")),
            ],
            ..Default::default()
        }
        .build();
        let mut secrets: SecretMap = [
            tls_secret("default", "ok", &["ok.example.com"]),
            tls_secret("default", "wrong", &["other.example.com"]),
        ]
        .into_iter()
        .collect();
        let (k, mut broken) = tls_secret("default", "broken", &["broken.example.com"]);
        broken.data.as_mut().unwrap().remove(TLS_KEY_KEY);
        secrets.insert(k, broken);

        let r = resolve_hosts(&l, [&ing], &none(), &secrets, now());
        assert_eq!(
            r.served.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
            ["ok.example.com"]
        );
        let s = |st: &str, re: &str| vec![(st.to_string(), re.to_string())];
        assert_eq!(
            by_name(&r, "ok.example.com"),
            s("Serving", reasons::SERVING)
        );
        assert_eq!(
            by_name(&r, "notls.example.com"),
            s("NotServing", reasons::NO_TLS)
        );
        assert_eq!(
            by_name(&r, "missing.example.com"),
            s("NotServing", reasons::SECRET_NOT_FOUND)
        );
        assert_eq!(
            by_name(&r, "wrong.example.com"),
            s("NotServing", reasons::CERTIFICATE_DOES_NOT_MATCH_HOST)
        );
        assert_eq!(
            by_name(&r, "broken.example.com"),
            s("NotServing", reasons::CERTIFICATE_INVALID)
        );
        let missing = r
            .reports
            .iter()
            .find(|h| h.name == "missing.example.com")
            .unwrap();
        assert_eq!(missing.message, "Secret default/missing not found");
        assert_eq!(missing.secret.as_deref(), Some("default/missing"));
        assert_eq!(missing.ingress.as_deref(), Some("default/web"));
        let wrong = r
            .reports
            .iter()
            .find(|h| h.name == "wrong.example.com")
            .unwrap();
        assert!(
            wrong.message.contains("other.example.com"),
            "{}",
            wrong.message
        );
        // Sorted by name.
        let names: Vec<_> = r.reports.iter().map(|h| h.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }

    #[test]
    fn conflicting_hosts_go_to_spec_hosts_then_the_oldest_ingress() {
        let mut l = listener("public", Some("nginx"));
        l.spec.hosts.push(ListenerHost {
            name: "pinned.example.com".into(),
            secret_ref: SecretRef {
                namespace: "infra".into(),
                name: "pinned".into(),
            },
        });
        let old = Ing {
            name: "old",
            rules: vec!["shared.example.com", "pinned.example.com"],
            tls: vec![(
                vec!["shared.example.com", "pinned.example.com"],
                Some("old-tls"),
            )],
            created: 100,
            ..Default::default()
        }
        .build();
        let new = Ing {
            name: "new",
            rules: vec!["shared.example.com"],
            tls: vec![(vec!["shared.example.com"], Some("new-tls"))],
            created: 200,
            ..Default::default()
        }
        .build();
        let same = Ing {
            name: "same",
            rules: vec!["shared.example.com"],
            tls: vec![(vec!["shared.example.com"], Some("old-tls"))],
            created: 300,
            ..Default::default()
        }
        .build();
        let secrets: SecretMap = [
            tls_secret("infra", "pinned", &["pinned.example.com"]),
            tls_secret(
                "default",
                "old-tls",
                &["shared.example.com", "pinned.example.com"],
            ),
            tls_secret("default", "new-tls", &["shared.example.com"]),
        ]
        .into_iter()
        .collect();
        // Input order must not matter: newest first here.
        let r = resolve_hosts(&l, [&same, &new, &old], &none(), &secrets, now());
        let shared: Vec<_> = r
            .reports
            .iter()
            .filter(|h| h.name == "shared.example.com")
            .map(|h| (h.ingress.clone().unwrap(), h.reason.clone()))
            .collect();
        assert_eq!(
            shared,
            [
                (
                    "default/new".to_string(),
                    reasons::HOST_CONFLICT.to_string()
                ),
                ("default/old".to_string(), reasons::SERVING.to_string()),
            ],
            "same-secret duplicate is not a conflict and is not listed twice"
        );
        let pinned: Vec<_> = r
            .reports
            .iter()
            .filter(|h| h.name == "pinned.example.com")
            .map(|h| (h.ingress.clone(), h.reason.clone()))
            .collect();
        assert_eq!(
            pinned,
            [
                (None, reasons::SERVING.to_string()),
                (
                    Some("default/old".to_string()),
                    reasons::HOST_CONFLICT.to_string()
                ),
            ]
        );
        let conflict = r
            .reports
            .iter()
            .find(|h| h.reason == reasons::HOST_CONFLICT && h.name == "pinned.example.com")
            .unwrap();
        assert_eq!(
            conflict.message,
            "pinned.example.com is already served from spec.hosts with Secret infra/pinned"
        );
        assert_eq!(r.served.len(), 2);
    }

    #[test]
    fn from_objects_builds_the_file_mode_config_and_fills_reports() {
        let l = listener("public", Some("nginx"));
        let ing = Ing {
            rules: vec!["a.example.com", "b.example.com"],
            tls: vec![(vec!["a.example.com"], Some("a"))],
            ..Default::default()
        }
        .build();
        let other_class = Ing {
            name: "other",
            class: Some("haproxy"),
            rules: vec!["c.example.com"],
            tls: vec![(vec!["c.example.com"], Some("a"))],
            ..Default::default()
        }
        .build();
        let secrets: SecretMap = [tls_secret("default", "a", &["a.example.com"])]
            .into_iter()
            .collect();
        let c = from_objects(&l, [&ing, &other_class], &none(), &secrets, now()).unwrap();
        assert_eq!(c.listen.port, 443);
        assert_eq!(c.upstream.address.host, "ingress-nginx.ingress");
        assert!(c.hosts.lookup("a.example.com").is_some());
        assert_eq!(c.hosts.len(), 1);
        assert_eq!(c.host_reports.len(), 2);
        assert_eq!(c.host_reports[0].ingress.as_deref(), Some("default/web"));
        assert_eq!(c.host_reports[0].secret.as_deref(), Some("default/a"));
        assert_eq!(c.host_reports[1].reason, reasons::NO_TLS);

        let mut bad = l.clone();
        bad.spec.upstream.address = "nope".into();
        let e = from_objects(&bad, [&ing], &none(), &secrets, now()).unwrap_err();
        assert!(e.errors[0].path == "spec.upstream.address", "{e}");
    }

    #[test]
    fn referenced_secrets_are_only_those_of_selected_hosts() {
        let mut l = listener("public", Some("nginx"));
        l.spec.hosts.push(ListenerHost {
            name: "p.example.com".into(),
            secret_ref: SecretRef {
                namespace: "infra".into(),
                name: "p".into(),
            },
        });
        let a = Ing {
            rules: vec!["a.example.com"],
            tls: vec![(vec!["a.example.com"], Some("a"))],
            ..Default::default()
        }
        .build();
        let off = Ing {
            name: "off",
            ann: vec![],
            tls: vec![(vec!["x.example.com"], Some("x"))],
            ..Default::default()
        }
        .build();
        let mut deleting = Ing {
            name: "deleting",
            tls: vec![(vec!["d.example.com"], Some("d"))],
            ..Default::default()
        }
        .build();
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        let refs: Vec<String> = referenced_secrets(&l, [&a, &off, &deleting], &none())
            .iter()
            .map(secret_key)
            .collect();
        assert_eq!(refs, ["default/a", "infra/p"]);
    }

    fn class(name: &str, default: Option<&str>) -> IngressClass {
        IngressClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: default.map(|v| {
                    [(DEFAULT_CLASS_ANNOTATION.to_string(), v.to_string())]
                        .into_iter()
                        .collect()
                }),
                ..Default::default()
            },
            spec: None,
        }
    }

    #[test]
    fn the_default_class_is_the_one_annotated_and_only_if_it_is_alone() {
        let nginx = class("nginx", Some("true"));
        let other = class("other", None);
        let no = class("no", Some("false"));
        assert_eq!(
            default_class([&nginx, &other, &no]).as_deref(),
            Some("nginx")
        );
        assert_eq!(default_class([&other, &no]), None);
        let second = class("second", Some("True"));
        assert_eq!(
            default_class([&nginx, &second]),
            None,
            "two defaults: ambiguous"
        );
    }

    #[test]
    fn an_ingress_without_a_class_is_served_by_the_listener_of_the_default_class() {
        let classless = Arc::new(
            Ing {
                class: None,
                tls: vec![(vec!["a.example.com"], Some("a-tls"))],
                ..Default::default()
            }
            .build(),
        );
        let legacy = Arc::new(
            Ing {
                name: "legacy",
                class: None,
                ann: vec![
                    (annotations::ENABLED, "true"),
                    (LEGACY_INGRESS_CLASS_ANNOTATION, "haproxy"),
                ],
                ..Default::default()
            }
            .build(),
        );
        let nginx = listener("public", Some("nginx"));
        let all = [classless.clone(), legacy.clone()];
        // Without a default class nobody serves the class-less Ingress.
        let seen = with_default_class(&all, None);
        assert!(selected_ingresses(&nginx, seen.iter().map(|i| i.as_ref())).is_empty());
        let seen = with_default_class(&all, Some("nginx"));
        let picked = selected_ingresses(&nginx, seen.iter().map(|i| i.as_ref()));
        assert_eq!(picked.len(), 1);
        assert_eq!(ingress_key(picked[0]), "default/web");
        assert_eq!(
            referenced_secrets(&nginx, seen.iter().map(|i| i.as_ref()), &none())
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<_>>(),
            ["a-tls"]
        );
        // The legacy annotation is a class: it stays haproxy's, and is not copied.
        assert!(Arc::ptr_eq(&seen[1], &legacy));
        assert_eq!(ingress_class(&seen[1]), Some("haproxy"));
    }
}
