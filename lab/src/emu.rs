//! The path emulator's core: delay line, random loss, rate limit with a drop-tail queue, path
//! MTU (ICMP or black hole), IPv4 fragmentation and the per-connection first-flight drop rule.
//!
//! No I/O and no clock: the router shell passes "now" in nanoseconds and moves bytes between
//! TUN devices, so every behaviour here is tested with synthetic packets and synthetic time.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::packet::{self, PacketInfo, PROTO_TCP, PROTO_UDP, TCP_SYN};
use super::topology;

/// Direction of travel through the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Dir {
    /// Client namespace to server namespace.
    C2S,
    /// Server namespace to client namespace.
    S2C,
}

impl Dir {
    fn idx(self) -> usize {
        match self {
            Dir::C2S => 0,
            Dir::S2C => 1,
        }
    }
    pub fn reverse(self) -> Dir {
        match self {
            Dir::C2S => Dir::S2C,
            Dir::S2C => Dir::C2S,
        }
    }
}

/// One direction of the emulated path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LinkConfig {
    /// One-way delay in microseconds.
    pub delay_us: u64,
    /// Probability (0..1) that a packet is dropped at random.
    pub loss: f64,
    /// Bottleneck rate in kbit/s; `None` is unlimited (the router's CPU is the limit).
    pub rate_kbit: Option<u64>,
    /// Drop-tail queue in front of the bottleneck, in bytes (only with a rate).
    pub queue_bytes: u64,
    /// Path MTU in bytes (IP packet size).
    pub mtu: u32,
    /// Send ICMP frag-needed / packet-too-big for oversized packets; `false` is a black hole.
    pub icmp: bool,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay_us: 0,
            loss: 0.0,
            rate_kbit: None,
            queue_bytes: 1_000_000,
            mtu: 1500,
            icmp: true,
        }
    }
}

/// Which datagram of a flight the rule drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Position {
    Last,
    /// The last datagram of the flight that carries handshake data: a QUIC long-header packet
    /// first (for TCP every data segment counts, so this is `Last`). A server that follows
    /// its handshake with 0.5-RTT data (HTTP/3 SETTINGS) loses handshake data with this
    /// rule, where `Last` would take the SETTINGS datagram.
    LastHandshake,
    /// 1-based position in the flight.
    Nth(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RuleProto {
    Udp,
    Tcp,
    Any,
}

impl RuleProto {
    fn matches(self, proto: u8) -> bool {
        match self {
            RuleProto::Udp => proto == PROTO_UDP,
            RuleProto::Tcp => proto == PROTO_TCP,
            RuleProto::Any => proto == PROTO_UDP || proto == PROTO_TCP,
        }
    }
}

/// Drop chosen datagrams of the server's first flight of every connection.
///
/// The flight is what the server sends from its first packet of the connection on, until the
/// server goes quiet for `gap_us` or the client reacts: a client packet reaching the router
/// after the flight's first packet was delivered to the client. Client packets sent earlier
/// (a ClientHello spread over several Initial datagrams) cannot be a reaction and do not end
/// the flight. Positions count every packet on the wire, extra or duplicate ones included.
/// For TCP only data-bearing segments count (the TLS ServerHello..Finished flight), never the
/// SYN-ACK or bare ACKs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlightRule {
    pub positions: Vec<Position>,
    pub proto: RuleProto,
    pub gap_us: u64,
}

/// Milliseconds (as the command line and the scenarios write them) to the router's microseconds.
pub fn ms_to_us(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

/// Quiet time that ends a flight when nothing else does, as a fraction of the round trip: long
/// enough to span a server waiting a few milliseconds for the rest of a multi-datagram
/// ClientHello, far shorter than the client's reaction (one RTT).
pub fn default_flight_gap_us(rtt_us: u64) -> u64 {
    (rtt_us / 4).clamp(1_000, 50_000)
}

impl FlightRule {
    /// `first-flight-last`, `first-flight:last`, `first-flight:3`, `first-flight:1,last`.
    pub fn parse(spec: &str, proto: RuleProto, gap_us: u64) -> Result<Option<Self>, String> {
        let spec = spec.trim();
        if spec.is_empty() || spec == "none" {
            return Ok(None);
        }
        let list = if spec == "first-flight-last" {
            "last"
        } else if spec == "first-flight-last-handshake" {
            "last-handshake"
        } else if let Some(rest) = spec.strip_prefix("first-flight:") {
            rest
        } else {
            return Err(format!(
                "unknown drop rule {spec:?} (expected none, first-flight-last, first-flight-last-handshake or first-flight:N[,last][,last-handshake])"
            ));
        };
        let mut positions = Vec::new();
        for p in list.split(',') {
            let p = p.trim();
            if p == "last" {
                positions.push(Position::Last);
            } else if p == "last-handshake" {
                positions.push(Position::LastHandshake);
            } else {
                match p.parse::<u32>() {
                    Ok(n) if n >= 1 => positions.push(Position::Nth(n)),
                    _ => {
                        return Err(format!(
                            "bad flight position {p:?} (1-based number, last or last-handshake)"
                        ))
                    }
                }
            }
        }
        Ok(Some(Self {
            positions,
            proto,
            gap_us,
        }))
    }

    /// Whether a position is only known once the flight went quiet.
    fn waits_for_quiet(&self) -> bool {
        self.positions
            .iter()
            .any(|p| matches!(p, Position::Last | Position::LastHandshake))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmuConfig {
    pub c2s: LinkConfig,
    pub s2c: LinkConfig,
    /// Seed of the random-loss generators (one per direction).
    pub seed: u64,
    pub rule: Option<FlightRule>,
}

impl Default for EmuConfig {
    fn default() -> Self {
        Self {
            c2s: LinkConfig::default(),
            s2c: LinkConfig::default(),
            seed: 1,
            rule: None,
        }
    }
}

impl EmuConfig {
    fn link(&self, d: Dir) -> &LinkConfig {
        match d {
            Dir::C2S => &self.c2s,
            Dir::S2C => &self.s2c,
        }
    }
}

macro_rules! counters {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident),* $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct $name { $($(#[$fm])* pub $f: u64),* }
        impl $name {
            /// `self - earlier`, saturating, for per-cell attribution.
            pub fn delta(&self, earlier: &Self) -> Self {
                Self { $($f: self.$f.saturating_sub(earlier.$f)),* }
            }
            /// Accumulates a delta into a per-cell total.
            pub fn add(&mut self, other: &Self) {
                $(self.$f += other.$f;)*
            }
        }
    };
}

counters!(
    /// Per-direction counters.
    DirCounters {
        rx_packets,
        rx_bytes,
        /// Packets written to the far side (fragments counted individually).
        tx_packets,
        tx_bytes,
        drop_random,
        drop_rule,
        /// Drop-tail at the rate limiter's queue.
        drop_queue,
        /// Oversized with DF (IPv4) or IPv6: dropped, ICMP or not.
        drop_mtu,
        /// Not addressed to the other side's prefixes (e.g. IPv6 router solicitations).
        drop_unroutable,
        drop_malformed,
        /// The TUN write failed.
        drop_write,
        ipv4_packets,
        ipv4_df,
        ipv4_no_df,
        ipv4_udp_df,
        ipv4_udp_no_df,
        /// IPv4 fragments that reached the router already fragmented (by the sending host).
        ipv4_fragments_in,
        ipv6_packets,
        udp_packets,
        tcp_packets,
        /// Fragments produced by the router from non-DF IPv4 packets above the MTU.
        fragments_created,
        /// ICMP errors sent back to the sender of this direction.
        icmp_sent,
    }
);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleCounters {
    /// Connections whose server started a first flight.
    pub flights: u64,
    /// Flights whose end was seen (client packet or quiet gap).
    pub flights_closed: u64,
    /// Datagrams dropped by the rule.
    pub drops: u64,
    /// Connections that lost at least one datagram to the rule.
    pub connections_with_drop: u64,
    /// Connections that lost more datagrams than the rule has positions (must stay 0).
    pub connections_over_dropped: u64,
    /// Flight length in datagrams -> number of flights.
    pub flight_sizes: BTreeMap<u32, u64>,
}

impl RuleCounters {
    pub fn add(&mut self, o: &Self) {
        self.flights += o.flights;
        self.flights_closed += o.flights_closed;
        self.drops += o.drops;
        self.connections_with_drop += o.connections_with_drop;
        self.connections_over_dropped += o.connections_over_dropped;
        for (k, v) in &o.flight_sizes {
            *self.flight_sizes.entry(*k).or_default() += v;
        }
    }

    pub fn delta(&self, earlier: &Self) -> Self {
        let mut sizes = BTreeMap::new();
        for (k, v) in &self.flight_sizes {
            let d = v.saturating_sub(earlier.flight_sizes.get(k).copied().unwrap_or(0));
            if d > 0 {
                sizes.insert(*k, d);
            }
        }
        Self {
            flights: self.flights.saturating_sub(earlier.flights),
            flights_closed: self.flights_closed.saturating_sub(earlier.flights_closed),
            drops: self.drops.saturating_sub(earlier.drops),
            connections_with_drop: self
                .connections_with_drop
                .saturating_sub(earlier.connections_with_drop),
            connections_over_dropped: self
                .connections_over_dropped
                .saturating_sub(earlier.connections_over_dropped),
            flight_sizes: sizes,
        }
    }
}

counters!(
    /// Server-to-client packets of one client address (S6 tells competing flows apart by
    /// the client address each one uses).
    ClientCounters {
        /// Delivered through the bottleneck.
        tx_packets,
        tx_bytes,
        /// Dropped by the bottleneck's drop-tail queue.
        drop_queue,
    }
);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    pub c2s: DirCounters,
    pub s2c: DirCounters,
    pub rule: RuleCounters,
    /// Server-to-client traffic per IPv4 client address, keyed by its last octet.
    #[serde(default)]
    pub s2c_by_client: BTreeMap<u8, ClientCounters>,
}

impl Counters {
    pub fn add(&mut self, o: &Self) {
        self.c2s.add(&o.c2s);
        self.s2c.add(&o.s2c);
        self.rule.add(&o.rule);
        for (k, v) in &o.s2c_by_client {
            self.s2c_by_client.entry(*k).or_default().add(v);
        }
    }

    pub fn delta(&self, earlier: &Self) -> Self {
        let by_client = self
            .s2c_by_client
            .iter()
            .map(|(k, v)| {
                let before = earlier.s2c_by_client.get(k).cloned().unwrap_or_default();
                (*k, v.delta(&before))
            })
            .collect();
        Self {
            c2s: self.c2s.delta(&earlier.c2s),
            s2c: self.s2c.delta(&earlier.s2c),
            rule: self.rule.delta(&earlier.rule),
            s2c_by_client: by_client,
        }
    }

    /// The counters of server-to-client packet `data` (an IP packet) by its client address,
    /// if it is IPv4 to the client network.
    fn client_mut(&mut self, dir: Dir, data: &[u8]) -> Option<&mut ClientCounters> {
        if dir != Dir::S2C || data.len() < 20 || data[0] >> 4 != 4 {
            return None;
        }
        let dst = IpAddr::from([data[16], data[17], data[18], data[19]]);
        topology::routable(Dir::S2C, dst).then(|| self.s2c_by_client.entry(data[19]).or_default())
    }
    pub fn dir(&self, d: Dir) -> &DirCounters {
        match d {
            Dir::C2S => &self.c2s,
            Dir::S2C => &self.s2c,
        }
    }
    fn dir_mut(&mut self, d: Dir) -> &mut DirCounters {
        match d {
            Dir::C2S => &mut self.c2s,
            Dir::S2C => &mut self.s2c,
        }
    }
}

/// SplitMix64: tiny, seedable, good enough for Bernoulli loss.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// A connection as the client sees it: protocol, client address/port, server address/port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ConnKey {
    proto: u8,
    client: (IpAddr, u16),
    server: (IpAddr, u16),
}

#[derive(Debug, Clone)]
struct Flight {
    count: u32,
    last_arrival: u64,
    /// When the flight's first packet reaches the client; only later client packets react.
    first_delivery: u64,
    /// Index of the latest datagram carrying handshake data.
    last_handshake: Option<u32>,
    closed: bool,
    drops: u32,
    touched: u64,
}

#[derive(Debug, Clone, Copy)]
struct Tag {
    conn: ConnKey,
    index: u32,
}

struct Queued {
    at: u64,
    seq: u64,
    dir: Dir,
    data: Vec<u8>,
    tag: Option<Tag>,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at && self.seq == o.seq
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    // BinaryHeap is a max-heap: reverse so the earliest release time pops first, FIFO on ties.
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.cmp(&self.at).then(o.seq.cmp(&self.seq))
    }
}

/// Buffers are recycled so the steady state allocates nothing per packet.
pub const BUF_SIZE: usize = 2048;
const FLIGHT_TABLE_PRUNE: usize = 4096;
const FLIGHT_IDLE_NS: u64 = 120_000_000_000;

pub struct Emulator {
    cfg: EmuConfig,
    rng: [Rng; 2],
    link_free_at: [u64; 2],
    heap: BinaryHeap<Queued>,
    seq: u64,
    pool: Vec<Vec<u8>>,
    flights: HashMap<ConnKey, Flight>,
    counters: Counters,
    scratch: Vec<Vec<u8>>,
}

/// A packet to write: `Dir::C2S` goes to the server-side TUN, `Dir::S2C` to the client side.
pub type Out = (Dir, Vec<u8>);

impl Emulator {
    pub fn new(cfg: EmuConfig) -> Self {
        let mut e = Self {
            rng: [Rng(0), Rng(0)],
            cfg: EmuConfig::default(),
            link_free_at: [0; 2],
            heap: BinaryHeap::new(),
            seq: 0,
            pool: Vec::new(),
            flights: HashMap::new(),
            counters: Counters::default(),
            scratch: Vec::new(),
        };
        e.set_config(cfg);
        e
    }

    pub fn config(&self) -> &EmuConfig {
        &self.cfg
    }

    /// Applies a new configuration; packets already in the delay line keep their release time.
    pub fn set_config(&mut self, cfg: EmuConfig) {
        self.rng = [
            Rng(cfg.seed ^ 0x5eed_c25c_0000_0001),
            Rng(cfg.seed ^ 0x5eed_52c0_0000_0002),
        ];
        if cfg.rule != self.cfg.rule {
            self.flights.clear();
        }
        self.cfg = cfg;
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    pub fn reset_counters(&mut self) {
        self.counters = Counters::default();
    }

    pub fn queued(&self) -> usize {
        self.heap.len()
    }

    pub fn take_buf(&mut self) -> Vec<u8> {
        let mut b = self
            .pool
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(BUF_SIZE));
        b.clear();
        b
    }

    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() >= BUF_SIZE && self.pool.len() < 65536 {
            self.pool.push(buf);
        }
    }

    pub fn next_release(&self) -> Option<u64> {
        self.heap.peek().map(|q| q.at)
    }

    pub fn note_write_error(&mut self, d: Dir) {
        self.counters.dir_mut(d).drop_write += 1;
    }

    /// A packet read from the TUN of `dir`'s sending side at `now`. Packets to send right away
    /// (ICMP errors) are appended to `immediate`.
    pub fn ingress(&mut self, now: u64, dir: Dir, data: Vec<u8>, immediate: &mut Vec<Out>) {
        let c = self.counters.dir_mut(dir);
        c.rx_packets += 1;
        c.rx_bytes += data.len() as u64;
        let info = match packet::parse(&data) {
            Ok(i) => i,
            Err(_) => {
                c.drop_malformed += 1;
                self.recycle(data);
                return;
            }
        };
        if !topology::routable(dir, info.dst) {
            c.drop_unroutable += 1;
            self.recycle(data);
            return;
        }
        count_kind(c, &info);
        let tag = self.observe_flight(now, dir, &info);

        let link = self.cfg.link(dir).clone();
        if info.total_len > link.mtu as usize {
            if info.is_ipv4() && !info.df {
                let mut pieces = std::mem::take(&mut self.scratch);
                let pool = &mut self.pool;
                let n = packet::fragment_ipv4(&data, link.mtu as usize, |f| {
                    let mut b = pool.pop().unwrap_or_else(|| Vec::with_capacity(BUF_SIZE));
                    b.clear();
                    b.extend_from_slice(f);
                    pieces.push(b);
                });
                self.counters.dir_mut(dir).fragments_created += n as u64;
                self.recycle(data);
                for p in pieces.drain(..) {
                    self.enqueue(now, dir, p, tag, &link);
                }
                self.scratch = pieces;
            } else {
                let c = self.counters.dir_mut(dir);
                c.drop_mtu += 1;
                if link.icmp {
                    let icmp = match info.src {
                        IpAddr::V4(_) => packet::icmpv4_frag_needed(
                            &data,
                            topology::router_v4(dir),
                            link.mtu.min(u32::from(u16::MAX)) as u16,
                        ),
                        IpAddr::V6(_) => {
                            packet::icmpv6_packet_too_big(&data, topology::router_v6(dir), link.mtu)
                        }
                    };
                    if let Some(icmp) = icmp {
                        c.icmp_sent += 1;
                        immediate.push((dir.reverse(), icmp));
                    }
                }
                self.recycle(data);
            }
            return;
        }
        self.enqueue(now, dir, data, tag, &link);
    }

    fn enqueue(&mut self, now: u64, dir: Dir, data: Vec<u8>, tag: Option<Tag>, link: &LinkConfig) {
        let i = dir.idx();
        if self.rng[i].chance(link.loss) {
            self.counters.dir_mut(dir).drop_random += 1;
            self.recycle(data);
            return;
        }
        let mut depart = now;
        if let Some(kbit) = link.rate_kbit.filter(|k| *k > 0) {
            let rate_bps = u128::from(kbit) * 1000;
            let busy = self.link_free_at[i].saturating_sub(now);
            let backlog = (u128::from(busy) * rate_bps / 8 / 1_000_000_000) as u64;
            if backlog + data.len() as u64 > link.queue_bytes {
                self.counters.dir_mut(dir).drop_queue += 1;
                if let Some(c) = self.counters.client_mut(dir, &data) {
                    c.drop_queue += 1;
                }
                self.recycle(data);
                return;
            }
            let tx_ns = (data.len() as u128 * 8 * 1_000_000_000 / rate_bps) as u64;
            depart = self.link_free_at[i].max(now) + tx_ns;
            self.link_free_at[i] = depart;
        }
        let mut at = depart + link.delay_us * 1000;
        if let (Some(_), Some(rule)) = (tag, &self.cfg.rule) {
            // "Last of its burst" is only known once the server stayed quiet for the gap; a
            // candidate is never released before that, even on paths shorter than the gap.
            if rule.waits_for_quiet() {
                at = at.max(now + rule.gap_us * 1000);
            }
        }
        if let Some(t) = tag.filter(|t| t.index == 0) {
            if let Some(f) = self.flights.get_mut(&t.conn) {
                f.first_delivery = at;
            }
        }
        self.seq += 1;
        self.heap.push(Queued {
            at,
            seq: self.seq,
            dir,
            data,
            tag,
        });
    }

    /// Tracks first flights; returns the position tag of a server packet inside one.
    fn observe_flight(&mut self, now: u64, dir: Dir, info: &PacketInfo) -> Option<Tag> {
        let rule = self.cfg.rule.as_ref()?;
        if !rule.proto.matches(info.proto) {
            return None;
        }
        let (sport, dport) = info.ports?;
        let gap = rule.gap_us * 1000;
        match dir {
            Dir::C2S => {
                let key = ConnKey {
                    proto: info.proto,
                    client: (info.src, sport),
                    server: (info.dst, dport),
                };
                if let Some(f) = self.flights.get_mut(&key) {
                    f.touched = now;
                    if !f.closed && now >= f.first_delivery {
                        f.closed = true;
                        close_flight(&mut self.counters.rule, f.count);
                    }
                }
                None
            }
            Dir::S2C => {
                if info.proto == PROTO_TCP
                    && (info.payload_len == 0 || info.tcp_flags & TCP_SYN != 0)
                {
                    return None;
                }
                let key = ConnKey {
                    proto: info.proto,
                    client: (info.dst, dport),
                    server: (info.src, sport),
                };
                let handshake = info.proto == PROTO_TCP || info.quic_long_header;
                if self.flights.len() >= FLIGHT_TABLE_PRUNE {
                    self.flights
                        .retain(|_, f| now.saturating_sub(f.touched) < FLIGHT_IDLE_NS);
                }
                match self.flights.get_mut(&key) {
                    None => {
                        self.flights.insert(
                            key,
                            Flight {
                                count: 1,
                                last_arrival: now,
                                // Refined to the real release time when the packet is queued.
                                first_delivery: now + self.cfg.s2c.delay_us * 1000,
                                last_handshake: handshake.then_some(0),
                                closed: false,
                                drops: 0,
                                touched: now,
                            },
                        );
                        self.counters.rule.flights += 1;
                        Some(Tag {
                            conn: key,
                            index: 0,
                        })
                    }
                    Some(f) => {
                        f.touched = now;
                        if f.closed {
                            return None;
                        }
                        if now.saturating_sub(f.last_arrival) > gap {
                            f.closed = true;
                            close_flight(&mut self.counters.rule, f.count);
                            return None;
                        }
                        f.count += 1;
                        f.last_arrival = now;
                        if handshake {
                            f.last_handshake = Some(f.count - 1);
                        }
                        Some(Tag {
                            conn: key,
                            index: f.count - 1,
                        })
                    }
                }
            }
        }
    }

    /// The next packet whose release time has come, after the drop rule had its say.
    pub fn pop_due(&mut self, now: u64) -> Option<Out> {
        loop {
            if self.heap.peek().is_none_or(|q| q.at > now) {
                return None;
            }
            let mut q = self.heap.pop()?;
            if let Some(tag) = q.tag {
                match self.rule_decision(now, tag) {
                    Decision::Keep => {}
                    Decision::Drop => {
                        self.counters.dir_mut(q.dir).drop_rule += 1;
                        self.recycle(q.data);
                        continue;
                    }
                    Decision::WaitUntil(t) => {
                        q.at = t;
                        self.heap.push(q);
                        continue;
                    }
                }
            }
            let c = self.counters.dir_mut(q.dir);
            c.tx_packets += 1;
            c.tx_bytes += q.data.len() as u64;
            if let Some(c) = self.counters.client_mut(q.dir, &q.data) {
                c.tx_packets += 1;
                c.tx_bytes += q.data.len() as u64;
            }
            return Some((q.dir, q.data));
        }
    }

    fn rule_decision(&mut self, now: u64, tag: Tag) -> Decision {
        let Some(rule) = &self.cfg.rule else {
            return Decision::Keep;
        };
        let Some(f) = self.flights.get_mut(&tag.conn) else {
            return Decision::Keep;
        };
        let mut drop = rule.positions.contains(&Position::Nth(tag.index + 1));
        // Both "last" positions can change while the flight is open: decide once it is quiet.
        let last = rule.positions.contains(&Position::Last) && tag.index + 1 == f.count;
        // Only handshake-bearing datagrams are ever recorded as `last_handshake`.
        let last_handshake = rule.positions.contains(&Position::LastHandshake)
            && f.last_handshake == Some(tag.index);
        if !drop && (last || last_handshake) {
            if !f.closed {
                let quiet_at = f.last_arrival + rule.gap_us * 1000;
                if now < quiet_at {
                    return Decision::WaitUntil(quiet_at);
                }
                f.closed = true;
                close_flight(&mut self.counters.rule, f.count);
            }
            drop = true;
        }
        if !drop {
            return Decision::Keep;
        }
        f.drops += 1;
        let rc = &mut self.counters.rule;
        rc.drops += 1;
        if f.drops == 1 {
            rc.connections_with_drop += 1;
        }
        if f.drops as usize == rule.positions.len() + 1 {
            rc.connections_over_dropped += 1;
        }
        Decision::Drop
    }
}

enum Decision {
    Keep,
    Drop,
    WaitUntil(u64),
}

fn close_flight(rc: &mut RuleCounters, size: u32) {
    rc.flights_closed += 1;
    *rc.flight_sizes.entry(size).or_default() += 1;
}

fn count_kind(c: &mut DirCounters, info: &PacketInfo) {
    match info.src {
        IpAddr::V4(_) => {
            c.ipv4_packets += 1;
            if info.df {
                c.ipv4_df += 1;
            } else {
                c.ipv4_no_df += 1;
            }
            if info.proto == PROTO_UDP {
                if info.df {
                    c.ipv4_udp_df += 1;
                } else {
                    c.ipv4_udp_no_df += 1;
                }
            }
            if info.fragment {
                c.ipv4_fragments_in += 1;
            }
        }
        IpAddr::V6(_) => c.ipv6_packets += 1,
    }
    match info.proto {
        PROTO_UDP => c.udp_packets += 1,
        PROTO_TCP => c.tcp_packets += 1,
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::tests::{tcp4, udp4, udp6};
    use crate::topology::{CLIENT2_V4, CLIENT_V4, CLIENT_V6, SERVER_V4, SERVER_V6};

    const MS: u64 = 1_000_000;
    const C: [u8; 4] = CLIENT_V4.octets();
    const S: [u8; 4] = SERVER_V4.octets();

    fn link(delay_ms: u64) -> LinkConfig {
        LinkConfig {
            delay_us: delay_ms * 1000,
            ..LinkConfig::default()
        }
    }

    fn emu_gap(delay_ms: u64, rule: Option<&str>, proto: RuleProto, gap_us: u64) -> Emulator {
        Emulator::new(EmuConfig {
            c2s: link(delay_ms),
            s2c: link(delay_ms),
            seed: 7,
            rule: rule.and_then(|r| FlightRule::parse(r, proto, gap_us).unwrap()),
        })
    }

    fn emu(delay_ms: u64, rule: Option<&str>, proto: RuleProto) -> Emulator {
        emu_gap(
            delay_ms,
            rule,
            proto,
            default_flight_gap_us(2 * delay_ms * 1000),
        )
    }

    /// Releases everything due up to `until`, in time order: (release time, dir, bytes).
    fn run(e: &mut Emulator, until: u64) -> Vec<(u64, Dir, Vec<u8>)> {
        let mut out = Vec::new();
        while let Some(t) = e.next_release() {
            if t > until {
                break;
            }
            while let Some((d, b)) = e.pop_due(t) {
                out.push((t, d, b));
            }
        }
        out
    }

    fn feed(e: &mut Emulator, now: u64, dir: Dir, p: Vec<u8>) -> Vec<Out> {
        let mut imm = Vec::new();
        e.ingress(now, dir, p, &mut imm);
        imm
    }

    /// Server datagram with a marker byte so tests can tell which one was dropped.
    fn server_dgram(cport: u16, marker: u8) -> Vec<u8> {
        let mut p = udp4(S, 443, C, cport, 1200, true);
        p[28] = marker;
        p
    }

    fn markers(out: &[(u64, Dir, Vec<u8>)], dir: Dir) -> Vec<u8> {
        out.iter().filter(|o| o.1 == dir).map(|o| o.2[28]).collect()
    }

    #[test]
    fn delays_each_direction() {
        let mut e = emu(100, None, RuleProto::Any);
        assert!(feed(&mut e, 0, Dir::C2S, udp4(C, 5000, S, 443, 100, true)).is_empty());
        assert!(e.pop_due(100 * MS - 1).is_none());
        let (d, _) = e.pop_due(100 * MS).unwrap();
        assert_eq!(d, Dir::C2S);
        let c = e.counters();
        assert_eq!(
            (c.c2s.rx_packets, c.c2s.tx_packets, c.c2s.ipv4_udp_df),
            (1, 1, 1)
        );
    }

    #[test]
    fn random_loss_is_seeded_and_close_to_the_rate() {
        let count = |seed| {
            let mut cfg = EmuConfig::default();
            cfg.c2s.loss = 0.02;
            cfg.seed = seed;
            let mut e = Emulator::new(cfg);
            for i in 0..20_000u64 {
                feed(&mut e, i, Dir::C2S, udp4(C, 5000, S, 443, 10, true));
            }
            e.counters().c2s.drop_random
        };
        let a = count(1);
        assert_eq!(a, count(1), "same seed, same losses");
        assert_ne!(a, count(2));
        assert!((300..=500).contains(&a), "2 % of 20000 is 400, got {a}");
    }

    #[test]
    fn rate_limit_serialises_and_drops_tail() {
        let mut cfg = EmuConfig::default();
        cfg.c2s.rate_kbit = Some(1000); // 1250 bytes take 10 ms
        cfg.c2s.queue_bytes = 5000;
        cfg.c2s.delay_us = 5000;
        let mut e = Emulator::new(cfg);
        for _ in 0..10 {
            feed(&mut e, 0, Dir::C2S, udp4(C, 5000, S, 443, 1222, true));
        }
        assert_eq!(e.counters().c2s.drop_queue, 6);
        let out = run(&mut e, u64::MAX);
        let times: Vec<u64> = out.iter().map(|o| o.0 / MS).collect();
        assert_eq!(times, vec![15, 25, 35, 45]);
    }

    #[test]
    fn server_to_client_traffic_is_counted_per_client_address() {
        let mut cfg = EmuConfig::default();
        cfg.s2c.rate_kbit = Some(1000);
        cfg.s2c.queue_bytes = 2500;
        let mut e = Emulator::new(cfg);
        let second = CLIENT2_V4.octets();
        // Two packets to each client address; the queue holds two, so the last two drop.
        for dst in [C, C, second, second] {
            feed(&mut e, 0, Dir::S2C, udp4(S, 443, dst, 5000, 1222, true));
        }
        feed(&mut e, 0, Dir::C2S, udp4(C, 5000, S, 443, 100, true));
        run(&mut e, u64::MAX);
        let by = &e.counters().s2c_by_client;
        assert_eq!(by.len(), 2, "{by:?}");
        assert_eq!((by[&2].tx_packets, by[&2].drop_queue), (2, 0));
        assert_eq!((by[&3].tx_packets, by[&3].drop_queue), (0, 2));
        assert_eq!(by[&2].tx_bytes, e.counters().s2c.tx_bytes);
        let d = e.counters().delta(&Counters::default());
        assert_eq!(d.s2c_by_client, *by);
    }

    #[test]
    fn mtu_with_df_drops_and_answers_with_icmp() {
        let mut cfg = EmuConfig::default();
        cfg.s2c.mtu = 1280;
        let mut e = Emulator::new(cfg.clone());
        let imm = feed(&mut e, 0, Dir::S2C, udp4(S, 443, C, 5000, 1300, true));
        assert_eq!(imm.len(), 1);
        assert_eq!(imm[0].0, Dir::C2S, "ICMP goes back towards the server");
        let i = packet::parse(&imm[0].1).unwrap();
        assert_eq!(i.dst, IpAddr::V4(SERVER_V4));
        assert_eq!(e.counters().s2c.drop_mtu, 1);
        assert_eq!(e.counters().s2c.icmp_sent, 1);
        assert!(run(&mut e, u64::MAX).is_empty());

        cfg.s2c.icmp = false;
        let mut e = Emulator::new(cfg);
        assert!(feed(&mut e, 0, Dir::S2C, udp4(S, 443, C, 5000, 1300, true)).is_empty());
        let imm = feed(
            &mut e,
            0,
            Dir::S2C,
            udp6(SERVER_V6, 443, CLIENT_V6, 5000, 1300),
        );
        assert!(imm.is_empty());
        assert_eq!(e.counters().s2c.drop_mtu, 2);
        assert_eq!(e.counters().s2c.icmp_sent, 0);
    }

    #[test]
    fn ipv6_too_big_gets_packet_too_big() {
        let mut cfg = EmuConfig::default();
        cfg.c2s.mtu = 1400;
        let mut e = Emulator::new(cfg);
        let imm = feed(
            &mut e,
            0,
            Dir::C2S,
            udp6(CLIENT_V6, 5000, SERVER_V6, 443, 1400),
        );
        assert_eq!(imm.len(), 1);
        assert_eq!(packet::parse(&imm[0].1).unwrap().icmp_type, Some(2));
        // Exactly at the MTU passes.
        feed(
            &mut e,
            0,
            Dir::C2S,
            udp6(CLIENT_V6, 5000, SERVER_V6, 443, 1352),
        );
        assert_eq!(run(&mut e, u64::MAX).len(), 1);
    }

    #[test]
    fn non_df_ipv4_is_fragmented() {
        let mut cfg = EmuConfig::default();
        cfg.s2c.mtu = 1280;
        let mut e = Emulator::new(cfg);
        assert!(feed(&mut e, 0, Dir::S2C, udp4(S, 443, C, 5000, 1400, false)).is_empty());
        let out = run(&mut e, u64::MAX);
        assert_eq!(out.len(), 2);
        let c = &e.counters().s2c;
        assert_eq!(
            (
                c.fragments_created,
                c.tx_packets,
                c.ipv4_udp_no_df,
                c.drop_mtu
            ),
            (2, 2, 1, 0)
        );
        assert!(out.iter().all(|o| packet::parse(&o.2).unwrap().fragment));
    }

    #[test]
    fn drops_the_last_datagram_of_the_first_flight_only() {
        let mut e = emu(50, Some("first-flight-last"), RuleProto::Udp);
        feed(&mut e, 0, Dir::C2S, udp4(C, 5000, S, 443, 1200, true));
        for k in 0..5u8 {
            feed(
                &mut e,
                50 * MS + u64::from(k) * 100_000,
                Dir::S2C,
                server_dgram(5000, k),
            );
        }
        // The client answers when the flight reached it; more server data follows.
        feed(&mut e, 101 * MS, Dir::C2S, udp4(C, 5000, S, 443, 100, true));
        feed(&mut e, 152 * MS, Dir::S2C, server_dgram(5000, 10));
        feed(&mut e, 152 * MS, Dir::S2C, server_dgram(5000, 11));
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0, 1, 2, 3, 10, 11]);
        let r = &e.counters().rule;
        assert_eq!(
            (
                r.flights,
                r.flights_closed,
                r.drops,
                r.connections_with_drop
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(r.flight_sizes, BTreeMap::from([(5, 1)]));
        assert_eq!(e.counters().s2c.drop_rule, 1);
    }

    #[test]
    fn drops_the_last_handshake_datagram_not_the_data_after_it() {
        let mut e = emu(50, Some("first-flight-last-handshake"), RuleProto::Udp);
        feed(&mut e, 0, Dir::C2S, udp4(C, 5000, S, 443, 1200, true));
        // Three long-header datagrams (Initial/Handshake), then 1-RTT data (short header).
        for (k, m) in [0xc0u8, 0xe1, 0xe2, 0x43, 0x44].into_iter().enumerate() {
            feed(
                &mut e,
                50 * MS + k as u64 * 100_000,
                Dir::S2C,
                server_dgram(5000, m),
            );
        }
        feed(&mut e, 101 * MS, Dir::C2S, udp4(C, 5000, S, 443, 100, true));
        // Long headers after the flight (retransmissions) are not the flight's.
        feed(&mut e, 152 * MS, Dir::S2C, server_dgram(5000, 0xe5));
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0xc0, 0xe1, 0x43, 0x44, 0xe5]);
        let r = &e.counters().rule;
        assert_eq!((r.drops, r.connections_with_drop), (1, 1));
        assert_eq!(r.flight_sizes, BTreeMap::from([(5, 1)]));
        let rule = FlightRule::parse("first-flight:last,last-handshake", RuleProto::Any, 1)
            .unwrap()
            .unwrap();
        assert_eq!(
            rule.positions,
            vec![Position::Last, Position::LastHandshake]
        );
        assert!(FlightRule::parse("first-flight:handshake", RuleProto::Any, 1).is_err());
    }

    #[test]
    fn flight_ends_at_the_clients_reaction_only() {
        let mut e = emu(50, Some("first-flight-last"), RuleProto::Udp);
        feed(&mut e, 0, Dir::S2C, server_dgram(6000, 0));
        feed(&mut e, 100_000, Dir::S2C, server_dgram(6000, 1));
        // More of the client's first flight (e.g. a ClientHello in several datagrams): sent
        // before the server's first datagram could have reached it, so not a reaction.
        feed(&mut e, MS, Dir::C2S, udp4(C, 6000, S, 443, 1200, true));
        feed(&mut e, 2 * MS, Dir::S2C, server_dgram(6000, 2));
        // The first datagram reaches the client at 50 ms; this one is its reaction.
        feed(&mut e, 51 * MS, Dir::C2S, udp4(C, 6000, S, 443, 1200, true));
        feed(&mut e, 52 * MS, Dir::S2C, server_dgram(6000, 3));
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0, 1, 3]);
        assert_eq!(e.counters().rule.flight_sizes, BTreeMap::from([(3, 1)]));
    }

    #[test]
    fn default_gap_scales_with_the_round_trip() {
        assert_eq!(default_flight_gap_us(200_000), 50_000);
        assert_eq!(default_flight_gap_us(100_000), 25_000);
        assert_eq!(default_flight_gap_us(400_000), 50_000);
        assert_eq!(default_flight_gap_us(0), 1_000);
    }

    #[test]
    fn flight_ends_when_the_server_goes_quiet() {
        let mut e = emu(50, Some("first-flight-last"), RuleProto::Udp);
        for (t, m) in [(0, 0u8), (1, 1), (2, 2), (30, 3), (31, 4)] {
            feed(&mut e, t * MS, Dir::S2C, server_dgram(7000, m));
        }
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0, 1, 3, 4]);
        assert_eq!(e.counters().rule.flight_sizes, BTreeMap::from([(3, 1)]));
    }

    #[test]
    fn each_connection_loses_exactly_one() {
        let mut e = emu(100, Some("first-flight-last"), RuleProto::Udp);
        for conn in 0..20u16 {
            let t0 = u64::from(conn) * 1000 * MS;
            feed(
                &mut e,
                t0,
                Dir::C2S,
                udp4(C, 10000 + conn, S, 443, 1200, true),
            );
            for k in 0..(3 + conn % 4) as u8 {
                feed(
                    &mut e,
                    t0 + 100 * MS + u64::from(k) * 50_000,
                    Dir::S2C,
                    server_dgram(10000 + conn, k),
                );
            }
            // A duplicate of the flight sent later (e.g. a PTO) is outside the first flight.
            feed(
                &mut e,
                t0 + 400 * MS,
                Dir::S2C,
                server_dgram(10000 + conn, 99),
            );
        }
        run(&mut e, u64::MAX);
        let r = &e.counters().rule;
        assert_eq!(
            (
                r.flights,
                r.drops,
                r.connections_with_drop,
                r.connections_over_dropped
            ),
            (20, 20, 20, 0)
        );
    }

    #[test]
    fn tcp_rule_counts_only_data_segments() {
        let mut e = emu(50, Some("first-flight-last"), RuleProto::Tcp);
        // SYN-ACK and a bare ACK from the server are not part of the flight.
        feed(
            &mut e,
            0,
            Dir::S2C,
            tcp4(S, 443, C, 40000, TCP_SYN | 0x10, 0),
        );
        feed(&mut e, MS, Dir::C2S, tcp4(C, 40000, S, 443, 0x18, 517));
        feed(&mut e, 2 * MS, Dir::S2C, tcp4(S, 443, C, 40000, 0x10, 0));
        for k in 0..4 {
            let mut p = tcp4(S, 443, C, 40000, 0x18, 1448);
            p[40] = k;
            feed(&mut e, 3 * MS + u64::from(k) * 10_000, Dir::S2C, p);
        }
        // UDP is not subject to a TCP rule.
        feed(&mut e, 3 * MS, Dir::S2C, server_dgram(40000, 50));
        let out = run(&mut e, u64::MAX);
        let data: Vec<u8> = out
            .iter()
            .filter(|o| o.1 == Dir::S2C && packet::parse(&o.2).unwrap().payload_len == 1448)
            .map(|o| o.2[40])
            .collect();
        assert_eq!(data, vec![0, 1, 2]);
        assert_eq!(e.counters().rule.drops, 1);
        assert_eq!(e.counters().s2c.tx_packets, 6);
    }

    #[test]
    fn nth_position_and_short_paths() {
        let mut e = emu(50, Some("first-flight:2"), RuleProto::Any);
        for k in 0..4 {
            feed(&mut e, u64::from(k) * 1000, Dir::S2C, server_dgram(8000, k));
        }
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0, 2, 3]);

        // One-way delay 1 ms, shorter than a 5 ms gap: the candidate waits for the gap.
        let mut e = emu_gap(1, Some("first-flight-last"), RuleProto::Udp, 5_000);
        feed(&mut e, 0, Dir::S2C, server_dgram(9000, 0));
        feed(&mut e, 2 * MS, Dir::S2C, server_dgram(9000, 1));
        let out = run(&mut e, u64::MAX);
        assert_eq!(markers(&out, Dir::S2C), vec![0]);
        assert!(out[0].0 >= 5 * MS);
    }

    #[test]
    fn unroutable_and_malformed_are_counted() {
        let mut e = emu(0, None, RuleProto::Any);
        feed(&mut e, 0, Dir::C2S, udp4(C, 1, C, 2, 10, true));
        feed(&mut e, 0, Dir::C2S, vec![0x45, 0, 0]);
        let c = &e.counters().c2s;
        assert_eq!(
            (c.drop_unroutable, c.drop_malformed, c.tx_packets),
            (1, 1, 0)
        );
    }

    #[test]
    fn rule_parser() {
        let r = FlightRule::parse("first-flight:1,last", RuleProto::Udp, 1)
            .unwrap()
            .unwrap();
        assert_eq!(r.positions, vec![Position::Nth(1), Position::Last]);
        assert!(FlightRule::parse("none", RuleProto::Udp, 1)
            .unwrap()
            .is_none());
        assert!(FlightRule::parse("first-flight:0", RuleProto::Udp, 1).is_err());
        assert!(FlightRule::parse("everything", RuleProto::Udp, 1).is_err());
    }

    #[test]
    fn counter_deltas() {
        let mut a = Counters::default();
        a.c2s.rx_packets = 5;
        a.rule.flight_sizes.insert(4, 2);
        let mut b = a.clone();
        b.c2s.rx_packets = 9;
        b.rule.flight_sizes.insert(4, 3);
        b.rule.flight_sizes.insert(6, 1);
        let d = b.delta(&a);
        assert_eq!(d.c2s.rx_packets, 4);
        assert_eq!(d.rule.flight_sizes, BTreeMap::from([(4, 1), (6, 1)]));
        let mut sum = d.clone();
        sum.add(&d);
        assert_eq!(sum.c2s.rx_packets, 8);
        assert_eq!(sum.rule.flight_sizes, BTreeMap::from([(4, 2), (6, 2)]));
    }
}
