//! One HTTP/3 request, in phases: resolve the headers, route (validate and match a configured
//! host), take the body, forward to the TCP ingress, send the response head, relay the
//! response body. Every phase works on one [`RequestCtx`], which carries what the request
//! has established so far; the body pumps are in [`super::body`].

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use h3::error::Code;
use http::{header, Response, StatusCode};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::body::{self, BodyError, RecvHalf, ResponseEnd, SendHalf};
use super::metrics::{self, rejected, status_class, OTHER_HOST};
use super::request::{self, Reject, Validated};
use super::state::{Generation, Shared};
use super::upstream::{Upstream, UpstreamBody};

/// Per QUIC connection facts every request on it shares.
pub struct ConnCtx {
    pub shared: Arc<Shared>,
    pub family: &'static str,
    pub remote: SocketAddr,
    pub local: SocketAddr,
    /// SNI of the handshake, lowercase.
    pub sni: Option<String>,
    /// PROXY protocol needs one upstream client per QUIC connection; cached per generation.
    pub upstream_cache: Mutex<Option<(u64, Upstream)>>,
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
}

impl Refusal {
    fn malformed(msg: String) -> Self {
        Refusal {
            reason: rejected::MALFORMED,
            status: StatusCode::BAD_REQUEST,
            msg,
        }
    }
}

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
    /// Fired when the client resets the request or its body fails.
    cancel: CancellationToken,
}

/// Handles one request stream from `resolve_request` to the last byte.
pub async fn handle(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    conn: Arc<ConnCtx>,
) {
    let Some((req, stream)) = resolve(resolver, &conn).await else {
        return;
    };
    let mut ctx = RequestCtx::new(conn, stream);
    if let Err(r) = ctx.route(&req) {
        return ctx.refuse(r).await;
    }
    let upstream = ctx.conn.upstream(&ctx.gen);
    let parts = match ctx.upstream_parts(&req, &upstream) {
        Ok(p) => p,
        Err(r) => return ctx.refuse(r).await,
    };
    let Some(body) = ctx.body().await else {
        return;
    };
    let Some(resp) = ctx
        .forward(&upstream, http::Request::from_parts(parts, body))
        .await
    else {
        return;
    };
    let (head, mut body) = resp.into_parts();
    if ctx.send_head(head).await {
        ctx.relay(&mut body).await;
    }
}

/// Phase 1: the request headers. h3 has already answered when they are unusable (431 for an
/// oversized field section, H3_MESSAGE_ERROR for a malformed one); only this stream fails.
async fn resolve(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    conn: &ConnCtx,
) -> Option<(
    http::Request<()>,
    h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
)> {
    match resolver.resolve_request().await {
        Ok(r) => Some(r),
        Err(e) => {
            let reason = if matches!(e, h3::error::StreamError::HeaderTooBig { .. }) {
                rejected::HEADERS_TOO_LARGE
            } else {
                rejected::MALFORMED
            };
            let m = &conn.shared.metrics;
            m.rejected_requests.with_label_values(&[reason]).inc();
            debug!(client = %conn.remote, error = %e, "request refused by the HTTP/3 layer");
            None
        }
    }
}

impl RequestCtx {
    fn new(
        conn: Arc<ConnCtx>,
        stream: h3::server::RequestStream<h3_quinn::BidiStream<Bytes>, Bytes>,
    ) -> Self {
        let (send, recv) = stream.split();
        RequestCtx {
            gen: conn.shared.current.load_full(),
            conn,
            started: Instant::now(),
            host: OTHER_HOST.to_string(),
            validated: None,
            send,
            recv: Some(recv),
            cancel: CancellationToken::new(),
        }
    }

    fn metrics(&self) -> &metrics::Metrics {
        &self.conn.shared.metrics
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
                return Err(Refusal {
                    reason: rejected::MISDIRECTED,
                    status: StatusCode::MISDIRECTED_REQUEST,
                    msg: format!("{} is not served on this connection", v.host),
                })
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

    /// Phase 3b: the upstream request's body; `None` when the request ended here.
    async fn body(&mut self) -> Option<UpstreamBody> {
        let declared = self.validated().content_length;
        let m = self.conn.shared.metrics.clone();
        let client = self.conn.remote;
        match body::request_body(&mut self.recv, declared, &self.cancel, &m, client).await {
            Ok(b) => Some(b),
            Err(BodyError::LengthMismatch(msg)) => {
                let r = Refusal {
                    reason: rejected::CONTENT_LENGTH,
                    status: StatusCode::BAD_REQUEST,
                    msg,
                };
                self.refuse(r).await;
                None
            }
            Err(BodyError::Client(e)) => {
                debug!(%client, error = %e, "client abandoned the request body");
                None
            }
        }
    }

    /// Phase 4: the request to the TCP ingress; its failures are answered here (502, 504).
    async fn forward(
        &mut self,
        upstream: &Upstream,
        req: http::Request<UpstreamBody>,
    ) -> Option<http::Response<hyper::body::Incoming>> {
        let result = tokio::select! {
            r = upstream.send(req) => r,
            _ = self.cancel.cancelled() => {
                debug!(client = %self.conn.remote, "client reset the request before the response");
                return None;
            }
        };
        match result {
            Ok(r) => Some(r),
            Err(e) => {
                let m = self.metrics();
                m.upstream_errors
                    .with_label_values(&[e.metric_kind()])
                    .inc();
                warn!(host = %self.host, error = %e, "upstream request failed");
                self.finish_local(e.status(), &e.to_string()).await;
                None
            }
        }
    }

    /// Phase 5: the response head, cleaned of hop-by-hop fields and advertising HTTP/3.
    /// False when the client is gone.
    async fn send_head(&mut self, mut parts: http::response::Parts) -> bool {
        request::sanitize_response_headers(&mut parts.headers);
        if !parts.headers.contains_key(header::ALT_SVC) {
            let alt_svc = self.conn.shared.alt_svc_value(&self.gen);
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
            self.cancel.cancel();
            return false;
        }
        self.count(status);
        true
    }

    /// Phase 6: the response body, then the request's duration.
    async fn relay(&mut self, body: &mut hyper::body::Incoming) {
        let (end, sent) = body::relay_response(&mut self.send, body, &self.cancel).await;
        let client = self.conn.remote;
        match end {
            ResponseEnd::Complete => {
                self.downloaded(sent);
                let _ = self.send.finish().await;
                self.observe_duration();
            }
            ResponseEnd::Cancelled => {
                debug!(%client, "client reset the stream; dropping the upstream response");
            }
            ResponseEnd::ClientGone(e) => {
                // Returning drops the body, and with it the upstream request.
                debug!(%client, error = %e, "client stopped reading the response");
                self.cancel.cancel();
                self.downloaded(sent);
            }
            ResponseEnd::TrailersFailed(e) => {
                debug!(%client, error = %e, "sending trailers failed");
            }
            ResponseEnd::UpstreamFailed(e) => {
                self.metrics()
                    .upstream_errors
                    .with_label_values(&[metrics::upstream_error::RESET])
                    .inc();
                warn!(host = %self.host, error = %e, "upstream failed mid-response; resetting the stream");
                self.send.stop_stream(Code::H3_INTERNAL_ERROR);
                self.downloaded(sent);
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
        let c = &self.conn;
        self.metrics()
            .requests
            .with_label_values(&[&self.host, status_class(status.as_u16()), c.family])
            .inc();
        c.shared.count_request(&self.host);
    }

    fn observe_duration(&self) {
        self.metrics()
            .request_duration
            .with_label_values(&[&self.host])
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
        if let Some(recv) = self.recv.as_mut() {
            recv.stop_sending(Code::H3_NO_ERROR);
        }
        self.finish_local(r.status, &r.msg).await;
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
