//! HTTP/3 frame boundaries, found as the bytes of a stream arrive, so that a frame longer than
//! its limit is refused before anything holds its payload.
//!
//! h3 0.0.8 decodes a frame only once all of it is buffered: a HEADERS frame that declares
//! 1 GiB is read (granting the client flow-control credit as it goes) and kept until it is
//! complete, and only then checked against SETTINGS_MAX_FIELD_SECTION_SIZE. Unknown frames and
//! control-stream frames are buffered the same way. The [`Scanner`] reads only each frame's
//! type and length (two QUIC variable-length integers, RFC 9000 16) and decides before the
//! payload: pass it on, drop it, or refuse it. Pure: no I/O, so the property tests and the
//! fuzz target drive it directly; [`super::streams`] runs it under h3.

use crate::proxy::quic::header::{varint, varint_len};

/// Frame types h3 understands (RFC 9114 7.2, and the HTTP/2 types it must refuse). Every
/// other type is unknown or reserved (RFC 9114 7.2.8, 9): it has no meaning and is dropped
/// here as it arrives instead of being buffered by h3 to be dropped there.
const DATA: u64 = 0x0;
const HEADERS: u64 = 0x1;
const KNOWN: [u64; 11] = [DATA, HEADERS, 0x2, 0x3, 0x4, 0x5, 0x6, 0x7, 0x8, 0x9, 0xd];
/// WebTransport's bidirectional stream signal: a type and a session ID, no length; h3 takes
/// the rest of the stream as opaque payload (and refuses it, WebTransport being off).
const WEBTRANSPORT_STREAM: u64 = 0x41;
/// The unidirectional stream type of the control stream (RFC 9114 6.2.1).
const CONTROL_STREAM: u64 = 0x0;

/// The longest frames accepted, in payload bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// HEADERS on a request stream (the header section and trailers). A QPACK-encoded section
    /// is never longer than its decoded size, which SETTINGS_MAX_FIELD_SECTION_SIZE bounds,
    /// for any encoder that uses Huffman coding only where it shrinks a string.
    pub headers: u64,
    /// Every other frame except DATA (unbounded, streamed) and unknown types (dropped).
    pub control: u64,
}

/// A frame that is too long: what it declared and what was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("HEADERS frame of {declared} bytes exceeds the field-section limit of {limit}")]
    Headers { declared: u64, limit: u64 },
    #[error("frame type {ty:#x} of {declared} bytes exceeds the limit of {limit}")]
    Frame { ty: u64, declared: u64, limit: u64 },
}

/// Which stream the scanner reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// A client-initiated bidirectional stream: a request.
    Request,
    /// A client-initiated unidirectional stream; only the control stream carries frames h3
    /// buffers (QPACK streams are never read with a zero-capacity table, and h3 stops
    /// unknown and push stream types right after their type).
    Uni,
}

/// What the bytes consumed by one [`Scanner::feed`] call become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// Nothing to pass on: part of a frame header (held by the scanner) or dropped payload.
    Held,
    /// A complete frame header: pass [`Scanner::header`] on. `headers` is the declared
    /// length when it starts a HEADERS frame of a request.
    Header { headers: Option<u64> },
    /// Pass the consumed bytes on unchanged.
    Payload,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading a unidirectional stream's type.
    StreamType,
    /// Reading a frame's type and length.
    FrameHeader,
    /// Passing `remaining` payload bytes on; `headers` when the frame is HEADERS.
    Forward { remaining: u64, headers: bool },
    /// Dropping `remaining` payload bytes of an unknown frame.
    Drop { remaining: u64 },
    /// Everything else passes unparsed.
    Opaque,
}

/// Follows the frames of one stream as its bytes arrive.
#[derive(Debug, Clone)]
pub struct Scanner {
    kind: StreamKind,
    limits: Limits,
    state: State,
    /// The varints being read (a stream type, or a frame's type and length): at most 16 bytes.
    buf: [u8; 16],
    len: usize,
    /// Complete HEADERS frames passed on (a request's header section, then trailers).
    headers_done: u32,
}

impl Scanner {
    pub fn new(kind: StreamKind, limits: Limits) -> Self {
        let state = match kind {
            StreamKind::Request => State::FrameHeader,
            StreamKind::Uni => State::StreamType,
        };
        Scanner {
            kind,
            limits,
            state,
            buf: [0; 16],
            len: 0,
            headers_done: 0,
        }
    }

    /// The frame header to pass on after [`Out::Header`].
    pub fn header(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// True once the first HEADERS frame (the request's header section) has been passed on
    /// completely.
    pub fn header_section_complete(&self) -> bool {
        self.headers_done > 0
    }

    /// True while a frame header or a frame payload is partly read: the stream ending now
    /// would truncate a frame.
    pub fn mid_frame(&self) -> bool {
        match self.state {
            State::FrameHeader | State::StreamType => self.len > 0,
            State::Forward { .. } | State::Drop { .. } => true,
            State::Opaque => false,
        }
    }

    /// Consumes a prefix of `input` (at least one byte when `input` is not empty) and says
    /// what it becomes.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Out), Violation> {
        if input.is_empty() {
            return Ok((0, Out::Held));
        }
        match self.state {
            State::Opaque => Ok((input.len(), Out::Payload)),
            State::Forward { remaining, headers } => {
                let n = clamp(remaining, input.len());
                let left = remaining - n as u64;
                self.state = if left == 0 {
                    self.payload_done(headers)
                } else {
                    State::Forward {
                        remaining: left,
                        headers,
                    }
                };
                Ok((n, Out::Payload))
            }
            State::Drop { remaining } => {
                let n = clamp(remaining, input.len());
                let left = remaining - n as u64;
                self.state = if left == 0 {
                    State::FrameHeader
                } else {
                    State::Drop { remaining: left }
                };
                Ok((n, Out::Held))
            }
            State::StreamType => Ok(self.stream_type(input)),
            State::FrameHeader => self.frame_header(input),
        }
    }

    fn payload_done(&mut self, headers: bool) -> State {
        if headers {
            self.headers_done += 1;
        }
        State::FrameHeader
    }

    /// Copies header bytes until the varint(s) wanted are complete; `need` says how many
    /// bytes the header has once its first bytes are known.
    fn take_header_bytes(&mut self, input: &[u8], need: impl Fn(&[u8]) -> usize) -> usize {
        let mut taken = 0;
        while taken < input.len() {
            self.buf[self.len] = input[taken];
            self.len += 1;
            taken += 1;
            if self.len >= need(&self.buf[..self.len]) {
                break;
            }
        }
        taken
    }

    fn stream_type(&mut self, input: &[u8]) -> (usize, Out) {
        let taken = self.take_header_bytes(input, |b| varint_len(b[0]));
        let Some((ty, _)) = varint(&self.buf[..self.len]) else {
            return (taken, Out::Held);
        };
        // The type goes on to h3 as the stream's first bytes, like a frame header.
        self.state = if ty == CONTROL_STREAM {
            State::FrameHeader
        } else {
            State::Opaque
        };
        (taken, Out::Header { headers: None })
    }

    /// Bytes the frame header in `b` has in all: the type, then the length (none for the
    /// WebTransport signal, whose session ID is the rest of its header).
    fn frame_header_len(b: &[u8]) -> usize {
        let t = varint_len(b[0]);
        match b.get(t) {
            Some(first) => t + varint_len(*first),
            None => t + 1,
        }
    }

    fn frame_header(&mut self, input: &[u8]) -> Result<(usize, Out), Violation> {
        let taken = self.take_header_bytes(input, Self::frame_header_len);
        let b = &self.buf[..self.len];
        if b.len() < Self::frame_header_len(b) {
            return Ok((taken, Out::Held));
        }
        let (ty, t) = varint(b).expect("complete");
        let (declared, _) = varint(&b[t..]).expect("complete");
        let out = self.decide(ty, declared)?;
        Ok((taken, out))
    }

    /// What to do with a frame of type `ty` declaring `declared` payload bytes.
    fn decide(&mut self, ty: u64, declared: u64) -> Result<Out, Violation> {
        let request = self.kind == StreamKind::Request;
        if ty == WEBTRANSPORT_STREAM {
            self.state = State::Opaque;
            return Ok(Out::Header { headers: None });
        }
        if ty == DATA {
            self.state = forward(declared, false);
            return Ok(Out::Header { headers: None });
        }
        if !KNOWN.contains(&ty) {
            self.state = if declared == 0 {
                State::FrameHeader
            } else {
                State::Drop {
                    remaining: declared,
                }
            };
            self.len = 0;
            return Ok(Out::Held);
        }
        if ty == HEADERS && request {
            let limit = self.limits.headers;
            if declared > limit {
                return Err(Violation::Headers { declared, limit });
            }
            self.state = forward(declared, true);
            if declared == 0 {
                self.headers_done += 1;
            }
            return Ok(Out::Header {
                headers: Some(declared),
            });
        }
        let limit = self.limits.control;
        if declared > limit {
            return Err(Violation::Frame {
                ty,
                declared,
                limit,
            });
        }
        self.state = forward(declared, false);
        Ok(Out::Header { headers: None })
    }

    /// Starts the next frame header; called by the I/O side once it has passed
    /// [`Scanner::header`] on.
    pub fn header_sent(&mut self) {
        self.len = 0;
    }
}

fn forward(declared: u64, headers: bool) -> State {
    if declared == 0 {
        State::FrameHeader
    } else {
        State::Forward {
            remaining: declared,
            headers,
        }
    }
}

fn clamp(remaining: u64, available: usize) -> usize {
    usize::try_from(remaining).map_or(available, |r| r.min(available))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        headers: 1000,
        control: 100,
    };

    fn var(v: u64) -> Vec<u8> {
        match v {
            0..=63 => vec![v as u8],
            64..=16383 => (v as u16 | 0x4000).to_be_bytes().to_vec(),
            16384..=1_073_741_823 => (v as u32 | 0x8000_0000).to_be_bytes().to_vec(),
            _ => (v | 0xc000_0000_0000_0000).to_be_bytes().to_vec(),
        }
    }

    fn frame(ty: u64, payload: &[u8]) -> Vec<u8> {
        let mut f = var(ty);
        f.extend(var(payload.len() as u64));
        f.extend_from_slice(payload);
        f
    }

    /// Feeds `input` in chunks of `chunk` bytes; returns what would reach h3.
    fn run(kind: StreamKind, input: &[u8], chunk: usize) -> Result<Vec<u8>, Violation> {
        let mut s = Scanner::new(kind, LIMITS);
        let mut out = Vec::new();
        for piece in input.chunks(chunk) {
            let mut rest = piece;
            while !rest.is_empty() {
                let (n, o) = s.feed(rest)?;
                assert!(n > 0);
                match o {
                    Out::Held => {}
                    Out::Header { .. } => {
                        out.extend_from_slice(s.header());
                        s.header_sent();
                    }
                    Out::Payload => out.extend_from_slice(&rest[..n]),
                }
                rest = &rest[n..];
            }
        }
        Ok(out)
    }

    #[test]
    fn known_frames_pass_unchanged_in_any_chunking() {
        let mut input = frame(HEADERS, &[7; 300]);
        input.extend(frame(DATA, &[1; 5000]));
        input.extend(frame(HEADERS, &[9; 20]));
        for chunk in [1, 2, 3, 7, 64, 10_000] {
            assert_eq!(run(StreamKind::Request, &input, chunk).unwrap(), input);
        }
    }

    #[test]
    fn unknown_and_reserved_frames_are_dropped_whatever_their_length() {
        let grease = 0x1f * 7 + 0x21;
        let mut input = frame(grease, &[0xaa; 5000]);
        input.extend(frame(HEADERS, &[7; 30]));
        input.extend(frame(0x2f, &[]));
        input.extend(frame(DATA, &[1; 10]));
        let mut want = frame(HEADERS, &[7; 30]);
        want.extend(frame(DATA, &[1; 10]));
        for chunk in [1, 5, 4096] {
            assert_eq!(run(StreamKind::Request, &input, chunk).unwrap(), want);
        }
    }

    #[test]
    fn an_oversized_headers_frame_is_refused_from_its_header_alone() {
        // Only the frame header arrives: the refusal cannot wait for the payload.
        let mut input = var(HEADERS);
        input.extend(var(1 << 30));
        assert_eq!(
            run(StreamKind::Request, &input, 1),
            Err(Violation::Headers {
                declared: 1 << 30,
                limit: 1000
            })
        );
        assert!(run(StreamKind::Request, &frame(HEADERS, &[0; 1000]), 9).is_ok());
    }

    #[test]
    fn other_known_frames_are_bounded_by_the_control_limit() {
        let settings = frame(0x4, &[0; 101]);
        assert_eq!(
            run(StreamKind::Request, &settings, 4),
            Err(Violation::Frame {
                ty: 4,
                declared: 101,
                limit: 100
            })
        );
        // DATA is streamed, never buffered whole: no limit.
        assert!(run(StreamKind::Request, &frame(DATA, &[0; 5000]), 100).is_ok());
    }

    #[test]
    fn the_control_stream_is_scanned_and_other_uni_streams_pass() {
        let mut control = var(CONTROL_STREAM);
        control.extend(frame(0x4, &[1, 2, 3, 4]));
        control.extend(frame(0x21, &[0; 3000]));
        let mut want = var(CONTROL_STREAM);
        want.extend(frame(0x4, &[1, 2, 3, 4]));
        assert_eq!(run(StreamKind::Uni, &control, 2).unwrap(), want);

        let mut big = var(CONTROL_STREAM);
        big.extend(var(0x4));
        big.extend(var(1 << 40));
        assert!(matches!(
            run(StreamKind::Uni, &big, 3),
            Err(Violation::Frame { ty: 4, .. })
        ));
        // Even a HEADERS frame on the control stream gets the control limit.
        let mut headers = var(CONTROL_STREAM);
        headers.extend(frame(HEADERS, &[0; 500]));
        assert!(run(StreamKind::Uni, &headers, 3).is_err());

        let mut encoder = var(0x2);
        encoder.extend([0xff; 700]);
        assert_eq!(run(StreamKind::Uni, &encoder, 3).unwrap(), encoder);
    }

    #[test]
    fn the_header_section_completes_with_the_first_headers_frame() {
        let mut s = Scanner::new(StreamKind::Request, LIMITS);
        let f = frame(HEADERS, &[5; 10]);
        let (n, out) = s.feed(&f).unwrap();
        assert_eq!(out, Out::Header { headers: Some(10) });
        s.header_sent();
        assert!(!s.header_section_complete());
        assert!(s.mid_frame());
        let (m, out) = s.feed(&f[n..]).unwrap();
        assert_eq!((m, out), (10, Out::Payload));
        assert!(s.header_section_complete());
        assert!(!s.mid_frame());
    }

    #[test]
    fn webtransport_signal_makes_the_rest_opaque() {
        let mut input = var(WEBTRANSPORT_STREAM);
        input.extend(var(4));
        input.extend([0xff; 40]);
        assert_eq!(run(StreamKind::Request, &input, 3).unwrap(), input);
    }

    /// A small deterministic generator (xorshift), so a failure reproduces from its seed.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A random stream: well-formed frames of random (known, unknown, oversized) types and
    /// lengths, or raw random bytes.
    fn random_stream(rng: &mut Rng) -> Vec<u8> {
        let mut out = Vec::new();
        for _ in 0..rng.below(8) {
            if rng.below(5) == 0 {
                out.extend((0..rng.below(40)).map(|_| rng.next() as u8));
                continue;
            }
            let ty = match rng.below(4) {
                0 => DATA,
                1 => HEADERS,
                2 => KNOWN[rng.below(KNOWN.len() as u64) as usize],
                _ => rng.below(1 << 20),
            };
            let max = if rng.below(4) == 0 { 3000 } else { 200 };
            let len = rng.below(max);
            let payload = vec![0x5a; len as usize];
            out.extend(frame(ty, &payload));
        }
        out
    }

    /// Whatever the bytes and however they are cut into reads, the scanner passes on the
    /// same bytes (or refuses the same frame), never more than it was given, and never
    /// holds more than a frame header.
    #[test]
    fn random_streams_scan_the_same_in_any_chunking() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..3000 {
            let input = random_stream(&mut rng);
            let kind = if rng.below(3) == 0 {
                StreamKind::Uni
            } else {
                StreamKind::Request
            };
            let whole = run(kind, &input, input.len().max(1));
            let random_chunk = 1 + rng.below(50) as usize;
            for chunk in [1, 2, random_chunk] {
                assert_eq!(run(kind, &input, chunk), whole, "case {case} chunk {chunk}");
            }
            if let Ok(out) = whole {
                assert!(out.len() <= input.len(), "case {case}");
            }
        }
    }
}
