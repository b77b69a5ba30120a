//! Upstream lanes: several pooled clients, each carrying at most a fixed number of requests
//! at once, so no single HTTP/2 connection to the ingress is shared by more streams than
//! the ingress admits on one connection.
//!
//! A pooled HTTP/2 client keeps one connection per host and never opens a second one: past
//! the server's SETTINGS_MAX_CONCURRENT_STREAMS (128 in nginx and the ingress controllers
//! built on it, 100 in HAProxy) further requests wait for a stream to end, so a few
//! long-running requests (downloads to slow clients, event streams, or a client holding
//! streams on purpose) would stall every other request for that host through this proxy.
//! Each lane is its own client, so its own connection per host; a request takes the first
//! lane below the cap and holds its place until the request ends (the [`Lease`] drops).
//! Lanes are never removed: an unused lane's connections close on the pool's idle timeout,
//! and what remains is a small struct per lane, bounded by the peak number of concurrent
//! requests divided by the cap.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::IntGauge;

use crate::proxy::observe::metrics::LaneMetrics;

struct Lane<T> {
    client: T,
    in_flight: AtomicUsize,
    /// The process-wide gauge, lowered when a lease drops.
    gauge: IntGauge,
}

/// The clients and the per-lane cap; `make` builds a lane's client.
pub struct Lanes<T> {
    make: Box<dyn Fn() -> T + Send + Sync>,
    lanes: Mutex<Vec<Arc<Lane<T>>>>,
    per_lane: usize,
    metrics: LaneMetrics,
}

/// One request's place in a lane; the place is given back when this drops.
pub struct Lease<T> {
    lane: Arc<Lane<T>>,
}

impl<T> Lease<T> {
    pub fn client(&self) -> &T {
        &self.lane.client
    }
}

impl<T> Drop for Lease<T> {
    fn drop(&mut self) {
        self.lane.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.lane.gauge.dec();
    }
}

impl<T> Lanes<T> {
    pub fn new(
        per_lane: usize,
        metrics: LaneMetrics,
        make: impl Fn() -> T + Send + Sync + 'static,
    ) -> Self {
        Self {
            make: Box::new(make),
            lanes: Mutex::new(Vec::new()),
            per_lane: per_lane.max(1),
            metrics,
        }
    }

    /// A place in the first lane with room, or in a new lane when all are full. Taking the
    /// first (not the emptiest) keeps requests on few connections, so the extra lanes go
    /// idle and close once the burst is over.
    pub fn lease(&self) -> Lease<T> {
        self.metrics.in_flight.inc();
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        // Increments happen only under the lock; a concurrent drop only lowers the count.
        for lane in lanes.iter() {
            if lane.in_flight.load(Ordering::Acquire) < self.per_lane {
                lane.in_flight.fetch_add(1, Ordering::AcqRel);
                return Lease { lane: lane.clone() };
            }
        }
        let lane = Arc::new(Lane {
            client: (self.make)(),
            in_flight: AtomicUsize::new(1),
            gauge: self.metrics.in_flight.clone(),
        });
        self.metrics.opened.inc();
        lanes.push(lane.clone());
        Lease { lane }
    }

    pub fn metrics(&self) -> &LaneMetrics {
        &self.metrics
    }

    /// How many lanes exist (the peak concurrency so far, divided by the cap, rounded up).
    pub fn count(&self) -> usize {
        self.lanes.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn numbered(per_lane: usize) -> Lanes<u32> {
        let next = AtomicU32::new(0);
        Lanes::new(per_lane, LaneMetrics::unregistered(), move || {
            next.fetch_add(1, Ordering::Relaxed)
        })
    }

    #[test]
    fn a_lane_takes_at_most_its_cap_then_a_new_lane_opens() {
        let lanes = numbered(3);
        let held: Vec<_> = (0..3).map(|_| lanes.lease()).collect();
        assert!(held.iter().all(|l| *l.client() == 0));
        assert_eq!(lanes.count(), 1);
        let fourth = lanes.lease();
        assert_eq!(*fourth.client(), 1);
        assert_eq!(lanes.count(), 2);
        assert_eq!(lanes.metrics.opened.get(), 2);
        assert_eq!(lanes.metrics.in_flight.get(), 4);
        drop(held);
        drop(fourth);
        assert_eq!(lanes.metrics.in_flight.get(), 0, "every place given back");
    }

    #[test]
    fn a_place_given_back_is_reused_before_later_lanes() {
        let lanes = numbered(2);
        let mut held: Vec<_> = (0..4).map(|_| lanes.lease()).collect();
        assert_eq!(lanes.count(), 2);
        held.remove(0);
        assert_eq!(*lanes.lease().client(), 0, "lane 0 had room again");
        drop(held);
        let again: Vec<_> = (0..2).map(|_| lanes.lease()).collect();
        assert!(again.iter().all(|l| *l.client() == 0));
        assert_eq!(lanes.count(), 2, "no lane is opened while one has room");
    }

    #[test]
    fn a_cap_of_zero_still_serves_one_request_per_lane() {
        let lanes = numbered(0);
        let a = lanes.lease();
        let b = lanes.lease();
        assert_ne!(a.client(), b.client());
    }
}
