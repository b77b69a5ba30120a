//! Which connection attempts get a handshake: the address-validation policy and the caps of
//! `addressValidation` and `limits`, as a pure decision over counters ([`State::decide`]),
//! and the [`Ticket`] an accepted attempt holds so the counters follow it until it ends.
//!
//! A Retry costs us one small stateless packet and the client one round trip, so it comes
//! first: an unvalidated address is retried in `always` mode, or in `auto` mode while
//! `halfOpenThreshold` handshakes are in progress. Spoofed sources never answer a Retry, so
//! under a spoofed flood at most `halfOpenThreshold` of them hold state (until the handshake
//! timeout).
//!
//! Above a cap, an address that has proven itself is refused (CONNECTION_REFUSED); one that
//! has not gets a Retry instead (unless the mode is `never`). A refusal is what a spoofer
//! would want: sending Initials in the name of someone else's address would get that
//! address refused. A Retry costs the real owner one round trip, and once it comes back
//! validated it is counted apart from the unvalidated attempts made in its name.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::api::{AddressValidationMode, AddressValidationSettings, LimitsSettings};

/// A cap that refused an attempt; `label` is its `h3_ingress_limits_total{limit}` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    HalfOpen,
    HalfOpenPerSource,
    Connections,
    ConnectionsPerSource,
    HandshakeRate,
}

impl Limit {
    pub fn label(self) -> &'static str {
        use crate::proxy::observe::metrics::limit as l;
        match self {
            Limit::HalfOpen => l::HALF_OPEN,
            Limit::HalfOpenPerSource => l::HALF_OPEN_PER_SOURCE,
            Limit::Connections => l::CONNECTIONS,
            Limit::ConnectionsPerSource => l::CONNECTIONS_PER_SOURCE,
            Limit::HandshakeRate => l::HANDSHAKE_RATE,
        }
    }
}

/// What to do with one connection attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Accept,
    /// Ask the client to prove its address first (QUIC Retry): under load, or because of
    /// this cap.
    Retry(Option<Limit>),
    /// CONNECTION_REFUSED, because of this cap.
    Refuse(Limit),
}

/// What the policy needs to know about an attempt.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    pub source: IpAddr,
    /// The client proved its address (a Retry token).
    pub validated: bool,
    /// A Retry is still allowed (it was not retried already).
    pub may_retry: bool,
}

/// The configured policy, taken from the current configuration at each decision.
#[derive(Debug, Clone, Copy)]
pub struct Policy<'a> {
    pub validation: &'a AddressValidationSettings,
    pub limits: &'a LimitsSettings,
}

/// `ip` masked to the configured prefix: the unit the per-source caps count.
pub fn source_key(ip: IpAddr, limits: &LimitsSettings) -> IpAddr {
    fn mask(bits: u32, len: u8) -> u128 {
        let len = u32::from(len).min(bits);
        if len == 0 {
            0
        } else {
            (u128::MAX << (128 - len)) >> (128 - bits)
        }
    }
    match ip.to_canonical() {
        IpAddr::V4(a) => {
            let m = mask(32, limits.source_prefix_length_ipv4) as u32;
            IpAddr::V4(Ipv4Addr::from(u32::from(a) & m))
        }
        IpAddr::V6(a) => {
            let m = mask(128, limits.source_prefix_length_ipv6);
            IpAddr::V6(Ipv6Addr::from(u128::from(a) & m))
        }
    }
}

/// Handshakes started per second, with a burst of one second's worth.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    tokens: f64,
    last: Option<Instant>,
}

impl TokenBucket {
    fn take(&mut self, rate: u32, now: Instant) -> bool {
        let cap = f64::from(rate);
        let refill = match self.last {
            Some(last) => now.duration_since(last).as_secs_f64() * cap,
            None => cap,
        };
        self.tokens = (self.tokens + refill).min(cap);
        self.last = Some(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    /// Handshakes in progress of clients that proved their address.
    half_open_validated: u32,
    /// Handshakes in progress of addresses nobody proved (possibly spoofed).
    half_open_unvalidated: u32,
    /// Connections, established or in handshake.
    connections: u32,
}

impl Count {
    fn half_open(&self, validated: bool) -> u32 {
        if validated {
            self.half_open_validated
        } else {
            self.half_open_unvalidated
        }
    }

    fn half_open_mut(&mut self, validated: bool) -> &mut u32 {
        if validated {
            &mut self.half_open_validated
        } else {
            &mut self.half_open_unvalidated
        }
    }
}

/// The counters every decision reads. Pure: time comes in as an argument.
#[derive(Debug)]
pub struct State {
    half_open: u32,
    connections: u32,
    per_source: HashMap<IpAddr, Count>,
    bucket: TokenBucket,
}

impl Default for State {
    fn default() -> Self {
        Self {
            half_open: 0,
            connections: 0,
            per_source: HashMap::new(),
            bucket: TokenBucket {
                tokens: 0.0,
                last: None,
            },
        }
    }
}

impl State {
    /// Decides on `a` and, when accepted, counts it as a half-open connection of its source.
    pub fn decide(&mut self, p: Policy<'_>, a: Attempt, now: Instant) -> Decision {
        let mode = p.validation.mode;
        // quinn guarantees `may_retry` for an unvalidated address; checked anyway.
        let may_retry = !a.validated && a.may_retry && mode != AddressValidationMode::Never;
        let busy = self.half_open >= p.validation.half_open_threshold;
        if may_retry && (mode == AddressValidationMode::Always || busy) {
            return Decision::Retry(None);
        }
        let key = source_key(a.source, p.limits);
        let source = self.per_source.get(&key).copied().unwrap_or_default();
        if let Some(cap) = self.cap(p.limits, &source, a.validated, now) {
            return if may_retry {
                Decision::Retry(Some(cap))
            } else {
                Decision::Refuse(cap)
            };
        }
        let c = self.per_source.entry(key).or_default();
        *c.half_open_mut(a.validated) += 1;
        c.connections += 1;
        self.half_open += 1;
        self.connections += 1;
        Decision::Accept
    }

    /// The first cap a new handshake from `source` would exceed; takes a token when none.
    fn cap(
        &mut self,
        l: &LimitsSettings,
        source: &Count,
        validated: bool,
        now: Instant,
    ) -> Option<Limit> {
        if self.connections >= l.connections {
            Some(Limit::Connections)
        } else if source.connections >= l.connections_per_source {
            Some(Limit::ConnectionsPerSource)
        } else if self.half_open >= l.half_open_connections {
            Some(Limit::HalfOpen)
        } else if source.half_open(validated) >= l.half_open_connections_per_source {
            Some(Limit::HalfOpenPerSource)
        } else if !self.bucket.take(l.handshakes_per_second, now) {
            Some(Limit::HandshakeRate)
        } else {
            None
        }
    }

    fn established(&mut self, key: IpAddr, validated: bool) {
        self.half_open -= 1;
        if let Some(c) = self.per_source.get_mut(&key) {
            *c.half_open_mut(validated) -= 1;
        }
    }

    fn ended(&mut self, key: IpAddr, half_open: Option<bool>) {
        self.connections -= 1;
        self.half_open -= u32::from(half_open.is_some());
        if let Some(c) = self.per_source.get_mut(&key) {
            c.connections -= 1;
            if let Some(validated) = half_open {
                *c.half_open_mut(validated) -= 1;
            }
            if c.connections == 0 {
                self.per_source.remove(&key);
            }
        }
    }

    pub fn half_open(&self) -> u32 {
        self.half_open
    }

    pub fn connections(&self) -> u32 {
        self.connections
    }

    /// Sources with at least one connection (bounded by `limits.connections`).
    pub fn sources(&self) -> usize {
        self.per_source.len()
    }
}

/// A [`Decision`] with the ticket of an accepted attempt.
#[derive(Debug)]
pub enum Verdict {
    Accept(Ticket),
    Retry(Option<Limit>),
    Refuse(Limit),
}

/// The shared counters, and the gauge of handshakes in progress.
#[derive(Debug)]
pub struct Admission {
    state: Mutex<State>,
    half_open: prometheus::IntGauge,
}

impl Admission {
    pub fn new(half_open: prometheus::IntGauge) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            half_open,
        })
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut s = self.state.lock().expect("admission lock");
        let r = f(&mut s);
        self.half_open.set(i64::from(s.half_open()));
        r
    }

    /// Decides on an attempt; an accepted one comes with its [`Ticket`].
    pub fn decide(self: &Arc<Self>, p: Policy<'_>, a: Attempt) -> Verdict {
        match self.with(|s| s.decide(p, a, Instant::now())) {
            Decision::Accept => Verdict::Accept(Ticket {
                admission: self.clone(),
                key: source_key(a.source, p.limits),
                half_open: Some(a.validated),
            }),
            Decision::Retry(cap) => Verdict::Retry(cap),
            Decision::Refuse(l) => Verdict::Refuse(l),
        }
    }

    /// (half-open, connections, sources) now.
    pub fn snapshot(&self) -> (u32, u32, usize) {
        self.with(|s| (s.half_open(), s.connections(), s.sources()))
    }
}

/// An accepted connection's place in the counters: half-open until [`Ticket::established`],
/// released when dropped, however the connection ends.
#[derive(Debug)]
pub struct Ticket {
    admission: Arc<Admission>,
    key: IpAddr,
    /// While half-open: whether the address was validated.
    half_open: Option<bool>,
}

impl Ticket {
    pub fn established(&mut self) {
        if let Some(validated) = self.half_open.take() {
            self.admission.with(|s| s.established(self.key, validated));
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let (key, half_open) = (self.key, self.half_open);
        self.admission.with(|s| s.ended(key, half_open));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> LimitsSettings {
        LimitsSettings {
            half_open_connections: 4,
            half_open_connections_per_source: 2,
            connections: 6,
            connections_per_source: 3,
            handshakes_per_second: 100,
            ..Default::default()
        }
    }

    fn attempt(ip: &str, validated: bool) -> Attempt {
        Attempt {
            source: ip.parse().unwrap(),
            validated,
            may_retry: !validated,
        }
    }

    fn mode(mode: AddressValidationMode, half_open_threshold: u32) -> AddressValidationSettings {
        AddressValidationSettings {
            mode,
            half_open_threshold,
        }
    }

    #[test]
    fn auto_mode_retries_unvalidated_sources_once_the_threshold_is_reached() {
        let v = mode(AddressValidationMode::Auto, 2);
        let l = limits();
        let p = Policy {
            validation: &v,
            limits: &l,
        };
        let mut s = State::default();
        let t = Instant::now();
        assert_eq!(s.decide(p, attempt("10.0.0.1", false), t), Decision::Accept);
        assert_eq!(s.decide(p, attempt("10.0.0.2", false), t), Decision::Accept);
        // Two handshakes in progress: the next unvalidated source gets a Retry...
        assert_eq!(
            s.decide(p, attempt("10.0.0.3", false), t),
            Decision::Retry(None)
        );
        // ...and once it proves its address, it is accepted.
        assert_eq!(s.decide(p, attempt("10.0.0.3", true), t), Decision::Accept);
        assert_eq!(s.decide(p, attempt("10.0.0.4", true), t), Decision::Accept);
        // The global half-open cap (4) refuses even validated clients.
        assert_eq!(
            s.decide(p, attempt("10.0.0.5", true), t),
            Decision::Refuse(Limit::HalfOpen)
        );
        s.established("10.0.0.1".parse().unwrap(), false);
        assert_eq!(s.decide(p, attempt("10.0.0.5", true), t), Decision::Accept);
        assert_eq!((s.half_open(), s.connections()), (4, 5));
    }

    #[test]
    fn always_and_never() {
        let l = limits();
        let always = mode(AddressValidationMode::Always, 64);
        let never = mode(AddressValidationMode::Never, 1);
        let mut s = State::default();
        let t = Instant::now();
        let p = |v| Policy {
            validation: v,
            limits: &l,
        };
        let retry = Decision::Retry(None);
        assert_eq!(s.decide(p(&always), attempt("10.0.0.1", false), t), retry);
        assert_eq!(
            s.decide(p(&always), attempt("10.0.0.1", true), t),
            Decision::Accept
        );
        assert_eq!(
            s.decide(p(&never), attempt("10.0.0.2", false), t),
            Decision::Accept
        );
        assert_eq!(
            s.decide(p(&never), attempt("10.0.0.2", false), t),
            Decision::Accept
        );
        // Without Retry, a cap refuses unvalidated addresses too.
        assert_eq!(
            s.decide(p(&never), attempt("10.0.0.2", false), t),
            Decision::Refuse(Limit::HalfOpenPerSource)
        );
    }

    #[test]
    fn a_spoofed_flood_in_the_name_of_an_address_does_not_lock_its_owner_out() {
        let v = mode(AddressValidationMode::Auto, 64);
        let l = LimitsSettings {
            half_open_connections: 1000,
            connections: 1000,
            ..limits()
        };
        let p = Policy {
            validation: &v,
            limits: &l,
        };
        let mut s = State::default();
        let t = Instant::now();
        let victim = "192.0.2.7";
        // Spoofed Initials fill the source's unvalidated share, then get Retries, not refusals.
        assert_eq!(s.decide(p, attempt(victim, false), t), Decision::Accept);
        assert_eq!(s.decide(p, attempt(victim, false), t), Decision::Accept);
        let capped = Decision::Retry(Some(Limit::HalfOpenPerSource));
        assert_eq!(s.decide(p, attempt(victim, false), t), capped);
        // The real owner answers the Retry and gets in.
        assert_eq!(s.decide(p, attempt(victim, true), t), Decision::Accept);
        assert_eq!(
            s.decide(p, attempt(victim, true), t),
            Decision::Refuse(Limit::ConnectionsPerSource)
        );
    }

    #[test]
    fn per_source_caps_count_the_prefix() {
        let v = mode(AddressValidationMode::Never, 64);
        let l = LimitsSettings {
            half_open_connections: 100,
            connections: 100,
            ..limits()
        };
        let p = Policy {
            validation: &v,
            limits: &l,
        };
        let mut s = State::default();
        let t = Instant::now();
        // Two addresses of one /64 are one source.
        assert_eq!(
            s.decide(p, attempt("2001:db8::1", true), t),
            Decision::Accept
        );
        assert_eq!(
            s.decide(p, attempt("2001:db8::2", true), t),
            Decision::Accept
        );
        assert_eq!(
            s.decide(p, attempt("2001:db8::3", true), t),
            Decision::Refuse(Limit::HalfOpenPerSource)
        );
        assert_eq!(
            s.decide(p, attempt("2001:db8:1::1", true), t),
            Decision::Accept
        );
        let key = source_key("2001:db8::9".parse().unwrap(), &l);
        s.established(key, true);
        s.established(key, true);
        assert_eq!(
            s.decide(p, attempt("2001:db8::4", true), t),
            Decision::Accept
        );
        // Three connections from the /64: the per-source connection cap.
        assert_eq!(
            s.decide(p, attempt("2001:db8::5", true), t),
            Decision::Refuse(Limit::ConnectionsPerSource)
        );
        s.ended(key, None);
        s.ended(key, None);
        s.ended(key, Some(true));
        assert_eq!((s.sources(), s.connections()), (1, 1));
    }

    #[test]
    fn the_global_connection_cap_and_the_handshake_rate() {
        let v = mode(AddressValidationMode::Auto, 900);
        let l = LimitsSettings {
            half_open_connections: 1000,
            half_open_connections_per_source: 1000,
            connections: 1000,
            connections_per_source: 1000,
            handshakes_per_second: 10,
            ..Default::default()
        };
        let p = Policy {
            validation: &v,
            limits: &l,
        };
        let mut s = State::default();
        let t = Instant::now();
        let accepted = (0..20)
            .filter(|i| s.decide(p, attempt(&format!("10.1.0.{i}"), true), t) == Decision::Accept)
            .count();
        // A burst of one second's worth, then one per 100 ms.
        assert_eq!(accepted, 10);
        assert_eq!(
            s.decide(p, attempt("10.2.0.1", true), t),
            Decision::Refuse(Limit::HandshakeRate)
        );
        assert_eq!(
            s.decide(p, attempt("10.2.0.1", false), t),
            Decision::Retry(Some(Limit::HandshakeRate))
        );
        let later = t + Duration::from_millis(100);
        assert_eq!(
            s.decide(p, attempt("10.2.0.1", true), later),
            Decision::Accept
        );
        let full = LimitsSettings {
            connections: 11,
            ..l.clone()
        };
        let p = Policy {
            validation: &v,
            limits: &full,
        };
        let much_later = t + Duration::from_secs(5);
        assert_eq!(
            s.decide(p, attempt("10.3.0.1", true), much_later),
            Decision::Refuse(Limit::Connections)
        );
    }

    #[test]
    fn tickets_release_their_counts() {
        let a = Admission::new(prometheus::IntGauge::new("g", "g").unwrap());
        let v = AddressValidationSettings::default();
        let l = LimitsSettings::default();
        let p = Policy {
            validation: &v,
            limits: &l,
        };
        let accept = |ip, validated| match a.decide(p, attempt(ip, validated)) {
            Verdict::Accept(t) => t,
            v => panic!("{v:?}"),
        };
        let mut t1 = accept("192.0.2.1", false);
        let t2 = accept("192.0.2.1", true);
        assert_eq!(a.snapshot(), (2, 2, 1));
        assert_eq!(a.half_open.get(), 2);
        t1.established();
        t1.established();
        assert_eq!(a.snapshot(), (1, 2, 1));
        drop(t2);
        assert_eq!(a.snapshot(), (0, 1, 1));
        drop(t1);
        assert_eq!(a.snapshot(), (0, 0, 0));
        assert!(a.with(|s| s.per_source.is_empty()));
    }

    #[test]
    fn source_keys() {
        let l = LimitsSettings {
            source_prefix_length_ipv4: 24,
            source_prefix_length_ipv6: 48,
            ..Default::default()
        };
        let k = |s: &str| source_key(s.parse().unwrap(), &l).to_string();
        assert_eq!(k("192.0.2.77"), "192.0.2.0");
        assert_eq!(k("::ffff:192.0.2.77"), "192.0.2.0");
        assert_eq!(k("2001:db8:1:2:3::1"), "2001:db8:1::");
        let full = LimitsSettings::default();
        assert_eq!(
            source_key("192.0.2.77".parse().unwrap(), &full).to_string(),
            "192.0.2.77"
        );
    }
}
