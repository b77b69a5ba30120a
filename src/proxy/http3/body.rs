//! The two body pumps of a request: the request body from the QUIC stream to the TCP ingress
//! (read ahead when small, streamed when not, checked against Content-Length either way) and
//! the response body back, frame by frame. Memory stays bounded: at most a few chunks are in
//! flight in either direction.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use h3::error::Code;
use h3::server::RequestStream;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio::time::{timeout, timeout_at, Instant};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::streams;
use crate::proxy::observe::metrics::{limit, rejected, Metrics};
use crate::proxy::upstream::{empty_body, BoxError, UpstreamBody};

pub type SendHalf = RequestStream<streams::SendHalf, Bytes>;
pub type RecvHalf = RequestStream<streams::GuardedRecv, Bytes>;

/// Bodies up to this size with a declared Content-Length are read completely before the
/// request goes upstream, so a length mismatch is refused before the ingress sees anything.
/// Larger bodies stream; a mismatch then aborts the upstream request mid-body. The bytes
/// are reserved against the buffered-request budget first.
pub const PREREAD_LIMIT: u64 = 64 * 1024;

/// Request body chunks buffered between the QUIC stream and the upstream request.
const CHANNEL_CHUNKS: usize = 8;

/// A request body makes progress when it delivers at least this many bytes (or ends) within
/// each window of `http.requestBodyIdleTimeoutSeconds`: a body trickled at a few bytes per
/// second holds a stream and a budget share as long as an idle one and is cut the same way.
pub const MIN_PROGRESS_BYTES: u64 = 1024;

/// The body idle clock: its deadline moves on only with [`MIN_PROGRESS_BYTES`] of progress.
struct Progress {
    idle: Duration,
    deadline: Instant,
    bytes: u64,
}

impl Progress {
    fn new(idle: Duration) -> Self {
        Progress {
            idle,
            deadline: Instant::now() + idle,
            bytes: 0,
        }
    }

    fn add(&mut self, n: u64) {
        self.bytes += n;
        if self.bytes >= MIN_PROGRESS_BYTES {
            self.bytes = 0;
            self.deadline = Instant::now() + self.idle;
        }
    }
}

/// Whether a body of `declared` length is read ahead (and so reserved against the budget).
pub fn reads_ahead(declared: Option<u64>) -> Option<u64> {
    declared.filter(|d| *d <= PREREAD_LIMIT)
}

#[derive(Debug)]
pub enum BodyError {
    /// The body does not have the length its header declared (the text says how).
    LengthMismatch(String),
    /// The client reset or abandoned the stream.
    Client(h3::error::StreamError),
    /// No body bytes arrived for this long (`http.requestBodyIdleTimeoutSeconds`).
    Idle(Duration),
}

/// Why a request was aborted while its body streams; the handler answers (or resets the
/// stream) accordingly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AbortReason {
    /// The client reset the request stream.
    ClientReset,
    /// The body made no progress for the idle timeout.
    Idle(Duration),
    /// The body's length differs from its Content-Length (the text says how).
    LengthMismatch(String),
    /// The upstream did not take body bytes for the idle timeout.
    UpstreamStalled(Duration),
}

impl AbortReason {
    /// The access log's `refused` value.
    pub fn label(&self) -> &'static str {
        match self {
            AbortReason::ClientReset => "client_reset",
            AbortReason::Idle(_) => limit::REQUEST_BODY_IDLE_TIMEOUT,
            AbortReason::LengthMismatch(_) => rejected::CONTENT_LENGTH,
            AbortReason::UpstreamStalled(_) => "upstream_stalled",
        }
    }

    /// The code the response stream is reset with once a response has started.
    pub fn reset_code(&self) -> Code {
        match self {
            AbortReason::ClientReset => Code::H3_REQUEST_CANCELLED,
            AbortReason::Idle(_) => Code::H3_REQUEST_INCOMPLETE,
            AbortReason::LengthMismatch(_) => Code::H3_MESSAGE_ERROR,
            AbortReason::UpstreamStalled(_) => Code::H3_INTERNAL_ERROR,
        }
    }
}

/// Fired (once, with its reason) when a streamed request body fails.
#[derive(Default)]
pub struct Abort {
    token: CancellationToken,
    why: OnceLock<AbortReason>,
}

impl Abort {
    pub fn abort(&self, why: AbortReason) {
        let _ = self.why.set(why);
        self.token.cancel();
    }

    /// Waits for the abort and says why.
    pub async fn aborted(&self) -> AbortReason {
        self.token.cancelled().await;
        self.why.get().cloned().unwrap_or(AbortReason::ClientReset)
    }
}

/// What reading a request body needs to know.
pub struct BodyCtx {
    pub declared: Option<u64>,
    pub idle: Duration,
    pub abort: Arc<Abort>,
    pub metrics: Arc<Metrics>,
    pub client: SocketAddr,
    /// Body bytes received so far, for the access log.
    pub received: Arc<std::sync::atomic::AtomicU64>,
}

fn mismatch(declared: u64, got: u64) -> String {
    format!(
        "header content-length says {declared} bytes but the request carried {}{got}",
        if got > declared { "at least " } else { "" }
    )
}

fn complete(data: Option<Bytes>, trailers: Option<http::HeaderMap>) -> UpstreamBody {
    match (data, trailers) {
        (Some(data), None) => http_body_util::Full::new(data)
            .map_err(|never| match never {})
            .boxed(),
        (None, None) => empty_body(),
        (data, Some(t)) => {
            let frames: Vec<Result<Frame<Bytes>, BoxError>> = data
                .map(Frame::data)
                .into_iter()
                .chain([Frame::trailers(t)])
                .map(Ok)
                .collect();
            http_body_util::StreamBody::new(futures_util::stream::iter(frames)).boxed()
        }
    }
}

/// Reads a small body with a declared length completely, checking the length; the buffer
/// grows with what arrives (its bytes were reserved by the caller).
async fn preread(
    recv: &mut RecvHalf,
    declared: u64,
    c: &BodyCtx,
) -> Result<UpstreamBody, BodyError> {
    // Chunks as they arrive, joined once at the end: no buffer sized by the declared length,
    // and none grown by doubling past what arrived.
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut got: u64 = 0;
    let mut progress = Progress::new(c.idle);
    loop {
        let next = timeout_at(progress.deadline, recv.recv_data())
            .await
            .map_err(|_| BodyError::Idle(c.idle))?;
        let Some(mut chunk) = next.map_err(BodyError::Client)? else {
            break;
        };
        let n = chunk.remaining() as u64;
        progress.add(n);
        got += n;
        if got > declared {
            return Err(BodyError::LengthMismatch(mismatch(declared, got)));
        }
        chunks.push(chunk.copy_to_bytes(chunk.remaining()));
    }
    if got != declared {
        return Err(BodyError::LengthMismatch(mismatch(declared, got)));
    }
    let mut buf = BytesMut::with_capacity(got as usize);
    for c in chunks {
        buf.extend_from_slice(&c);
    }
    let trailers = timeout_at(progress.deadline, recv.recv_trailers())
        .await
        .map_err(|_| BodyError::Idle(c.idle))?
        .map_err(BodyError::Client)?;
    c.metrics
        .body_bytes
        .with_label_values(&["upload"])
        .inc_by(declared);
    c.received
        .fetch_add(declared, std::sync::atomic::Ordering::Relaxed);
    Ok(complete(Some(buf.freeze()), trailers))
}

/// The request body for the upstream request, and a token cancelled once the upstream has
/// taken all of it (the response timeout counts from there). Takes `recv` when the body
/// streams (the pump task owns it then); leaves it otherwise.
pub async fn request_body(
    recv: &mut Option<RecvHalf>,
    c: BodyCtx,
) -> Result<(UpstreamBody, CancellationToken), BodyError> {
    let sent = CancellationToken::new();
    let stream = recv.as_mut().expect("the request body is read once");
    if let Some(d) = reads_ahead(c.declared) {
        sent.cancel();
        return Ok((preread(stream, d, &c).await?, sent));
    }
    // Most requests without a body arrive with the stream already finished. Then the
    // upstream gets an empty body, not a chunked one (a GET with `transfer-encoding: chunked`
    // is refused by some servers).
    let first = match stream.recv_data().now_or_never() {
        Some(Ok(None)) => {
            if let Some(d) = c.declared.filter(|d| *d > 0) {
                return Err(BodyError::LengthMismatch(mismatch(d, 0)));
            }
            let trailers = stream.recv_trailers().await.map_err(BodyError::Client)?;
            sent.cancel();
            return Ok((complete(None, trailers), sent));
        }
        Some(Ok(Some(mut chunk))) => chunk.copy_to_bytes(chunk.remaining()),
        Some(Err(e)) => return Err(BodyError::Client(e)),
        None => Bytes::new(),
    };
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let remaining = c.declared;
    let pump = RequestPump {
        recv: recv.take().expect("checked above"),
        tx,
        progress: Progress::new(c.idle),
        c,
    };
    tokio::spawn(pump.run(first));
    let body = ChannelBody {
        rx,
        remaining,
        sent: sent.clone(),
    };
    Ok((body.boxed(), sent))
}

/// Moves a streamed request body from the QUIC stream to the upstream request, chunk by
/// chunk, checking Content-Length as it goes and cutting a body that stops moving.
struct RequestPump {
    recv: RecvHalf,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    c: BodyCtx,
    progress: Progress,
}

/// How one step of the pump ended when it did not deliver data.
enum Stop {
    Done,
    Failed(AbortReason, BoxError),
}

impl RequestPump {
    async fn run(mut self, first: Bytes) {
        let mut total: u64 = 0;
        let mut pending = (!first.is_empty()).then_some(first);
        loop {
            let data = match pending.take() {
                Some(data) => data,
                None => match self.next_chunk().await {
                    Ok(Some(data)) => data,
                    Ok(None) => break,
                    Err(stop) => return self.stop(stop).await,
                },
            };
            total += data.len() as u64;
            self.progress.add(data.len() as u64);
            (self.c.received).fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.c
                .metrics
                .body_bytes
                .with_label_values(&["upload"])
                .inc_by(data.len() as u64);
            if self.c.declared.is_some_and(|d| total > d) {
                self.recv.stop_sending(Code::H3_MESSAGE_ERROR);
                return self.length_mismatch(total).await;
            }
            if let Err(stop) = self.deliver(Frame::data(data)).await {
                return self.stop(stop).await;
            }
        }
        if self.c.declared.is_some_and(|d| total != d) {
            return self.length_mismatch(total).await;
        }
        match timeout_at(self.progress.deadline, self.recv.recv_trailers()).await {
            Ok(Ok(Some(t))) => {
                if let Err(stop) = self.deliver(Frame::trailers(t)).await {
                    self.stop(stop).await;
                }
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                let stop = self.client_failed(e);
                self.stop(stop).await;
            }
            Err(_) => {
                let stop = self.idle();
                self.stop(stop).await;
            }
        }
    }

    /// The next body chunk from the client; `Ok(None)` at the end of the body.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, Stop> {
        match timeout_at(self.progress.deadline, self.recv.recv_data()).await {
            Err(_) => Err(self.idle()),
            Ok(Err(e)) => Err(self.client_failed(e)),
            Ok(Ok(c)) => Ok(c.map(|mut c| c.copy_to_bytes(c.remaining()))),
        }
    }

    /// Hands a frame to the upstream request, which must take it within the idle timeout.
    async fn deliver(&mut self, frame: Frame<Bytes>) -> Result<(), Stop> {
        let idle = self.c.idle;
        match timeout(idle, self.tx.send(Ok(frame))).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                // The upstream request no longer wants the body (it answered already).
                self.recv.stop_sending(Code::H3_NO_ERROR);
                Err(Stop::Done)
            }
            Err(_) => {
                self.recv.stop_sending(Code::H3_NO_ERROR);
                let msg = format!("the upstream took no request body bytes for {idle:?}");
                Err(Stop::Failed(AbortReason::UpstreamStalled(idle), msg.into()))
            }
        }
    }

    fn idle(&mut self) -> Stop {
        let idle = self.c.idle;
        self.c.metrics.limit(limit::REQUEST_BODY_IDLE_TIMEOUT);
        debug!(client = %self.c.client, ?idle, "request body made no progress; cutting it");
        self.recv.stop_sending(Code::H3_NO_ERROR);
        let msg = format!("the request body made no progress for {idle:?}");
        Stop::Failed(AbortReason::Idle(idle), msg.into())
    }

    fn client_failed(&self, e: h3::error::StreamError) -> Stop {
        debug!(client = %self.c.client, error = %e, "request body aborted by the client");
        Stop::Failed(AbortReason::ClientReset, Box::new(e))
    }

    async fn length_mismatch(&self, total: u64) {
        self.c
            .metrics
            .rejected_requests
            .with_label_values(&[rejected::CONTENT_LENGTH])
            .inc();
        let declared = self
            .c
            .declared
            .expect("only a declared length can mismatch");
        let msg = mismatch(declared, total);
        self.stop(Stop::Failed(
            AbortReason::LengthMismatch(msg.clone()),
            msg.into(),
        ))
        .await;
    }

    /// Fails the upstream body (without waiting on an upstream that does not read it) and
    /// tells the handler why.
    async fn stop(&self, stop: Stop) {
        if let Stop::Failed(why, e) = stop {
            let _ = self.tx.try_send(Err(e));
            self.c.abort.abort(why);
        }
    }
}

/// A request body fed by [`RequestPump`] through a bounded channel.
struct ChannelBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, BoxError>>,
    remaining: Option<u64>,
    /// Cancelled when the upstream has read the end of the body, or will read no more of it.
    sent: CancellationToken,
}

/// Dropped, the body will be read no further, so the response timeout runs from then: an
/// upstream that stopped reading it part-way still owes its answer within the limit. (A body
/// dropped before its first frame, such as the HTTP/1 client's for a GET of unknown length,
/// is `upstream::retained`'s case: that layer starts the timer and keeps the body for a
/// second send, so this drop comes later.)
impl Drop for ChannelBody {
    fn drop(&mut self) {
        self.sent.cancel();
    }
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
            Poll::Ready(None) => {
                this.sent.cancel();
                Poll::Ready(None)
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

/// How relaying a response body ended.
#[derive(Debug)]
pub enum ResponseEnd {
    /// Every frame was sent; the stream still needs finishing.
    Complete,
    /// The request body failed while the response was being relayed.
    Aborted(AbortReason),
    /// The client sent STOP_SENDING or its connection ended.
    ClientStopped,
    /// Sending data to the client failed: it stopped reading.
    ClientGone(h3::error::StreamError),
    /// Sending the trailers failed.
    TrailersFailed(h3::error::StreamError),
    /// The upstream response body failed mid-way.
    UpstreamFailed(hyper::Error),
    /// Neither the upstream sent nor the client took response bytes for this long.
    Idle(Duration),
}

impl ResponseEnd {
    /// The access log's `refused` value; empty for a complete response.
    pub fn label(&self) -> &'static str {
        match self {
            ResponseEnd::Complete => "",
            ResponseEnd::Aborted(why) => why.label(),
            ResponseEnd::ClientStopped => "client_stopped",
            ResponseEnd::ClientGone(_) => "client_gone",
            ResponseEnd::TrailersFailed(_) => "trailers_failed",
            ResponseEnd::UpstreamFailed(_) => "upstream_reset",
            ResponseEnd::Idle(_) => limit::RESPONSE_BODY_IDLE_TIMEOUT,
        }
    }
}

/// Relays the upstream response body to the client, each step within `idle`; returns how it
/// ended and the body bytes sent.
pub async fn relay_response(
    send: &mut SendHalf,
    body: &mut hyper::body::Incoming,
    abort: &Abort,
    stopped: &mut streams::Stopped,
    idle: Duration,
) -> (ResponseEnd, u64) {
    let mut sent: u64 = 0;
    loop {
        let frame = tokio::select! {
            f = timeout(idle, body.frame()) => f,
            why = abort.aborted() => return (ResponseEnd::Aborted(why), sent),
            _ = stopped.as_mut() => return (ResponseEnd::ClientStopped, sent),
        };
        let frame = match frame {
            Err(_) => return (ResponseEnd::Idle(idle), sent),
            Ok(None) => return (ResponseEnd::Complete, sent),
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(e))) => return (ResponseEnd::UpstreamFailed(e), sent),
        };
        if frame.is_data() {
            let data = frame.into_data().unwrap_or_default();
            let n = data.len() as u64;
            match timeout(idle, send.send_data(data)).await {
                Err(_) => return (ResponseEnd::Idle(idle), sent),
                Ok(Err(e)) => return (ResponseEnd::ClientGone(e), sent),
                Ok(Ok(())) => sent += n,
            }
        } else if let Ok(trailers) = frame.into_trailers() {
            if let Err(e) = send.send_trailers(trailers).await {
                return (ResponseEnd::TrailersFailed(e), sent);
            }
        }
    }
}
