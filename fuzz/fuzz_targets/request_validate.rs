//! Request validation (src/proxy/http3/request.rs `validate`) on any field section h3 would hand
//! over: it never panics, every refusal has a message, and what it accepts holds what the
//! rest of the request path relies on. Input: a header section as text (`:method: GET` ...,
//! one field per line; see `h3_ingress_fuzz::fields`).
#![no_main]

use h3_ingress::proxy::http3::request::{self, Reject};
use http::{header, Method};
use libfuzzer_sys::fuzz_target;

const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

fuzz_target!(|data: &[u8]| {
    let (_, fields) = h3_ingress_fuzz::meta(h3_ingress_fuzz::fields(data));
    let Some(req) = h3_ingress_fuzz::h3_request(&fields) else {
        return;
    };
    let v = match request::validate(&req) {
        Ok(v) => v,
        Err(Reject::Malformed(msg)) => {
            assert!(!msg.is_empty());
            return;
        }
    };
    assert_ne!(req.method(), Method::CONNECT);
    assert_eq!(req.uri().scheme_str(), Some("https"));
    // The host the request is routed by: what the authority names, never empty, lowercase.
    assert!(!v.authority.contains('@'), "userinfo in {:?}", v.authority);
    assert_eq!(request::host_of(&v.authority).as_deref(), Some(&*v.host));
    assert!(!v.host.is_empty(), "empty host from {:?}", v.authority);
    assert_eq!(v.host, v.host.to_ascii_lowercase());
    assert!(!v.host.ends_with('.'), "{:?}", v.host);
    if let Some(a) = req.uri().authority() {
        assert_eq!(a.as_str(), v.authority);
    }
    // A port, if any, is what a TCP connection could use: decimal digits up to 65535.
    let port = match v.authority.strip_prefix('[') {
        Some(rest) => rest.split_once(']').map_or("", |(_, p)| p),
        None => v.authority.find(':').map_or("", |i| &v.authority[i..]),
    };
    if let Some(digits) = port.strip_prefix(':') {
        assert!(
            digits.bytes().all(|b| b.is_ascii_digit())
                && (digits.is_empty() || digits.parse::<u16>().is_ok()),
            "port {digits:?} accepted in {:?}",
            v.authority
        );
    } else {
        assert!(port.is_empty(), "{:?} after the host", v.authority);
    }
    // The asterisk form names no resource an upstream URL could carry.
    assert_ne!(req.uri().path_and_query().map(|p| p.as_str()), Some("*"));
    let h = req.headers();
    for name in CONNECTION_SPECIFIC {
        assert!(!h.contains_key(name), "{name} accepted");
    }
    for te in h.get_all(header::TE) {
        assert!(te.as_bytes().eq_ignore_ascii_case(b"trailers"));
    }
    // Every content-length item is the length validation reports.
    for cl in h.get_all(header::CONTENT_LENGTH) {
        for item in cl.to_str().unwrap().split(',') {
            assert_eq!(item.trim().parse::<u64>().ok(), v.content_length);
        }
    }
    if !h.contains_key(header::CONTENT_LENGTH) {
        assert_eq!(v.content_length, None);
    }
});
