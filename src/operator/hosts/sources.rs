//! What each object says of its hosts' policy ([`super::policy`]): an Ingress's annotations
//! (and the Traefik objects they name), an HTTPRoute's rules. Pure.

use k8s_openapi::api::networking::v1::Ingress;

use super::ingress::ingress_key;
use super::policy::{gateway_duration, keys, nginx_time, AddressRule, Judges, SourcePolicy};
use super::policy::{Timed, Timeouts};
use super::traefik::{alt_svc_reference, Demands, Index};
use crate::api::bounds;
use crate::api::gateway::{HTTPRoute, HTTPRouteRule};
use crate::api::traefik::GROUP as TRAEFIK_GROUP;

fn annotations(ing: &Ingress) -> impl Iterator<Item = (&str, &str)> {
    ing.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.trim()))
}

fn get<'a>(ing: &'a Ingress, key: &str) -> Option<&'a str> {
    annotations(ing).find(|(k, _)| *k == key).map(|(_, v)| v)
}

/// Whether an Ingress carries any annotation the policy reads, so a change of an Ingress that
/// is not switched on for HTTP/3 concerns the listeners serving its hosts only then.
pub fn has_policy_annotations(ing: &Ingress) -> bool {
    annotations(ing).any(|(k, _)| {
        k.starts_with(keys::NGINX)
            || k.starts_with(keys::NGINX_ORG)
            || k.starts_with(keys::HAPROXY)
            || k == keys::TRAEFIK_ROUTER_MIDDLEWARES
            || k == keys::TRAEFIK_SERVICE_MIDDLEWARES
            || k == keys::TRAEFIK_ROUTER_TLS_OPTIONS
    })
}

/// nginx directives (and variables) of a snippet that judge the client's address or ask for
/// a client certificate: a snippet is free text, so it is searched statement by statement.
const SNIPPET_ADDRESS: &[&str] = &["allow", "deny", "limit_req", "limit_conn", "geo", "geoip"];
const SNIPPET_ADDRESS_VARIABLES: &[&str] = &["$remote_addr", "$binary_remote_addr"];
const SNIPPET_CLIENT_CERTIFICATE: &str = "ssl_verify_client";

/// What a snippet asks for: `(judges the address, asks for a client certificate)`.
pub fn snippet_demands(text: &str) -> (bool, bool) {
    let mut address = false;
    let mut certificate = false;
    for statement in text.split([';', '{', '}', '\n']) {
        let statement = statement.trim();
        let directive = statement.split_whitespace().next().unwrap_or_default();
        address |= SNIPPET_ADDRESS.contains(&directive)
            || SNIPPET_ADDRESS_VARIABLES
                .iter()
                .any(|v| statement.contains(v));
        let value = statement.split_whitespace().nth(1);
        certificate |= directive == SNIPPET_CLIENT_CERTIFICATE && value != Some("off");
    }
    (address, certificate)
}

/// A timeout annotation in whole seconds (ingress-nginx) or nginx time syntax (F5 NGINX IC);
/// anything else is a note naming the annotation.
fn timeout(
    ing: &Ingress,
    key: &str,
    parse: fn(&str) -> Option<u64>,
    syntax: &str,
    notes: &mut Vec<String>,
) -> Option<Timed> {
    let value = get(ing, key)?;
    match parse(value) {
        Some(seconds) => Some(Timed {
            seconds,
            from: format!("{key}: {value:?} on Ingress {}", ingress_key(ing)),
        }),
        None => {
            notes.push(format!(
                "{key}: {value:?} on Ingress {} is not {syntax}: ignored, the listener's \
                 setting applies",
                ingress_key(ing)
            ));
            None
        }
    }
}

fn whole_seconds(v: &str) -> Option<u64> {
    v.parse().ok()
}

/// The timeouts of an Ingress: nginx's `proxy_read_timeout` is the time between two reads
/// from the upstream (so both to the headers and between body bytes), `proxy_send_timeout`
/// between two writes to it (the nearest to a request body's idle time).
fn ingress_timeouts(ing: &Ingress, notes: &mut Vec<String>) -> Timeouts {
    let nginx = |k: &str| format!("{}{k}", keys::NGINX);
    let org = |k: &str| format!("{}{k}", keys::NGINX_ORG);
    const WHOLE: &str = "a whole number of seconds";
    const TIME: &str = "an nginx time (60s, 1m30s)";
    let read = [
        timeout(
            ing,
            &nginx(keys::NGINX_PROXY_READ_TIMEOUT),
            whole_seconds,
            WHOLE,
            notes,
        ),
        timeout(
            ing,
            &org(keys::NGINX_ORG_PROXY_READ_TIMEOUT),
            nginx_time,
            TIME,
            notes,
        ),
    ];
    let send = [
        timeout(
            ing,
            &nginx(keys::NGINX_PROXY_SEND_TIMEOUT),
            whole_seconds,
            WHOLE,
            notes,
        ),
        timeout(
            ing,
            &org(keys::NGINX_ORG_PROXY_SEND_TIMEOUT),
            nginx_time,
            TIME,
            notes,
        ),
    ];
    let largest = |v: [Option<Timed>; 2]| v.into_iter().flatten().max_by_key(|t| t.seconds);
    let read = largest(read);
    Timeouts {
        response: read.clone(),
        response_body_idle: read,
        request_body_idle: largest(send),
    }
}

/// A client-address annotation is off when empty, or `"0"` for a limit.
fn address_annotation_on(value: &str) -> bool {
    !value.is_empty() && value != "0"
}

/// The nginx-family and HAProxy annotations of an Ingress.
fn controller_annotations(ing: &Ingress, out: &mut SourcePolicy) {
    let on = format!("on Ingress {}", ingress_key(ing));
    let rule = |key: &str, value: &str| AddressRule {
        what: format!("{key}: {value:?} {on}"),
        judges: Judges::ClientAddress,
    };
    for (prefix, names) in [
        (keys::NGINX, keys::NGINX_ADDRESS),
        (keys::HAPROXY, keys::HAPROXY_ADDRESS),
    ] {
        for name in names {
            let key = format!("{prefix}{name}");
            let Some(value) = get(ing, &key).filter(|v| address_annotation_on(v)) else {
                continue;
            };
            let keyed_elsewhere = *name == "global-rate-limit"
                && get(
                    ing,
                    &format!("{prefix}{}", keys::NGINX_GLOBAL_RATE_LIMIT_KEY),
                )
                .is_some_and(|k| !k.contains("remote_addr"));
            if !keyed_elsewhere {
                out.address.push(rule(&key, value));
            }
        }
    }
    let policies = format!("{}{}", keys::NGINX_ORG, keys::NGINX_ORG_POLICIES);
    if let Some(v) = get(ing, &policies).filter(|v| !v.is_empty()) {
        out.address.push(AddressRule {
            what: format!("{policies}: {v:?} {on} (Policy objects are not read)"),
            judges: Judges::ClientAddress,
        });
    }
    let snippets = (keys::NGINX_SNIPPETS.iter().map(|s| (keys::NGINX, s))).chain(
        keys::NGINX_ORG_SNIPPETS
            .iter()
            .map(|s| (keys::NGINX_ORG, s)),
    );
    for (prefix, name) in snippets {
        let key = format!("{prefix}{name}");
        let Some(text) = get(ing, &key) else { continue };
        let (address, certificate) = snippet_demands(text);
        if address {
            out.address.push(AddressRule {
                what: format!("{key} {on} (an address directive)"),
                judges: Judges::ClientAddress,
            });
        }
        if certificate {
            out.client_certificate
                .push(format!("{key} {on} (ssl_verify_client)"));
        }
    }
    nginx_tls(ing, &on, out);
}

/// ingress-nginx's client certificates (`auth-tls-secret` turns verification on, `on` by
/// default; `off` leaves it off) and TLS passthrough.
fn nginx_tls(ing: &Ingress, on: &str, out: &mut SourcePolicy) {
    let key = |k: &str| format!("{}{k}", keys::NGINX);
    let verify_key = key(keys::NGINX_AUTH_TLS_VERIFY_CLIENT);
    let verify = get(ing, &verify_key).map(str::to_ascii_lowercase);
    let secret = get(ing, &key(keys::NGINX_AUTH_TLS_SECRET)).filter(|s| !s.is_empty());
    match (verify.as_deref(), secret) {
        (Some("off"), _) | (None, None) => {}
        (Some(v), _) => out
            .client_certificate
            .push(format!("{verify_key}: {v:?} {on}")),
        (None, Some(s)) => out.client_certificate.push(format!(
            "{}: {s:?} {on} (verification on by default)",
            key(keys::NGINX_AUTH_TLS_SECRET)
        )),
    }
    let passthrough = key(keys::NGINX_SSL_PASSTHROUGH);
    if get(ing, &passthrough).is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        out.passthrough
            .push(format!("{passthrough}: \"true\" {on}"));
    }
}

/// The Traefik objects an Ingress's router names. `traefik_class`: the Ingress's class is
/// Traefik's, so Traefik's default TLSOption applies when the Ingress names none.
fn traefik_annotations(ing: &Ingress, index: &Index, traefik_class: bool, out: &mut Demands) {
    let on = format!("Ingress {}", ingress_key(ing));
    for key in [
        keys::TRAEFIK_ROUTER_MIDDLEWARES,
        keys::TRAEFIK_SERVICE_MIDDLEWARES,
    ] {
        if let Some(names) = get(ing, key) {
            let short = key.rsplit('/').next().unwrap_or(key);
            // The operator's own Alt-Svc Middleware judges no address; until the cache holds
            // it (it was written a moment before the Ingress named it) it is not "missing".
            let ns = ing.metadata.namespace.as_deref().unwrap_or_default();
            let name = ing.metadata.name.as_deref().unwrap_or_default();
            let names: Vec<&str> = (names.split(','))
                .filter(|r| index.knows(r) || r.trim() != alt_svc_reference(ns, name))
                .collect();
            index.by_names(&names.join(","), &format!("{short} of {on}"), out);
        }
    }
    let named = get(ing, keys::TRAEFIK_ROUTER_TLS_OPTIONS);
    if named.is_some() || traefik_class {
        index.tls_option(named, &format!("router of {on}"), out);
    }
}

/// An Ingress's policy for all its hosts, and the Traefik names it looked up.
pub fn ingress_policy(
    ing: &Ingress,
    index: &Index,
    traefik_class: bool,
) -> (SourcePolicy, std::collections::BTreeSet<String>) {
    let mut out = SourcePolicy::default();
    out.timeouts = ingress_timeouts(ing, &mut out.notes);
    controller_annotations(ing, &mut out);
    let mut demands = Demands::default();
    traefik_annotations(ing, index, traefik_class, &mut demands);
    out.address.extend(demands.address);
    out.client_certificate.extend(demands.client_certificate);
    (out, demands.looked_up)
}

/// One HTTPRoute rule's timeouts: `backendRequest`, else `request`, for the response and the
/// time between its body bytes (a total bounds every gap in it); `0s` (none) is the largest
/// h3-ingress allows.
fn rule_timeouts(route: &str, rule: &HTTPRouteRule, notes: &mut Vec<String>) -> Timeouts {
    let Some(t) = &rule.timeouts else {
        return Timeouts::default();
    };
    let (field, value) = match (&t.backend_request, &t.request) {
        (Some(b), _) => ("timeouts.backendRequest", b),
        (None, Some(r)) => ("timeouts.request", r),
        (None, None) => return Timeouts::default(),
    };
    let from = format!("{field}: {value:?} of HTTPRoute {route}");
    let seconds = match gateway_duration(value) {
        Some(Some(s)) => s,
        Some(None) => {
            let most = bounds::RESPONSE_TIMEOUT_SECONDS.max;
            notes.push(format!(
                "{from} is no timeout at all: h3-ingress allows at most {most} s"
            ));
            most
        }
        None => {
            notes.push(format!(
                "{from} is not a Gateway API duration (1h, 10m30s, 500ms): ignored"
            ));
            return Timeouts::default();
        }
    };
    let timed = Some(Timed { seconds, from });
    Timeouts {
        response: timed.clone(),
        response_body_idle: timed,
        request_body_idle: None,
    }
}

/// An HTTPRoute's policy: one source per rule (the rules of a host's paths are merged like
/// Ingresses), with the Traefik Middlewares its `ExtensionRef` filters name.
pub fn route_policy(
    route: &HTTPRoute,
    index: &Index,
) -> (Vec<SourcePolicy>, std::collections::BTreeSet<String>) {
    let ns = route.metadata.namespace.clone().unwrap_or_default();
    let key = format!(
        "{ns}/{}",
        route.metadata.name.as_deref().unwrap_or_default()
    );
    let mut looked_up = std::collections::BTreeSet::new();
    let mut rules = route.spec.rules.clone();
    if rules.is_empty() {
        // A route without rules still has one (the default backend, in Gateway API terms).
        rules.push(HTTPRouteRule::default());
    }
    let sources = rules
        .iter()
        .map(|rule| {
            let mut out = SourcePolicy::default();
            out.timeouts = rule_timeouts(&key, rule, &mut out.notes);
            let mut demands = Demands::default();
            for f in rule.filters.iter().filter_map(|f| f.extension_ref.as_ref()) {
                if f.group == TRAEFIK_GROUP && f.kind == "Middleware" {
                    let by = format!("ExtensionRef of HTTPRoute {key}");
                    index.by_key(&ns, &f.name, &by, &mut demands);
                }
            }
            out.address.extend(demands.address);
            looked_up.extend(demands.looked_up);
            out
        })
        .collect();
    (sources, looked_up)
}
