//! What a QUIC datagram shows without keys: the invariant long-header fields (RFC 8999), the
//! v1 packet types and lengths that let a reader step over coalesced packets (RFC 9000
//! section 17.2), and the variable-length integer both QUIC and HTTP/3 frames use. Pure.
//!
//! The socket layers read this much: the reuseport program routes on it, the amplification
//! guard learns from it when a client has proven its address, and the shedding layer tells a
//! client's first Initial from one carrying a token.

/// QUIC versions whose long-header types we know: v1 and the drafts quinn speaks (29-34),
/// which share v1's type bits.
pub const QUIC_V1: u32 = 1;
pub const DRAFTS: std::ops::RangeInclusive<u32> = 0xff00_001d..=0xff00_0022;
/// Long-header type bits of v1: Initial 0b00, 0-RTT 0b01, Handshake 0b10, Retry 0b11.
pub const TYPE_MASK: u32 = 0x30;
pub const TYPE_INITIAL: u32 = 0x00;
pub const TYPE_ZERO_RTT: u32 = 0x10;
pub const TYPE_HANDSHAKE: u32 = 0x20;
/// The longest connection ID of QUIC v1.
pub const MAX_CID_LEN: usize = 20;
/// Coalesced packets read from one datagram before giving up (a client coalesces at most
/// Initial, 0-RTT or Handshake, and 1-RTT).
pub const MAX_COALESCED: usize = 4;

/// The length of a QUIC varint from its first byte.
pub fn varint_len(first: u8) -> usize {
    1 << (first >> 6)
}

/// Decodes a varint at the start of `b`: `(value, length)`, or `None` when incomplete.
pub fn varint(b: &[u8]) -> Option<(u64, usize)> {
    let first = *b.first()?;
    let n = varint_len(first);
    let bytes = b.get(..n)?;
    let v = bytes[1..].iter().fold(u64::from(first & 0x3f), |v, byte| {
        (v << 8) | u64::from(*byte)
    });
    Some((v, n))
}

/// The first byte of a long-header packet of type Initial (QUIC v1 and its drafts); the fixed
/// bit may be greased (RFC 9287).
pub fn is_initial(first_byte: u8) -> bool {
    first_byte & 0xb0 == 0x80
}

pub fn is_long_header(first_byte: u8) -> bool {
    first_byte & 0x80 != 0
}

fn known_version(v: u32) -> bool {
    v == QUIC_V1 || DRAFTS.contains(&v)
}

/// A connection ID held by value (no allocation per tracked handshake).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cid {
    len: u8,
    bytes: [u8; MAX_CID_LEN],
}

impl Cid {
    pub fn new(id: &[u8]) -> Option<Cid> {
        let mut bytes = [0; MAX_CID_LEN];
        bytes.get_mut(..id.len())?.copy_from_slice(id);
        Some(Cid {
            len: id.len() as u8,
            bytes,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The readable part of one long-header packet of a known version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LongHeader<'a> {
    /// `TYPE_*`: the type bits of the first byte.
    pub ty: u32,
    pub dcid: &'a [u8],
    pub scid: &'a [u8],
    /// The token's length (Initial packets; 0 for the others).
    pub token_len: usize,
    /// Bytes from the packet's first byte to its end (the next coalesced packet starts there).
    pub len: usize,
}

/// Reads a `len`-byte connection ID preceded by its length byte at `b[at]`: (ID, next offset).
fn cid_at(b: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let n = usize::from(*b.get(at)?);
    if n > MAX_CID_LEN {
        return None;
    }
    Some((b.get(at + 1..at + 1 + n)?, at + 1 + n))
}

/// The long-header packet at the start of `b`, if it is one of a known version with a length
/// field (Initial, 0-RTT, Handshake; a Retry has none) that fits in `b`.
pub fn long_header(b: &[u8]) -> Option<LongHeader<'_>> {
    let first = *b.first()?;
    if !is_long_header(first) {
        return None;
    }
    let version = u32::from_be_bytes(b.get(1..5)?.try_into().ok()?);
    if !known_version(version) {
        return None;
    }
    let (dcid, at) = cid_at(b, 5)?;
    let (scid, mut at) = cid_at(b, at)?;
    let ty = u32::from(first) & TYPE_MASK;
    let mut token_len = 0;
    if ty == TYPE_INITIAL {
        let (n_token, n) = varint(b.get(at..)?)?;
        token_len = usize::try_from(n_token).ok()?;
        at = at.checked_add(n)?.checked_add(token_len)?;
    } else if ty != TYPE_ZERO_RTT && ty != TYPE_HANDSHAKE {
        return None;
    }
    let (payload_len, n) = varint(b.get(at..)?)?;
    let len = at
        .checked_add(n)?
        .checked_add(usize::try_from(payload_len).ok()?)?;
    (len <= b.len()).then_some(LongHeader {
        ty,
        dcid,
        scid,
        token_len,
        len,
    })
}

/// The long-header packets coalesced at the start of a datagram, in order; stops at the
/// first packet it cannot read (a short header, which always comes last, included).
pub fn coalesced(datagram: &[u8]) -> impl Iterator<Item = LongHeader<'_>> {
    let mut rest = datagram;
    std::iter::from_fn(move || {
        let h = long_header(rest)?;
        rest = &rest[h.len..];
        Some(h)
    })
    .take(MAX_COALESCED)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A v1 long-header packet: first byte, version 1, the IDs, the token (Initial only), a
    /// two-byte length and `payload` zero bytes.
    pub(crate) fn packet(ty: u32, dcid: &[u8], scid: &[u8], payload: usize) -> Vec<u8> {
        let mut p = vec![0xc0 | ty as u8 | 0x01];
        p.extend_from_slice(&QUIC_V1.to_be_bytes());
        p.push(dcid.len() as u8);
        p.extend_from_slice(dcid);
        p.push(scid.len() as u8);
        p.extend_from_slice(scid);
        if ty == TYPE_INITIAL {
            p.push(0);
        }
        p.extend_from_slice(&(0x4000 | payload as u16).to_be_bytes());
        p.resize(p.len() + payload, 0);
        p
    }

    #[test]
    fn coalesced_packets_are_read_in_order_up_to_the_short_header() {
        let mut d = packet(TYPE_INITIAL, b"server-1", b"client", 1000);
        d.extend(packet(TYPE_HANDSHAKE, b"server-1", b"client", 40));
        d.extend([0x40, 1, 2, 3]);
        let got: Vec<_> = coalesced(&d).map(|h| (h.ty, h.dcid, h.scid)).collect();
        assert_eq!(
            got,
            [
                (TYPE_INITIAL, &b"server-1"[..], &b"client"[..]),
                (TYPE_HANDSHAKE, &b"server-1"[..], &b"client"[..]),
            ]
        );
        // 1 + 4 + (1 + 8) + (1 + 6) + token length 1 + length 2 + 1000.
        assert_eq!(long_header(&d).unwrap().len, 1024);
    }

    #[test]
    fn truncated_unknown_and_retry_packets_are_not_read() {
        let p = packet(TYPE_HANDSHAKE, b"abc", b"def", 30);
        assert!(long_header(&p).is_some());
        assert!(
            long_header(&p[..p.len() - 1]).is_none(),
            "length past the end"
        );
        let mut v2 = p.clone();
        v2[1..5].copy_from_slice(&0x6b33_43cfu32.to_be_bytes());
        assert!(long_header(&v2).is_none(), "unknown version");
        let mut retry = p.clone();
        retry[0] |= 0x30;
        assert!(long_header(&retry).is_none());
        let mut long_cid = p;
        long_cid[5] = 21;
        assert!(long_header(&long_cid).is_none());
        assert_eq!(coalesced(&[0x40, 0, 0]).count(), 0);
    }

    #[test]
    fn header_forms_and_varints() {
        assert!(is_initial(0xc3));
        assert!(is_initial(0x83)); // greased fixed bit
        assert!(!is_initial(0xe0)); // Handshake
        assert!(!is_initial(0x40)); // short header
        assert!(is_long_header(0xe0));
        assert!(!is_long_header(0x5f));
        assert_eq!(varint(&[0x25]), Some((37, 1)));
        assert_eq!(varint(&[0x7b, 0xbd]), Some((15293, 2)));
        assert_eq!(varint(&[0x9d, 0x7f, 0x3e]), None);
        assert_eq!(Cid::new(b"0123").unwrap().as_slice(), b"0123");
        assert!(Cid::new(&[0; 21]).is_none());
    }
}
