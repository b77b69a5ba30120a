//! Congestion control: `cubic-hs`, a CUBIC (RFC 9438 on RFC 9002 slow start and recovery) that
//! survives a lost packet of the server's first flight, and the factory that picks the
//! controller a listener asked for.
//!
//! docs/field-reports.md, "004 cwnd pinned after one lost handshake packet", is the reason
//! this exists. nginx derives the slow-start threshold from the bytes in flight; when the tail of the handshake flight is lost and only found by a probe timeout,
//! nothing is in flight, so the window collapses to two packets and slow start never returns.
//! Two changes answer it:
//!
//! 1. The threshold is always `window * beta`; bytes in flight are never consulted.
//! 2. A loss of a packet sent before the first acknowledgement arrived (the server's first
//!    flight, sent with no knowledge of the path at all) is forgiven once per connection: the
//!    window is neither reduced nor is slow start left. Later losses get the normal response.
//!    Persistent congestion and ECN marks are never forgiven, and forgiving only skips a
//!    reduction, so the window can never grow beyond what the loss-free connection would have.
//!
//! `cubic-hs-lt` (loss-tolerant) adds one more rule for lossy radio paths, where CUBIC reads
//! every random loss as congestion and at 1-2 % loss over 200 ms sits near the Mathis limit:
//! a loss is not treated as congestion when the path shows no queue (the smallest RTT sample of
//! the current round trip within max(min RTT / 8, 4 ms) of the path's minimum, the signal
//! HyStart++ uses to leave slow start) and the last two round trips did not lose more than 5 %
//! of their packets (counted only from 8 lost packets on, as BBRv2 leaves startup). Loss from a
//! filling queue comes with a rising RTT, and a shallow-buffered or policed bottleneck pushes
//! the loss rate past 5 %, so both still get the normal CUBIC response; the 5 % bound is what
//! this mode can cost a shallow bottleneck that shows no delay (BBRv2 uses 2 %, BBRv1
//! tolerated up to 20 %). Like the handshake rule it only skips reductions, so it never grows
//! the window beyond what the loss-free connection would have.
//!
//! A queue of a dozen packets adds too little delay to see (1.4 ms at 100 Mbit/s, under the
//! noise floor above) and overflows at a loss rate well under 5 %, so beside a TCP flow such a
//! bottleneck looked like random loss and `cubic-hs-lt` kept a window TCP would have halved.
//! So a loss is also congestion once the pipe is full: the delivery rate of the last
//! three whole round trips did not grow by 25 % over the best one before (BBR's full-pipe
//! test). Random loss on a path with room left does not stop the rate from growing (the
//! window keeps growing through tolerated losses); a bottleneck, shared or not, does.
//!
//! Both leave the initial slow start with HyStart++ (RFC 9406, in `hystart.rs`) when the
//! round trip time rises, instead of by overrunning the bottleneck queue. The rules combine:
//! a forgiven first-flight loss and a tolerated random loss change nothing, so HyStart++ goes
//! on as on the loss-free connection; but once HyStart++ has seen the RTT rise (conservative
//! slow start), a queue is building and `cubic-hs-lt` no longer reads a loss as random.
//!
//! quinn never reports lost MTU probes to the controller, so PLPMTUD probing costs no window.

mod hystart;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{
    BbrConfig, Controller, ControllerFactory, ControllerMetrics, CubicConfig, NewRenoConfig,
};
use quinn_proto::RttEstimator;

use crate::api::CongestionControl;
use hystart::{HyStart, Transition};

/// RFC 9438 section 4.6: multiplicative decrease factor.
const BETA: f64 = 0.7;
/// RFC 9438 section 5.1: the cubic scaling constant, in segments per second cubed.
const C: f64 = 0.4;
/// RFC 9438 section 4.3: the additive increase that makes CUBIC as aggressive as Reno with the
/// same beta, in segments per window acknowledged.
const ALPHA_RENO_FRIENDLY: f64 = 3.0 * (1.0 - BETA) / (1.0 + BETA);
/// RFC 9002 kMinimumWindow is two maximum datagrams.
const MIN_WINDOW_PACKETS: u64 = 2;
/// `cubic-hs-lt`: the highest recent loss rate still read as random loss.
const RANDOM_LOSS_MAX_RATE: f64 = 0.05;
/// `cubic-hs-lt`: fewer lost packets than this in the last two rounds are no loss rate at all,
/// so three random losses among the 60 packets of an early round do not look like 5 %. BBRv2
/// leaves startup on the same condition: a loss rate above its bound and at least 8 losses.
const RANDOM_LOSS_MIN_PACKETS: u64 = 8;
/// `cubic-hs-lt`: queueing delay below max(min RTT / 8, this) counts as no queue; below a few
/// milliseconds ACK-delay jitter and scheduling noise dominate.
const QUEUE_DELAY_FLOOR: Duration = Duration::from_millis(4);
/// `cubic-hs-lt`: a round's minimum RTT counts once it has this many samples (RFC 9406's
/// N_RTT_SAMPLE); before that the previous round's minimum stands in.
const QUEUE_DELAY_MIN_SAMPLES: u32 = 8;
/// `cubic-hs-lt`: a round whose delivery rate is at least this factor above the best so far
/// means the path still had room (BBR's full-pipe test, which uses the same 25 %).
const PIPE_GROWTH: f64 = 1.25;
/// `cubic-hs-lt`: this many rounds in a row without such growth mean the pipe is full: the
/// flow has reached a bottleneck, and a loss there is the bottleneck's queue overflowing.
const PIPE_FULL_ROUNDS: u32 = 3;

/// Counters shared by every controller the factory builds (global, for Prometheus).
#[derive(Debug, Default)]
pub struct CcStats {
    handshake_losses_forgiven: AtomicU64,
    random_losses_tolerated: AtomicU64,
    congestion_events: AtomicU64,
    slow_start_delay_exits: AtomicU64,
}

impl CcStats {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// First-flight losses that `cubic-hs` did not treat as congestion.
    pub fn handshake_losses_forgiven(&self) -> u64 {
        self.handshake_losses_forgiven.load(Ordering::Relaxed)
    }

    /// Losses that `cubic-hs-lt` read as random (no queue, low loss rate), not as congestion.
    pub fn random_losses_tolerated(&self) -> u64 {
        self.random_losses_tolerated.load(Ordering::Relaxed)
    }

    /// Window reductions by `cubic-hs` (new recovery periods and persistent-congestion collapses).
    pub fn congestion_events(&self) -> u64 {
        self.congestion_events.load(Ordering::Relaxed)
    }

    /// Initial slow starts that HyStart++ ended on a rising RTT, without a loss.
    pub fn slow_start_delay_exits(&self) -> u64 {
        self.slow_start_delay_exits.load(Ordering::Relaxed)
    }
}

/// Per-connection counters, read from a controller at connection close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CcCounters {
    pub handshake_losses_forgiven: u64,
    pub random_losses_tolerated: u64,
    pub congestion_events: u64,
    /// Times HyStart++ saw the RTT rise and began conservative slow start.
    pub css_entries: u64,
    /// 1 when HyStart++ ended the initial slow start (no loss did).
    pub slow_start_delay_exits: u64,
    /// Collapses to the minimum window after persistent congestion (RFC 9002 7.6): TCP's
    /// equivalent is a retransmission timeout.
    pub persistent_congestion: u64,
    /// Acknowledgements outside recovery that quinn flagged app-limited (the sender had nothing
    /// it could send: the client's flow control or the upstream held it back), so the window
    /// did not grow on them.
    pub app_limited_acks: u64,
}

/// The counters of a connection's controller if it is a `cubic-hs` or `cubic-hs-lt` one. quinn
/// hands out the controller as a boxed clone (`Connection::congestion_state`), so this consumes
/// the box.
pub fn connection_counters(controller: Box<dyn Controller>) -> Option<CcCounters> {
    controller
        .into_any()
        .downcast::<CubicHs>()
        .ok()
        .map(|c| c.counters())
}

/// The controller factory for a listener's `congestionControl` setting. All five controllers
/// start from the same initial window so that switching between them compares like with like.
pub fn factory(
    kind: CongestionControl,
    initial_window_bytes: u64,
    stats: Arc<CcStats>,
) -> Arc<dyn ControllerFactory + Send + Sync> {
    match kind {
        CongestionControl::CubicHs => Arc::new(CubicHsConfig::new(initial_window_bytes, stats)),
        CongestionControl::CubicHsLt => {
            Arc::new(CubicHsConfig::new(initial_window_bytes, stats).tolerating_random_loss())
        }
        CongestionControl::Cubic => {
            let mut config = CubicConfig::default();
            config.initial_window(initial_window_bytes);
            Arc::new(config)
        }
        CongestionControl::NewReno => {
            let mut config = NewRenoConfig::default();
            config.initial_window(initial_window_bytes);
            Arc::new(config)
        }
        CongestionControl::Bbr => {
            let mut config = BbrConfig::default();
            config.initial_window(initial_window_bytes);
            Arc::new(config)
        }
    }
}

/// Builds [`CubicHs`] controllers.
#[derive(Debug)]
pub struct CubicHsConfig {
    initial_window: u64,
    tolerate_random_loss: bool,
    hystart: bool,
    stats: Arc<CcStats>,
}

impl CubicHsConfig {
    pub fn new(initial_window: u64, stats: Arc<CcStats>) -> Self {
        Self {
            initial_window,
            tolerate_random_loss: false,
            hystart: true,
            stats,
        }
    }

    /// Plain slow start until the first loss, as before HyStart++: what the comparisons in
    /// the tests and the lab measure against. No listener setting selects it.
    pub fn without_hystart(mut self) -> Self {
        self.hystart = false;
        self
    }

    /// `cubic-hs-lt`: losses without queueing delay at a low loss rate are not congestion.
    pub fn tolerating_random_loss(mut self) -> Self {
        self.tolerate_random_loss = true;
        self
    }
}

impl ControllerFactory for CubicHsConfig {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(CubicHs::new(self, current_mtu))
    }
}

/// State of the current congestion-avoidance epoch (RFC 9438 section 4). Everything in bytes
/// except `k`, which is in seconds.
#[derive(Debug, Clone, Default)]
struct Epoch {
    /// When the current congestion-avoidance stage began; `None` until the first ACK after
    /// slow start or recovery, so that recovery time does not count as growth time.
    start: Option<Instant>,
    /// Time for the cubic curve to climb from the epoch's start window back to `w_max`.
    k: f64,
    /// The window the cubic curve plateaus at.
    w_max: f64,
    /// Reno-friendly estimate of the window (RFC 9438 section 4.3).
    w_est: f64,
    /// The window just before the most recent reduction; once `w_est` reaches it the Reno
    /// estimate grows at a full segment per window.
    cwnd_prior: f64,
    /// The next epoch follows a persistent-congestion collapse: K = 0 and W_max is the
    /// window at the epoch's start (RFC 9438 section 4.8).
    after_collapse: bool,
    /// Fractional window growth not yet applied (the window itself is whole bytes).
    carry: f64,
}

/// One round trip as `cubic-hs-lt` counts it.
#[derive(Debug, Clone, Copy, Default)]
struct Round {
    acked: u64,
    lost: u64,
    /// Smallest RTT sample: ACK time minus send time of an acknowledged packet (an ACK's
    /// largest packet gives quinn's RTT sample, the others only larger values).
    min_rtt: Option<Duration>,
    samples: u32,
    /// An acknowledged packet was sent while the sender had nothing more to send: its rate
    /// says nothing about the path.
    app_limited: bool,
}

/// What `cubic-hs-lt` knows about the last two round trips and the path.
#[derive(Debug, Clone, Copy, Default)]
struct Recent {
    /// When the current round began; it ends when a packet sent after that is acknowledged.
    round_start: Option<Instant>,
    current: Round,
    previous: Round,
    /// The smallest sample ever: the path's RTT without a queue. Should the path get longer
    /// (a route change), every loss looks queued and the normal response returns: the safe side.
    path_min_rtt: Option<Duration>,
    /// The best delivery rate of a whole round so far, bytes per second.
    full_rate: f64,
    /// Rounds in a row whose delivery rate did not beat `full_rate` by [`PIPE_GROWTH`].
    flat_rounds: u32,
}

fn min_of(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.min(b)))
}

impl Recent {
    fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        if self.round_start.is_none_or(|start| sent >= start) {
            if let Some(start) = self.round_start {
                self.end_round(now.saturating_duration_since(start));
            }
            self.round_start = Some(now);
            self.previous = std::mem::take(&mut self.current);
        }
        let sample = now.saturating_duration_since(sent);
        let round = &mut self.current;
        round.app_limited |= app_limited;
        round.acked += bytes;
        round.samples = round.samples.saturating_add(1);
        round.min_rtt = min_of(round.min_rtt, sample);
        self.path_min_rtt = min_of(self.path_min_rtt, sample);
    }

    /// The delivery rate of the round that just ended, for the full-pipe test; app-limited
    /// rounds say nothing either way.
    fn end_round(&mut self, took: Duration) {
        let round = &self.current;
        if round.app_limited || round.acked == 0 || took.is_zero() {
            return;
        }
        let rate = round.acked as f64 / took.as_secs_f64();
        if rate >= self.full_rate * PIPE_GROWTH {
            self.full_rate = rate;
            self.flat_rounds = 0;
        } else {
            self.flat_rounds = self.flat_rounds.saturating_add(1);
        }
    }

    /// The delivery rate stopped growing: the flow sits at a bottleneck (its own or a share
    /// of one), where a loss is what a full queue does, however little delay the queue adds.
    /// Random loss on a path with room left does not stop the rate from growing.
    fn pipe_full(&self) -> bool {
        self.flat_rounds >= PIPE_FULL_ROUNDS
    }

    fn on_loss(&mut self, bytes: u64) {
        self.current.lost += bytes;
    }

    fn lost(&self) -> u64 {
        self.current.lost + self.previous.lost
    }

    /// Lost over lost plus acknowledged.
    fn loss_rate(&self) -> f64 {
        let lost = self.lost();
        lost as f64 / (lost + self.current.acked + self.previous.acked).max(1) as f64
    }

    /// How far the smallest RTT of the current round (of the previous one until the current
    /// has [`QUEUE_DELAY_MIN_SAMPLES`] samples) sits above the path's minimum, as HyStart++
    /// (RFC 9406) measures it. A queue raises every sample of a round; one late ACK (a stalled
    /// receiver, a lost ACK) raises only its own, which the minimum ignores where a smoothed
    /// RTT would not.
    fn queue_delay(&self) -> Option<Duration> {
        let recent = if self.current.samples >= QUEUE_DELAY_MIN_SAMPLES {
            self.current.min_rtt
        } else {
            self.previous.min_rtt.or(self.current.min_rtt)
        }?;
        Some(recent.saturating_sub(self.path_min_rtt?))
    }
}

/// CUBIC with the fixes for field report 004 (docs/field-reports.md). See the module
/// documentation.
#[derive(Debug, Clone)]
pub struct CubicHs {
    config: Arc<CubicHsConfig>,
    mtu: u64,
    window: u64,
    ssthresh: u64,
    /// RFC 9002 `congestion_recovery_start_time`: losses of packets sent up to then belong to
    /// the reduction already made.
    recovery_start: Option<Instant>,
    /// No packet sent after `recovery_start` has been acknowledged yet, so the window is frozen.
    recovering: bool,
    /// When the first ACK of an ack-eliciting packet arrived, which is also when the first
    /// RTT sample is taken. Packets sent before it form the first flight.
    first_ack_at: Option<Instant>,
    forgiveness_used: bool,
    /// `cubic-hs-lt`'s view of the last two round trips; not kept by plain `cubic-hs`.
    recent: Recent,
    /// HyStart++ of the initial slow start; idle once the threshold is set.
    hystart: HyStart,
    /// Start of the current run of app-limited ACKs; that time is cut out of the epoch so an
    /// idle connection does not come back with a window jump (RFC 9438 section 5.8).
    app_limited_since: Option<Instant>,
    epoch: Epoch,
    counters: CcCounters,
}

impl CubicHs {
    pub fn new(config: Arc<CubicHsConfig>, current_mtu: u16) -> Self {
        let mtu = u64::from(current_mtu);
        Self {
            window: config.initial_window.max(MIN_WINDOW_PACKETS * mtu),
            ssthresh: u64::MAX,
            recovery_start: None,
            recovering: false,
            first_ack_at: None,
            forgiveness_used: false,
            recent: Recent::default(),
            hystart: HyStart::default(),
            app_limited_since: None,
            epoch: Epoch::default(),
            counters: CcCounters::default(),
            mtu,
            config,
        }
    }

    pub fn ssthresh(&self) -> u64 {
        self.ssthresh
    }

    pub fn in_slow_start(&self) -> bool {
        self.window < self.ssthresh
    }

    pub fn in_recovery(&self) -> bool {
        self.recovering
    }

    pub fn counters(&self) -> CcCounters {
        self.counters
    }

    pub fn losses_forgiven(&self) -> u64 {
        self.counters.handshake_losses_forgiven
    }

    pub fn congestion_events(&self) -> u64 {
        self.counters.congestion_events
    }

    pub fn random_losses_tolerated(&self) -> u64 {
        self.counters.random_losses_tolerated
    }

    fn minimum_window(&self) -> u64 {
        MIN_WINDOW_PACKETS * self.mtu
    }

    /// A packet sent no later than the start of the current recovery period belongs to it.
    fn sent_in_recovery(&self, sent: Instant) -> bool {
        self.recovery_start.is_some_and(|start| sent <= start)
    }

    fn sent_in_first_flight(&self, sent: Instant) -> bool {
        self.first_ack_at.is_none_or(|first| sent < first)
    }

    /// HyStart++ runs in the initial slow start only (RFC 9406 section 4.3): from the first
    /// reduction or its own exit on, the threshold is set and slow start is the standard one.
    fn hystart_active(&self) -> bool {
        self.config.hystart && self.ssthresh == u64::MAX
    }

    pub fn in_css(&self) -> bool {
        self.hystart_active() && self.hystart.in_css()
    }

    /// `cubic-hs-lt`: the path shows no queue, recent losses are rare and the delivery rate is
    /// still growing, so this loss is most likely random (radio, a flaky link), not a full
    /// buffer. In conservative slow
    /// start HyStart++ has just seen the RTT rise round over round: a queue, so never random.
    fn loss_looks_random(&self) -> bool {
        if self.in_css() {
            return false;
        }
        let (Some(queue_delay), Some(path_min)) =
            (self.recent.queue_delay(), self.recent.path_min_rtt)
        else {
            return false;
        };
        let high_loss_rate = self.recent.loss_rate() > RANDOM_LOSS_MAX_RATE
            && self.recent.lost() >= RANDOM_LOSS_MIN_PACKETS * self.mtu;
        queue_delay <= (path_min / 8).max(QUEUE_DELAY_FLOOR)
            && !high_loss_rate
            && !self.recent.pipe_full()
    }

    /// One acknowledged ack-eliciting packet. The same as [`Controller::on_ack`] with the
    /// smoothed RTT instead of quinn's estimator (which cannot be built outside quinn).
    pub fn ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: Duration,
    ) {
        self.first_ack_at.get_or_insert(now);
        if self.config.tolerate_random_loss {
            self.recent.on_ack(now, sent, bytes, app_limited);
        }
        if self.hystart_active() {
            self.hystart.on_ack(now, sent);
        }

        if self.sent_in_recovery(sent) {
            return;
        }
        // A packet sent after recovery began was delivered: recovery is over (RFC 9002 7.3.2).
        self.recovering = false;

        if app_limited {
            self.counters.app_limited_acks += 1;
            self.app_limited_since.get_or_insert(now);
            return;
        }
        if let Some(since) = self.app_limited_since.take() {
            if let Some(start) = self.epoch.start.as_mut() {
                *start += now.saturating_duration_since(since);
            }
        }

        if self.in_slow_start() {
            let growth = if self.hystart_active() {
                self.hystart.growth(bytes)
            } else {
                bytes
            };
            self.window = self.window.saturating_add(growth);
            return;
        }
        self.congestion_avoidance(now, bytes, rtt);
    }

    /// The end of one ACK frame: HyStart++ takes its RTT sample and may change the phase.
    fn end_of_ack_frame(&mut self, now: Instant, in_flight: u64) {
        if !self.hystart_active() {
            return;
        }
        let rounds_before = self.hystart.rounds().0;
        let transition = self.hystart.on_end_acks(now);
        if let (rounds, Some(min_rtt)) = self.hystart.rounds() {
            if rounds != rounds_before {
                // Off by default; bounded by the rounds of one initial slow start.
                tracing::trace!(
                    rounds,
                    window = self.window,
                    in_flight,
                    min_rtt_ms = min_rtt.as_secs_f64() * 1e3,
                    "slow-start round ended"
                );
            }
        }
        match transition {
            Transition::None => {}
            Transition::EnteredCss => {
                self.counters.css_entries += 1;
                tracing::debug!(
                    window = self.window,
                    in_flight,
                    "RTT rose: conservative slow start"
                );
            }
            Transition::ResumedSlowStart => {
                tracing::debug!(
                    window = self.window,
                    in_flight,
                    "RTT fell back: slow start resumed"
                );
            }
            Transition::GrowthPaused => {
                tracing::debug!(
                    window = self.window,
                    in_flight,
                    "RTT still rising: CSS paused"
                );
            }
            Transition::ExitToCongestionAvoidance => {
                // RFC 9406: congestion avoidance from the current window, no reduction.
                self.ssthresh = self.window;
                self.counters.slow_start_delay_exits += 1;
                self.config
                    .stats
                    .slow_start_delay_exits
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    window = self.window,
                    in_flight,
                    "slow start ended by HyStart++"
                );
            }
        }
    }

    fn start_epoch(&mut self, now: Instant) {
        let window = self.window as f64;
        let epoch = &mut self.epoch;
        epoch.start = Some(now);
        epoch.w_est = window;
        epoch.carry = 0.0;
        if epoch.after_collapse || epoch.w_max <= window {
            epoch.after_collapse = false;
            epoch.w_max = window;
            epoch.k = 0.0;
        } else {
            let segments_to_climb = (epoch.w_max - window) / self.mtu as f64;
            epoch.k = (segments_to_climb / C).cbrt();
        }
    }

    /// RFC 9438 eq. 1, in bytes.
    fn w_cubic(&self, t: f64) -> f64 {
        C * (t - self.epoch.k).powi(3) * self.mtu as f64 + self.epoch.w_max
    }

    fn congestion_avoidance(&mut self, now: Instant, bytes: u64, rtt: Duration) {
        if self.epoch.start.is_none() {
            self.start_epoch(now);
        }
        let start = self.epoch.start.unwrap_or(now);
        let t = now.saturating_duration_since(start).as_secs_f64();
        let window = self.window as f64;
        let mtu = self.mtu as f64;
        let acked = bytes as f64;

        let alpha = if self.epoch.w_est >= self.epoch.cwnd_prior {
            1.0
        } else {
            ALPHA_RENO_FRIENDLY
        };
        // alpha segments per window's worth of acknowledged bytes.
        self.epoch.w_est += alpha * mtu * acked / window;

        let increase = if self.w_cubic(t) < self.epoch.w_est {
            // Reno-friendly region: at least as fast as Reno would be.
            self.epoch.w_est - window
        } else {
            // Concave and convex regions: aim at where the curve will be one RTT from now,
            // bounded so a window never more than grows by half per RTT.
            let target = self
                .w_cubic(t + rtt.as_secs_f64())
                .clamp(window, 1.5 * window);
            (target - window) * acked / window
        };
        self.epoch.carry += increase.max(0.0);
        let whole = self.epoch.carry.floor();
        self.epoch.carry -= whole;
        self.window = self.window.saturating_add(whole as u64);
    }

    /// RFC 9438 sections 4.6 and 4.7, with the threshold taken from the window (RFC 9002),
    /// never from the bytes in flight.
    fn reduce(&mut self, now: Instant) {
        let window = self.window as f64;
        self.recovery_start = Some(now);
        self.recovering = true;
        self.epoch.cwnd_prior = window;
        // Fast convergence: a window that did not get back to the previous plateau gives up
        // some of it to newer flows.
        self.epoch.w_max = if window < self.epoch.w_max {
            window * (1.0 + BETA) / 2.0
        } else {
            window
        };
        self.ssthresh = ((window * BETA) as u64).max(self.minimum_window());
        self.window = self.ssthresh;
        self.epoch.start = None;
        self.count_congestion_event();
    }

    fn count_congestion_event(&mut self) {
        self.counters.congestion_events += 1;
        self.config
            .stats
            .congestion_events
            .fetch_add(1, Ordering::Relaxed);
    }
}

impl Controller for CubicHs {
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.ack(now, sent, bytes, app_limited, rtt.get());
    }

    fn on_end_acks(
        &mut self,
        now: Instant,
        in_flight: u64,
        _app_limited: bool,
        _largest_packet_num_acked: Option<u64>,
    ) {
        self.end_of_ack_frame(now, in_flight);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        if self.config.tolerate_random_loss {
            self.recent.on_loss(lost_bytes);
        }
        if is_persistent_congestion {
            self.counters.persistent_congestion += 1;
            // RFC 9002 7.6.2: collapse whatever phase we are in, the handshake included.
            let counted = !self.sent_in_recovery(sent);
            if counted {
                self.reduce(now);
            }
            self.window = self.minimum_window();
            // RFC 9002 7.6.2 resets recovery so the very next loss reduces again.
            self.recovery_start = None;
            self.recovering = false;
            self.epoch.start = None;
            self.epoch.after_collapse = true;
            // A path that just proved persistently congested has nothing left to forgive.
            self.forgiveness_used = true;
            if !counted {
                self.count_congestion_event();
            }
            return;
        }

        if self.sent_in_recovery(sent) {
            return;
        }

        // lost_bytes is zero for ECN-CE: an explicit congestion signal, never forgiven.
        if lost_bytes > 0 && !self.forgiveness_used && self.sent_in_first_flight(sent) {
            self.forgiveness_used = true;
            self.counters.handshake_losses_forgiven += 1;
            self.config
                .stats
                .handshake_losses_forgiven
                .fetch_add(1, Ordering::Relaxed);
            // An nginx debug line is how the collapse of field report 004 was found
            // (docs/field-reports.md); keep the equivalent decision visible.
            tracing::debug!(
                window = self.window,
                lost_bytes,
                "first-flight loss forgiven, staying in slow start"
            );
            return;
        }

        if lost_bytes > 0 && self.config.tolerate_random_loss {
            if self.loss_looks_random() {
                self.counters.random_losses_tolerated += 1;
                self.config
                    .stats
                    .random_losses_tolerated
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
            tracing::debug!(
                window = self.window,
                queue_delay_ms = self.recent.queue_delay().unwrap_or_default().as_secs_f64() * 1e3,
                min_rtt_ms = self.recent.path_min_rtt.unwrap_or_default().as_secs_f64() * 1e3,
                loss_rate = self.recent.loss_rate(),
                lost_bytes_two_rounds = self.recent.lost(),
                pipe_full = self.recent.pipe_full(),
                "loss with queueing delay, a high loss rate or at a full pipe: congestion"
            );
        }

        self.reduce(now);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.mtu = u64::from(new_mtu);
        self.window = self.window.max(self.minimum_window());
    }

    fn window(&self) -> u64 {
        self.window
    }

    fn metrics(&self) -> ControllerMetrics {
        let mut metrics = ControllerMetrics::default();
        metrics.congestion_window = self.window;
        metrics.ssthresh = Some(self.ssthresh);
        metrics
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.config.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1200;
    const PKT: u64 = MTU as u64;
    const IW: u64 = 10 * PKT;

    fn cubic_hs() -> (CubicHs, Arc<CcStats>) {
        let stats = CcStats::new();
        let cc = CubicHs::new(Arc::new(CubicHsConfig::new(IW, stats.clone())), MTU);
        (cc, stats)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Field report 004's scenario (docs/field-reports.md) up to the moment the tail loss is declared: a six-datagram first
    /// flight at `t0`, the first five acknowledged one RTT later, the sixth found lost by the
    /// ACK of a PTO probe. Returns the time the loss is declared.
    fn replay_first_flight_tail_loss(cc: &mut CubicHs, t0: Instant, rtt: Duration) -> Instant {
        for pn in 0..6 {
            cc.on_sent(t0, PKT, pn);
        }
        let first_ack = t0 + rtt;
        for _ in 0..5 {
            cc.ack(first_ack, t0, PKT, false, rtt);
        }
        cc.on_end_acks(first_ack, PKT, false, Some(4));
        let probe_sent = first_ack + 3 * rtt;
        cc.on_sent(probe_sent, PKT, 6);
        let loss_found = probe_sent + rtt;
        cc.ack(loss_found, probe_sent, PKT, false, rtt);
        // Nothing is in flight any more: exactly the state that pinned nginx at 2 packets.
        cc.on_end_acks(loss_found, 0, false, Some(6));
        cc.on_congestion_event(loss_found, t0, false, PKT);
        loss_found
    }

    #[test]
    fn field_report_004_tail_loss_of_first_flight_is_forgiven_and_later_loss_is_not() {
        let (mut cc, stats) = cubic_hs();
        let t0 = Instant::now();
        let rtt = ms(200);
        let loss_found = replay_first_flight_tail_loss(&mut cc, t0, rtt);

        // Five first-flight packets and the probe were acknowledged in slow start.
        assert_eq!(cc.window(), IW + 6 * PKT);
        assert!(cc.window() >= IW);
        assert!(cc.in_slow_start());
        assert_eq!(cc.ssthresh(), u64::MAX);
        assert!(!cc.in_recovery());
        assert_eq!(cc.losses_forgiven(), 1);
        assert_eq!(cc.congestion_events(), 0);
        assert_eq!(stats.handshake_losses_forgiven(), 1);
        assert_eq!(stats.congestion_events(), 0);

        // A data packet sent after the first RTT sample is lost, again with nothing in flight.
        let sent = loss_found + ms(1);
        let window = cc.window();
        cc.on_end_acks(sent + rtt, 0, false, None);
        cc.on_congestion_event(sent + rtt, sent, false, PKT);
        let expected = (window as f64 * BETA) as u64;
        assert_eq!(cc.window(), expected);
        assert_eq!(cc.ssthresh(), expected);
        assert!(!cc.in_slow_start());
        assert!(cc.in_recovery());
        assert_eq!(cc.congestion_events(), 1);
        assert_eq!(cc.losses_forgiven(), 1);
        assert_eq!(stats.congestion_events(), 1);
        assert_eq!(stats.handshake_losses_forgiven(), 1);
    }

    #[test]
    fn threshold_follows_the_window_even_with_nothing_in_flight() {
        let (mut cc, _) = cubic_hs();
        let t0 = Instant::now();
        cc.ack(t0 + ms(50), t0, 20 * PKT, false, ms(50));
        assert_eq!(cc.window(), 30 * PKT);
        let sent = t0 + ms(60);
        cc.on_end_acks(sent + ms(100), 0, false, None);
        cc.on_congestion_event(sent + ms(100), sent, false, PKT);
        assert_eq!(cc.ssthresh(), 21 * PKT);
        assert_eq!(cc.window(), 21 * PKT);
    }

    #[test]
    fn forgiveness_is_used_at_most_once() {
        let (mut cc, stats) = cubic_hs();
        let t0 = Instant::now();
        let rtt = ms(100);
        cc.ack(t0 + rtt, t0, PKT, false, rtt);
        // Two first-flight losses found in separate batches (e.g. Initial and Handshake space).
        cc.on_congestion_event(t0 + 3 * rtt, t0, false, PKT);
        assert_eq!(cc.window(), IW + PKT);
        cc.on_congestion_event(t0 + 4 * rtt, t0 + ms(1), false, PKT);
        assert_eq!(cc.window(), ((IW + PKT) as f64 * BETA) as u64);
        assert!(!cc.in_slow_start());
        assert_eq!(cc.losses_forgiven(), 1);
        assert_eq!(cc.congestion_events(), 1);
        assert_eq!(stats.handshake_losses_forgiven(), 1);
    }

    #[test]
    fn ecn_mark_on_first_flight_is_not_forgiven() {
        let (mut cc, _) = cubic_hs();
        let t0 = Instant::now();
        cc.on_congestion_event(t0 + ms(100), t0, false, 0);
        assert_eq!(cc.window(), (IW as f64 * BETA) as u64);
        assert_eq!(cc.losses_forgiven(), 0);
        assert_eq!(cc.congestion_events(), 1);
    }

    #[test]
    fn persistent_congestion_during_handshake_collapses_the_window() {
        let (mut cc, stats) = cubic_hs();
        let t0 = Instant::now();
        cc.on_congestion_event(t0 + ms(900), t0, true, 6 * PKT);
        assert_eq!(cc.window(), 2 * PKT);
        assert_eq!(cc.ssthresh(), (IW as f64 * BETA) as u64);
        assert!(cc.in_slow_start());
        assert_eq!(cc.losses_forgiven(), 0);
        assert_eq!(cc.congestion_events(), 1);
        assert_eq!(stats.handshake_losses_forgiven(), 0);
        // After a collapse there is nothing left to forgive.
        cc.on_congestion_event(t0 + ms(1000), t0 + ms(1), false, PKT);
        assert_eq!(cc.losses_forgiven(), 0);
        assert_eq!(cc.window(), 2 * PKT);
        assert_eq!(cc.congestion_events(), 2);
    }

    #[test]
    fn persistent_congestion_after_handshake_collapses_and_resets_recovery() {
        let (mut cc, stats) = cubic_hs();
        let t0 = Instant::now();
        let rtt = ms(100);
        cc.ack(t0 + rtt, t0, 30 * PKT, false, rtt);
        assert_eq!(cc.window(), 40 * PKT);
        let sent = t0 + 2 * rtt;
        cc.on_congestion_event(sent + rtt, sent, false, PKT);
        assert_eq!(cc.window(), 28 * PKT);
        // Persistent congestion reported for a packet of the same recovery period still
        // collapses the window and counts as a reduction.
        cc.on_congestion_event(sent + 5 * rtt, sent, true, 10 * PKT);
        assert_eq!(cc.window(), 2 * PKT);
        assert_eq!(cc.ssthresh(), 28 * PKT);
        assert!(!cc.in_recovery());
        assert_eq!(cc.congestion_events(), 2);
        assert_eq!(stats.congestion_events(), 2);
        assert_eq!(cc.counters().persistent_congestion, 1);
        // Recovery was reset: the next loss reduces again (floored at the minimum window).
        let later = sent + 6 * rtt;
        cc.on_congestion_event(later + rtt, later, false, PKT);
        assert_eq!(cc.window(), 2 * PKT);
        assert_eq!(cc.ssthresh(), 2 * PKT);
        assert_eq!(cc.congestion_events(), 3);
        assert_eq!(cc.losses_forgiven(), 0);
    }

    /// What a controller sees, in order.
    #[derive(Clone, Copy)]
    enum Event {
        Ack {
            now: Instant,
            sent: Instant,
            bytes: u64,
        },
        Loss {
            now: Instant,
            sent: Instant,
        },
    }

    fn feed(cc: &mut CubicHs, event: Event, rtt: Duration) {
        match event {
            Event::Ack { now, sent, bytes } => cc.ack(now, sent, bytes, false, rtt),
            Event::Loss { now, sent } => cc.on_congestion_event(now, sent, false, PKT),
        }
    }

    #[test]
    fn forgiven_connection_grows_exactly_like_the_loss_free_one() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let mut acks = Vec::new();
        // First flight of six at t0; five ACKed one RTT later (the sixth is the lost one).
        for _ in 0..5 {
            acks.push(Event::Ack {
                now: t0 + rtt,
                sent: t0,
                bytes: PKT,
            });
        }
        // Then rounds of packets: slow-start-like doubling, a real loss, then a long
        // congestion-avoidance stretch. The sequence is fixed, independent of any window.
        let mut now = t0 + rtt;
        let mut real_loss_at = None;
        for round in 0..60u32 {
            let sent = now + ms(1);
            now += rtt;
            let packets = if round < 5 { 1u64 << (round + 3) } else { 150 };
            for _ in 0..packets {
                acks.push(Event::Ack {
                    now,
                    sent,
                    bytes: PKT,
                });
            }
            if round == 6 {
                acks.push(Event::Loss { now, sent });
                real_loss_at = Some(acks.len());
            }
        }
        let real_loss_at = real_loss_at.unwrap();
        let forgiven_loss = Event::Loss {
            now: t0 + 4 * rtt,
            sent: t0,
        };

        let (mut loss_free, _) = cubic_hs();
        let (mut forgiven, _) = cubic_hs();
        // Same ACKs, plus the sixth first-flight packet ACKed: the truly loss-free connection.
        let (mut six_acked, _) = cubic_hs();
        feed(
            &mut six_acked,
            Event::Ack {
                now: t0 + rtt,
                sent: t0,
                bytes: PKT,
            },
            rtt,
        );

        for (i, &event) in acks.iter().enumerate() {
            if i == 5 {
                feed(&mut forgiven, forgiven_loss, rtt);
            }
            feed(&mut loss_free, event, rtt);
            feed(&mut forgiven, event, rtt);
            feed(&mut six_acked, event, rtt);
            assert_eq!(forgiven.window(), loss_free.window(), "event {i}");
            assert_eq!(forgiven.ssthresh(), loss_free.ssthresh(), "event {i}");
            if i < real_loss_at {
                assert!(forgiven.window() <= six_acked.window(), "event {i}");
            }
        }
        assert_eq!(forgiven.losses_forgiven(), 1);
        assert_eq!(forgiven.congestion_events(), 1);
        assert_eq!(loss_free.congestion_events(), 1);
        // The sequence really exercised congestion avoidance after the real loss.
        assert!(!forgiven.in_slow_start());
        assert!(forgiven.window() > forgiven.ssthresh());
    }

    /// Drives a controller in congestion avoidance: every RTT one window's worth of single
    /// packets is acknowledged, all sent after the last reduction. Returns the window after
    /// each RTT, in packets.
    fn run_rounds(cc: &mut CubicHs, start: Instant, rtt: Duration, rounds: u32) -> Vec<f64> {
        let mut windows = Vec::new();
        let mut now = start;
        for _ in 0..rounds {
            // Strictly after `start`, which is when the reduction opened recovery.
            let sent = now + Duration::from_micros(1);
            let packets = cc.window() / PKT;
            for i in 0..packets {
                let at = now + rtt.mul_f64((i + 1) as f64 / packets as f64);
                cc.ack(at, sent, PKT, false, rtt);
            }
            now += rtt;
            windows.push(cc.window() as f64 / PKT as f64);
        }
        windows
    }

    /// A controller that just reduced from `w_max_packets`, with the reduction at `at`.
    fn after_loss_at(w_max_packets: u64, at: Instant) -> CubicHs {
        let (mut cc, _) = cubic_hs();
        cc.ack(
            at - ms(1),
            at - ms(2),
            w_max_packets * PKT - IW,
            false,
            ms(100),
        );
        assert_eq!(cc.window(), w_max_packets * PKT);
        cc.on_congestion_event(at, at - ms(1), false, PKT);
        cc
    }

    fn w_cubic_packets(w_max: f64, t: f64) -> f64 {
        let k = (w_max * (1.0 - BETA) / C).cbrt();
        C * (t - k).powi(3) + w_max
    }

    #[test]
    fn cubic_growth_is_concave_then_plateaus_then_convex() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let mut cc = after_loss_at(100, t0);
        assert_eq!(cc.window(), 70 * PKT);
        let k = (100.0 * (1.0 - BETA) / C).cbrt(); // 4.22 s
        let w = run_rounds(&mut cc, t0, rtt, 100);

        // The window follows the cubic curve (targeting one RTT ahead) until, past W_max, the
        // Reno-friendly estimate overtakes it: 0.53 packets per RTT from 70 until it reaches
        // the window before the loss (100), then one packet per RTT.
        let reno = |rtts: f64| {
            let to_prior = 30.0 / ALPHA_RENO_FRIENDLY;
            if rtts < to_prior {
                70.0 + ALPHA_RENO_FRIENDLY * rtts
            } else {
                100.0 + rtts - to_prior
            }
        };
        for (i, &win) in w.iter().enumerate() {
            let t = (i + 1) as f64 * 0.1;
            let low = w_cubic_packets(100.0, t - 0.1).max(reno(i as f64)) - 1.0;
            let high = w_cubic_packets(100.0, t + 0.2).max(reno(i as f64 + 1.0)) + 1.0;
            assert!(
                win >= low && win <= high,
                "t={t:.1} window {win:.1} not in {low:.1}..{high:.1}"
            );
        }
        let growth = |from: usize, to: usize| w[to] - w[from];
        let concave = growth(0, 10);
        let plateau = growth((k * 10.0) as usize - 5, (k * 10.0) as usize + 5);
        let convex = growth(80, 90);
        assert!(
            concave > 3.0 * plateau,
            "concave {concave:.1} plateau {plateau:.1}"
        );
        assert!(
            convex > 3.0 * plateau,
            "convex {convex:.1} plateau {plateau:.1}"
        );
        let at_k = w[(k * 10.0) as usize];
        assert!((97.0..=103.0).contains(&at_k), "window at K: {at_k:.1}");
        assert!(w[99] > 110.0, "window beyond W_max: {:.1}", w[99]);
        // Never more than 1.5x per RTT.
        for pair in w.windows(2) {
            assert!(pair[1] <= pair[0] * 1.5);
        }
    }

    #[test]
    fn reno_friendly_region_is_respected_on_short_rtt() {
        let t0 = Instant::now();
        // At 1 ms RTT Reno outgrows the cubic curve by far: K is 2.47 s for W_max 20.
        let rtt = ms(1);
        let mut cc = after_loss_at(20, t0);
        assert_eq!(cc.window(), 14 * PKT);
        let w = run_rounds(&mut cc, t0, rtt, 100);
        // Reno-friendly estimate: 0.53 packets per RTT until it reaches the window before the
        // loss (about 11 RTTs), then one packet per RTT: about 108 packets after 100 RTTs.
        let last = w[99];
        assert!((100.0..=112.0).contains(&last), "window {last:.1}");
        assert!(last > 3.0 * w_cubic_packets(20.0, 0.1));
        let early = w[9] - 14.0;
        assert!(
            (4.0..=7.0).contains(&early),
            "first 10 RTTs grew {early:.1}"
        );
    }

    #[test]
    fn one_reduction_per_recovery_period() {
        let (mut cc, _) = cubic_hs();
        let t0 = Instant::now();
        let rtt = ms(100);
        cc.ack(t0 + rtt, t0, 10 * PKT, false, rtt);
        let sent_a = t0 + rtt + ms(1);
        let sent_b = sent_a + ms(5);
        let recovery_start = sent_a + rtt;
        cc.on_congestion_event(recovery_start, sent_a, false, PKT);
        let reduced = cc.window();
        assert_eq!(reduced, 14 * PKT);
        assert!(cc.in_recovery());
        // Another loss from before recovery began: same congestion event, no new reduction.
        cc.on_congestion_event(recovery_start + ms(10), sent_b, false, PKT);
        assert_eq!(cc.window(), reduced);
        assert_eq!(cc.congestion_events(), 1);
        // ACKs of packets sent before recovery began do not grow the window.
        cc.ack(recovery_start + ms(20), sent_b, 5 * PKT, false, rtt);
        assert_eq!(cc.window(), reduced);
        assert!(cc.in_recovery());
        // The first ACK of a packet sent after recovery began ends recovery.
        let sent_c = recovery_start + ms(30);
        for i in 0..14 {
            cc.ack(sent_c + rtt + ms(i), sent_c, PKT, false, rtt);
        }
        assert!(!cc.in_recovery());
        assert!(cc.window() > reduced);
        // A late-detected loss from the old period still does not reduce again.
        let grown = cc.window();
        cc.on_congestion_event(sent_c + 2 * rtt, sent_b, false, PKT);
        assert_eq!(cc.window(), grown);
        // A loss of a packet sent after recovery began is a new event, with fast convergence:
        // the window never got back to the old plateau, so W_max shrinks below it.
        cc.on_congestion_event(sent_c + 3 * rtt, sent_c, false, PKT);
        assert_eq!(cc.congestion_events(), 2);
        assert_eq!(cc.window(), (grown as f64 * BETA) as u64);
        assert_eq!(cc.epoch.w_max, grown as f64 * (1.0 + BETA) / 2.0);
    }

    #[test]
    fn mtu_update_moves_the_minimum_window() {
        let (mut cc, _) = cubic_hs();
        let t0 = Instant::now();
        cc.on_congestion_event(t0 + ms(500), t0, true, PKT);
        assert_eq!(cc.window(), 2 * PKT);
        cc.on_mtu_update(1452);
        assert_eq!(cc.window(), 2 * 1452);
        // A larger window is left alone by an MTU change.
        cc.ack(t0 + ms(600), t0 + ms(501), 10 * PKT, false, ms(100));
        let window = cc.window();
        cc.on_mtu_update(1300);
        assert_eq!(cc.window(), window);
        // The collapse floor follows the new MTU.
        cc.on_congestion_event(t0 + ms(900), t0 + ms(800), true, PKT);
        assert_eq!(cc.window(), 2 * 1300);
    }

    #[test]
    fn app_limited_acks_do_not_grow_and_idle_time_is_not_growth_time() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let mut cc = after_loss_at(100, t0);
        let w = run_rounds(&mut cc, t0, rtt, 3);
        let before = cc.window();
        let start = t0 + rtt * w.len() as u32;
        // 20 s of app-limited ACKs: far past K (4.2 s) if idle time counted.
        for s in 0..20 {
            cc.ack(start + Duration::from_secs(s), start, PKT, true, rtt);
        }
        assert_eq!(cc.window(), before);
        assert_eq!(cc.counters().app_limited_acks, 20);
        let resume = start + Duration::from_secs(20);
        cc.ack(resume, resume - ms(1), PKT, false, rtt);
        let jump = cc.window() - before;
        assert!(jump < 100, "window jumped {jump} bytes after idle");

        // In slow start, app-limited ACKs do not grow the window either.
        let (mut ss, _) = cubic_hs();
        ss.ack(t0 + rtt, t0, 5 * PKT, true, rtt);
        assert_eq!(ss.window(), IW);
    }

    fn cubic_hs_lt() -> (CubicHs, Arc<CcStats>) {
        let stats = CcStats::new();
        let config = CubicHsConfig::new(IW, stats.clone()).tolerating_random_loss();
        (CubicHs::new(Arc::new(config), MTU), stats)
    }

    /// One round of `packets` single-packet ACKs at a steady RTT, all sent at `sent`.
    fn ack_round(cc: &mut CubicHs, sent: Instant, rtt: Duration, packets: u64) -> Instant {
        let now = sent + rtt;
        for _ in 0..packets {
            cc.ack(now, sent, PKT, false, rtt);
        }
        now
    }

    #[test]
    fn random_loss_without_queue_is_tolerated_only_by_cubic_hs_lt() {
        let t0 = Instant::now();
        let rtt = ms(200);
        let (mut lt, stats) = cubic_hs_lt();
        let (mut hs, _) = cubic_hs();
        for cc in [&mut lt, &mut hs] {
            let now = ack_round(cc, t0, rtt, 10);
            let now = ack_round(cc, now, rtt, 20);
            assert_eq!(cc.window(), IW + 30 * PKT);
            // A data packet sent well after the first RTT sample, one loss in 31.
            cc.on_congestion_event(now + rtt, now, false, PKT);
        }
        assert_eq!(lt.window(), IW + 30 * PKT);
        assert!(lt.in_slow_start());
        assert!(!lt.in_recovery());
        assert_eq!(lt.random_losses_tolerated(), 1);
        assert_eq!(lt.congestion_events(), 0);
        assert_eq!(lt.losses_forgiven(), 0);
        assert_eq!(stats.random_losses_tolerated(), 1);
        assert_eq!(stats.congestion_events(), 0);
        // Plain cubic-hs gives the same loss the normal response.
        assert_eq!(hs.window(), ((IW + 30 * PKT) as f64 * BETA) as u64);
        assert!(!hs.in_slow_start());
        assert_eq!(hs.random_losses_tolerated(), 0);
        assert_eq!(hs.congestion_events(), 1);
    }

    #[test]
    fn first_flight_loss_is_forgiven_before_anything_is_tolerated() {
        let (mut lt, stats) = cubic_hs_lt();
        let t0 = Instant::now();
        let loss_found = replay_first_flight_tail_loss(&mut lt, t0, ms(200));
        assert_eq!(lt.losses_forgiven(), 1);
        assert_eq!(lt.random_losses_tolerated(), 0);
        assert_eq!(stats.handshake_losses_forgiven(), 1);
        // The tolerant rule then covers a later loss on the same quiet path.
        lt.on_congestion_event(loss_found + ms(400), loss_found + ms(1), false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 1);
        assert!(lt.in_slow_start());
    }

    #[test]
    fn loss_with_queueing_delay_is_congestion() {
        let t0 = Instant::now();
        let (mut lt, _) = cubic_hs_lt();
        let now = ack_round(&mut lt, t0, ms(200), 30);
        let round_b = now;
        let now = ack_round(&mut lt, now, ms(200), 10);
        // One ACK 1.5 s late (a stalled receiver, a lost ACK) in an otherwise quiet round is
        // not a queue: a smoothed RTT would have jumped by 190 ms, the round's minimum does not.
        lt.ack(round_b + ms(1700), round_b - ms(1), PKT, false, ms(390));
        lt.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 1);
        // min RTT 200 ms: up to 25 ms of queue is noise. A round whose samples sit 30 ms up is
        // judged by the quiet round before it until it has 8 samples; then a queue is building.
        let sent = now;
        let at = sent + ms(230);
        for _ in 0..5 {
            lt.ack(at, sent, PKT, false, ms(230));
        }
        lt.on_congestion_event(at + ms(1), sent, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 2);
        let window = lt.window();
        for _ in 0..3 {
            lt.ack(at + ms(2), sent, PKT, false, ms(230));
        }
        lt.on_congestion_event(at + ms(3), sent, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 2);
        assert_eq!(lt.congestion_events(), 1);
        assert_eq!(lt.window(), ((window + 3 * PKT) as f64 * BETA) as u64);
        assert!(!lt.in_slow_start());

        // On a short path the 4 ms floor applies: 11 ms minimum, 3 ms up is noise, 5 ms is not.
        let (mut short, _) = cubic_hs_lt();
        let mut now = ack_round(&mut short, t0, ms(11), 30);
        for _ in 0..2 {
            now = ack_round(&mut short, now, ms(14), 1);
        }
        short.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(short.random_losses_tolerated(), 1);
        for _ in 0..2 {
            now = ack_round(&mut short, now, ms(16), 1);
        }
        short.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(short.congestion_events(), 1);
    }

    #[test]
    fn loss_rate_above_five_percent_is_congestion_even_without_delay() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let (mut lt, _) = cubic_hs_lt();
        let now = ack_round(&mut lt, t0, rtt, 100);
        let now = ack_round(&mut lt, now, rtt, 100);
        // 200 packets acknowledged in the last two rounds: 10 of 210 lost is 4.8 %, tolerated;
        // the eleventh makes 5.2 %.
        for i in 1..=10u64 {
            lt.on_congestion_event(now + ms(i), now, false, PKT);
            assert_eq!(lt.random_losses_tolerated(), i);
            assert_eq!(lt.congestion_events(), 0);
        }
        lt.on_congestion_event(now + ms(11), now, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 10);
        assert_eq!(lt.congestion_events(), 1);
        assert!(!lt.in_slow_start());

        // A burst found in one batch counts with all its bytes: 9 packets of 109.
        let (mut burst, _) = cubic_hs_lt();
        let now = ack_round(&mut burst, t0, rtt, 40);
        let now = ack_round(&mut burst, now, rtt, 60);
        burst.on_congestion_event(now + ms(1), now, false, 9 * PKT);
        assert_eq!(burst.random_losses_tolerated(), 0);
        assert_eq!(burst.congestion_events(), 1);
    }

    #[test]
    fn fewer_than_8_losses_are_no_loss_rate_yet() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let (mut lt, _) = cubic_hs_lt();
        let now = ack_round(&mut lt, t0, rtt, 40);
        // 7 of 47 is 15 %, but 7 losses say little about a rate; the eighth decides.
        for i in 1..=7u64 {
            lt.on_congestion_event(now + ms(i), now, false, PKT);
        }
        assert_eq!(lt.random_losses_tolerated(), 7);
        lt.on_congestion_event(now + ms(8), now, false, PKT);
        assert_eq!(lt.congestion_events(), 1);
    }

    #[test]
    fn losses_older_than_two_rounds_are_forgotten() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let (mut lt, _) = cubic_hs_lt();
        let mut now = ack_round(&mut lt, t0, rtt, 60);
        for i in 1..=7u64 {
            lt.on_congestion_event(now + ms(i), now, false, PKT);
        }
        assert_eq!(lt.random_losses_tolerated(), 7);
        // Two clean rounds later the seven losses no longer count: seven more are again too few
        // to be a rate (with the old seven they would be 14 of 134, 10 %).
        now = ack_round(&mut lt, now, rtt, 60);
        now = ack_round(&mut lt, now, rtt, 60);
        for i in 1..=7u64 {
            lt.on_congestion_event(now + ms(i), now, false, PKT);
        }
        assert_eq!(lt.random_losses_tolerated(), 14);
        assert_eq!(lt.congestion_events(), 0);
    }

    #[test]
    fn ecn_and_persistent_congestion_are_never_tolerated() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let (mut lt, _) = cubic_hs_lt();
        let now = ack_round(&mut lt, t0, rtt, 60);
        lt.on_congestion_event(now + ms(1), now, false, 0);
        assert_eq!(lt.congestion_events(), 1);
        assert_eq!(lt.random_losses_tolerated(), 0);

        let (mut lt, _) = cubic_hs_lt();
        let now = ack_round(&mut lt, t0, rtt, 60);
        lt.on_congestion_event(now + ms(1), now, true, PKT);
        assert_eq!(lt.window(), 2 * PKT);
        assert_eq!(lt.random_losses_tolerated(), 0);
    }

    #[test]
    fn tolerated_connection_grows_exactly_like_the_loss_free_one() {
        let t0 = Instant::now();
        let rtt = ms(100);
        let (mut lossy, _) = cubic_hs_lt();
        let (mut loss_free, _) = cubic_hs_lt();
        let mut now = t0;
        // The window (and with it the delivery rate) grows every round: room left on the path.
        for round in 0..8u32 {
            let sent = now;
            let packets = loss_free.window() / PKT;
            for i in 0..packets {
                let at = sent + rtt + Duration::from_micros(i);
                lossy.ack(at, sent, PKT, false, rtt);
                loss_free.ack(at, sent, PKT, false, rtt);
                // One random loss per round, from round 2 on.
                if round >= 2 && i == packets / 2 {
                    lossy.on_congestion_event(at, sent, false, PKT);
                }
                assert_eq!(lossy.window(), loss_free.window(), "round {round}");
            }
            now = sent + rtt;
        }
        assert_eq!(lossy.random_losses_tolerated(), 6);
        assert_eq!(lossy.congestion_events(), 0);
    }

    #[test]
    fn loss_at_a_full_pipe_is_congestion_without_delay() {
        let t0 = Instant::now();
        let rtt = ms(50);
        let (mut lt, _) = cubic_hs_lt();
        // A bottleneck (or a share of one) delivers 100 packets per round, however large the
        // window; no queueing delay shows and losses are rare.
        let mut now = ack_round(&mut lt, t0, rtt, 50);
        for _ in 0..3 {
            now = ack_round(&mut lt, now, rtt, 100);
        }
        // Rounds ended so far: 50 (the first best), 100 (growth), 100 (flat): not yet full.
        lt.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 1);
        now = ack_round(&mut lt, now, rtt, 100);
        now = ack_round(&mut lt, now, rtt, 110);
        // Three flat rounds in a row: the pipe is full and the next loss is congestion.
        lt.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(lt.random_losses_tolerated(), 1);
        assert_eq!(lt.congestion_events(), 1);

        // App-limited rounds say nothing: a sender waiting for its upstream is not at a pipe.
        let (mut app, _) = cubic_hs_lt();
        let mut now = ack_round(&mut app, t0, rtt, 50);
        for _ in 0..6 {
            let at = now + rtt;
            for _ in 0..50 {
                app.ack(at, now, PKT, true, rtt);
            }
            now = at;
        }
        app.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(app.random_losses_tolerated(), 1);
        // A rate growing again by 25 % means room again.
        let (mut grown, _) = cubic_hs_lt();
        let mut now = ack_round(&mut grown, t0, rtt, 100);
        for _ in 0..4 {
            now = ack_round(&mut grown, now, rtt, 100);
        }
        now = ack_round(&mut grown, now, rtt, 130);
        now = ack_round(&mut grown, now, rtt, 130);
        grown.on_congestion_event(now + ms(1), now, false, PKT);
        assert_eq!(grown.random_losses_tolerated(), 1);
    }

    #[test]
    fn factory_builds_every_kind_with_the_same_initial_window() {
        let stats = CcStats::new();
        let now = Instant::now();
        let iw = 16 * PKT;
        for kind in [
            CongestionControl::CubicHs,
            CongestionControl::CubicHsLt,
            CongestionControl::Cubic,
            CongestionControl::NewReno,
            CongestionControl::Bbr,
        ] {
            let controller = factory(kind, iw, stats.clone()).build(now, MTU);
            assert_eq!(controller.initial_window(), iw, "{}", kind.as_str());
            assert_eq!(controller.window(), iw, "{}", kind.as_str());
            let any = controller.into_any();
            let matches = match kind {
                CongestionControl::CubicHs | CongestionControl::CubicHsLt => any.is::<CubicHs>(),
                CongestionControl::Cubic => any.is::<quinn::congestion::Cubic>(),
                CongestionControl::NewReno => any.is::<quinn::congestion::NewReno>(),
                CongestionControl::Bbr => any.is::<quinn::congestion::Bbr>(),
            };
            assert!(matches, "{} built the wrong controller", kind.as_str());
        }
        let hs = factory(CongestionControl::CubicHs, iw, stats.clone()).build(now, MTU);
        assert_eq!(connection_counters(hs), Some(CcCounters::default()));
        let stock = factory(CongestionControl::Cubic, iw, stats).build(now, MTU);
        assert_eq!(connection_counters(stock), None);
    }

    /// One ACK frame of `packets` packets, all sent at `sent`, as quinn reports it: one
    /// `on_ack` per packet, then the end of the frame.
    fn ack_frame(cc: &mut CubicHs, now: Instant, sent: Instant, packets: u64, rtt: Duration) {
        for _ in 0..packets {
            cc.ack(now, sent, PKT, false, rtt);
        }
        cc.on_end_acks(now, 0, false, None);
    }

    /// One round trip of slow start at a steady `rtt`: `frames` ACK frames of two packets; all
    /// but the last acknowledge packets sent before the round began, the last one a packet
    /// sent at its start, which ends the round. Returns the round's end.
    fn slow_start_round(cc: &mut CubicHs, start: Instant, rtt: Duration, frames: u64) -> Instant {
        for i in 0..frames {
            let sent = start - Duration::from_micros(frames - 1 - i);
            ack_frame(cc, sent + rtt, sent, 2, rtt);
        }
        start + rtt
    }

    fn without_hystart(config: CubicHsConfig) -> CubicHs {
        CubicHs::new(Arc::new(config.without_hystart()), MTU)
    }

    #[test]
    fn hystart_ends_slow_start_on_an_rtt_rise_without_a_loss() {
        let t0 = Instant::now();
        let (mut hs, stats) = cubic_hs();
        let mut plain = without_hystart(CubicHsConfig::new(IW, CcStats::new()));
        let mut end = t0;
        // Round zero, then two rounds at 40 ms: the baseline.
        for (rtt, frames) in [(40, 1), (40, 10), (40, 10)] {
            slow_start_round(&mut hs, end, ms(rtt), frames);
            end = slow_start_round(&mut plain, end, ms(rtt), frames);
        }
        assert_eq!(hs.window(), IW + 42 * PKT);
        assert_eq!(plain.window(), hs.window());
        // 46 ms is more than 40 + 40/8: at the eighth ACK of the round a queue is building.
        // Growth is full up to that ACK and a quarter after it.
        let before = hs.window();
        slow_start_round(&mut hs, end, ms(46), 10);
        end = slow_start_round(&mut plain, end, ms(46), 10);
        assert!(hs.in_css());
        assert_eq!(hs.window(), before + 16 * PKT + 4 * PKT / 4);
        assert_eq!(plain.window(), before + 20 * PKT);
        // Four more CSS rounds grow a quarter each, then congestion avoidance at that window.
        for round in 1..=4 {
            let before = hs.window();
            assert!(hs.in_slow_start(), "CSS round {round}");
            slow_start_round(&mut hs, end, ms(46), 10);
            end = slow_start_round(&mut plain, end, ms(46), 10);
            assert_eq!(hs.window(), before + 20 * PKT / 4, "CSS round {round}");
        }
        assert!(!hs.in_slow_start());
        assert_eq!(hs.ssthresh(), hs.window());
        assert_eq!(hs.congestion_events(), 0);
        assert_eq!(hs.counters().css_entries, 1);
        assert_eq!(hs.counters().slow_start_delay_exits, 1);
        assert_eq!(stats.slow_start_delay_exits(), 1);
        assert!(plain.in_slow_start());
        assert_eq!(plain.window(), IW + 142 * PKT);
        assert_eq!(plain.counters().css_entries, 0);
        // Congestion avoidance now: well under a packet per ACK frame.
        let before = hs.window();
        slow_start_round(&mut hs, end, ms(46), 10);
        assert!(
            hs.window() - before <= 2 * PKT,
            "grew {}",
            hs.window() - before
        );
    }

    #[test]
    fn hystart_runs_in_the_initial_slow_start_only() {
        let t0 = Instant::now();
        let (mut cc, _) = cubic_hs();
        let mut end = t0;
        for (rtt, frames) in [(40, 1), (40, 10), (40, 40)] {
            end = slow_start_round(&mut cc, end, ms(rtt), frames);
        }
        // A persistent-congestion collapse: slow start again from two packets, below the
        // threshold the reduction set. That slow start is the standard one.
        cc.on_congestion_event(end + ms(1), end, true, 10 * PKT);
        assert_eq!(cc.window(), 2 * PKT);
        assert_eq!(cc.ssthresh(), ((IW + 102 * PKT) as f64 * BETA) as u64);
        assert!(cc.in_slow_start());
        let later = end + ms(2);
        let mut end = later;
        for (rtt, frames) in [(40, 10), (40, 10)] {
            end = slow_start_round(&mut cc, end, ms(rtt), frames);
        }
        let before = cc.window();
        slow_start_round(&mut cc, end, ms(60), 10);
        assert!(!cc.in_css());
        assert!(cc.in_slow_start());
        assert_eq!(cc.window(), before + 20 * PKT);
        assert_eq!(cc.counters().css_entries, 0);
    }

    #[test]
    fn forgiven_first_flight_loss_leaves_hystart_as_on_the_loss_free_connection() {
        let t0 = Instant::now();
        let (mut loss_free, _) = cubic_hs();
        let (mut forgiven, _) = cubic_hs();
        let mut end = t0;
        let rounds = [(40, 1), (40, 10), (40, 10), (46, 10), (46, 10), (46, 10)];
        for (i, (rtt, frames)) in rounds.into_iter().enumerate() {
            if i == 1 {
                // A first-flight packet (sent at t0, before the first ACK) found lost.
                forgiven.on_congestion_event(end, t0 - ms(1), false, PKT);
                assert_eq!(forgiven.losses_forgiven(), 1);
            }
            slow_start_round(&mut loss_free, end, ms(rtt), frames);
            end = slow_start_round(&mut forgiven, end, ms(rtt), frames);
            assert_eq!(forgiven.window(), loss_free.window(), "round {i}");
            assert_eq!(forgiven.in_css(), loss_free.in_css(), "round {i}");
        }
        assert!(forgiven.in_css());
        assert_eq!(forgiven.counters().css_entries, 1);
    }

    #[test]
    fn cubic_hs_lt_tolerates_random_loss_in_slow_start_but_not_in_css() {
        let t0 = Instant::now();
        let rtt = ms(200);
        let (mut lt, _) = cubic_hs_lt();
        let mut plain_lt =
            without_hystart(CubicHsConfig::new(IW, CcStats::new()).tolerating_random_loss());
        let mut end = t0;
        for frames in [1, 10, 10] {
            slow_start_round(&mut lt, end, rtt, frames);
            end = slow_start_round(&mut plain_lt, end, rtt, frames);
        }
        // No queue: a loss is random for both, slow start goes on.
        for cc in [&mut lt, &mut plain_lt] {
            cc.on_congestion_event(end + ms(1), end - ms(1), false, PKT);
            assert_eq!(cc.random_losses_tolerated(), 1);
            assert!(cc.in_slow_start());
        }
        // 18 ms up on a 200 ms path: HyStart++ sees a queue (threshold capped at 16 ms), the
        // tolerant rule alone would not (it allows 200 / 8 = 25 ms).
        slow_start_round(&mut lt, end, rtt + ms(18), 10);
        end = slow_start_round(&mut plain_lt, end, rtt + ms(18), 10);
        assert!(lt.in_css());
        let window = lt.window();
        for cc in [&mut lt, &mut plain_lt] {
            cc.on_congestion_event(end + ms(1), end - ms(1), false, PKT);
        }
        assert_eq!(plain_lt.random_losses_tolerated(), 2);
        assert_eq!(plain_lt.congestion_events(), 0);
        assert_eq!(lt.random_losses_tolerated(), 1);
        assert_eq!(lt.congestion_events(), 1);
        assert_eq!(lt.window(), (window as f64 * BETA) as u64);
        assert!(!lt.in_slow_start());
    }
}
