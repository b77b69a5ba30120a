//! The accept loop of each endpoint and the task of each QUIC connection: handshake (within
//! `transport.handshakeTimeoutSeconds`), HTTP/3 setup, one task per request stream, GOAWAY on
//! drain or at `http.maxConnectionAgeSeconds` as its [`super::lifecycle`] decides, transport
//! statistics at the end.
//!
//! A process superseded by a newer generation on its host ([`crate::proxy::handover`]) keeps
//! accepting the rare connection the socket-selection program still sends it (a client's
//! random CID that looks like one of its own): such a *stray* is served, and gets its
//! GOAWAY after its first request (or [`STRAY_GRACE`] without one), so the client moves on
//! to the newest process without a refused request.
//!
//! Every connection attempt passes through `admit`, the one place where the proxy decides
//! what to do with it: a Retry, a refusal at a cap ([`crate::proxy::quic::admission`]), or a handshake.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use quinn::VarInt;
use ring::rand::{SecureRandom, SystemRandom};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info_span, Instrument};

use super::frames;
use super::handler::{self, ConnCtx};
use super::lifecycle::{Action, CloseReason, Event, Lifecycle};
use super::serving::Serving;
use super::streams::{self, ConnStreams, Delivered, StreamHandle, StreamLimits};
use crate::api::{AddressValidationMode, HttpSettings, TransportSettings};
use crate::proxy::observe::metrics::{handshake, limit, Metrics};
use crate::proxy::quic::admission::{Attempt, Policy, Ticket, Verdict};
use crate::proxy::quic::amplification::CLOSING_TTL;
use crate::proxy::quic::cc;
use crate::proxy::quic::shed::Gate;

/// How long a drained connection that has not sent a request yet (a stray of a superseded
/// process, or one whose handshake crossed the drain) may stay before it gets its GOAWAY.
pub const STRAY_GRACE: Duration = Duration::from_secs(2);

/// Decisions the accept loop makes before it lets its worker thread run other tasks.
const YIELD_EVERY: u32 = 64;

/// Accepts connections on `endpoint` until it closes or `stop` is cancelled; each one runs
/// on `tracker` so the drain can wait for them, under the drain token current when it came.
/// Tells `gate` of each decision and of each time it finds no attempt waiting.
pub async fn accept_loop(
    endpoint: quinn::Endpoint,
    gate: Arc<Gate>,
    family: &'static str,
    serving: Arc<Serving>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let mut decided: u32 = 0;
    while !stop.is_cancelled() {
        // An attempt that is ready spends no runtime budget: under a flood this loop would
        // keep its worker thread from every other task.
        decided = decided.wrapping_add(1);
        if decided % YIELD_EVERY == 0 {
            tokio::task::yield_now().await;
        }
        let mut next = std::pin::pin!(endpoint.accept());
        let incoming = match next.as_mut().now_or_never() {
            Some(i) => i,
            None => {
                gate.drained();
                tokio::select! {
                    i = next => i,
                    _ = stop.cancelled() => break,
                }
            }
        };
        let Some(incoming) = incoming else { break };
        admit(incoming, family, &serving, &tracker);
        gate.decided();
    }
}

/// Decides what happens to one connection attempt (a drain stops the accept loop before it
/// gets here): a Retry, a refusal at a cap, or a handshake in its own task on `tracker`.
fn admit(
    incoming: quinn::Incoming,
    family: &'static str,
    serving: &Arc<Serving>,
    tracker: &TaskTracker,
) {
    let gen = serving.current.load();
    let policy = Policy {
        validation: &gen.config.address_validation,
        limits: &gen.config.limits,
    };
    let remote = incoming.remote_address();
    let attempt = Attempt {
        source: remote.ip(),
        validated: incoming.remote_address_validated(),
        may_retry: incoming.may_retry(),
    };
    let m = &serving.metrics;
    let count = |limit: &str, result: &str| {
        m.limits.with_label_values(&[limit]).inc();
        m.handshakes.with_label_values(&[result]).inc();
    };
    if !attempt.validated && !serving.guard.tracks(remote) {
        // Its Initial found the amplification ledger full: no handshake before the address
        // proves itself, since nothing would keep what we send it within 3x. A Retry needs
        // no entry (`quic::amplification`); `never` sends none, so the attempt is dropped.
        m.limits.with_label_values(&[limit::INITIAL_BACKLOG]).inc();
        if attempt.may_retry && policy.validation.mode != AddressValidationMode::Never {
            count(limit::RETRY, handshake::RETRY);
            if let Err(e) = incoming.retry() {
                e.into_incoming().ignore();
            }
        } else {
            incoming.ignore();
        }
        return;
    }
    match serving.admission.decide(policy, attempt) {
        Verdict::Accept(ticket) => {
            if attempt.validated {
                serving.guard.release(remote);
            } else {
                serving.guard.pin(remote);
            }
            let span = info_span!("conn", client = %remote, family);
            let drain = Drain {
                // Its own child: a stray cancels it alone; a drain cancels them all.
                token: serving.drain_token().child_token(),
                close: serving.close_token(),
                stray: serving
                    .superseded
                    .load(std::sync::atomic::Ordering::Relaxed),
            };
            let conn = connection(incoming, ticket, family, serving.clone(), drain);
            tracker.spawn(conn.instrument(span));
        }
        Verdict::Retry(cap) => {
            if let Some(cap) = cap {
                m.limits.with_label_values(&[cap.label()]).inc();
            }
            count(limit::RETRY, handshake::RETRY);
            // `decide` retries only when `may_retry()`, so this cannot fail; refuse if it did.
            if let Err(e) = incoming.retry() {
                e.into_incoming().refuse();
            }
            serving.guard.release(remote);
        }
        Verdict::Refuse(cap) => {
            count(cap.label(), handshake::REFUSED);
            incoming.refuse();
            serving.guard.release(remote);
        }
    }
}

/// Decrements the active-connection gauge however the connection ends.
struct ActiveGuard(prometheus::IntGauge);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn handshake_result(e: &quinn::ConnectionError) -> Option<&'static str> {
    match e {
        quinn::ConnectionError::TimedOut => Some(handshake::TIMEOUT),
        // The SNI resolver has already counted (and logged) an unknown name.
        quinn::ConnectionError::TransportError(t) if t.reason.contains("no server certificate") => {
            None
        }
        _ => Some(handshake::FAILED),
    }
}

fn handshake_failed(m: &Metrics, e: &quinn::ConnectionError) {
    if let Some(result) = handshake_result(e) {
        m.handshakes.with_label_values(&[result]).inc();
    }
    debug!(error = %e, "handshake failed");
}

/// Completes the handshake within `timeout`; `None` when it failed or timed out (counted).
/// Until it completes, `remote` is unvalidated, so the guard keeps limiting what we send it a
/// little longer after a failure (quinn may still send a CONNECTION_CLOSE).
async fn handshake(
    incoming: quinn::Incoming,
    timeout: Duration,
    serving: &Serving,
) -> Option<quinn::Connection> {
    let m = &serving.metrics;
    let remote = incoming.remote_address();
    let failed = || serving.guard.unpin_after(remote, CLOSING_TTL);
    // quinn processes the ClientHello in `accept`, so TLS failures (unknown SNI) land here.
    let connecting = match incoming.accept() {
        Ok(c) => c,
        Err(e) => {
            handshake_failed(m, &e);
            failed();
            return None;
        }
    };
    let conn = match tokio::time::timeout(timeout, connecting).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => {
            handshake_failed(m, &e);
            failed();
            return None;
        }
        Err(_) => {
            // Dropping `connecting` closes the connection.
            m.handshakes.with_label_values(&[handshake::TIMEOUT]).inc();
            m.limits
                .with_label_values(&[limit::HANDSHAKE_TIMEOUT])
                .inc();
            debug!(?timeout, "handshake timed out");
            failed();
            return None;
        }
    };
    serving.guard.release(remote);
    m.handshakes.with_label_values(&[handshake::OK]).inc();
    Some(conn)
}

/// The streams of `conn` under the limits of the configuration current when it started.
fn conn_streams(conn: &quinn::Connection, serving: &Serving) -> Arc<ConnStreams> {
    let gen = serving.current.load();
    let http = &gen.config.http;
    let limits = StreamLimits {
        frames: frames::Limits {
            headers: http.max_field_section_size_bytes.into(),
            control: http.max_control_frame_bytes.into(),
        },
        headers_timeout: Duration::from_secs(http.request_headers_timeout_seconds.into()),
    };
    let budget = serving.budget.connection(&gen.config.limits);
    ConnStreams::new(conn.clone(), serving.metrics.clone(), budget, limits)
}

fn conn_ctx(
    conn: &quinn::Connection,
    remote: SocketAddr,
    family: &'static str,
    serving: &Arc<Serving>,
) -> ConnCtx {
    let sni = conn
        .handshake_data()
        .and_then(|d| d.downcast::<quinn::crypto::rustls::HandshakeData>().ok())
        .and_then(|d| d.server_name)
        .map(|s| s.to_ascii_lowercase());
    let local_ip = conn
        .local_ip()
        .unwrap_or_else(|| std::net::Ipv4Addr::UNSPECIFIED.into());
    ConnCtx {
        serving: serving.clone(),
        family,
        remote,
        local: SocketAddr::new(local_ip, serving.port),
        sni,
        upstream_cache: Mutex::new(None),
        streams: conn_streams(conn, serving),
    }
}

/// When a connection gets its GOAWAY: when `token` is cancelled, or (a stray, accepted by a
/// superseded process) after its first request.
struct Drain {
    token: CancellationToken,
    stray: bool,
    /// Cancelled at a drain deadline: close now.
    close: CancellationToken,
}

/// One connection from handshake to close. `ticket` holds its place in the caps until then.
async fn connection(
    incoming: quinn::Incoming,
    mut ticket: Ticket,
    family: &'static str,
    serving: Arc<Serving>,
    drain: Drain,
) {
    let m = serving.metrics.clone();
    let remote = incoming.remote_address();
    let gen = serving.current.load_full();
    let timeout = Duration::from_secs(gen.config.transport.handshake_timeout_seconds.into());
    let Some(conn) = handshake(incoming, timeout, &serving).await else {
        return;
    };
    ticket.established();
    let gauge = m.active_connections.with_label_values(&[family]);
    gauge.inc();
    let _active = ActiveGuard(gauge);
    let ctx = Arc::new(conn_ctx(&conn, remote, family, &serving));
    debug!(sni = ?ctx.sni, "connection established");

    let max_field = serving
        .current
        .load()
        .config
        .http
        .max_field_section_size_bytes as u64;
    let built = h3::server::builder()
        .max_field_section_size(max_field)
        .build::<_, Bytes>(streams::Connection::new(ctx.streams.clone()))
        .await;
    let life = lifetime(&gen.config.http, &gen.config.transport, jitter());
    match built {
        Ok(h3conn) => serve_requests(h3conn, &conn, ctx, drain, life).await,
        Err(e) => debug!(error = %e, "HTTP/3 setup failed"),
    }
    record_stats(&conn, &m);
}

type H3Conn = h3::server::Connection<streams::Connection, Bytes>;

/// HTTP/3's "no error" code, for closing a connection that reached its maximum age.
const H3_NO_ERROR: u32 = 0x100;

/// How long a connection may live (`http.maxConnectionAgeSeconds`, `None` when 0), how
/// long its requests then get to finish (`http.drainTimeoutSeconds`), and how long it may
/// stay without a request in flight (`transport.idleTimeoutSeconds`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lifetime {
    pub max_age: Option<Duration>,
    pub grace: Duration,
    pub idle: Duration,
}

/// The lifetime of one connection: up to 10 % shorter than the maximum (`jitter` in 0..1), so
/// connections opened together (after a restart) do not all get GOAWAY together.
pub fn lifetime(http: &HttpSettings, transport: &TransportSettings, jitter: f64) -> Lifetime {
    let age = Duration::from_secs(http.max_connection_age_seconds.into());
    Lifetime {
        max_age: (!age.is_zero()).then(|| age.mul_f64(1.0 - 0.1 * jitter.clamp(0.0, 1.0))),
        grace: Duration::from_secs(http.drain_timeout_seconds.into()),
        // The same as QUIC's max_idle_timeout, which our keep-alive PINGs no longer let end
        // an idle connection (`quic::transport`).
        idle: Duration::from_secs(transport.idle_timeout_seconds.into()),
    }
}

fn jitter() -> f64 {
    let mut b = [0u8; 2];
    let _ = SystemRandom::new().fill(&mut b);
    f64::from(u16::from_le_bytes(b)) / 65_536.0
}

/// GOAWAY naming the first request stream not accepted (h3's `shutdown(1)`: the one after
/// the last accepted). From then on the stream layer refuses every newer request stream with
/// H3_REQUEST_REJECTED, that one included (h3 would accept it): a client never retries a
/// request that was processed, and may retry every one that was not.
async fn send_goaway(h3conn: &mut H3Conn, streams: &ConnStreams) {
    streams.refuse_new_requests();
    if let Err(e) = h3conn.shutdown(1).await {
        debug!(error = %e, "sending GOAWAY failed");
    }
}

/// One request, then until the client has its whole response: quinn has only queued it when
/// the handler is done, and a connection closed then (after GOAWAY, its last request done)
/// would lose the response to a request the upstream has processed.
async fn respond(
    resolver: handler::Resolver,
    handle: StreamHandle,
    delivered: Delivered,
    ctx: Arc<ConnCtx>,
) {
    handler::handle(resolver, handle, ctx).await;
    delivered.await;
}

/// Runs every request of one connection under its [`Lifecycle`]: this task turns the drain
/// and close tokens, the timers and h3's events into lifecycle events and carries out what it
/// decides (GOAWAY, timers, closing). Once nothing more is accepted it waits for the requests
/// still in flight, bounded by the grace after the maximum age and by a drain deadline. The
/// idle timer runs from the start and again after each last request in flight; the lifecycle
/// listens to it only while nothing is in flight.
async fn serve_requests(
    mut h3conn: H3Conn,
    conn: &quinn::Connection,
    ctx: Arc<ConnCtx>,
    drain: Drain,
    life: Lifetime,
) {
    let mut requests = JoinSet::new();
    if drain.stray {
        drain.token.cancel();
    }
    let (close, drain) = (drain.close, drain.token);
    let mut lc = Lifecycle::new();
    // Set once the connection reached its maximum age: everything after must end by then.
    let mut deadline: Option<Instant> = None;
    let far = Instant::now() + Duration::from_secs(10 * 365 * 86_400);
    let age = tokio::time::sleep_until(life.max_age.map_or(far, |a| Instant::now() + a));
    let grace_over = tokio::time::sleep_until(far);
    let stray_over = tokio::time::sleep_until(far);
    let idle_over = tokio::time::sleep_until(Instant::now() + life.idle);
    tokio::pin!(age, grace_over, stray_over, idle_over);
    while lc.accepting() {
        let listen = lc.listening();
        let event = tokio::select! {
            _ = close.cancelled() => Event::CloseNow,
            _ = drain.cancelled(), if listen.drain => Event::Drained,
            _ = &mut stray_over, if listen.stray_grace => Event::StrayGraceOver,
            _ = &mut age, if listen.max_age => Event::MaxAge,
            _ = &mut grace_over, if listen.grace => Event::GraceOver,
            _ = &mut idle_over, if listen.idle => Event::IdleOver,
            Some(_) = requests.join_next(), if !requests.is_empty() => Event::Done,
            // Polled after GOAWAY too: the stream layer refuses new requests in it.
            r = h3conn.accept() => match r {
                Ok(Some(resolver)) => {
                    let Some((handle, delivered)) = ctx.streams.take(resolver.frame_stream.id())
                    else {
                        // Every accepted request stream registers one; never reached.
                        continue;
                    };
                    let request = respond(resolver, handle, delivered, ctx.clone());
                    requests.spawn(request.in_current_span());
                    Event::Accepted
                }
                Ok(None) => Event::Ended,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        debug!(error = %e, "connection ended with an error");
                    }
                    Event::Ended
                }
            }
        };
        match lc.step(event) {
            Action::Nothing => {}
            Action::ArmStrayGrace => stray_over.as_mut().reset(Instant::now() + STRAY_GRACE),
            Action::ArmIdle => idle_over.as_mut().reset(Instant::now() + life.idle),
            Action::Goaway => send_goaway(&mut h3conn, &ctx.streams).await,
            Action::GoawayAtMaxAge => {
                let m = &ctx.serving.metrics;
                m.limits.with_label_values(&[limit::CONNECTION_AGE]).inc();
                let d = Instant::now() + life.grace;
                deadline = Some(d);
                grace_over.as_mut().reset(d);
                send_goaway(&mut h3conn, &ctx.streams).await;
            }
            Action::Close(reason) => {
                conn.close(VarInt::from_u32(H3_NO_ERROR), reason.phrase());
                return;
            }
            Action::GoawayAndClose(reason) => {
                debug!("no request in flight for the idle timeout, closing");
                send_goaway(&mut h3conn, &ctx.streams).await;
                conn.close(VarInt::from_u32(H3_NO_ERROR), reason.phrase());
                return;
            }
        }
    }
    // What is left: requests still running when h3 ended (the client's GOAWAY, a connection
    // error), or after GOAWAY, bounded by the grace after the maximum age.
    let finish = async { while requests.join_next().await.is_some() {} };
    tokio::select! {
        _ = finish => {}
        _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {
            debug!("maximum connection age: grace period over, closing");
            conn.close(VarInt::from_u32(H3_NO_ERROR), CloseReason::MaxAge.phrase());
        }
        _ = close.cancelled() => {
            conn.close(VarInt::from_u32(H3_NO_ERROR), CloseReason::DrainDeadline.phrase());
        }
    }
    // Dropping the h3 connection closes it with H3_NO_ERROR.
}

/// Per-connection transport statistics, exported when the connection ends.
fn record_stats(conn: &quinn::Connection, m: &Metrics) {
    let s = conn.stats();
    m.connection_rtt.observe(s.path.rtt.as_secs_f64());
    m.connection_path_mtu.observe(s.path.current_mtu as f64);
    m.connection_lost_packets.inc_by(s.path.lost_packets);
    m.connection_sent_packets.inc_by(s.path.sent_packets);
    // quinn counts every loss event; cubic-hs knows which ones really reduced the window.
    let counters = cc::connection_counters(conn.congestion_state());
    let events = counters.map_or(s.path.congestion_events, |c| c.congestion_events);
    m.connection_congestion_events.inc_by(events);
    m.connection_black_holes.inc_by(s.path.black_holes_detected);
    debug!(
        rtt_ms = s.path.rtt.as_millis() as u64,
        mtu = s.path.current_mtu,
        lost = s.path.lost_packets,
        sent = s.path.sent_packets,
        congestion_events = events,
        forgiven = counters.map_or(0, |c| c.handshake_losses_forgiven),
        tolerated = counters.map_or(0, |c| c.random_losses_tolerated),
        cwnd = s.path.cwnd,
        // Frames we sent saying the client's flow-control window, not the path, held us back.
        data_blocked = s.frame_tx.data_blocked,
        stream_data_blocked = s.frame_tx.stream_data_blocked,
        css_entries = counters.map_or(0, |c| c.css_entries),
        persistent_congestion = counters.map_or(0, |c| c.persistent_congestion),
        app_limited_acks = counters.map_or(0, |c| c.app_limited_acks),
        "connection closed"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maximum_age_is_off_by_default_and_jittered_downwards() {
        let http = HttpSettings::default();
        let transport = TransportSettings::default();
        assert_eq!(
            lifetime(&http, &transport, 0.5),
            Lifetime {
                max_age: None,
                grace: Duration::from_secs(30),
                idle: Duration::from_secs(30),
            }
        );
        let http = HttpSettings {
            max_connection_age_seconds: 1000,
            drain_timeout_seconds: 5,
            ..Default::default()
        };
        let l = |j| {
            lifetime(&http, &transport, j)
                .max_age
                .unwrap()
                .as_secs_f64()
        };
        assert_eq!(l(0.0), 1000.0);
        assert_eq!(l(0.5), 950.0);
        assert!((900.0..901.0).contains(&l(0.9999)));
        assert_eq!(l(7.0), 900.0);
        assert_eq!(
            lifetime(&http, &transport, 0.0).grace,
            Duration::from_secs(5)
        );
        assert!((0.0..1.0).contains(&jitter()));
    }
}
