//! How many connection attempts may await the accept loop, and when the receive path sheds new
//! ones so that those which proved their address still get a place.
//!
//! quinn keeps at most [`MAX_INCOMING`] attempts awaiting the accept loop's decision and drops,
//! unseen, every Initial that would open one more. Under a flood of Initials from spoofed
//! sources that outruns the loop (a Retry costs it about 17 µs, so about 45,000 a second on one
//! core), those places stay taken by the flood, and a real client's second Initial, the one
//! carrying the Retry token that proves its address, is dropped with the rest: its handshake
//! waited for the flood to end (measured: 7.9 s for an 8 s flood at 60,000/s).
//!
//! So the accept loop reports how long each attempt it decides has waited since its source's
//! last datagram (the amplification ledger knows when that came), and once one has waited
//! [`BEHIND`], or found the ledger full, the socket drops Initials that carry no token from
//! sources it holds nothing for, for [`SHED_FOR`]: a few instructions per datagram instead of a
//! Retry, so quinn's places drain, the CPU the Retries would take goes to the connections, and
//! the Initials that carry a token (a Retry's or a NEW_TOKEN's), which a spoofed source never
//! has, get in. A real new client loses only its first Initial: the one it resends after its
//! probe timeout, from the same address to the same connection ID, is let through (the ledger
//! remembers what it shed, `Ledger::first_shed`), which a spoofer sending from a new source per
//! datagram never does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Connection attempts quinn queues for the accept loop. The loop decides on each at once, so
/// the queue is short; quinn's default (65536) would let a flood park that many Initials.
pub const MAX_INCOMING: usize = 4096;
/// An attempt that waited this long for its decision means the loop is behind (an idle loop
/// decides within microseconds; 50 ms is about 2,000 attempts queued at full speed).
pub const BEHIND: Duration = Duration::from_millis(50);
/// How long a late decision sheds new attempts: long enough for quinn's queue to drain at the
/// loop's speed and leave the machine's CPU to the connections, short enough that a real
/// client's resent Initial finds the door open again within its first probe timeouts.
pub const SHED_FOR: Duration = Duration::from_millis(200);

/// When the receive path sheds new attempts: for [`SHED_FOR`] after a decision that came
/// [`BEHIND`] (or found the ledger full). Shedding while a count of undecided attempts stayed
/// above half of quinn's places was tried too, alone and beside this: it kept the loop busy
/// with Retries, and a legitimate client's p99 at 60,000/s went from 0.40-0.46 s to 0.9-2.2 s.
/// One per address family, as each has its own endpoint and accept loop. Lock-free: read for
/// every Initial.
#[derive(Debug)]
pub struct Backlog {
    epoch: Instant,
    /// Nanoseconds after `epoch` until which new attempts are shed (0: never yet).
    shed_until: AtomicU64,
}

impl Backlog {
    pub fn new(epoch: Instant) -> Self {
        Self {
            epoch,
            shed_until: AtomicU64::new(0),
        }
    }

    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The accept loop decided on an attempt that waited `waited` since its source's last
    /// datagram (`None`: its source had no entry, the ledger was full).
    pub fn decided(&self, waited: Option<Duration>, now: Instant) {
        if waited.is_none_or(|w| w >= BEHIND) {
            self.shed_until
                .fetch_max(self.nanos(now + SHED_FOR), Ordering::Relaxed);
        }
    }

    /// Whether a new attempt without a token is shed now.
    pub fn shedding(&self, now: Instant) -> bool {
        self.nanos(now) < self.shed_until.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_late_decision_sheds_for_a_while_and_a_prompt_one_does_not() {
        let t0 = Instant::now();
        let b = Backlog::new(t0);
        b.decided(Some(Duration::from_micros(30)), t0);
        b.decided(Some(BEHIND - Duration::from_millis(1)), t0);
        assert!(!b.shedding(t0), "prompt decisions shed nothing");
        let t1 = t0 + Duration::from_secs(1);
        b.decided(Some(BEHIND), t1);
        assert!(b.shedding(t1));
        assert!(b.shedding(t1 + SHED_FOR - Duration::from_millis(1)));
        assert!(!b.shedding(t1 + SHED_FOR), "it ends by itself");
    }

    #[test]
    fn a_full_ledger_sheds_and_a_later_prompt_decision_does_not_cut_it_short() {
        let t0 = Instant::now();
        let b = Backlog::new(t0);
        b.decided(None, t0);
        b.decided(Some(Duration::ZERO), t0 + Duration::from_millis(10));
        assert!(b.shedding(t0 + SHED_FOR - Duration::from_millis(1)));
        b.decided(Some(BEHIND * 2), t0 + SHED_FOR / 2);
        assert!(b.shedding(t0 + SHED_FOR));
        assert!(!b.shedding(t0 + SHED_FOR / 2 + SHED_FOR));
    }
}
