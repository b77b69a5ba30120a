//! The bench's results: what was measured (cases, rows, cells), per-cell statistics, the
//! issue's targets ([`targets`]) and the markdown table ([`markdown`]). All pure, so the
//! verdict logic is tested with made-up numbers.

pub mod cpu;
pub mod markdown;
pub mod share;
pub mod targets;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use markdown::render_markdown;
pub use targets::verdicts;

use crate::client::{Proto, Sample};
use crate::emu::{Counters, Position};
use crate::scenario::{Competitor, PathSpec};
use crate::session::UdpStats;

/// One case of the plan: a scenario's `CaseSpec` with the run's flags applied (runs, rate,
/// time limit), as stored in the JSON results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// The id of its entry in `scenario::SCENARIOS`.
    pub scenario: String,
    pub id: String,
    pub label: String,
    pub rtt_ms: f64,
    pub loss: f64,
    pub mtu: u32,
    pub icmp: bool,
    /// Which datagram/segment of the server's first flight of every connection is dropped:
    /// the last one, or the last one carrying handshake data (QUIC long header; for TCP the
    /// same segment).
    pub rule: Option<Position>,
    pub file: String,
    pub bytes: u64,
    pub upload: bool,
    pub runs: usize,
    pub rate_mbit: Option<f64>,
    pub max_time: f64,
    /// S6: the drop-tail queue in front of the bottleneck, bytes (else 100 ms at the rate).
    #[serde(default)]
    pub queue_bytes: Option<u64>,
    /// S6: the competing flow, by `scenario::Competitor::name` ("cubic", "bbr", "self").
    #[serde(default)]
    pub competitor: Option<String>,
}

impl Case {
    /// S6: the competing flow, `None` for other cases (or a name this build does not know).
    pub fn competitor(&self) -> Option<Competitor> {
        self.competitor.as_deref().and_then(Competitor::from_name)
    }

    /// The emulated path of this case.
    pub fn path(&self) -> PathSpec {
        PathSpec {
            rtt_ms: self.rtt_ms,
            loss: self.loss,
            mtu: self.mtu,
            icmp: self.icmp,
            first_flight_drop: self.rule,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowInfo {
    pub id: String,
    pub label: String,
    pub proto: Proto,
    /// Measured only in this scenario (e.g. the forced-small-buffer row in S4).
    pub only_in: Option<String>,
    pub not_run: Option<String>,
}

/// All transfers of one row in one case, with the router's and the kernel's counters summed
/// over exactly those transfers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    pub case_id: String,
    pub row: String,
    pub samples: Vec<Sample>,
    pub counters: Counters,
    pub server_udp: UdpStats,
    pub client_udp: UdpStats,
    pub tun_client_tx_dropped: u64,
    pub tun_server_tx_dropped: u64,
    pub not_run: Option<String>,
    /// Our proxy's own view of the cell's connections (its /metrics), for our rows.
    #[serde(default)]
    pub proxy: Option<ProxyStats>,
    /// S6: one per run, what each flow received in the window.
    #[serde(default)]
    pub shares: Vec<crate::share::ShareSample>,
    /// E1: one per transfer, the servers' process CPU time.
    #[serde(default)]
    pub cpu: Vec<cpu::CpuSample>,
}

/// Deltas of our proxy's per-connection counters over one cell, read from its /metrics:
/// what path-MTU discovery settled on and what the congestion controller saw.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProxyStats {
    pub connections: f64,
    pub path_mtu_sum: f64,
    pub lost_packets: f64,
    pub congestion_events: f64,
    pub handshake_losses_forgiven: f64,
    /// Older reports have no such field.
    #[serde(default)]
    pub random_losses_tolerated: f64,
    pub mtu_black_holes: f64,
}

impl ProxyStats {
    /// Sums every series of the counters we use from a Prometheus text exposition. Pure.
    pub fn parse(text: &str) -> Self {
        let sum = |name: &str| -> f64 {
            text.lines()
                .filter(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        ProxyStats {
            connections: sum("h3_ingress_connection_path_mtu_bytes_count"),
            path_mtu_sum: sum("h3_ingress_connection_path_mtu_bytes_sum"),
            lost_packets: sum("h3_ingress_connection_lost_packets_total"),
            congestion_events: sum("h3_ingress_connection_congestion_events_total"),
            handshake_losses_forgiven: sum("h3_ingress_congestion_handshake_losses_forgiven_total"),
            random_losses_tolerated: sum("h3_ingress_congestion_random_losses_tolerated_total"),
            mtu_black_holes: sum("h3_ingress_connection_mtu_black_holes_total"),
        }
    }

    /// Mean UDP payload size path-MTU discovery settled on; `None` before any connection closed.
    pub fn mean_path_mtu(&self) -> Option<f64> {
        (self.connections > 0.0).then(|| self.path_mtu_sum / self.connections)
    }

    pub fn delta(&self, earlier: &Self) -> Self {
        ProxyStats {
            connections: self.connections - earlier.connections,
            path_mtu_sum: self.path_mtu_sum - earlier.path_mtu_sum,
            lost_packets: self.lost_packets - earlier.lost_packets,
            congestion_events: self.congestion_events - earlier.congestion_events,
            handshake_losses_forgiven: self.handshake_losses_forgiven
                - earlier.handshake_losses_forgiven,
            random_losses_tolerated: self.random_losses_tolerated - earlier.random_losses_tolerated,
            mtu_black_holes: self.mtu_black_holes - earlier.mtu_black_holes,
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.connections += o.connections;
        self.path_mtu_sum += o.path_mtu_sum;
        self.lost_packets += o.lost_packets;
        self.congestion_events += o.congestion_events;
        self.handshake_losses_forgiven += o.handshake_losses_forgiven;
        self.random_losses_tolerated += o.random_losses_tolerated;
        self.mtu_black_holes += o.mtu_black_holes;
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub n: usize,
    pub ok: usize,
    pub failures: usize,
    pub handshake_failures: usize,
    /// Seconds over successful transfers (nearest-rank percentiles).
    pub median: Option<f64>,
    pub p90: Option<f64>,
    pub max: Option<f64>,
    /// Median goodput of successful transfers, Mbit/s.
    pub mbit_median: Option<f64>,
}

fn nearest_rank(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
}

pub fn stats(cell: &Cell, bytes: u64) -> Stats {
    let mut t: Vec<f64> = cell
        .samples
        .iter()
        .filter(|s| s.ok)
        .map(|s| s.time_total)
        .collect();
    t.sort_by(|a, b| a.total_cmp(b));
    let mut rates: Vec<f64> = t
        .iter()
        .filter(|x| **x > 0.0)
        .map(|x| bytes as f64 * 8.0 / x / 1e6)
        .collect();
    rates.sort_by(|a, b| a.total_cmp(b));
    Stats {
        n: cell.samples.len(),
        ok: t.len(),
        failures: cell.samples.len() - t.len(),
        handshake_failures: cell.samples.iter().filter(|s| s.handshake_failed).count(),
        median: nearest_rank(&t, 0.5),
        p90: nearest_rank(&t, 0.9),
        max: t.last().copied(),
        mbit_median: nearest_rank(&rates, 0.5),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BenchReport {
    pub started: String,
    pub quick: bool,
    pub interrupted: bool,
    pub env: BTreeMap<String, String>,
    /// Router throughput measured at the start (TCP, no delay), Mbit/s by direction.
    pub router_mbit: BTreeMap<String, f64>,
    pub cases: Vec<Case>,
    pub rows: Vec<RowInfo>,
    pub cells: Vec<Cell>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    Pass,
    Fail,
    NotEvaluated(String),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub target: String,
    pub outcome: Outcome,
    pub detail: String,
}

impl BenchReport {
    pub fn case(&self, id: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.id == id)
    }
    pub fn cell(&self, case_id: &str, row: &str) -> Option<&Cell> {
        self.cells
            .iter()
            .find(|c| c.case_id == case_id && c.row == row)
    }
    fn row_not_run(&self, row: &str) -> Option<String> {
        match self.rows.iter().find(|r| r.id == row) {
            None => Some("row not selected".into()),
            Some(r) => r.not_run.clone(),
        }
    }
    /// Statistics of a measured cell, or why there are none.
    fn measured(&self, case_id: &str, row: &str) -> Result<Stats, String> {
        if let Some(why) = self.row_not_run(row) {
            return Err(format!("{row} not run: {why}"));
        }
        let case = self
            .case(case_id)
            .ok_or_else(|| format!("case {case_id} not run"))?;
        let cell = self
            .cell(case_id, row)
            .ok_or_else(|| format!("{row} has no cell in {case_id}"))?;
        if let Some(why) = &cell.not_run {
            return Err(format!("{row} not run in {case_id}: {why}"));
        }
        let st = stats(cell, case.bytes);
        if st.median.is_none() {
            return Err(format!("{row} had no successful transfer in {case_id}"));
        }
        Ok(st)
    }
}

/// Made-up reports for the tests of the verdicts and the table.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;

    pub fn sample(t: f64) -> Sample {
        Sample {
            ok: true,
            time_total: t,
            ..Sample::default()
        }
    }

    pub fn case(scenario: &str, id: &str, rtt: f64) -> Case {
        Case {
            scenario: scenario.into(),
            id: id.into(),
            label: id.into(),
            rtt_ms: rtt,
            loss: 0.0,
            mtu: 1500,
            icmp: true,
            rule: (scenario == "S2").then_some(Position::Last),
            file: "1m.bin".into(),
            bytes: 1 << 20,
            upload: false,
            runs: 3,
            rate_mbit: None,
            max_time: 30.0,
            queue_bytes: None,
            competitor: None,
        }
    }

    pub fn row(id: &str, not_run: Option<&str>) -> RowInfo {
        RowInfo {
            id: id.into(),
            label: id.into(),
            proto: Proto::H3,
            only_in: None,
            not_run: not_run.map(str::to_string),
        }
    }

    pub fn cell(case_id: &str, row: &str, times: &[f64]) -> Cell {
        Cell {
            case_id: case_id.into(),
            row: row.into(),
            samples: times.iter().map(|t| sample(*t)).collect(),
            ..Cell::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::cell;
    use super::*;

    #[test]
    fn proxy_stats_sum_every_series() {
        let text = "# HELP x\n\
            h3_ingress_connection_path_mtu_bytes_sum{family=\"ipv4\"} 2400\n\
            h3_ingress_connection_path_mtu_bytes_sum{family=\"ipv6\"} 1452\n\
            h3_ingress_connection_path_mtu_bytes_count 3\n\
            h3_ingress_connection_path_mtu_bytes_bucket{le=\"1200\"} 2\n\
            h3_ingress_congestion_handshake_losses_forgiven_total 1\n\
            h3_ingress_congestion_random_losses_tolerated_total 7\n\
            h3_ingress_connection_lost_packets_total_other 99\n";
        let p = ProxyStats::parse(text);
        assert_eq!(p.random_losses_tolerated, 7.0);
        assert_eq!(p.path_mtu_sum, 3852.0);
        assert_eq!(p.connections, 3.0);
        assert_eq!(p.handshake_losses_forgiven, 1.0);
        assert_eq!(p.lost_packets, 0.0, "a longer name is another metric");
        let d = p.delta(&ProxyStats {
            connections: 1.0,
            ..Default::default()
        });
        assert_eq!(d.connections, 2.0);
    }

    #[test]
    fn percentiles_are_nearest_rank_over_successes() {
        let mut c = cell(
            "a",
            "r",
            &[5.0, 1.0, 2.0, 4.0, 3.0, 6.0, 7.0, 8.0, 9.0, 10.0],
        );
        c.samples.push(Sample {
            handshake_failed: true,
            ..Sample::default()
        });
        let s = stats(&c, 1_000_000);
        assert_eq!(
            (s.n, s.ok, s.failures, s.handshake_failures),
            (11, 10, 1, 1)
        );
        assert_eq!(s.median, Some(5.0));
        assert_eq!(s.p90, Some(9.0));
        assert_eq!(s.max, Some(10.0));
        assert_eq!(s.mbit_median, Some(8.0 / 6.0)); // 5th of 10 sorted rates: 8 Mbit over 6 s
        assert_eq!(stats(&cell("a", "r", &[]), 1).median, None);
    }
}
