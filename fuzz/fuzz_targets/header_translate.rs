//! Header translation both ways (src/proxy/http3/request.rs): a request validation accepted
//! becomes the upstream request head (`upstream_parts`) for the same authority and target,
//! with the client's fields kept, the proxy's forwarding entries last (the only ones with
//! Replace), X-Real-IP the client's address and no hop-by-hop or Host field; an upstream
//! response head loses exactly its hop-by-hop fields (`sanitize_response_headers`). Input: a
//! request header section as text (as for request_validate; `~client: ADDR`, `~upstream: http`
//! and `~forwarded: append` lines set the QUIC peer, the upstream scheme and the mode), an
//! empty line, then the upstream's response fields.
#![no_main]

use std::net::IpAddr;

use h3_ingress::api::ClientForwardedFor;
use h3_ingress::proxy::http3::request;
use h3_ingress::proxy::upstream::canonical_ip;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;

const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
];

/// Fields the proxy sets or rewrites; every other request field goes upstream unchanged.
const REWRITTEN: [&str; 7] = [
    "host",
    "cookie",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-real-ip",
    "forwarded",
    "via",
];

fn values<'a>(h: &'a HeaderMap, name: &str) -> Vec<&'a [u8]> {
    h.get_all(name).iter().map(HeaderValue::as_bytes).collect()
}

/// The one field `name` carries, which must end with `, item` (or be `item`; only `item`
/// when `alone`).
fn ends_with_item(h: &HeaderMap, name: &str, item: &str, alone: bool) {
    let v = values(h, name);
    assert_eq!(v.len(), 1, "{name}: {v:?}");
    assert!(
        v[0] == item.as_bytes() || !alone && v[0].ends_with(format!(", {item}").as_bytes()),
        "{name} must end with {item:?}: {:?}",
        String::from_utf8_lossy(v[0])
    );
}

fn check_request(data: &[u8]) {
    let (meta, fields) = h3_ingress_fuzz::meta(h3_ingress_fuzz::fields(data));
    let Some(req) = h3_ingress_fuzz::h3_request(&fields) else {
        return;
    };
    let Ok(v) = request::validate(&req) else {
        return;
    };
    let p = request::upstream_parts(
        &req,
        &v,
        meta.client,
        meta.forwarded_for,
        meta.upstream_scheme,
    )
    .unwrap_or_else(|e| panic!("validated request does not translate: {e}"));
    assert_eq!(p.method, req.method());
    // Routing: the upstream sees the authority that was validated and matched, and the
    // request target as sent.
    assert_eq!(p.uri.scheme_str(), Some(meta.upstream_scheme));
    assert_eq!(p.uri.authority().map(|a| a.as_str()), Some(&*v.authority));
    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
    assert_eq!(p.uri.path_and_query().map(|p| p.as_str()), Some(target));

    let up = &p.headers;
    for name in HOP_BY_HOP.iter().take(5).chain(["host"].iter()) {
        assert!(!up.contains_key(*name), "{name} forwarded");
    }
    let crumbs = values(req.headers(), "cookie");
    if crumbs.is_empty() {
        assert!(!up.contains_key(header::COOKIE));
    } else {
        assert_eq!(values(up, "cookie"), vec![&*crumbs.join(&b"; "[..])]);
    }
    let ip = canonical_ip(meta.client);
    let alone = meta.forwarded_for == ClientForwardedFor::Replace;
    ends_with_item(up, "x-forwarded-for", &ip.to_string(), alone);
    assert_eq!(values(up, "x-real-ip"), vec![ip.to_string().as_bytes()]);
    assert_eq!(values(up, "x-forwarded-proto"), vec![&b"https"[..]]);
    let for_ip = match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("\"[{a}]\""),
    };
    let forwarded = format!("for={for_ip};proto=https;host=\"{}\"", v.authority);
    ends_with_item(up, "forwarded", &forwarded, alone);
    ends_with_item(up, "via", "3 h3-ingress", false);
    for name in req.headers().keys() {
        if !REWRITTEN.contains(&name.as_str()) {
            assert_eq!(
                values(up, name.as_str()),
                values(req.headers(), name.as_str())
            );
        }
    }
}

fn check_response(text: &[u8]) {
    let mut h = HeaderMap::new();
    for (n, v) in h3_ingress_fuzz::fields(text) {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(n), HeaderValue::from_bytes(v)) {
            h.append(n, v);
        }
    }
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect();
    let before = h.clone();
    request::sanitize_response_headers(&mut h);
    for name in before.keys() {
        let hop = HOP_BY_HOP.contains(&name.as_str()) || listed.contains(name);
        if hop {
            assert!(!h.contains_key(name), "{name} crosses into HTTP/3");
        } else {
            assert_eq!(values(&h, name.as_str()), values(&before, name.as_str()));
        }
    }
    assert!(h.keys().all(|k| before.contains_key(k)));
}

fuzz_target!(|data: &[u8]| {
    let sections = h3_ingress_fuzz::sections(data);
    check_request(sections[0]);
    if let Some(resp) = sections.get(1) {
        check_response(resp);
    }
});
