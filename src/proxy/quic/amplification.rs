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

//!
//! At most [`MAX_ENTRIES`] sources are tracked at once. An entry lives until the accept loop
//! decides on its Initial or, when quinn never makes that Initial a connection attempt (an
//! invalid one, a duplicate), for `UNPINNED_TTL`; so a flood of Initials from a new spoofed
//! source per datagram, faster than the accept loop decides, fills the table within a second
//! or two, and from then on every datagram meets a full table. What a datagram costs here
//! must therefore not depend on the table's size: every entry that can expire sits on one of
//! two queues in deadline order (the unpinned ones by when they were last touched, the
//! failed ones by when they stop being limited), linked through the table's slots, so the
//! oldest is always at a head. Each Initial that would open an entry first evicts at most
//! `EVICTIONS_PER_INSERT` expired entries from the heads; if the table is then still full,
//! every entry in it is live, and the Initial gets none ([`Seen::Full`]): a constant amount
//! of work either way (the tests count it), where a scan of 65,536 entries per Initial used
//! to stall the receive path.
//!
//! An Initial without an entry still goes to quinn, and the accept loop answers the attempt
//! with a stateless Retry ([`Ledger::tracks`]; it is ignored, as before, under
//! `addressValidation.mode: never`): a handshake for an untracked address would be limited
//! only by quinn's overshooting rule, and the Retry needs no entry, because it keeps within
//! 3x by itself. quinn sends one Retry per connection attempt, and makes an attempt only of a
//! datagram of at least 1200 bytes (RFC 9000 section 14.1; shorter Initials are dropped);
//! the Retry is a long header (at most 47 bytes with two 20-byte connection IDs), quinn's
//! token (at most 81: type, address, original destination CID, time, AEAD tag and nonce) and
//! the 16-byte integrity tag, 144 bytes at most: under 0.13x of what the source sent. The
//! client then comes back with the token, validated, and needs no entry either.
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
/// Sources with an Initial awaiting a decision or an unvalidated handshake; beyond this, an
/// Initial from a further source gets no entry (and so no handshake before a Retry).
pub const MAX_ENTRIES: usize = 65_536;
/// An Initial the accept loop never decided on (quinn dropped it) is forgotten after this.
const UNPINNED_TTL: Duration = Duration::from_secs(2);
/// After a failed handshake quinn may still send a CONNECTION_CLOSE; it stays limited this long.
pub const CLOSING_TTL: Duration = Duration::from_secs(5);
/// Expired entries evicted, at most, by each Initial that opens an entry: more than one, so
/// eviction outpaces insertion and the table never fills with expired entries.
const EVICTIONS_PER_INSERT: usize = 2;
/// A table that empties with more slots than this gives them back (after a flood).
const KEEP_SLOTS: usize = 1024;

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

    /// The expiry queue it belongs on; none while held (it never expires then).
    fn queue(&self) -> Option<Queue> {
        match self.pin {
            Hold::No => Some(Queue::Unpinned),
            Hold::Held => None,
            Hold::Until(_) => Some(Queue::Closing),
        }
    }
}

/// The two expiry queues. Each is in deadline order because every entry joins it at its tail
/// with a deadline at least that of every entry before it: unpinned entries at `touched +
/// UNPINNED_TTL` when touched, closing ones at `now + CLOSING_TTL` when unpinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Unpinned = 0,
    Closing = 1,
}

/// Ends a queue, and marks a slot on none.
const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Slot {
    addr: SocketAddr,
    entry: Entry,
    queue: Option<Queue>,
    prev: u32,
    next: u32,
}

#[derive(Debug, Clone, Copy)]
struct Ends {
    head: u32,
    tail: u32,
}

const EMPTY: Ends = Ends {
    head: NIL,
    tail: NIL,
};

/// Bytes in and out per source address. Pure: time comes in as an argument.
///
/// Entries live in a table of slots, found by address through an index; each entry that can
/// expire is also on one of two doubly linked queues in deadline order (`Queue`), so the
/// oldest is always at a head: eviction looks at two heads and unlinks in O(1), touching an
/// entry moves it to its tail in O(1), and nothing ever scans the table.
#[derive(Debug)]
pub struct Ledger {
    index: HashMap<SocketAddr, u32>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    queues: [Ends; 2],
    /// Entries whose sends are limited (the fast path skips the lock when there are none).
    limited: usize,
    /// Queue heads examined by eviction, in all: the tests hold it to a constant per datagram.
    steps: u64,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            queues: [EMPTY; 2],
            limited: 0,
            steps: 0,
        }
    }
}

/// What [`Ledger::received`] did with a datagram. Every datagram goes on to quinn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Counted for a source with an entry.
    Counted,
    /// An Initial from a new source: an entry opened.
    Opened,
    /// An Initial from a new source while every entry is in use: none opened, so its
    /// connection attempt gets a Retry before any handshake ([`Ledger::tracks`]).
    Full,
    /// Neither: no entry needed.
    Ignored,
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
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Whether `addr` has an entry: an unvalidated handshake with an address without one
    /// would go unlimited, so it must get a Retry first.
    pub fn tracks(&self, addr: SocketAddr) -> bool {
        self.index.contains_key(&canonical(addr))
    }

    /// Queue heads examined by eviction so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    fn entry_mut(&mut self, addr: SocketAddr) -> Option<(u32, &mut Entry)> {
        let i = *self.index.get(&canonical(addr))?;
        Some((i, &mut self.slots[i as usize].entry))
    }

    fn unlink(&mut self, i: u32) {
        let Slot {
            queue, prev, next, ..
        } = self.slots[i as usize];
        let Some(q) = queue else {
            return;
        };
        match prev {
            NIL => self.queues[q as usize].head = next,
            p => self.slots[p as usize].next = next,
        }
        match next {
            NIL => self.queues[q as usize].tail = prev,
            n => self.slots[n as usize].prev = prev,
        }
        let s = &mut self.slots[i as usize];
        (s.queue, s.prev, s.next) = (None, NIL, NIL);
    }

    /// Moves slot `i` to the tail of the queue its entry belongs on (or off every queue).
    fn requeue(&mut self, i: u32) {
        self.unlink(i);
        let Some(q) = self.slots[i as usize].entry.queue() else {
            return;
        };
        let tail = self.queues[q as usize].tail;
        match tail {
            NIL => self.queues[q as usize].head = i,
            t => self.slots[t as usize].next = i,
        }
        self.queues[q as usize].tail = i;
        let s = &mut self.slots[i as usize];
        (s.queue, s.prev, s.next) = (Some(q), tail, NIL);
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let s = &self.slots[i as usize];
        self.index.remove(&s.addr);
        if s.entry.pin != Hold::No {
            self.limited -= 1;
        }
        self.free.push(i);
        if self.index.is_empty() && self.slots.len() > KEEP_SLOTS {
            // A flood is over: its slots go back to the allocator.
            self.slots = Vec::new();
            self.free = Vec::new();
            self.index = HashMap::new();
        }
    }

    /// Evicts up to `max` expired entries from the queues' heads.
    fn evict(&mut self, now: Instant, max: usize) {
        let mut evicted = 0;
        for q in [Queue::Unpinned, Queue::Closing] {
            while evicted < max {
                let head = self.queues[q as usize].head;
                if head == NIL {
                    break;
                }
                self.steps += 1;
                if !self.slots[head as usize].entry.expired(now) {
                    break;
                }
                self.remove(head);
                evicted += 1;
            }
        }
    }

    /// Evicts every expired entry (tests; the receive path evicts a few at a time).
    #[cfg(test)]
    fn sweep(&mut self, now: Instant) {
        self.evict(now, usize::MAX);
    }

    fn insert(&mut self, addr: SocketAddr, entry: Entry) {
        let slot = Slot {
            addr,
            entry,
            queue: None,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(addr, i);
        self.requeue(i);
    }

    /// Counts a long-header datagram of `len` bytes from `from`; an Initial from an unknown
    /// source opens an entry if there is room (after evicting a few expired ones).
    pub fn received(&mut self, from: SocketAddr, len: usize, initial: bool, now: Instant) -> Seen {
        let from = canonical(from);
        if let Some((i, e)) = self.entry_mut(from) {
            e.received += len as u64;
            e.touched = now;
            if e.pin == Hold::No {
                self.requeue(i);
            }
            return Seen::Counted;
        }
        if !initial {
            return Seen::Ignored;
        }
        self.evict(now, EVICTIONS_PER_INSERT);
        if self.index.len() >= MAX_ENTRIES {
            return Seen::Full;
        }
        let entry = Entry {
            received: len as u64,
            sent: 0,
            pin: Hold::No,
            touched: now,
            ours: None,
        };
        self.insert(from, entry);
        Seen::Opened
    }

    fn set_pin(&mut self, addr: SocketAddr, pin: Hold, now: Instant) {
        let Some((i, e)) = self.entry_mut(addr) else {
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
        self.requeue(i);
    }

    /// Counts a datagram from `from` as [`Self::received`] does, and forgets `from` (validated)
    /// when it carries a Handshake packet to the CID we gave it.
    pub fn received_datagram(&mut self, from: SocketAddr, datagram: &[u8], now: Instant) -> Seen {
        let Some(&first) = datagram.first() else {
            return Seen::Ignored;
        };
        let seen = self.received(from, datagram.len(), header::is_initial(first), now);
        let proven = self
            .entry_mut(from)
            .and_then(|(_, e)| e.ours)
            .is_some_and(|ours| proves_address(datagram, &ours));
        if proven {
            self.release(from);
        }
        seen
    }

    /// An unvalidated handshake with `addr` starts: limit what we send it.
    pub fn pin(&mut self, addr: SocketAddr, now: Instant) {
        self.set_pin(addr, Hold::Held, now);
    }

    /// The handshake with `addr` failed: keep limiting its last packets for `for_` (always
    /// [`CLOSING_TTL`], which keeps the closing queue in deadline order; a shorter one would
    /// only be evicted late, never early).
    pub fn unpin_after(&mut self, addr: SocketAddr, for_: Duration, now: Instant) {
        self.set_pin(addr, Hold::Until(now + for_), now);
    }

    /// `addr` is validated, or no handshake was started: forget it.
    pub fn release(&mut self, addr: SocketAddr) {
        if let Some(&i) = self.index.get(&canonical(addr)) {
            self.remove(i);
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
        let (_, e) = self.entry_mut(to)?;
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
    /// Transmits (partly) withheld.
    pub withheld: prometheus::IntCounter,
}

impl Guard {
    pub fn new(withheld: prometheus::IntCounter) -> Arc<Self> {
        Arc::new(Self {
            ledger: Mutex::new(Ledger::default()),
            limited: AtomicUsize::new(0),
            withheld,
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

    /// Whether `addr` has an entry ([`Ledger::tracks`]).
    pub fn tracks(&self, addr: SocketAddr) -> bool {
        self.with(|l| l.tracks(addr))
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

    /// Counts the long-header datagrams of one receive batch (each of a GRO buffer's). Every
    /// datagram is delivered: an Initial the full ledger has no entry for is refused a
    /// handshake by the accept loop instead ([`Guard::tracks`]).
    fn account(&self, bufs: &[IoSliceMut<'_>], meta: &[RecvMeta]) {
        let now = Instant::now();
        for (m, buf) in meta.iter().zip(bufs) {
            let Some(data) = buf.get(..m.len).filter(|d| !d.is_empty()) else {
                continue;
            };
            let datagrams = data.chunks(m.stride.max(1));
            let mut long = datagrams
                .filter(|d| header::is_long_header(d[0]))
                .peekable();
            if long.peek().is_none() {
                continue;
            }
            self.guard.with(|l| {
                for d in long {
                    l.received_datagram(m.addr, d, now);
                }
            });
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
        self.account(&bufs[..n], &meta[..n]);
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
        assert_eq!(l.received(a, 1200, true, t), Seen::Opened);
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

    fn source(i: usize) -> SocketAddr {
        SocketAddr::new(std::net::Ipv4Addr::from(i as u32 + 1).into(), 1)
    }

    /// A full ledger opens no entry for a new source, in constant work: every Initial looks
    /// at the two queue heads at most and nothing scans the 65,536 entries.
    #[test]
    fn a_full_ledger_opens_no_entry_and_costs_constant_work_per_initial() {
        let mut l = Ledger::default();
        let t = Instant::now();
        for i in 0..MAX_ENTRIES {
            assert_eq!(l.received(source(i), 1200, true, t), Seen::Opened);
        }
        // The same instant: nothing has expired.
        let before = l.steps();
        for i in 0..100_000 {
            let new = source(MAX_ENTRIES + i);
            assert_eq!(l.received(new, 1200, true, t), Seen::Full);
            assert!(!l.tracks(new));
        }
        let per = (l.steps() - before) as f64 / 100_000.0;
        assert!(per <= 2.0, "{per} steps per Initial");
        // A known source is still counted.
        assert_eq!(l.received(source(7), 1200, false, t), Seen::Counted);
        // Once the undecided ones have expired, each new Initial evicts two and gets room.
        let later = t + UNPINNED_TTL + Duration::from_millis(1);
        let before = l.steps();
        for i in 0..1000 {
            let new = addr(&format!("203.0.113.{}:{}", i % 250, 1000 + i));
            assert_eq!(l.received(new, 1200, true, later), Seen::Opened);
            assert!(l.tracks(new));
        }
        assert!(l.steps() - before <= 1000 * (EVICTIONS_PER_INSERT as u64 + 2));
        assert_eq!(l.len(), MAX_ENTRIES - 1000, "2 out, 1 in, per Initial");
    }

    /// Entries leave in deadline order whatever the order they came in: a touched entry moves
    /// back, a held one never expires, a failed one expires after CLOSING_TTL.
    #[test]
    fn eviction_follows_deadlines_not_arrival() {
        let mut l = Ledger::default();
        let t = Instant::now();
        let (a, b, c, d) = (source(1), source(2), source(3), source(4));
        for x in [a, b, c, d] {
            l.received(x, 1200, true, t);
        }
        l.pin(b, t);
        l.pin(c, t);
        l.unpin_after(c, CLOSING_TTL, t);
        // a is touched a second later; d is not.
        let t1 = t + Duration::from_secs(1);
        l.received(a, 100, false, t1);
        let t2 = t + UNPINNED_TTL + Duration::from_millis(1);
        l.sweep(t2);
        assert!(l.tracks(a) && l.tracks(b) && l.tracks(c) && !l.tracks(d));
        l.sweep(t1 + UNPINNED_TTL + Duration::from_millis(1));
        assert!(!l.tracks(a) && l.tracks(b) && l.tracks(c));
        l.sweep(t + CLOSING_TTL);
        assert!(
            l.tracks(b) && !l.tracks(c),
            "held forever, closing until its time"
        );
        assert_eq!((l.len(), l.limited()), (1, 1));
        // Released: the slot is reused, nothing dangles on a queue.
        l.release(b);
        assert!(l.is_empty());
        for i in 10..20 {
            l.received(source(i), 1200, true, t2);
        }
        l.sweep(t2 + UNPINNED_TTL + Duration::from_millis(1));
        assert!(l.is_empty());
    }

    /// After a flood the table gives its memory back once it empties.
    #[test]
    fn the_slots_of_a_flood_are_returned() {
        let mut l = Ledger::default();
        let t = Instant::now();
        for i in 0..MAX_ENTRIES {
            l.received(source(i), 1200, true, t);
        }
        assert_eq!(l.slots.len(), MAX_ENTRIES);
        l.sweep(t + UNPINNED_TTL + Duration::from_millis(1));
        assert!(l.is_empty());
        assert_eq!(l.slots.capacity(), 0);
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
        let ours = |l: &Ledger| l.slots[l.index[&a] as usize].entry.ours;
        assert_eq!(ours(&l), None, "not limited: nothing to learn");
        l.pin(a, t);
        l.allow(a, &[0x40, 1, 2], none(), t);
        l.allow(a, &packet(TYPE_INITIAL, b"c", b"first", 10), none(), t);
        l.allow(a, &packet(TYPE_HANDSHAKE, b"c", b"second", 10), none(), t);
        assert_eq!(ours(&l), Cid::new(b"first"));
    }

    #[test]
    fn mapped_addresses_are_one_source() {
        let mapped = addr("[::ffff:192.0.2.9]:5");
        assert_eq!(canonical(mapped), addr("192.0.2.9:5"));
    }
}
