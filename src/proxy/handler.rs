//! One HTTP/3 request: validate, forward to the TCP ingress, stream both bodies back and forth.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use h3::error::Code;
use h3::server::RequestStream;
use http::{header, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::metrics::{self, rejected, status_class, OTHER_HOST};
use super::request::{self, Reject, Validated};
use super::server::{Generation, Shared};
use super::upstream::{BoxError, Upstream, UpstreamBody};

type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
type RecvHalf = RequestStream<h3_quinn::RecvStream, Bytes>;

/// Bodies up to this size with a declared Content-Length are read completely before the
/// request goes upstream, so a length mismatch is refused before the ingress sees anything.
/// Larger bodies stream; a mismatch then aborts the upstream request mid-body.
pub const PREREAD_LIMIT: u64 = 64 * 1024;

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

/// Handles one request stream from `resolve_request` to the last byte.
pub async fn handle(
    resolver: h3::server::RequestResolver<h3_quinn::Connection, Bytes>,
    ctx: Arc<ConnCtx>,
) {
    let m = ctx.shared.metrics.clone();
    let (req, stream) = match resolver.resolve_request().await {
        Ok(r) => r,
        Err(e) => {
            // h3 already answered: 431 for an oversized field section, H3_MESSAGE_ERROR for
            // a malformed one. Only this stream fails.
            let reason = if matches!(e, h3::error::StreamError::HeaderTooBig { .. }) {
                rejected::HEADERS_TOO_LARGE
            } else {
                rejected::MALFORMED
            };
            m.rejected_requests.with_label_values(&[reason]).inc();
            debug!(client = %ctx.remote, error = %e, "request refused by the HTTP/3 layer");
            return;
        }
    };
    let started = Instant::now();
    let gen = ctx.shared.current.load_full();
    let (mut send, mut recv) = stream.split();

    let v = match request::validate(&req) {
        Ok(v) => v,
        Err(Reject::Malformed(msg)) => {
            debug!(client = %ctx.remote, %msg, "malformed request");
            refuse(
                &mut send,
                &mut recv,
                &ctx,
                rejected::MALFORMED,
                StatusCode::BAD_REQUEST,
                &msg,
                OTHER_HOST,
                started,
            )
            .await;
            return;
        }
    };

    // The request must name a configured host, and one whose certificate is the one this
    // connection was set up with: otherwise 421 so the client retries on a fresh connection
    // (or drops a stale Alt-Svc entry).
    let entry = gen.config.hosts.lookup(&v.host);
    let conn_entry = ctx.sni.as_deref().and_then(|s| gen.config.hosts.lookup(s));
    let entry = match (entry, conn_entry) {
        (Some(e), Some(c)) if Arc::ptr_eq(e, c) => e.clone(),
        _ => {
            let msg = format!("{} is not served on this connection", v.host);
            refuse(
                &mut send,
                &mut recv,
                &ctx,
                rejected::MISDIRECTED,
                StatusCode::MISDIRECTED_REQUEST,
                &msg,
                OTHER_HOST,
                started,
            )
            .await;
            return;
        }
    };
    let host_label = entry.name.clone();

    let upstream = ctx.upstream(&gen);
    let parts = match request::upstream_parts(&req, &v, ctx.remote, upstream.scheme()) {
        Ok(p) => p,
        Err(Reject::Malformed(msg)) => {
            refuse(
                &mut send,
                &mut recv,
                &ctx,
                rejected::MALFORMED,
                StatusCode::BAD_REQUEST,
                &msg,
                &host_label,
                started,
            )
            .await;
            return;
        }
    };

    let cancel = CancellationToken::new();
    let body = match request_body(&mut recv, &v, &ctx).await {
        Ok(BodyStart::Complete(body)) => body,
        Ok(BodyStart::Streaming(first)) => {
            let (tx, rx) = mpsc::channel(8);
            let pump_cancel = cancel.clone();
            let pump_ctx = ctx.clone();
            let declared = v.content_length;
            tokio::spawn(async move {
                pump(recv, first, declared, tx, pump_cancel, pump_ctx).await;
            });
            ChannelBody {
                rx,
                remaining: v.content_length,
            }
            .boxed()
        }
        Err(BodyError::LengthMismatch(msg)) => {
            refuse(
                &mut send,
                &mut recv,
                &ctx,
                rejected::CONTENT_LENGTH,
                StatusCode::BAD_REQUEST,
                &msg,
                &host_label,
                started,
            )
            .await;
            return;
        }
        Err(BodyError::Client(e)) => {
            debug!(client = %ctx.remote, error = %e, "client abandoned the request body");
            return;
        }
    };

    let upstream_req = http::Request::from_parts(parts, body);
    let result = tokio::select! {
        r = upstream.send(upstream_req) => r,
        _ = cancel.cancelled() => {
            debug!(client = %ctx.remote, "client reset the request before the response");
            return;
        }
    };
    let resp = match result {
        Ok(r) => r,
        Err(e) => {
            m.upstream_errors
                .with_label_values(&[e.metric_kind()])
                .inc();
            warn!(host = %host_label, error = %e, "upstream request failed");
            let status = e.status();
            finish_local(
                &mut send,
                status,
                &e.to_string(),
                &ctx,
                &host_label,
                started,
            )
            .await;
            return;
        }
    };

    let (mut parts, mut body) = resp.into_parts();
    request::sanitize_response_headers(&mut parts.headers);
    if !parts.headers.contains_key(header::ALT_SVC) {
        parts
            .headers
            .insert(header::ALT_SVC, ctx.shared.alt_svc_value(&gen));
    }
    let status = parts.status;
    parts.version = http::Version::HTTP_3;
    if let Err(e) = send.send_response(Response::from_parts(parts, ())).await {
        debug!(client = %ctx.remote, error = %e, "client went away before the response");
        cancel.cancel();
        return;
    }
    count(&ctx, &host_label, status, started);

    let mut sent: u64 = 0;
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = cancel.cancelled() => {
                debug!(client = %ctx.remote, "client reset the stream; dropping the upstream response");
                return;
            }
        };
        match frame {
            None => break,
            Some(Ok(frame)) => {
                if frame.is_data() {
                    let data = frame.into_data().unwrap_or_default();
                    sent += data.len() as u64;
                    if let Err(e) = send.send_data(data).await {
                        // The client cancelled: dropping `body` drops the upstream request.
                        debug!(client = %ctx.remote, error = %e, "client stopped reading the response");
                        cancel.cancel();
                        m.body_bytes.with_label_values(&["download"]).inc_by(sent);
                        return;
                    }
                } else if let Ok(trailers) = frame.into_trailers() {
                    if let Err(e) = send.send_trailers(trailers).await {
                        debug!(client = %ctx.remote, error = %e, "sending trailers failed");
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                m.upstream_errors
                    .with_label_values(&[metrics::upstream_error::RESET])
                    .inc();
                warn!(host = %host_label, error = %e, "upstream failed mid-response; resetting the stream");
                send.stop_stream(Code::H3_INTERNAL_ERROR);
                m.body_bytes.with_label_values(&["download"]).inc_by(sent);
                return;
            }
        }
    }
    m.body_bytes.with_label_values(&["download"]).inc_by(sent);
    let _ = send.finish().await;
    m.request_duration
        .with_label_values(&[&host_label])
        .observe(started.elapsed().as_secs_f64());
}

fn count(ctx: &ConnCtx, host: &str, status: StatusCode, _started: Instant) {
    ctx.shared
        .metrics
        .requests
        .with_label_values(&[host, status_class(status.as_u16()), ctx.family])
        .inc();
    ctx.shared.count_request(host);
}

/// Refuses a request before it reaches the upstream: counts why, stops reading its body
/// (RFC 9114 4.1.2 allows H3_NO_ERROR once a response is sent) and answers with the reason.
#[allow(clippy::too_many_arguments)]
async fn refuse(
    send: &mut SendHalf,
    recv: &mut RecvHalf,
    ctx: &ConnCtx,
    reason: &str,
    status: StatusCode,
    msg: &str,
    host: &str,
    started: Instant,
) {
    ctx.shared
        .metrics
        .rejected_requests
        .with_label_values(&[reason])
        .inc();
    recv.stop_sending(Code::H3_NO_ERROR);
    finish_local(send, status, msg, ctx, host, started).await;
}

/// Answers locally (errors, 421) with a short text body naming the problem.
async fn finish_local(
    send: &mut SendHalf,
    status: StatusCode,
    msg: &str,
    ctx: &ConnCtx,
    host: &str,
    started: Instant,
) {
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
    count(ctx, host, status, started);
    if send.send_response(resp).await.is_ok() && send.send_data(body).await.is_ok() {
        let _ = send.finish().await;
    }
    if host != OTHER_HOST {
        ctx.shared
            .metrics
            .request_duration
            .with_label_values(&[host])
            .observe(started.elapsed().as_secs_f64());
    }
}

enum BodyStart {
    /// The whole body (and trailers) is here; it was checked against Content-Length.
    Complete(UpstreamBody),
    /// The body continues; here are the bytes read so far.
    Streaming(Bytes),
}

#[derive(Debug)]
enum BodyError {
    LengthMismatch(String),
    Client(h3::error::StreamError),
}

fn mismatch(declared: u64, got: u64) -> BodyError {
    BodyError::LengthMismatch(format!(
        "header content-length says {declared} bytes but the request carried {}{got}",
        if got > declared { "at least " } else { "" }
    ))
}

async fn request_body(
    recv: &mut RecvHalf,
    v: &Validated,
    ctx: &ConnCtx,
) -> Result<BodyStart, BodyError> {
    match v.content_length {
        Some(declared) if declared <= PREREAD_LIMIT => {
            let mut buf = BytesMut::with_capacity(declared as usize);
            while let Some(mut chunk) = recv.recv_data().await.map_err(BodyError::Client)? {
                let n = chunk.remaining() as u64;
                if buf.len() as u64 + n > declared {
                    return Err(mismatch(declared, buf.len() as u64 + n));
                }
                buf.extend_from_slice(&chunk.copy_to_bytes(chunk.remaining()));
            }
            if buf.len() as u64 != declared {
                return Err(mismatch(declared, buf.len() as u64));
            }
            let trailers = recv.recv_trailers().await.map_err(BodyError::Client)?;
            ctx.shared
                .metrics
                .body_bytes
                .with_label_values(&["upload"])
                .inc_by(declared);
            let data = buf.freeze();
            let body = match trailers {
                None => http_body_util::Full::new(data)
                    .map_err(|never| match never {})
                    .boxed(),
                Some(t) => {
                    let frames = vec![Ok::<_, BoxError>(Frame::data(data)), Ok(Frame::trailers(t))];
                    http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
                }
            };
            Ok(BodyStart::Complete(body))
        }
        declared => {
            // Most requests without a body arrive with the stream already finished. Then the
            // upstream gets an empty body, not a chunked one (a GET with
            // `transfer-encoding: chunked` is refused by some servers).
            match recv.recv_data().now_or_never() {
                Some(Ok(None)) => {
                    if let Some(d) = declared.filter(|d| *d > 0) {
                        return Err(mismatch(d, 0));
                    }
                    let trailers = recv.recv_trailers().await.map_err(BodyError::Client)?;
                    Ok(BodyStart::Complete(match trailers {
                        None => http_body_util::Empty::new()
                            .map_err(|never| match never {})
                            .boxed(),
                        Some(t) => {
                            http_body_util::StreamBody::new(futures_util::stream::iter(vec![Ok::<
                                _,
                                BoxError,
                            >(
                                Frame::trailers(t),
                            )]))
                            .boxed()
                        }
                    }))
                }
                Some(Ok(Some(mut chunk))) => {
                    Ok(BodyStart::Streaming(chunk.copy_to_bytes(chunk.remaining())))
                }
                Some(Err(e)) => Err(BodyError::Client(e)),
                None => Ok(BodyStart::Streaming(Bytes::new())),
            }
        }
    }
}

/// Moves the request body from the QUIC stream to the upstream request, chunk by chunk, with
/// at most a few chunks buffered (bounded memory), checking Content-Length as it goes.
async fn pump(
    mut recv: RecvHalf,
    first: Bytes,
    declared: Option<u64>,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    cancel: CancellationToken,
    ctx: Arc<ConnCtx>,
) {
    let mut total: u64 = 0;
    let upload = ctx.shared.metrics.body_bytes.with_label_values(&["upload"]);
    let mut pending = (!first.is_empty()).then_some(first);
    loop {
        let next = match pending.take() {
            Some(data) => Ok(Some(data)),
            None => recv
                .recv_data()
                .await
                .map(|c| c.map(|mut c| c.copy_to_bytes(c.remaining()))),
        };
        match next {
            Ok(Some(data)) => {
                total += data.len() as u64;
                upload.inc_by(data.len() as u64);
                if let Some(d) = declared {
                    if total > d {
                        ctx.shared
                            .metrics
                            .rejected_requests
                            .with_label_values(&[rejected::CONTENT_LENGTH])
                            .inc();
                        let _ = tx.send(Err(mismatch_msg(d, total))).await;
                        recv.stop_sending(Code::H3_MESSAGE_ERROR);
                        cancel.cancel();
                        return;
                    }
                }
                if tx.send(Ok(Frame::data(data))).await.is_err() {
                    // The upstream request no longer wants the body (it answered already).
                    recv.stop_sending(Code::H3_NO_ERROR);
                    return;
                }
            }
            Ok(None) => break,
            Err(e) => {
                debug!(client = %ctx.remote, error = %e, "request body aborted by the client");
                let _ = tx.send(Err(Box::new(e))).await;
                cancel.cancel();
                return;
            }
        }
    }
    if let Some(d) = declared {
        if total != d {
            ctx.shared
                .metrics
                .rejected_requests
                .with_label_values(&[rejected::CONTENT_LENGTH])
                .inc();
            let _ = tx.send(Err(mismatch_msg(d, total))).await;
            cancel.cancel();
            return;
        }
    }
    match recv.recv_trailers().await {
        Ok(Some(t)) => {
            let _ = tx.send(Ok(Frame::trailers(t))).await;
        }
        Ok(None) => {}
        Err(e) => {
            let _ = tx.send(Err(Box::new(e))).await;
            cancel.cancel();
        }
    }
}

fn mismatch_msg(declared: u64, got: u64) -> BoxError {
    match mismatch(declared, got) {
        BodyError::LengthMismatch(m) => m.into(),
        BodyError::Client(e) => Box::new(e),
    }
}

/// A request body fed by [`pump`] through a bounded channel.
struct ChannelBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    remaining: Option<u64>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(r), Some(d)) = (this.remaining.as_mut(), frame.data_ref()) {
                    *r = r.saturating_sub(d.len() as u64);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            other => other,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
