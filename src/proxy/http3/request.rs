//! Pure translation of an HTTP/3 request into the request sent to the TCP ingress, and of the
//! ingress's response back (RFC 9114 section 4, RFC 9110). No I/O: unit-tested in isolation.
//!
//! The h3 crate already refuses field names with uppercase letters, values with CR, LF or NUL,
//! and unknown or missing pseudo-headers (stream error H3_MESSAGE_ERROR). What it lets through
//! and HTTP/3 still forbids is checked here, so a malformed request never reaches the upstream.

use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};

use crate::proxy::upstream::canonical_ip;

/// Why a request is refused before it reaches the upstream. The message names the header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("{0}")]
    Malformed(String),
}

impl Reject {
    fn malformed(msg: impl Into<String>) -> Self {
        Reject::Malformed(msg.into())
    }
}

/// Headers that only make sense on one HTTP/1.1 connection and are forbidden in HTTP/3
/// requests (RFC 9114 section 4.2).
const CONNECTION_SPECIFIC: [&str; 5] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
];

/// What the request path needs to know about a validated request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    /// Lowercase host name without port, for host lookup and metrics.
    pub host: String,
    /// `:authority` as sent (may include a port); becomes the upstream Host header.
    pub authority: String,
    /// Declared body length, if any.
    pub content_length: Option<u64>,
}

/// Checks an HTTP/3 request the h3 crate accepted.
pub fn validate(req: &Request<()>) -> Result<Validated, Reject> {
    let uri = req.uri();
    if req.method() == Method::CONNECT {
        return Err(Reject::malformed(
            ":method CONNECT is not supported by this proxy",
        ));
    }
    match uri.scheme_str() {
        Some("https") => {}
        Some(other) => return Err(Reject::malformed(format!(":scheme {other:?} is not https"))),
        None => return Err(Reject::malformed(":scheme is missing")),
    }
    let authority = match uri.authority() {
        Some(a) => a.as_str().to_string(),
        None => match req.headers().get(header::HOST) {
            Some(h) => h
                .to_str()
                .map_err(|_| Reject::malformed("header host is not visible ASCII"))?
                .to_string(),
            None => return Err(Reject::malformed(":authority and host are both missing")),
        },
    };
    if authority.contains('@') {
        return Err(Reject::malformed(":authority must not contain userinfo"));
    }
    if let (Some(a), Some(h)) = (uri.authority(), req.headers().get(header::HOST)) {
        if !h.as_bytes().eq_ignore_ascii_case(a.as_str().as_bytes()) {
            return Err(Reject::malformed(format!(
                "header host {:?} disagrees with :authority {:?}",
                String::from_utf8_lossy(h.as_bytes()),
                a.as_str()
            )));
        }
    }
    let host = host_of(&authority)
        .ok_or_else(|| Reject::malformed(format!(":authority {authority:?} has no host")))?;
    if !port_is_valid(&authority) {
        return Err(Reject::malformed(format!(
            ":authority {authority:?} has a port that is not a number up to 65535"
        )));
    }
    if uri.path().is_empty() && req.method() != Method::OPTIONS {
        return Err(Reject::malformed(":path is empty"));
    }
    // The asterisk form (a server-wide OPTIONS, RFC 9110 7.1) names no resource the upstream
    // could be asked for by URL; forwarded, it would read as part of the authority.
    if uri.path_and_query().is_some_and(|p| p.as_str() == "*") {
        return Err(Reject::malformed(
            ":path \"*\" (a server-wide OPTIONS) is not forwarded",
        ));
    }

    let headers = req.headers();
    for name in CONNECTION_SPECIFIC {
        if headers.contains_key(name) {
            return Err(Reject::malformed(format!(
                "header {name} is connection-specific and not allowed in HTTP/3"
            )));
        }
    }
    for te in headers.get_all(header::TE) {
        if !te.as_bytes().eq_ignore_ascii_case(b"trailers") {
            return Err(Reject::malformed(format!(
                "header te may only be \"trailers\" in HTTP/3, not {:?}",
                String::from_utf8_lossy(te.as_bytes())
            )));
        }
    }
    for (name, value) in headers {
        if let Some(b) = value
            .as_bytes()
            .iter()
            .find(|b| matches!(b, b'\r' | b'\n' | b'\0'))
        {
            return Err(Reject::malformed(format!(
                "header {name} contains byte 0x{b:02x}"
            )));
        }
    }

    let content_length = content_length(headers)?;
    Ok(Validated {
        host,
        authority,
        content_length,
    })
}

/// Parses Content-Length; several fields must agree (RFC 9110 section 8.6).
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Reject> {
    let mut found: Option<u64> = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        for part in v
            .to_str()
            .map_err(|_| Reject::malformed("header content-length is not a number"))?
            .split(',')
        {
            let n: u64 = part.trim().parse().map_err(|_| {
                Reject::malformed(format!(
                    "header content-length {:?} is not a number",
                    part.trim()
                ))
            })?;
            if found.is_some_and(|f| f != n) {
                return Err(Reject::malformed(
                    "header content-length has conflicting values",
                ));
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// The host part of an authority, lowercase, without port, IPv6 brackets or the final dot
/// of a fully qualified name; `None` when nothing is left.
pub fn host_of(authority: &str) -> Option<String> {
    let a: http::uri::Authority = authority.parse().ok()?;
    let host = a
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.');
    if host.is_empty() {
        None
    } else {
        Some(host.to_ascii_lowercase())
    }
}

/// The port of an authority without userinfo, if it has one, is decimal digits (RFC 3986
/// 3.2.3) that fit a TCP port; the http crate accepts any URI characters there.
fn port_is_valid(authority: &str) -> bool {
    let Ok(a) = authority.parse::<http::uri::Authority>() else {
        return false;
    };
    match authority.get(a.host().len()..) {
        Some("") => true,
        Some(rest) => rest.strip_prefix(':').is_some_and(|digits| {
            digits.is_empty()
                || (digits.bytes().all(|b| b.is_ascii_digit()) && digits.parse::<u16>().is_ok())
        }),
        None => false,
    }
}

/// Builds the upstream request head from a validated HTTP/3 request.
///
/// `upstream_scheme` is `https` or `http`; the URI carries the request's authority so the
/// connection pool keys by host and TLS uses it as SNI. Forwarding headers are appended, never
/// replaced, so a chain of proxies stays visible.
pub fn upstream_parts(
    req: &Request<()>,
    v: &Validated,
    client: SocketAddr,
    upstream_scheme: &str,
) -> Result<http::request::Parts, Reject> {
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let uri: Uri = format!("{upstream_scheme}://{}{path}", v.authority)
        .parse()
        .map_err(|_| Reject::malformed(format!(":path {path:?} is not a valid request target")))?;

    let mut headers = HeaderMap::with_capacity(req.headers().len() + 5);
    let mut cookies: Vec<&[u8]> = Vec::new();
    for (name, value) in req.headers() {
        if name == header::COOKIE {
            cookies.push(value.as_bytes());
            continue;
        }
        if name == header::HOST {
            continue;
        }
        headers.append(name.clone(), value.clone());
    }
    // HTTP/3 may split Cookie into crumbs; HTTP/1.1 upstreams need one field (RFC 9114 4.2.1).
    if !cookies.is_empty() {
        let joined = cookies.join(&b"; "[..]);
        let value = HeaderValue::from_bytes(&joined)
            .map_err(|_| Reject::malformed("header cookie has invalid bytes"))?;
        headers.insert(header::COOKIE, value);
    }
    // No Host field: the URI carries the authority, which hyper sends as `:authority` on h2
    // and as Host on HTTP/1.1. Sending both makes nginx before 1.25 answer 400 ("duplicate
    // host header") on h2.

    let ip = canonical_ip(client);
    append_list(
        &mut headers,
        HeaderName::from_static("x-forwarded-for"),
        &ip.to_string(),
    );
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("https"),
    );
    let for_value = match ip {
        IpAddr::V4(a) => a.to_string(),
        IpAddr::V6(a) => format!("\"[{a}]\""),
    };
    let forwarded = format!("for={for_value};proto=https;host=\"{}\"", v.authority);
    append_list(&mut headers, header::FORWARDED, &forwarded);
    append_list(&mut headers, header::VIA, "3 h3-ingress");

    let mut builder = Request::builder().method(req.method().clone()).uri(uri);
    *builder.headers_mut().expect("builder has no error yet") = headers;
    let (parts, ()) = builder
        .body(())
        .map_err(|e| Reject::malformed(e.to_string()))?
        .into_parts();
    Ok(parts)
}

fn append_list(headers: &mut HeaderMap, name: HeaderName, item: &str) {
    let mut all: Vec<String> = headers
        .get_all(&name)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    all.push(item.to_string());
    if let Ok(v) = HeaderValue::from_str(&all.join(", ")) {
        headers.insert(name, v);
    }
}

/// Response headers that must not cross into HTTP/3 (hop-by-hop), including any header the
/// upstream listed in its Connection field.
pub fn sanitize_response_headers(headers: &mut HeaderMap) {
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in CONNECTION_SPECIFIC {
        headers.remove(name);
    }
    headers.remove(header::TE);
    headers.remove(header::TRAILER);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(build: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Request<()> {
        build(
            Request::builder()
                .method("GET")
                .uri("https://a.test/path?q=1")
                .version(http::Version::HTTP_3),
        )
        .body(())
        .unwrap()
    }

    fn reject(r: Request<()>) -> String {
        match validate(&r) {
            Err(Reject::Malformed(m)) => m,
            Ok(v) => panic!("accepted: {v:?}"),
        }
    }

    #[test]
    fn plain_get_is_accepted() {
        let v = validate(&req(|b| b)).unwrap();
        assert_eq!(v.host, "a.test");
        assert_eq!(v.authority, "a.test");
        assert_eq!(v.content_length, None);
    }

    #[test]
    fn authority_with_port_and_case() {
        let v = validate(&req(|b| b.uri("https://A.Test:8443/"))).unwrap();
        assert_eq!(v.host, "a.test");
        assert_eq!(v.authority, "A.Test:8443");
        assert_eq!(host_of("[::1]:443").as_deref(), Some("::1"));
    }

    #[test]
    fn connection_specific_headers_are_rejected_by_name() {
        for name in CONNECTION_SPECIFIC {
            let m = reject(req(|b| b.header(name, "x")));
            assert!(m.contains(name), "{m}");
        }
    }

    #[test]
    fn te_other_than_trailers_is_rejected() {
        assert!(validate(&req(|b| b.header("te", "trailers"))).is_ok());
        let m = reject(req(|b| b.header("te", "gzip")));
        assert!(m.contains("te"), "{m}");
    }

    #[test]
    fn content_length_forms() {
        let v = validate(&req(|b| b.header("content-length", "10"))).unwrap();
        assert_eq!(v.content_length, Some(10));
        let v = validate(&req(|b| b.header("content-length", "10, 10"))).unwrap();
        assert_eq!(v.content_length, Some(10));
        assert!(reject(req(|b| b
            .header("content-length", "10")
            .header("content-length", "11")))
        .contains("conflicting"));
        assert!(reject(req(|b| b.header("content-length", "ten"))).contains("content-length"));
    }

    #[test]
    fn scheme_authority_and_host_rules() {
        assert!(reject(req(|b| b.uri("http://a.test/"))).contains(":scheme"));
        assert!(reject(req(|b| b.uri("/only-path"))).contains(":scheme"));
        assert!(reject(req(|b| b.header("host", "b.test"))).contains("disagrees"));
        assert!(validate(&req(|b| b.header("host", "A.TEST"))).is_ok());
        assert!(reject(req(|b| b.method("CONNECT"))).contains("CONNECT"));
    }

    /// Found by the request_validate and header_translate fuzz targets: an authority whose
    /// host is only dots was accepted with an empty host, a port of any URI characters went
    /// upstream in the Host field, and `:path *` was forwarded as `https://a.test*`, an
    /// upstream URI naming another authority.
    #[test]
    fn empty_hosts_bad_ports_and_the_asterisk_form_are_refused() {
        assert!(reject(req(|b| b.uri("https://.:443/"))).contains("has no host"));
        assert!(reject(req(|b| b.uri("https://..:te)st/"))).contains("has no host"));
        for bad in ["a.test:te)st", "a.test:65536", "a.test:+1", "[::1]:x"] {
            let m = reject(req(|b| b.uri(format!("https://{bad}/"))));
            assert!(m.contains("port"), "{bad}: {m}");
        }
        for good in ["a.test:", "a.test:0443", "[::1]:443", "a.test.:8443"] {
            let v = validate(&req(|b| b.uri(format!("https://{good}/")))).unwrap();
            assert_eq!(v.authority, good);
        }
        let star_uri = Uri::builder()
            .scheme("https")
            .authority("a.test")
            .path_and_query("*")
            .build()
            .unwrap();
        let star = req(|b| b.method("OPTIONS").uri(star_uri));
        assert_eq!(star.uri().path_and_query().unwrap().as_str(), "*");
        assert!(reject(star).contains(":path \"*\""));
    }

    #[test]
    fn upstream_request_carries_forwarding_headers_and_joined_cookies() {
        let r = req(|b| {
            b.header("cookie", "a=1")
                .header("cookie", "b=2")
                .header("x-forwarded-for", "198.51.100.7")
                .header("user-agent", "t")
        });
        let v = validate(&r).unwrap();
        let client: SocketAddr = "[::ffff:192.0.2.1]:5555".parse().unwrap();
        let p = upstream_parts(&r, &v, client, "https").unwrap();
        assert_eq!(p.uri.to_string(), "https://a.test/path?q=1");
        assert!(p.headers.get("host").is_none());
        assert_eq!(p.uri.authority().unwrap().as_str(), "a.test");
        assert_eq!(p.headers["cookie"], "a=1; b=2");
        assert_eq!(p.headers["x-forwarded-for"], "198.51.100.7, 192.0.2.1");
        assert_eq!(p.headers["x-forwarded-proto"], "https");
        assert_eq!(
            p.headers["forwarded"],
            "for=192.0.2.1;proto=https;host=\"a.test\""
        );
        assert_eq!(p.headers["via"], "3 h3-ingress");
        assert_eq!(p.headers["user-agent"], "t");

        let v6: SocketAddr = "[2001:db8::1]:5555".parse().unwrap();
        let p = upstream_parts(&r, &v, v6, "http").unwrap();
        assert!(p.headers["forwarded"]
            .to_str()
            .unwrap()
            .starts_with("for=\"[2001:db8::1]\""));
        assert!(p.uri.to_string().starts_with("http://a.test/"));
    }

    #[test]
    fn hop_by_hop_response_headers_are_stripped() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-private".parse().unwrap());
        h.insert("x-private", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("content-type", "text/plain".parse().unwrap());
        sanitize_response_headers(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key("content-type"));
    }
}
