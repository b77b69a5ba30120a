//! When a connection sends GOAWAY and when it closes: the rules that make restarts, rollouts
//! and `http.maxConnectionAgeSeconds` hitless, as a pure state machine. The connection task
//! ([`super::connection`]) turns its timers, tokens and h3 events into [`Event`]s and carries
//! out the [`Action`]s; everything it decides is here and unit-tested without a connection.
//!
//! - A drained connection sends GOAWAY, lets the requests in flight finish and closes once
//!   their responses are out; a client may ignore the GOAWAY, so nothing waits for it.
//! - A connection drained before its first request (its handshake crossed the drain, or a
//!   *stray* that a superseded process accepted) sends GOAWAY after that request or at the end
//!   of the stray grace without one: a GOAWAY before it would refuse the request the client has
//!   most likely just sent.
//! - At its maximum age a connection sends GOAWAY and its requests get the drain grace; at
//!   the end of it the connection closes whatever remains.
//! - A drain deadline closes the connection at once.
//! - A connection with no request in flight for `transport.idleTimeoutSeconds` sends GOAWAY
//!   and closes. QUIC's own idle timeout cannot do this: the server's keep-alive PINGs
//!   (`quic::transport`), which keep a connection whose request waits long upstream alive,
//!   are ACKed, so at the transport level such a connection is never idle.

/// Where a connection is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Serving requests; no GOAWAY due.
    Open,
    /// Drained before its first request: GOAWAY after it, or when the stray grace is over.
    GoawayDue,
    /// GOAWAY sent: the requests in flight finish; the stream layer refuses newer ones.
    GoingAway,
    /// Nothing more will be accepted: the task waits for the requests still in flight (until
    /// the grace deadline, if the maximum age set one), then ends.
    Finishing,
    /// Closed at once.
    Closed,
}

/// What happened to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The process drains: every connection it accepted so far is to go.
    Drained,
    /// The stray grace armed by [`Action::ArmStrayGrace`] is over.
    StrayGraceOver,
    /// The connection reached its maximum age.
    MaxAge,
    /// The grace after the maximum age is over.
    GraceOver,
    /// h3 handed over a request, now in flight.
    Accepted,
    /// A request in flight finished (its response reached the client).
    Done,
    /// h3 will hand over no more requests (the client closed, or the connection failed).
    Ended,
    /// The drain deadline: close now.
    CloseNow,
    /// No request has been in flight for the idle timeout (armed by [`Action::ArmIdle`], and
    /// by the task at the start).
    IdleOver,
}

/// Why a connection is closed at once (the reason phrase of its CONNECTION_CLOSE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    DrainDeadline,
    MaxAge,
    IdleTimeout,
}

impl CloseReason {
    pub fn phrase(self) -> &'static [u8] {
        match self {
            CloseReason::DrainDeadline => b"drain deadline",
            CloseReason::MaxAge => b"maximum connection age",
            CloseReason::IdleTimeout => b"idle timeout",
        }
    }
}

/// What the connection task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Nothing,
    /// Arm the stray grace ([`Event::StrayGraceOver`] when it ends).
    ArmStrayGrace,
    /// Send GOAWAY.
    Goaway,
    /// Count the maximum age, arm the grace deadline ([`Event::GraceOver`]), send GOAWAY.
    GoawayAtMaxAge,
    /// Close the connection now.
    Close(CloseReason),
    /// (Re)arm the idle timer ([`Event::IdleOver`] when it ends): the last request in flight
    /// is done.
    ArmIdle,
    /// Send GOAWAY, then close the connection now: nothing is in flight, so the GOAWAY only
    /// tells a client whose request crosses the close that it was not processed.
    GoawayAndClose(CloseReason),
}

/// Which events the task should wait for now, besides requests, h3 and the drain deadline
/// (always).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listening {
    pub drain: bool,
    pub stray_grace: bool,
    pub max_age: bool,
    pub grace: bool,
    /// The idle timer: only while nothing is in flight, so a request that is accepted
    /// stops it without an action of its own.
    pub idle: bool,
}

/// One connection's lifecycle.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    phase: Phase,
    served: bool,
    in_flight: usize,
    grace_armed: bool,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Self::new()
    }
}

impl Lifecycle {
    pub fn new() -> Self {
        Lifecycle {
            phase: Phase::Open,
            served: false,
            in_flight: 0,
            grace_armed: false,
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether the task should still accept requests from h3.
    pub fn accepting(&self) -> bool {
        matches!(
            self.phase,
            Phase::Open | Phase::GoawayDue | Phase::GoingAway
        )
    }

    pub fn listening(&self) -> Listening {
        Listening {
            drain: self.phase == Phase::Open,
            stray_grace: self.phase == Phase::GoawayDue,
            max_age: matches!(self.phase, Phase::Open | Phase::GoawayDue),
            grace: self.grace_armed && self.phase != Phase::Closed,
            idle: self.idle_may_close(),
        }
    }

    /// Whether the idle timer may close the connection now: nothing in flight, and no GOAWAY
    /// sent (after one the connection finishes by itself once nothing is in flight).
    fn idle_may_close(&self) -> bool {
        self.in_flight == 0 && matches!(self.phase, Phase::Open | Phase::GoawayDue)
    }

    /// GOAWAY is (about to be) sent: finish now if nothing is in flight.
    fn going_away(&mut self) {
        self.phase = if self.in_flight == 0 {
            Phase::Finishing
        } else {
            Phase::GoingAway
        };
    }

    /// The next action for `event`. Events the current phase does not listen for change
    /// nothing.
    pub fn step(&mut self, event: Event) -> Action {
        if self.phase == Phase::Closed {
            return Action::Nothing;
        }
        match event {
            Event::CloseNow => {
                self.phase = Phase::Closed;
                Action::Close(CloseReason::DrainDeadline)
            }
            Event::GraceOver if self.grace_armed => {
                self.phase = Phase::Closed;
                Action::Close(CloseReason::MaxAge)
            }
            Event::Drained if self.phase == Phase::Open => {
                if self.served {
                    self.going_away();
                    Action::Goaway
                } else {
                    self.phase = Phase::GoawayDue;
                    Action::ArmStrayGrace
                }
            }
            Event::StrayGraceOver if self.phase == Phase::GoawayDue => {
                self.going_away();
                Action::Goaway
            }
            Event::MaxAge if matches!(self.phase, Phase::Open | Phase::GoawayDue) => {
                self.grace_armed = true;
                self.going_away();
                Action::GoawayAtMaxAge
            }
            Event::IdleOver if self.idle_may_close() => {
                self.phase = Phase::Closed;
                Action::GoawayAndClose(CloseReason::IdleTimeout)
            }
            Event::Accepted => self.accepted(),
            Event::Done => self.done(),
            Event::Ended => {
                if self.accepting() {
                    self.phase = Phase::Finishing;
                }
                Action::Nothing
            }
            _ => Action::Nothing,
        }
    }

    fn done(&mut self) -> Action {
        let was = self.in_flight;
        self.in_flight = was.saturating_sub(1);
        if self.phase == Phase::GoingAway && self.in_flight == 0 {
            self.phase = Phase::Finishing;
        }
        if was == 1 && self.idle_may_close() {
            // The idle time counts from the last response's delivery, not from the first
            // request: a busy connection must not be closed between two requests.
            Action::ArmIdle
        } else {
            Action::Nothing
        }
    }

    fn accepted(&mut self) -> Action {
        self.in_flight += 1;
        self.served = true;
        if self.phase == Phase::GoawayDue {
            // Its first request is in: now the GOAWAY refuses nothing the client sent.
            self.phase = Phase::GoingAway;
            Action::Goaway
        } else {
            Action::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(events: &[Event]) -> (Lifecycle, Vec<Action>) {
        let mut l = Lifecycle::new();
        let actions = events.iter().map(|e| l.step(*e)).collect();
        (l, actions)
    }

    #[test]
    fn a_drained_connection_sends_goaway_and_finishes_when_its_requests_are_done() {
        use Event::*;
        let (l, a) = run(&[Accepted, Accepted, Drained, Done]);
        assert_eq!(
            a,
            [
                Action::Nothing,
                Action::Nothing,
                Action::Goaway,
                Action::Nothing
            ]
        );
        assert_eq!(l.phase(), Phase::GoingAway);
        assert!(
            l.accepting(),
            "h3 may still hand over a request below the GOAWAY's ID"
        );
        let mut l = l;
        assert_eq!(l.step(Done), Action::Nothing);
        assert_eq!(l.phase(), Phase::Finishing);
        assert!(!l.accepting());
    }

    #[test]
    fn an_idle_served_connection_finishes_at_once_on_drain() {
        use Event::*;
        let (l, a) = run(&[Accepted, Done, Drained]);
        assert_eq!(a[2], Action::Goaway);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn a_fresh_connection_gets_its_goaway_after_its_first_request() {
        use Event::*;
        let (mut l, a) = run(&[Drained]);
        assert_eq!(a, [Action::ArmStrayGrace]);
        assert_eq!(l.phase(), Phase::GoawayDue);
        assert!(!l.listening().drain && l.listening().stray_grace);
        assert_eq!(l.step(Drained), Action::Nothing, "one drain is enough");
        assert_eq!(l.step(Accepted), Action::Goaway);
        assert_eq!(l.phase(), Phase::GoingAway);
        assert_eq!(
            l.step(StrayGraceOver),
            Action::Nothing,
            "GOAWAY already sent"
        );
        assert_eq!(l.step(Done), Action::Nothing);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn a_fresh_connection_without_a_request_gets_its_goaway_when_the_grace_ends() {
        use Event::*;
        let (l, a) = run(&[Drained, StrayGraceOver]);
        assert_eq!(a, [Action::ArmStrayGrace, Action::Goaway]);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn the_maximum_age_sends_goaway_then_the_grace_closes_what_remains() {
        use Event::*;
        let (mut l, a) = run(&[Accepted, MaxAge]);
        assert_eq!(a[1], Action::GoawayAtMaxAge);
        assert_eq!(l.phase(), Phase::GoingAway);
        let listen = l.listening();
        assert!(listen.grace && !listen.max_age && !listen.drain);
        assert_eq!(l.step(Drained), Action::Nothing, "GOAWAY already sent");
        assert_eq!(l.step(GraceOver), Action::Close(CloseReason::MaxAge));
        assert_eq!(l.phase(), Phase::Closed);
        assert_eq!(l.step(Done), Action::Nothing);
        assert_eq!(l.phase(), Phase::Closed);
    }

    #[test]
    fn the_maximum_age_of_an_idle_connection_finishes_it_but_keeps_the_grace() {
        use Event::*;
        let (l, a) = run(&[MaxAge]);
        assert_eq!(a, [Action::GoawayAtMaxAge]);
        assert_eq!(l.phase(), Phase::Finishing);
        assert!(
            l.listening().grace,
            "the wait for stragglers is bounded by it"
        );
    }

    #[test]
    fn the_maximum_age_also_ends_a_pending_stray_grace() {
        use Event::*;
        let (l, a) = run(&[Drained, MaxAge]);
        assert_eq!(a, [Action::ArmStrayGrace, Action::GoawayAtMaxAge]);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn the_drain_deadline_closes_in_every_phase() {
        use Event::*;
        for prefix in [
            &[][..],
            &[Drained][..],
            &[Accepted, Drained][..],
            &[Accepted, MaxAge][..],
            &[Ended][..],
        ] {
            let (mut l, _) = run(prefix);
            assert_eq!(
                l.step(CloseNow),
                Action::Close(CloseReason::DrainDeadline),
                "{prefix:?}"
            );
            assert_eq!(l.phase(), Phase::Closed);
            assert_eq!(l.step(CloseNow), Action::Nothing);
        }
    }

    #[test]
    fn when_h3_ends_the_connection_finishes_what_it_accepted() {
        use Event::*;
        let (mut l, _) = run(&[Accepted, Ended]);
        assert_eq!(l.phase(), Phase::Finishing);
        assert!(!l.listening().drain && !l.listening().max_age);
        assert_eq!(l.step(Done), Action::Nothing);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn a_connection_with_nothing_in_flight_closes_when_the_idle_timer_ends() {
        use Event::*;
        let (mut l, _) = run(&[]);
        assert!(l.listening().idle, "armed from the start");
        assert_eq!(
            l.step(IdleOver),
            Action::GoawayAndClose(CloseReason::IdleTimeout)
        );
        assert_eq!(l.phase(), Phase::Closed);
        assert!(!l.accepting());
        assert_eq!(CloseReason::IdleTimeout.phrase(), b"idle timeout");
    }

    #[test]
    fn the_idle_timer_stops_while_a_request_is_in_flight_and_rearms_after_the_last() {
        use Event::*;
        let (mut l, a) = run(&[Accepted, Accepted]);
        assert_eq!(a, [Action::Nothing, Action::Nothing]);
        assert!(!l.listening().idle, "a request is in flight");
        assert_eq!(l.step(IdleOver), Action::Nothing, "a timer that fired late");
        assert_eq!(l.phase(), Phase::Open);
        assert_eq!(l.step(Done), Action::Nothing, "one still in flight");
        assert!(!l.listening().idle);
        assert_eq!(l.step(Done), Action::ArmIdle);
        assert!(l.listening().idle);
        assert_eq!(l.step(Accepted), Action::Nothing);
        assert!(!l.listening().idle, "accepting a request stops it again");
        assert_eq!(l.step(Done), Action::ArmIdle);
        assert_eq!(
            l.step(IdleOver),
            Action::GoawayAndClose(CloseReason::IdleTimeout)
        );
    }

    #[test]
    fn after_goaway_the_idle_timer_is_not_needed() {
        use Event::*;
        let (mut l, a) = run(&[Accepted, Drained]);
        assert_eq!(a[1], Action::Goaway);
        assert!(!l.listening().idle);
        assert_eq!(l.step(IdleOver), Action::Nothing);
        assert_eq!(
            l.step(Done),
            Action::Nothing,
            "no timer: the connection finishes now"
        );
        assert_eq!(l.phase(), Phase::Finishing);
        let (mut l, _) = run(&[MaxAge]);
        assert!(!l.listening().idle);
        assert_eq!(l.step(IdleOver), Action::Nothing);
        assert_eq!(l.phase(), Phase::Finishing);
    }

    #[test]
    fn a_drained_connection_without_a_request_also_goes_at_the_idle_timeout() {
        use Event::*;
        let (mut l, _) = run(&[Drained]);
        assert!(l.listening().idle && l.listening().stray_grace);
        assert_eq!(
            l.step(IdleOver),
            Action::GoawayAndClose(CloseReason::IdleTimeout)
        );
        assert_eq!(l.phase(), Phase::Closed);
    }

    #[test]
    fn grace_over_without_a_maximum_age_is_ignored() {
        let (l, a) = run(&[Event::GraceOver]);
        assert_eq!(a, [Action::Nothing]);
        assert_eq!(l.phase(), Phase::Open);
    }
}
