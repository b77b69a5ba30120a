//! Response body data in fewer, larger HTTP/3 DATA frames.
//!
//! nginx hands out HTTP/2 DATA frames of 8 KiB (`http2_chunk_size`), other ingresses 16 KiB.
//! Forwarding each one as its own HTTP/3 frame costs, per 8 KiB: a frame header write and a
//! data write into quinn (each takes the connection lock, allocates and wakes the connection
//! driver), a driver run that often ends with a short GSO batch, and a pass of the response
//! loop. Frames that have already arrived when one is taken are merged with it, up to
//! [`DATA_BATCH_BYTES`]; nothing ever waits for more data, so no latency is added.

use bytes::{Bytes, BytesMut};
use futures_util::FutureExt;
use http_body::{Body, Frame};
use http_body_util::BodyExt;

/// Upper bound of one merged DATA frame: 8 nginx frames, 48 packets of 1340 bytes, below
/// glibc's mmap threshold so the merge buffer is an ordinary heap block.
pub const DATA_BATCH_BYTES: usize = 64 * 1024;

/// A body whose consecutive ready data frames come out as one.
pub struct Batched<B: Body> {
    body: B,
    /// A non-data frame (trailers), an error or the end, found while merging: it comes next.
    pending: Option<Option<Result<Frame<Bytes>, B::Error>>>,
    cap: usize,
}

impl<B> Batched<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    pub fn new(body: B, cap: usize) -> Self {
        Self {
            body,
            pending: None,
            cap,
        }
    }

    /// The next frame. Cancel-safe: the only await is the wait for the first frame.
    pub async fn frame(&mut self) -> Option<Result<Frame<Bytes>, B::Error>> {
        let first = match self.pending.take() {
            Some(next) => next,
            None => self.body.frame().await,
        };
        let first = match first {
            Some(Ok(frame)) if frame.is_data() => frame.into_data().unwrap_or_default(),
            other => return other,
        };
        let mut parts = vec![first];
        let mut len = parts[0].len();
        while len < self.cap {
            // Only what is already there: `now_or_never` gives up at the first Pending.
            let Some(next) = self.body.frame().now_or_never() else {
                break;
            };
            match next {
                Some(Ok(frame)) if frame.is_data() => {
                    let data = frame.into_data().unwrap_or_default();
                    len += data.len();
                    parts.push(data);
                }
                other => {
                    self.pending = Some(other);
                    break;
                }
            }
        }
        Some(Ok(Frame::data(merge(parts, len))))
    }
}

/// One buffer from several; a single part is passed through without a copy.
fn merge(mut parts: Vec<Bytes>, len: usize) -> Bytes {
    if parts.len() == 1 {
        return parts.pop().unwrap_or_default();
    }
    let mut buf = BytesMut::with_capacity(len);
    for part in parts {
        buf.extend_from_slice(&part);
    }
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A body that yields scripted steps: a frame, an error, or one Pending.
    enum Step {
        Data(&'static [u8]),
        Trailers,
        Error,
        Pending,
    }

    struct Script(VecDeque<Step>);

    impl Body for Script {
        type Data = Bytes;
        type Error = &'static str;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, &'static str>>> {
            match self.0.pop_front() {
                None => Poll::Ready(None),
                Some(Step::Data(d)) => Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(d))))),
                Some(Step::Trailers) => {
                    let mut t = http::HeaderMap::new();
                    t.insert("x-t", http::HeaderValue::from_static("1"));
                    Poll::Ready(Some(Ok(Frame::trailers(t))))
                }
                Some(Step::Error) => Poll::Ready(Some(Err("upstream reset"))),
                Some(Step::Pending) => {
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            }
        }
    }

    fn batched(steps: Vec<Step>, cap: usize) -> Batched<Script> {
        Batched::new(Script(steps.into()), cap)
    }

    async fn data(b: &mut Batched<Script>) -> Vec<u8> {
        let frame = b.frame().await.expect("a frame").expect("no error");
        frame.into_data().expect("data").to_vec()
    }

    #[tokio::test]
    async fn ready_frames_merge_and_a_pending_ends_the_batch() {
        use Step::*;
        let mut b = batched(
            vec![Data(b"ab"), Data(b"cd"), Data(b"e"), Pending, Data(b"fg")],
            1024,
        );
        assert_eq!(data(&mut b).await, b"abcde");
        // The Pending was not waited out inside the first batch; the next call waits for it.
        assert_eq!(data(&mut b).await, b"fg");
        assert!(b.frame().await.is_none());
    }

    #[tokio::test]
    async fn the_cap_bounds_a_batch() {
        use Step::*;
        let mut b = batched(vec![Data(b"abc"), Data(b"def"), Data(b"ghi")], 5);
        assert_eq!(data(&mut b).await, b"abcdef");
        assert_eq!(data(&mut b).await, b"ghi");
    }

    #[tokio::test]
    async fn trailers_error_and_end_come_after_the_data_before_them() {
        use Step::*;
        let mut b = batched(vec![Data(b"a"), Data(b"b"), Trailers], 1024);
        assert_eq!(data(&mut b).await, b"ab");
        let t = b.frame().await.unwrap().unwrap();
        assert_eq!(t.trailers_ref().unwrap()["x-t"], "1");
        assert!(b.frame().await.is_none());

        let mut b = batched(vec![Data(b"a"), Error, Data(b"never")], 1024);
        assert_eq!(data(&mut b).await, b"a");
        assert_eq!(b.frame().await.unwrap().unwrap_err(), "upstream reset");

        let mut b = batched(vec![Data(b"a")], 1024);
        assert_eq!(data(&mut b).await, b"a");
        assert!(b.frame().await.is_none());
    }

    #[test]
    fn one_part_is_not_copied() {
        let part = Bytes::from(vec![7u8; 100]);
        let ptr = part.as_ptr();
        assert_eq!(merge(vec![part], 100).as_ptr(), ptr);
        assert_eq!(
            merge(vec![Bytes::from_static(b"x"), Bytes::from_static(b"yz")], 3),
            Bytes::from_static(b"xyz")
        );
    }
}
