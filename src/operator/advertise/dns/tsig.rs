//! TSIG (RFC 8945): an UPDATE is signed with a key shared with the DNS server, and the
//! server's answer is checked with the same key before the operator believes it. HMAC-SHA256
//! by default (what `tsig-keygen` and `keymgr` make), SHA-384 and SHA-512 as well. Pure: the
//! time is an argument.

use ring::hmac;

use super::wire::{self, Name, WireError, CLASS_ANY, TYPE_TSIG};

/// How far the server's clock and ours may differ (RFC 8945 section 10 recommends 300 s).
pub const FUDGE_SECONDS: u16 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    HmacSha256,
    HmacSha384,
    HmacSha512,
}

impl Algorithm {
    /// `hmac-sha256` etc., as key files and server configurations name them.
    pub fn parse(text: &str) -> Option<Algorithm> {
        match text
            .trim()
            .trim_end_matches('.')
            .to_ascii_lowercase()
            .as_str()
        {
            "hmac-sha256" => Some(Algorithm::HmacSha256),
            "hmac-sha384" => Some(Algorithm::HmacSha384),
            "hmac-sha512" => Some(Algorithm::HmacSha512),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::HmacSha256 => "hmac-sha256",
            Algorithm::HmacSha384 => "hmac-sha384",
            Algorithm::HmacSha512 => "hmac-sha512",
        }
    }

    fn ring(self) -> hmac::Algorithm {
        match self {
            Algorithm::HmacSha256 => hmac::HMAC_SHA256,
            Algorithm::HmacSha384 => hmac::HMAC_SHA384,
            Algorithm::HmacSha512 => hmac::HMAC_SHA512,
        }
    }
}

/// A TSIG key: its name (the same on both sides), algorithm and secret.
#[derive(Clone)]
pub struct Key {
    pub name: Name,
    pub algorithm: Algorithm,
    secret: hmac::Key,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({} {})", self.name, self.algorithm.name())
    }
}

impl Key {
    pub fn new(name: Name, algorithm: Algorithm, secret: &[u8]) -> Key {
        Key {
            secret: hmac::Key::new(algorithm.ring(), secret),
            name,
            algorithm,
        }
    }
}

/// Why a server's answer was not believed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TsigError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("the answer is not signed (the server said {0})")]
    Unsigned(&'static str),
    #[error("the answer is signed with key {0}, not ours")]
    OtherKey(String),
    #[error("the answer's signature does not verify with our key")]
    BadSignature,
    #[error("the server refused our signature: {0}")]
    Refused(&'static str),
    #[error(
        "the answer was signed {0} s away from our clock (more than the {FUDGE_SECONDS} s allowed)"
    )]
    Time(i64),
}

/// The TSIG variables (RFC 8945 section 4.3.3) in wire form, after the key name.
fn variables(key: &Key, time: u64, fudge: u16, error: u16, other: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(64);
    key.name.encode(&mut v);
    v.extend_from_slice(&CLASS_ANY.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes());
    Name::parse(key.algorithm.name())
        .expect("algorithm names are valid")
        .encode(&mut v);
    v.extend_from_slice(&time.to_be_bytes()[2..]);
    v.extend_from_slice(&fudge.to_be_bytes());
    v.extend_from_slice(&error.to_be_bytes());
    v.extend_from_slice(&(other.len() as u16).to_be_bytes());
    v.extend_from_slice(other);
    v
}

/// Signs `message` (ARCOUNT 0 or more, no TSIG yet) at `now` (Unix seconds): appends the TSIG
/// record and counts it. Returns the MAC, which the answer's signature covers.
pub fn sign(message: &mut Vec<u8>, key: &Key, now: u64) -> Vec<u8> {
    let mut ctx = hmac::Context::with_key(&key.secret);
    ctx.update(message);
    ctx.update(&variables(key, now, FUDGE_SECONDS, 0, &[]));
    let mac = ctx.sign().as_ref().to_vec();
    let id = [message[0], message[1]];
    let mut rdata = Vec::with_capacity(64 + mac.len());
    Name::parse(key.algorithm.name())
        .expect("algorithm names are valid")
        .encode(&mut rdata);
    rdata.extend_from_slice(&now.to_be_bytes()[2..]);
    rdata.extend_from_slice(&FUDGE_SECONDS.to_be_bytes());
    rdata.extend_from_slice(&(mac.len() as u16).to_be_bytes());
    rdata.extend_from_slice(&mac);
    rdata.extend_from_slice(&id);
    rdata.extend_from_slice(&0u16.to_be_bytes());
    rdata.extend_from_slice(&0u16.to_be_bytes());
    key.name.encode(message);
    message.extend_from_slice(&TYPE_TSIG.to_be_bytes());
    message.extend_from_slice(&CLASS_ANY.to_be_bytes());
    message.extend_from_slice(&0u32.to_be_bytes());
    message.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    message.extend_from_slice(&rdata);
    let arcount = u16::from_be_bytes([message[10], message[11]]) + 1;
    message[10..12].copy_from_slice(&arcount.to_be_bytes());
    mac
}

/// The fields of a TSIG record's data.
struct Fields<'a> {
    algorithm: Name,
    time: u64,
    fudge: u16,
    mac: &'a [u8],
    original_id: u16,
    error: u16,
    other: &'a [u8],
}

fn fields(m: &[u8], rdata: std::ops::Range<usize>) -> Result<Fields<'_>, WireError> {
    let short = WireError::Malformed("TSIG record too short");
    let (algorithm, mut at) = wire::read_name(m, rdata.start)?;
    let d = m.get(at..rdata.end).ok_or(short.clone())?;
    if d.len() < 10 {
        return Err(short);
    }
    let time = u64::from_be_bytes([0, 0, d[0], d[1], d[2], d[3], d[4], d[5]]);
    let fudge = u16::from_be_bytes([d[6], d[7]]);
    let mac_len = u16::from_be_bytes([d[8], d[9]]) as usize;
    at += 10;
    let mac = m.get(at..at + mac_len).ok_or(short.clone())?;
    at += mac_len;
    let rest = m.get(at..rdata.end).ok_or(short.clone())?;
    if rest.len() < 6 {
        return Err(short);
    }
    let other_len = u16::from_be_bytes([rest[4], rest[5]]) as usize;
    Ok(Fields {
        algorithm,
        time,
        fudge,
        mac,
        original_id: u16::from_be_bytes([rest[0], rest[1]]),
        error: u16::from_be_bytes([rest[2], rest[3]]),
        other: rest.get(6..6 + other_len).ok_or(short)?,
    })
}

/// Checks the signature of `answer` to a request whose MAC was `request_mac`, at `now`.
pub fn verify(answer: &[u8], key: &Key, request_mac: &[u8], now: u64) -> Result<(), TsigError> {
    let h = wire::header(answer)?;
    let records = wire::records(answer)?;
    let Some(tsig) = records.last().filter(|r| r.rtype == TYPE_TSIG) else {
        return Err(TsigError::Unsigned(wire::rcode::name(h.rcode)));
    };
    let f = fields(answer, tsig.rdata.clone())?;
    if f.error != 0 {
        return Err(TsigError::Refused(wire::rcode::name(f.error)));
    }
    if tsig.name != key.name || f.algorithm.to_string() != key.algorithm.name() {
        return Err(TsigError::OtherKey(format!(
            "{} {}",
            tsig.name, f.algorithm
        )));
    }
    let mut unsigned = answer[..tsig.start].to_vec();
    unsigned[0..2].copy_from_slice(&f.original_id.to_be_bytes());
    unsigned[10..12].copy_from_slice(&(h.counts[3] - 1).to_be_bytes());
    let mut signed = Vec::with_capacity(2 + request_mac.len() + unsigned.len() + 64);
    signed.extend_from_slice(&(request_mac.len() as u16).to_be_bytes());
    signed.extend_from_slice(request_mac);
    signed.extend_from_slice(&unsigned);
    signed.extend_from_slice(&variables(key, f.time, f.fudge, f.error, f.other));
    // ring compares in constant time.
    if hmac::verify(&key.secret, &signed, f.mac).is_err() {
        return Err(TsigError::BadSignature);
    }
    let skew = f.time as i64 - now as i64;
    if skew.unsigned_abs() > u64::from(f.fudge) {
        return Err(TsigError::Time(skew));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::advertise::dns::wire::{Record, Update, TYPE_HTTPS};

    fn key(secret: &[u8]) -> Key {
        Key::new(
            Name::parse("h3-ingress").unwrap(),
            Algorithm::HmacSha256,
            secret,
        )
    }

    fn request() -> Vec<u8> {
        let host = Name::parse("a.example.com").unwrap();
        Update {
            id: 7,
            zone: Name::parse("example.com").unwrap(),
            prerequisites: vec![],
            updates: vec![Record::https(&host, 60, &["h3"], None)],
        }
        .encode()
        .unwrap()
    }

    /// A server's answer to `req`, signed the way RFC 8945 section 5.3 says a server signs.
    fn answer(req_mac: &[u8], k: &Key, time: u64, id: u16) -> Vec<u8> {
        let mut a = vec![0, 0, 0xa8, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        a[0..2].copy_from_slice(&7u16.to_be_bytes());
        Name::parse("example.com").unwrap().encode(&mut a);
        a.extend_from_slice(&[0, 6, 0, 1]);
        let mut ctx = hmac::Context::with_key(&k.secret);
        ctx.update(&(req_mac.len() as u16).to_be_bytes());
        ctx.update(req_mac);
        ctx.update(&a);
        ctx.update(&variables(k, time, FUDGE_SECONDS, 0, &[]));
        let mac = ctx.sign().as_ref().to_vec();
        let mut rdata = Vec::new();
        Name::parse("hmac-sha256").unwrap().encode(&mut rdata);
        rdata.extend_from_slice(&time.to_be_bytes()[2..]);
        rdata.extend_from_slice(&FUDGE_SECONDS.to_be_bytes());
        rdata.extend_from_slice(&(mac.len() as u16).to_be_bytes());
        rdata.extend_from_slice(&mac);
        rdata.extend_from_slice(&7u16.to_be_bytes());
        rdata.extend_from_slice(&[0, 0, 0, 0]);
        a[0..2].copy_from_slice(&id.to_be_bytes());
        k.name.encode(&mut a);
        a.extend_from_slice(&[0, 250, 0, 255, 0, 0, 0, 0]);
        a.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        a.extend_from_slice(&rdata);
        a[11] = 1;
        a
    }

    #[test]
    fn a_signed_request_carries_one_tsig_record_over_the_whole_message() {
        let k = key(b"0123456789abcdef0123456789abcdef");
        let mut m = request();
        let plain = m.clone();
        let mac = sign(&mut m, &k, 1_800_000_000);
        assert_eq!(mac.len(), 32);
        let rs = wire::records(&m).unwrap();
        let t = rs.last().unwrap();
        assert_eq!((t.rtype, t.class), (TYPE_TSIG, CLASS_ANY));
        assert_eq!(wire::header(&m).unwrap().counts[3], 1);
        // The MAC is HMAC(message || variables), recomputed independently here.
        let mut ctx = hmac::Context::with_key(&k.secret);
        ctx.update(&plain);
        let mut vars = b"\x0ah3-ingress\x00\x00\xff\x00\x00\x00\x00\x0bhmac-sha256\x00".to_vec();
        vars.extend_from_slice(&1_800_000_000u64.to_be_bytes()[2..]);
        vars.extend_from_slice(&[0x01, 0x2c, 0, 0, 0, 0]);
        ctx.update(&vars);
        assert_eq!(ctx.sign().as_ref(), &mac[..]);
        assert_eq!(rs[0].rtype, TYPE_HTTPS);
    }

    #[test]
    fn answers_are_believed_only_when_signed_by_our_key_in_time() {
        let k = key(b"0123456789abcdef0123456789abcdef");
        let mut m = request();
        let mac = sign(&mut m, &k, 1_800_000_000);
        let ok = answer(&mac, &k, 1_800_000_010, 99);
        assert_eq!(verify(&ok, &k, &mac, 1_800_000_000), Ok(()));
        let other = key(b"another secret of thirty-two b!!");
        assert_eq!(
            verify(
                &answer(&mac, &other, 1_800_000_010, 99),
                &k,
                &mac,
                1_800_000_000
            ),
            Err(TsigError::BadSignature)
        );
        let mut tampered = ok.clone();
        tampered[3] ^= 0x05;
        assert_eq!(
            verify(&tampered, &k, &mac, 1_800_000_000),
            Err(TsigError::BadSignature)
        );
        assert_eq!(
            verify(&ok, &k, b"another request", 1_800_000_000),
            Err(TsigError::BadSignature)
        );
        assert_eq!(
            verify(&ok, &k, &mac, 1_800_001_000),
            Err(TsigError::Time(-990))
        );
        let unsigned = &ok[..12 + 13 + 4];
        let mut unsigned = unsigned.to_vec();
        unsigned[11] = 0;
        unsigned[3] = 0x05; // REFUSED
        assert_eq!(
            verify(&unsigned, &k, &mac, 1_800_000_000),
            Err(TsigError::Unsigned("REFUSED"))
        );
    }

    #[test]
    fn algorithms_by_their_key_file_names() {
        assert_eq!(
            Algorithm::parse("HMAC-SHA256."),
            Some(Algorithm::HmacSha256)
        );
        assert_eq!(Algorithm::parse("hmac-sha512"), Some(Algorithm::HmacSha512));
        assert_eq!(Algorithm::parse("hmac-md5"), None);
    }
}
