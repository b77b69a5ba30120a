//! `h3-ingress-lab smoke`: the CI proof that the lab works end to end, with what CI has (the
//! system curl for h2, aioquic for h3, Caddy as the independent h3 server, our proxy). First
//! the emulator's own mechanics (`probe`), then the smoke steps of every scenario in the
//! table (`steps`). No timing assertions except lower bounds the emulator guarantees; the
//! router's counters are checked after every step.

mod probe;
mod steps;

use std::path::Path;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use crate::client;
use crate::emu::RuleProto;
use crate::netns;
use crate::scenario::{PathSpec, MB1, MB4, MB5_7};
use crate::servers::{self, ProxyBinArg, ProxyVariant};
use crate::session::Session;
use crate::LabError;

#[derive(Args, Debug, Clone)]
pub struct SmokeArgs {
    /// Name prefix of the smoke lab (kept apart from a lab or bench that may be running).
    #[arg(long, default_value = "h3smoke")]
    pub prefix: String,
    #[command(flatten)]
    pub proxy: ProxyBinArg,
}

const CADDY_PORT: u16 = 8443;
const PROXY_PORT: u16 = 4433;
const PROXY_METRICS_PORT: u16 = 9480;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    name: String,
    ok: bool,
    detail: String,
}

#[derive(Default, Serialize)]
pub(crate) struct Report {
    checks: Vec<Check>,
}

impl Report {
    pub(crate) fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        let detail = detail.into();
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        self.checks.push(Check {
            name: name.to_string(),
            ok,
            detail,
        });
    }
    fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// An HTTP/3 server the smoke downloads from with aioquic.
pub(crate) struct H3Target {
    pub name: &'static str,
    pub port: u16,
}

pub fn run(a: &SmokeArgs) -> Result<(), LabError> {
    if !netns::is_root() {
        eprintln!("SKIPPED: needs root: `lab smoke` creates network namespaces and TUN devices");
        return Err(LabError::NotRoot("lab smoke".into()));
    }
    let exe = a.proxy.resolve()?;
    let started = Instant::now();
    let mut report = Report::default();
    let result = smoke(a, &exe, &mut report);
    let secs = started.elapsed().as_secs_f64();
    let out = super::output_dir();
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(
            out.join("smoke-latest.json"),
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        );
    }
    result?;
    let failed = report.failures();
    if failed.is_empty() {
        println!(
            "smoke: all {} checks passed in {secs:.1} s",
            report.checks.len()
        );
        Ok(())
    } else {
        Err(LabError::Failed(format!(
            "smoke: {} of {} checks failed in {secs:.1} s: {}",
            failed.len(),
            report.checks.len(),
            failed
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// The project's aioquic test client when the source tree has it, else the lab's own script.
fn h3_client(s: &Session) -> Result<client::AioquicClient, LabError> {
    let candidates = [
        std::env::current_dir()
            .unwrap_or_default()
            .join("tests/py/h3client.py"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/py/h3client.py"),
    ];
    if let Some(p) = candidates.into_iter().find(|p| p.exists()) {
        return Ok(client::AioquicClient::Harness(p));
    }
    let own = s.work.path("h3get.py");
    std::fs::write(&own, crate::H3GET).map_err(|e| LabError::io("write h3get.py", e))?;
    Ok(client::AioquicClient::Own(own))
}

fn smoke(a: &SmokeArgs, exe: &Path, report: &mut Report) -> Result<(), LabError> {
    let mut s = Session::start(&a.prefix, &PathSpec::CLEAN.emu(RuleProto::Any, None, 1))?;
    println!(
        "lab {} up; certificate chain {} DER bytes",
        s.names.prefix, s.pki.chain_der_bytes
    );
    for f in [&MB1, &MB4, &MB5_7] {
        servers::make_file(&s.work, f.name, f.bytes)?;
    }
    let h3 = h3_client(&s)?;
    println!("h3 client: {}", h3.script().display());
    let targets = start_servers(&mut s, exe)?;
    probe::mechanics(&mut s, report)?;
    let h3 = steps::H3 {
        servers: &targets,
        client: &h3,
    };
    steps::run_all(&mut s, report, &h3)?;
    if let Some(dead) = s.dead_process() {
        report.check("servers stayed up", false, dead);
    }
    Ok(())
}

/// The ingress (h2), Caddy and our proxy (h3); returns the h3 servers.
fn start_servers(s: &mut Session, exe: &Path) -> Result<Vec<H3Target>, LabError> {
    let ns = s.names.server_ns.clone();
    let ingress = servers::start_ingress(&ns, &s.work, &s.pki, None)?;
    s.keep(ingress);
    let caddy = servers::start_caddy(&ns, &s.work, &s.pki, CADDY_PORT)?;
    s.keep(caddy);
    // The smoke checks what users get: the product's default controller.
    let ours = ProxyVariant {
        congestion_control: h3_ingress::api::CongestionControl::default().as_str(),
        buffer_bytes: None,
        initial_window_packets: None,
    };
    let yaml = servers::proxy_config(&ours, PROXY_PORT, PROXY_METRICS_PORT, &s.pki)?;
    let p = servers::start_proxy(&ns, &s.work, exe, "h3-ingress", &yaml, PROXY_METRICS_PORT)?;
    s.keep(p);
    Ok(vec![
        H3Target {
            name: "caddy",
            port: CADDY_PORT,
        },
        H3Target {
            name: "h3-ingress",
            port: PROXY_PORT,
        },
    ])
}
