//! The scenarios the lab measures, as one table ([`SCENARIOS`]). An entry holds everything
//! about its scenario: the paths and transfers the bench runs (its cases), the rows measured
//! only there, the targets the report judges, which counters the table's notes show, and the
//! steps of the CI smoke. The bench, the report and the smoke read this table; none of them
//! matches on a scenario's name.
//!
//! Adding a scenario is adding an entry. One that needs a new kind of measurement (a transfer
//! beside a TCP bulk flow, CPU time per GB) adds a [`Measure`] variant and its runner in
//! `bench`, a [`Check`] variant and its judgement in `report::targets`, and a [`SmokeStep`]
//! variant and its function in `smoke::steps`; the compiler then lists every place to extend.

use std::fmt;

use crate::emu::{self, EmuConfig, LinkConfig, Position, RuleProto};
use crate::rows::{RFC_IW, SMALL_BUFFERS};

/// A content file every server serves (pseudo-random, so compression cannot help).
#[derive(Debug, PartialEq)]
pub struct FileSpec {
    pub name: &'static str,
    pub bytes: u64,
    pub label: &'static str,
}

pub const MB1: FileSpec = FileSpec {
    name: "1m.bin",
    bytes: 1 << 20,
    label: "1 MB",
};
pub const MB4: FileSpec = FileSpec {
    name: "4m.bin",
    bytes: 4 << 20,
    label: "4 MB",
};
/// The download of docs/field-reports.md, "002 64 KB / 208 KB brakes".
pub const MB5_7: FileSpec = FileSpec {
    name: "5.7m.bin",
    bytes: 5_700_000,
    label: "5.7 MB",
};
pub const MB50: FileSpec = FileSpec {
    name: "50m.bin",
    bytes: 50 << 20,
    label: "50 MB",
};
/// E1's bulk download: large enough that start-up and handshake are noise in CPU per GB.
pub const MB256: FileSpec = FileSpec {
    name: "256m.bin",
    bytes: 256 << 20,
    label: "256 MB",
};
/// The upload of the same report.
pub const MB20: FileSpec = FileSpec {
    name: "20m.bin",
    bytes: 20 << 20,
    label: "20 MB",
};

/// The emulated path of one bench case or smoke step; both directions alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PathSpec {
    pub rtt_ms: f64,
    /// Random loss probability per packet, each direction.
    pub loss: f64,
    pub mtu: u32,
    /// ICMP errors for oversized packets; `false` makes an MTU black hole.
    pub icmp: bool,
    /// Which datagram (h3) or TLS segment (h2) of the server's first flight of every
    /// connection is dropped.
    pub first_flight_drop: Option<Position>,
}

impl PathSpec {
    pub const CLEAN: PathSpec = PathSpec {
        rtt_ms: 0.0,
        loss: 0.0,
        mtu: 1500,
        icmp: true,
        first_flight_drop: None,
    };

    /// A clean path with this round-trip time.
    pub const fn rtt(rtt_ms: f64) -> PathSpec {
        PathSpec {
            rtt_ms,
            ..Self::CLEAN
        }
    }
    pub const fn loss(self, loss: f64) -> PathSpec {
        PathSpec { loss, ..self }
    }
    /// Path MTU `mtu`, ICMP errors dropped.
    pub const fn black_hole(self, mtu: u32) -> PathSpec {
        PathSpec {
            mtu,
            icmp: false,
            ..self
        }
    }
    pub const fn with_icmp(self) -> PathSpec {
        PathSpec { icmp: true, ..self }
    }
    pub const fn drop(self, position: Position) -> PathSpec {
        PathSpec {
            first_flight_drop: Some(position),
            ..self
        }
    }

    /// The router's settings for this path: the drop rule applies to `proto` (UDP for h3
    /// clients, TCP for h2), `rate_mbit` adds a bottleneck with a drop-tail queue of about
    /// 100 ms at that rate (at least 64 KB). Pure.
    pub fn emu(&self, proto: RuleProto, rate_mbit: Option<f64>, seed: u64) -> EmuConfig {
        let link = LinkConfig {
            delay_us: emu::ms_to_us(self.rtt_ms / 2.0),
            loss: self.loss,
            rate_kbit: rate_mbit.map(|r| (r * 1000.0).round() as u64),
            queue_bytes: rate_mbit
                .map(|r| ((r * 1e6 / 8.0 * 0.1) as u64).max(65_536))
                .unwrap_or(1_000_000),
            mtu: self.mtu,
            icmp: self.icmp,
        };
        EmuConfig {
            c2s: link.clone(),
            s2c: link,
            seed,
            rule: self.first_flight_drop.map(|position| emu::FlightRule {
                positions: vec![position],
                proto,
                gap_us: emu::default_flight_gap_us(emu::ms_to_us(self.rtt_ms)),
            }),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Transfer {
    Download(&'static FileSpec),
    /// A PUT of the file (WebDAV at the ingress).
    Upload(&'static FileSpec),
}

impl Transfer {
    pub fn file(self) -> &'static FileSpec {
        match self {
            Transfer::Download(f) | Transfer::Upload(f) => f,
        }
    }
    pub fn is_upload(self) -> bool {
        matches!(self, Transfer::Upload(_))
    }
}

/// Where a case's bottleneck comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseRate {
    /// The scenario's rate flag (no bottleneck unless it sets one).
    Flag,
    /// The rate flag's bottleneck; the case is left out when the flag sets none.
    OnlyLimited,
    /// Never a bottleneck, whatever the flags say ("no rate limit" in the label).
    Unlimited,
}

/// Which command-line flag sets a scenario's bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateFlag {
    /// `--rate-mbit` (default: none).
    Rate,
    /// `--s4-rate-mbit` (default 100), else `--rate-mbit`.
    S4Rate,
}

/// One path and transfer of a scenario, measured for every row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CaseSpec {
    pub path: PathSpec,
    pub transfer: Transfer,
    /// Also run with `--quick`.
    pub quick: bool,
    pub rate: CaseRate,
    /// S6: the bottleneck and the flow the row competes with.
    pub competition: Option<Competition>,
    /// Transfers per cell instead of the scenario's (E1: many short ones, few bulk ones).
    pub runs: Option<usize>,
}

impl CaseSpec {
    pub const fn download(path: PathSpec, file: &'static FileSpec) -> CaseSpec {
        CaseSpec {
            path,
            transfer: Transfer::Download(file),
            quick: true,
            rate: CaseRate::Flag,
            competition: None,
            runs: None,
        }
    }
    /// S6: the row's bulk download beside a competing one through a `rate_mbit` bottleneck.
    pub const fn share(
        rtt_ms: f64,
        rate_mbit: f64,
        queue: QueueSize,
        against: Competitor,
    ) -> CaseSpec {
        CaseSpec {
            competition: Some(Competition {
                rate_mbit,
                queue,
                against,
            }),
            ..Self::download(PathSpec::rtt(rtt_ms), &BULK)
        }
    }
    pub const fn upload(path: PathSpec, file: &'static FileSpec) -> CaseSpec {
        CaseSpec {
            transfer: Transfer::Upload(file),
            ..Self::download(path, file)
        }
    }
    /// Left out of `--quick`.
    pub const fn full_only(self) -> CaseSpec {
        CaseSpec {
            quick: false,
            ..self
        }
    }
    pub const fn rate(self, rate: CaseRate) -> CaseSpec {
        CaseSpec { rate, ..self }
    }
    pub const fn runs(self, runs: usize) -> CaseSpec {
        CaseSpec {
            runs: Some(runs),
            ..self
        }
    }
}

/// The drop-tail queue in front of an S6 bottleneck.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueSize {
    /// One bandwidth-delay product at the case's rate and RTT.
    Bdp,
    /// This many full-size (1500-byte) packets: a shallow buffer.
    Packets(u32),
}

impl QueueSize {
    /// The queue in bytes at `rate_mbit` and `rtt_ms`. Pure.
    pub fn bytes(self, rate_mbit: f64, rtt_ms: f64) -> u64 {
        match self {
            QueueSize::Bdp => (rate_mbit * 1e6 / 8.0 * rtt_ms / 1000.0) as u64,
            QueueSize::Packets(n) => u64::from(n) * 1500,
        }
    }
}

/// The kernel TCP congestion control of S6's competing HTTP/2 download.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpCc {
    Cubic,
    Bbr,
}

impl TcpCc {
    /// The kernel's name (`net.ipv4.tcp_congestion_control`, `ip route ... congctl`).
    pub fn name(self) -> &'static str {
        match self {
            TcpCc::Cubic => "cubic",
            TcpCc::Bbr => "bbr",
        }
    }
}

/// S6: the flow a case's row competes with, from the second client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Competitor {
    /// An HTTP/2 download from the same nginx whose server-side TCP runs this controller.
    Tcp(TcpCc),
    /// A second download from the row's own server with the row's own client and protocol:
    /// for our rows the same proxy and controller, so the cell asks whether the controller
    /// shares fairly with itself (two identical flows should split 50/50). The same row's
    /// controller rather than the default's, so the answer does not change meaning when the
    /// default does, and for the default row it is the same cell either way.
    Itself,
}

impl Competitor {
    pub const ALL: [Competitor; 3] = [
        Competitor::Tcp(TcpCc::Cubic),
        Competitor::Tcp(TcpCc::Bbr),
        Competitor::Itself,
    ];

    /// The name in case ids and in the results' `competitor` field: "cubic", "bbr", "self".
    pub fn name(self) -> &'static str {
        match self {
            Competitor::Tcp(cc) => cc.name(),
            Competitor::Itself => "self",
        }
    }

    /// The competitor a results file names. Pure.
    pub fn from_name(name: &str) -> Option<Competitor> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }

    /// "TCP CUBIC", "itself (a second flow of the row)".
    pub fn describe(self) -> String {
        match self {
            Competitor::Tcp(cc) => format!("TCP {}", cc.name().to_uppercase()),
            Competitor::Itself => "itself (a second flow of the row)".into(),
        }
    }
}

/// S6: what a case's row competes against, and through what.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Competition {
    pub rate_mbit: f64,
    pub queue: QueueSize,
    pub against: Competitor,
}

impl Competition {
    /// ", 20 Mbit/s, queue 1 BDP (125 KB), vs TCP CUBIC" at `rtt_ms`; the id suffix ends in
    /// [`Competitor::name`].
    pub fn label(&self, rtt_ms: f64) -> String {
        let bytes = self.queue.bytes(self.rate_mbit, rtt_ms);
        let queue = match self.queue {
            QueueSize::Bdp => format!("1 BDP ({:.0} KB)", bytes as f64 / 1000.0),
            QueueSize::Packets(n) => format!("{n} packets ({:.0} KB)", bytes as f64 / 1000.0),
        };
        format!(
            ", {} Mbit/s, queue {queue}, vs {}",
            self.rate_mbit,
            self.against.describe()
        )
    }

    /// "-20mbit-bdp-cubic": what tells the case apart in its id.
    pub fn id_suffix(&self) -> String {
        let queue = match self.queue {
            QueueSize::Bdp => "bdp".to_string(),
            QueueSize::Packets(n) => format!("q{n}"),
        };
        format!("-{}mbit-{queue}-{}", self.rate_mbit, self.against.name())
    }
}

/// How the bench measures a scenario's cells.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Measure {
    /// One transfer at a time, a fresh client process and connection each; the rows take turns
    /// within a case; per transfer the client's times, per cell the router's counters, both
    /// namespaces' UDP counters and our proxy's /metrics deltas.
    Transfers,
    /// Two bulk downloads at once through one bottleneck: the row's (from client address
    /// `CLIENT_V4`) and a competing one (from `CLIENT2_V4`, see [`Competitor`]: HTTP/2 from
    /// the same nginx, its server-side TCP congestion control set per route, or a second
    /// download of the row itself). After `warm_up_s` the
    /// router counts what each client address received for `window_s`; per run the row's share
    /// of the two. Each run is one cell sample; the rows take turns as in `Transfers`.
    Share { warm_up_s: f64, window_s: f64 },
    /// Downloads over the server namespace's loopback (the client runs beside the servers, the
    /// router is not on the path): per transfer the client's times and the process CPU time
    /// (utime + stime from /proc, the process and its children) of the row's server and of the
    /// TCP ingress behind it. The rows take turns as in `Transfers`.
    Loopback,
}

/// Which cases of its scenario a target is judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    Always,
    Downloads,
    /// Cases whose path MTU is below 1500.
    ReducedMtu,
    /// The upload with a bottleneck when the plan has one, else every upload: throughput
    /// parity is a question of the protocol, not of the client's CPU.
    ThroughputUpload,
    /// Uploads without a bottleneck: the server's socket buffer is what they test.
    UnlimitedUpload,
    /// S6 cases whose competing flow runs TCP CUBIC / TCP BBR / is the row itself.
    AgainstCubic,
    AgainstBbr,
    AgainstItself,
    /// Cases that transfer this file.
    File(&'static str),
}

/// Margin over the clean path's median that [`Check::MedianVsClean`] allows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Slack {
    /// One probe timeout right after the first RTT sample in the handshake space (RFC 9002
    /// 6.2.1: smoothed_rtt + 4 * rtt/2, no ack delay): 3 x RTT.
    OnePto,
    Factor(f64),
}

/// A target of the issue, judged per case for one of our rows (the "judged row").
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// Median <= factor x h2's median in the same case (and no failures, if `no_failures`).
    MedianVsH2 {
        factor: f64,
        no_failures: bool,
    },
    /// Median <= the row's own median on the clean path (the case of scenario `clean_in` with
    /// the same RTT and file, no loss, no drop rule, MTU 1500) plus `slack`; no failures.
    MedianVsClean {
        clean_in: &'static str,
        slack: Slack,
    },
    /// p90 <= factor x the row's own median.
    P90VsOwnMedian {
        factor: f64,
    },
    NoFailedHandshakes,
    /// Median goodput >= factor x h2's; no failures.
    ThroughputVsH2 {
        factor: f64,
    },
    /// The server namespace's UDP `RcvbufErrors` did not grow during the row's transfers.
    NoServerRcvbufErrors,
    /// The forced-small-buffer row does overflow (the check that the case can show it).
    SmallBuffersOverflow,
    /// The mean path MTU our proxy reports in its metrics fits what the path carries.
    PathMtuInMetrics,
    /// No IPv4 fragments and DF on every server IPv4 datagram.
    NoFragmentsAllDf,
    /// The row's median share of the bottleneck beside the competing flow within [min, max].
    ShareWithin {
        min: f64,
        max: f64,
    },
    /// The row's median share >= what TCP CUBIC (the h2 row) gets against the same flow.
    ShareAtLeastTcpCubic,
    /// The median process CPU time of the row's own server per GB transferred, at most this.
    CpuPerGbAtMost {
        s_per_gb: f64,
    },
}

impl Check {
    /// What the target says, for the judged row `row`.
    pub fn describe(&self, row: &str) -> String {
        match *self {
            Check::MedianVsH2 { factor, .. } => format!("{row} median <= {factor:.1} x h2"),
            Check::MedianVsClean {
                slack: Slack::OnePto,
                ..
            } => format!("{row} median <= own no-loss median + one PTO (3 x RTT)"),
            Check::MedianVsClean {
                slack: Slack::Factor(f),
                ..
            } => format!("{row} completes within {f:.1} x the clean path"),
            Check::P90VsOwnMedian { factor } => format!("{row} p90 <= {factor:.1} x own median"),
            Check::NoFailedHandshakes => format!("{row} zero failed handshakes"),
            Check::ThroughputVsH2 { factor } => format!("{row} throughput >= {factor:.1} x h2"),
            Check::NoServerRcvbufErrors => format!("{row} server UDP RcvbufErrors delta = 0"),
            Check::SmallBuffersOverflow => {
                format!("{SMALL_BUFFERS} (forced 208 KB) RcvbufErrors delta > 0")
            }
            Check::PathMtuInMetrics => {
                format!("{row} discovered path MTU in its metrics, within what the path carries")
            }
            Check::NoFragmentsAllDf => {
                format!("{row} zero IPv4 fragments, DF on every server IPv4 datagram")
            }
            Check::ShareWithin { min, max } => {
                format!("{row} median share {min:.1}-{max:.1} beside the competing flow")
            }
            Check::ShareAtLeastTcpCubic => {
                format!("{row} median share >= TCP CUBIC's against the same flow")
            }
            Check::CpuPerGbAtMost { s_per_gb } => {
                format!("{row} process CPU <= {s_per_gb:.2} s per GB")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub when: When,
    pub check: Check,
}

const fn always(check: Check) -> Target {
    Target {
        when: When::Always,
        check,
    }
}

/// Counters the table's notes show for a scenario's cells, beyond what every case with a drop
/// rule (rule drops, flight sizes) or random loss (drops, slow handshakes) shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notes {
    /// Server IPv4 fragments and datagrams without DF, MTU drops (also shown when MTU < 1500).
    pub mtu_counters: bool,
    /// Median goodput.
    pub throughput: bool,
    /// UDP `RcvbufErrors` of both namespaces (also shown whenever they grew).
    pub socket_buffers: bool,
}

/// One step of the CI smoke: a transfer per client and server with counter checks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SmokeStep {
    /// S6 in short: our proxy's download (aioquic) beside an HTTP/2 one through a bottleneck;
    /// both flows get through, the router's per-client counters add up to the link's.
    Share {
        path: PathSpec,
        rate_mbit: f64,
        window_s: f64,
    },
    /// 1 MB over h2 (IPv4 and IPv6) and from each h3 server: nothing dropped, the right
    /// address family, DF on every server datagram.
    CleanDownload(PathSpec),
    /// The drop rule (UDP for h3, TCP for h2) drops exactly one datagram or TLS segment.
    FirstFlightDrop(PathSpec),
    /// Every client completes 1 MB and the router really drops packets at random.
    RandomLoss { path: PathSpec, seed: u64 },
    /// 5.7 MB down and 4 MB up (stored intact) per server; the server's UDP RcvbufErrors are
    /// reported, not asserted.
    LargeTransfers(PathSpec),
    /// Through an MTU black hole h3 needs no fragments and keeps DF; h2 stalls there (TCP
    /// needs ICMP), and gets through once the router sends it.
    MtuBlackHole(PathSpec),
    /// E1 in short: one download of `file` over the server namespace's loopback from our proxy
    /// and over h2 from nginx; complete bodies, and the servers' CPU time grew.
    LoopbackCpu { file: &'static FileSpec },
}

impl fmt::Display for SmokeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmokeStep::CleanDownload(p) => write!(f, "clean download, {p}"),
            SmokeStep::FirstFlightDrop(p) => write!(f, "one first-flight drop per connection, {p}"),
            SmokeStep::RandomLoss { path, seed } => write!(f, "random loss, {path}, seed {seed}"),
            SmokeStep::LargeTransfers(p) => write!(f, "large download and upload, {p}"),
            SmokeStep::MtuBlackHole(p) => write!(f, "MTU black hole, {p}, then with ICMP"),
            SmokeStep::LoopbackCpu { file } => {
                write!(f, "{} over loopback with the servers' CPU time", file.label)
            }
            SmokeStep::Share {
                path,
                rate_mbit,
                window_s,
            } => write!(
                f,
                "h3 beside h2 through {rate_mbit} Mbit/s, {path}, {window_s} s window"
            ),
        }
    }
}

/// One scenario: what it asks, how it is measured and judged.
#[derive(Debug)]
pub struct Scenario {
    pub id: &'static str,
    pub title: &'static str,
    /// The question, and where it comes from.
    pub question: &'static str,
    pub measure: Measure,
    /// Transfers per cell in a full run (`--quick`: a quarter, at least 3).
    pub runs: usize,
    pub rate_flag: RateFlag,
    /// Upper bound on the time limit per transfer (a hung transfer in a black hole would
    /// otherwise cost the full `--max-time` per run).
    pub max_time_cap_s: Option<f64>,
    pub cases: &'static [CaseSpec],
    /// Rows measured only in this scenario (each answers one question of it).
    pub only_rows: &'static [&'static str],
    pub targets: &'static [Target],
    pub notes: Notes,
    pub smoke: &'static [SmokeStep],
}

const S1: Scenario = Scenario {
    id: "S1",
    title: "no loss",
    question: "Is HTTP/3 through the proxy faster than HTTP/2 to the ingress on a long clean path?",
    measure: Measure::Transfers,
    runs: 10,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: None,
    cases: &[
        CaseSpec::download(PathSpec::rtt(200.0), &MB1),
        CaseSpec::download(PathSpec::rtt(200.0), &MB4).full_only(),
        CaseSpec::download(PathSpec::rtt(100.0), &MB1),
    ],
    // What our larger initial window buys on a long fat path, next to RFC 9002's 10 packets.
    only_rows: &[RFC_IW],
    targets: &[always(Check::MedianVsH2 {
        factor: 0.8,
        no_failures: true,
    })],
    notes: Notes {
        mtu_counters: false,
        throughput: false,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::CleanDownload(PathSpec::rtt(200.0))],
};

const S2: Scenario = Scenario {
    id: "S2",
    title: "first-flight drop",
    question: "Does one lost datagram of the server's first flight cost more than one probe \
        timeout? (docs/field-reports.md, \"004 cwnd pinned after one lost handshake packet\")",
    measure: Measure::Transfers,
    runs: 10,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: None,
    cases: &[
        CaseSpec::download(PathSpec::rtt(200.0).drop(Position::Last), &MB1),
        CaseSpec::download(PathSpec::rtt(100.0).drop(Position::Last), &MB1),
        // The rule above takes the flight's last datagram, which for a server that sends its
        // HTTP/3 SETTINGS right after the handshake is that 1-RTT datagram; this case takes
        // the last one with handshake data, the loss the field report traced.
        CaseSpec::download(PathSpec::rtt(200.0).drop(Position::LastHandshake), &MB1),
    ],
    only_rows: &[],
    targets: &[
        always(Check::MedianVsClean {
            clean_in: "S1",
            slack: Slack::OnePto,
        }),
        always(Check::MedianVsH2 {
            factor: 0.8,
            no_failures: false,
        }),
    ],
    notes: Notes {
        mtu_counters: false,
        throughput: false,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::FirstFlightDrop(
        PathSpec::rtt(100.0).drop(Position::Last),
    )],
};

const S3: Scenario = Scenario {
    id: "S3",
    title: "random loss",
    question: "Under random loss both ways, is HTTP/3 still faster than HTTP/2, with a short \
        tail and every handshake completed?",
    measure: Measure::Transfers,
    runs: 40,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: None,
    cases: &[
        CaseSpec::download(PathSpec::rtt(200.0).loss(0.01), &MB1),
        CaseSpec::download(PathSpec::rtt(200.0).loss(0.02), &MB1),
    ],
    only_rows: &[],
    targets: &[
        always(Check::MedianVsH2 {
            factor: 0.9,
            no_failures: false,
        }),
        always(Check::P90VsOwnMedian { factor: 1.3 }),
        always(Check::NoFailedHandshakes),
    ],
    notes: Notes {
        mtu_counters: false,
        throughput: false,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::RandomLoss {
        path: PathSpec::rtt(100.0).loss(0.01),
        seed: 3,
    }],
};

const S4: Scenario = Scenario {
    id: "S4",
    title: "large transfers",
    question: "Do large downloads and uploads keep up with HTTP/2, without socket-buffer drops? \
        (docs/field-reports.md, \"002 64 KB / 208 KB brakes\")",
    measure: Measure::Transfers,
    runs: 10,
    rate_flag: RateFlag::S4Rate,
    max_time_cap_s: None,
    cases: &[
        CaseSpec::download(PathSpec::rtt(11.0), &MB5_7).full_only(),
        CaseSpec::download(PathSpec::rtt(11.0), &MB50).full_only(),
        CaseSpec::download(PathSpec::rtt(42.0), &MB5_7),
        CaseSpec::download(PathSpec::rtt(42.0), &MB50).full_only(),
        CaseSpec::upload(PathSpec::rtt(42.0), &MB20).rate(CaseRate::OnlyLimited),
        // At the client's full speed: the server's socket buffer is what is tested.
        CaseSpec::upload(PathSpec::rtt(42.0), &MB20).rate(CaseRate::Unlimited),
    ],
    only_rows: &[SMALL_BUFFERS],
    targets: &[
        Target {
            when: When::Downloads,
            check: Check::MedianVsH2 {
                factor: 1.0,
                no_failures: true,
            },
        },
        Target {
            when: When::ThroughputUpload,
            check: Check::ThroughputVsH2 { factor: 0.8 },
        },
        Target {
            when: When::UnlimitedUpload,
            check: Check::NoServerRcvbufErrors,
        },
        Target {
            when: When::UnlimitedUpload,
            check: Check::SmallBuffersOverflow,
        },
    ],
    notes: Notes {
        mtu_counters: false,
        throughput: true,
        socket_buffers: true,
    },
    smoke: &[SmokeStep::LargeTransfers(PathSpec::rtt(42.0))],
};

const S5: Scenario = Scenario {
    id: "S5",
    title: "MTU black hole",
    question: "With ICMP filtered, does HTTP/3 find the path MTU by itself, without fragments? \
        (docs/field-reports.md, \"000 dual-stack socket without DF\" and \"003 ICMP-blind MTU \
        black hole\")",
    measure: Measure::Transfers,
    runs: 10,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: Some(10.0),
    cases: &[
        CaseSpec::download(PathSpec::rtt(42.0), &MB4),
        CaseSpec::download(PathSpec::rtt(42.0).black_hole(1400), &MB4).full_only(),
        CaseSpec::download(PathSpec::rtt(42.0).black_hole(1280), &MB4),
    ],
    only_rows: &[],
    targets: &[
        Target {
            when: When::ReducedMtu,
            check: Check::MedianVsClean {
                clean_in: "S5",
                slack: Slack::Factor(1.1),
            },
        },
        Target {
            when: When::ReducedMtu,
            check: Check::PathMtuInMetrics,
        },
        Target {
            when: When::ReducedMtu,
            check: Check::NoFragmentsAllDf,
        },
    ],
    notes: Notes {
        mtu_counters: true,
        throughput: false,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::MtuBlackHole(
        PathSpec::rtt(42.0).black_hole(1280),
    )],
};

const fn share(rtt: f64, rate: f64, queue: QueueSize, against: Competitor) -> CaseSpec {
    CaseSpec::share(rtt, rate, queue, against)
}
const SHALLOW: QueueSize = QueueSize::Packets(12);
const CUBIC: Competitor = Competitor::Tcp(TcpCc::Cubic);
const BBR: Competitor = Competitor::Tcp(TcpCc::Bbr);
const ITSELF: Competitor = Competitor::Itself;

const S6: Scenario = Scenario {
    id: "S6",
    title: "fair share beside TCP",
    question: "Beside one HTTP/2 download (kernel TCP) from the same nginx through one \
        bottleneck, does HTTP/3 through the proxy take a TCP-like share, with deep and shallow \
        queues, against TCP CUBIC and TCP BBR? And beside a second flow of itself, a fair half?",
    measure: Measure::Share {
        warm_up_s: 5.0,
        window_s: 60.0,
    },
    runs: 3,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: None,
    // Quick: 20 Mbit/s at 50 ms, both queues, every competitor.
    cases: &[
        share(50.0, 20.0, QueueSize::Bdp, CUBIC),
        share(50.0, 20.0, SHALLOW, CUBIC),
        share(50.0, 20.0, QueueSize::Bdp, BBR),
        share(50.0, 20.0, SHALLOW, BBR),
        share(50.0, 20.0, QueueSize::Bdp, ITSELF),
        share(50.0, 20.0, SHALLOW, ITSELF),
        share(200.0, 20.0, QueueSize::Bdp, CUBIC).full_only(),
        share(200.0, 20.0, SHALLOW, CUBIC).full_only(),
        share(200.0, 20.0, QueueSize::Bdp, BBR).full_only(),
        share(200.0, 20.0, SHALLOW, BBR).full_only(),
        share(200.0, 20.0, QueueSize::Bdp, ITSELF).full_only(),
        share(200.0, 20.0, SHALLOW, ITSELF).full_only(),
        share(50.0, 100.0, QueueSize::Bdp, CUBIC).full_only(),
        share(50.0, 100.0, SHALLOW, CUBIC).full_only(),
        share(50.0, 100.0, QueueSize::Bdp, BBR).full_only(),
        share(50.0, 100.0, SHALLOW, BBR).full_only(),
        share(50.0, 100.0, QueueSize::Bdp, ITSELF).full_only(),
        share(50.0, 100.0, SHALLOW, ITSELF).full_only(),
        share(200.0, 100.0, QueueSize::Bdp, CUBIC).full_only(),
        share(200.0, 100.0, SHALLOW, CUBIC).full_only(),
        share(200.0, 100.0, QueueSize::Bdp, BBR).full_only(),
        share(200.0, 100.0, SHALLOW, BBR).full_only(),
        share(200.0, 100.0, QueueSize::Bdp, ITSELF).full_only(),
        share(200.0, 100.0, SHALLOW, ITSELF).full_only(),
    ],
    // The h2 row is the TCP reference: HTTP/2 with TCP CUBIC (a per-route congctl on the
    // server) against the same competing flow as every other row.
    only_rows: &[],
    targets: &[
        Target {
            when: When::AgainstCubic,
            check: Check::ShareWithin { min: 0.4, max: 0.6 },
        },
        Target {
            when: When::AgainstBbr,
            check: Check::ShareAtLeastTcpCubic,
        },
        Target {
            when: When::AgainstItself,
            check: Check::ShareWithin { min: 0.4, max: 0.6 },
        },
    ],
    notes: Notes {
        mtu_counters: false,
        throughput: false,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::Share {
        path: PathSpec::rtt(50.0),
        rate_mbit: 20.0,
        window_s: 8.0,
    }],
};

/// The target for E1: half of the proxy's CPU per GB before the efficiency work, which
/// E1 measured as 2.83 s/GB (median of 3, range 2.68-3.02) at commit e44e149
/// (docs/transport-efficiency.md, section 2).
pub const E1_CPU_TARGET_S_PER_GB: f64 = 1.42;

const E1: Scenario = Scenario {
    id: "E1",
    title: "CPU per byte on loopback",
    question: "How much CPU does the proxy itself spend per GB of a bulk download, next to \
        Caddy and to nginx serving HTTP/2, and is 1 MiB through the proxy on a path without \
        delay within 3x of HTTP/2 straight to nginx?",
    measure: Measure::Loopback,
    runs: 3,
    rate_flag: RateFlag::Rate,
    max_time_cap_s: None,
    cases: &[
        CaseSpec::download(PathSpec::CLEAN, &MB256),
        CaseSpec::download(PathSpec::CLEAN, &MB1).runs(15),
    ],
    only_rows: &[],
    targets: &[
        Target {
            when: When::File(MB256.name),
            check: Check::CpuPerGbAtMost {
                s_per_gb: E1_CPU_TARGET_S_PER_GB,
            },
        },
        Target {
            when: When::File(MB1.name),
            check: Check::MedianVsH2 {
                factor: 3.0,
                no_failures: true,
            },
        },
    ],
    notes: Notes {
        mtu_counters: false,
        throughput: true,
        socket_buffers: false,
    },
    smoke: &[SmokeStep::LoopbackCpu { file: &MB4 }],
};

/// Every scenario, in the order the bench runs them and the smoke steps through them.
pub static SCENARIOS: &[Scenario] = &[S1, S2, S3, S4, S5, S6, E1];

/// S6's bulk download: more than any flow receives in a window at 100 Mbit/s, so both flows
/// run for the whole window (the client's time limit ends them).
pub const BULK: FileSpec = FileSpec {
    name: "bulk.bin",
    bytes: 1 << 30,
    label: "bulk",
};

/// Every content file the cases use, for the servers' document roots.
pub const FILES: &[&FileSpec] = &[&MB1, &MB4, &MB5_7, &MB50, &MB20, &BULK, &MB256];

/// The scenario with this id (case-insensitive).
pub fn find(id: &str) -> Option<&'static Scenario> {
    SCENARIOS
        .iter()
        .find(|s| s.id.eq_ignore_ascii_case(id.trim()))
}

/// The ids of every scenario, for messages and defaults: "S1,S2,...".
pub fn ids() -> String {
    SCENARIOS.iter().map(|s| s.id).collect::<Vec<_>>().join(",")
}

/// The scenario a row is measured in exclusively, if any.
pub fn only_in(row: &str) -> Option<&'static str> {
    SCENARIOS
        .iter()
        .find(|s| s.only_rows.contains(&row))
        .map(|s| s.id)
}

impl When {
    /// Whether a target with this condition is judged on `case`, among the plan's `cases`.
    pub fn applies(self, case: &crate::report::Case, cases: &[crate::report::Case]) -> bool {
        match self {
            When::Always => true,
            When::Downloads => !case.upload,
            When::ReducedMtu => case.mtu < 1500,
            When::ThroughputUpload => {
                case.upload
                    && (case.rate_mbit.is_some()
                        || !cases.iter().any(|c| c.upload && c.rate_mbit.is_some()))
            }
            When::UnlimitedUpload => case.upload && case.rate_mbit.is_none(),
            When::AgainstCubic => case.competitor() == Some(Competitor::Tcp(TcpCc::Cubic)),
            When::AgainstBbr => case.competitor() == Some(Competitor::Tcp(TcpCc::Bbr)),
            When::AgainstItself => case.competitor() == Some(Competitor::Itself),
            When::File(name) => case.file == name,
        }
    }
}

impl PathSpec {
    /// What the path does besides delaying, as the case labels write it:
    /// ", 1 % loss, first-flight drop, MTU 1280 no ICMP"; empty for a clean path.
    pub fn impairments(&self) -> String {
        let mut s = String::new();
        if self.loss > 0.0 {
            s.push_str(&format!(", {:.0} % loss", self.loss * 100.0));
        }
        match self.first_flight_drop {
            None => {}
            Some(Position::Last) => s.push_str(", first-flight drop"),
            Some(Position::LastHandshake) => s.push_str(", last handshake datagram dropped"),
            Some(Position::Nth(n)) => s.push_str(&format!(", first-flight datagram {n} dropped")),
        }
        if self.mtu < 1500 {
            let icmp = if self.icmp { "" } else { " no ICMP" };
            s.push_str(&format!(", MTU {}{icmp}", self.mtu));
        }
        s
    }
}

impl fmt::Display for PathSpec {
    /// "200 ms, 1 % loss, first-flight drop".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.0} ms{}", self.rtt_ms, self.impairments())
    }
}

/// The table as `h3-ingress-lab scenarios` prints it: per scenario its question, cases (with
/// `quick` marking the ones `--quick` keeps), targets and smoke steps.
pub fn describe_all() -> String {
    let mut out = String::new();
    for sc in SCENARIOS {
        out.push_str(&format!(
            "{} {}: {}\n  {} transfers per cell{}\n",
            sc.id,
            sc.title,
            sc.question,
            sc.runs,
            if sc.only_rows.is_empty() {
                String::new()
            } else {
                format!("; rows only here: {}", sc.only_rows.join(", "))
            }
        ));
        for c in sc.cases {
            let t = c.transfer;
            let what = if t.is_upload() { " upload" } else { "" };
            let rate = match c.rate {
                CaseRate::Flag => "",
                CaseRate::OnlyLimited => " (only with a rate limit)",
                CaseRate::Unlimited => " (no rate limit)",
            };
            let quick = if c.quick { " [quick]" } else { "" };
            let versus = c
                .competition
                .map(|k| k.label(c.path.rtt_ms))
                .unwrap_or_default();
            out.push_str(&format!(
                "  case: {:.0} ms, {}{what}{}{versus}{rate}{quick}\n",
                c.path.rtt_ms,
                t.file().label,
                c.path.impairments()
            ));
        }
        for t in sc.targets {
            out.push_str(&format!(
                "  target ({:?}): {}\n",
                t.when,
                t.check.describe("<row>")
            ));
        }
        for s in sc.smoke {
            out.push_str(&format!("  smoke: {s}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_found_case_insensitively() {
        let mut all: Vec<&str> = SCENARIOS.iter().map(|s| s.id).collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), SCENARIOS.len());
        assert_eq!(find(" s3").map(|s| s.id), Some("S3"));
        assert!(find("S9").is_none());
        assert_eq!(ids(), "S1,S2,S3,S4,S5,S6,E1");
    }

    #[test]
    fn every_reference_in_the_table_resolves() {
        for sc in SCENARIOS {
            assert!(!sc.cases.is_empty(), "{} has no cases", sc.id);
            assert!(!sc.smoke.is_empty(), "{} has no smoke step", sc.id);
            for c in sc.cases {
                assert!(FILES.contains(&c.transfer.file()), "{}: {:?}", sc.id, c);
            }
            for t in sc.targets {
                if let Check::MedianVsClean { clean_in, .. } = t.check {
                    let base = find(clean_in).expect("baseline scenario exists");
                    assert!(
                        base.cases
                            .iter()
                            .any(|c| c.path.loss == 0.0 && c.path.mtu == 1500),
                        "{clean_in} has a clean case"
                    );
                }
            }
            for r in sc.only_rows {
                assert_eq!(only_in(r), Some(sc.id));
            }
        }
        assert_eq!(only_in(SMALL_BUFFERS), Some("S4"));
        assert_eq!(only_in(crate::rows::OURS), None);
    }

    #[test]
    fn path_labels_and_router_settings() {
        let p = PathSpec::rtt(200.0).loss(0.01).drop(Position::Last);
        assert_eq!(p.to_string(), "200 ms, 1 % loss, first-flight drop");
        assert_eq!(
            PathSpec::rtt(42.0).black_hole(1280).to_string(),
            "42 ms, MTU 1280 no ICMP"
        );
        let cfg = p.emu(RuleProto::Udp, Some(100.0), 7);
        assert_eq!(cfg.c2s.delay_us, 100_000);
        assert_eq!(cfg.s2c.loss, 0.01);
        assert_eq!(cfg.s2c.rate_kbit, Some(100_000));
        assert_eq!(cfg.s2c.queue_bytes, 1_250_000, "100 ms at 100 Mbit/s");
        assert_eq!(cfg.seed, 7);
        let rule = cfg.rule.unwrap();
        assert_eq!(rule.proto, RuleProto::Udp);
        assert_eq!(rule.gap_us, 50_000, "a quarter of 200 ms, capped at 50 ms");
        assert!(PathSpec::CLEAN.emu(RuleProto::Tcp, None, 1).rule.is_none());
    }

    #[test]
    fn competitors_have_one_name_each_and_read_back() {
        let names: Vec<&str> = Competitor::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["cubic", "bbr", "self"]);
        for c in Competitor::ALL {
            assert_eq!(Competitor::from_name(c.name()), Some(c));
        }
        assert_eq!(Competitor::from_name("reno"), None);
        let k = Competition {
            rate_mbit: 20.0,
            queue: QueueSize::Bdp,
            against: Competitor::Itself,
        };
        assert_eq!(k.id_suffix(), "-20mbit-bdp-self");
        assert!(k
            .label(50.0)
            .ends_with("vs itself (a second flow of the row)"));
        // Every S6 competitor has a target.
        let s6 = find("S6").unwrap();
        for (c, when) in [
            (Competitor::Tcp(TcpCc::Cubic), When::AgainstCubic),
            (Competitor::Tcp(TcpCc::Bbr), When::AgainstBbr),
            (Competitor::Itself, When::AgainstItself),
        ] {
            assert!(s6
                .cases
                .iter()
                .any(|x| x.quick && x.competition.map(|k| k.against) == Some(c)));
            assert!(s6.targets.iter().any(|t| t.when == when), "{c:?}");
        }
    }

    #[test]
    fn the_listing_names_every_scenario_and_target() {
        let text = describe_all();
        for sc in SCENARIOS {
            assert!(text.contains(&format!("{} {}", sc.id, sc.title)), "{text}");
        }
        assert!(text.contains("<row> p90 <= 1.3 x own median"), "{text}");
        assert!(
            text.contains("case: 42 ms, 20 MB upload (no rate limit) [quick]"),
            "{text}"
        );
    }
}
