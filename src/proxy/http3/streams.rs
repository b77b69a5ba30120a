//! The QUIC streams under h3: our implementation of h3's `quic` traits on quinn, which puts
//! a [`Scanner`] between every client stream and h3 and keeps, per request stream, what the
//! request handler needs from the transport.
//!
//! - Frames too long for their type are refused from their header, before h3 buffers them
//!   ([`super::frames`]): on a request stream with STOP_SENDING and RESET_STREAM carrying
//!   H3_EXCESSIVE_LOAD (a client that ignores the SETTINGS_MAX_FIELD_SECTION_SIZE it was sent
//!   is abusing the server, and H3_REQUEST_REJECTED would invite it to retry the same frame);
//!   on the control stream by closing the connection with H3_EXCESSIVE_LOAD.
//! - A request stream must complete its header section within `http.requestHeadersTimeoutSeconds`
//!   of opening; the clock is the stream's own, so PINGs or other streams' data do not reset
//!   it. Then the stream is refused with H3_REQUEST_REJECTED: nothing was processed, so a
//!   client may retry.
//! - Header sections are reserved against the buffered-request budget as their frame header
//!   arrives; a request that does not fit is refused with H3_REQUEST_REJECTED.
//! - quinn's `SendStream::stopped` is the only way to learn of STOP_SENDING before writing;
//!   h3-quinn's streams do not expose it, so the streams here are built on quinn directly
//!   and hand it to the request handler as a [`StreamHandle`] (server-initiated streams,
//!   which h3 only writes to, stay h3-quinn's). It is also how the connection learns that
//!   the client has acknowledged a whole response ([`Delivered`]).
//! - Once the connection has sent GOAWAY ([`ConnStreams::refuse_new_requests`]), every
//!   request stream not yet handed to h3 is refused here with H3_REQUEST_REJECTED: its ID is
//!   at or above the GOAWAY's (quinn hands streams over in ID order, and the GOAWAY names the
//!   one after the last h3 accepted), so the client may retry it. h3 itself would still
//!   accept the stream whose ID the GOAWAY names.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures_util::stream::{self, BoxStream, StreamExt};
use futures_util::FutureExt;
use h3::error::Code;
use h3::quic::{self, ConnectionErrorIncoming, StreamErrorIncoming, StreamId, WriteBuf};
use tokio::time::Sleep;
use tracing::{debug, Level};

use super::budget::{ConnShare, Exhausted, Reservation, StreamShare};
use super::frames::{self, Out, Scanner, StreamKind, Violation};
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::metrics::{limit, rejected, Metrics};

/// Bytes read from quinn per call; the copy into a `Bytes` of exactly what was read is what
/// h3 and the scanner hold.
const READ_CHUNK: usize = 16 * 1024;

/// Resolves when the client sent STOP_SENDING for the response or the connection ended.
pub type Stopped = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// Resolves when the client has acknowledged the whole response (the stream finished), when
/// it stopped the stream, when the stream was reset, or when the connection ended: until
/// then, closing the connection could cut off a response to a request that was processed.
pub type Delivered = Stopped;

/// What a request handler takes over from the transport for its stream.
pub struct StreamHandle {
    pub stopped: Stopped,
    /// Set when the stream was refused below h3 (counted there); h3 then reports an
    /// undefined stream error.
    pub refused: Arc<OnceLock<Refused>>,
    /// The stream's share of the buffered-request budget (its header section is already
    /// reserved in it).
    pub share: Arc<StreamShare>,
}

/// The limits one connection's streams are held to.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    pub frames: frames::Limits,
    pub headers_timeout: Duration,
}

/// What every stream of one connection shares.
pub struct ConnStreams {
    quinn: quinn::Connection,
    metrics: Arc<Metrics>,
    budget: Arc<ConnShare>,
    limits: StreamLimits,
    handles: Mutex<HashMap<StreamId, (StreamHandle, Delivered)>>,
    /// Set when the connection sends GOAWAY: new request streams are refused.
    refusing: AtomicBool,
}

impl ConnStreams {
    pub fn new(
        quinn: quinn::Connection,
        metrics: Arc<Metrics>,
        budget: Arc<ConnShare>,
        limits: StreamLimits,
    ) -> Arc<Self> {
        Arc::new(ConnStreams {
            quinn,
            metrics,
            budget,
            limits,
            handles: Mutex::new(HashMap::new()),
            refusing: AtomicBool::new(false),
        })
    }

    /// The handle of request stream `id` and when its response is delivered, once.
    pub fn take(&self, id: StreamId) -> Option<(StreamHandle, Delivered)> {
        self.handles.lock().expect("stream handles").remove(&id)
    }

    /// From now on, refuse every request stream h3 has not accepted yet (H3_REQUEST_REJECTED):
    /// called as the connection sends GOAWAY, before h3 names its ID.
    pub fn refuse_new_requests(&self) {
        self.refusing.store(true, Ordering::Relaxed);
    }

    /// Refuses a request stream that arrived after GOAWAY; nothing of it was read.
    fn refuse_after_goaway(&self, mut send: quinn::SendStream, mut recv: quinn::RecvStream) {
        let code = var(Code::H3_REQUEST_REJECTED.value());
        let _ = recv.stop(code);
        let _ = send.reset(code);
        let m = &self.metrics;
        m.rejected_requests
            .with_label_values(&[rejected::AFTER_GOAWAY])
            .inc();
        debug!(stream = %stream_id(send.id()), "request after GOAWAY refused unprocessed");
    }

    fn forget(&self, id: StreamId) {
        self.handles.lock().expect("stream handles").remove(&id);
    }
}

/// Why a stream was refused below h3; h3 reports it as `StreamError::Undefined` carrying this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Frame(#[from] Violation),
    #[error("the header section did not arrive within {0:?}")]
    HeadersTimeout(Duration),
    #[error(transparent)]
    Budget(#[from] Exhausted),
}

impl Refused {
    /// The `h3_ingress_limits_total` label of the limit that acted.
    pub fn limit(&self) -> &'static str {
        match self {
            Refused::Frame(Violation::Headers { .. }) => limit::HEADERS_FRAME,
            Refused::Frame(Violation::Frame { .. }) => limit::CONTROL_FRAME,
            Refused::HeadersTimeout(_) => limit::REQUEST_HEADERS_TIMEOUT,
            Refused::Budget(e) => e.limit(),
        }
    }

    /// The stream (or, on the control stream, connection) error code; see the module docs.
    pub fn code(&self, header_section_complete: bool) -> Code {
        match self {
            Refused::Frame(_) => Code::H3_EXCESSIVE_LOAD,
            // Once the request is being processed it must not be called unprocessed.
            _ if header_section_complete => Code::H3_EXCESSIVE_LOAD,
            _ => Code::H3_REQUEST_REJECTED,
        }
    }
}

fn connection_error(e: quinn::ConnectionError) -> ConnectionErrorIncoming {
    match e {
        quinn::ConnectionError::ApplicationClosed(c) => ConnectionErrorIncoming::ApplicationClose {
            error_code: c.error_code.into_inner(),
        },
        quinn::ConnectionError::TimedOut => ConnectionErrorIncoming::Timeout,
        other => ConnectionErrorIncoming::Undefined(Arc::new(other)),
    }
}

fn read_error(e: quinn::ReadError) -> StreamErrorIncoming {
    match e {
        quinn::ReadError::Reset(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::ReadError::ConnectionLost(c) => StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(c),
        },
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

fn write_error(e: quinn::WriteError) -> StreamErrorIncoming {
    match e {
        quinn::WriteError::Stopped(code) => StreamErrorIncoming::StreamTerminated {
            error_code: code.into_inner(),
        },
        quinn::WriteError::ConnectionLost(c) => StreamErrorIncoming::ConnectionErrorIncoming {
            connection_error: connection_error(c),
        },
        other => StreamErrorIncoming::Unknown(Box::new(other)),
    }
}

fn stream_id(id: quinn::StreamId) -> StreamId {
    StreamId::try_from(u64::from(id)).expect("quinn stream IDs are valid varints")
}

fn var(code: u64) -> quinn::VarInt {
    quinn::VarInt::from_u64(code).unwrap_or(quinn::VarInt::MAX)
}

/// The per-request part of a guarded receive stream.
struct RequestGuard {
    refused: Arc<OnceLock<Refused>>,
    deadline: Option<Pin<Box<Sleep>>>,
    share: Arc<StreamShare>,
    held: Vec<Reservation>,
}

/// A client stream's receive side, scanned frame by frame on its way to h3.
pub struct GuardedRecv {
    inner: quinn::RecvStream,
    id: StreamId,
    scanner: Scanner,
    /// Read from quinn, not yet passed on.
    pending: Bytes,
    finished: bool,
    conn: Arc<ConnStreams>,
    request: Option<RequestGuard>,
    refused: Option<Refused>,
}

impl GuardedRecv {
    fn new(
        inner: quinn::RecvStream,
        conn: Arc<ConnStreams>,
        request: Option<RequestGuard>,
    ) -> Self {
        let kind = if request.is_some() {
            StreamKind::Request
        } else {
            StreamKind::Uni
        };
        GuardedRecv {
            id: stream_id(inner.id()),
            inner,
            scanner: Scanner::new(kind, conn.limits.frames),
            pending: Bytes::new(),
            finished: false,
            request,
            conn,
            refused: None,
        }
    }

    fn read(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        let mut buf = [0u8; READ_CHUNK];
        let n = ready!(self.inner.poll_read(cx, &mut buf)).map_err(read_error)?;
        if n == 0 {
            self.finished = true;
        } else {
            self.pending = Bytes::copy_from_slice(&buf[..n]);
        }
        Poll::Ready(Ok(()))
    }

    /// The header-section clock: `Err` once it ran out; registers the wake-up otherwise.
    fn check_deadline(&mut self, cx: &mut Context<'_>) -> Result<(), Refused> {
        let Some(deadline) = self.request.as_mut().and_then(|r| r.deadline.as_mut()) else {
            return Ok(());
        };
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(Refused::HeadersTimeout(self.conn.limits.headers_timeout)),
            Poll::Pending => Ok(()),
        }
    }

    fn reserve_headers(&mut self, len: u64) -> Result<(), Refused> {
        if let Some(r) = self.request.as_mut() {
            r.held.push(r.share.reserve(len)?);
        }
        Ok(())
    }

    fn progressed(&mut self) {
        if let Some(r) = self.request.as_mut() {
            if self.scanner.header_section_complete() {
                r.deadline = None;
            }
        }
    }

    /// Counts and acts on a refusal; the stream or connection error goes out here.
    fn refuse(&mut self, why: Refused) -> StreamErrorIncoming {
        let m = &self.conn.metrics;
        m.limit(why.limit());
        let code = why.code(self.scanner.header_section_complete());
        if let Refused::Budget(e) = why {
            limited!(
                Level::WARN,
                Reason::RequestBudget,
                "refusing a request: {e}"
            );
        }
        if self.request.is_some() {
            debug!(stream = %self.id, %why, ?code, "request stream refused");
            let _ = self.inner.stop(var(code.value()));
        } else {
            debug!(%why, "control stream violated a limit; closing the connection");
            self.conn
                .quinn
                .close(var(code.value()), why.to_string().as_bytes());
        }
        if let Some(r) = self.request.as_ref() {
            let _ = r.refused.set(why);
        }
        self.refused = Some(why);
        StreamErrorIncoming::Unknown(Box::new(why))
    }

    fn next(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        if let Some(why) = self.refused {
            return Poll::Ready(Err(StreamErrorIncoming::Unknown(Box::new(why))));
        }
        loop {
            if self.pending.is_empty() {
                if self.finished {
                    return Poll::Ready(Ok(None));
                }
                if let Err(why) = self.check_deadline(cx) {
                    return Poll::Ready(Err(self.refuse(why)));
                }
                ready!(self.read(cx))?;
                continue;
            }
            let (n, out) = match self.scanner.feed(&self.pending) {
                Ok(step) => step,
                Err(v) => return Poll::Ready(Err(self.refuse(v.into()))),
            };
            let data = match out {
                Out::Held => {
                    self.pending.advance(n);
                    continue;
                }
                Out::Header { headers } => {
                    if let Err(why) = headers.map_or(Ok(()), |len| self.reserve_headers(len)) {
                        return Poll::Ready(Err(self.refuse(why)));
                    }
                    let h = Bytes::copy_from_slice(self.scanner.header());
                    self.scanner.header_sent();
                    self.pending.advance(n);
                    h
                }
                Out::Payload => self.pending.split_to(n),
            };
            self.progressed();
            return Poll::Ready(Ok(Some(data)));
        }
    }
}

impl Drop for GuardedRecv {
    fn drop(&mut self) {
        if self.request.is_some() {
            // h3 may drop a stream it never handed out (refused during GOAWAY).
            self.conn.forget(self.id);
        }
    }
}

impl quic::RecvStream for GuardedRecv {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        self.next(cx)
    }

    fn stop_sending(&mut self, error_code: u64) {
        let _ = self.inner.stop(var(error_code));
    }

    fn recv_id(&self) -> StreamId {
        self.id
    }
}

/// A request stream's send side, on quinn.
pub struct SendHalf {
    inner: quinn::SendStream,
    writing: Option<WriteBuf<Bytes>>,
}

impl quic::SendStream<Bytes> for SendHalf {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        while let Some(buf) = self.writing.as_mut() {
            if !buf.has_remaining() {
                self.writing = None;
                break;
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, buf.chunk()))
                .map_err(write_error)?;
            buf.advance(n);
        }
        Poll::Ready(Ok(()))
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        if self.writing.is_some() {
            return Err(StreamErrorIncoming::ConnectionErrorIncoming {
                connection_error: ConnectionErrorIncoming::InternalError(
                    "send_data before the previous write completed".into(),
                ),
            });
        }
        self.writing = Some(data.into());
        Ok(())
    }

    fn poll_finish(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        Poll::Ready(
            self.inner
                .finish()
                .map_err(|e| StreamErrorIncoming::Unknown(Box::new(e))),
        )
    }

    fn reset(&mut self, reset_code: u64) {
        let _ = self.inner.reset(var(reset_code));
    }

    fn send_id(&self) -> StreamId {
        stream_id(self.inner.id())
    }
}

/// A request stream: both sides until h3 splits them.
pub struct RequestStream {
    send: SendHalf,
    recv: GuardedRecv,
}

impl quic::RecvStream for RequestStream {
    type Buf = Bytes;

    fn poll_data(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Option<Bytes>, StreamErrorIncoming>> {
        let first = self.recv.refused.is_none();
        let r = self.recv.next(cx);
        if let (true, Some(why)) = (first, self.recv.refused) {
            let code = why.code(self.recv.scanner.header_section_complete());
            quic::SendStream::reset(&mut self.send, code.value());
        }
        r
    }

    fn stop_sending(&mut self, error_code: u64) {
        self.recv.stop_sending(error_code);
    }

    fn recv_id(&self) -> StreamId {
        self.recv.id
    }
}

impl quic::SendStream<Bytes> for RequestStream {
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_ready(cx)
    }

    fn send_data<T: Into<WriteBuf<Bytes>>>(&mut self, data: T) -> Result<(), StreamErrorIncoming> {
        self.send.send_data(data)
    }

    fn poll_finish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), StreamErrorIncoming>> {
        self.send.poll_finish(cx)
    }

    fn reset(&mut self, reset_code: u64) {
        self.send.reset(reset_code);
    }

    fn send_id(&self) -> StreamId {
        self.send.send_id()
    }
}

impl quic::BidiStream<Bytes> for RequestStream {
    type SendStream = SendHalf;
    type RecvStream = GuardedRecv;

    fn split(self) -> (SendHalf, GuardedRecv) {
        (self.send, self.recv)
    }
}

/// Server-initiated streams: h3-quinn's (h3 only writes to them). The server never opens a
/// bidirectional stream.
pub struct Opener(h3_quinn::OpenStreams);

impl quic::OpenStreams<Bytes> for Opener {
    type BidiStream = RequestStream;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        _cx: &mut Context<'_>,
    ) -> Poll<Result<RequestStream, StreamErrorIncoming>> {
        Poll::Ready(Err(StreamErrorIncoming::Unknown(
            "an HTTP/3 server opens no bidirectional streams".into(),
        )))
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.0.poll_open_send(cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        quic::OpenStreams::<Bytes>::close(&mut self.0, code, reason);
    }
}

impl Clone for Opener {
    fn clone(&self) -> Self {
        Opener(self.0.clone())
    }
}

type Accepted<T> = BoxStream<'static, Result<T, quinn::ConnectionError>>;

/// One QUIC connection as h3 sees it.
pub struct Connection {
    streams: Arc<ConnStreams>,
    bi: Accepted<(quinn::SendStream, quinn::RecvStream)>,
    uni: Accepted<quinn::RecvStream>,
    opener: Opener,
}

impl Connection {
    pub fn new(streams: Arc<ConnStreams>) -> Self {
        let q = streams.quinn.clone();
        let bi = stream::unfold(q.clone(), |q| async move {
            let next = q.accept_bi().await;
            Some((next, q))
        });
        let uni = stream::unfold(q.clone(), |q| async move {
            let next = q.accept_uni().await;
            Some((next, q))
        });
        let opener = Opener(quic::Connection::<Bytes>::opener(
            &h3_quinn::Connection::new(q),
        ));
        Connection {
            streams,
            bi: bi.boxed(),
            uni: uni.boxed(),
            opener,
        }
    }

    fn request_stream(&self, send: quinn::SendStream, recv: quinn::RecvStream) -> RequestStream {
        let share = self.streams.budget.stream();
        let stopped: Stopped = Box::pin(send.stopped().map(|_| ()));
        // The same event as `stopped`, or the acknowledgement of the finished stream.
        let delivered: Delivered = Box::pin(send.stopped().map(|_| ()));
        let id = stream_id(send.id());
        let deadline = Box::pin(tokio::time::sleep(self.streams.limits.headers_timeout));
        let refused = Arc::new(OnceLock::new());
        let guard = RequestGuard {
            refused: refused.clone(),
            deadline: Some(deadline),
            share: share.clone(),
            held: Vec::new(),
        };
        let handle = StreamHandle {
            stopped,
            refused,
            share,
        };
        let handles = &self.streams.handles;
        (handles.lock().expect("stream handles")).insert(id, (handle, delivered));
        RequestStream {
            send: SendHalf {
                inner: send,
                writing: None,
            },
            recv: GuardedRecv::new(recv, self.streams.clone(), Some(guard)),
        }
    }
}

impl quic::Connection<Bytes> for Connection {
    type RecvStream = GuardedRecv;
    type OpenStreams = Opener;

    fn poll_accept_recv(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<GuardedRecv, ConnectionErrorIncoming>> {
        let next = ready!(self.uni.poll_next_unpin(cx)).expect("the accept stream never ends");
        let recv = next.map_err(connection_error)?;
        Poll::Ready(Ok(GuardedRecv::new(recv, self.streams.clone(), None)))
    }

    fn poll_accept_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RequestStream, ConnectionErrorIncoming>> {
        loop {
            let next = ready!(self.bi.poll_next_unpin(cx)).expect("the accept stream never ends");
            let (send, recv) = next.map_err(connection_error)?;
            if self.streams.refusing.load(Ordering::Relaxed) {
                self.streams.refuse_after_goaway(send, recv);
                continue;
            }
            return Poll::Ready(Ok(self.request_stream(send, recv)));
        }
    }

    fn opener(&self) -> Opener {
        self.opener.clone()
    }
}

impl quic::OpenStreams<Bytes> for Connection {
    type BidiStream = RequestStream;
    type SendStream = h3_quinn::SendStream<Bytes>;

    fn poll_open_bidi(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<RequestStream, StreamErrorIncoming>> {
        self.opener.poll_open_bidi(cx)
    }

    fn poll_open_send(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Self::SendStream, StreamErrorIncoming>> {
        self.opener.poll_open_send(cx)
    }

    fn close(&mut self, code: Code, reason: &[u8]) {
        self.opener.close(code, reason);
    }
}
