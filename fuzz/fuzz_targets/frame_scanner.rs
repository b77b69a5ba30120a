//! The frame scanner (src/proxy/http3/frames.rs) against an independent whole-stream reading of
//! the same rules (`h3_ingress_fuzz::expected`), fed the way src/proxy/http3/streams.rs feeds it:
//! all at once and cut into reads of varying sizes. Input: one byte of settings (bit 0: a
//! unidirectional stream; bits 1-3 and 4-6: the HEADERS and control frame limits from
//! `LIMITS`), one byte seeding the read sizes, then the stream's bytes.
#![no_main]

use h3_ingress::proxy::http3::frames::{Limits, Out, Scanner, StreamKind, Violation};
use libfuzzer_sys::fuzz_target;

const LIMITS: [u64; 8] = [0, 1, 5, 64, 300, 16_384, 65_536, 1 << 62];

struct Fed {
    out: Result<Vec<u8>, (u64, u64)>,
    header_section: bool,
    mid_frame: bool,
}

/// Feeds `input` in reads whose sizes come from `seed` (`seed` 0: one read).
fn feed(kind: StreamKind, limits: Limits, input: &[u8], seed: u8) -> Fed {
    let mut s = Scanner::new(kind, limits);
    let mut out = Vec::new();
    let mut rng = u32::from(seed);
    let mut at = 0;
    while at < input.len() {
        let size = if seed == 0 {
            input.len()
        } else {
            rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            1 + (rng >> 16) as usize % 40
        };
        let mut read = &input[at..input.len().min(at + size)];
        at += read.len();
        while !read.is_empty() {
            let (n, o) = match s.feed(read) {
                Ok(r) => r,
                Err(v) => {
                    let refused = match v {
                        Violation::Headers { declared, limit } => {
                            assert_eq!(limit, limits.headers);
                            (1, declared)
                        }
                        Violation::Frame {
                            ty,
                            declared,
                            limit,
                        } => {
                            assert_eq!(limit, limits.control);
                            (ty, declared)
                        }
                    };
                    return Fed {
                        out: Err(refused),
                        header_section: s.header_section_complete(),
                        mid_frame: true,
                    };
                }
            };
            assert!(
                n > 0 && n <= read.len(),
                "feed consumed {n} of {}",
                read.len()
            );
            match o {
                Out::Held => {}
                Out::Header { headers } => {
                    assert!(
                        s.header().len() <= 16,
                        "a frame header is at most two varints"
                    );
                    if let Some(declared) = headers {
                        assert!(declared <= limits.headers);
                    }
                    out.extend_from_slice(s.header());
                    s.header_sent();
                }
                Out::Payload => out.extend_from_slice(&read[..n]),
            }
            read = &read[n..];
        }
    }
    Fed {
        out: Ok(out),
        header_section: s.header_section_complete(),
        mid_frame: s.mid_frame(),
    }
}

fuzz_target!(|data: &[u8]| {
    let [settings, seed, stream @ ..] = data else {
        return;
    };
    let uni = settings & 1 == 1;
    let limits = Limits {
        headers: LIMITS[usize::from(settings >> 1 & 7)],
        control: LIMITS[usize::from(settings >> 4 & 7)],
    };
    let kind = if uni {
        StreamKind::Uni
    } else {
        StreamKind::Request
    };
    let want = h3_ingress_fuzz::expected(stream, uni, limits.headers, limits.control);
    for seed in [0, *seed] {
        let got = feed(kind, limits, stream, seed);
        assert_eq!(got.out, want.out, "bytes passed on (read seed {seed})");
        if let Ok(out) = &got.out {
            assert!(out.len() <= stream.len());
            assert_eq!(
                got.mid_frame, want.mid_frame,
                "mid_frame (read seed {seed})"
            );
        }
        assert_eq!(
            got.header_section, want.header_section,
            "header section complete (read seed {seed})"
        );
    }
});
