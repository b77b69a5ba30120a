//! Tests of the per-host policy: annotations, Traefik objects, HTTPRoute timeouts, verdicts
//! and what resolution makes of them.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::api::gateway::HTTPRoute;
use crate::api::traefik::{Middleware, TLSOption};
use crate::api::{annotations, host_states};
use crate::operator::hosts::fixtures::{listener, none, now, tls_secret, Ing};
use crate::operator::hosts::resolve::{resolve_wanted, SecretMap};
use crate::operator::hosts::sources::{ingress_policy, route_policy, snippet_demands};
use crate::operator::hosts::traefik::{Index, TraefikObjects};
use crate::operator::hosts::{policies_for_listener, wanted_for_listener};

const WL: &str = "nginx.ingress.kubernetes.io/whitelist-source-range";
const READ: &str = "nginx.ingress.kubernetes.io/proxy-read-timeout";
const SEND: &str = "nginx.ingress.kubernetes.io/proxy-send-timeout";
const MIDDLEWARES: &str = keys::TRAEFIK_ROUTER_MIDDLEWARES;

fn ing(ann: Vec<(&'static str, &'static str)>) -> k8s_openapi::api::networking::v1::Ingress {
    let mut all = vec![(annotations::ENABLED, "true")];
    all.extend(ann);
    Ing {
        ann: all,
        rules: vec!["a.example.com"],
        tls: vec![(vec!["a.example.com"], Some("a-tls"))],
        ..Default::default()
    }
    .build()
}

fn middleware(ns: &str, name: &str, spec: serde_json::Value) -> Arc<Middleware> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name}, "spec": spec
        }))
        .unwrap(),
    )
}

fn tls_option(ns: &str, name: &str, client_auth_type: &str) -> Arc<TLSOption> {
    Arc::new(
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"clientAuth": {"clientAuthType": client_auth_type}}
        }))
        .unwrap(),
    )
}

fn traefik(middlewares: Vec<Arc<Middleware>>, tls: Vec<Arc<TLSOption>>) -> TraefikObjects {
    TraefikObjects {
        middlewares,
        tls_options: tls,
        readable: true,
    }
}

/// One Ingress's policy as the host's whole policy.
fn host_policy(i: &k8s_openapi::api::networking::v1::Ingress, t: &TraefikObjects) -> HostPolicy {
    let (source, _) = ingress_policy(i, &Index::new(t), false);
    let mut h = HostPolicy::default();
    h.add(&source);
    h
}

fn policies(h: HostPolicy, passing: Passing) -> Policies {
    let l = listener("public", Some("nginx"));
    Policies {
        by_host: [("a.example.com".to_string(), h)].into_iter().collect(),
        passing,
        ..Policies::none(&l)
    }
}

#[test]
fn nginx_times_and_gateway_durations_parse_as_their_owners_do() {
    for (text, want) in [
        ("60", Some(60)),
        ("60s", Some(60)),
        ("1m30s", Some(90)),
        ("1h 30m", Some(5400)),
        ("1500ms", Some(2)),
        ("2d", Some(172_800)),
        ("", None),
        ("ten", None),
        ("5x", None),
        ("-1", None),
        ("99999999999999999999", None),
        ("999999999999y", None),
    ] {
        assert_eq!(nginx_time(text), want, "{text:?}");
    }
    for (text, want) in [
        ("10s", Some(Some(10))),
        ("1h30m", Some(Some(5400))),
        ("500ms", Some(Some(1))),
        ("0s", Some(None)),
        ("1h1m1s1ms", Some(Some(3662))),
        ("1h1m1s1ms1h", None),
        ("123456s", None),
        ("10", None),
        ("", None),
        ("1d", None),
    ] {
        assert_eq!(gateway_duration(text), want, "{text:?}");
    }
}

#[test]
fn an_allowlist_holds_the_host_back_until_the_ingress_gets_the_address() {
    let p = host_policy(&ing(vec![(WL, "10.0.0.0/8")]), &TraefikObjects::default());
    let (reason, message) = hold_back(&p, Passing::UntrustedHeaders).unwrap();
    assert_eq!(reason, reasons::CLIENT_ADDRESS_POLICY);
    assert!(message.starts_with(&format!("{WL}: \"10.0.0.0/8\" on Ingress default/web")));
    assert!(message.contains("clientAddress.trusted: true"), "{message}");
    assert_eq!(hold_back(&p, Passing::TrustedHeaders), None);
    assert_eq!(hold_back(&p, Passing::ProxyProtocol), None);
    // Empty values and zero limits are off, as the controllers read them.
    for off in [
        vec![(WL, "")],
        vec![("nginx.ingress.kubernetes.io/limit-rps", "0")],
    ] {
        let p = host_policy(&ing(off), &TraefikObjects::default());
        assert!(p.address.is_empty(), "{p:?}");
    }
    for on in [
        "nginx.ingress.kubernetes.io/allowlist-source-range",
        "nginx.ingress.kubernetes.io/denylist-source-range",
        "nginx.ingress.kubernetes.io/limit-connections",
        "nginx.ingress.kubernetes.io/limit-rpm",
        "nginx.ingress.kubernetes.io/global-rate-limit",
        "haproxy.org/allow-list",
        "nginx.org/policies",
    ] {
        let p = host_policy(&ing(vec![(on, "5")]), &TraefikObjects::default());
        assert_eq!(p.address.len(), 1, "{on}");
        assert!(hold_back(&p, Passing::UntrustedHeaders).is_some(), "{on}");
    }
    // A global rate limit keyed by something else than the address does not count.
    let p = host_policy(
        &ing(vec![
            ("nginx.ingress.kubernetes.io/global-rate-limit", "100"),
            (
                "nginx.ingress.kubernetes.io/global-rate-limit-key",
                "$http_x_api_client",
            ),
        ]),
        &TraefikObjects::default(),
    );
    assert!(p.address.is_empty());
}

#[test]
fn a_malformed_timeout_is_named_and_loses_nothing_else() {
    let i = ing(vec![(READ, "ten"), (SEND, "120"), (WL, "10.0.0.0/8")]);
    let p = host_policy(&i, &TraefikObjects::default());
    assert_eq!(
        p.notes,
        [format!(
            "{READ}: \"ten\" on Ingress default/web is not a whole number of seconds: ignored, \
             the listener's setting applies"
        )]
    );
    assert_eq!(p.address.len(), 1, "the allowlist is still read");
    let (carried, notes) = policies(p, Passing::TrustedHeaders).timeouts("a.example.com");
    assert_eq!(
        carried,
        Carried {
            request_body_idle: Some(120),
            ..Default::default()
        }
    );
    assert_eq!(notes.len(), 1);
    // ingress-nginx takes whole seconds only; F5 NGINX IC takes nginx times.
    let p = host_policy(&ing(vec![(READ, "120s")]), &TraefikObjects::default());
    assert_eq!(p.notes.len(), 1);
    let org = host_policy(
        &ing(vec![("nginx.org/proxy-read-timeout", "2m")]),
        &TraefikObjects::default(),
    );
    let (carried, _) = policies(org, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(carried.response, Some(120));
    // Hostile values: parsed or noted, never a panic.
    for v in [
        "",
        " ",
        "-5",
        "1e9",
        "18446744073709551616",
        "\u{202e}60",
        "6\n0",
        "0x10",
    ] {
        let p = host_policy(&ing(vec![(READ, v)]), &TraefikObjects::default());
        let _ = policies(p, Passing::UntrustedHeaders).timeouts("a.example.com");
    }
}

#[test]
fn timeouts_are_carried_only_when_they_differ_and_within_bounds() {
    let l = listener("public", Some("nginx"));
    let p = host_policy(&ing(vec![(READ, "120")]), &TraefikObjects::default());
    let (carried, notes) = policies(p, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(
        carried,
        Carried {
            response: Some(120),
            response_body_idle: Some(120),
            request_body_idle: None,
        }
    );
    assert!(notes.is_empty());
    assert_eq!(l.spec.upstream.response_timeout_seconds, 60);
    // The listener's own value is not carried.
    let p = host_policy(&ing(vec![(READ, "60")]), &TraefikObjects::default());
    let (carried, _) = policies(p, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(carried, Carried::default());
    // Above the bound: capped, and said.
    let p = host_policy(&ing(vec![(READ, "7200")]), &TraefikObjects::default());
    let (carried, notes) = policies(p, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(carried.response, Some(3600));
    assert!(notes[0].contains("7200 s is above the 3600 s"), "{notes:?}");
    // Two sources: the larger wins, and a source without one has the listener's.
    let mut two = HostPolicy::default();
    for v in ["30", "600"] {
        let (s, _) = ingress_policy(
            &ing(vec![(READ, v)]),
            &Index::new(&TraefikObjects::default()),
            false,
        );
        two.add(&s);
    }
    let (carried, _) = policies(two, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(carried.response, Some(600));
    let mut short = HostPolicy::default();
    for i in [ing(vec![(READ, "30")]), ing(vec![])] {
        let (s, _) = ingress_policy(&i, &Index::new(&TraefikObjects::default()), false);
        short.add(&s);
    }
    let (carried, _) = policies(short, Passing::UntrustedHeaders).timeouts("a.example.com");
    assert_eq!(
        carried.response, None,
        "max(30, the listener's 60) is the listener's"
    );
}

#[test]
fn client_certificates_and_passthrough_are_never_served() {
    let none_t = TraefikObjects::default();
    let verify = "nginx.ingress.kubernetes.io/auth-tls-verify-client";
    for (ann, held) in [
        (vec![(verify, "on")], true),
        (vec![(verify, "optional_no_ca")], true),
        (vec![(verify, "off")], false),
        (
            vec![("nginx.ingress.kubernetes.io/auth-tls-secret", "shop/ca")],
            true,
        ),
        (
            vec![
                ("nginx.ingress.kubernetes.io/auth-tls-secret", "shop/ca"),
                (verify, "off"),
            ],
            false,
        ),
    ] {
        let p = host_policy(&ing(ann.clone()), &none_t);
        let verdict = hold_back(&p, Passing::ProxyProtocol);
        assert_eq!(verdict.is_some(), held, "{ann:?}");
        if held {
            let (reason, message) = verdict.unwrap();
            assert_eq!(reason, reasons::CLIENT_CERTIFICATE_REQUIRED);
            assert!(
                message.contains("nginx.ingress.kubernetes.io/auth-tls-"),
                "{message}"
            );
        }
    }
    let p = host_policy(
        &ing(vec![(
            "nginx.ingress.kubernetes.io/ssl-passthrough",
            "true",
        )]),
        &none_t,
    );
    assert_eq!(
        hold_back(&p, Passing::ProxyProtocol).unwrap().0,
        reasons::TLS_PASSTHROUGH
    );
}

#[test]
fn snippets_are_searched_statement_by_statement() {
    assert_eq!(
        snippet_demands("allow 10.0.0.0/8;\ndeny all;"),
        (true, false)
    );
    assert_eq!(
        snippet_demands("add_header X-Frame-Options DENY; more_set_headers 'Allow: x';"),
        (false, false)
    );
    assert_eq!(
        snippet_demands("if ($remote_addr = 1.2.3.4) { return 403; }"),
        (true, false)
    );
    assert_eq!(snippet_demands("ssl_verify_client on;"), (false, true));
    assert_eq!(snippet_demands("ssl_verify_client off;"), (false, false));
    let p = host_policy(
        &ing(vec![(
            "nginx.ingress.kubernetes.io/configuration-snippet",
            "limit_req zone=one burst=5;",
        )]),
        &TraefikObjects::default(),
    );
    assert_eq!(p.address.len(), 1);
}

/// Traefik v3.7.13's rules for which address a Middleware judges, against each way of
/// passing it (`misjudged`'s table).
#[test]
fn traefik_middlewares_are_judged_by_what_their_ip_strategy_reads() {
    use Passing::*;
    let cases: [(serde_json::Value, [bool; 3]); 8] = [
        // [untrusted headers, trusted headers, PROXY protocol]: held back?
        (
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}}),
            [true, true, false],
        ),
        (
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"], "ipStrategy": {"depth": 1}}}),
            [true, false, true],
        ),
        (
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"], "ipStrategy": {"depth": 2}}}),
            [true, true, true],
        ),
        (
            serde_json::json!({"ipWhiteList": {"sourceRange": ["10.0.0.0/8"], "ipStrategy": {"excludedIPs": ["10.9.0.0/16"]}}}),
            [true, false, true],
        ),
        (
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"], "ipStrategy": {"ipv6Subnet": 64}}}),
            [true, true, false],
        ),
        (
            serde_json::json!({"rateLimit": {"average": 10}}),
            [true, true, false],
        ),
        (
            serde_json::json!({"inFlightReq": {"amount": 10, "sourceCriterion": {"requestHeaderName": "X-Api-Key"}}}),
            [false, false, false],
        ),
        (
            serde_json::json!({"plugin": {"geoblock": {}}}),
            [true, true, false],
        ),
    ];
    for (spec, held) in cases {
        let t = traefik(vec![middleware("shop", "guard", spec.clone())], vec![]);
        let p = host_policy(&ing(vec![(MIDDLEWARES, "shop-guard@kubernetescrd")]), &t);
        for (passing, want) in [UntrustedHeaders, TrustedHeaders, ProxyProtocol]
            .iter()
            .zip(held)
        {
            let verdict = hold_back(&p, *passing);
            assert_eq!(
                verdict.is_some(),
                want,
                "{spec} with {passing:?}: {verdict:?}"
            );
            if let Some((reason, message)) = verdict {
                assert_eq!(reason, reasons::CLIENT_ADDRESS_POLICY);
                assert!(message.starts_with("Middleware shop/guard ("), "{message}");
            }
        }
    }
    // The message for the default strategy says what to set.
    let t = traefik(
        vec![middleware(
            "shop",
            "guard",
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}}),
        )],
        vec![],
    );
    let p = host_policy(&ing(vec![(MIDDLEWARES, "shop-guard@kubernetescrd")]), &t);
    let (_, message) = hold_back(&p, TrustedHeaders).unwrap();
    assert!(message.contains("ipStrategy.depth: 1"), "{message}");
}

#[test]
fn middleware_names_follow_traefiks_naming_and_chains_are_followed() {
    let allow = serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}});
    let t = traefik(
        vec![
            middleware("my.shop", "ip_guard", allow.clone()),
            middleware(
                "shop",
                "outer",
                serde_json::json!({"chain": {"middlewares": [
                {"name": "inner"}]}}),
            ),
            middleware(
                "shop",
                "inner",
                serde_json::json!({"chain": {"middlewares": [
                {"name": "ip_guard", "namespace": "my.shop"}, {"name": "outer"}]}}),
            ),
            middleware(
                "shop",
                "headers",
                serde_json::json!({"headers": {"customRequestHeaders": {"a": "b"}}}),
            ),
        ],
        vec![],
    );
    // Legacy (normalised) and safe names both find it.
    for name in [
        "my-shop-ip-guard@kubernetescrd",
        "my.shop_ip_guard@kubernetescrd",
    ] {
        let p = host_policy(&ing(vec![(MIDDLEWARES, name)]), &t);
        assert_eq!(p.address.len(), 1, "{name}");
        assert_eq!(p.address[0].judges, Judges::Peer);
    }
    // A chain (with a cycle) reaches the allowlist and stops.
    let i = ing(vec![(MIDDLEWARES, "shop-outer@kubernetescrd")]);
    let (source, looked_up) = ingress_policy(&i, &Index::new(&t), false);
    assert!(source
        .address
        .iter()
        .any(|r| r.judges == Judges::Peer && r.what.contains("in chain shop/inner")));
    assert!(looked_up.contains("my.shop/ip_guard"), "{looked_up:?}");
    // A harmless Middleware holds nothing back; unreadable ones do, except with PROXY.
    let p = host_policy(&ing(vec![(MIDDLEWARES, "shop-headers@kubernetescrd")]), &t);
    assert!(p.address.is_empty());
    for name in [
        "shop-missing@kubernetescrd",
        "compress@file",
        "shop-headers",
    ] {
        let p = host_policy(&ing(vec![(MIDDLEWARES, name)]), &t);
        assert_eq!(p.address[0].judges, Judges::Unknown, "{name}");
        assert!(hold_back(&p, Passing::TrustedHeaders).is_some());
        assert!(hold_back(&p, Passing::ProxyProtocol).is_none());
    }
    // Without the kinds (no CRDs, no RBAC) nothing named can be judged.
    let unreadable = TraefikObjects {
        readable: false,
        ..t.clone()
    };
    let p = host_policy(
        &ing(vec![(MIDDLEWARES, "shop-headers@kubernetescrd")]),
        &unreadable,
    );
    assert!(p.address[0].what.contains("cannot be read"), "{p:?}");
}

#[test]
fn tls_options_with_client_auth_hold_the_host_back() {
    let t = traefik(
        vec![],
        vec![
            tls_option("shop", "mtls", "RequireAndVerifyClientCert"),
            tls_option("shop", "plain", "NoClientCert"),
        ],
    );
    let key = keys::TRAEFIK_ROUTER_TLS_OPTIONS;
    let p = host_policy(&ing(vec![(key, "shop-mtls@kubernetescrd")]), &t);
    let (reason, message) = hold_back(&p, Passing::ProxyProtocol).unwrap();
    assert_eq!(reason, reasons::CLIENT_CERTIFICATE_REQUIRED);
    assert!(message.starts_with("TLSOption shop/mtls (clientAuthType RequireAndVerifyClientCert"));
    let p = host_policy(&ing(vec![(key, "shop-plain@kubernetescrd")]), &t);
    assert!(hold_back(&p, Passing::ProxyProtocol).is_none());
    // Traefik's default option applies to Traefik's Ingresses that name none, unless two
    // namespaces define one.
    let with_default = |defaults: Vec<Arc<TLSOption>>| traefik(vec![], defaults);
    let one = with_default(vec![tls_option(
        "traefik",
        "default",
        "RequireAnyClientCert",
    )]);
    let (on_traefik, _) = ingress_policy(&ing(vec![]), &Index::new(&one), true);
    assert_eq!(on_traefik.client_certificate.len(), 1);
    let (on_nginx, _) = ingress_policy(&ing(vec![]), &Index::new(&one), false);
    assert!(on_nginx.client_certificate.is_empty());
    let two = with_default(vec![
        tls_option("a", "default", "RequireAnyClientCert"),
        tls_option("b", "default", "RequireAnyClientCert"),
    ]);
    let (dropped, _) = ingress_policy(&ing(vec![]), &Index::new(&two), true);
    assert!(dropped.client_certificate.is_empty());
}

fn route(rules: serde_json::Value) -> HTTPRoute {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "apps", "name": "web"},
        "spec": {"hostnames": ["a.example.com"], "rules": rules}
    }))
    .unwrap()
}

#[test]
fn httproute_timeouts_and_extension_refs() {
    let t = traefik(
        vec![middleware(
            "apps",
            "allow",
            serde_json::json!({"ipAllowList": {"sourceRange": ["10.0.0.0/8"]}}),
        )],
        vec![],
    );
    let r = route(serde_json::json!([
        {"timeouts": {"request": "10m", "backendRequest": "2m"}},
        {"timeouts": {"request": "5m"}},
        {"filters": [{"type": "ExtensionRef", "extensionRef":
            {"group": "traefik.io", "kind": "Middleware", "name": "allow"}}]},
        {"timeouts": {"request": "soon"}}
    ]));
    let (sources, looked_up) = route_policy(&r, &Index::new(&t));
    assert_eq!(sources.len(), 4);
    let mut h = HostPolicy::default();
    sources.iter().for_each(|s| h.add(s));
    assert_eq!(h.address.len(), 1);
    assert!(looked_up.contains("apps/allow"));
    let (carried, notes) = policies(h.clone(), Passing::ProxyProtocol).timeouts("a.example.com");
    // backendRequest (2m) beats request (10m) in its rule; the other rule's 5m is larger.
    assert_eq!(carried.response, Some(300));
    assert_eq!(carried.response_body_idle, Some(300));
    assert!(notes.iter().any(|n| n.contains("\"soon\"")), "{notes:?}");
    let (none_given, _) = route_policy(&route(serde_json::json!([])), &Index::new(&t));
    assert_eq!(none_given.len(), 1);
    let (zero, _) = route_policy(
        &route(serde_json::json!([{"timeouts": {"request": "0s"}}])),
        &Index::new(&t),
    );
    let mut h = HostPolicy::default();
    h.add(&zero[0]);
    let (carried, notes) = policies(h, Passing::ProxyProtocol).timeouts("a.example.com");
    assert_eq!(carried.response, Some(3600));
    assert!(notes[0].contains("no timeout at all"), "{notes:?}");
}

/// Through resolution: a held-back host is not served from any source, and a source the
/// TCP ingress merges under the same name counts even when it is not switched on.
#[test]
fn a_held_back_name_is_refused_from_every_source_and_served_ones_carry_their_timeouts() {
    let l = listener("public", Some("nginx"));
    let open = Ing {
        name: "open",
        rules: vec!["a.example.com", "b.example.com"],
        tls: vec![(vec!["a.example.com", "b.example.com"], Some("ab-tls"))],
        ann: vec![(annotations::ENABLED, "true"), (READ, "600")],
        ..Default::default()
    }
    .build();
    let guarded = Ing {
        name: "guarded",
        rules: vec!["a.example.com"],
        ann: vec![(WL, "10.0.0.0/8")],
        created: 1_700_000_100,
        ..Default::default()
    }
    .build();
    let other_class = Ing {
        name: "elsewhere",
        class: Some("haproxy"),
        rules: vec!["b.example.com"],
        ann: vec![(WL, "10.0.0.0/8")],
        ..Default::default()
    }
    .build();
    let secrets: SecretMap = [tls_secret(
        "default",
        "ab-tls",
        &["a.example.com", "b.example.com"],
    )]
    .into_iter()
    .collect();
    let all = [&open, &guarded, &other_class];
    let wanted = wanted_for_listener(&l, all, &none());
    let scan = policies_for_listener(
        &l,
        &wanted,
        all,
        &none(),
        &TraefikObjects::default(),
        &BTreeSet::new(),
    );
    assert_eq!(
        scan.ingresses,
        ["default/guarded", "default/open"]
            .map(String::from)
            .into_iter()
            .collect()
    );
    let r = resolve_wanted(wanted, &scan.policies, &secrets, now());
    let a = r
        .reports
        .iter()
        .find(|h| h.name == "a.example.com")
        .unwrap();
    assert_eq!(
        (a.state.as_str(), a.reason.as_str()),
        (host_states::NOT_SERVING, reasons::CLIENT_ADDRESS_POLICY)
    );
    assert!(
        a.message.contains("Ingress default/guarded"),
        "{}",
        a.message
    );
    assert!(!r.serves("a.example.com"));
    let b = r.served.iter().find(|h| h.name == "b.example.com").unwrap();
    assert_eq!(b.timeouts.response, Some(600));
    // Trusted: both served.
    let mut trusted = l.clone();
    trusted.spec.upstream.client_address.trusted = true;
    let wanted = wanted_for_listener(&trusted, all, &none());
    let scan = policies_for_listener(
        &trusted,
        &wanted,
        all,
        &none(),
        &TraefikObjects::default(),
        &BTreeSet::new(),
    );
    let r = resolve_wanted(wanted, &scan.policies, &secrets, now());
    assert!(r.serves("a.example.com") && r.serves("b.example.com"));
}

#[test]
fn the_operators_own_alt_svc_middleware_holds_nothing_back_even_before_it_is_cached() {
    let i = ing(vec![]);
    let own = crate::operator::hosts::traefik::alt_svc_reference(
        i.metadata.namespace.as_deref().unwrap(),
        i.metadata.name.as_deref().unwrap(),
    );
    let list = format!("{own},shop-missing@kubernetescrd");
    let mut named = i.clone();
    (named.metadata.annotations.as_mut().unwrap()).insert(MIDDLEWARES.into(), list);
    let p = host_policy(&named, &traefik(vec![], vec![]));
    assert_eq!(p.address.len(), 1, "{p:?}");
    assert!(p.address[0].what.contains("shop-missing"), "{p:?}");
    // Another Ingress naming it is judged as any reference: it is not that Ingress's.
    let mut other = named.clone();
    other.metadata.name = Some("other".into());
    assert_eq!(
        host_policy(&other, &traefik(vec![], vec![])).address.len(),
        2
    );
}
