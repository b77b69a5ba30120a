//! E1's results ([`crate::scenario::Measure::Loopback`]): per transfer the process CPU time of
//! the row's server and of the TCP ingress behind it; per cell CPU seconds per GB, wall time
//! in milliseconds, the ratio to HTTP/2 straight to nginx, and the load average the runs saw.
//! Pure.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::markdown::table_head;
use super::{stats, BenchReport, Case, Cell};
use crate::rows::H2;
use crate::scenario::{self, Measure};

/// One loopback transfer's CPU accounting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CpuSample {
    /// CPU seconds (utime + stime, with children) of the row's own server over the transfer:
    /// our proxy, Caddy, nginx 1.26, or for the h2 row the ingress nginx itself.
    pub server_s: f64,
    /// CPU seconds of the TCP ingress (nginx 1.22) behind a proxying row; `None` for rows
    /// that serve the file themselves.
    pub ingress_s: Option<f64>,
    /// Body bytes the client received.
    pub bytes: u64,
    /// `/proc/loadavg`'s 1-minute figure right after the transfer.
    pub load1: f64,
}

/// Whether the case is measured over loopback (E1).
pub fn is_loopback(case: &Case) -> bool {
    scenario::find(&case.scenario).is_some_and(|s| s.measure == Measure::Loopback)
}

/// A cell's CPU per GB (1e9 bytes) over its transfers, seconds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuStats {
    pub n: usize,
    pub server_median: Option<f64>,
    pub server_min: Option<f64>,
    pub server_max: Option<f64>,
    pub ingress_median: Option<f64>,
    /// All transfers' CPU over all their bytes: what short transfers can show, whose
    /// single CPU readings are a few clock ticks (10 ms) each.
    pub server_total: Option<f64>,
    pub ingress_total: Option<f64>,
    pub load_min: Option<f64>,
    pub load_max: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

pub fn cpu_stats(cell: &Cell) -> CpuStats {
    let per_gb = |s: f64, bytes: u64| s / (bytes.max(1) as f64 / 1e9);
    let counted: Vec<&CpuSample> = cell.cpu.iter().filter(|x| x.bytes > 0).collect();
    let server: Vec<f64> = counted
        .iter()
        .map(|x| per_gb(x.server_s, x.bytes))
        .collect();
    let ingress: Vec<f64> = counted
        .iter()
        .filter_map(|x| Some(per_gb(x.ingress_s?, x.bytes)))
        .collect();
    let load: Vec<f64> = counted.iter().map(|x| x.load1).collect();
    let bytes: u64 = counted.iter().map(|x| x.bytes).sum();
    let total = |v: Option<f64>| v.filter(|_| bytes > 0).map(|s| per_gb(s, bytes));
    let ingress_sum: Option<f64> = counted.iter().map(|x| x.ingress_s).sum();
    CpuStats {
        n: counted.len(),
        server_median: median(server.clone()),
        server_min: server.iter().copied().reduce(f64::min),
        server_max: server.iter().copied().reduce(f64::max),
        ingress_median: median(ingress),
        server_total: total(Some(counted.iter().map(|x| x.server_s).sum())),
        ingress_total: total(ingress_sum),
        load_min: load.iter().copied().reduce(f64::min),
        load_max: load.iter().copied().reduce(f64::max),
    }
}

fn f2(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.2}"))
}

fn ms(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{:.1}", v * 1000.0))
}

/// Transfers at least this large show CPU per GB per transfer (median and range); smaller
/// ones, whose readings are a few clock ticks, show all the cell's CPU over all its bytes.
const PER_TRANSFER_MIN_BYTES: u64 = 64 << 20;

/// The E1 table: one line per loopback case and row.
pub fn write_loopback_table(m: &mut String, r: &BenchReport) {
    let cases: Vec<&Case> = r.cases.iter().filter(|c| is_loopback(c)).collect();
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        m,
        "### E1: downloads over loopback, process CPU per GB and wall time"
    );
    let _ = writeln!(m);
    let _ = writeln!(m, "curl 8.14 runs in the server namespace and fetches from the servers' address there, so packets cross `lo`, not the router. CPU = utime + stime from /proc of the server process and its children over each transfer (other load on the machine does not count); s/GB per 1e9 bytes, median (min–max) over the cell's transfers. \"server\" is the row's own process (our proxy, Caddy, nginx 1.26; for h2 the ingress nginx), \"ingress\" the nginx 1.22 behind a proxying row. Wall times in ms (median, p90); ×h2 = median / h2's median in the same case; load = 1-minute load average after each transfer (min–max).");
    let _ = writeln!(m);
    table_head(
        m,
        &[
            "Case",
            "Row",
            "n",
            "server CPU s/GB",
            "ingress s/GB",
            "server+ingress s/GB",
            "median ms",
            "p90 ms",
            "MB/s",
            "×h2",
            "fail",
            "load",
        ],
    );
    for case in cases {
        let h2 = r.cell(&case.id, H2).map(|c| stats(c, case.bytes));
        for row in &r.rows {
            let Some(cell) = r.cell(&case.id, &row.id).filter(|_| row.not_run.is_none()) else {
                let why = row.not_run.clone().unwrap_or_else(|| "no transfers".into());
                let _ = writeln!(
                    m,
                    "| {} | {} | – | – | – | – | – | – | – | – | – | not run: {why} |",
                    case.label, row.label
                );
                continue;
            };
            let st = stats(cell, case.bytes);
            let c = cpu_stats(cell);
            let ratio = match (st.median, h2.as_ref().and_then(|h| h.median)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "–".into(),
            };
            let (server, ingress) = if case.bytes >= PER_TRANSFER_MIN_BYTES {
                let range = format!(
                    "{} ({}–{})",
                    f2(c.server_median),
                    f2(c.server_min),
                    f2(c.server_max)
                );
                (range, c.ingress_median)
            } else {
                (
                    format!("{} (all {})", f2(c.server_total), c.n),
                    c.ingress_total,
                )
            };
            let own = if case.bytes >= PER_TRANSFER_MIN_BYTES {
                c.server_median
            } else {
                c.server_total
            };
            let both = own.zip(ingress).map(|(a, b)| a + b);
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}–{} |",
                case.label,
                row.label,
                st.n,
                server,
                f2(ingress),
                f2(both.or(own)),
                ms(st.median),
                ms(st.p90),
                st.mbit_median
                    .map_or("–".into(), |v| format!("{:.0}", v / 8.0)),
                ratio,
                st.failures,
                f2(c.load_min),
                f2(c.load_max),
            );
        }
    }
    let _ = writeln!(m);
}

/// [`scenario::Check::CpuPerGbAtMost`]: the row's median server CPU per GB.
pub fn cpu_per_gb_at_most(
    r: &BenchReport,
    case: &Case,
    row: &str,
    limit: f64,
) -> Result<(bool, String), String> {
    let cell = r.cell(&case.id, row).ok_or("no cell")?;
    let c = cpu_stats(cell);
    let med = c.server_median.ok_or("no CPU samples")?;
    Ok((
        med <= limit,
        format!(
            "{med:.2} s/GB (range {}–{}, {} transfers) vs {limit:.2}",
            f2(c.server_min),
            f2(c.server_max),
            c.n
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(server_s: f64, ingress_s: Option<f64>, bytes: u64) -> CpuSample {
        CpuSample {
            server_s,
            ingress_s,
            bytes,
            load1: 1.5,
        }
    }

    #[test]
    fn cpu_per_gb_is_the_median_over_counted_transfers() {
        let cell = Cell {
            cpu: vec![
                sample(0.5, Some(0.2), 250_000_000),
                sample(0.75, Some(0.25), 250_000_000),
                sample(1.0, None, 500_000_000),
                // A failed transfer (no bytes) does not count.
                sample(9.0, None, 0),
            ],
            ..Cell::default()
        };
        let c = cpu_stats(&cell);
        assert_eq!(c.n, 3);
        assert_eq!(c.server_median, Some(2.0));
        assert_eq!(c.server_min, Some(2.0));
        assert_eq!(c.server_max, Some(3.0));
        assert_eq!(c.ingress_median, Some(0.9));
        assert_eq!(c.server_total, Some(2.25), "2.25 s over 1e9 bytes");
        assert_eq!(c.ingress_total, None, "one transfer has no ingress reading");
        assert_eq!(cpu_stats(&Cell::default()).server_median, None);
    }
}
