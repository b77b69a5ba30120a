//! What every connection and request of a running proxy shares: the current configuration
//! [`Generation`] (swapped atomically on reload), the metrics, the buffered-request budget, the
//! caps on attempts and the amplification guard, and the tokens that send GOAWAY to, or
//! close, the connections accepted so far. The server creates it and keeps it in
//! `proxy::state::Shared` beside what only it and the admin endpoint read.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use http::HeaderValue;
use tokio_util::sync::CancellationToken;

use super::budget::Budget;
use crate::config::ProxyConfig;
use crate::proxy::observe::access::AccessLog;
use crate::proxy::observe::metrics::{limit, Metrics};
use crate::proxy::quic::admission::Admission;
use crate::proxy::quic::amplification::Guard;
use crate::proxy::upstream::Upstream;

/// Everything one configuration implies for requests; swapped atomically on reload.
pub struct Generation {
    pub id: u64,
    pub config: ProxyConfig,
    pub upstream: Upstream,
}

pub struct Serving {
    pub current: ArcSwap<Generation>,
    pub metrics: Arc<Metrics>,
    /// The buffered-request budget of the process (`limits.bufferedRequestBytes`).
    pub budget: Arc<Budget>,
    /// The UDP port actually bound (differs from the config only when it asked for 0).
    pub port: u16,
    /// A newer generation takes the new connections (see [`crate::proxy::handover`]).
    pub superseded: AtomicBool,
    /// Cancelled to send GOAWAY on every connection accepted under it; a connection
    /// accepted later gets the next token.
    drain: Mutex<CancellationToken>,
    /// Cancelled to close every connection accepted under it at once (a drain deadline).
    close: Mutex<CancellationToken>,
    /// Handshakes and connections per source, for the caps of `limits`.
    pub admission: Arc<Admission>,
    /// Bytes to and from unvalidated addresses, shared by the sockets of both families.
    pub guard: Arc<Guard>,
    /// The access log (`accessLog.enabled`), following the applied configuration.
    pub access: Arc<AccessLog>,
}

impl Serving {
    /// Serving `first` on `port`.
    pub fn new(first: Generation, metrics: Arc<Metrics>, port: u16) -> Self {
        let admission = Admission::new(metrics.half_open_connections.clone());
        let guard = Guard::new(metrics.limits.with_label_values(&[limit::AMPLIFICATION]));
        let budget = Budget::new(
            first.config.limits.buffered_request_bytes,
            metrics.buffered_request_bytes.clone(),
        );
        let access = Arc::new(AccessLog::start(metrics.access_log_dropped.clone()));
        access.set_enabled(first.config.access_log);
        Self {
            access,
            current: ArcSwap::from_pointee(first),
            metrics,
            budget,
            port,
            superseded: AtomicBool::new(false),
            drain: Mutex::new(CancellationToken::new()),
            close: Mutex::new(CancellationToken::new()),
            admission,
            guard,
        }
    }

    /// The `Alt-Svc` value our responses carry when the upstream sent none.
    pub fn alt_svc_value(&self, gen: &Generation) -> HeaderValue {
        let value = crate::api::altsvc::header_value(self.port, gen.config.alt_svc_max_age);
        HeaderValue::from_str(&value).expect("digits and ASCII are a valid header value")
    }

    /// The drain token a connection accepted now serves under.
    pub fn drain_token(&self) -> CancellationToken {
        self.drain.lock().expect("drain lock").clone()
    }

    /// GOAWAY on every connection accepted so far; later ones get a fresh token.
    pub fn drain_connections(&self) {
        let mut d = self.drain.lock().expect("drain lock");
        d.cancel();
        *d = CancellationToken::new();
    }

    /// The token that closes a connection accepted now.
    pub fn close_token(&self) -> CancellationToken {
        self.close.lock().expect("close lock").clone()
    }

    /// Closes every connection accepted so far (later ones get a fresh token).
    pub fn close_connections(&self) {
        let mut c = self.close.lock().expect("close lock");
        c.cancel();
        *c = CancellationToken::new();
    }
}
