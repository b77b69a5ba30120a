//! `h3-ingress-lab bench`: HTTP/2 to nginx vs HTTP/3 through our proxy, Caddy and nginx 1.26,
//! through the emulated paths of the scenarios (`scenario::SCENARIOS`). [`plan`] turns the
//! selected scenarios into cases, [`runner`] measures them, `report` judges and prints them.

pub mod env;
mod loopback;
pub mod plan;
pub mod runner;
mod share;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::emu::RuleProto;
use crate::netns;
use crate::report::{self, BenchReport, Case, RowInfo};
use crate::rows::{Row, ServerKind, ROWS};
use crate::scenario::{self, PathSpec};
use crate::servers::{self, ProxyBinArg};
use crate::session::Session;
use crate::throughput;
use crate::LabError;
use plan::PlanOptions;
use runner::{NotRun, Runner};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientArg {
    /// curl 8.14 from the trixie chroot for every row (h2 and h3).
    Curl,
    /// aioquic (lab/scripts/h3get.py) for h3 rows, the system curl for h2.
    Aioquic,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Fewer transfers (3 per cell, 10 in S3) and fewer cases: a quick look, not the protocol.
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run (default: all; `h3-ingress-lab scenarios` lists them).
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Transfers per cell (default: the scenario's, 10 or 40).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Rows to run (default: all; `h3-ingress-lab scenarios` lists them).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
    /// Debian trixie chroot with curl 8.14 (HTTP/3) and nginx 1.26 (http_v3).
    #[arg(long, env = "H3LAB_CHROOT", default_value = "/work/trixie-root")]
    pub chroot: PathBuf,
    #[arg(long, value_enum, default_value_t = ClientArg::Curl)]
    pub client: ClientArg,
    /// Name prefix of the bench's lab (namespaces, TUN devices, `/run/<prefix>`).
    #[arg(long, default_value = "h3bench")]
    pub prefix: String,
    /// Bottleneck rate in Mbit/s (each direction) for every case.
    #[arg(long)]
    pub rate_mbit: Option<f64>,
    /// Bottleneck rate in Mbit/s for S4's downloads and first upload case (0: none), so the
    /// machine's CPU (curl's QUIC receive path) is not what S4 measures. S4 also runs the
    /// upload without any limit, to stress the server's UDP socket buffers.
    #[arg(long, default_value_t = 100.0)]
    pub s4_rate_mbit: f64,
    /// Time limit per transfer in seconds (S5 uses at most 10 s, uploads at least 60 s).
    #[arg(long, default_value_t = 30.0)]
    pub max_time: f64,
    /// Initial congestion window (packets) for the h3-ingress rows that do not pin one;
    /// default: the product's default (`transport.initialWindowPackets`).
    #[arg(long)]
    pub initial_window_packets: Option<u32>,
    /// TCP congestion control for the HTTP/2 rows (both lab namespaces), e.g. `cubic`;
    /// default: the machine's (`net.ipv4.tcp_congestion_control`), named in the report.
    #[arg(long)]
    pub tcp_congestion_control: Option<String>,
    /// Pace the ingress nginx's TCP connections (the HTTP/2 flows of S6 and every h2 row):
    /// an LD_PRELOAD shim (`lab/scripts/tcp-pacing.c`, built with `cc`) sets
    /// SO_MAX_PACING_RATE on each accepted socket, which turns on the kernel's own TCP
    /// pacing. A paced TCP reference for kernels without the `fq` qdisc; S6 runs whose
    /// sockets `ss` does not show paced do not count.
    #[arg(long)]
    pub tcp_pacing: bool,
    /// Keep only the cases whose id contains one of these (e.g. `S6-50ms-20mbit`).
    #[arg(long, value_delimiter = ',')]
    pub cells: Vec<String>,
    /// S6's measuring window in seconds (default: the scenario's, 60 s after 5 s warm-up).
    #[arg(long)]
    pub share_window_s: Option<f64>,
    /// Where the JSON and markdown results go.
    #[arg(long, default_value = "target/lab")]
    pub out: PathBuf,
    #[command(flatten)]
    pub proxy: ProxyBinArg,
}

impl BenchArgs {
    /// `--s4-rate-mbit`, with 0 meaning none.
    pub fn s4_rate(&self) -> Option<f64> {
        (self.s4_rate_mbit > 0.0).then_some(self.s4_rate_mbit)
    }

    fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            quick: self.quick,
            runs: self.runs,
            rate_mbit: self.rate_mbit,
            s4_rate_mbit: self.s4_rate(),
            max_time: self.max_time,
            cells: self.cells.clone(),
            share_window_s: self.share_window_s,
        }
    }

    /// The selected scenario ids, every scenario when none is given.
    fn scenario_ids(&self) -> Vec<String> {
        if self.scenarios.is_empty() {
            scenario::SCENARIOS
                .iter()
                .map(|s| s.id.to_string())
                .collect()
        } else {
            self.scenarios.clone()
        }
    }
}

/// Set by SIGINT/SIGTERM: the bench stops after the current transfer and writes what it has.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

pub fn run(a: &BenchArgs) -> Result<(), LabError> {
    netns::require_root("lab bench")?;
    catch_interrupts();
    let cases = plan::plan(&a.scenario_ids(), &a.plan_options())?;
    let rows = select_rows(a, &cases)?;
    let mut env = env::Env::new();
    let mut not_run = NotRun::new();
    let chroot = find_chroot(a, &mut env, &mut not_run)?;
    // Our rows need the product binary; without one the bench stops here rather than
    // printing a table without them.
    let needs_proxy = rows
        .iter()
        .any(|r| matches!(r.server, ServerKind::Ours { .. }));
    let proxy_bin = needs_proxy.then(|| a.proxy.resolve()).transpose()?;
    env::describe_run(&mut env, a, proxy_bin.as_deref());
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; numbers need a release build (`cargo build --release --workspace`)");
    }

    let s = Session::start(&a.prefix, &PathSpec::CLEAN.emu(RuleProto::Any, None, 1))?;
    env.insert("chain_der_bytes".into(), s.pki.chain_der_bytes.to_string());
    env.insert(
        "tcp_cc".into(),
        env::tcp_congestion_control(&s, a.tcp_congestion_control.as_deref())?,
    );
    let mut report = BenchReport {
        started: env::first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        quick: a.quick,
        cases: cases.clone(),
        ..BenchReport::default()
    };
    measure_router(&s, &mut report);
    for f in scenario::FILES {
        if cases.iter().any(|c| c.file == f.name) {
            servers::make_file(&s.work, f.name, f.bytes)?;
        }
    }
    let mut runner = Runner::new(s, a, chroot)?;
    runner.start_servers(&rows, proxy_bin.as_deref(), &mut not_run)?;
    runner.warm_up(&rows, &mut not_run)?;
    report.rows = row_infos(&rows, &not_run);
    let abort = runner.run_cases(&cases, &rows, &not_run, &mut report);
    env.insert("loadavg_end".into(), env::loadavg());
    if let Some(why) = &abort {
        env.insert("aborted".into(), why.clone());
        report.interrupted = true;
    }
    report.env = env;
    let md = report::render_markdown(&report);
    write_results(&a.out, &report, &md)?;
    println!("{md}");
    drop(runner);
    match abort {
        Some(why) => Err(LabError::Failed(format!(
            "bench stopped early ({why}); partial results written"
        ))),
        None => Ok(()),
    }
}

/// The rows of `--rows` (default all) that the plan's scenarios measure, with
/// `--initial-window-packets` applied to our rows that do not pin a window.
fn select_rows(a: &BenchArgs, cases: &[Case]) -> Result<Vec<Row>, LabError> {
    let mut rows = ROWS.to_vec();
    if !a.rows.is_empty() {
        if let Some(r) = a.rows.iter().find(|r| !ROWS.iter().any(|x| x.id == *r)) {
            return Err(LabError::Config(format!(
                "unknown row {r:?} ({})",
                crate::rows::ids()
            )));
        }
        rows.retain(|r| a.rows.iter().any(|x| x == r.id));
    }
    if let Some(iw) = a.initial_window_packets {
        for r in &mut rows {
            if let ServerKind::Ours { variant, .. } = &mut r.server {
                variant.initial_window_packets.get_or_insert(iw);
            }
        }
    }
    rows.retain(|r| {
        scenario::only_in(r.id).is_none_or(|sc| cases.iter().any(|c| c.scenario == sc))
    });
    Ok(rows)
}

/// The trixie chroot (curl 8.14 with HTTP/3, nginx 1.26), required for the curl client;
/// without it, with aioquic, the nginx 1.26 row is not run.
fn find_chroot(
    a: &BenchArgs,
    env: &mut env::Env,
    not_run: &mut NotRun,
) -> Result<Option<PathBuf>, LabError> {
    match servers::probe_chroot(&a.chroot) {
        Ok((curl, nginx)) => {
            env.insert("chroot_curl".to_string(), curl);
            env.insert(
                "nginx_h3".to_string(),
                format!(
                    "{nginx} (trixie chroot, serves the files itself, http3_stream_buffer_size 1m)"
                ),
            );
            Ok(Some(a.chroot.clone()))
        }
        Err(why) if a.client == ClientArg::Curl => Err(LabError::Failed(format!(
            "the bench's client is curl 8.14 from a trixie chroot: {why}; or run with --client aioquic"
        ))),
        Err(why) => {
            not_run.insert("nginx-1.26", why);
            Ok(None)
        }
    }
}

/// Router capacity, measured first on a quiet lab.
fn measure_router(s: &Session, report: &mut BenchReport) {
    for (reverse, dir) in [(false, "client->server"), (true, "server->client")] {
        match throughput::measure(&s.names, Duration::from_secs(3), false, reverse) {
            Ok(t) => {
                eprintln!("router throughput {dir}: {:.0} Mbit/s", t.mbit_per_s);
                report.router_mbit.insert(dir.into(), t.mbit_per_s);
            }
            Err(e) => eprintln!("router throughput {dir}: {e}"),
        }
    }
}

fn row_infos(rows: &[Row], not_run: &NotRun) -> Vec<RowInfo> {
    rows.iter()
        .map(|r| RowInfo {
            id: r.id.into(),
            label: r.label.into(),
            proto: r.proto,
            only_in: scenario::only_in(r.id).map(str::to_string),
            not_run: not_run.get(r.id).cloned(),
        })
        .collect()
}

fn write_results(out: &Path, report: &BenchReport, md: &str) -> Result<(), LabError> {
    std::fs::create_dir_all(out)
        .map_err(|e| LabError::io(format!("mkdir {}", out.display()), e))?;
    let stamp: String = report
        .started
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let json = serde_json::to_string_pretty(report).map_err(|e| LabError::Failed(e.to_string()))?;
    for name in [format!("bench-{stamp}"), "bench-latest".to_string()] {
        std::fs::write(out.join(format!("{name}.json")), &json)
            .map_err(|e| LabError::io("write bench json", e))?;
        std::fs::write(out.join(format!("{name}.md")), md)
            .map_err(|e| LabError::io("write bench markdown", e))?;
    }
    eprintln!("results: {}/bench-{stamp}.{{json,md}}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn args(v: &[&str]) -> BenchArgs {
        let mut all = vec!["t"];
        all.extend_from_slice(v);
        T::parse_from(all).bench
    }

    #[test]
    fn rows_follow_the_flags_and_the_plan() {
        let a = args(&["--scenarios", "S2"]);
        let cases = plan::plan(&a.scenario_ids(), &a.plan_options()).unwrap();
        let rows = select_rows(&a, &cases).unwrap();
        // The S1-only and S4-only rows are left out of an S2 run.
        assert_eq!(rows.len(), ROWS.len() - 2);
        let a = args(&[
            "--rows",
            "h2-nginx,h3-ingress-iw10",
            "--initial-window-packets",
            "64",
        ]);
        let cases = plan::plan(&a.scenario_ids(), &a.plan_options()).unwrap();
        assert_eq!(
            cases.len(),
            17 + 24 + 2,
            "every scenario by default (S6: 24 cells, E1: 2)"
        );
        let rows = select_rows(&a, &cases).unwrap();
        assert_eq!(rows.len(), 2);
        let ServerKind::Ours { variant, .. } = &rows[1].server else {
            panic!("{rows:?}")
        };
        assert_eq!(
            variant.initial_window_packets,
            Some(10),
            "a pinned window stays"
        );
        let e = select_rows(&args(&["--rows", "h9"]), &cases).unwrap_err();
        assert!(
            e.to_string().contains("h2-nginx, h3-ingress-cubic-hs"),
            "{e}"
        );
    }

    #[test]
    fn s4_rate_zero_means_none() {
        assert_eq!(args(&[]).s4_rate(), Some(100.0));
        assert_eq!(args(&["--s4-rate-mbit", "0"]).s4_rate(), None);
    }
}
