//! The two body pumps of a request: the request body from the QUIC stream to the TCP ingress
//! (read ahead when small, streamed when not, checked against Content-Length either way) and
//! the response body back, frame by frame. Memory stays bounded: at most a few chunks are in
//! flight in either direction.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::FutureExt;
use h3::error::Code;
use h3::server::RequestStream;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::metrics::{rejected, Metrics};
use super::upstream::{BoxError, UpstreamBody};

pub type SendHalf = RequestStream<h3_quinn::SendStream<Bytes>, Bytes>;
pub type RecvHalf = RequestStream<h3_quinn::RecvStream, Bytes>;

/// Bodies up to this size with a declared Content-Length are read completely before the
/// request goes upstream, so a length mismatch is refused before the ingress sees anything.
/// Larger bodies stream; a mismatch then aborts the upstream request mid-body.
pub const PREREAD_LIMIT: u64 = 64 * 1024;

/// Request body chunks buffered between the QUIC stream and the upstream request.
const CHANNEL_CHUNKS: usize = 8;

#[derive(Debug)]
pub enum BodyError {
    /// The body does not have the length its header declared (the text says how).
    LengthMismatch(String),
    /// The client reset or abandoned the stream.
    Client(h3::error::StreamError),
}

fn mismatch(declared: u64, got: u64) -> BodyError {
    BodyError::LengthMismatch(format!(
        "header content-length says {declared} bytes but the request carried {}{got}",
        if got > declared { "at least " } else { "" }
    ))
}

fn mismatch_msg(declared: u64, got: u64) -> BoxError {
    match mismatch(declared, got) {
        BodyError::LengthMismatch(m) => m.into(),
        BodyError::Client(e) => Box::new(e),
    }
}

fn complete(data: Option<Bytes>, trailers: Option<http::HeaderMap>) -> UpstreamBody {
    match (data, trailers) {
        (Some(data), None) => http_body_util::Full::new(data)
            .map_err(|never| match never {})
            .boxed(),
        (None, None) => http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed(),
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

/// Reads a small body with a declared length completely, checking the length.
async fn preread(
    recv: &mut RecvHalf,
    declared: u64,
    metrics: &Metrics,
) -> Result<UpstreamBody, BodyError> {
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
    metrics
        .body_bytes
        .with_label_values(&["upload"])
        .inc_by(declared);
    Ok(complete(Some(buf.freeze()), trailers))
}

/// The request body for the upstream request. Takes `recv` when the body streams (the pump
/// task owns it then); leaves it otherwise.
pub async fn request_body(
    recv: &mut Option<RecvHalf>,
    declared: Option<u64>,
    cancel: &CancellationToken,
    metrics: &Arc<Metrics>,
    client: SocketAddr,
) -> Result<UpstreamBody, BodyError> {
    let stream = recv.as_mut().expect("the request body is read once");
    if let Some(d) = declared.filter(|d| *d <= PREREAD_LIMIT) {
        return preread(stream, d, metrics).await;
    }
    // Most requests without a body arrive with the stream already finished. Then the
    // upstream gets an empty body, not a chunked one (a GET with `transfer-encoding: chunked`
    // is refused by some servers).
    let first = match stream.recv_data().now_or_never() {
        Some(Ok(None)) => {
            if let Some(d) = declared.filter(|d| *d > 0) {
                return Err(mismatch(d, 0));
            }
            let trailers = stream.recv_trailers().await.map_err(BodyError::Client)?;
            return Ok(complete(None, trailers));
        }
        Some(Ok(Some(mut chunk))) => chunk.copy_to_bytes(chunk.remaining()),
        Some(Err(e)) => return Err(BodyError::Client(e)),
        None => Bytes::new(),
    };
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    let pump = RequestPump {
        recv: recv.take().expect("checked above"),
        declared,
        tx,
        cancel: cancel.clone(),
        metrics: metrics.clone(),
        client,
    };
    tokio::spawn(pump.run(first));
    Ok(ChannelBody {
        rx,
        remaining: declared,
    }
    .boxed())
}

/// Moves a streamed request body from the QUIC stream to the upstream request, chunk by
/// chunk, checking Content-Length as it goes.
struct RequestPump {
    recv: RecvHalf,
    declared: Option<u64>,
    tx: mpsc::Sender<Result<Frame<Bytes>, BoxError>>,
    /// Fired when the body fails, so the request is not answered from a broken upload.
    cancel: CancellationToken,
    metrics: Arc<Metrics>,
    client: SocketAddr,
}

impl RequestPump {
    async fn run(mut self, first: Bytes) {
        let mut total: u64 = 0;
        let upload = self.metrics.body_bytes.with_label_values(&["upload"]);
        let mut pending = (!first.is_empty()).then_some(first);
        loop {
            let next = match pending.take() {
                Some(data) => Ok(Some(data)),
                None => self
                    .recv
                    .recv_data()
                    .await
                    .map(|c| c.map(|mut c| c.copy_to_bytes(c.remaining()))),
            };
            match next {
                Ok(Some(data)) => {
                    total += data.len() as u64;
                    upload.inc_by(data.len() as u64);
                    if self.declared.is_some_and(|d| total > d) {
                        self.recv.stop_sending(Code::H3_MESSAGE_ERROR);
                        return self.length_mismatch(total).await;
                    }
                    if self.tx.send(Ok(Frame::data(data))).await.is_err() {
                        // The upstream request no longer wants the body (it answered already).
                        self.recv.stop_sending(Code::H3_NO_ERROR);
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    debug!(client = %self.client, error = %e, "request body aborted by the client");
                    return self.fail(Box::new(e)).await;
                }
            }
        }
        if self.declared.is_some_and(|d| total != d) {
            return self.length_mismatch(total).await;
        }
        match self.recv.recv_trailers().await {
            Ok(Some(t)) => {
                let _ = self.tx.send(Ok(Frame::trailers(t))).await;
            }
            Ok(None) => {}
            Err(e) => self.fail(Box::new(e)).await,
        }
    }

    async fn length_mismatch(&self, total: u64) {
        self.metrics
            .rejected_requests
            .with_label_values(&[rejected::CONTENT_LENGTH])
            .inc();
        let declared = self.declared.expect("only a declared length can mismatch");
        self.fail(mismatch_msg(declared, total)).await;
    }

    async fn fail(&self, e: BoxError) {
        let _ = self.tx.send(Err(e)).await;
        self.cancel.cancel();
    }
}

/// A request body fed by [`RequestPump`] through a bounded channel.
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

/// How relaying a response body ended.
#[derive(Debug)]
pub enum ResponseEnd {
    /// Every frame was sent; the stream still needs finishing.
    Complete,
    /// The request was cancelled (client reset) while waiting for the upstream.
    Cancelled,
    /// Sending data to the client failed: it stopped reading.
    ClientGone(h3::error::StreamError),
    /// Sending the trailers failed.
    TrailersFailed(h3::error::StreamError),
    /// The upstream response body failed mid-way.
    UpstreamFailed(hyper::Error),
}

/// Relays the upstream response body to the client; returns how it ended and the body bytes
/// sent.
pub async fn relay_response(
    send: &mut SendHalf,
    body: &mut hyper::body::Incoming,
    cancel: &CancellationToken,
) -> (ResponseEnd, u64) {
    let mut sent: u64 = 0;
    loop {
        let frame = tokio::select! {
            f = body.frame() => f,
            _ = cancel.cancelled() => return (ResponseEnd::Cancelled, sent),
        };
        let frame = match frame {
            None => return (ResponseEnd::Complete, sent),
            Some(Ok(frame)) => frame,
            Some(Err(e)) => return (ResponseEnd::UpstreamFailed(e), sent),
        };
        if frame.is_data() {
            let data = frame.into_data().unwrap_or_default();
            sent += data.len() as u64;
            if let Err(e) = send.send_data(data).await {
                return (ResponseEnd::ClientGone(e), sent);
            }
        } else if let Ok(trailers) = frame.into_trailers() {
            if let Err(e) = send.send_trailers(trailers).await {
                return (ResponseEnd::TrailersFailed(e), sent);
            }
        }
    }
}
