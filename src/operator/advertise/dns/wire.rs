//! The DNS wire format of what the operator sends and reads (RFC 1035): names, records, the
//! RFC 2136 UPDATE message (zone, prerequisites, updates), the HTTPS record's data (RFC 9460)
//! and TXT strings; and the few parts of a response it reads (ID, RCODE, the records it skips
//! to reach the TSIG record at the end). Pure: bytes in, bytes out.

use std::fmt;

pub const TYPE_SOA: u16 = 6;
pub const TYPE_TXT: u16 = 16;
pub const TYPE_HTTPS: u16 = 65;
pub const TYPE_TSIG: u16 = 250;
pub const CLASS_IN: u16 = 1;
/// In prerequisites "this RRset does not exist"; in updates "delete this one record".
pub const CLASS_NONE: u16 = 254;
/// In prerequisites "this RRset exists"; in updates "delete this RRset".
pub const CLASS_ANY: u16 = 255;
const OPCODE_UPDATE: u16 = 5;
/// The HTTPS record's SvcParamKeys we write (RFC 9460 section 14.3.2).
const SVC_ALPN: u16 = 1;
const SVC_PORT: u16 = 3;
/// A DNS message's size limit over TCP (its two-byte length prefix).
pub const MAX_MESSAGE: usize = 65_535;

/// Why a name or a message could not be encoded or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("{name:?} is not a valid DNS name: {why}")]
    Name { name: String, why: &'static str },
    #[error("the message is {0} bytes, above the 65535 a DNS message may have")]
    TooLarge(usize),
    #[error("malformed DNS response: {0}")]
    Malformed(&'static str),
}

/// A domain name, stored as its labels in lowercase (DNS compares names without case, and
/// TSIG signs the lowercase form).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Vec<String>);

impl Name {
    /// `shop.example.com`, with or without the final dot; `*.example.com` for a wildcard;
    /// `.` for the root.
    pub fn parse(text: &str) -> Result<Self, WireError> {
        let bad = |why| WireError::Name {
            name: text.to_string(),
            why,
        };
        let trimmed = text.strip_suffix('.').unwrap_or(text);
        if trimmed.is_empty() {
            return Ok(Name(Vec::new()));
        }
        let mut labels = Vec::new();
        for (i, label) in trimmed.split('.').enumerate() {
            if label.is_empty() {
                return Err(bad("an empty label"));
            }
            if label.len() > 63 {
                return Err(bad("a label longer than 63 bytes"));
            }
            let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
            if !(label.chars().all(ok) || (i == 0 && label == "*")) {
                return Err(bad("a character other than letters, digits, '-' and '_'"));
            }
            labels.push(label.to_ascii_lowercase());
        }
        let name = Name(labels);
        if name.wire_len() > 255 {
            return Err(bad("longer than 255 bytes"));
        }
        Ok(name)
    }

    fn wire_len(&self) -> usize {
        self.0.iter().map(|l| l.len() + 1).sum::<usize>() + 1
    }

    /// Whether `self` is `zone` or below it.
    pub fn is_in(&self, zone: &Name) -> bool {
        self.0.len() >= zone.0.len() && self.0[self.0.len() - zone.0.len()..] == zone.0[..]
    }

    /// `label.self`.
    pub fn child(&self, label: &str) -> Result<Name, WireError> {
        Name::parse(&format!("{label}.{self}"))
    }

    /// Uncompressed, lowercase: the form TSIG signs and the form every name is sent in.
    pub fn encode(&self, out: &mut Vec<u8>) {
        for l in &self.0 {
            out.push(l.len() as u8);
            out.extend_from_slice(l.as_bytes());
        }
        out.push(0);
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, ".");
        }
        write!(f, "{}", self.0.join("."))
    }
}

/// One resource record as an UPDATE carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: Name,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    pub rdata: Vec<u8>,
}

impl Record {
    fn encode(&self, out: &mut Vec<u8>) {
        self.name.encode(out);
        out.extend_from_slice(&self.rtype.to_be_bytes());
        out.extend_from_slice(&self.class.to_be_bytes());
        out.extend_from_slice(&self.ttl.to_be_bytes());
        out.extend_from_slice(&(self.rdata.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.rdata);
    }

    /// Prerequisite: no record of `rtype` exists at `name` (RFC 2136 section 2.4.3).
    pub fn rrset_absent(name: &Name, rtype: u16) -> Record {
        Record::bare(name, rtype, CLASS_NONE)
    }

    /// Update: delete every record of `rtype` at `name` (section 2.5.2).
    pub fn delete_rrset(name: &Name, rtype: u16) -> Record {
        Record::bare(name, rtype, CLASS_ANY)
    }

    /// Prerequisite: the RRset at `name` is exactly these records (section 2.4.2), given as
    /// the records themselves (class IN, TTL 0 is written).
    pub fn rrset_equals(records: &Record) -> Record {
        Record {
            ttl: 0,
            ..records.clone()
        }
    }

    /// Update: delete exactly this record (section 2.5.4).
    pub fn delete_one(record: &Record) -> Record {
        Record {
            class: CLASS_NONE,
            ttl: 0,
            ..record.clone()
        }
    }

    fn bare(name: &Name, rtype: u16, class: u16) -> Record {
        Record {
            name: name.clone(),
            rtype,
            class,
            ttl: 0,
            rdata: Vec::new(),
        }
    }

    /// `name HTTPS 1 . alpn=... [port=...]` (RFC 9460 service mode, target the owner itself).
    pub fn https(name: &Name, ttl: u32, alpn: &[&str], port: Option<u16>) -> Record {
        let mut rdata = Vec::new();
        rdata.extend_from_slice(&1u16.to_be_bytes());
        Name(Vec::new()).encode(&mut rdata);
        let mut ids = Vec::new();
        for a in alpn {
            ids.push(a.len() as u8);
            ids.extend_from_slice(a.as_bytes());
        }
        // SvcParams in increasing key order (section 2.2).
        rdata.extend_from_slice(&SVC_ALPN.to_be_bytes());
        rdata.extend_from_slice(&(ids.len() as u16).to_be_bytes());
        rdata.extend_from_slice(&ids);
        if let Some(p) = port {
            rdata.extend_from_slice(&SVC_PORT.to_be_bytes());
            rdata.extend_from_slice(&2u16.to_be_bytes());
            rdata.extend_from_slice(&p.to_be_bytes());
        }
        Record {
            name: name.clone(),
            rtype: TYPE_HTTPS,
            class: CLASS_IN,
            ttl,
            rdata,
        }
    }

    /// `name TXT "text"` (one character-string; longer text is split into 255-byte strings).
    pub fn txt(name: &Name, ttl: u32, text: &str) -> Record {
        let mut rdata = Vec::new();
        for chunk in text.as_bytes().chunks(255) {
            rdata.push(chunk.len() as u8);
            rdata.extend_from_slice(chunk);
        }
        if text.is_empty() {
            rdata.push(0);
        }
        Record {
            name: name.clone(),
            rtype: TYPE_TXT,
            class: CLASS_IN,
            ttl,
            rdata,
        }
    }
}

/// An RFC 2136 UPDATE of one zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub id: u16,
    pub zone: Name,
    pub prerequisites: Vec<Record>,
    pub updates: Vec<Record>,
}

impl Update {
    /// The message without TSIG (ARCOUNT 0).
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(&self.id.to_be_bytes());
        out.extend_from_slice(&(OPCODE_UPDATE << 11).to_be_bytes());
        for count in [1, self.prerequisites.len(), self.updates.len(), 0] {
            out.extend_from_slice(&(count as u16).to_be_bytes());
        }
        self.zone.encode(&mut out);
        out.extend_from_slice(&TYPE_SOA.to_be_bytes());
        out.extend_from_slice(&CLASS_IN.to_be_bytes());
        for r in self.prerequisites.iter().chain(&self.updates) {
            r.encode(&mut out);
        }
        if out.len() > MAX_MESSAGE {
            return Err(WireError::TooLarge(out.len()));
        }
        Ok(out)
    }
}

/// The response codes an UPDATE can get (RFC 1035, 2136, 8945).
pub mod rcode {
    pub const NOERROR: u16 = 0;
    pub const FORMERR: u16 = 1;
    pub const SERVFAIL: u16 = 2;
    pub const NXDOMAIN: u16 = 3;
    pub const NOTIMP: u16 = 4;
    pub const REFUSED: u16 = 5;
    pub const YXDOMAIN: u16 = 6;
    pub const YXRRSET: u16 = 7;
    pub const NXRRSET: u16 = 8;
    pub const NOTAUTH: u16 = 9;
    pub const NOTZONE: u16 = 10;

    /// Its mnemonic, as servers log it.
    pub fn name(code: u16) -> &'static str {
        match code {
            NOERROR => "NOERROR",
            FORMERR => "FORMERR",
            SERVFAIL => "SERVFAIL",
            NXDOMAIN => "NXDOMAIN",
            NOTIMP => "NOTIMP",
            REFUSED => "REFUSED",
            YXDOMAIN => "YXDOMAIN",
            YXRRSET => "YXRRSET",
            NXRRSET => "NXRRSET",
            NOTAUTH => "NOTAUTH",
            NOTZONE => "NOTZONE",
            16 => "BADSIG",
            17 => "BADKEY",
            18 => "BADTIME",
            _ => "unknown",
        }
    }
}

/// The header fields of a response the operator reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub id: u16,
    pub is_response: bool,
    pub rcode: u16,
    pub counts: [u16; 4],
}

fn u16_at(m: &[u8], at: usize) -> Result<u16, WireError> {
    m.get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or(WireError::Malformed("truncated"))
}

pub fn header(m: &[u8]) -> Result<Header, WireError> {
    let flags = u16_at(m, 2)?;
    Ok(Header {
        id: u16_at(m, 0)?,
        is_response: flags & 0x8000 != 0,
        rcode: flags & 0x000f,
        counts: [u16_at(m, 4)?, u16_at(m, 6)?, u16_at(m, 8)?, u16_at(m, 10)?],
    })
}

/// Reads a possibly compressed name at `at`; returns it and the offset after it in place.
pub fn read_name(m: &[u8], at: usize) -> Result<(Name, usize), WireError> {
    let mut labels = Vec::new();
    let (mut pos, mut end, mut jumps) = (at, None, 0);
    loop {
        let len = *m
            .get(pos)
            .ok_or(WireError::Malformed("name runs past the end"))? as usize;
        match len {
            0 => {
                return Ok((Name(labels), end.unwrap_or(pos + 1)));
            }
            l if l & 0xc0 == 0xc0 => {
                jumps += 1;
                if jumps > 64 {
                    return Err(WireError::Malformed("a loop of name pointers"));
                }
                let target = (u16_at(m, pos)? & 0x3fff) as usize;
                end.get_or_insert(pos + 2);
                pos = target;
            }
            l if l <= 63 => {
                let label = m
                    .get(pos + 1..pos + 1 + l)
                    .ok_or(WireError::Malformed("label runs past the end"))?;
                labels.push(String::from_utf8_lossy(label).to_ascii_lowercase());
                pos += 1 + l;
            }
            _ => return Err(WireError::Malformed("unknown label type")),
        }
    }
}

/// One record as read: where it starts, its section (1: answer or prerequisites, 2: authority
/// or updates, 3: additional), its fields, and where its data is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordAt {
    pub start: usize,
    pub section: u8,
    pub name: Name,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    pub rdata: std::ops::Range<usize>,
}

/// Every record of a message after its question/zone section, in order.
pub fn records(m: &[u8]) -> Result<Vec<RecordAt>, WireError> {
    let h = header(m)?;
    let mut pos = 12;
    for _ in 0..h.counts[0] {
        pos = read_name(m, pos)?.1 + 4;
    }
    let total: usize = h.counts[1..].iter().map(|c| *c as usize).sum();
    let mut out = Vec::with_capacity(total.min(64));
    let sections = (1u8..=3).flat_map(|s| std::iter::repeat_n(s, h.counts[s as usize] as usize));
    for section in sections {
        let start = pos;
        let (name, after) = read_name(m, pos)?;
        let rtype = u16_at(m, after)?;
        let class = u16_at(m, after + 2)?;
        let ttl = (u32::from(u16_at(m, after + 4)?) << 16) | u32::from(u16_at(m, after + 6)?);
        let len = u16_at(m, after + 8)? as usize;
        let data = after + 10;
        if data + len > m.len() {
            return Err(WireError::Malformed("record data runs past the end"));
        }
        out.push(RecordAt {
            start,
            section,
            name,
            rtype,
            class,
            ttl,
            rdata: data..data + len,
        });
        pos = data + len;
    }
    Ok(out)
}

/// A standard query (no recursion wanted: the server is authoritative) for `name TYPE`.
pub fn query(id: u16, name: &Name, rtype: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    name.encode(&mut out);
    out.extend_from_slice(&rtype.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out
}

/// The character-strings of a TXT record's data, joined (as one value was split to write it).
pub fn txt_text(rdata: &[u8]) -> Result<String, WireError> {
    let mut out = Vec::with_capacity(rdata.len());
    let mut at = 0;
    while at < rdata.len() {
        let len = rdata[at] as usize;
        let chunk = rdata
            .get(at + 1..at + 1 + len)
            .ok_or(WireError::Malformed("TXT string runs past its record"))?;
        out.extend_from_slice(chunk);
        at += 1 + len;
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// The SOA serial of a record's data (after the two names).
pub fn soa_serial(m: &[u8], rdata: std::ops::Range<usize>) -> Result<u32, WireError> {
    let (_, after_mname) = read_name(m, rdata.start)?;
    let (_, after_rname) = read_name(m, after_mname)?;
    let b = m
        .get(after_rname..after_rname + 4)
        .filter(|_| after_rname + 20 <= rdata.end)
        .ok_or(WireError::Malformed("SOA record too short"))?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_lowercase_and_refuse_what_dns_cannot_carry() {
        let n = Name::parse("Shop.Example.COM.").unwrap();
        assert_eq!(n.to_string(), "shop.example.com");
        let mut w = Vec::new();
        n.encode(&mut w);
        assert_eq!(w, b"\x04shop\x07example\x03com\x00");
        assert_eq!(Name::parse(".").unwrap().to_string(), ".");
        assert!(Name::parse("*.example.com").is_ok());
        for bad in ["a..b", "a.*.b", "sp ace.com", &"x".repeat(64), "ü.com"] {
            assert!(Name::parse(bad).is_err(), "{bad}");
        }
        let long = vec!["abcdefghij"; 26].join(".");
        assert!(Name::parse(&long).is_err(), "over 255 bytes");
        let zone = Name::parse("example.com").unwrap();
        assert!(n.is_in(&zone) && zone.is_in(&zone));
        assert!(!Name::parse("example.org").unwrap().is_in(&zone));
        assert!(!Name::parse("badexample.com").unwrap().is_in(&zone));
    }

    #[test]
    fn the_https_record_is_service_mode_on_its_own_name_with_sorted_params() {
        let n = Name::parse("a.example.com").unwrap();
        let r = Record::https(&n, 60, &["h3", "h2"], Some(8443));
        assert_eq!(
            r.rdata,
            [
                0, 1, // SvcPriority 1: service mode
                0, // TargetName ".": the owner itself
                0, 1, 0, 6, 2, b'h', b'3', 2, b'h', b'2', // alpn="h3,h2"
                0, 3, 0, 2, 0x20, 0xfb, // port=8443
            ]
        );
        assert_eq!(
            Record::https(&n, 60, &["h3"], None).rdata.len(),
            2 + 1 + 4 + 3
        );
    }

    #[test]
    fn txt_splits_into_character_strings_and_reads_back_whole() {
        let n = Name::parse("t.example.com").unwrap();
        let text = "x".repeat(300);
        let r = Record::txt(&n, 0, &text);
        assert_eq!(r.rdata[0], 255);
        assert_eq!(r.rdata[256], 45);
        assert_eq!(r.rdata.len(), 302);
        assert_eq!(txt_text(&r.rdata).unwrap(), text);
        assert!(txt_text(&[5, b'a']).is_err());
    }

    #[test]
    fn an_update_encodes_and_reads_back() {
        let zone = Name::parse("example.com").unwrap();
        let host = Name::parse("a.example.com").unwrap();
        let u = Update {
            id: 0x1234,
            zone,
            prerequisites: vec![Record::rrset_absent(&host, TYPE_HTTPS)],
            updates: vec![Record::https(&host, 60, &["h3", "h2"], None)],
        };
        let m = u.encode().unwrap();
        let h = header(&m).unwrap();
        assert_eq!(h.id, 0x1234);
        assert!(!h.is_response);
        assert_eq!(u16::from_be_bytes([m[2], m[3]]) >> 11, 5, "opcode UPDATE");
        assert_eq!(h.counts, [1, 1, 1, 0]);
        let rs = records(&m).unwrap();
        assert_eq!(rs.len(), 2);
        assert_eq!((rs[0].rtype, rs[0].class), (TYPE_HTTPS, CLASS_NONE));
        assert!(rs[0].rdata.is_empty());
        assert_eq!(&m[rs[1].rdata.clone()], &u.updates[0].rdata[..]);
    }

    #[test]
    fn compressed_names_are_read_and_pointer_loops_refused() {
        // Header (1 question), question "a.example.com" at 12, then a record whose name is
        // a pointer to offset 14 ("example.com").
        let mut m = vec![0, 1, 0x80, 0, 0, 1, 0, 1, 0, 0, 0, 0];
        Name::parse("a.example.com").unwrap().encode(&mut m);
        m.extend_from_slice(&[0, 6, 0, 1]);
        m.extend_from_slice(&[0xc0, 14, 0, 16, 0, 1, 0, 0, 0, 0, 0, 1, 0]);
        let rs = records(&m).unwrap();
        assert_eq!(rs[0].name.to_string(), "example.com");
        let looped = [0xc0u8, 0];
        assert!(read_name(&looped, 0).is_err());
        assert!(records(&m[..m.len() - 3]).is_err(), "truncated record");
    }
}
