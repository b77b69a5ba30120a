//! A request body that can go to the upstream again while the upstream has taken nothing
//! from it.
//!
//! An upstream that ends its HTTP/2 connection (nginx after `keepalive_requests`) refuses
//! the streams past the GOAWAY's last stream ID, and RFC 9113 8.7 lets such a request be
//! sent again on another connection. Which requests can be sent again is not a property of
//! the request but of what the upstream read: a GET whose QUIC FIN came in a packet after its
//! HEADERS is forwarded with a streamed body that turns out empty, and an upload the refused
//! stream never read is still whole in the pump's channel. So each send wraps the body in a
//! [`Retained`], which gives the body back through a oneshot channel when it is dropped before
//! yielding a frame, and gives up that right at its first frame.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{empty_body, BoxError, UpstreamBody};

/// One send's body; see the module's doc.
pub struct Retained {
    inner: Option<UpstreamBody>,
    /// Where the body goes back when this drops untouched; `None` once a frame went out.
    back: Option<oneshot::Sender<UpstreamBody>>,
    /// Cancelled when this drops before its end was read: the HTTP/1 client drops the body
    /// of a GET or HEAD of unknown length without reading it (it sends `content-length: 0`),
    /// and the response timeout must run from then.
    unread: CancellationToken,
}

/// The other end of a [`Retained`]: the body, if the upstream took nothing from it.
pub type Returned = oneshot::Receiver<UpstreamBody>;

impl Retained {
    /// Wraps `body` for one send; the token is cancelled when the send drops the body unread.
    pub fn new(body: UpstreamBody) -> (Self, Returned, CancellationToken) {
        let (tx, rx) = oneshot::channel();
        let unread = CancellationToken::new();
        let me = Retained {
            inner: Some(body),
            back: Some(tx),
            unread: unread.clone(),
        };
        (me, rx, unread)
    }

    pub fn boxed(self) -> UpstreamBody {
        BodyExt::boxed(self)
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        self.unread.cancel();
        if let (Some(back), Some(body)) = (self.back.take(), self.inner.take()) {
            let _ = back.send(body);
        }
    }
}

impl Body for Retained {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let next = Pin::new(inner).poll_frame(cx);
        match &next {
            Poll::Pending => {}
            // An empty body read to its end: a later send gets an empty body, which is what
            // this one was (a finished body need not answer a second poll the same way).
            Poll::Ready(None) => {
                this.unread = CancellationToken::new();
                this.inner = Some(empty_body());
            }
            Poll::Ready(Some(_)) => {
                this.back = None;
                this.unread = CancellationToken::new();
            }
        }
        next
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |b| b.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full(s: &'static str) -> UpstreamBody {
        http_body_util::Full::new(Bytes::from_static(s.as_bytes()))
            .map_err(|never| match never {})
            .boxed()
    }

    #[tokio::test]
    async fn a_body_dropped_untouched_comes_back_whole() {
        let (r, back, unread) = Retained::new(full("abc"));
        drop(r);
        assert!(unread.is_cancelled());
        let body = back.await.expect("given back");
        let bytes = body.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abc");
    }

    #[tokio::test]
    async fn a_body_that_gave_a_frame_does_not_come_back() {
        let (mut r, back, unread) = Retained::new(full("abc"));
        let frame = r.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "abc");
        drop(r);
        assert!(back.await.is_err());
        assert!(!unread.is_cancelled(), "read, not dropped unread");
    }

    #[tokio::test]
    async fn an_empty_body_read_to_its_end_comes_back_empty() {
        let (mut r, back, unread) = Retained::new(empty_body());
        assert!(r.frame().await.is_none());
        drop(r);
        assert!(!unread.is_cancelled(), "its end was read");
        let body = back.await.expect("an empty body can go again");
        assert!(body.collect().await.unwrap().to_bytes().is_empty());
    }
}
