//! IP packet parsing, IPv4 fragmentation and ICMP error generation. Pure: byte slices in,
//! byte vectors out, so every rule of the emulator is unit-testable without a TUN device.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const PROTO_ICMP: u8 = 1;
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
pub const PROTO_ICMPV6: u8 = 58;

const IPV4_DF: u16 = 0x4000;
const IPV4_MF: u16 = 0x2000;
const IPV4_OFFSET_MASK: u16 = 0x1fff;
const IPV6_HEADER: usize = 40;
/// RFC 1812 4.3.2.3: an ICMPv4 error carries as much of the offending packet as fits in 576 bytes.
const ICMPV4_MAX_TOTAL: usize = 576;
/// RFC 4443 2.4(c): an ICMPv6 error must not exceed the IPv6 minimum MTU.
const ICMPV6_MAX_TOTAL: usize = 1280;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("packet too short")]
    Truncated,
    #[error("IP version {0} is neither 4 nor 6")]
    Version(u8),
    #[error("header length field is inconsistent with the packet")]
    BadLength,
}

/// What the emulator needs to know about one IP packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketInfo {
    pub src: IpAddr,
    pub dst: IpAddr,
    /// Transport protocol (after IPv6 extension headers).
    pub proto: u8,
    /// Bytes of IP header (IPv4 header with options, or IPv6 header plus extension headers).
    pub header_len: usize,
    /// Length as stated by the IP header (never more than the buffer).
    pub total_len: usize,
    /// Source and destination port, when the transport header is present (TCP/UDP, first fragment).
    pub ports: Option<(u16, u16)>,
    /// TCP payload bytes or UDP payload bytes; 0 when unknown.
    pub payload_len: usize,
    /// TCP flags byte (0 for other protocols).
    pub tcp_flags: u8,
    /// UDP payload starts with a QUIC long header (Initial, 0-RTT, Handshake, Retry): the
    /// datagram carries handshake data, which short-header (1-RTT) datagrams never do.
    pub quic_long_header: bool,
    /// IPv4 Don't Fragment bit (always false for IPv6, which has none).
    pub df: bool,
    /// The packet is an IP fragment (IPv4 MF/offset, or an IPv6 Fragment header).
    pub fragment: bool,
    /// ICMP/ICMPv6 type if the packet is one.
    pub icmp_type: Option<u8>,
}

impl PacketInfo {
    pub fn is_ipv4(&self) -> bool {
        self.src.is_ipv4()
    }
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub fn parse(pkt: &[u8]) -> Result<PacketInfo, ParseError> {
    let first = *pkt.first().ok_or(ParseError::Truncated)?;
    match first >> 4 {
        4 => parse_v4(pkt),
        6 => parse_v6(pkt),
        v => Err(ParseError::Version(v)),
    }
}

fn parse_v4(pkt: &[u8]) -> Result<PacketInfo, ParseError> {
    if pkt.len() < 20 {
        return Err(ParseError::Truncated);
    }
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(be16(pkt, 2));
    if ihl < 20 || total < ihl || total > pkt.len() {
        return Err(ParseError::BadLength);
    }
    let frag = be16(pkt, 6);
    let offset = frag & IPV4_OFFSET_MASK;
    let proto = pkt[9];
    let src = Ipv4Addr::new(pkt[12], pkt[13], pkt[14], pkt[15]);
    let dst = Ipv4Addr::new(pkt[16], pkt[17], pkt[18], pkt[19]);
    let mut info = PacketInfo {
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
        proto,
        header_len: ihl,
        total_len: total,
        ports: None,
        payload_len: 0,
        tcp_flags: 0,
        quic_long_header: false,
        df: frag & IPV4_DF != 0,
        fragment: frag & IPV4_MF != 0 || offset != 0,
        icmp_type: None,
    };
    // Only the first fragment carries the transport header.
    if offset == 0 {
        transport(&mut info, &pkt[ihl..total]);
    }
    Ok(info)
}

fn parse_v6(pkt: &[u8]) -> Result<PacketInfo, ParseError> {
    if pkt.len() < IPV6_HEADER {
        return Err(ParseError::Truncated);
    }
    let total = IPV6_HEADER + usize::from(be16(pkt, 4));
    if total > pkt.len() {
        return Err(ParseError::BadLength);
    }
    let mut src = [0u8; 16];
    src.copy_from_slice(&pkt[8..24]);
    let mut dst = [0u8; 16];
    dst.copy_from_slice(&pkt[24..40]);
    let mut next = pkt[6];
    let mut at = IPV6_HEADER;
    let mut fragment = false;
    let mut first_fragment = true;
    // Walk the extension headers that may precede the transport header.
    loop {
        match next {
            0 | 43 | 60 => {
                if at + 8 > total {
                    return Err(ParseError::BadLength);
                }
                next = pkt[at];
                at += (usize::from(pkt[at + 1]) + 1) * 8;
            }
            44 => {
                if at + 8 > total {
                    return Err(ParseError::BadLength);
                }
                fragment = true;
                first_fragment = be16(pkt, at + 2) >> 3 == 0;
                next = pkt[at];
                at += 8;
            }
            _ => break,
        }
        if at > total {
            return Err(ParseError::BadLength);
        }
    }
    let mut info = PacketInfo {
        src: IpAddr::V6(Ipv6Addr::from(src)),
        dst: IpAddr::V6(Ipv6Addr::from(dst)),
        proto: next,
        header_len: at,
        total_len: total,
        ports: None,
        payload_len: 0,
        tcp_flags: 0,
        quic_long_header: false,
        df: false,
        fragment,
        icmp_type: None,
    };
    if first_fragment {
        transport(&mut info, &pkt[at..total]);
    }
    Ok(info)
}

fn transport(info: &mut PacketInfo, seg: &[u8]) {
    match info.proto {
        PROTO_TCP if seg.len() >= 20 => {
            info.ports = Some((be16(seg, 0), be16(seg, 2)));
            let data_offset = usize::from(seg[12] >> 4) * 4;
            info.tcp_flags = seg[13];
            info.payload_len = seg.len().saturating_sub(data_offset);
        }
        PROTO_UDP if seg.len() >= 8 => {
            info.ports = Some((be16(seg, 0), be16(seg, 2)));
            info.payload_len = seg.len() - 8;
            info.quic_long_header = seg.get(8).is_some_and(|b| b & 0x80 != 0);
        }
        PROTO_ICMP | PROTO_ICMPV6 if !seg.is_empty() => info.icmp_type = Some(seg[0]),
        _ => {}
    }
}

/// RFC 1071 one's-complement sum, continued from `start`.
fn sum16(data: &[u8], start: u32) -> u32 {
    let mut sum = start;
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u32::from(*last) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn checksum(data: &[u8]) -> u16 {
    fold(sum16(data, 0))
}

fn set_ipv4_checksum(hdr: &mut [u8]) {
    hdr[10] = 0;
    hdr[11] = 0;
    let c = checksum(hdr);
    hdr[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Splits an IPv4 packet that has no DF bit into fragments of at most `mtu` bytes, the way a
/// router does (RFC 791): payload cut at multiples of 8 bytes, MF on all but the last piece,
/// offsets relative to the original datagram (so an existing fragment can be split again).
/// Every fragment keeps the full header, options included; the hosts in the lab send none.
pub fn fragment_ipv4(pkt: &[u8], mtu: usize, mut out: impl FnMut(&[u8])) -> usize {
    let ihl = usize::from(pkt[0] & 0x0f) * 4;
    let total = usize::from(be16(pkt, 2)).min(pkt.len());
    let payload = &pkt[ihl..total];
    let per = ((mtu.saturating_sub(ihl)) / 8) * 8;
    if per == 0 {
        return 0;
    }
    let orig = be16(pkt, 6);
    let orig_offset = usize::from(orig & IPV4_OFFSET_MASK) * 8;
    let orig_mf = orig & IPV4_MF != 0;
    let mut buf = [0u8; 65536];
    let mut count = 0;
    let mut at = 0;
    while at < payload.len() {
        let n = per.min(payload.len() - at);
        let last = at + n == payload.len();
        let len = ihl + n;
        buf[..ihl].copy_from_slice(&pkt[..ihl]);
        buf[2..4].copy_from_slice(&(len as u16).to_be_bytes());
        let mut flags = (((orig_offset + at) / 8) as u16) & IPV4_OFFSET_MASK;
        if !last || orig_mf {
            flags |= IPV4_MF;
        }
        buf[6..8].copy_from_slice(&flags.to_be_bytes());
        buf[ihl..len].copy_from_slice(&payload[at..at + n]);
        set_ipv4_checksum(&mut buf[..ihl]);
        out(&buf[..len]);
        count += 1;
        at += n;
    }
    count
}

/// ICMPv4 "fragmentation needed and DF set" (type 3 code 4, RFC 1191) from `router` back to
/// the sender of `pkt`, announcing `mtu`.
pub fn icmpv4_frag_needed(pkt: &[u8], router: Ipv4Addr, mtu: u16) -> Option<Vec<u8>> {
    let info = parse_v4(pkt).ok()?;
    let IpAddr::V4(sender) = info.src else {
        return None;
    };
    // Never answer an ICMP error with an ICMP error (RFC 1122 3.2.2).
    if info.proto == PROTO_ICMP && !matches!(info.icmp_type, Some(0) | Some(8)) {
        return None;
    }
    let quoted = info.total_len.min(ICMPV4_MAX_TOTAL - 28);
    let total = 28 + quoted;
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[8] = 64;
    p[9] = PROTO_ICMP;
    p[12..16].copy_from_slice(&router.octets());
    p[16..20].copy_from_slice(&sender.octets());
    set_ipv4_checksum(&mut p[..20]);
    p[20] = 3;
    p[21] = 4;
    p[26..28].copy_from_slice(&mtu.to_be_bytes());
    p[28..].copy_from_slice(&pkt[..quoted]);
    let c = checksum(&p[20..]);
    p[22..24].copy_from_slice(&c.to_be_bytes());
    Some(p)
}

/// ICMPv6 Packet Too Big (type 2, RFC 4443 3.2) from `router` back to the sender of `pkt`.
pub fn icmpv6_packet_too_big(pkt: &[u8], router: Ipv6Addr, mtu: u32) -> Option<Vec<u8>> {
    let info = parse_v6(pkt).ok()?;
    let IpAddr::V6(sender) = info.src else {
        return None;
    };
    // ICMPv6 errors are not sent in reply to errors (types below 128).
    if info.proto == PROTO_ICMPV6 && info.icmp_type.is_some_and(|t| t < 128) {
        return None;
    }
    let quoted = info.total_len.min(ICMPV6_MAX_TOTAL - 48);
    let icmp_len = 8 + quoted;
    let mut p = vec![0u8; 40 + icmp_len];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(icmp_len as u16).to_be_bytes());
    p[6] = PROTO_ICMPV6;
    p[7] = 64;
    p[8..24].copy_from_slice(&router.octets());
    p[24..40].copy_from_slice(&sender.octets());
    p[40] = 2;
    p[44..48].copy_from_slice(&mtu.to_be_bytes());
    p[48..].copy_from_slice(&pkt[..quoted]);
    // Pseudo-header: source, destination, upper-layer length, next header.
    let mut s = sum16(&p[8..40], 0);
    s += icmp_len as u32;
    s += u32::from(PROTO_ICMPV6);
    let c = fold(sum16(&p[40..], s));
    p[42..44].copy_from_slice(&c.to_be_bytes());
    Some(p)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A UDP/IPv4 datagram with `payload` bytes; checksums are valid.
    pub fn udp4(
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        payload: usize,
        df: bool,
    ) -> Vec<u8> {
        let total = 28 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
        if df {
            p[6] = 0x40;
        }
        p[8] = 64;
        p[9] = PROTO_UDP;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        set_ipv4_checksum(&mut p[..20]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[24..26].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        for (i, b) in p[28..].iter_mut().enumerate() {
            *b = i as u8;
        }
        p
    }

    pub fn tcp4(
        src: [u8; 4],
        sport: u16,
        dst: [u8; 4],
        dport: u16,
        flags: u8,
        payload: usize,
    ) -> Vec<u8> {
        let total = 40 + payload;
        let mut p = vec![0u8; total];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
        p[6] = 0x40;
        p[8] = 64;
        p[9] = PROTO_TCP;
        p[12..16].copy_from_slice(&src);
        p[16..20].copy_from_slice(&dst);
        set_ipv4_checksum(&mut p[..20]);
        p[20..22].copy_from_slice(&sport.to_be_bytes());
        p[22..24].copy_from_slice(&dport.to_be_bytes());
        p[32] = 5 << 4;
        p[33] = flags;
        p
    }

    pub fn udp6(src: Ipv6Addr, sport: u16, dst: Ipv6Addr, dport: u16, payload: usize) -> Vec<u8> {
        let mut p = vec![0u8; 48 + payload];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        p[6] = PROTO_UDP;
        p[7] = 64;
        p[8..24].copy_from_slice(&src.octets());
        p[24..40].copy_from_slice(&dst.octets());
        p[40..42].copy_from_slice(&sport.to_be_bytes());
        p[42..44].copy_from_slice(&dport.to_be_bytes());
        p[44..46].copy_from_slice(&((8 + payload) as u16).to_be_bytes());
        p
    }

    #[test]
    fn parses_udp4_with_df() {
        let p = udp4([10, 77, 2, 2], 443, [10, 77, 1, 2], 5555, 1200, true);
        let i = parse(&p).unwrap();
        assert_eq!(i.proto, PROTO_UDP);
        assert_eq!(i.ports, Some((443, 5555)));
        assert_eq!(i.payload_len, 1200);
        assert!(i.df);
        assert!(!i.fragment);
        assert_eq!(i.total_len, 1228);
        assert_eq!(checksum(&p[..20]), 0, "header checksum must verify");
    }

    #[test]
    fn parses_tcp_payload_and_flags() {
        let p = tcp4([10, 77, 1, 2], 40000, [10, 77, 2, 2], 443, TCP_SYN, 0);
        let i = parse(&p).unwrap();
        assert_eq!(i.tcp_flags, TCP_SYN);
        assert_eq!(i.payload_len, 0);
        let p = tcp4([10, 77, 2, 2], 443, [10, 77, 1, 2], 40000, 0x18, 1448);
        assert_eq!(parse(&p).unwrap().payload_len, 1448);
    }

    #[test]
    fn parses_ipv6_and_rejects_garbage() {
        let a: Ipv6Addr = "fd77:1::2".parse().unwrap();
        let b: Ipv6Addr = "fd77:2::2".parse().unwrap();
        let p = udp6(a, 1000, b, 443, 1200);
        let i = parse(&p).unwrap();
        assert_eq!(i.dst, IpAddr::V6(b));
        assert_eq!(i.ports, Some((1000, 443)));
        assert!(!i.df);
        assert_eq!(parse(&[0x50; 40]), Err(ParseError::Version(5)));
        assert_eq!(parse(&p[..30]), Err(ParseError::Truncated));
        let mut short = p.clone();
        short.truncate(100);
        assert_eq!(parse(&short), Err(ParseError::BadLength));
    }

    #[test]
    fn fragments_a_non_df_datagram_and_they_reassemble() {
        let p = udp4([10, 77, 2, 2], 443, [10, 77, 1, 2], 5555, 2972, false);
        let mut frags = Vec::new();
        let n = fragment_ipv4(&p, 1280, |f| frags.push(f.to_vec()));
        assert_eq!(n, 3);
        let mut payload = Vec::new();
        for (k, f) in frags.iter().enumerate() {
            assert!(f.len() <= 1280);
            assert_eq!(checksum(&f[..20]), 0);
            let i = parse(f).unwrap();
            assert!(i.fragment);
            let flags = be16(f, 6);
            assert_eq!(flags & IPV4_MF != 0, k + 1 < frags.len());
            assert_eq!(usize::from(flags & IPV4_OFFSET_MASK) * 8, payload.len());
            payload.extend_from_slice(&f[20..]);
        }
        assert_eq!(payload, p[20..]);
        // Splitting a middle fragment again keeps its offset and MF bit.
        let mut again = Vec::new();
        fragment_ipv4(&frags[1], 600, |f| again.push(f.to_vec()));
        assert_eq!(usize::from(be16(&again[0], 6) & IPV4_OFFSET_MASK) * 8, 1256);
        assert!(again.iter().all(|f| be16(f, 6) & IPV4_MF != 0));
    }

    #[test]
    fn icmpv4_frag_needed_quotes_the_packet() {
        let p = udp4([10, 77, 2, 2], 443, [10, 77, 1, 2], 5555, 1400, true);
        let icmp = icmpv4_frag_needed(&p, Ipv4Addr::new(10, 77, 2, 1), 1280).unwrap();
        let i = parse(&icmp).unwrap();
        assert_eq!(i.dst, IpAddr::V4(Ipv4Addr::new(10, 77, 2, 2)));
        assert_eq!(i.icmp_type, Some(3));
        assert_eq!(icmp[21], 4);
        assert_eq!(be16(&icmp, 26), 1280);
        assert_eq!(icmp.len(), 576);
        assert_eq!(checksum(&icmp[20..]), 0);
        assert_eq!(checksum(&icmp[..20]), 0);
        assert_eq!(&icmp[28..48], &p[..20]);
        // No error about an error.
        assert!(icmpv4_frag_needed(&icmp, Ipv4Addr::new(10, 77, 1, 1), 1000).is_none());
    }

    #[test]
    fn icmpv6_packet_too_big_has_valid_checksum() {
        let a: Ipv6Addr = "fd77:2::2".parse().unwrap();
        let b: Ipv6Addr = "fd77:1::2".parse().unwrap();
        let r: Ipv6Addr = "fd77:2::1".parse().unwrap();
        let p = udp6(a, 443, b, 1000, 1400);
        let icmp = icmpv6_packet_too_big(&p, r, 1280).unwrap();
        assert_eq!(icmp.len(), 1280);
        let i = parse(&icmp).unwrap();
        assert_eq!(i.icmp_type, Some(2));
        assert_eq!(i.dst, IpAddr::V6(a));
        let len = icmp.len() - 40;
        let mut s = sum16(&icmp[8..40], 0) + len as u32 + u32::from(PROTO_ICMPV6);
        s = sum16(&icmp[40..], s);
        assert_eq!(fold(s), 0);
        assert!(icmpv6_packet_too_big(&icmp, r, 1280).is_none());
    }
}
