//! The accept loop of each endpoint and the task of each QUIC connection: handshake, HTTP/3
//! setup, one task per request stream, GOAWAY on drain, transport statistics at the end.
//!
//! Every connection attempt passes through [`admit`], the one place where the proxy decides
//! what to do with it (and where refusing, address validation and limits belong).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info_span, Instrument};

use super::cc;
use super::frames;
use super::handler::{self, ConnCtx};
use super::metrics::{handshake, Metrics};
use super::state::Shared;
use super::streams::{self, ConnStreams, StreamLimits};

/// Accepts connections on `endpoint` until it closes or `drain` is cancelled; each one runs
/// on `tracker` so the drain can wait for them.
pub async fn accept_loop(
    endpoint: quinn::Endpoint,
    family: &'static str,
    shared: Arc<Shared>,
    tracker: TaskTracker,
    drain: CancellationToken,
) {
    loop {
        let incoming = tokio::select! {
            i = endpoint.accept() => i,
            _ = drain.cancelled() => break,
        };
        let Some(incoming) = incoming else { break };
        admit(incoming, family, &shared, &tracker, &drain);
    }
}

/// Decides what happens to one connection attempt. Today every attempt is accepted (a drain
/// stops the accept loop before it gets here) and runs as its own task on `tracker`.
fn admit(
    incoming: quinn::Incoming,
    family: &'static str,
    shared: &Arc<Shared>,
    tracker: &TaskTracker,
    drain: &CancellationToken,
) {
    let span = info_span!("conn", client = %incoming.remote_address(), family);
    let conn = connection(incoming, family, shared.clone(), drain.clone());
    tracker.spawn(conn.instrument(span));
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

/// Completes the handshake; `None` when it failed (counted).
async fn handshake(incoming: quinn::Incoming, m: &Metrics) -> Option<quinn::Connection> {
    // quinn processes the ClientHello in `accept`, so TLS failures (unknown SNI) land here.
    let connecting = incoming
        .accept()
        .map_err(|e| handshake_failed(m, &e))
        .ok()?;
    let conn = connecting.await.map_err(|e| handshake_failed(m, &e)).ok()?;
    m.handshakes.with_label_values(&[handshake::OK]).inc();
    Some(conn)
}

/// The streams of `conn` under the limits of the configuration current when it started.
fn conn_streams(conn: &quinn::Connection, shared: &Shared) -> Arc<ConnStreams> {
    let gen = shared.current.load();
    let http = &gen.config.http;
    let limits = StreamLimits {
        frames: frames::Limits {
            headers: http.max_field_section_size_bytes.into(),
            control: http.max_control_frame_bytes.into(),
        },
        headers_timeout: Duration::from_secs(http.request_headers_timeout_seconds.into()),
    };
    let budget = shared.budget.connection(&gen.config.limits);
    ConnStreams::new(conn.clone(), shared.metrics.clone(), budget, limits)
}

fn conn_ctx(
    conn: &quinn::Connection,
    remote: SocketAddr,
    family: &'static str,
    shared: &Arc<Shared>,
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
        shared: shared.clone(),
        family,
        remote,
        local: SocketAddr::new(local_ip, shared.port),
        sni,
        upstream_cache: Mutex::new(None),
        streams: conn_streams(conn, shared),
    }
}

async fn connection(
    incoming: quinn::Incoming,
    family: &'static str,
    shared: Arc<Shared>,
    drain: CancellationToken,
) {
    let m = shared.metrics.clone();
    let remote = incoming.remote_address();
    let Some(conn) = handshake(incoming, &m).await else {
        return;
    };
    let gauge = m.active_connections.with_label_values(&[family]);
    gauge.inc();
    let _active = ActiveGuard(gauge);
    let ctx = Arc::new(conn_ctx(&conn, remote, family, &shared));
    debug!(sni = ?ctx.sni, "connection established");

    let max_field = shared
        .current
        .load()
        .config
        .http
        .max_field_section_size_bytes as u64;
    let built = h3::server::builder()
        .max_field_section_size(max_field)
        .build::<_, Bytes>(streams::Connection::new(ctx.streams.clone()))
        .await;
    match built {
        Ok(h3conn) => serve_requests(h3conn, &conn, ctx, drain).await,
        Err(e) => debug!(error = %e, "HTTP/3 setup failed"),
    }
    record_stats(&conn, &m);
}

type H3Conn = h3::server::Connection<streams::Connection, Bytes>;

/// Runs every request of one connection; on drain sends GOAWAY and lets them finish.
async fn serve_requests(
    mut h3conn: H3Conn,
    conn: &quinn::Connection,
    ctx: Arc<ConnCtx>,
    drain: CancellationToken,
) {
    let mut requests = JoinSet::new();
    let mut goaway_sent = false;
    // Responses finished during the drain may still sit unacknowledged in quinn's send
    // buffer; closing the connection then would cut them off.
    let mut wait_for_client_close = false;
    loop {
        tokio::select! {
            _ = drain.cancelled(), if !goaway_sent => {
                goaway_sent = true;
                if let Err(e) = h3conn.shutdown(0).await {
                    debug!(error = %e, "sending GOAWAY failed");
                }
                if requests.is_empty() {
                    break;
                }
                wait_for_client_close = true;
            }
            Some(_) = requests.join_next(), if !requests.is_empty() => {
                if goaway_sent && requests.is_empty() {
                    break;
                }
            }
            r = h3conn.accept() => match r {
                Ok(Some(resolver)) => {
                    let Some(handle) = ctx.streams.take(resolver.frame_stream.id()) else {
                        // Every accepted request stream registers one; never reached.
                        continue;
                    };
                    let request = handler::handle(resolver, handle, ctx.clone());
                    requests.spawn(request.in_current_span());
                }
                Ok(None) => break,
                Err(e) => {
                    if !e.is_h3_no_error() {
                        debug!(error = %e, "connection ended with an error");
                    }
                    break;
                }
            }
        }
    }
    // Requests already accepted finish (the drain deadline bounds this from outside);
    // dropping the h3 connection closes it with H3_NO_ERROR.
    while requests.join_next().await.is_some() {}
    if wait_for_client_close {
        // The client closes once it has everything (GOAWAY told it to); the global drain
        // deadline closes the endpoint if it never does.
        debug!("drain: responses complete, waiting for the client to close");
        let _ = h3conn.accept().await;
        conn.closed().await;
    }
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
        "connection closed"
    );
}
