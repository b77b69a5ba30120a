//! HyStart++ (RFC 9406): leave slow start when the round trip time rises, before the queue
//! that causes the rise overflows.
//!
//! Slow start doubles the window every round trip until a packet is lost. By then the
//! bottleneck queue has been overrun by up to a whole window: S4's 5.7 MB downloads lost about
//! 13 % of their packets that way, once per connection. HyStart++ watches the RTT; once it is
//! clearly above the path's, a queue is building and growth drops to a quarter (conservative
//! slow start, CSS). Should the RTT fall back below the level that started CSS, the rise was
//! jitter and slow start resumes; after `CSS_ROUNDS` rounds without that, congestion
//! avoidance takes over at the window reached.
//!
//! The differences from the RFC's TCP wording, and why:
//! - CSS begins once `N_RTT_SAMPLE` samples in a row sit a threshold above the smallest
//!   sample so far, within the round they arrive in. The RFC compares the minimum of a
//!   round's first samples with the previous round's minimum: a queue that begins in the
//!   middle of a round shows in that minimum only a round later, a window doubling later.
//!   In S4 at 42 ms that was 2.3 BDP in flight against 3.4 BDP that path and queue hold.
//! - In CSS, growth pauses while the latest sample sits another threshold above the level
//!   that started CSS: a real queue rises by a quarter window per CSS round, so the RFC's
//!   five CSS rounds (3x) overran the queue they had detected. The pause never ends slow
//!   start by itself, so a spurious rise (a busy client or sender) costs growth only
//!   while it lasts.
//! - A round ends with the first acknowledgement of a packet sent after the round began
//!   (RFC: when `windowEnd`, the sequence number sent first in the round, is acknowledged).
//!   The controller sees send times, not sequence numbers; the two mark the same packet.
//! - An RTT sample is the ACK time minus the send time of the newest packet an ACK frame
//!   acknowledges, including the peer's ACK delay, as quinn's own latest RTT. quinn updates its
//!   estimator only after the controller saw the ACK, so the controller measures itself.
//! - quinn paces, so the per-ACK growth limit `L` is infinite (RFC 9406 section 4.3).

use std::time::{Duration, Instant};

/// RFC 9406 section 4.3: the smallest and largest RTT rise that ends slow start.
const MIN_RTT_THRESH: Duration = Duration::from_millis(4);
const MAX_RTT_THRESH: Duration = Duration::from_millis(16);
/// The rise is a fraction 1/8 of the last round's minimum RTT, within those bounds.
const MIN_RTT_DIVISOR: u32 = 8;
/// A round's minimum RTT counts once it has this many samples (one per ACK frame).
pub const N_RTT_SAMPLE: u32 = 8;
/// In CSS the window grows by a quarter of what slow start would add.
pub const CSS_GROWTH_DIVISOR: u64 = 4;
/// CSS rounds before congestion avoidance.
pub const CSS_ROUNDS: u32 = 5;

/// What one ACK frame did to the slow-start phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    None,
    /// The RTT rose: conservative slow start began.
    EnteredCss,
    /// The RTT fell below the level that started CSS: slow start again.
    ResumedSlowStart,
    /// `CSS_ROUNDS` rounds of CSS are over: congestion avoidance at the current window.
    ExitToCongestionAvoidance,
    /// In CSS the RTT rose by another threshold: the queue keeps growing even at a quarter
    /// of slow start's growth. The window holds until the RTT falls back under that level.
    GrowthPaused,
}

/// The minimum RTT of one round and how many samples it rests on.
#[derive(Debug, Clone, Copy, Default)]
struct RoundMin {
    min: Option<Duration>,
    samples: u32,
}

impl RoundMin {
    fn add(&mut self, sample: Duration) {
        self.min = Some(self.min.map_or(sample, |m| m.min(sample)));
        self.samples = self.samples.saturating_add(1);
    }

    /// The minimum, once enough samples support it.
    fn settled(&self) -> Option<Duration> {
        self.min.filter(|_| self.samples >= N_RTT_SAMPLE)
    }
}

/// Consecutive samples at or above a level, and the smallest of them.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    len: u32,
    min: Option<Duration>,
}

impl Run {
    /// Counts `sample` if it reaches `level`, starts over otherwise; the run's minimum once
    /// it is `N_RTT_SAMPLE` samples long.
    fn add(&mut self, sample: Duration, level: Duration) -> Option<Duration> {
        if sample < level {
            *self = Self::default();
            return None;
        }
        self.len = self.len.saturating_add(1);
        self.min = Some(self.min.map_or(sample, |m| m.min(sample)));
        self.min.filter(|_| self.len >= N_RTT_SAMPLE)
    }
}

/// HyStart++ state of one connection's initial slow start.
#[derive(Debug, Clone, Default)]
pub struct HyStart {
    /// When the current round began; `None` before the first ACK, so that the first ACK
    /// ends the (empty) round zero as acknowledging `windowEnd` does in the RFC.
    round_start: Option<Instant>,
    /// An ACK of the frame being processed acknowledged a packet sent in the current round.
    round_done: bool,
    /// The smallest sample among the packets of the ACK frame being processed.
    ack_sample: Option<Duration>,
    current: RoundMin,
    last_round_min: Option<Duration>,
    /// The smallest sample so far: the path's RTT without our queue.
    base_rtt: Option<Duration>,
    /// Samples in a row at or above `base_rtt` plus the threshold: a queue.
    high: Run,
    /// `Some` while in CSS: the RTT level that started it (RFC `cssBaselineMinRtt`).
    css_baseline: Option<Duration>,
    css_rounds: u32,
    /// In CSS, the latest sample sat another threshold above the baseline: no growth.
    paused: bool,
    /// Growth was paused at least once in this CSS period (reported once).
    paused_before: bool,
    /// Rounds completed, for the controller's per-round log.
    rounds: u32,
}

/// RFC 9406 `RttThresh`: an eighth of `rtt`, between 4 and 16 ms. The RFC takes the last
/// round's minimum; the in-round test here takes the path's minimum (`base_rtt`).
pub fn rtt_threshold(rtt: Duration) -> Duration {
    (rtt / MIN_RTT_DIVISOR).clamp(MIN_RTT_THRESH, MAX_RTT_THRESH)
}

impl HyStart {
    pub fn in_css(&self) -> bool {
        self.css_baseline.is_some()
    }

    /// Rounds completed so far and the minimum RTT of the last one.
    pub fn rounds(&self) -> (u32, Option<Duration>) {
        (self.rounds, self.last_round_min)
    }

    /// How much of `acked` bytes the window may grow by now.
    pub fn growth(&self, acked: u64) -> u64 {
        if self.paused {
            0
        } else if self.in_css() {
            acked / CSS_GROWTH_DIVISOR
        } else {
            acked
        }
    }

    /// One acknowledged ack-eliciting packet of the ACK frame being processed.
    pub fn on_ack(&mut self, now: Instant, sent: Instant) {
        let sample = now.saturating_duration_since(sent);
        self.ack_sample = Some(self.ack_sample.map_or(sample, |s| s.min(sample)));
        if self.round_start.is_none_or(|start| sent >= start) {
            self.round_done = true;
        }
    }

    /// The ACK frame is processed: its sample counts, then the phase may change, then the
    /// round may end (in the RFC's order: the ACK of `windowEnd` still belongs to its round).
    pub fn on_end_acks(&mut self, now: Instant) -> Transition {
        let Some(sample) = self.ack_sample.take() else {
            return Transition::None;
        };
        self.current.add(sample);
        let base = *self
            .base_rtt
            .insert(self.base_rtt.map_or(sample, |b| b.min(sample)));
        let transition = match self.css_baseline {
            None => self.watch_slow_start(sample, base),
            Some(baseline) => self.watch_css(sample, base, baseline),
        };
        if std::mem::take(&mut self.round_done) {
            self.rounds = self.rounds.saturating_add(1);
            self.round_start = Some(now);
            self.last_round_min = self.current.min;
            self.current = RoundMin::default();
            if self.in_css() {
                self.css_rounds += 1;
                if self.css_rounds >= CSS_ROUNDS {
                    return Transition::ExitToCongestionAvoidance;
                }
            }
        }
        transition
    }

    /// Slow start: CSS once `N_RTT_SAMPLE` samples in a row sit a threshold above the path's
    /// minimum. The RFC compares the minimum of a round's first `N_RTT_SAMPLE` samples with
    /// the previous round's minimum, so it sees a queue that began in the middle of a round
    /// only in the round after next, one window doubling later; this sees it as soon as the
    /// ACKs of the queued packets come back. Whenever the RFC's test holds, this one held no
    /// later (every sample of that round is above the level), so it replaces it.
    fn watch_slow_start(&mut self, sample: Duration, base: Duration) -> Transition {
        let Some(run_min) = self.high.add(sample, base + rtt_threshold(base)) else {
            return Transition::None;
        };
        self.css_baseline = Some(run_min);
        self.css_rounds = 0;
        self.high = Run::default();
        // The round's earlier samples predate the queue: falling back below the baseline
        // must be shown by `N_RTT_SAMPLE` samples from here on.
        self.current = RoundMin::default();
        Transition::EnteredCss
    }

    /// CSS: back to slow start when a round's minimum falls below the baseline (RFC 9406).
    /// While the latest sample sits another threshold above the baseline, the window does
    /// not grow at all. A real queue rises by a quarter window per CSS round, so without
    /// the pause the RFC's five CSS rounds grow the window threefold into a queue that is
    /// already filling; a stalled receiver or a busy sender raises a few samples and pauses
    /// growth only while they last. The pause is not an exit: only the RFC's exits end
    /// slow start, so a spurious rise can never leave the window short of the path.
    fn watch_css(&mut self, sample: Duration, base: Duration, baseline: Duration) -> Transition {
        if self.current.settled().is_some_and(|min| min < baseline) {
            self.css_baseline = None;
            self.css_rounds = 0;
            self.high = Run::default();
            self.paused = false;
            self.paused_before = false;
            return Transition::ResumedSlowStart;
        }
        self.paused = sample >= baseline + rtt_threshold(base);
        if self.paused && !std::mem::replace(&mut self.paused_before, true) {
            return Transition::GrowthPaused;
        }
        Transition::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Feeds one round that begins at `start` with `acks` ACK frames of one packet each at a
    /// steady `rtt`: all but the last acknowledge packets sent before the round began, the last
    /// one the first packet sent in it, which ends the round at `start + rtt`. Returns the
    /// transitions in order and that end.
    fn round(
        h: &mut HyStart,
        start: Instant,
        rtt: Duration,
        acks: u32,
    ) -> (Vec<Transition>, Instant) {
        let mut seen = Vec::new();
        for i in 0..acks {
            let sent = start - Duration::from_micros(u64::from(acks - 1 - i));
            let now = sent + rtt;
            h.on_ack(now, sent);
            let t = h.on_end_acks(now);
            if t != Transition::None {
                seen.push(t);
            }
        }
        (seen, start + rtt)
    }

    #[test]
    fn threshold_is_an_eighth_clamped_to_4_and_16_ms() {
        assert_eq!(rtt_threshold(ms(11)), ms(4));
        assert_eq!(rtt_threshold(ms(42)), Duration::from_micros(5250));
        assert_eq!(rtt_threshold(ms(100)), ms(12) + Duration::from_micros(500));
        assert_eq!(rtt_threshold(ms(200)), ms(16));
    }

    #[test]
    fn a_round_ends_with_the_first_ack_of_a_packet_sent_after_it_began() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        // Round zero ends at the first ACK; its one sample becomes the last round's minimum.
        h.on_ack(t0 + ms(50), t0);
        h.on_end_acks(t0 + ms(50));
        assert_eq!(h.last_round_min, Some(ms(50)));
        let round_start = t0 + ms(50);
        // ACKs of packets sent before the round began stay in the round, however many.
        for i in 1..=12 {
            h.on_ack(t0 + ms(50 + i), t0 + ms(i));
            h.on_end_acks(t0 + ms(50 + i));
        }
        assert_eq!(h.current.samples, 12);
        assert_eq!(h.round_start, Some(round_start));
        // The first packet sent in the round is acknowledged: its sample closes the round.
        h.on_ack(round_start + ms(49), round_start + ms(1));
        h.on_end_acks(round_start + ms(49));
        assert_eq!(h.current.samples, 0);
        assert_eq!(h.last_round_min, Some(ms(48)));
        assert_eq!(h.round_start, Some(round_start + ms(49)));
    }

    #[test]
    fn one_sample_per_ack_frame_the_smallest_of_its_packets() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let now = t0 + ms(60);
        h.on_ack(now, t0);
        h.on_ack(now, t0 + ms(15));
        h.on_ack(now, t0 + ms(5));
        h.on_end_acks(now);
        assert_eq!(h.last_round_min, Some(ms(45)));
        // A frame without ack-eliciting packets is no sample.
        assert_eq!(h.on_end_acks(now + ms(1)), Transition::None);
        assert_eq!(h.current.samples, 0);
    }

    #[test]
    fn rise_of_the_threshold_enters_css_only_after_8_samples() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(40), 1);
        let (_, end) = round(&mut h, end, ms(40), 10);
        assert!(!h.in_css());
        // Threshold for 40 ms: 5 ms. 44.9 ms is not enough.
        let (seen, end) = round(&mut h, end, ms(44) + Duration::from_micros(900), 10);
        assert!(seen.is_empty() && !h.in_css(), "{seen:?}");
        // 45 ms is: the level is the path's minimum plus the threshold, whatever the last
        // round's minimum was (the RFC's round-over-round test needed 50.51 ms here, so a
        // queue that grows by less than a threshold per round went unseen).
        for i in 1..=8u64 {
            let sent = end - ms(9 - i);
            h.on_ack(sent + ms(45), sent);
            let t = h.on_end_acks(sent + ms(45));
            if i < 8 {
                assert_eq!(t, Transition::None, "sample {i}");
            } else {
                assert_eq!(t, Transition::EnteredCss);
            }
        }
        assert!(h.in_css());
        assert_eq!(h.css_baseline, Some(ms(45)));
        assert_eq!(h.growth(4000), 1000);
    }

    /// Feeds single-packet ACK frames of packets sent 1 ms apart from `first_sent`, with the
    /// given RTT samples; returns the transitions by sample index.
    fn samples(
        h: &mut HyStart,
        first_sent: Instant,
        rtts: &[Duration],
    ) -> Vec<(usize, Transition)> {
        let mut seen = Vec::new();
        for (i, rtt) in rtts.iter().enumerate() {
            let sent = first_sent + ms(i as u64);
            h.on_ack(sent + *rtt, sent);
            let t = h.on_end_acks(sent + *rtt);
            if t != Transition::None {
                seen.push((i, t));
            }
        }
        seen
    }

    #[test]
    fn a_queue_that_begins_inside_a_round_enters_css_in_the_round_it_shows() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(42), 1);
        let (_, end) = round(&mut h, end, ms(42), 10);
        // One long round: 20 samples at the path's RTT, then the ACKs of packets that met a
        // queue, 6-7 ms more. The RFC's minimum of this round is 42 ms, so it would wait for
        // the round after; 8 samples above 47.25 ms are enough.
        let mut rtts = vec![ms(42); 20];
        rtts.extend((0..12).map(|i| ms(48) + Duration::from_micros(100 * i)));
        let seen = samples(&mut h, end - ms(40), &rtts);
        assert_eq!(seen, [(27, Transition::EnteredCss)]);
        assert_eq!(h.css_baseline, Some(ms(48)));
        // The round's earlier 42 ms samples predate the queue and do not read as a fall.
        assert!(h.in_css());
    }

    #[test]
    fn jitter_above_the_level_must_hold_for_8_samples_in_a_row() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(42), 1);
        let (_, end) = round(&mut h, end, ms(42), 10);
        // Seven late ACKs, one on time, seven late again: no queue.
        let mut rtts = vec![ms(60); 7];
        rtts.push(ms(43));
        rtts.extend([ms(60); 7]);
        assert!(samples(&mut h, end - ms(40), &rtts).is_empty());
        assert!(!h.in_css());
    }

    #[test]
    fn a_queue_still_growing_in_css_pauses_growth_until_the_rtt_falls_back() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(42), 1);
        let (_, end) = round(&mut h, end, ms(42), 10);
        // Enters CSS at 48 ms; the queue keeps growing: from 53.25 ms (48 + 5.25) on the
        // window stops growing, reported once.
        let mut rtts = vec![ms(48); 8];
        rtts.extend([ms(50), ms(52), ms(54), ms(56), ms(55)]);
        let seen = samples(&mut h, end - ms(40), &rtts);
        assert_eq!(
            seen,
            [(7, Transition::EnteredCss), (10, Transition::GrowthPaused)]
        );
        assert_eq!(h.growth(4000), 0);
        // Below the level again: a quarter, as CSS grows; a new rise is not reported again.
        let seen = samples(&mut h, end - ms(20), &[ms(52), ms(60)]);
        assert!(seen.is_empty(), "{seen:?}");
        assert_eq!(h.growth(4000), 0);
        samples(&mut h, end - ms(10), &[ms(51)]);
        assert_eq!(h.growth(4000), 1000);
        // A pause is not an exit: five CSS rounds still end slow start, a fall still resumes.
        assert!(h.in_css());
        assert_eq!(h.css_rounds, 0);
    }

    #[test]
    fn a_steady_rtt_in_css_is_no_further_rise() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(42), 1);
        let (_, end) = round(&mut h, end, ms(42), 10);
        let (seen, end) = round(&mut h, end, ms(48), 10);
        assert_eq!(seen, [Transition::EnteredCss]);
        // 53 ms stays below 48 + 5.25: CSS goes on round after round.
        let (seen, _) = round(&mut h, end, ms(53), 10);
        assert!(seen.is_empty(), "{seen:?}");
        assert!(h.in_css());
    }

    #[test]
    fn css_returns_to_slow_start_when_the_rtt_falls_below_the_baseline() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(20), 1);
        let (_, end) = round(&mut h, end, ms(20), 10);
        let (seen, end) = round(&mut h, end, ms(30), 10);
        assert_eq!(seen, [Transition::EnteredCss]);
        // Still 30 ms: no change. Then a round at 29 ms, below the 30 ms baseline: the rise
        // was not a queue.
        let (seen, end) = round(&mut h, end, ms(30), 10);
        assert!(seen.is_empty());
        let (seen, _) = round(&mut h, end, ms(29), 10);
        assert_eq!(seen, [Transition::ResumedSlowStart]);
        assert!(!h.in_css());
        assert_eq!(h.growth(4000), 4000);
        assert_eq!(h.css_rounds, 0);
    }

    #[test]
    fn five_css_rounds_end_slow_start() {
        let t0 = Instant::now();
        let mut h = HyStart::default();
        let (_, end) = round(&mut h, t0, ms(20), 1);
        let (_, mut end) = round(&mut h, end, ms(20), 10);
        let mut per_round = Vec::new();
        for _ in 0..5 {
            let (seen, e) = round(&mut h, end, ms(30), 10);
            per_round.push(seen);
            end = e;
        }
        // The round that entered CSS counts as its first; the fifth ends slow start.
        assert_eq!(per_round[0], [Transition::EnteredCss]);
        for r in &per_round[1..4] {
            assert!(r.is_empty(), "{per_round:?}");
        }
        assert_eq!(per_round[4], [Transition::ExitToCongestionAvoidance]);
    }
}
