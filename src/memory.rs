//! Hands memory the process has freed back to the kernel (the data plane and the operator).
//!
//! glibc's allocator keeps what is freed in its arenas (one per thread that allocated, up to
//! eight per core) and returns it only from the top of a heap, so a burst (connections in the
//! data plane, the first lists and reads of thousands of objects in the operator) leaves the
//! process at its peak long after it is over. Measured with
//! `tests/dataplane_scale.rs`: after a request to each of 10,000 hosts, every QUIC and upstream
//! connection closed, RSS stayed at 287 MiB; one `malloc_trim` brought it to 88 MiB. The
//! trim runs on the blocking pool, as it walks every arena.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often freed memory is returned.
pub const PERIOD: Duration = Duration::from_secs(30);

/// Arenas for a process whose memory is mostly long-lived caches (the operator).
pub const CACHE_ARENAS: i32 = 2;
/// Allocations from this size up get their own mapping, returned to the kernel when freed.
pub const CACHE_MMAP_THRESHOLD: i32 = 256 << 10;

/// Sets the allocator up for a process that holds caches of thousands of objects and rebuilds
/// transient views of them (the operator); called before any thread starts. Two arenas
/// instead of up to sixteen, and a fixed mmap threshold (glibc otherwise raises it after the
/// first large free, so later list pages and request bodies land in the heap between cached
/// objects). Measured at 10,000 hosts after loading: 88 MiB of live heap and 130 MiB free
/// that no trim could return (RSS 214 MiB) before; 88 and 103 MiB (RSS 194 MiB) with it.
pub fn tune_for_caches() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; before other threads exist no
    // allocation can race with it.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, CACHE_ARENAS);
        libc::mallopt(libc::M_MMAP_THRESHOLD, CACHE_MMAP_THRESHOLD);
    }
}

/// Returns the allocator's free memory to the kernel (glibc; elsewhere nothing to do).
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of the allocator's own arenas; it takes
    // the arenas' locks like any allocation and has no precondition.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The allocator's own account: bytes in live allocations, and bytes it holds free (what a
/// trim can return, less what fragmentation pins). `None` off glibc.
pub fn heap() -> Option<Heap> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads the arenas' counters, under their locks.
        let m = unsafe { libc::mallinfo2() };
        Some(Heap {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    None
}

/// See [`heap`].
#[derive(Debug, Clone, Copy)]
pub struct Heap {
    pub in_use: u64,
    pub free: u64,
}

/// [`heap`] as of the last trim. mallinfo2 walks every arena's free chunks under its lock,
/// like a trim, so it runs beside the trim on the blocking pool and never on a scrape, whose
/// rate a Prometheus user sets.
static LAST_HEAP: std::sync::Mutex<Option<Heap>> = std::sync::Mutex::new(None);

fn record_heap() {
    *LAST_HEAP.lock().expect("heap lock") = heap();
}

/// The heap as of the last trim (`None` before the first, or off glibc).
pub fn last_heap() -> Option<Heap> {
    *LAST_HEAP.lock().expect("heap lock")
}

/// `<name>{state="in_use"|"free"}`, the allocator's account as of the last trim ([`PERIOD`]):
/// with the process's RSS it tells memory held by live data from memory the allocator keeps.
pub struct HeapCollector {
    gauge: prometheus::IntGaugeVec,
}

/// The metric's help; its name is each process's (the data plane's in its metrics registry,
/// [`OPERATOR_HEAP_BYTES`] in the operator).
pub const HEAP_BYTES_HELP: &str =
    "Heap bytes by state: in_use (live allocations) and free (held by the allocator), read after each trim (every 30 s).";
pub const OPERATOR_HEAP_BYTES: &str = "h3_ingress_operator_heap_bytes";

impl HeapCollector {
    pub fn new(name: &str) -> Self {
        let opts = prometheus::Opts::new(name, HEAP_BYTES_HELP);
        let gauge = prometheus::IntGaugeVec::new(opts, &["state"]).expect("valid gauge");
        Self { gauge }
    }
}

impl prometheus::core::Collector for HeapCollector {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        if let Some(h) = last_heap() {
            let set = |state: &str, v: u64| {
                self.gauge
                    .with_label_values(&[state])
                    .set(i64::try_from(v).unwrap_or(i64::MAX))
            };
            set("in_use", h.in_use);
            set("free", h.free);
        }
        self.gauge.collect()
    }
}

/// Trims every [`PERIOD`] until `shutdown`, reading the heap ([`last_heap`]) at the start and
/// after each trim.
pub async fn trim_periodically(shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(PERIOD);
    tick.tick().await;
    let _ = tokio::task::spawn_blocking(record_heap).await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let _ = tokio::task::spawn_blocking(|| {
            trim();
            record_heap();
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Memory freed by a burst comes back: allocate and free many small blocks from several
    /// threads (as connections do), then trim and read RSS.
    #[test]
    fn a_trim_returns_what_a_burst_freed() {
        fn rss_kib() -> u64 {
            let s = std::fs::read_to_string("/proc/self/status").unwrap();
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap()
        }
        // 256 MiB in 4 KiB blocks from four threads, written so the pages are resident; one
        // block in 64 outlives the burst (as a few connections or cached objects do), which
        // keeps the rest from being returned by the allocator on its own.
        let survivors: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let blocks: Vec<Vec<u8>> =
                            (0..16_384).map(|i| vec![i as u8; 4096]).collect();
                        blocks.into_iter().step_by(64).collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let before = rss_kib();
        trim();
        let after = rss_kib();
        assert!(
            after + 64 * 1024 < before,
            "trim returned {} KiB of a 256 MiB burst ({before} -> {after})",
            before.saturating_sub(after)
        );
        drop(survivors);
    }
}
