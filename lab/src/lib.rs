//! The network lab of h3-ingress: a user-space path emulator between two network namespaces,
//! the benchmark that compares HTTP/3 servers through it, and a CI smoke test. Linux only,
//! needs root. The scenarios it measures are one table, [`scenario::SCENARIOS`]; the servers
//! it compares another, [`rows::ROWS`]. docs/lab.md describes it for users.
//!
//! ```text
//!  h3lab-c (client)            router process (root ns)            h3lab-s (server)
//!  10.77.1.2  fd77:1::2  <-TUN-> [delay|loss|rate|MTU|rule] <-TUN->  10.77.2.2  fd77:2::2
//! ```
//!
//! It uses the product crate only for its configuration types (`h3_ingress::api`); the proxy
//! runs as a child process, the product binary (`servers::ProxyBinArg`).

pub mod bench;
pub mod cli;
pub mod client;
pub mod control;
pub mod emu;
pub mod lifecycle;
pub mod netns;
pub mod packet;
pub mod pki;
pub mod procstat;
pub mod report;
pub mod router;
pub mod rows;
pub mod scenario;
pub mod servers;
pub mod session;
pub mod share;
pub mod smoke;
pub mod throughput;
pub mod topology;
pub mod tun;

pub use cli::{Common, EmuArgs, LabCommand};
pub use lifecycle::{down, output_dir, router_pid, set_config, snapshot, up, Snapshot, UpResult};

use netns::LabNames;

/// The lab's own minimal aioquic client (one HTTP/3 request, JSON result), written into a
/// run's work directory when the project's test client is not at hand.
pub const H3GET: &str = include_str!("../scripts/h3get.py");
/// The LD_PRELOAD shim behind `bench --tcp-pacing`, compiled into a run's work directory.
pub const TCP_PACING_SHIM: &str = include_str!("../scripts/tcp-pacing.c");

#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("{0} needs root (network namespaces, TUN devices); run it as root")]
    NotRoot(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed with status {status}: {stderr}")]
    Command {
        cmd: String,
        status: i32,
        stderr: String,
    },
    #[error("control socket: {0}")]
    Control(String),
    #[error("invalid lab settings: {0}")]
    Config(String),
    #[error("lab {0:?} is not up (run `h3-ingress-lab up --prefix {0}` first)")]
    NotUp(String),
    #[error("{0}")]
    Failed(String),
}

impl LabError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LabError::Io {
            context: context.into(),
            source,
        }
    }
}

pub fn run(command: LabCommand) -> Result<(), LabError> {
    match command {
        LabCommand::Up { common, emu } => {
            let names = LabNames::new(&common.prefix)?;
            let cfg = emu.to_config()?;
            let r = up(&names, &cfg)?;
            println!("{}", lifecycle::describe(&names, &cfg, r));
            Ok(())
        }
        LabCommand::Down { common } => down(&LabNames::new(&common.prefix)?),
        LabCommand::Router {
            common,
            emu,
            config_json,
        } => {
            let names = LabNames::new(&common.prefix)?;
            let cfg = match config_json {
                Some(j) => serde_json::from_str(&j)
                    .map_err(|e| LabError::Config(format!("--config-json: {e}")))?,
                None => emu.to_config()?,
            };
            router::run(&names, cfg)
        }
        LabCommand::Counters { common, reset } => {
            let names = LabNames::new(&common.prefix)?;
            let snap = snapshot(&names, reset)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&snap).map_err(|e| LabError::Failed(e.to_string()))?
            );
            Ok(())
        }
        LabCommand::Throughput(a) => throughput::run(&a),
        LabCommand::Bench(a) => bench::run(&a),
        LabCommand::Smoke(a) => smoke::run(&a),
        LabCommand::Scenarios => {
            print!("{}", scenario::describe_all());
            println!("rows: {}", rows::ids());
            Ok(())
        }
    }
}
