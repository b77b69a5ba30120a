//! Requests per host in the last few minutes, for `/status` and the listener status.

/// Minutes covered by [`RecentCounter::sum`].
pub const WINDOW_MINUTES: u64 = 5;

/// A ring of per-minute counts. Pure: the caller passes the minute (unix seconds / 60).
#[derive(Debug, Clone, Default)]
pub struct RecentCounter {
    /// (minute, count) per slot; `None` until first used.
    slots: [Option<(u64, u64)>; WINDOW_MINUTES as usize],
}

impl RecentCounter {
    pub fn add(&mut self, minute: u64) {
        let slot = &mut self.slots[(minute % WINDOW_MINUTES) as usize];
        match slot {
            Some((m, n)) if *m == minute => *n += 1,
            _ => *slot = Some((minute, 1)),
        }
    }

    /// Events in the current minute and the `WINDOW_MINUTES - 1` before it.
    pub fn sum(&self, now_minute: u64) -> u64 {
        self.slots
            .iter()
            .flatten()
            .filter(|(m, _)| *m <= now_minute && now_minute - *m < WINDOW_MINUTES)
            .map(|(_, n)| n)
            .sum()
    }
}

pub fn current_minute() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() / 60)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_the_window() {
        let mut c = RecentCounter::default();
        c.add(100);
        c.add(100);
        c.add(102);
        assert_eq!(c.sum(102), 3);
        assert_eq!(c.sum(104), 3);
        assert_eq!(c.sum(105), 1, "minute 100 left the window");
        assert_eq!(c.sum(107), 0);
        // A slot is reused for a later minute, not added to.
        c.add(105);
        assert_eq!(c.sum(105), 2);
        assert_eq!(c.sum(99), 0, "nothing from the future");
    }
}
