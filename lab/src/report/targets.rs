//! The targets, judged against the measured cells: each case's scenario lists its
//! targets (`scenario::Scenario::targets`); every [`Check`] has one function here. Pure.

use super::{cpu, share, BenchReport, Case, Cell, Outcome, Stats, Verdict};
use crate::rows::{CUBIC_HS, H2, OURS, SMALL_BUFFERS};
use crate::scenario::{self, Check, Slack};

/// A judgement: pass or fail with the numbers behind it, or why it could not be made.
type Judged = Result<(bool, String), String>;

/// One PTO right after the first RTT sample in the handshake space (RFC 9002 6.2.1:
/// smoothed_rtt + 4 * rtt/2, no ack delay): 3 x RTT.
pub fn one_pto_s(rtt_ms: f64) -> f64 {
    3.0 * rtt_ms / 1000.0
}

/// Evaluates the targets for our default row, and for `cubic-hs` (the previous default) when
/// it was run.
pub fn verdicts(r: &BenchReport) -> Vec<Verdict> {
    let mut out = verdicts_for(r, OURS);
    if r.rows.iter().any(|row| row.id == CUBIC_HS) {
        out.extend(verdicts_for(r, CUBIC_HS));
    }
    out
}

/// Every target of every case's scenario, for one of our rows.
fn verdicts_for(r: &BenchReport, row: &str) -> Vec<Verdict> {
    let mut out = Vec::new();
    for case in &r.cases {
        let Some(sc) = scenario::find(&case.scenario) else {
            continue;
        };
        for t in sc.targets.iter().filter(|t| t.when.applies(case, &r.cases)) {
            let target = format!(
                "{} {}: {}",
                case.scenario,
                case.label,
                t.check.describe(row)
            );
            out.push(judge(target, evaluate(&t.check, r, case, row)));
        }
    }
    out
}

fn judge(target: String, r: Judged) -> Verdict {
    match r {
        Ok((ok, detail)) => Verdict {
            target,
            outcome: if ok { Outcome::Pass } else { Outcome::Fail },
            detail,
        },
        Err(why) => Verdict {
            target,
            outcome: Outcome::NotEvaluated(why.clone()),
            detail: why,
        },
    }
}

fn evaluate(check: &Check, r: &BenchReport, case: &Case, row: &str) -> Judged {
    match *check {
        Check::MedianVsH2 {
            factor,
            no_failures,
        } => median_vs_h2(r, case, row, factor, no_failures),
        Check::MedianVsClean { clean_in, slack } => median_vs_clean(r, case, row, clean_in, slack),
        Check::P90VsOwnMedian { factor } => p90_vs_own_median(r, case, row, factor),
        Check::NoFailedHandshakes => no_failed_handshakes(r, case, row),
        Check::ThroughputVsH2 { factor } => throughput_vs_h2(r, case, row, factor),
        Check::NoServerRcvbufErrors => server_rcvbuf_errors(r, case, row, false),
        Check::SmallBuffersOverflow => server_rcvbuf_errors(r, case, SMALL_BUFFERS, true),
        Check::PathMtuInMetrics => path_mtu_in_metrics(r, case, row),
        Check::NoFragmentsAllDf => no_fragments_all_df(r, case, row),
        Check::ShareWithin { min, max } => share::share_within(r, case, row, min, max),
        Check::ShareAtLeastTcpCubic => share::share_at_least_tcp_cubic(r, case, row),
        Check::CpuPerGbAtMost { s_per_gb } => cpu::cpu_per_gb_at_most(r, case, row, s_per_gb),
    }
}

fn med(s: &Stats) -> f64 {
    s.median.unwrap_or(f64::NAN)
}

/// The cell of a row that has statistics (it ran and had a successful transfer).
fn measured_cell<'a>(r: &'a BenchReport, case: &Case, row: &str) -> Result<&'a Cell, String> {
    r.measured(&case.id, row)?;
    r.cell(&case.id, row).ok_or_else(|| "no cell".to_string())
}

fn median_vs_h2(r: &BenchReport, case: &Case, row: &str, factor: f64, strict: bool) -> Judged {
    let o = r.measured(&case.id, row)?;
    let h = r.measured(&case.id, H2)?;
    let limit = factor * med(&h);
    // Loopback cases take milliseconds.
    let t = |s: f64| {
        if limit < 0.1 {
            format!("{:.1} ms", s * 1000.0)
        } else {
            format!("{s:.2} s")
        }
    };
    let mut detail = format!(
        "{} vs {factor:.1} x {} = {}",
        t(med(&o)),
        t(med(&h)),
        t(limit)
    );
    if strict {
        detail.push_str(&format!("; failures {}", o.failures));
    }
    Ok((med(&o) <= limit && (!strict || o.failures == 0), detail))
}

/// The case of scenario `scenario` that is `case` without its impairment: same RTT and file,
/// no loss, no drop rule, MTU 1500.
fn clean_case<'a>(r: &'a BenchReport, case: &Case, scenario: &str) -> Option<&'a Case> {
    r.cases.iter().find(|c| {
        c.scenario == scenario
            && c.rtt_ms == case.rtt_ms
            && c.file == case.file
            && c.loss == 0.0
            && c.rule.is_none()
            && c.mtu == 1500
    })
}

fn median_vs_clean(
    r: &BenchReport,
    case: &Case,
    row: &str,
    clean_in: &str,
    slack: Slack,
) -> Judged {
    let o = r.measured(&case.id, row)?;
    let c = clean_case(r, case, clean_in)
        .ok_or_else(|| format!("the matching {clean_in} clean-path case was not run"))?;
    let base = r.measured(&c.id, row)?;
    let (limit, how) = match slack {
        Slack::OnePto => {
            let pto = one_pto_s(case.rtt_ms);
            (med(&base) + pto, format!("{:.2} + {pto:.2}", med(&base)))
        }
        Slack::Factor(f) => (f * med(&base), format!("{f:.1} x {:.2} s", med(&base))),
    };
    Ok((
        med(&o) <= limit && o.failures == 0,
        format!(
            "{:.2} s vs {how} = {limit:.2} s; failures {}",
            med(&o),
            o.failures
        ),
    ))
}

fn p90_vs_own_median(r: &BenchReport, case: &Case, row: &str, factor: f64) -> Judged {
    let o = r.measured(&case.id, row)?;
    let p90 = o.p90.unwrap_or(f64::NAN);
    let limit = factor * med(&o);
    Ok((
        p90 <= limit,
        format!(
            "p90 {p90:.2} s vs {factor:.1} x {:.2} s = {limit:.2} s",
            med(&o)
        ),
    ))
}

fn no_failed_handshakes(r: &BenchReport, case: &Case, row: &str) -> Judged {
    let o = r.measured(&case.id, row)?;
    Ok((
        o.handshake_failures == 0,
        format!(
            "{} failed handshakes, {} failures of {}",
            o.handshake_failures, o.failures, o.n
        ),
    ))
}

fn throughput_vs_h2(r: &BenchReport, case: &Case, row: &str, factor: f64) -> Judged {
    let o = r.measured(&case.id, row)?;
    let h = r.measured(&case.id, H2)?;
    let (a, b) = (o.mbit_median.unwrap_or(0.0), h.mbit_median.unwrap_or(0.0));
    Ok((
        a >= factor * b && o.failures == 0,
        format!(
            "{a:.0} Mbit/s vs {factor:.1} x {b:.0} = {:.0} Mbit/s",
            factor * b
        ),
    ))
}

/// The server namespace's UDP RcvbufErrors over `row`'s transfers: zero, or (`expect_drops`)
/// more than zero.
fn server_rcvbuf_errors(r: &BenchReport, case: &Case, row: &str, expect_drops: bool) -> Judged {
    let c = measured_cell(r, case, row)?;
    let n = c.server_udp.rcvbuf_errors;
    Ok(((n > 0) == expect_drops, format!("+{n}")))
}

fn path_mtu_in_metrics(r: &BenchReport, case: &Case, row: &str) -> Judged {
    let c = measured_cell(r, case, row)?;
    let p = c.proxy.as_ref().ok_or("no proxy metrics")?;
    let mean = p
        .mean_path_mtu()
        .ok_or("no h3_ingress_connection_path_mtu_bytes observations")?;
    // UDP payload the path carries: the IP MTU minus IPv4 and UDP headers.
    let limit = f64::from(case.mtu) - 28.0;
    Ok((
        (1200.0..=limit).contains(&mean),
        format!(
            "mean {mean:.0} bytes over {:.0} connections, path carries {limit:.0}",
            p.connections
        ),
    ))
}

fn no_fragments_all_df(r: &BenchReport, case: &Case, row: &str) -> Judged {
    let c = measured_cell(r, case, row)?;
    let s = &c.counters.s2c;
    let frags = s.fragments_created + s.ipv4_fragments_in;
    Ok((
        frags == 0 && s.ipv4_udp_no_df == 0 && s.ipv4_udp_df > 0,
        format!(
            "fragments {frags}, UDP/IPv4 without DF {}, with DF {}",
            s.ipv4_udp_no_df, s.ipv4_udp_df
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{case, cell, row};
    use crate::report::{BenchReport, ProxyStats};

    #[test]
    fn verdicts_compare_against_h2_and_own_clean_path() {
        let r = BenchReport {
            cases: vec![case("S1", "s1", 200.0), case("S2", "s2", 200.0)],
            rows: vec![row(H2, None), row(OURS, None)],
            cells: vec![
                cell("s1", H2, &[1.84, 1.85, 1.83]),
                cell("s1", OURS, &[1.40, 1.41, 1.39]),
                cell("s2", H2, &[2.40, 2.40, 2.40]),
                cell("s2", OURS, &[1.95, 1.90, 2.0]),
            ],
            ..BenchReport::default()
        };
        let v = verdicts(&r);
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].outcome, Outcome::Pass, "{v:?}"); // 1.40 <= 1.472
        assert_eq!(v[1].outcome, Outcome::Pass, "{v:?}"); // 1.95 <= 1.40 + 0.6
        assert_eq!(v[2].outcome, Outcome::Fail, "{v:?}"); // 1.95 > 0.8 x 2.40
    }

    #[test]
    fn the_previous_default_is_judged_by_the_same_targets_when_run() {
        let s3 = |row: &str, times: &[f64]| cell("s3", row, times);
        let mut r = BenchReport {
            cases: vec![case("S3", "s3", 200.0)],
            rows: vec![row(H2, None), row(OURS, None)],
            cells: vec![
                s3(H2, &[2.3, 2.3, 2.4]),
                s3(OURS, &[1.7, 1.7, 1.8]),
                s3(CUBIC_HS, &[5.6, 5.7, 12.0]),
            ],
            ..BenchReport::default()
        };
        // Not selected: only the default row's three S3 targets.
        assert_eq!(verdicts(&r).len(), 3);
        r.rows.push(row(CUBIC_HS, None));
        let v = verdicts(&r);
        assert_eq!(v.len(), 6);
        // OURS ("h3-ingress-cubic-hs-lt") is not a substring of CUBIC_HS's targets.
        let outcome = |i: usize| (v[i].target.contains(OURS), v[i].outcome.clone());
        assert_eq!(outcome(0), (true, Outcome::Pass), "{v:?}"); // 1.7 <= 2.07
        assert_eq!(outcome(1), (true, Outcome::Pass), "{v:?}"); // 1.8 <= 2.21
        assert_eq!(outcome(2), (true, Outcome::Pass), "{v:?}");
        assert_eq!(outcome(3), (false, Outcome::Fail), "{v:?}"); // 5.7 > 0.9 x 2.3
        assert_eq!(outcome(4), (false, Outcome::Fail), "{v:?}"); // p90 12 > 1.3 x 5.7
    }

    #[test]
    fn uploads_split_throughput_and_buffer_verdicts() {
        let mut limited = case("S4", "up", 42.0);
        limited.upload = true;
        limited.bytes = 20 << 20;
        limited.rate_mbit = Some(100.0);
        let mut free = limited.clone();
        free.id = "up-free".into();
        free.rate_mbit = None;
        let mut ours_free = cell("up-free", OURS, &[2.0]);
        ours_free.server_udp.rcvbuf_errors = 0;
        let mut small = cell("up-free", SMALL_BUFFERS, &[3.0]);
        small.server_udp.rcvbuf_errors = 284;
        let r = BenchReport {
            cases: vec![limited, free],
            rows: vec![row(H2, None), row(OURS, None), row(SMALL_BUFFERS, None)],
            cells: vec![
                cell("up", H2, &[2.0]),
                cell("up", OURS, &[2.2]),
                cell("up-free", H2, &[1.0]),
                ours_free,
                small,
            ],
            ..BenchReport::default()
        };
        let v = verdicts(&r);
        let targets: Vec<&str> = v.iter().map(|v| v.target.as_str()).collect();
        assert_eq!(v.len(), 3, "{targets:?}");
        assert!(v[0].target.starts_with("S4 up:") && v[0].target.contains("throughput"));
        assert_eq!(v[0].outcome, Outcome::Pass, "{v:?}"); // 2.2 s vs 2.0 s: 0.91x
        assert!(v[1].target.contains("RcvbufErrors delta = 0"));
        assert_eq!(v[1].outcome, Outcome::Pass);
        assert!(v[2].target.contains("forced 208 KB"));
        assert_eq!(v[2].outcome, Outcome::Pass, "{v:?}");
    }

    #[test]
    fn s5_needs_no_fragments_and_df() {
        let mut clean = case("S5", "clean", 42.0);
        clean.scenario = "S5".into();
        let mut hole = case("S5", "hole", 42.0);
        hole.mtu = 1280;
        hole.icmp = false;
        let mut c = cell("hole", OURS, &[0.5]);
        c.counters.s2c.ipv4_udp_df = 100;
        c.counters.s2c.ipv4_udp_no_df = 1;
        let r = BenchReport {
            cases: vec![clean, hole],
            rows: vec![row(H2, None), row(OURS, None)],
            cells: vec![cell("clean", OURS, &[0.48]), c],
            ..BenchReport::default()
        };
        let v = verdicts(&r);
        assert_eq!(v[0].outcome, Outcome::Pass, "{v:?}"); // 0.5 <= 0.528
        assert!(matches!(v[1].outcome, Outcome::NotEvaluated(_)), "{v:?}"); // no proxy metrics
        assert_eq!(v[2].outcome, Outcome::Fail, "{v:?}"); // one datagram without DF

        // The MTU our proxy reports must be one the path carries (1252 at MTU 1280).
        let mut r = r;
        r.cells[1].proxy = Some(ProxyStats {
            connections: 2.0,
            path_mtu_sum: 2.0 * 1452.0,
            ..ProxyStats::default()
        });
        assert_eq!(verdicts(&r)[1].outcome, Outcome::Fail);
        r.cells[1].proxy.as_mut().unwrap().path_mtu_sum = 2.0 * 1250.0;
        assert_eq!(verdicts(&r)[1].outcome, Outcome::Pass);
    }
}
