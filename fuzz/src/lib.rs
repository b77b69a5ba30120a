//! What the fuzz targets share: a readable input format for header sections, a model of the
//! request h3 0.0.8 hands the proxy for a decoded field section, and independent references
//! for the frame scanner (a whole-stream reading) and the QUIC header reader (a cursor).

use std::net::SocketAddr;
use std::str::FromStr;

use h3_ingress::proxy::quic::header::MAX_COALESCED;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Uri};

/// A header section as text, one field per line: `name: value` (`:method: GET` for
/// pseudo-headers). The name ends at the first `:` after its first byte, one space after it
/// is dropped; a line without `:` is a name with an empty value. The value keeps every
/// other byte (CR, NUL, non-ASCII), so what the http crate refuses is exercised too.
pub fn fields(text: &[u8]) -> Vec<(&[u8], &[u8])> {
    text.split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(
            |line| match line.iter().skip(1).position(|b| *b == b':').map(|p| p + 1) {
                Some(p) => {
                    let value = &line[p + 1..];
                    (&line[..p], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => (line, &b""[..]),
            },
        )
        .collect()
}

/// Splits an input into sections at empty lines (`\n\n`).
pub fn sections(data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    while let Some(p) = rest.windows(2).position(|w| w == b"\n\n") {
        out.push(&rest[..p + 1]);
        rest = &rest[p + 2..];
    }
    out.push(rest);
    out
}

/// Settings of a request input that are not header fields: lines `~client: ADDR` (the QUIC
/// peer, default 192.0.2.7:5000) and `~upstream: http` (the upstream scheme, default https).
pub struct Meta {
    pub client: SocketAddr,
    pub upstream_scheme: &'static str,
}

/// Separates `~` lines (settings) from the fields.
pub fn meta<'a>(all: Vec<(&'a [u8], &'a [u8])>) -> (Meta, Vec<(&'a [u8], &'a [u8])>) {
    let mut m = Meta {
        client: SocketAddr::from(([192, 0, 2, 7], 5000)),
        upstream_scheme: "https",
    };
    let mut rest = Vec::new();
    for (n, v) in all {
        match n {
            b"~client" => {
                if let Some(a) = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok()) {
                    m.client = a;
                }
            }
            b"~upstream" => {
                if v == b"http" {
                    m.upstream_scheme = "http";
                }
            }
            _ => rest.push((n, v)),
        }
    }
    (m, rest)
}

#[derive(Default)]
struct Pseudo {
    method: Option<Method>,
    scheme: Option<Scheme>,
    authority: Option<Authority>,
    path: Option<PathAndQuery>,
}

fn parse_str<T: FromStr>(v: &[u8]) -> Option<T> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// The request h3 0.0.8 hands the proxy for a decoded field section, or `None` where h3
/// answers H3_MESSAGE_ERROR itself. A model of its observable behaviour (field by field:
/// lowercase names and valid values only, known pseudo-headers only, the last of a repeated
/// pseudo-header wins; `:authority` and `host` must agree byte for byte and host becomes the
/// URI's authority; the URI is built by the http crate, which refuses a missing `:path`
/// when `:scheme` is present). Keeping it beside the targets, rather than driving h3's
/// decoder, lets the fuzzer reach the proxy's own checks with any field list.
pub fn h3_request(fields: &[(&[u8], &[u8])]) -> Option<Request<()>> {
    let mut p = Pseudo::default();
    let mut headers = HeaderMap::new();
    for (name, value) in fields {
        match *name {
            [] => return None,
            b":method" => p.method = Some(Method::from_bytes(value).ok()?),
            b":scheme" => p.scheme = Some(parse_str(value)?),
            b":authority" => p.authority = Some(parse_str(value)?),
            b":path" => p.path = Some(parse_str(value)?),
            // A request's :status is parsed and ignored; :protocol only sets an extension
            // the proxy never reads.
            b":status" => {
                http::StatusCode::from_bytes(value).ok()?;
            }
            b":protocol" => {
                if !matches!(*value, b"webtransport" | b"connect-udp") {
                    return None;
                }
            }
            [b':', ..] => return None,
            _ => {
                let n = HeaderName::from_lowercase(name).ok()?;
                headers.append(n, HeaderValue::from_bytes(value).ok()?);
            }
        }
    }
    let mut uri = Uri::builder();
    if let Some(path) = p.path {
        uri = uri.path_and_query(path);
    }
    if let Some(s) = p.scheme {
        uri = uri.scheme(s);
    }
    uri = match (p.authority, headers.get(http::header::HOST)) {
        (None, None) => return None,
        (Some(a), None) => uri.authority(a),
        (Some(a), Some(h)) if a.as_str().as_bytes() != h.as_bytes() => return None,
        (_, Some(h)) => uri.authority(h.as_bytes()),
    };
    let mut req = Request::new(());
    *req.method_mut() = p.method?;
    *req.uri_mut() = uri.build().ok()?;
    *req.headers_mut() = headers;
    *req.version_mut() = http::Version::HTTP_3;
    Some(req)
}

/// The QUIC variable-length integer at the start of `b` and its length (RFC 9000 16).
pub fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let n = 1usize << (first >> 6);
    let bytes = b.get(..n)?;
    let mut v = u64::from(first & 0x3f);
    for byte in &bytes[1..] {
        v = (v << 8) | u64::from(*byte);
    }
    Some((v, n))
}

/// What the scanner must make of a whole stream, decided frame by frame on the complete
/// input (an independent reading of the rules in docs/reliability.md "Stream limits").
#[derive(Debug, PartialEq, Eq)]
pub struct Expected {
    /// The bytes h3 gets, or the frame refused (type, declared length).
    pub out: Result<Vec<u8>, (u64, u64)>,
    /// A complete HEADERS frame went through on a request stream.
    pub header_section: bool,
    /// The input ends inside a frame header or payload.
    pub mid_frame: bool,
}

/// Frame types h3 understands (RFC 9114 7.2 and the HTTP/2 types it must refuse).
fn known(ty: u64) -> bool {
    matches!(ty, 0x0..=0x9 | 0xd)
}

/// The reference reading of `input` as a request stream (`uni` false) or a unidirectional
/// stream, with `headers` and `control` as the frame limits.
pub fn expected(input: &[u8], uni: bool, headers: u64, control: u64) -> Expected {
    let mut out = Vec::new();
    let mut header_section = false;
    let mut at = 0;
    if uni {
        let Some((ty, n)) = varint(input) else {
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: !input.is_empty(),
            };
        };
        out.extend_from_slice(&input[..n]);
        if ty != 0 {
            // Not the control stream: everything after the type passes unread.
            out.extend_from_slice(&input[n..]);
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: false,
            };
        }
        at = n;
    }
    while at < input.len() {
        let rest = &input[at..];
        let Some((ty, t)) = varint(rest) else {
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: true,
            };
        };
        let Some((len, l)) = varint(&rest[t..]) else {
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: true,
            };
        };
        if ty == 0x41 {
            // The WebTransport stream signal (a type and a session ID, no length): the rest
            // of the stream is opaque. h3 refuses it (WebTransport is off) and closes the
            // connection with H3_FRAME_UNEXPECTED when it comes on the control stream, so
            // nothing after it is ever buffered.
            out.extend_from_slice(rest);
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: false,
            };
        }
        let head = t + l;
        let is_headers = ty == 0x1 && !uni;
        let limit = if is_headers { headers } else { control };
        if ty != 0x0 && known(ty) && len > limit {
            return Expected {
                out: Err((ty, len)),
                header_section,
                mid_frame: true,
            };
        }
        let available = (rest.len() - head) as u64;
        let taken = len.min(available) as usize;
        if known(ty) {
            out.extend_from_slice(&rest[..head + taken]);
        }
        if (taken as u64) < len {
            return Expected {
                out: Ok(out),
                header_section,
                mid_frame: true,
            };
        }
        header_section |= is_headers;
        at += head + taken;
    }
    Expected {
        out: Ok(out),
        header_section,
        mid_frame: false,
    }
}

/// One long-header packet as [`expected_packets`] reads it.
#[derive(Debug, PartialEq, Eq)]
pub struct Packet {
    /// The type bits of the first byte, in place (`0x00` Initial ... `0x20` Handshake).
    pub ty: u32,
    pub dcid: Vec<u8>,
    pub scid: Vec<u8>,
    /// Bytes from its first byte to its end.
    pub len: usize,
}

struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: u64) -> Option<&[u8]> {
        let end = self.at.checked_add(usize::try_from(n).ok()?)?;
        let s = self.b.get(self.at..end)?;
        self.at = end;
        Some(s)
    }
    fn byte(&mut self) -> Option<u8> {
        self.take(1).map(|s| s[0])
    }
    fn varint(&mut self) -> Option<u64> {
        let (v, n) = varint(&self.b[self.at..])?;
        self.at += n;
        Some(v)
    }
    fn cid(&mut self) -> Option<Vec<u8>> {
        let n = self.byte()?;
        if n > 20 {
            return None;
        }
        self.take(n.into()).map(<[u8]>::to_vec)
    }
}

fn one_packet(b: &[u8]) -> Option<Packet> {
    let mut c = Cursor { b, at: 0 };
    let first = c.byte()?;
    if first & 0x80 == 0 {
        return None;
    }
    let version = u32::from_be_bytes(c.take(4)?.try_into().ok()?);
    if version != 1 && !(0xff00_001d..=0xff00_0022).contains(&version) {
        return None;
    }
    let dcid = c.cid()?;
    let scid = c.cid()?;
    let kind = (first >> 4) & 0b11;
    match kind {
        0 => {
            let token = c.varint()?;
            c.take(token)?;
        }
        1 | 2 => {}
        _ => return None,
    }
    let payload = c.varint()?;
    c.take(payload)?;
    Some(Packet {
        ty: u32::from(kind) << 4,
        dcid,
        scid,
        len: c.at,
    })
}

/// The reference reading of the long-header packets coalesced in a datagram (RFC 9000
/// 17.2): a cursor over the bytes, stopping at the first packet it cannot read whole.
pub fn expected_packets(datagram: &[u8]) -> Vec<Packet> {
    let mut out: Vec<Packet> = Vec::new();
    let mut at = 0;
    while out.len() < MAX_COALESCED {
        let Some(p) = one_packet(&datagram[at..]) else {
            break;
        };
        at += p.len;
        out.push(p);
    }
    out
}
