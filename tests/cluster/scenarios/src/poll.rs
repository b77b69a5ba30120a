//! Polling with deadlines: a condition is asked every half second until it holds or its
//! deadline passes; an error counts as "not yet" and the last one is reported on time-out.

use std::future::Future;
use std::time::{Duration, Instant};

use crate::{ok, Error, Result};

/// Asks `cond` every 0.5 s until it returns `Ok(true)`, at most `secs` seconds; fails with
/// `what (not within Ns; last: ...)`. Returns the seconds it took.
pub async fn until<F, Fut>(secs: u64, what: &str, cond: F) -> Result<u64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let every = Duration::from_millis(500);
    let (_, end) = timed(Instant::now(), every, secs, what, cond).await?;
    Ok(end as u64)
}

/// Asks `cond` every `every` until it returns `Ok(true)`, until `secs` seconds after `t0`;
/// fails as [`until`] does. Returns when the ask that held started and ended, in seconds
/// after `t0` (a timing measured with it is exact to one ask).
pub async fn timed<F, Fut>(
    t0: Instant,
    every: Duration,
    secs: u64,
    what: &str,
    mut cond: F,
) -> Result<(f64, f64)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let deadline = t0 + Duration::from_secs(secs);
    loop {
        let started = t0.elapsed().as_secs_f64();
        let last = match cond().await {
            Ok(true) => return Ok((started, t0.elapsed().as_secs_f64())),
            Ok(false) => None,
            Err(e) => Some(e.to_string()),
        };
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_string(),
                secs,
                last,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// [`until`], then `ok: what (after Ns)`.
pub async fn wait_ok<F, Fut>(secs: u64, what: &str, cond: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let took = until(secs, what, cond).await?;
    ok(format!("{what} (after {took}s)"));
    Ok(())
}

/// How often [`first_true`] asks: a change timed with it is exact to about this.
pub const TIMING_POLL: Duration = Duration::from_millis(100);

/// Seconds from `t0` to the start of the first ask of `cond` that held, asked every
/// [`TIMING_POLL`] for at most `secs`.
pub async fn first_true<F, Fut>(t0: Instant, secs: u64, what: &str, cond: F) -> Result<f64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    Ok(timed(t0, TIMING_POLL, secs, what, cond).await?.0)
}

/// Timed changes against one target, printed as one table at the end of a scenario.
pub struct Timings {
    target: f64,
    rows: Vec<(String, f64)>,
}

impl Timings {
    pub fn new(target_seconds: f64) -> Self {
        Timings {
            target: target_seconds,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, what: impl Into<String>, secs: f64) {
        self.rows.push((what.into(), secs));
    }

    /// The table, one line per change, and a failure naming every change over the target.
    pub fn report(&self) -> Result<()> {
        let mut missed = Vec::new();
        for (what, secs) in &self.rows {
            let within = *secs <= self.target;
            let verdict = if within { "ok" } else { "MISSED" };
            crate::indent(format!("{what:<72} {secs:>6.2} s  {verdict}"));
            if !within {
                missed.push(what.clone());
            }
        }
        if missed.is_empty() {
            return Ok(());
        }
        crate::fail(format!("over {} s: {}", self.target, missed.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gives_up_at_the_deadline_with_the_last_error() {
        let mut n = 0;
        let e = until(1, "never", || {
            n += 1;
            async { crate::fail::<bool>("still 1 of 2") }
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), "never (not within 1s; last: still 1 of 2)");
        assert!((2..=4).contains(&n), "asked {n} times in 1 s");
    }

    #[tokio::test]
    async fn returns_once_it_holds() {
        let mut n = 0;
        let took = until(5, "third time", || {
            n += 1;
            let now = n;
            async move { Ok(now >= 3) }
        })
        .await
        .unwrap();
        assert_eq!((n, took), (3, 1));
    }
}
