//! S6's results: per cell the row's share of the bottleneck over its runs, the table, and the
//! share targets. Pure.

use std::fmt::Write as _;

use super::markdown::table_head;
use super::{BenchReport, Case, Cell};
use crate::rows::H2;

/// A cell's shares over the runs that count.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareStats {
    pub runs: usize,
    /// Runs that do not count (a flow ended inside the window, a controller did not take).
    pub invalid: usize,
    pub median: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub row_mbit: Option<f64>,
    pub other_mbit: Option<f64>,
}

/// The median of an unsorted list (mean of the middle two for an even count).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn share_stats(cell: &Cell) -> ShareStats {
    let valid: Vec<_> = cell.shares.iter().filter(|x| x.share().is_some()).collect();
    let shares: Vec<f64> = valid.iter().filter_map(|x| x.share()).collect();
    ShareStats {
        runs: cell.shares.len(),
        invalid: cell.shares.len() - valid.len(),
        median: median(shares.clone()),
        min: shares.iter().copied().reduce(f64::min),
        max: shares.iter().copied().reduce(f64::max),
        row_mbit: median(valid.iter().map(|x| x.row_mbit()).collect()),
        other_mbit: median(valid.iter().map(|x| x.other_mbit()).collect()),
    }
}

fn f2(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.2}"))
}

fn f1(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.1}"))
}

/// The S6 table: one line per case and row, after the transfer table.
pub fn write_share_table(m: &mut String, r: &BenchReport) {
    let cases: Vec<&Case> = r.cases.iter().filter(|c| c.competitor.is_some()).collect();
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "### S6: share of the bottleneck beside a competing download (second client address)"
    );
    let _ = writeln!(m);
    let _ = writeln!(m, "The competitor is one HTTP/2 download from the same nginx (kernel TCP CUBIC or BBR), or, \"vs itself\", a second download of the row's own server with the same client. The h2 row is the TCP reference: HTTP/2 whose server-side TCP runs CUBIC (per-route congctl). Share = the row's bytes / both flows' bytes through the bottleneck in the window (router counters per client address); median and range over the runs that count.");
    let _ = writeln!(m);
    table_head(
        m,
        &[
            "Case",
            "Row",
            "runs",
            "share median",
            "share min–max",
            "row Mbit/s",
            "competitor Mbit/s",
            "queue drops row/competitor",
            "notes",
        ],
    );
    for case in cases {
        for row in r
            .rows
            .iter()
            .filter(|x| x.only_in.as_ref().is_none_or(|sc| *sc == case.scenario))
        {
            let Some(cell) = r.cell(&case.id, &row.id) else {
                let why = row.not_run.clone().unwrap_or_else(|| "no runs".into());
                let _ = writeln!(
                    m,
                    "| {} | {} | – | – | – | – | – | – | not run: {why} |",
                    case.label, row.label
                );
                continue;
            };
            let _ = writeln!(m, "{}", share_line(case, &row.label, cell));
        }
    }
    let _ = writeln!(m);
}

fn share_line(case: &Case, label: &str, cell: &Cell) -> String {
    let st = share_stats(cell);
    let drops: (u64, u64) = cell
        .shares
        .iter()
        .fold((0, 0), |a, x| (a.0 + x.row_drops, a.1 + x.other_drops));
    let mut notes = Vec::new();
    if st.invalid > 0 {
        let why = cell.shares.iter().find_map(|x| x.invalid.clone());
        notes.push(format!(
            "{} runs not counted: {}",
            st.invalid,
            why.unwrap_or_default()
                .chars()
                .take(100)
                .collect::<String>()
        ));
    }
    let each: Vec<String> = cell.shares.iter().map(|x| f2(x.share())).collect();
    notes.push(format!("runs: {}", each.join(" ")));
    format!(
        "| {} | {} | {} | {} | {}–{} | {} | {} | {}/{} | {} |",
        case.label,
        label,
        st.runs - st.invalid,
        f2(st.median),
        f2(st.min),
        f2(st.max),
        f1(st.row_mbit),
        f1(st.other_mbit),
        drops.0,
        drops.1,
        notes.join("; ")
    )
}

type Judged = Result<(bool, String), String>;

fn measured_share(r: &BenchReport, case: &Case, row: &str) -> Result<ShareStats, String> {
    let cell = r
        .cell(&case.id, row)
        .ok_or_else(|| format!("{row} has no cell in {}", case.id))?;
    let st = share_stats(cell);
    match st.median {
        Some(_) => Ok(st),
        None => Err(format!("{row} has no run that counts in {}", case.id)),
    }
}

/// The row's median share lies within [min, max].
pub fn share_within(r: &BenchReport, case: &Case, row: &str, min: f64, max: f64) -> Judged {
    let st = measured_share(r, case, row)?;
    let m = st.median.unwrap_or(f64::NAN);
    Ok((
        (min..=max).contains(&m),
        format!(
            "median {m:.2} over {} runs (range {}–{})",
            st.runs - st.invalid,
            f2(st.min),
            f2(st.max)
        ),
    ))
}

/// The row's median share is at least the TCP CUBIC reference's (the h2 row) in the same case.
pub fn share_at_least_tcp_cubic(r: &BenchReport, case: &Case, row: &str) -> Judged {
    let o = measured_share(r, case, row)?;
    let t = measured_share(r, case, H2)?;
    let (a, b) = (o.median.unwrap_or(f64::NAN), t.median.unwrap_or(f64::NAN));
    Ok((a >= b, format!("{a:.2} vs TCP CUBIC's {b:.2}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{fixtures, verdicts, Outcome};
    use crate::rows::OURS;
    use crate::scenario::{Competitor, TcpCc};
    use crate::share::ShareSample;

    fn run(row: u64, other: u64) -> ShareSample {
        ShareSample {
            window_s: 10.0,
            row_bytes: row,
            other_bytes: other,
            ..ShareSample::default()
        }
    }

    #[test]
    fn share_stats_take_the_median_of_the_runs_that_count() {
        let mut bad = run(9, 1);
        bad.invalid = Some("ended".into());
        let cell = Cell {
            shares: vec![run(3, 7), run(5, 5), run(6, 4), bad],
            ..Cell::default()
        };
        let st = share_stats(&cell);
        assert_eq!((st.runs, st.invalid), (4, 1));
        assert_eq!(st.median, Some(0.5));
        assert_eq!((st.min, st.max), (Some(0.3), Some(0.6)));
        assert!((median(vec![0.2, 0.4]).unwrap() - 0.3).abs() < 1e-12);
        assert_eq!(share_stats(&Cell::default()).median, None);
    }

    fn s6(id: &str, against: Competitor) -> Case {
        Case {
            competitor: Some(against.name().into()),
            ..fixtures::case("S6", id, 50.0)
        }
    }

    fn shares(case_id: &str, row: &str, runs: &[(u64, u64)]) -> Cell {
        Cell {
            case_id: case_id.into(),
            row: row.into(),
            shares: runs.iter().map(|&(a, b)| run(a, b)).collect(),
            ..Cell::default()
        }
    }

    /// Each competitor's cell gets its own target: 0.4-0.6 against TCP CUBIC and against
    /// itself, at least TCP CUBIC's share against TCP BBR.
    #[test]
    fn every_competitor_is_judged_by_its_target() {
        let cubic = Competitor::Tcp(TcpCc::Cubic);
        let bbr = Competitor::Tcp(TcpCc::Bbr);
        let r = BenchReport {
            cases: vec![s6("c", cubic), s6("b", bbr), s6("self", Competitor::Itself)],
            rows: vec![fixtures::row(H2, None), fixtures::row(OURS, None)],
            cells: vec![
                shares("c", H2, &[(5, 5), (4, 6)]),
                shares("c", OURS, &[(7, 3), (8, 2)]),
                shares("b", H2, &[(2, 8), (2, 8)]),
                shares("b", OURS, &[(1, 9), (1, 9)]),
                shares("self", H2, &[(5, 5), (5, 5)]),
                shares("self", OURS, &[(45, 55), (52, 48)]),
            ],
            ..BenchReport::default()
        };
        let v = verdicts(&r);
        let got: Vec<(&str, &Outcome)> =
            v.iter().map(|x| (x.target.as_str(), &x.outcome)).collect();
        assert_eq!(v.len(), 3, "{got:?}");
        assert!(v[0].target.contains("beside the competing flow"), "{got:?}");
        assert_eq!(v[0].outcome, Outcome::Fail, "{got:?}"); // 0.75 > 0.6
        assert!(v[1].target.contains(">= TCP CUBIC's"), "{got:?}");
        assert_eq!(v[1].outcome, Outcome::Fail, "{got:?}"); // 0.10 < 0.20
        assert!(v[2].target.starts_with("S6 self:"), "{got:?}");
        assert_eq!(v[2].outcome, Outcome::Pass, "{got:?}"); // median 0.485
        assert!(
            v[2].detail.contains("over 2 runs (range 0.45–0.52)"),
            "{}",
            v[2].detail
        );

        let mut m = String::new();
        write_share_table(&mut m, &r);
        assert!(m.contains("| self | h3-ingress"), "{m}");
        assert!(m.contains("competitor Mbit/s"), "{m}");
    }
}
