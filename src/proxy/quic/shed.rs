//! First Initials shed at the socket while the accept loop is behind or past their rate, so
//! that a client answering our Retry always finds a place in quinn's queue of connection
//! attempts and the socket keeps the core it needs to drain.
//!
//! quinn keeps at most [`MAX_INCOMING`] attempts awaiting the accept loop and ignores any
//! Initial beyond them, whatever it carries. A spoofed flood from a new source per datagram
//! keeps that queue full: the accept loop answers each attempt with a stateless Retry (about
//! 17 us of CPU), and each place it frees is taken by the flood's next Initial. A real
//! client's Initial with the token of our Retry then competes for a free place with tens of
//! thousands of spoofed ones a second, and was answered only when the flood stopped (7.9 s
//! at 60,000/s). Shedding in the accept loop instead does not work: once quinn's queue is
//! short, quinn derives keys for and decrypts every Initial, which costs a core at 200,000/s.
//!
//! So this layer, below quinn and below the amplification ledger, drops a datagram that
//! would open an attempt without a token once the attempts it let through and the accept
//! loop has not yet decided on reach [`SHED_FROM`], a quarter of quinn's queue:
//!
//! - an Initial with a token (a client answering our Retry, or with a NEW_TOKEN token) always
//!   goes on: three quarters of the queue stay free for it;
//! - an Initial to a connection ID of ours (a handshake already under way) always goes on;
//! - a token-less first Initial goes on below [`SHED_FROM`] and within [`FIRST_PER_SECOND`],
//!   and otherwise only if it is a resend (the same source address, port and destination ID
//!   as one shed before, but another packet: a client's resend has a new packet number, so
//!   other ciphertext; remembered in a table of [`RESEND_SLOTS`] fingerprints, for
//!   [`RESEND_WINDOW`]) and the backlog is below [`RESENDS_UNTIL`].
//!   A client resends its first Initial on its probe timeout; a spoofer with a new source per
//!   datagram never does. So a real client's first Initial gets through at its first or
//!   second send, and the flood gets through only at the rate the accept loop decides, at
//!   most [`FIRST_PER_SECOND`]. Without that rate the accept loop's Retries took most of a
//!   core at 200,000 Initials a second, the socket overflowed (the kernel drops without
//!   looking), and a real client's handshake took 6.2 s (five probe timeouts) in a CI run. A
//!   flood that replays the same datagrams is not resending. (One that sends other bytes in
//!   each spoofed Initial's name within the window passes as resends, up to
//!   [`RESENDS_UNTIL`], and costs quinn a decryption each: the quarter of the queue kept for
//!   tokens is what it cannot take.)
//!
//! The backlog is an estimate ([`Gate`]): the socket counts what it lets through, the accept
//! loop subtracts each decision and zeroes it whenever it finds the queue empty; an estimate
//! no decision has moved for [`STALE`] is zeroed too, so Initials quinn drops without making
//! an attempt of them cannot hold the gate shut. Off the flood, the backlog stays near zero
//! and nothing is shed.

use std::hash::BuildHasher;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use quinn_proto::{ConnectionId, ConnectionIdGenerator};

use super::cid::{SlotCids, CID_LEN};
use super::header::{self, TYPE_INITIAL};

/// Connection attempts quinn queues for the accept loop (its `max_incoming`). The loop
/// decides on each at once, so the queue is short; quinn's default (65536) would let a flood
/// park that many Initials.
pub const MAX_INCOMING: usize = 4096;
/// Undecided attempts (as estimated) from which token-less first Initials are shed.
pub const SHED_FROM: i64 = MAX_INCOMING as i64 / 4;
/// Undecided attempts up to which a resent first Initial still goes on.
pub const RESENDS_UNTIL: i64 = MAX_INCOMING as i64 * 3 / 4;
/// An estimate no decision has moved for this long is zeroed (see the module's doc).
pub const STALE: Duration = Duration::from_millis(20);
/// Fingerprints of shed Initials kept to recognise a resend: 8 MiB, allocated at the first
/// shed. At 200,000 shed Initials a second one survives 1 s with a chance of 0.83.
pub const RESEND_SLOTS: usize = 1 << 20;
/// How long after the last send of a first Initial a resend is recognised. A client resends
/// on its probe timeout, doubled each time from 0.2-1 s (aioquic 0.2 s, curl and quinn about
/// 1 s); a flood that replays the same source and ID later than this is not a resend.
pub const RESEND_WINDOW: Duration = Duration::from_secs(2);
/// The clock of the fingerprints: 16 bits of 50 ms ticks.
const TICK: Duration = Duration::from_millis(50);
/// Token-less first Initials a second that go on to quinn even below [`SHED_FROM`], in a
/// burst of up to [`FIRST_BURST`]. Each costs quinn a decryption and the accept loop a Retry
/// (about 17 us together): 8,192 a second is a seventh of a core, and the rest of the core is
/// left to draining the socket, whose overflow the gate cannot choose among. Past it a client
/// gets through on its resend, which this rate does not hold back.
pub const FIRST_PER_SECOND: u64 = 8_192;
/// The burst of [`FIRST_PER_SECOND`].
pub const FIRST_BURST: u64 = SHED_FROM as u64;
/// The smallest datagram quinn makes a connection attempt of (RFC 9000 section 14.1).
const MIN_INITIAL_DATAGRAM: usize = 1200;
/// Receive batches shed whole in one poll before the endpoint's task is made to yield: quinn
/// counts received datagrams to know when to turn to its other work, and an empty batch
/// counts nothing.
const SHED_BATCHES_PER_POLL: usize = 8;

/// The backlog estimate one endpoint's socket and accept loop share.
#[derive(Debug)]
pub struct Gate {
    backlog: AtomicI64,
    /// When a decision last moved the estimate, in microseconds since `epoch`.
    last_move: AtomicU64,
    epoch: Instant,
    /// `h3_ingress_limits_total{limit="initial_shed"}`.
    shed: prometheus::IntCounter,
}

impl Gate {
    pub fn new(shed: prometheus::IntCounter) -> Arc<Self> {
        Arc::new(Gate {
            backlog: AtomicI64::new(0),
            last_move: AtomicU64::new(0),
            epoch: Instant::now(),
            shed,
        })
    }

    fn micros(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_micros() as u64
    }

    /// The accept loop decided on one attempt.
    pub fn decided(&self) {
        let _ = (self.backlog).fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
            Some((b - 1).max(0))
        });
        self.last_move
            .store(self.micros(Instant::now()), Ordering::Relaxed);
    }

    /// The accept loop found no attempt waiting.
    pub fn drained(&self) {
        self.backlog.store(0, Ordering::Relaxed);
    }

    /// The estimate at `now`, zeroed when stale. (A decision on another thread may come
    /// after `now`.)
    fn backlog(&self, now: Instant) -> i64 {
        let b = self.backlog.load(Ordering::Relaxed);
        if b > 0 {
            let idle = self
                .micros(now)
                .saturating_sub(self.last_move.load(Ordering::Relaxed));
            if idle > STALE.as_micros() as u64 {
                self.backlog.store(0, Ordering::Relaxed);
                self.last_move.store(self.micros(now), Ordering::Relaxed);
                return 0;
            }
        }
        b
    }

    fn passed(&self) {
        self.backlog.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a datagram is to the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anything that opens no attempt: short headers, other long headers, small Initials,
    /// Initials to a connection ID of ours.
    Other,
    /// An Initial with a token.
    Token,
    /// An Initial without a token to an ID not ours: a client's first flight.
    First,
}

/// Whether a datagram goes on to quinn, given the backlog; for a first Initial, `credit`
/// takes one of [`FIRST_PER_SECOND`] and `resend` tells (and remembers) a resend, each asked
/// only when it decides.
pub fn passes(
    kind: Kind,
    backlog: i64,
    credit: impl FnOnce() -> bool,
    resend: impl FnOnce() -> bool,
) -> bool {
    match kind {
        Kind::Other | Kind::Token => true,
        Kind::First => (backlog < SHED_FROM && credit()) || (resend() && backlog < RESENDS_UNTIL),
    }
}

/// The credit of [`FIRST_PER_SECOND`].
#[derive(Debug)]
struct Credit {
    /// In millionths of a first Initial.
    micro: u64,
    at: Instant,
}

impl Credit {
    fn new(now: Instant) -> Self {
        Credit {
            micro: FIRST_BURST * 1_000_000,
            at: now,
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let waited = now.saturating_duration_since(self.at).as_micros() as u64;
        self.at = now;
        let gained = waited.saturating_mul(FIRST_PER_SECOND);
        self.micro = self
            .micro
            .saturating_add(gained)
            .min(FIRST_BURST * 1_000_000);
        if self.micro < 1_000_000 {
            return false;
        }
        self.micro -= 1_000_000;
        true
    }
}

/// What the gate reads of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read<'a> {
    pub kind: Kind,
    /// The first packet's destination connection ID.
    pub dcid: &'a [u8],
    /// The first packet's last bytes (its AEAD tag), different in every packet a client sends.
    pub tail: &'a [u8],
}

/// What `datagram` is, reading its first packet; `ours` recognises our connection IDs.
pub fn read<'a>(datagram: &'a [u8], ours: &SlotCids) -> Read<'a> {
    let other = Read {
        kind: Kind::Other,
        dcid: &[],
        tail: &[],
    };
    if datagram.len() < MIN_INITIAL_DATAGRAM || !header::is_initial(datagram[0]) {
        return other;
    }
    let Some(h) = header::long_header(datagram).filter(|h| h.ty == TYPE_INITIAL) else {
        return other;
    };
    let kind = if h.token_len > 0 {
        Kind::Token
    } else if h.dcid.len() == CID_LEN && ours.validate(&ConnectionId::new(h.dcid)).is_ok() {
        Kind::Other
    } else {
        Kind::First
    };
    let tail = &datagram[h.len.saturating_sub(TAIL)..h.len];
    Read {
        kind,
        dcid: h.dcid,
        tail,
    }
}

/// Bytes of a packet's end that tell two packets apart: the AEAD tag.
const TAIL: usize = 16;

/// Fingerprints of shed first Initials, by source and destination ID.
struct Resends {
    hasher: std::collections::hash_map::RandomState,
    /// From the high bits: the fingerprint of source and ID (16 bits, never 0), the tick of
    /// the last send (16 bits), and the fingerprint of its packet (32 bits).
    slots: Vec<u64>,
    epoch: Instant,
}

impl Resends {
    fn new() -> Self {
        Resends {
            hasher: Default::default(),
            slots: Vec::new(),
            epoch: Instant::now(),
        }
    }

    /// Whether another packet to the same source and ID was shed within [`RESEND_WINDOW`];
    /// remembers this one either way.
    fn seen(&mut self, from: SocketAddr, r: &Read<'_>, now: Instant) -> bool {
        if self.slots.is_empty() {
            self.slots = vec![0; RESEND_SLOTS];
        }
        let h = self.hasher.hash_one((from, r.dcid));
        let slot = (h as usize) & (RESEND_SLOTS - 1);
        let key = (h >> 48) | 1;
        let packet = self.hasher.hash_one(r.tail) & 0xffff_ffff;
        let since = now.saturating_duration_since(self.epoch);
        let tick = (since.as_millis() / TICK.as_millis()) as u64 & 0xffff;
        let old = std::mem::replace(&mut self.slots[slot], key << 48 | tick << 32 | packet);
        let age = tick.wrapping_sub(old >> 32) & 0xffff;
        let window = (RESEND_WINDOW.as_millis() / TICK.as_millis()) as u64;
        old >> 48 == key && age <= window && old & 0xffff_ffff != packet
    }
}

/// A UDP socket that sheds first Initials while its endpoint's accept loop is behind or past
/// [`FIRST_PER_SECOND`].
pub struct SheddingSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    gate: Arc<Gate>,
    ours: SlotCids,
    firsts: Mutex<Firsts>,
}

/// What the socket keeps of first Initials.
struct Firsts {
    credit: Credit,
    resends: Resends,
}

impl std::fmt::Debug for SheddingSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SheddingSocket")
            .field("gate", &self.gate)
            .finish()
    }
}

impl SheddingSocket {
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, gate: Arc<Gate>, ours: SlotCids) -> Arc<Self> {
        Arc::new(Self {
            inner,
            gate,
            ours,
            firsts: Mutex::new(Firsts {
                credit: Credit::new(Instant::now()),
                resends: Resends::new(),
            }),
        })
    }

    /// Whether one received entry goes on. A GRO batch (several datagrams of one source)
    /// always does: a flood from new sources is never batched.
    fn keep(&self, data: &[u8], m: &RecvMeta, now: Instant) -> bool {
        if m.len > m.stride {
            return true;
        }
        let read = read(data, &self.ours);
        let kind = read.kind;
        if kind == Kind::Other {
            return true;
        }
        let backlog = self.gate.backlog(now);
        let mut firsts = self.firsts.lock().expect("first Initials lock");
        let Firsts { credit, resends } = &mut *firsts;
        let pass = passes(
            kind,
            backlog,
            || credit.take(now),
            || resends.seen(m.addr, &read, now),
        );
        drop(firsts);
        if pass {
            self.gate.passed();
            return true;
        }
        self.gate.shed.inc();
        false
    }

    /// Moves the entries that go on to the front; how many there are.
    fn sift(&self, bufs: &mut [IoSliceMut<'_>], meta: &mut [RecvMeta], n: usize) -> usize {
        // One clock read a batch: the batch came off the socket at once.
        let now = Instant::now();
        let mut kept = 0;
        for i in 0..n {
            let len = meta[i].len.min(bufs[i].len());
            if self.keep(&bufs[i][..len], &meta[i], now) {
                bufs.swap(i, kept);
                meta.swap(i, kept);
                kept += 1;
            }
        }
        kept
    }
}

impl AsyncUdpSocket for SheddingSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        for _ in 0..SHED_BATCHES_PER_POLL {
            let n = match self.inner.poll_recv(cx, bufs, meta) {
                Poll::Ready(Ok(n)) => n,
                other => return other,
            };
            let kept = self.sift(bufs, meta, n);
            if kept > 0 || n == 0 {
                return Poll::Ready(Ok(kept));
            }
        }
        // Everything shed for a while: let the endpoint's task send and run its timers, and
        // come back at once.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments()
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::quic::cid::marker_of;
    use crate::proxy::quic::header::tests::packet;

    fn ours() -> SlotCids {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[9; 32]);
        SlotCids::new(2, marker_of([0x5a, 0x5a]), key)
    }

    fn initial(dcid: &[u8], token: &[u8], size: usize) -> Vec<u8> {
        let mut p = packet(TYPE_INITIAL, dcid, b"client", 0);
        // `packet` writes an empty token and a two-byte length: put the token in.
        let at = 1 + 4 + 1 + dcid.len() + 1 + 6;
        p.splice(
            at..at + 1,
            [token.len() as u8].into_iter().chain(token.iter().copied()),
        );
        let payload = size - p.len();
        let len_at = at + 1 + token.len();
        p[len_at..len_at + 2].copy_from_slice(&(0x4000 | payload as u16).to_be_bytes());
        p.resize(size, 0);
        p
    }

    #[test]
    fn datagrams_are_told_apart_by_what_their_first_packet_shows() {
        let g = ours();
        let mine = g.with_random([1, 2, 3, 4]);
        assert_eq!(read(&initial(b"random-8", b"", 1200), &g).kind, Kind::First);
        assert_eq!(
            read(&initial(b"random-8", b"tok", 1200), &g).kind,
            Kind::Token
        );
        assert_eq!(
            read(&initial(&mine, b"", 1200), &g).kind,
            Kind::Other,
            "ours"
        );
        assert_eq!(
            read(&initial(b"random-8", b"", 1199), &g).kind,
            Kind::Other,
            "small"
        );
        let mut forged = mine.to_vec();
        forged[7] ^= 1;
        assert_eq!(
            read(&initial(&forged, b"", 1200), &g).kind,
            Kind::First,
            "our marker, bad check"
        );
        let hs = packet(header::TYPE_HANDSHAKE, b"random-8", b"c", 1200);
        assert_eq!(read(&hs, &g).kind, Kind::Other);
        assert_eq!(read(&[0x40; 1300], &g).kind, Kind::Other, "short header");
    }

    #[test]
    fn first_initials_are_shed_past_a_quarter_or_their_rate_and_resends_until_three_quarters() {
        let yes = || true;
        let no = || false;
        assert!(passes(Kind::First, SHED_FROM - 1, yes, no));
        assert!(!passes(Kind::First, SHED_FROM - 1, no, no), "no credit");
        assert!(
            passes(Kind::First, SHED_FROM - 1, no, yes),
            "no credit, a resend"
        );
        assert!(!passes(Kind::First, SHED_FROM, yes, no));
        assert!(passes(Kind::First, SHED_FROM, yes, yes));
        assert!(!passes(Kind::First, RESENDS_UNTIL, yes, yes));
        for b in [0, SHED_FROM, RESENDS_UNTIL, i64::MAX] {
            assert!(passes(Kind::Token, b, no, no), "{b}");
            assert!(passes(Kind::Other, b, no, no), "{b}");
        }
        // A credit that would go unused is not taken; a resend is remembered whenever a
        // first Initial is not let through on credit.
        let mut asked = false;
        assert!(passes(
            Kind::First,
            SHED_FROM,
            || panic!("credit"),
            || {
                asked = true;
                true
            }
        ));
        assert!(asked);
        assert!(passes(Kind::First, 0, yes, || panic!("resend")));
    }

    #[test]
    fn the_credit_is_a_burst_then_the_rate() {
        let t = Instant::now();
        let mut c = Credit::new(t);
        let burst = (0..FIRST_BURST * 2).filter(|_| c.take(t)).count();
        assert_eq!(burst as u64, FIRST_BURST);
        let later = t + Duration::from_millis(100);
        let then = (0..FIRST_PER_SECOND).filter(|_| c.take(later)).count();
        assert_eq!(then as u64, FIRST_PER_SECOND / 10);
        let much_later = later + Duration::from_secs(60);
        let capped = (0..FIRST_BURST * 2).filter(|_| c.take(much_later)).count();
        assert_eq!(capped as u64, FIRST_BURST);
    }

    #[test]
    fn a_resend_is_another_packet_to_the_same_source_and_destination_id() {
        let mut r = Resends::new();
        let t = r.epoch;
        let a: SocketAddr = "192.0.2.1:5000".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:5001".parse().unwrap();
        let one = |tail: &'static [u8]| Read {
            kind: Kind::First,
            dcid: b"dcid-one",
            tail,
        };
        let two = Read {
            dcid: b"dcid-two",
            ..one(b"p2")
        };
        assert!(!r.seen(a, &one(b"p1"), t));
        assert!(r.seen(a, &one(b"p2"), t + Duration::from_millis(200)));
        assert!(
            !r.seen(a, &one(b"p2"), t + Duration::from_millis(210)),
            "a replay"
        );
        assert!(!r.seen(b, &one(b"p3"), t), "another port");
        assert!(!r.seen(a, &two, t), "another ID");
        assert_eq!(r.slots.len(), RESEND_SLOTS);
        // Within the window of the last send; not after it.
        let last = t + Duration::from_millis(200) + RESEND_WINDOW;
        assert!(r.seen(a, &one(b"p4"), last));
        assert!(!r.seen(a, &one(b"p5"), last + RESEND_WINDOW + TICK * 2));
    }

    #[test]
    fn the_estimate_follows_decisions_and_goes_stale() {
        let g = Gate::new(prometheus::IntCounter::new("t", "t").unwrap());
        for _ in 0..3 {
            g.passed();
        }
        g.decided();
        assert_eq!(g.backlog(Instant::now()), 2);
        g.drained();
        assert_eq!(g.backlog(Instant::now()), 0);
        g.decided();
        assert_eq!(g.backlog(Instant::now()), 0, "never below zero");
        g.passed();
        std::thread::sleep(STALE * 2);
        assert_eq!(
            g.backlog(Instant::now()),
            0,
            "no decision for longer than STALE"
        );
    }
}
