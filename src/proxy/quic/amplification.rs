//! The anti-amplification limit of RFC 9000 section 8, enforced at the socket: before a
//! client has proven its address, we send it at most three times the bytes it sent us.
//!
//! quinn enforces the limit too, but lets a datagram through whenever any budget is left
//! (quinn issue 1082), so it may overshoot by up to one datagram. It does: after the first
//! flight (1200 bytes, Initial + Handshake) the server sends a 222-byte 1-RTT packet with
//! NEW_CONNECTION_ID frames, so 1422 of the 3600 bytes a 1200-byte Initial allows are used;
//! when the probe timeout fires, each of the two 1200-byte probes still finds budget left, and
//! a silent (spoofed) source gets 3822 bytes, 3.19x. This layer withholds whatever would go
//! beyond 3x; quinn counts the withheld datagram as sent and lost, and stays blocked.
//!
//! Which addresses are unvalidated is what the accept loop decides: it [`Guard::pin`]s the
//! address of a handshake it accepts without validation, and [`Guard::release`]s it once the
//! handshake is done (or was never started). Bytes are counted from the first Initial on, so
//! datagrams that arrived before the decision count too. Only pinned addresses are limited;
//! an entry that was never pinned only counts and expires.
//!
//! An address is also validated, here as in quinn, by a Handshake packet from it (RFC 9000
//! section 8.1): a client that lost the datagrams acknowledging our Initial has only its small
//! Handshake packets left to send, and would otherwise never earn the budget for our next
//! 1200-byte datagram (quinn, which does count it as validated, keeps handing us datagrams
//! this layer drops, until the handshake times out). We cannot decrypt it, so it counts when
//! its destination CID is the source CID of our first datagram to that address, which an
//! off-path spoofer never sees.

use std::collections::HashMap;
use std::io::{self, IoSliceMut};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};

use super::header::{self, Cid, TYPE_HANDSHAKE};

/// RFC 9000 section 8.1.
pub const FACTOR: u64 = 3;
/// Sources with an Initial awaiting a decision or an unvalidated handshake; beyond this,
/// Initials from further sources are dropped (a flood far above any cap of `limits`).
pub const MAX_ENTRIES: usize = 65_536;
/// An Initial the accept loop never decided on (quinn dropped it) is forgotten after this.
const UNPINNED_TTL: Duration = Duration::from_secs(2);
/// After a failed handshake quinn may still send a CONNECTION_CLOSE; it stays limited this long.
pub const CLOSING_TTL: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// Counted only.
    No,
    /// An unvalidated handshake in progress: limited.
    Held,
    /// A handshake that failed: limited until then.
    Until(Instant),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    received: u64,
    sent: u64,
    pin: Hold,
    touched: Instant,
    /// The source CID of our first long-header datagram to this address.
    ours: Option<Cid>,
}

impl Entry {
    fn limited(&self, now: Instant) -> bool {
        match self.pin {
            Hold::No => false,
            Hold::Held => true,
            Hold::Until(t) => now < t,
        }
    }

    fn expired(&self, now: Instant) -> bool {
        match self.pin {
            Hold::No => now.duration_since(self.touched) > UNPINNED_TTL,
            Hold::Held => false,
            Hold::Until(t) => now >= t,
        }
    }
}

/// Bytes in and out per source address. Pure: time comes in as an argument.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: HashMap<SocketAddr, Entry>,
    /// Entries whose sends are limited (the fast path skips the lock when there are none).
    limited: usize,
}

/// What [`Ledger::received`] says about a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Deliver,
    /// Too many sources pending: drop the datagram.
    Drop,
}

/// Whether `datagram` carries a Handshake packet addressed to `ours`.
fn proves_address(datagram: &[u8], ours: &Cid) -> bool {
    header::coalesced(datagram).any(|h| h.ty == TYPE_HANDSHAKE && h.dcid == ours.as_slice())
}

fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

impl Ledger {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn sweep(&mut self, now: Instant) {
        self.entries.retain(|_, e| !e.expired(now));
        self.limited = self.entries.values().filter(|e| e.pin != Hold::No).count();
    }

    /// Counts a long-header datagram of `len` bytes from `from`; an Initial from an unknown
    /// source opens an entry.
    pub fn received(&mut self, from: SocketAddr, len: usize, initial: bool, now: Instant) -> Admit {
        let from = canonical(from);
        if let Some(e) = self.entries.get_mut(&from) {
            e.received += len as u64;
            e.touched = now;
            return Admit::Deliver;
        }
        if !initial {
            return Admit::Deliver;
        }
        if self.entries.len() >= MAX_ENTRIES {
            self.sweep(now);
            if self.entries.len() >= MAX_ENTRIES {
                return Admit::Drop;
            }
        }
        let entry = Entry {
            received: len as u64,
            sent: 0,
            pin: Hold::No,
            touched: now,
            ours: None,
        };
        self.entries.insert(from, entry);
        Admit::Deliver
    }

    fn set_pin(&mut self, addr: SocketAddr, pin: Hold, now: Instant) {
        let addr = canonical(addr);
        let Some(e) = self.entries.get_mut(&addr) else {
            return;
        };
        let was = e.pin != Hold::No;
        e.pin = pin;
        e.touched = now;
        match (was, pin != Hold::No) {
            (false, true) => self.limited += 1,
            (true, false) => self.limited -= 1,
            _ => {}
        }
    }

    /// Counts a datagram from `from` as [`Self::received`] does, and forgets `from` (validated)
    /// when it carries a Handshake packet to the CID we gave it.
    pub fn received_datagram(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) -> Admit {
        let Some(&first) = datagram.first() else {
            return Admit::Deliver;
        };
        let admit = self.received(from, datagram.len(), header::is_initial(first), now);
        let proven = self
            .entries
            .get(&canonical(from))
            .and_then(|e| e.ours.as_ref())
            .is_some_and(|ours| proves_address(datagram, ours));
        if proven {
            self.release(from);
        }
        admit
    }

    /// An unvalidated handshake with `addr` starts: limit what we send it.
    pub fn pin(&mut self, addr: SocketAddr, now: Instant) {
        self.set_pin(addr, Hold::Held, now);
    }

    /// The handshake with `addr` failed: keep limiting its last packets for `for_`.
    pub fn unpin_after(&mut self, addr: SocketAddr, for_: Duration, now: Instant) {
        self.set_pin(addr, Hold::Until(now + for_), now);
    }

    /// `addr` is validated, or no handshake was started: forget it.
    pub fn release(&mut self, addr: SocketAddr) {
        if let Some(e) = self.entries.remove(&canonical(addr)) {
            if e.pin != Hold::No {
                self.limited -= 1;
            }
        }
    }

    /// How many of the `segments` (sizes in order) of `datagram` to `to` may go out now;
    /// counts them, and keeps the source CID of our first long-header datagram to a limited
    /// `to`. `None`: `to` is not limited. (A send that then fails with WouldBlock stays
    /// counted: that errs on the safe side.)
    pub fn allow(
        &mut self,
        to: SocketAddr,
        datagram: &[u8],
        segments: impl Iterator<Item = usize>,
        now: Instant,
    ) -> Option<usize> {
        let e = self.entries.get_mut(&canonical(to))?;
        if !e.limited(now) {
            return None;
        }
        if e.ours.is_none() {
            // An empty ID would be no secret (quinn's server IDs never are).
            e.ours = header::long_header(datagram)
                .filter(|h| !h.scid.is_empty())
                .and_then(|h| Cid::new(h.scid));
        }
        let budget = e.received * FACTOR;
        let mut n = 0;
        for size in segments {
            if e.sent + size as u64 > budget {
                break;
            }
            e.sent += size as u64;
            n += 1;
        }
        Some(n)
    }

    pub fn limited(&self) -> usize {
        self.limited
    }
}

/// The ledger shared by a socket and the accept loop, with what it withheld.
#[derive(Debug)]
pub struct Guard {
    ledger: Mutex<Ledger>,
    /// Mirrors `Ledger::limited` for a lock-free fast path on every send.
    limited: AtomicUsize,
    /// Transmits (partly) withheld, and Initials dropped because the ledger was full.
    pub withheld: prometheus::IntCounter,
    pub dropped: prometheus::IntCounter,
}

impl Guard {
    pub fn new(withheld: prometheus::IntCounter, dropped: prometheus::IntCounter) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Ledger::default()),
            limited: AtomicUsize::new(0),
            withheld,
            dropped,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut Ledger) -> R) -> R {
        let mut l = self.ledger.lock().expect("amplification ledger lock");
        let r = f(&mut l);
        self.limited.store(l.limited(), Ordering::Relaxed);
        r
    }

    pub fn pin(&self, addr: SocketAddr) {
        self.with(|l| l.pin(addr, Instant::now()));
    }

    pub fn unpin_after(&self, addr: SocketAddr, for_: Duration) {
        self.with(|l| l.unpin_after(addr, for_, Instant::now()));
    }

    pub fn release(&self, addr: SocketAddr) {
        self.with(|l| l.release(addr));
    }

    /// Number of tracked sources (tests, `/status` debugging).
    pub fn tracked(&self) -> usize {
        self.with(|l| l.len())
    }
}

/// A UDP socket whose sends to unvalidated addresses stay within 3x of what they sent us.
#[derive(Debug)]
pub struct GuardedSocket {
    inner: Arc<dyn AsyncUdpSocket>,
    guard: Arc<Guard>,
}

impl GuardedSocket {
    pub fn new(inner: Arc<dyn AsyncUdpSocket>, guard: Arc<Guard>) -> Arc<Self> {
        Arc::new(Self { inner, guard })
    }

    /// Counts the long-header datagrams of one receive batch (each of a GRO buffer's); drops
    /// Initials the ledger refuses.
    fn account(&self, bufs: &[IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        let now = Instant::now();
        for (m, buf) in meta.iter_mut().zip(bufs) {
            let Some(data) = buf.get(..m.len).filter(|d| !d.is_empty()) else {
                continue;
            };
            let datagrams = data.chunks(m.stride.max(1));
            let long = || datagrams.clone().filter(|d| header::is_long_header(d[0]));
            if long().next().is_none() {
                continue;
            }
            let admit = self.guard.with(|l| {
                long().fold(Admit::Deliver, |admit, d| {
                    match l.received_datagram(m.addr, d, now) {
                        Admit::Drop => Admit::Drop,
                        Admit::Deliver => admit,
                    }
                })
            });
            if admit == Admit::Drop {
                // quinn skips a buffer with no bytes.
                m.len = 0;
                self.guard.dropped.inc();
            }
        }
    }
}

fn segment_sizes(t: &Transmit<'_>) -> impl Iterator<Item = usize> {
    let seg = t.segment_size.unwrap_or(t.contents.len()).max(1);
    let len = t.contents.len();
    (0..len.div_ceil(seg)).map(move |i| seg.min(len - i * seg))
}

impl AsyncUdpSocket for GuardedSocket {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        if self.guard.limited.load(Ordering::Relaxed) == 0 {
            return self.inner.try_send(transmit);
        }
        let now = Instant::now();
        let allowed = self.guard.with(|l| {
            l.allow(
                transmit.destination,
                transmit.contents,
                segment_sizes(transmit),
                now,
            )
        });
        let total = segment_sizes(transmit).count();
        match allowed {
            None => self.inner.try_send(transmit),
            Some(n) if n == total => self.inner.try_send(transmit),
            Some(n) => {
                self.guard.withheld.inc();
                if n == 0 {
                    // quinn counts it as sent; to the peer it is lost.
                    return Ok(());
                }
                let seg = transmit.segment_size.unwrap_or(transmit.contents.len());
                let end = (n * seg).min(transmit.contents.len());
                let part = Transmit {
                    destination: transmit.destination,
                    ecn: transmit.ecn,
                    contents: &transmit.contents[..end],
                    segment_size: (n > 1).then_some(seg),
                    src_ip: transmit.src_ip,
                };
                self.inner.try_send(&part)
            }
        }
    }

    fn poll_recv(
        &self,
        cx: &mut Context,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        let n = match self.inner.poll_recv(cx, bufs, meta) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        self.account(&bufs[..n], &mut meta[..n]);
        Poll::Ready(Ok(n))
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

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_silent_source_gets_at_most_three_times_its_initial() {
        let mut l = Ledger::default();
        let t = Instant::now();
        let a = addr("192.0.2.1:4433");
        assert_eq!(l.received(a, 1200, true, t), Admit::Deliver);
        l.pin(a, t);
        // The flight quinn really sent to a silent aioquic client: 1200, 222, then two
        // 1200-byte probes, the second of which would make it 3822 bytes (3.19x).
        assert_eq!(l.allow(a, &[], [1200].into_iter(), t), Some(1));
        assert_eq!(l.allow(a, &[], [222].into_iter(), t), Some(1));
        assert_eq!(l.allow(a, &[], [1200].into_iter(), t), Some(1));
        assert_eq!(l.allow(a, &[], [1200].into_iter(), t), Some(0));
        // A small close still fits.
        assert_eq!(l.allow(a, &[], [60].into_iter(), t), Some(1));
        // More from the client raises the budget; a GSO batch is cut at a segment.
        l.received(a, 1200, false, t);
        assert_eq!(l.allow(a, &[], [1200; 4].into_iter(), t), Some(3));
    }

    #[test]
    fn only_pinned_sources_are_limited_and_release_forgets() {
        let mut l = Ledger::default();
        let t = Instant::now();
        let a = addr("[2001:db8::1]:1");
        let b = addr("192.0.2.2:2");
        l.received(a, 1200, true, t);
        l.received(b, 1200, true, t);
        // Not pinned (validated, retried or refused): not limited.
        assert_eq!(l.allow(a, &[], [1200; 10].into_iter(), t), None);
        l.pin(b, t);
        assert_eq!(l.limited(), 1);
        l.release(b);
        assert_eq!((l.limited(), l.len()), (0, 1));
        assert_eq!(l.allow(b, &[], [1200; 10].into_iter(), t), None);
        // A non-Initial long header from an unknown source opens nothing.
        l.received(b, 1200, false, t);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn entries_expire_and_a_failed_handshake_stays_limited_a_while() {
        let mut l = Ledger::default();
        let t = Instant::now();
        let a = addr("192.0.2.3:3");
        let b = addr("192.0.2.4:4");
        l.received(a, 1200, true, t);
        l.received(b, 1200, true, t);
        l.pin(b, t);
        l.unpin_after(b, CLOSING_TTL, t);
        assert_eq!(l.allow(b, &[], [3600, 1].into_iter(), t), Some(1));
        let later = t + CLOSING_TTL;
        assert_eq!(l.allow(b, &[], [1].into_iter(), later), None);
        l.sweep(later);
        assert_eq!((l.len(), l.limited()), (0, 0));
    }

    #[test]
    fn a_full_ledger_drops_initials_from_new_sources() {
        let mut l = Ledger::default();
        let t = Instant::now();
        for i in 0..MAX_ENTRIES {
            let a = SocketAddr::new(std::net::Ipv4Addr::from(i as u32 + 1).into(), 1);
            assert_eq!(l.received(a, 1200, true, t), Admit::Deliver);
        }
        let new = addr("203.0.113.1:1");
        assert_eq!(l.received(new, 1200, true, t), Admit::Drop);
        // Once the undecided ones have expired, there is room again.
        let later = t + UNPINNED_TTL + Duration::from_millis(1);
        assert_eq!(l.received(new, 1200, true, later), Admit::Deliver);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn a_handshake_packet_to_our_cid_validates_the_address() {
        use super::header::tests::packet;
        use super::header::{TYPE_HANDSHAKE, TYPE_INITIAL};
        let mut l = Ledger::default();
        let t = Instant::now();
        let a = addr("192.0.2.5:5");
        // 27 header bytes + 1173: a 1200-byte Initial.
        let client_initial = packet(TYPE_INITIAL, b"random-dcid", b"client", 1173);
        assert_eq!(client_initial.len(), 1200);
        l.received_datagram(a, &client_initial, t);
        l.pin(a, t);
        // Our flight: Initial + Handshake from our CID "server-9", 3600 bytes in all.
        let ours = packet(TYPE_INITIAL, b"client", b"server-9", 1150);
        assert_eq!(l.allow(a, &ours, [1200; 4].into_iter(), t), Some(3));
        // The client's padded Initial ACK is lost; its Handshake ACKs arrive (48 bytes each),
        // which buy no 1200-byte datagram by the 3x rule...
        let wrong = packet(TYPE_HANDSHAKE, b"server-8", b"client", 25);
        l.received_datagram(a, &wrong, t);
        let initial_to_us = packet(TYPE_INITIAL, b"server-9", b"client", 25);
        l.received_datagram(a, &initial_to_us, t);
        assert_eq!(l.allow(a, &[], [1200].into_iter(), t), Some(0), "not proof");
        // ...but one addressed to our CID is proof the client got our Initial.
        let mut ack = packet(TYPE_INITIAL, b"server-9", b"client", 1000);
        ack.extend(packet(TYPE_HANDSHAKE, b"server-9", b"client", 25));
        l.received_datagram(a, &ack, t);
        assert_eq!(l.allow(a, &[], [1200; 10].into_iter(), t), None);
        assert_eq!((l.limited(), l.len()), (0, 0));
    }

    #[test]
    fn the_cid_of_our_first_datagram_is_kept_and_only_for_limited_sources() {
        use super::header::tests::packet;
        use super::header::{TYPE_HANDSHAKE, TYPE_INITIAL};
        let mut l = Ledger::default();
        let t = Instant::now();
        let a = addr("192.0.2.6:6");
        l.received(a, 1200, true, t);
        let none = std::iter::empty;
        l.allow(a, &packet(TYPE_INITIAL, b"c", b"first", 10), none(), t);
        assert_eq!(l.entries[&a].ours, None, "not limited: nothing to learn");
        l.pin(a, t);
        l.allow(a, &[0x40, 1, 2], none(), t);
        l.allow(a, &packet(TYPE_INITIAL, b"c", b"first", 10), none(), t);
        l.allow(a, &packet(TYPE_HANDSHAKE, b"c", b"second", 10), none(), t);
        assert_eq!(l.entries[&a].ours, Cid::new(b"first"));
    }

    #[test]
    fn mapped_addresses_are_one_source() {
        let mapped = addr("[::ffff:192.0.2.9]:5");
        assert_eq!(canonical(mapped), addr("192.0.2.9:5"));
    }
}
