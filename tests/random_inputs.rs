//! Seeded random inputs for the three parsers a client or a user feeds: request validation,
//! header translation, and the configuration file. Not coverage-guided fuzzing (no cargo-fuzz
//! target builds here, see docs/reliability.md): a deterministic generator, so any failure
//! reproduces from its case number, run for a fixed number of cases in `cargo test`.

use std::net::SocketAddr;

use h3_ingress::api::ClientForwardedFor;
use h3_ingress::config;
use h3_ingress::proxy::http3::request;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.below(xs.len())]
    }

    /// Bytes from `alphabet`, or (one time in four) any byte.
    fn text(&mut self, alphabet: &str, max: usize) -> String {
        let a: Vec<char> = alphabet.chars().collect();
        (0..self.below(max + 1))
            .map(|_| {
                if self.below(4) == 0 {
                    char::from(self.next() as u8)
                } else {
                    a[self.below(a.len())]
                }
            })
            .collect()
    }
}

const NAMES: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "te",
    "cookie",
    "forwarded",
    "x-forwarded-for",
    "upgrade",
    "keep-alive",
    "proxy-connection",
    "accept",
    "via",
    "x-a",
];

fn random_request(rng: &mut Rng) -> Option<http::Request<()>> {
    let method = rng.pick(&["GET", "POST", "HEAD", "PUT", "CONNECT", "OPTIONS", "BREW"]);
    let scheme = rng.pick(&["https", "http", ""]);
    let authority = match rng.below(4) {
        0 => rng.text("a.test:443[]@%", 20),
        n => ["a.test", "a.test:443", "A.Test:8443"][n - 1].to_string(),
    };
    let path = format!("/{}", rng.text("/?#%a=&.", 30));
    let uri = if scheme.is_empty() {
        path.clone()
    } else {
        format!("{scheme}://{authority}{path}")
    };
    let mut b = http::Request::builder().method(method).uri(uri);
    for _ in 0..rng.below(8) {
        let value = rng.text("0123456789 ,a.test;=chunked", 16);
        b = b.header(rng.pick(NAMES), value);
    }
    // The http crate refuses what h3 would never hand over (invalid names, values, URIs).
    b.body(()).ok()
}

/// Validation and translation never panic; what validation accepts translates, and the
/// upstream head carries no hop-by-hop field.
#[test]
fn random_requests_validate_and_translate_without_panicking() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let client: SocketAddr = "192.0.2.7:5000".parse().unwrap();
    let mut accepted = 0;
    for case in 0..20_000 {
        let Some(req) = random_request(&mut rng) else {
            continue;
        };
        let Ok(v) = request::validate(&req) else {
            continue;
        };
        accepted += 1;
        let mode = if case % 2 == 0 {
            ClientForwardedFor::Replace
        } else {
            ClientForwardedFor::Append
        };
        if let Ok(parts) = request::upstream_parts(&req, &v, client, mode, "https") {
            for hop in ["connection", "keep-alive", "transfer-encoding", "upgrade"] {
                assert!(
                    !parts.headers.contains_key(hop),
                    "case {case}: {hop} forwarded"
                );
            }
        }
    }
    assert!(
        accepted > 100,
        "the generator must reach the accepting paths: {accepted}"
    );
}

const BASE: &str = "port: 443\nupstream: {address: '127.0.0.1:443', responseTimeoutSeconds: 60}\nhttp: {maxFieldSectionSizeBytes: 65536, requestHeadersTimeoutSeconds: 10}\nlimits: {bufferedRequestBytes: 67108864, bufferedRequestBytesPerStream: 131072}\ntransport: {idleTimeoutSeconds: 30}\n";

/// The file parser and the validation never panic on mutated files, and every error names
/// a field path or says what is wrong.
#[test]
fn random_config_files_parse_or_fail_with_a_message() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..5_000 {
        let mut text: Vec<u8> = BASE.as_bytes().to_vec();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(text.len());
            match rng.below(3) {
                0 => {
                    text[at] = rng
                        .pick(&["0", "9", "-", ":", "{", "}", "x", "\n", "'"])
                        .as_bytes()[0]
                }
                1 => {
                    text.remove(at);
                }
                _ => text.insert(at, rng.next() as u8),
            }
        }
        let yaml = String::from_utf8_lossy(&text);
        match config::file::parse(&yaml) {
            Err(e) => assert!(
                !e.errors.is_empty() && !e.errors[0].message.is_empty(),
                "case {case}"
            ),
            Ok(f) => {
                if let Err(e) =
                    config::build(f.listener_settings(), &[], config::HostTable::default(), "")
                {
                    for fe in e.errors {
                        assert!(
                            !fe.path.is_empty() && !fe.message.is_empty(),
                            "case {case}: {fe}"
                        );
                    }
                }
            }
        }
    }
}
