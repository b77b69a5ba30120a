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
