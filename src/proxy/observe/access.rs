//! The access log of the HTTP/3 side (`accessLog.enabled`): one JSON line per request on
//! standard output.
//!
//! A request never waits for it: its line goes into a bounded queue ([`QUEUE_LINES`]) that one
//! writer task empties; a line that does not fit is dropped and counted
//! (`h3_ingress_access_log_dropped_total`). Nothing is rate-limited (it is the log the user
//! asked for), but every field a client chooses is cut to a fixed length (the line says which
//! were cut) and serialised by serde_json, which escapes quotes, backslashes and control
//! characters: a line is always one valid JSON object of at most [`MAX_LINE_BYTES`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::IntCounter;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

/// Lines waiting for the writer; beyond this they are dropped (and counted).
pub const QUEUE_LINES: usize = 4096;
/// Longest path kept, in bytes (a longer one is cut and `truncated` names it).
pub const MAX_PATH_BYTES: usize = 2048;
/// Longest authority, SNI, method or upstream address kept, in bytes.
pub const MAX_FIELD_BYTES: usize = 256;
/// No line is longer, whatever a client sends: each cut field escaped at worst six bytes
/// per byte (`\u00XX`), plus the fixed fields.
pub const MAX_LINE_BYTES: usize = 6 * (MAX_PATH_BYTES + 4 * MAX_FIELD_BYTES) + 1024;

/// What one line says about one request; `None` fields are left out.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Entry {
    /// RFC 3339, UTC, milliseconds: when the request stream was accepted.
    pub time: String,
    pub client: String,
    pub client_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What the client got; absent when the stream was reset instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Request body bytes received from the client.
    pub bytes_received: u64,
    /// Response body bytes sent to the client.
    pub bytes_sent: u64,
    pub duration_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
    /// Why the request did not get the upstream's full answer: the `reason` of
    /// `h3_ingress_rejected_requests_total`, the `limit` of `h3_ingress_limits_total`, the
    /// `kind` of `h3_ingress_upstream_errors_total`, or how the stream ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<&'static str>,
    /// Fields cut to their maximum length.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub truncated: Vec<&'static str>,
}

impl Entry {
    /// An entry for a request from `client` that started at `started`.
    pub fn new(client: SocketAddr, started: SystemTime) -> Self {
        Entry {
            time: rfc3339_millis(started),
            client: match client.ip() {
                std::net::IpAddr::V6(v6) => v6
                    .to_ipv4_mapped()
                    .map_or(std::net::IpAddr::V6(v6), std::net::IpAddr::V4),
                v4 => v4,
            }
            .to_string(),
            client_port: client.port(),
            ..Default::default()
        }
    }

    /// Sets a client-chosen field, cut to `max` bytes on a character boundary.
    pub fn set(&mut self, field: &'static str, value: &str, max: usize) -> Option<String> {
        if value.len() <= max {
            return Some(value.to_string());
        }
        let mut end = max;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.truncated.push(field);
        Some(value[..end].to_string())
    }

    /// The JSON line, newline included.
    pub fn line(&self) -> String {
        let mut s = serde_json::to_string(self).expect("an entry serialises");
        s.push('\n');
        s
    }
}

/// `2026-12-03T20:51:10.123Z` for `t`.
pub fn rfc3339_millis(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), proleptic Gregorian.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// The queue to the writer task, and whether lines are wanted at all.
pub struct AccessLog {
    enabled: AtomicBool,
    tx: Option<mpsc::Sender<String>>,
    dropped: IntCounter,
}

impl AccessLog {
    /// Starts the writer task on the current runtime (none outside one: then nothing is
    /// ever written, and every line is counted as dropped).
    pub fn start(dropped: IntCounter) -> Self {
        let tx = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (tx, rx) = mpsc::channel(QUEUE_LINES);
            rt.spawn(write_lines(rx, tokio::io::stdout()));
            tx
        });
        AccessLog {
            enabled: AtomicBool::new(false),
            tx,
            dropped,
        }
    }

    /// Follows `accessLog.enabled` of the configuration applied.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Queues `entry`'s line without waiting; counts it as dropped when the queue is full.
    pub fn write(&self, entry: &Entry) {
        let queued = self
            .tx
            .as_ref()
            .is_some_and(|tx| tx.try_send(entry.line()).is_ok());
        if !queued {
            self.dropped.inc();
        }
    }
}

/// How long the writer gathers lines before it writes them out. Each flush of standard output
/// is a write(2) on tokio's blocking pool (a thread hand-off): flushed per line, at a few hundred
/// requests a second, that cost more proxy CPU than the line itself. A line is on the output at
/// most this long after its request ended (or as soon as 64 KiB are waiting).
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);

/// Writes queued lines, gathering for [`FLUSH_AFTER`] after the first of a batch, then
/// flushing once; everything queued is written before the task ends.
async fn write_lines(mut rx: mpsc::Receiver<String>, out: impl tokio::io::AsyncWrite + Unpin) {
    let mut out = tokio::io::BufWriter::with_capacity(64 * 1024, out);
    while let Some(line) = rx.recv().await {
        if out.write_all(line.as_bytes()).await.is_err() {
            return;
        }
        let until = tokio::time::Instant::now() + FLUSH_AFTER;
        let mut open = true;
        while open {
            match tokio::time::timeout_at(until, rx.recv()).await {
                Ok(Some(line)) => {
                    if out.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                }
                Ok(None) => open = false,
                Err(_elapsed) => break,
            }
        }
        if out.flush().await.is_err() || !open {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::from_millis(1_796_331_070_123);
        assert_eq!(rfc3339_millis(t), "2026-12-03T20:51:10.123Z");
        assert_eq!(rfc3339_millis(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339_millis(leap), "2000-02-29T00:00:00.000Z");
    }

    /// Whatever a client puts in its fields, a line is one JSON object, bounded, that says
    /// what it cut.
    #[test]
    fn hostile_fields_cannot_break_or_grow_a_line() {
        let client: SocketAddr = "[::ffff:198.18.0.2]:4433".parse().unwrap();
        let mut e = Entry::new(client, UNIX_EPOCH);
        let nasty: String = (0u8..32)
            .map(char::from)
            .chain("\"\\\u{2028}é".chars())
            .collect();
        let long = nasty.repeat(1000);
        e.path = e.set("path", &long, MAX_PATH_BYTES);
        e.authority = e.set("authority", &long, MAX_FIELD_BYTES);
        e.method = e.set("method", &long, MAX_FIELD_BYTES);
        e.sni = e.set("sni", &long, MAX_FIELD_BYTES);
        e.upstream = e.set("upstream", &long, MAX_FIELD_BYTES);
        let line = e.line();
        assert!(line.len() <= MAX_LINE_BYTES, "{}", line.len());
        assert_eq!(line.matches('\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["client"], "198.18.0.2");
        assert_eq!(v["client_port"], 4433);
        assert_eq!(
            v["truncated"],
            serde_json::json!(["path", "authority", "method", "sni", "upstream"])
        );
        assert!(long.starts_with(v["path"].as_str().unwrap()));
        let short = Entry::new(client, UNIX_EPOCH).set("path", "/a?b=c", MAX_PATH_BYTES);
        assert_eq!(short.as_deref(), Some("/a?b=c"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_waiting() {
        let dropped = IntCounter::new("d", "-").unwrap();
        let (tx, rx) = mpsc::channel(2);
        let log = AccessLog {
            enabled: AtomicBool::new(true),
            tx: Some(tx),
            dropped: dropped.clone(),
        };
        let e = Entry::new("127.0.0.1:1".parse().unwrap(), UNIX_EPOCH);
        for _ in 0..5 {
            log.write(&e);
        }
        assert_eq!(dropped.get(), 3);
        let (mut reader, writer) = tokio::io::duplex(1 << 16);
        let task = tokio::spawn(write_lines(rx, writer));
        drop(log);
        task.await.unwrap();
        let mut text = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut reader, &mut text)
            .await
            .unwrap();
        assert_eq!(text.lines().count(), 2);
    }

    /// Counts the flushes that reach it.
    struct Flushes(std::sync::Arc<std::sync::atomic::AtomicUsize>, Vec<u8>);

    impl tokio::io::AsyncWrite for Flushes {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.1.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn lines_of_a_burst_are_flushed_together_and_soon() {
        let flushes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(write_lines(rx, Flushes(flushes.clone(), Vec::new())));
        // 20 lines 1 ms apart: one flush, FLUSH_AFTER after the first.
        for _ in 0..20 {
            tx.send("x\n".to_string()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(FLUSH_AFTER).await;
        assert_eq!(flushes.load(Ordering::Relaxed), 1);
        // A lone line later: flushed within FLUSH_AFTER of it.
        tx.send("y\n".to_string()).await.unwrap();
        tokio::time::sleep(FLUSH_AFTER + Duration::from_millis(1)).await;
        assert_eq!(flushes.load(Ordering::Relaxed), 2);
        drop(tx);
        task.await.unwrap();
    }
}
