//! The bench's markdown: conditions, the table with per-cell notes from the counters, and the
//! targets' verdicts. Pure.

use std::fmt::Write as _;

use super::targets::verdicts;
use super::{stats, BenchReport, Case, Cell, Outcome, RowInfo, Stats};
use crate::rows::{CUBIC_HS, H2, OURS};
use crate::scenario;

/// Successful transfers whose handshake took at least half an RTT longer than the cell's
/// fastest: a handshake datagram was lost and a retransmission timer (often the client's,
/// 1 s before any RTT sample) had to fire. Under random loss these explain most of the tail.
fn slow_handshakes(cell: &Cell, rtt_ms: f64) -> Option<usize> {
    let times: Vec<f64> = cell
        .samples
        .iter()
        .filter(|s| s.ok && s.time_appconnect > 0.0)
        .map(|s| s.time_appconnect)
        .collect();
    let fastest = times.iter().copied().reduce(f64::min)?;
    Some(
        times
            .iter()
            .filter(|&&t| t >= fastest + rtt_ms / 2000.0)
            .count(),
    )
}

fn fmt_s(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into())
}

/// Short notes from the counters: what the path did to this row's packets.
pub fn notes(case: &Case, cell: &Cell, st: &Stats) -> String {
    let shown = scenario::find(&case.scenario)
        .map(|sc| sc.notes)
        .unwrap_or_default();
    let c = &cell.counters;
    let mut n = Vec::new();
    if case.rule.is_some() {
        let r = &c.rule;
        let sizes: Vec<String> = r
            .flight_sizes
            .iter()
            .map(|(k, v)| format!("{k}x{v}"))
            .collect();
        n.push(format!(
            "rule dropped {} in {} conns (flight sizes {})",
            r.drops,
            r.flights,
            sizes.join(",")
        ));
    }
    if case.loss > 0.0 {
        n.push(format!(
            "random drops {}/{}",
            c.c2s.drop_random, c.s2c.drop_random
        ));
        if let Some(k) = slow_handshakes(cell, case.rtt_ms) {
            n.push(format!("{k} slow handshakes"));
        }
    }
    if case.mtu < 1500 || shown.mtu_counters {
        n.push(format!(
            "server IPv4 frags {}, without DF {}; MTU drops c2s {} s2c {}",
            c.s2c.fragments_created + c.s2c.ipv4_fragments_in,
            c.s2c.ipv4_no_df,
            c.c2s.drop_mtu,
            c.s2c.drop_mtu
        ));
    }
    if shown.throughput {
        if let Some(m) = st.mbit_median {
            n.push(format!("{m:.0} Mbit/s"));
        }
    }
    // Kernel drops at the UDP sockets: the server's (docs/field-reports.md, "002 64 KB /
    // 208 KB brakes") and the client's, which an unpaced server's bursts overflow (curl keeps
    // the default 208 KB receive buffer).
    let (srv, cli) = (cell.server_udp.rcvbuf_errors, cell.client_udp.rcvbuf_errors);
    if shown.socket_buffers || srv + cli > 0 {
        n.push(format!("UDP RcvbufErrors srv +{srv} cli +{cli}"));
    }
    if let Some((p, mtu)) = cell
        .proxy
        .as_ref()
        .and_then(|p| Some((p, p.mean_path_mtu()?)))
    {
        n.push(format!(
            "proxy: path MTU {mtu:.0}, lost {:.0}, cc events {:.0}, forgiven {:.0}{}{}",
            p.lost_packets,
            p.congestion_events,
            p.handshake_losses_forgiven,
            if p.random_losses_tolerated > 0.0 {
                format!(", tolerated {:.0}", p.random_losses_tolerated)
            } else {
                String::new()
            },
            if p.mtu_black_holes > 0.0 {
                format!(", black holes {:.0}", p.mtu_black_holes)
            } else {
                String::new()
            }
        ));
    }
    let q = c.c2s.drop_queue + c.s2c.drop_queue;
    if q > 0 {
        n.push(format!("queue drops {q}"));
    }
    let tun = cell.tun_client_tx_dropped + cell.tun_server_tx_dropped;
    if tun > 0 {
        n.push(format!("TUN drops {tun}"));
    }
    if st.handshake_failures > 0 {
        n.push(format!("{} failed handshakes", st.handshake_failures));
    }
    if st.failures > 0 {
        if let Some(e) = cell.samples.iter().find_map(|s| s.error.clone()) {
            n.push(format!(
                "first error: {}",
                e.chars().take(80).collect::<String>()
            ));
        }
    }
    n.join("; ")
}

/// The bench's printed result: the run's conditions, one table row per row and case, and the
/// targets' verdicts.
pub fn render_markdown(r: &BenchReport) -> String {
    let mut m = String::new();
    write_header(&mut m, r);
    write_table(&mut m, r);
    super::share::write_share_table(&mut m, r);
    super::cpu::write_loopback_table(&mut m, r);
    write_verdicts(&mut m, r);
    m
}

fn write_header(m: &mut String, r: &BenchReport) {
    let e = |k: &str| r.env.get(k).cloned().unwrap_or_else(|| "?".into());
    let _ = writeln!(
        m,
        "# h3-ingress lab bench, {}{}{}",
        r.started,
        if r.quick {
            " (quick: fewer transfers, not the full protocol)"
        } else {
            ""
        },
        if r.interrupted {
            format!(" (STOPPED EARLY: {}; partial)", e("aborted"))
        } else {
            String::new()
        }
    );
    let _ = writeln!(m);
    let _ = writeln!(
        m,
        "- machine: kernel {}, {} CPUs, {} build of commit {}, proxy binary {}; rmem_max {}",
        e("kernel"),
        e("cpus"),
        e("profile"),
        e("commit"),
        e("proxy_bin"),
        e("rmem_max")
    );
    let router: Vec<String> = r
        .router_mbit
        .iter()
        .map(|(k, v)| format!("{k} {v:.0} Mbit/s"))
        .collect();
    let _ = writeln!(
        m,
        "- router (TCP bulk through the TUN emulator, no delay): {}",
        if router.is_empty() {
            "not measured".into()
        } else {
            router.join(", ")
        }
    );
    let _ = writeln!(m, "- client: {} in the client namespace, fresh connection per transfer, rows round-robin within each case", e("client"));
    let _ = writeln!(m, "- servers: {} as the TCP ingress (TLS 1.3 + h2, kernel TCP congestion control {}, TCP {}), certificate chain root+intermediate+leaf RSA, {} DER bytes; {}; {}", e("nginx"), e("tcp_cc"), r.env.get("tcp_pacing").map_or("not paced", String::as_str), e("chain_der_bytes"), e("caddy"), e("nginx_h3"));
    let _ = writeln!(m, "- path: RTT split evenly over both directions; random loss both ways, seeded per run (same seed for every row of a run); first-flight rule drops the last datagram (h3) or TLS segment (h2) of the server's first flight; MTU cases drop ICMP; {}", e("rate"));
    let _ = writeln!(m, "- times are curl's time_total in seconds over successful transfers (nearest-rank p90); failures counted separately; ×h2 = median / h2 median of the same case");
    let _ = writeln!(m);
}

/// A markdown table's header row and separator, one column per name.
pub(super) fn table_head(m: &mut String, columns: &[&str]) {
    let _ = writeln!(m, "| {} |", columns.join(" | "));
    let _ = writeln!(m, "|{}", "---|".repeat(columns.len()));
}

fn write_table(m: &mut String, r: &BenchReport) {
    // S6 and E1 cases have tables of their own.
    let own_table = |c: &Case| c.competitor.is_some() || super::cpu::is_loopback(c);
    if r.cases.iter().all(own_table) {
        return;
    }
    table_head(
        m,
        &[
            "Scen", "Case", "Row", "n", "median s", "p90 s", "max s", "fail", "×h2", "notes",
        ],
    );
    for case in r.cases.iter().filter(|c| !own_table(c)) {
        let h2 = r.cell(&case.id, H2).map(|c| stats(c, case.bytes));
        for row in &r.rows {
            if row.only_in.as_ref().is_some_and(|sc| *sc != case.scenario) {
                continue;
            }
            let _ = writeln!(m, "{}", table_row(r, case, row, h2.as_ref()));
        }
    }
    let _ = writeln!(m);
}

/// One line of the table: a row's statistics in a case, or why it has none.
fn table_row(r: &BenchReport, case: &Case, row: &RowInfo, h2: Option<&Stats>) -> String {
    let cell = r.cell(&case.id, &row.id);
    let why = row
        .not_run
        .clone()
        .or_else(|| cell.and_then(|c| c.not_run.clone()))
        .or_else(|| cell.is_none().then(|| "no transfers (interrupted)".into()));
    let (Some(cell), None) = (cell, &why) else {
        return format!(
            "| {} | {} | {} | – | – | – | – | – | – | not run: {} |",
            case.scenario,
            case.label,
            row.label,
            why.unwrap_or_default()
        );
    };
    let st = stats(cell, case.bytes);
    let ratio = match (st.median, h2.and_then(|h| h.median)) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "–".into(),
    };
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        case.scenario,
        case.label,
        row.label,
        st.n,
        fmt_s(st.median),
        fmt_s(st.p90),
        fmt_s(st.max),
        st.failures,
        ratio,
        notes(case, cell, &st)
    )
}

fn write_verdicts(m: &mut String, r: &BenchReport) {
    let _ = writeln!(
        m,
        "## Targets (issue 3), evaluated for `{OURS}` (the default) and `{CUBIC_HS}` when run"
    );
    let _ = writeln!(m);
    for v in verdicts(r) {
        let o = match &v.outcome {
            Outcome::Pass => "PASS".to_string(),
            Outcome::Fail => "FAIL".to_string(),
            Outcome::NotEvaluated(_) => "not evaluated".to_string(),
        };
        let _ = writeln!(m, "- {o}: {} ({})", v.target, v.detail);
    }
    let _ = writeln!(m);
    let _ = writeln!(m, "Reference medians at 200 ms RTT, 1 MB, measured earlier on this kind of machine: HTTP/2 1.84 s clean, 2.66 s with its last handshake segment dropped; nginx 1.26 h3 1.63 s clean, 2.06 s with the drop; Caddy 2.19 s clean. The field report on a pinned congestion window (docs/field-reports.md, 004; stock nginx 1.30.6): 1.65 s clean, 9.38 s with the drop.");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::{case, cell, row};

    #[test]
    fn slow_handshakes_are_counted_against_the_fastest_of_the_cell() {
        let mut c = cell("s3", OURS, &[1.7, 1.8, 3.2, 1.9]);
        for (s, t) in c.samples.iter_mut().zip([0.204, 0.206, 1.407, 0.305]) {
            s.time_appconnect = t;
        }
        // 200 ms RTT: 0.305 is just over half an RTT late, 1.407 a client PTO late.
        assert_eq!(slow_handshakes(&c, 200.0), Some(2));
        assert_eq!(slow_handshakes(&cell("s3", OURS, &[]), 200.0), None);
    }

    #[test]
    fn rows_that_did_not_run_are_not_evaluated_and_shown() {
        let r = BenchReport {
            cases: vec![case("S1", "s1", 200.0)],
            rows: vec![row(H2, None), row(OURS, Some("binary has no proxy"))],
            cells: vec![cell("s1", H2, &[1.84])],
            ..BenchReport::default()
        };
        let v = verdicts(&r);
        assert!(
            matches!(&v[0].outcome, Outcome::NotEvaluated(w) if w.contains("binary has no proxy"))
        );
        let md = render_markdown(&r);
        assert!(md.contains("not run: binary has no proxy"), "{md}");
        assert!(md.contains("| S1 | s1 | h2-nginx | 1 | 1.84 |"), "{md}");
        assert!(md.contains("- not evaluated: S1 s1"), "{md}");
    }
}
