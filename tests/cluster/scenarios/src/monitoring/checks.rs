//! The monitoring scenario's checks: each is one query (PromQL or a Prometheus API read) and the
//! answer it must give, asked until it gives it or its deadline passes, and a row of the table
//! the run ends with (check, verdict, time, query and the last answer).

use std::future::Future;
use std::time::{Duration, Instant};

use h3i_scenarios::{fail, info, Result};

/// What a probe said last, and whether that was the expected answer.
pub struct Answer {
    pub ok: bool,
    pub got: String,
    pub secs: f64,
}

/// Asks `probe` every 2 s until it says ok, at most `secs` seconds; an error counts as a wrong
/// answer (the last one is what the row shows).
pub async fn poll<F, Fut>(secs: u64, mut probe: F) -> Answer
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(bool, String)>>,
{
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    loop {
        let (ok, got) = match probe().await {
            Ok(answer) => answer,
            Err(e) => (false, format!("error: {e}")),
        };
        if ok || Instant::now() >= deadline {
            return Answer {
                ok,
                got,
                secs: t0.elapsed().as_secs_f64(),
            };
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

struct Row {
    check: String,
    query: String,
    expected: String,
    answer: Answer,
}

/// The rows so far.
#[derive(Default)]
pub struct Checks {
    rows: Vec<Row>,
}

impl Checks {
    /// Adds the row and prints `ok:` or `FAIL:`; a wrong answer fails the run.
    pub fn record(
        &mut self,
        check: &str,
        query: &str,
        expected: &str,
        answer: Answer,
    ) -> Result<()> {
        let verdict = if answer.ok { "ok" } else { "FAIL" };
        info(format!(
            "{verdict}: {check}: {query} -> {} (expected {expected}; {:.1}s)",
            answer.got, answer.secs
        ));
        let (ok, got) = (answer.ok, answer.got.clone());
        self.rows.push(Row {
            check: check.to_string(),
            query: query.to_string(),
            expected: expected.to_string(),
            answer,
        });
        if ok {
            Ok(())
        } else {
            fail(format!("{check}: {query} -> {got}; expected {expected}"))
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// One line per check, then `N/M checks passed`.
    pub fn table(&self) -> String {
        let mut out = format!(
            "\n{:<3} {:<46} {:<7} {:>6}  query -> answer\n",
            "#", "check", "verdict", "took"
        );
        for (i, r) in self.rows.iter().enumerate() {
            let verdict = if r.answer.ok { "ok" } else { "FAIL" };
            let took = format!("{:.1}s", r.answer.secs);
            out += &format!(
                "{:<3} {:<46} {verdict:<7} {took:>6}  {} -> {}\n",
                i + 1,
                cut(&r.check, 46),
                cut(&r.query, 100),
                cut(&r.answer.got, 200)
            );
        }
        let passed = self.rows.iter().filter(|r| r.answer.ok).count();
        out + &format!("\n{passed}/{} checks passed\n", self.rows.len())
    }

    /// The expected answers, for the failure report.
    pub fn expectations(&self) -> String {
        let lines: Vec<String> = (self.rows.iter().enumerate())
            .map(|(i, r)| format!("{:<3} {}: {}", i + 1, r.check, r.expected))
            .collect();
        lines.join("\n")
    }
}

fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    s.chars().take(max - 1).collect::<String>() + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wrong_answer_is_a_failed_row_with_the_last_answer() {
        let mut checks = Checks::default();
        let mut n = 0;
        let answer = poll(1, || {
            n += 1;
            let now = n;
            async move { Ok((false, format!("answer {now}"))) }
        })
        .await;
        assert!((answer.secs - 2.0).abs() < 0.5, "{}", answer.secs);
        let e = checks.record("c", "q", "e", answer).unwrap_err();
        assert_eq!(e.to_string(), "c: q -> answer 2; expected e");
        let ok = poll(5, || async { Ok((true, "fine".to_string())) }).await;
        checks.record("d", "q2", "fine", ok).unwrap();
        let t = checks.table();
        assert!(
            t.contains("FAIL") && t.ends_with("1/2 checks passed\n"),
            "{t}"
        );
    }
}
