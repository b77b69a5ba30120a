//! The data plane's log budget: a line that can repeat is written at most once per cause per
//! [`WINDOW`] (a minute), whatever causes it.
//!
//! Lines that clients or the upstream can cause name a [`Reason`] from a fixed set and go
//! through [`LOG`]: one line per reason per window, and what it suppressed is said by one
//! periodic line per reason ("N similar lines suppressed"), so an attacker (or an upstream that
//! is down) costs a bounded number of lines whatever the request rate. Lines about failures
//! and changes that repeat on their own (a refused watch, a configuration applied while
//! thousands of hosts load) go through a [`CauseLog`] of the task that writes them, and the
//! next line of a cause says how many it held back. Lines at debug level are for diagnosis,
//! off by default, and not limited.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

/// One line per cause per window; also how often suppressed lines are reported. A minute is
/// what an operator reading a log at 10,000 hosts can afford per cause, and the metrics count
/// every occurrence anyway.
pub const WINDOW: Duration = Duration::from_secs(60);

/// Why a line is logged; the `reason` field of the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// A handshake named a host we do not serve.
    UnknownSni,
    /// A request could not be forwarded (upstream refused, timed out, TLS failed).
    UpstreamFailed,
    /// The upstream failed or stalled in the middle of a response.
    UpstreamMidResponse,
    /// The upstream presented another certificate than the one we serve.
    UpstreamCertificate,
    /// The upstream presented the previous or next certificate within the renewal grace:
    /// accepted, and its own reason so these lines never use up the allowance of a refusal.
    UpstreamRenewal,
    /// The buffered-request budget refused a request.
    RequestBudget,
    /// Another process sharing the port misbehaved (bad message, no answer, another user).
    Handover,
    /// Another process sharing the port joined, left, or took the new connections.
    Rollout,
    /// This process was superseded by a newer one; its own reason, so the lines about other
    /// processes never hide it.
    Superseded,
    /// The newer process left and this one takes new connections again.
    Resumed,
}

impl Reason {
    pub const ALL: [Reason; 10] = [
        Reason::UnknownSni,
        Reason::UpstreamFailed,
        Reason::UpstreamMidResponse,
        Reason::UpstreamCertificate,
        Reason::UpstreamRenewal,
        Reason::RequestBudget,
        Reason::Handover,
        Reason::Rollout,
        Reason::Superseded,
        Reason::Resumed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::UnknownSni => "unknown_sni",
            Reason::UpstreamFailed => "upstream_failed",
            Reason::UpstreamMidResponse => "upstream_mid_response",
            Reason::UpstreamCertificate => "upstream_certificate",
            Reason::UpstreamRenewal => "upstream_renewal",
            Reason::RequestBudget => "request_budget",
            Reason::Handover => "handover",
            Reason::Rollout => "rollout",
            Reason::Superseded => "superseded",
            Reason::Resumed => "resumed",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

struct Slot {
    window: AtomicU64,
    lines: AtomicU64,
    suppressed: AtomicU64,
}

impl Slot {
    const fn new() -> Self {
        Slot {
            window: AtomicU64::new(0),
            lines: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }
}

/// Per-reason line allowances; one instance, [`LOG`], for the process.
pub struct RateLimitedLog {
    slots: [Slot; Reason::ALL.len()],
}

/// The process's limiter: log lines are a process-wide resource, whichever proxy generation,
/// connection or task writes them.
pub static LOG: RateLimitedLog = RateLimitedLog::new();

fn window_now() -> u64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    secs / WINDOW.as_secs()
}

impl RateLimitedLog {
    pub const LINES_PER_WINDOW: u64 = 1;

    pub const fn new() -> Self {
        RateLimitedLog {
            slots: [const { Slot::new() }; Reason::ALL.len()],
        }
    }

    /// Whether a line for `reason` may be written now; counts it as suppressed if not.
    pub fn allow(&self, reason: Reason) -> bool {
        self.allow_at(reason, window_now())
    }

    fn allow_at(&self, reason: Reason, window: u64) -> bool {
        let slot = &self.slots[reason.index()];
        if slot.window.swap(window, Ordering::AcqRel) != window {
            slot.lines.store(0, Ordering::Release);
        }
        if slot.lines.fetch_add(1, Ordering::AcqRel) < Self::LINES_PER_WINDOW {
            true
        } else {
            slot.suppressed.fetch_add(1, Ordering::AcqRel);
            false
        }
    }

    /// Lines suppressed since the last call, per reason (zeros left out).
    pub fn take_suppressed(&self) -> Vec<(Reason, u64)> {
        Reason::ALL
            .iter()
            .map(|r| {
                (
                    *r,
                    self.slots[r.index()].suppressed.swap(0, Ordering::AcqRel),
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

impl Default for RateLimitedLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes the periodic "N similar lines suppressed" lines until `shutdown`.
pub async fn report_suppressed(shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(WINDOW);
    // After a stall, one report, not a burst of them in the same minute.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => break,
        }
        for (reason, n) in LOG.take_suppressed() {
            tracing::warn!(
                reason = reason.as_str(),
                suppressed = n,
                "{n} similar log lines suppressed in the last {}s",
                WINDOW.as_secs()
            );
        }
    }
}

/// Lines about a failure that repeats on its own (a watch refused with 403 while RBAC is
/// pending, retried with backoff): at most one per cause per window, the next one saying
/// how many were held back. Causes are few (a watch and an HTTP status); the map is still
/// capped so an unexpected variety of causes cannot grow it.
#[derive(Debug)]
pub struct CauseLog {
    window: Duration,
    causes: std::collections::HashMap<String, (std::time::Instant, u64)>,
}

impl CauseLog {
    const MAX_CAUSES: usize = 64;

    pub fn new(window: Duration) -> Self {
        CauseLog {
            window,
            causes: std::collections::HashMap::new(),
        }
    }

    /// `Some(held back since the last line)` when a line about `cause` may be written at
    /// `now`; `None` (and counted) when one was written less than a window ago.
    pub fn allow(&mut self, cause: &str, now: std::time::Instant) -> Option<u64> {
        if let Some((last, held)) = self.causes.get_mut(cause) {
            if now.saturating_duration_since(*last) < self.window {
                *held += 1;
                return None;
            }
            let n = *held;
            *last = now;
            *held = 0;
            return Some(n);
        }
        if self.causes.len() >= Self::MAX_CAUSES {
            let window = self.window;
            self.causes
                .retain(|_, (last, _)| now.saturating_duration_since(*last) < window);
            if self.causes.len() >= Self::MAX_CAUSES {
                return None;
            }
        }
        self.causes.insert(cause.to_string(), (now, 0));
        Some(0)
    }
}

/// `limited!(Level::WARN, Reason::X, fields..., "message")`: a `tracing` event that goes
/// through [`LOG`] first.
macro_rules! limited {
    ($level:expr, $reason:expr, $($arg:tt)+) => {
        if $crate::proxy::observe::logs::LOG.allow($reason) {
            tracing::event!($level, reason = $reason.as_str(), $($arg)+);
        }
    };
}
pub(crate) use limited;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_has_its_own_allowance_per_window() {
        let l = RateLimitedLog::new();
        let allowed = (0..400)
            .filter(|_| l.allow_at(Reason::UpstreamFailed, 7))
            .count() as u64;
        assert_eq!(allowed, RateLimitedLog::LINES_PER_WINDOW);
        assert!(l.allow_at(Reason::UnknownSni, 7));
        assert_eq!(
            l.take_suppressed(),
            vec![(Reason::UpstreamFailed, 400 - allowed)]
        );
        assert!(l.take_suppressed().is_empty());
        // A new window refills the allowance.
        assert!(l.allow_at(Reason::UpstreamFailed, 8));
    }

    #[test]
    fn a_cause_logs_once_per_window_and_says_what_it_held_back() {
        let t0 = std::time::Instant::now();
        let mut l = CauseLog::new(Duration::from_secs(60));
        assert_eq!(l.allow("mirrors 403 Forbidden", t0), Some(0));
        for i in 1..=100 {
            assert_eq!(
                l.allow("mirrors 403 Forbidden", t0 + Duration::from_millis(i * 500)),
                None
            );
        }
        // Another cause has its own allowance.
        assert_eq!(l.allow("listener 404 NotFound", t0), Some(0));
        let later = t0 + Duration::from_secs(61);
        assert_eq!(l.allow("mirrors 403 Forbidden", later), Some(100));
        assert_eq!(l.allow("mirrors 403 Forbidden", later), None);
        // The map stays bounded whatever the causes.
        for i in 0..1000 {
            l.allow(&format!("cause {i}"), later);
        }
        assert!(l.causes.len() <= CauseLog::MAX_CAUSES);
    }

    #[test]
    fn every_reason_has_a_slot() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
    }
}
