//! The bench's measuring loop: starts every row's server, proves each row with a warm-up
//! transfer, then runs the plan's cases. Within a case the rows take turns (round-robin, the
//! starting row rotating every run) so drift of this shared machine hits every row alike; the
//! router's counters, both namespaces' UDP counters and our proxy's /metrics are attributed
//! per cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{BenchArgs, ClientArg, INTERRUPTED};
use crate::client::{self, Expect, Proto, Sample};
use crate::emu::RuleProto;
use crate::netns;
use crate::report::{BenchReport, Case, Cell, ProxyStats};
use crate::rows::{Row, ServerKind};
use crate::scenario::{self, Measure, MB1};
use crate::servers;
use crate::session::Session;
use crate::topology::SERVER_V4;
use crate::LabError;

/// Rows that will not be measured, with the reason (shown in the table, never estimated).
pub type NotRun = BTreeMap<&'static str, String>;

pub struct Runner<'a> {
    pub s: Session,
    pub(super) args: &'a BenchArgs,
    /// The trixie chroot whose curl (and nginx 1.26) the bench uses, if found.
    chroot: Option<PathBuf>,
    /// The aioquic script for `--client aioquic`.
    script: PathBuf,
}

impl<'a> Runner<'a> {
    pub fn new(s: Session, args: &'a BenchArgs, chroot: Option<PathBuf>) -> Result<Self, LabError> {
        let script = s.work.path("h3get.py");
        std::fs::write(&script, crate::H3GET).map_err(|e| LabError::io("write h3get.py", e))?;
        Ok(Runner {
            s,
            args,
            chroot,
            script,
        })
    }

    /// Starts the ingress and every row's server; a row whose server does not start is not run.
    pub fn start_servers(
        &mut self,
        rows: &[Row],
        proxy_bin: Option<&Path>,
        not_run: &mut NotRun,
    ) -> Result<(), LabError> {
        let ns = self.s.names.server_ns.clone();
        let shim = match self.args.tcp_pacing {
            true => Some(servers::build_pacing_shim(&self.s.work)?),
            false => None,
        };
        let ingress = servers::start_ingress(&ns, &self.s.work, &self.s.pki, shim.as_deref())?;
        self.s.keep(ingress);
        let inside = match &self.chroot {
            Some(root) => Some((root.clone(), self.s.mount_chroot(root)?.inside.clone())),
            None => None,
        };
        for r in rows {
            if not_run.contains_key(r.id) {
                continue;
            }
            let (s, port) = (&self.s, r.port);
            let started = match &r.server {
                ServerKind::Ingress => Ok(None),
                ServerKind::Caddy => servers::start_caddy(&ns, &s.work, &s.pki, port).map(Some),
                ServerKind::NginxH3 => match &inside {
                    Some((root, inside)) => {
                        servers::start_nginx_h3(&ns, &s.work, root, inside, port).map(Some)
                    }
                    None => Err(LabError::Failed("no trixie chroot".into())),
                },
                ServerKind::Ours {
                    variant,
                    metrics_port,
                } => {
                    let exe = proxy_bin.ok_or(LabError::Failed("no proxy binary".into()))?;
                    servers::proxy_config(variant, port, *metrics_port, &s.pki).and_then(|y| {
                        servers::start_proxy(&ns, &s.work, exe, r.id, &y, *metrics_port).map(Some)
                    })
                }
            };
            match started {
                Ok(Some(p)) => self.s.keep(p),
                Ok(None) => {}
                Err(e) => {
                    not_run.insert(r.id, format!("server did not start: {e}"));
                }
            }
        }
        Ok(())
    }

    /// One clean 1 MB transfer per row (three tries) proves the row works before it is
    /// measured; a row that cannot is not run.
    pub fn warm_up(&mut self, rows: &[Row], not_run: &mut NotRun) -> Result<(), LabError> {
        let warm = Case {
            scenario: "warm-up".into(),
            id: "warm-up".into(),
            label: "warm-up".into(),
            rtt_ms: 0.0,
            loss: 0.0,
            mtu: 1500,
            icmp: true,
            rule: None,
            file: MB1.name.into(),
            bytes: MB1.bytes,
            upload: false,
            runs: 1,
            rate_mbit: None,
            max_time: 15.0,
            queue_bytes: None,
            competitor: None,
        };
        servers::make_file(&self.s.work, MB1.name, MB1.bytes)?;
        for r in rows {
            if not_run.contains_key(r.id) {
                continue;
            }
            let mut last = String::new();
            let mut ok = false;
            for _ in 0..3 {
                let x = self.transfer(r, &warm)?;
                if x.ok {
                    ok = true;
                    break;
                }
                last = x.error.unwrap_or_default();
                std::thread::sleep(Duration::from_millis(500));
            }
            if !ok {
                not_run.insert(r.id, format!("warm-up transfer failed: {last}"));
            }
            eprintln!("warm-up {}: {}", r.id, if ok { "ok" } else { &last });
        }
        Ok(())
    }

    /// Runs every case, adding its cells to the report; returns why it stopped early, if it
    /// did (the cells measured so far are in the report either way).
    pub fn run_cases(
        &mut self,
        cases: &[Case],
        rows: &[Row],
        not_run: &NotRun,
        report: &mut BenchReport,
    ) -> Option<String> {
        for (ci, case) in cases.iter().enumerate() {
            let active: Vec<&Row> = rows
                .iter()
                .filter(|r| {
                    !not_run.contains_key(r.id)
                        && scenario::only_in(r.id).is_none_or(|sc| sc == case.scenario)
                })
                .collect();
            let measure = scenario::find(&case.scenario).map_or(Measure::Transfers, |s| s.measure);
            let (cells, abort) = match measure {
                Measure::Transfers => self.transfers(ci, case, &active),
                Measure::Share { .. } => self.shares(ci, case, &active),
                Measure::Loopback => self.loopback(case, &active),
            };
            report.cells.extend(cells);
            if abort.is_some() {
                return abort;
            }
        }
        None
    }

    /// [`Measure::Transfers`]: `case.runs` rounds of one transfer per row.
    fn transfers(
        &mut self,
        ci: usize,
        case: &Case,
        active: &[&Row],
    ) -> (Vec<Cell>, Option<String>) {
        let mut cells = empty_cells(case, active);
        let abort = self.rounds(case, active, &mut cells, |r, row, run, cell| {
            // Same seed for every row of a run, a new one per run and case.
            let seed = (ci as u64 + 1) * 1000 + run as u64 + 1;
            let x = r.one_transfer(row, case, seed, cell)?;
            record(case, run, row, cell, x);
            Ok(())
        });
        (cells, abort)
    }

    /// `case.runs` rounds of `one` over the active rows, the starting row rotating every run
    /// so no row always goes first; stops at an interrupt, an error or a dead server.
    pub(super) fn rounds<F>(
        &mut self,
        case: &Case,
        active: &[&Row],
        cells: &mut [Cell],
        mut one: F,
    ) -> Option<String>
    where
        F: FnMut(&mut Self, &Row, usize, &mut Cell) -> Result<(), LabError>,
    {
        for run in 0..case.runs {
            for k in 0..active.len() {
                let i = (k + run) % active.len();
                if INTERRUPTED.load(Ordering::SeqCst) {
                    return Some("interrupted".into());
                }
                if let Err(e) = one(self, active[i], run, &mut cells[i]) {
                    return Some(format!("lab error: {e}"));
                }
            }
            if let Some(dead) = self.s.dead_process() {
                return Some(format!("a server died: {dead}"));
            }
        }
        None
    }

    /// Sets the case's path for the row's protocol and measures one transfer.
    fn one_transfer(
        &mut self,
        row: &Row,
        case: &Case,
        seed: u64,
        cell: &mut Cell,
    ) -> Result<Sample, LabError> {
        let proto = match row.proto {
            Proto::H2 => RuleProto::Tcp,
            Proto::H3 => RuleProto::Udp,
        };
        let cfg = case.path().emu(proto, case.rate_mbit, seed);
        self.s.set(&cfg)?;
        self.measured(row, case, cell)
    }

    fn transfer(&self, row: &Row, case: &Case) -> Result<Sample, LabError> {
        self.transfer_from(row, case, None)
    }

    /// A transfer; with `from`, the client sends from that client address (curl
    /// `--interface`, h3get.py `--bind`).
    pub(super) fn transfer_from(
        &self,
        row: &Row,
        case: &Case,
        from: Option<std::net::Ipv4Addr>,
    ) -> Result<Sample, LabError> {
        let (expect, path) = expect_and_path(row, case);
        if row.proto == Proto::H3 && self.args.client == ClientArg::Aioquic {
            let src = self.s.work.path("www").join(&case.file);
            return client::run_h3get(
                &self.s.names.client_ns,
                &client::H3Get {
                    script: &self.script,
                    ca: &self.s.pki.root,
                    port: row.port,
                    path: &path,
                    upload: case.upload.then_some(src.as_path()),
                    max_time: case.max_time,
                    bind: from,
                },
                expect,
            );
        }
        self.curl_transfer(row, case, from, &self.s.names.client_ns)
    }

    /// A transfer by curl in namespace `ns` (the client's, or for loopback cases the server's).
    pub(super) fn curl_transfer(
        &self,
        row: &Row,
        case: &Case,
        from: Option<std::net::Ipv4Addr>,
        ns: &str,
    ) -> Result<Sample, LabError> {
        let (expect, path) = expect_and_path(row, case);
        // Paths as the client sees them: inside the chroot, the work dir is under /mnt/<prefix>.
        let (ca, upload) = match &self.chroot {
            Some(_) => {
                let inside = PathBuf::from("/mnt").join(&self.s.names.prefix);
                (
                    inside.join("pki/root.pem"),
                    inside.join("www").join(&case.file),
                )
            }
            None => (
                self.s.pki.root.clone(),
                self.s.work.path("www").join(&case.file),
            ),
        };
        let upload = upload.to_string_lossy().into_owned();
        let mut a = client::curl_args(
            row.proto,
            std::net::IpAddr::V4(SERVER_V4),
            row.port,
            &path,
            &ca.to_string_lossy(),
            case.upload.then_some(upload.as_str()),
            case.max_time,
        );
        if let Some(ip) = from {
            a.splice(0..0, ["--interface".to_string(), ip.to_string()]);
        }
        client::run_curl(ns, self.chroot.as_deref(), &a, expect)
    }

    /// One transfer with its counters: router deltas and UDP stats of both namespaces.
    fn measured(&mut self, row: &Row, case: &Case, cell: &mut Cell) -> Result<Sample, LabError> {
        let before = self.s.snapshot()?;
        let proxy_before = self.proxy_stats(row);
        let srv = self.s.udp_stats(true)?;
        let cli = self.s.udp_stats(false)?;
        let sample = self.transfer(row, case)?;
        // Let the delay line empty so late packets of this connection count here, not in the
        // next row's cell, and do not compete with it.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.s.snapshot()?.queued > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = self.s.snapshot()?;
        cell.counters.add(&after.counters.delta(&before.counters));
        cell.server_udp.add(&self.s.udp_stats(true)?.delta(&srv));
        cell.client_udp.add(&self.s.udp_stats(false)?.delta(&cli));
        cell.tun_client_tx_dropped += after
            .tun_client_tx_dropped
            .saturating_sub(before.tun_client_tx_dropped);
        cell.tun_server_tx_dropped += after
            .tun_server_tx_dropped
            .saturating_sub(before.tun_server_tx_dropped);
        if let (Some(b), Some(a)) = (proxy_before, self.proxy_stats(row)) {
            cell.proxy
                .get_or_insert_with(Default::default)
                .add(&a.delta(&b));
        }
        Ok(sample)
    }

    /// Our proxy's counters from its /metrics inside the server namespace; `None` for other
    /// rows or when the scrape fails (the cell then simply has no proxy notes).
    pub(super) fn proxy_stats(&self, row: &Row) -> Option<ProxyStats> {
        let ServerKind::Ours { metrics_port, .. } = &row.server else {
            return None;
        };
        let url = format!("http://127.0.0.1:{metrics_port}/metrics");
        let ns = &self.s.names.server_ns;
        netns::run(
            "ip",
            &["netns", "exec", ns, "curl", "-sf", "--max-time", "2", &url],
        )
        .ok()
        .map(|t| ProxyStats::parse(&t))
    }
}

/// One empty cell per active row of `case`.
pub(super) fn empty_cells(case: &Case, active: &[&Row]) -> Vec<Cell> {
    active
        .iter()
        .map(|r| Cell {
            case_id: case.id.clone(),
            row: r.id.into(),
            ..Cell::default()
        })
        .collect()
}

/// What a row's transfer of `case` must deliver, and the URL path it asks for.
fn expect_and_path(row: &Row, case: &Case) -> (Expect, String) {
    let expect = Expect {
        proto: row.proto,
        bytes: case.bytes,
        upload: case.upload,
    };
    let path = if case.upload {
        format!("/upload/{}.bin", row.id)
    } else {
        format!("/{}", case.file)
    };
    (expect, path)
}

/// Prints a sample's progress line and keeps it in its cell.
pub(super) fn record(case: &Case, run: usize, row: &Row, cell: &mut Cell, x: Sample) {
    progress(case, run, row, &x);
    cell.samples.push(x);
}

pub(super) fn progress(case: &Case, run: usize, row: &Row, x: &Sample) {
    eprintln!(
        "[{} {} {}/{}] {:<22} {}",
        case.scenario,
        case.label,
        run + 1,
        case.runs,
        row.id,
        if x.ok {
            format!("{:.3} s", x.time_total)
        } else {
            format!("FAILED {}", x.error.clone().unwrap_or_default())
        }
    );
}
