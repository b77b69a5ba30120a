//! One HTTP/3 request, in phases: resolve the headers, route (validate and match a configured
//! host), take the body, forward to the TCP ingress, send the response head, relay the
//! response body. Every phase works on one `RequestCtx`, which carries what the request
//! has established so far; the body pumps are in [`super::body`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h3::error::Code;
use http::{header, Response, StatusCode};
use tracing::{debug, Level};

use super::body::{self, Abort, AbortReason, BodyCtx, BodyError, RecvHalf, ResponseEnd, SendHalf};
use super::budget::{Reservation, StreamShare};
use super::request::{self, Reject, Validated};
use super::serving::{Generation, Serving};
use super::streams::{self, ConnStreams, StreamHandle};
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::metrics::{self, limit, rejected, OTHER_HOST};
use crate::proxy::upstream::{Upstream, UpstreamBody, UpstreamLease};

/// Per QUIC connection facts every request on it shares.
pub struct ConnCtx {
    pub serving: Arc<Serving>,
    pub family: &'static str,
    pub remote: SocketAddr,
    pub local: SocketAddr,
    /// SNI of the handshake, lowercase.
    pub sni: Option<String>,
    /// PROXY protocol needs one upstream client per QUIC connection; cached per generation.
    pub upstream_cache: Mutex<Option<(u64, Upstream)>>,
    /// The connection's streams under h3, and what each request takes over from them.
    pub streams: Arc<ConnStreams>,
}

impl ConnCtx {
    fn upstream(&self, gen: &Generation) -> Upstream {
        if !gen.config.upstream.proxy_protocol {
            return gen.upstream.clone();
        }
        let mut cache = self.upstream_cache.lock().expect("upstream cache lock");
        match &*cache {
            Some((id, u)) if *id == gen.id => u.clone(),
            _ => {
                let u = gen.upstream.for_connection(self.remote, self.local);
                *cache = Some((gen.id, u.clone()));
                u
            }
        }
    }
}

/// A request answered locally, before it reaches the upstream: why (the `reason` label), the
/// status and a message naming the problem.
struct Refusal {
    reason: &'static str,
    status: StatusCode,
    msg: String,
    /// The STOP_SENDING code for the rest of the request body.
    stop: Code,
}

impl Refusal {
    fn new(reason: &'static str, status: StatusCode, msg: String) -> Self {
        Refusal {
            reason,
            status,
            msg,
            // RFC 9114 4.1.2: H3_NO_ERROR once a complete response is sent.
            stop: Code::H3_NO_ERROR,
        }
    }

    fn malformed(msg: String) -> Self {
        Self::new(rejected::MALFORMED, StatusCode::BAD_REQUEST, msg)
    }
}

type Stream = h3::server::RequestStream<streams::RequestStream, Bytes>;
pub type Resolver = h3::server::RequestResolver<streams::Connection, Bytes>;

/// What one request has established so far, passed through its phases.
struct RequestCtx {
    conn: Arc<ConnCtx>,
    /// The configuration the request is served under, fixed when its headers arrived.
    gen: Arc<Generation>,
    started: Instant,
    /// The `host` metrics label: `other` until the request is matched to a configured host.
    host: String,
    /// What validation found; set by [`RequestCtx::route`].
    validated: Option<Validated>,
    send: SendHalf,
    /// The request body's half of the stream, until a streaming body pump takes it.
    recv: Option<RecvHalf>,
    /// Fired, with a reason, when a streamed request body fails.
    abort: Arc<Abort>,
    /// Resolves when the client stops reading the response or its connection ends.
    stopped: streams::Stopped,
    share: Arc<StreamShare>,
    /// The read-ahead body's bytes, held until the request ends.
    reserved: Option<Reservation>,
    /// The request's place on its upstream connection, held until the request ends.
    lease: Option<UpstreamLease>,
}

/// Handles one request stream from `resolve_request` to the last byte.
pub async fn handle(resolver: Resolver, handle: StreamHandle, conn: Arc<ConnCtx>) {
    let Some((req, stream)) = resolve(resolver, &handle, &conn).await else {
        return;
    };
    let mut ctx = RequestCtx::new(conn, stream, handle);
    if let Err(r) = ctx.route(&req) {
        return ctx.refuse(r).await;
    }
    let upstream = ctx.conn.upstream(&ctx.gen);
    let parts = match ctx.upstream_parts(&req, &upstream) {
        Ok(p) => p,
        Err(r) => return ctx.refuse(r).await,
    };
    let Some((body, sent)) = ctx.body().await else {
        return;
    };
    let req = http::Request::from_parts(parts, body);
    let Some(resp) = ctx.forward(&upstream, req, sent).await else {
        return;
    };
    let (head, mut body) = resp.into_parts();
    if ctx.send_head(head).await {
        ctx.relay(&mut body, upstream.body_idle_timeout()).await;
    }
}

/// Phase 1: the request headers. h3 has already answered when they are unusable (431 for an
/// oversized field section, H3_MESSAGE_ERROR for a malformed one), and the stream layer has
/// reset streams it refused (too long a frame, too slow a header section, no budget, each
/// counted there); only this stream fails.
async fn resolve(
    resolver: Resolver,
    handle: &StreamHandle,
    conn: &ConnCtx,
) -> Option<(http::Request<()>, Stream)> {
    match resolver.resolve_request().await {
        Ok(r) => Some(r),
        Err(e) => {
            if let Some(why) = handle.refused.get() {
                debug!(client = %conn.remote, %why, "request stream refused");
                return None;
            }
            let reason = if matches!(e, h3::error::StreamError::HeaderTooBig { .. }) {
                rejected::HEADERS_TOO_LARGE
            } else {
                rejected::MALFORMED
            };
            let m = &conn.serving.metrics;
            m.rejected_requests.with_label_values(&[reason]).inc();
            debug!(client = %conn.remote, error = %e, "request refused by the HTTP/3 layer");
            None
        }
    }
}

impl RequestCtx {
    fn new(conn: Arc<ConnCtx>, stream: Stream, handle: StreamHandle) -> Self {
        let (send, recv) = stream.split();
        RequestCtx {
            gen: conn.serving.current.load_full(),
            conn,
            started: Instant::now(),
            host: OTHER_HOST.to_string(),
            validated: None,
            send,
            recv: Some(recv),
            abort: Arc::new(Abort::default()),
            stopped: handle.stopped,
            share: handle.share,
            reserved: None,
            lease: None,
        }
    }

    fn metrics(&self) -> &metrics::Metrics {
        &self.conn.serving.metrics
    }

    /// Phase 2: the request must be valid and name a configured host, and one whose
    /// certificate is the one this connection was set up with: otherwise 421, so the client
    /// retries on a fresh connection (or drops a stale Alt-Svc entry).
    fn route(&mut self, req: &http::Request<()>) -> Result<(), Refusal> {
        let v = request::validate(req).map_err(|Reject::Malformed(msg)| {
            debug!(client = %self.conn.remote, %msg, "malformed request");
            Refusal::malformed(msg)
        })?;
        let hosts = &self.gen.config.hosts;
        let entry = hosts.lookup(&v.host);
        let conn_entry = self.conn.sni.as_deref().and_then(|s| hosts.lookup(s));
        match (entry, conn_entry) {
            (Some(e), Some(c)) if Arc::ptr_eq(e, c) => self.host = e.name.clone(),
            _ => {
                return Err(Refusal::new(
                    rejected::MISDIRECTED,
                    StatusCode::MISDIRECTED_REQUEST,
                    format!("{} is not served on this connection", v.host),
                ))
            }
        }
        self.validated = Some(v);
        Ok(())
    }

    fn validated(&self) -> &Validated {
        self.validated.as_ref().expect("routed before")
    }

    /// Phase 3a: the upstream request's head.
    fn upstream_parts(
        &self,
        req: &http::Request<()>,
        upstream: &Upstream,
    ) -> Result<http::request::Parts, Refusal> {
        request::upstream_parts(req, self.validated(), self.conn.remote, upstream.scheme())
            .map_err(|Reject::Malformed(msg)| Refusal::malformed(msg))
    }

    /// Phase 3b: the upstream request's body, and the token that says it was all sent;
    /// `None` when the request ended here. A body read ahead is reserved against the
    /// buffered-request budget first: when that is exhausted, 503 and H3_REQUEST_REJECTED.
    async fn body(&mut self) -> Option<(UpstreamBody, tokio_util::sync::CancellationToken)> {
        let declared = self.validated().content_length;
        if let Some(n) = body::reads_ahead(declared) {
            match self.share.reserve(n) {
                Ok(r) => self.reserved = Some(r),
                Err(e) => {
                    self.metrics().limit(e.limit());
                    limited!(Level::WARN, Reason::RequestBudget, host = %self.host, "refusing a request: {e}");
                    let mut r = Refusal::new(
                        rejected::OVERLOADED,
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("{e}; retry later"),
                    );
                    r.stop = Code::H3_REQUEST_REJECTED;
                    self.refuse(r).await;
                    return None;
                }
            }
        }
        let c = BodyCtx {
            declared,
            idle: self.body_idle_timeout(),
            abort: self.abort.clone(),
            metrics: self.conn.serving.metrics.clone(),
            client: self.conn.remote,
        };
        match body::request_body(&mut self.recv, c).await {
            Ok(b) => Some(b),
            Err(BodyError::LengthMismatch(msg)) => {
                let r = Refusal::new(rejected::CONTENT_LENGTH, StatusCode::BAD_REQUEST, msg);
                self.refuse(r).await;
                None
            }
            Err(BodyError::Idle(idle)) => {
                self.metrics().limit(limit::REQUEST_BODY_IDLE_TIMEOUT);
                let msg = format!("the request body made no progress for {idle:?}");
                self.stop_body(Code::H3_NO_ERROR);
                self.finish_local(StatusCode::REQUEST_TIMEOUT, &msg).await;
                None
            }
            Err(BodyError::Client(e)) => {
                debug!(client = %self.conn.remote, error = %e, "client abandoned the request body");
                None
            }
        }
    }

    fn body_idle_timeout(&self) -> Duration {
        Duration::from_secs(
            self.gen
                .config
                .http
                .request_body_idle_timeout_seconds
                .into(),
        )
    }

    /// Phase 4: the request to the TCP ingress; its failures are answered here (502, 504),
    /// and so is a streamed body that failed before the response (408, 400). When the client
    /// resets, stops reading or leaves, the upstream request is dropped at once.
    async fn forward(
        &mut self,
        upstream: &Upstream,
        req: http::Request<UpstreamBody>,
        sent: tokio_util::sync::CancellationToken,
    ) -> Option<http::Response<hyper::body::Incoming>> {
        let abort = self.abort.clone();
        let result = tokio::select! {
            r = upstream.send(req, sent) => r,
            why = abort.aborted() => {
                self.aborted_before_response(why).await;
                return None;
            }
            _ = self.stopped.as_mut() => {
                debug!(client = %self.conn.remote, "client left before the response; dropping the upstream request");
                return None;
            }
        };
        match result {
            Ok((r, lease)) => {
                self.lease = Some(lease);
                Some(r)
            }
            Err(e) => {
                let m = self.metrics();
                m.upstream_errors
                    .with_label_values(&[e.metric_kind()])
                    .inc();
                if matches!(e, crate::proxy::upstream::UpstreamError::Timeout(_)) {
                    m.limit(limit::RESPONSE_TIMEOUT);
                }
                limited!(Level::WARN, Reason::UpstreamFailed, host = %self.host, error = %e, "upstream request failed");
                self.finish_local(e.status(), &e.to_string()).await;
                None
            }
        }
    }

    /// A streamed request body failed before the upstream answered.
    async fn aborted_before_response(&mut self, why: AbortReason) {
        let status = match &why {
            AbortReason::ClientReset => {
                debug!(client = %self.conn.remote, "client reset the request before the response");
                self.send.stop_stream(why.reset_code());
                return;
            }
            AbortReason::Idle(_) => StatusCode::REQUEST_TIMEOUT,
            AbortReason::LengthMismatch(_) => StatusCode::BAD_REQUEST,
            AbortReason::UpstreamStalled(_) => {
                self.metrics()
                    .upstream_errors
                    .with_label_values(&[metrics::upstream_error::TIMEOUT])
                    .inc();
                StatusCode::GATEWAY_TIMEOUT
            }
        };
        let msg = match why {
            AbortReason::Idle(d) => format!("the request body made no progress for {d:?}"),
            AbortReason::UpstreamStalled(d) => {
                format!("the upstream took no request body for {d:?}")
            }
            AbortReason::LengthMismatch(m) => m,
            AbortReason::ClientReset => unreachable!("returned above"),
        };
        self.finish_local(status, &msg).await;
    }

    /// Phase 5: the response head, cleaned of hop-by-hop fields and advertising HTTP/3.
    /// False when the client is gone.
    async fn send_head(&mut self, mut parts: http::response::Parts) -> bool {
        request::sanitize_response_headers(&mut parts.headers);
        if !parts.headers.contains_key(header::ALT_SVC) {
            let alt_svc = self.conn.serving.alt_svc_value(&self.gen);
            parts.headers.insert(header::ALT_SVC, alt_svc);
        }
        let status = parts.status;
        parts.version = http::Version::HTTP_3;
        if let Err(e) = self
            .send
            .send_response(Response::from_parts(parts, ()))
            .await
        {
            debug!(client = %self.conn.remote, error = %e, "client went away before the response");
            return false;
        }
        self.count(status);
        true
    }

    /// Phase 6: the response body, then the request's duration. Returning drops the
    /// upstream body, and with it the upstream request.
    async fn relay(&mut self, body: &mut hyper::body::Incoming, idle: Duration) {
        let abort = self.abort.clone();
        let (end, sent) =
            body::relay_response(&mut self.send, body, &abort, &mut self.stopped, idle).await;
        let client = self.conn.remote;
        self.downloaded(sent);
        match end {
            ResponseEnd::Complete => {
                let _ = self.send.finish().await;
                self.observe_duration();
            }
            ResponseEnd::Aborted(why) => {
                debug!(%client, ?why, "request body failed during the response; resetting the stream");
                self.send.stop_stream(why.reset_code());
            }
            ResponseEnd::ClientStopped => {
                debug!(%client, "client stopped reading the response; dropping the upstream response");
                self.send.stop_stream(Code::H3_REQUEST_CANCELLED);
            }
            ResponseEnd::ClientGone(e) => {
                debug!(%client, error = %e, "client stopped reading the response");
            }
            ResponseEnd::TrailersFailed(e) => {
                debug!(%client, error = %e, "sending trailers failed");
            }
            ResponseEnd::UpstreamFailed(e) => {
                self.metrics()
                    .upstream_errors
                    .with_label_values(&[metrics::upstream_error::RESET])
                    .inc();
                limited!(Level::WARN, Reason::UpstreamMidResponse, host = %self.host, error = %e, "upstream failed mid-response; resetting the stream");
                self.send.stop_stream(Code::H3_INTERNAL_ERROR);
            }
            ResponseEnd::Idle(idle) => {
                self.metrics().limit(limit::RESPONSE_BODY_IDLE_TIMEOUT);
                limited!(Level::WARN, Reason::UpstreamMidResponse, host = %self.host, ?idle, "response body made no progress; resetting the stream");
                self.send.stop_stream(Code::H3_INTERNAL_ERROR);
            }
        }
    }

    fn downloaded(&self, bytes: u64) {
        self.metrics()
            .body_bytes
            .with_label_values(&["download"])
            .inc_by(bytes);
    }

    fn count(&self, status: StatusCode) {
        let expiry = self.gen.config.hosts.get(&self.host).map(|e| e.not_after);
        let per_host = &self.metrics().per_host;
        per_host.count_request(&self.host, expiry, status.as_u16(), self.conn.family);
    }

    fn observe_duration(&self) {
        self.metrics()
            .request_duration
            .observe(self.started.elapsed().as_secs_f64());
    }

    /// Refuses the request before it reaches the upstream: counts why, stops reading its
    /// body (RFC 9114 4.1.2 allows H3_NO_ERROR once a response is sent) and answers with the
    /// reason.
    async fn refuse(&mut self, r: Refusal) {
        self.metrics()
            .rejected_requests
            .with_label_values(&[r.reason])
            .inc();
        self.stop_body(r.stop);
        self.finish_local(r.status, &r.msg).await;
    }

    fn stop_body(&mut self, code: Code) {
        if let Some(recv) = self.recv.as_mut() {
            recv.stop_sending(code);
        }
    }

    /// Answers locally (errors, 421) with a short text body naming the problem.
    async fn finish_local(&mut self, status: StatusCode, msg: &str) {
        let body = Bytes::from(format!(
            "{} {}: {msg}\n",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ));
        let resp = Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .header(header::CONTENT_LENGTH, body.len())
            .body(())
            .expect("static response parts are valid");
        self.count(status);
        if self.send.send_response(resp).await.is_ok() && self.send.send_data(body).await.is_ok() {
            let _ = self.send.finish().await;
        }
        if self.host != OTHER_HOST {
            self.observe_duration();
        }
    }
}
