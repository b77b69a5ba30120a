//! [`Measure::Loopback`](crate::scenario::Measure::Loopback) (E1) in the bench: curl runs in
//! the server namespace, so each download crosses `lo` and never the router, and the servers'
//! process CPU time is read from /proc before and after each transfer.
//!
//! Why loopback and not the lab's zero-delay path: through the router every packet also
//! crosses two TUN devices and a user-space process that shares the two cores, which caps
//! the rate near the router's capacity and makes the kernel's per-packet cost a TUN write
//! instead of the receive path the real NIC would take. On `lo` the only processes on the
//! path are the client and the servers, and the figures are comparable with the
//! `scripts/loopback-cpu.sh` measurements (which stay for profiling). The one distortion of
//! loopback is that the kernel charges the receiver's UDP/TCP delivery to the sender; it
//! does so alike for every row.

use super::runner::{empty_cells, record, Runner};
use crate::client::Sample;
use crate::procstat;
use crate::report::cpu::CpuSample;
use crate::report::{Case, Cell};
use crate::rows::{Row, ServerKind};
use crate::LabError;

/// The name a row's server process was started under (see `Runner::start_servers`).
fn server_process(row: &Row) -> &'static str {
    match row.server {
        ServerKind::Ingress => INGRESS,
        ServerKind::Ours { .. } => row.id,
        ServerKind::Caddy => "caddy",
        ServerKind::NginxH3 => "nginx-h3",
    }
}

const INGRESS: &str = "nginx-ingress";

fn load1() -> f64 {
    super::env::loadavg()
        .split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(f64::NAN)
}

impl Runner<'_> {
    /// `case.runs` rounds of one loopback download per row, the starting row rotating.
    pub(super) fn loopback(&mut self, case: &Case, active: &[&Row]) -> (Vec<Cell>, Option<String>) {
        let mut cells = empty_cells(case, active);
        let abort = self.rounds(case, active, &mut cells, |r, row, run, cell| {
            let x = r.one_loopback(row, case, cell)?;
            record(case, run, row, cell, x);
            Ok(())
        });
        (cells, abort)
    }

    /// One download with the CPU time of the row's server and of the ingress behind it.
    fn one_loopback(
        &mut self,
        row: &Row,
        case: &Case,
        cell: &mut Cell,
    ) -> Result<Sample, LabError> {
        let pid = |name: &str| {
            self.s
                .pid(name)
                .ok_or_else(|| LabError::Failed(format!("no process {name} for {}", row.id)))
        };
        let server = pid(server_process(row))?;
        let ingress = match row.server {
            ServerKind::Ingress | ServerKind::NginxH3 => None,
            _ => Some(pid(INGRESS)?),
        };
        let cpu = |p: Option<u32>| p.map(procstat::tree_cpu_seconds).transpose();
        let proxy_before = self.proxy_stats(row);
        let (s0, i0) = (procstat::tree_cpu_seconds(server)?, cpu(ingress)?);
        let ns = self.s.names.server_ns.clone();
        let x = self.curl_transfer(row, case, None, &ns)?;
        // Our proxy accounts a connection when it closes; curl has closed it by now, and the
        // proxy's work on the close belongs to this transfer.
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (s1, i1) = (procstat::tree_cpu_seconds(server)?, cpu(ingress)?);
        cell.cpu.push(CpuSample {
            server_s: s1 - s0,
            ingress_s: i1.zip(i0).map(|(a, b)| a - b),
            bytes: if x.ok { x.bytes } else { 0 },
            load1: load1(),
        });
        if let (Some(b), Some(a)) = (proxy_before, self.proxy_stats(row)) {
            cell.proxy
                .get_or_insert_with(Default::default)
                .add(&a.delta(&b));
        }
        Ok(x)
    }
}
