//! The budget for buffered request bytes: what header sections and read-ahead bodies may hold
//! in the whole process (`limits.bufferedRequestBytes`), in one QUIC connection and in one
//! request stream. A [`Reservation`] is taken before the bytes are read and returned when it
//! drops, so memory is admitted, not just observed; when a share is exhausted the new request
//! is refused and the ones already admitted continue.
//!
//! Reservations are counters, not allocations: a body is still read into a buffer that grows
//! with what arrives, never one sized by the declared Content-Length.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus::IntGauge;

use crate::api::LimitsSettings;
use crate::proxy::observe::metrics::limit;

/// Which share ran out; each is one value of `h3_ingress_limits_total{limit}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Exhausted {
    #[error("the process's buffered-request budget is exhausted")]
    Process,
    #[error("the connection's share of the buffered-request budget is exhausted")]
    Connection,
    #[error("the request's share of the buffered-request budget is exhausted")]
    Stream,
}

impl Exhausted {
    pub fn limit(self) -> &'static str {
        match self {
            Exhausted::Process => limit::BUFFERED_REQUEST_BYTES,
            Exhausted::Connection => limit::BUFFERED_REQUEST_BYTES_PER_CONNECTION,
            Exhausted::Stream => limit::BUFFERED_REQUEST_BYTES_PER_STREAM,
        }
    }
}

/// Adds `n` to `used` unless that exceeds `max`.
fn take(used: &AtomicU64, n: u64, max: u64) -> bool {
    used.fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
        u.checked_add(n).filter(|t| *t <= max)
    })
    .is_ok()
}

fn give(used: &AtomicU64, n: u64) {
    used.fetch_sub(n, Ordering::AcqRel);
}

/// The process-wide budget. Its size follows configuration reloads; the shares of a
/// connection are fixed when it starts.
pub struct Budget {
    max: AtomicU64,
    used: AtomicU64,
    gauge: IntGauge,
}

impl Budget {
    pub fn new(max: u64, gauge: IntGauge) -> Arc<Self> {
        Arc::new(Budget {
            max: AtomicU64::new(max),
            used: AtomicU64::new(0),
            gauge,
        })
    }

    /// A reload's new size; reservations above it stay until they are returned.
    pub fn resize(&self, max: u64) {
        self.max.store(max, Ordering::Release);
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The share of a new connection under `limits`.
    pub fn connection(self: &Arc<Self>, limits: &LimitsSettings) -> Arc<ConnShare> {
        Arc::new(ConnShare {
            process: self.clone(),
            max: limits.buffered_request_bytes_per_connection,
            per_stream: limits.buffered_request_bytes_per_stream,
            used: AtomicU64::new(0),
        })
    }
}

/// One connection's share.
pub struct ConnShare {
    process: Arc<Budget>,
    max: u64,
    per_stream: u64,
    used: AtomicU64,
}

impl ConnShare {
    pub fn stream(self: &Arc<Self>) -> Arc<StreamShare> {
        Arc::new(StreamShare {
            conn: self.clone(),
            used: AtomicU64::new(0),
        })
    }
}

/// One request stream's share; the stream's frame guard (header sections) and its handler
/// (read-ahead body) reserve from the same one.
pub struct StreamShare {
    conn: Arc<ConnShare>,
    used: AtomicU64,
}

impl StreamShare {
    /// Reserves `n` bytes from the stream, its connection and the process, or none of them.
    pub fn reserve(self: &Arc<Self>, n: u64) -> Result<Reservation, Exhausted> {
        let conn = &self.conn;
        let process = &conn.process;
        if !take(&self.used, n, conn.per_stream) {
            return Err(Exhausted::Stream);
        }
        if !take(&conn.used, n, conn.max) {
            give(&self.used, n);
            return Err(Exhausted::Connection);
        }
        if !take(&process.used, n, process.max.load(Ordering::Acquire)) {
            give(&conn.used, n);
            give(&self.used, n);
            return Err(Exhausted::Process);
        }
        process.gauge.add(n as i64);
        Ok(Reservation {
            stream: self.clone(),
            bytes: n,
        })
    }
}

/// Bytes held against every share; returned on drop.
pub struct Reservation {
    stream: Arc<StreamShare>,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let n = self.bytes;
        let conn = &self.stream.conn;
        give(&self.stream.used, n);
        give(&conn.used, n);
        give(&conn.process.used, n);
        conn.process.gauge.sub(n as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(per_conn: u64, per_stream: u64) -> LimitsSettings {
        LimitsSettings {
            buffered_request_bytes: 0,
            buffered_request_bytes_per_connection: per_conn,
            buffered_request_bytes_per_stream: per_stream,
            ..Default::default()
        }
    }

    #[test]
    fn every_share_is_enforced_and_returned() {
        let gauge = IntGauge::new("g", "g").unwrap();
        let b = Budget::new(300, gauge.clone());
        let c1 = b.connection(&limits(200, 150));
        let c2 = b.connection(&limits(200, 150));
        let s1 = c1.stream();
        let r1 = s1.reserve(100).unwrap();
        assert_eq!(s1.reserve(60).err(), Some(Exhausted::Stream));
        let s2 = c1.stream();
        let r2 = s2.reserve(100).unwrap();
        assert_eq!(c1.stream().reserve(1).err(), Some(Exhausted::Connection));
        let s3 = c2.stream();
        let r3 = s3.reserve(100).unwrap();
        assert_eq!(c2.stream().reserve(1).err(), Some(Exhausted::Process));
        assert_eq!((b.used(), gauge.get()), (300, 300));
        // A failed reservation leaves nothing behind.
        assert_eq!(s3.used.load(Ordering::Acquire), 100);
        drop((r1, r2));
        assert_eq!(b.used(), 100);
        let r4 = c2.stream().reserve(100).unwrap();
        drop((r3, r4));
        assert_eq!((b.used(), gauge.get()), (0, 0));
        assert_eq!(c1.used.load(Ordering::Acquire), 0);
    }

    #[test]
    fn a_smaller_budget_after_a_reload_admits_nothing_until_it_fits() {
        let b = Budget::new(100, IntGauge::new("g", "g").unwrap());
        let s = b.connection(&limits(100, 100)).stream();
        let r = s.reserve(80).unwrap();
        b.resize(50);
        assert_eq!(s.reserve(1).err(), Some(Exhausted::Process));
        drop(r);
        assert!(s.reserve(50).is_ok());
    }
}
