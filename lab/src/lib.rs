//! The network lab: a user-space path emulator between two network namespaces, the benchmark
//! that compares HTTP/3 servers through it, and a CI smoke test. Linux only, needs root.
//!
//! ```text
//!  h3lab-c (client)            router process (root ns)            h3lab-s (server)
//!  10.77.1.2  fd77:1::2  <-TUN-> [delay|loss|rate|MTU|rule] <-TUN->  10.77.2.2  fd77:2::2
//! ```

pub mod bench;
pub mod client;
pub mod control;
pub mod emu;
pub mod netns;
pub mod packet;
pub mod report;
pub mod router;
pub mod servers;
pub mod session;
pub mod smoke;
pub mod throughput;
pub mod topology;
pub mod tun;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};

use control::Request;
use emu::{default_flight_gap_us, EmuConfig, FlightRule, LinkConfig, RuleProto};
use netns::LabNames;

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

#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Name prefix of the namespaces (`<prefix>-c`, `<prefix>-s`), TUN devices and /run/<prefix>.
    #[arg(long, default_value = "h3lab")]
    pub prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProtoArg {
    Udp,
    Tcp,
    Any,
}

/// Path emulation settings; the per-direction flags override the symmetric ones.
#[derive(Args, Debug, Clone)]
pub struct EmuArgs {
    /// Round-trip time in ms, split evenly over both directions (presets used: 11, 42, 100, 200).
    #[arg(long, default_value_t = 0.0)]
    pub rtt: f64,
    /// One-way delay client->server in ms (overrides --rtt for this direction).
    #[arg(long)]
    pub delay_c2s: Option<f64>,
    /// One-way delay server->client in ms.
    #[arg(long)]
    pub delay_s2c: Option<f64>,
    /// Random loss probability (0..1) in both directions, e.g. 0.01.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    #[arg(long)]
    pub loss_c2s: Option<f64>,
    #[arg(long)]
    pub loss_s2c: Option<f64>,
    /// Seed of the random-loss generators.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Bottleneck rate in Mbit/s in both directions (default: unlimited).
    #[arg(long)]
    pub rate_mbit: Option<f64>,
    #[arg(long)]
    pub rate_c2s_mbit: Option<f64>,
    #[arg(long)]
    pub rate_s2c_mbit: Option<f64>,
    /// Drop-tail queue in front of the bottleneck, bytes.
    #[arg(long, default_value_t = 1_000_000)]
    pub queue_bytes: u64,
    /// Path MTU in bytes (576..=1500) in both directions.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    #[arg(long)]
    pub mtu_c2s: Option<u32>,
    #[arg(long)]
    pub mtu_s2c: Option<u32>,
    /// ICMP frag-needed / packet-too-big for oversized packets (`off`: MTU black hole).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub icmp: OnOff,
    /// Per-connection drop rule: none, first-flight-last, first-flight-last-handshake,
    /// first-flight:N[,last][,last-handshake].
    #[arg(long, default_value = "none")]
    pub drop_rule: String,
    /// Protocol the drop rule applies to.
    #[arg(long, value_enum, default_value_t = ProtoArg::Any)]
    pub drop_proto: ProtoArg,
    /// Quiet time (ms) after which the server's first flight counts as ended
    /// (default: a quarter of the round trip, 1..50 ms).
    #[arg(long)]
    pub flight_gap_ms: Option<f64>,
}

fn ms_to_us(ms: f64) -> u64 {
    (ms * 1000.0).round() as u64
}

impl EmuArgs {
    /// Validates the flags and builds the emulator configuration. Pure.
    pub fn to_config(&self) -> Result<EmuConfig, LabError> {
        let bad = |m: String| Err(LabError::Config(m));
        if !(0.0..=10_000.0).contains(&self.rtt) {
            return bad(format!("--rtt {} ms is out of range 0..10000", self.rtt));
        }
        let link = |delay: Option<f64>, loss: Option<f64>, rate: Option<f64>, mtu: Option<u32>| {
            let delay_ms = delay.unwrap_or(self.rtt / 2.0);
            let loss = loss.unwrap_or(self.loss);
            let rate = rate.or(self.rate_mbit);
            let mtu = mtu.unwrap_or(self.mtu);
            if !(0.0..=5_000.0).contains(&delay_ms) {
                return Err(LabError::Config(format!(
                    "one-way delay {delay_ms} ms out of range"
                )));
            }
            if !(0.0..=1.0).contains(&loss) {
                return Err(LabError::Config(format!("loss {loss} must be within 0..1")));
            }
            if !(576..=topology::TUN_MTU).contains(&mtu) {
                return Err(LabError::Config(format!(
                    "MTU {mtu} must be within 576..={}",
                    topology::TUN_MTU
                )));
            }
            if let Some(r) = rate {
                if !(r > 0.0 && r <= 100_000.0) {
                    return Err(LabError::Config(format!("rate {r} Mbit/s out of range")));
                }
            }
            Ok(LinkConfig {
                delay_us: ms_to_us(delay_ms),
                loss,
                rate_kbit: rate.map(|r| (r * 1000.0).round() as u64),
                queue_bytes: self.queue_bytes,
                mtu,
                icmp: self.icmp == OnOff::On,
            })
        };
        let proto = match self.drop_proto {
            ProtoArg::Udp => RuleProto::Udp,
            ProtoArg::Tcp => RuleProto::Tcp,
            ProtoArg::Any => RuleProto::Any,
        };
        let c2s = link(
            self.delay_c2s,
            self.loss_c2s,
            self.rate_c2s_mbit,
            self.mtu_c2s,
        )?;
        let s2c = link(
            self.delay_s2c,
            self.loss_s2c,
            self.rate_s2c_mbit,
            self.mtu_s2c,
        )?;
        let gap_us = match self.flight_gap_ms {
            Some(g) if (0.1..=1000.0).contains(&g) => ms_to_us(g),
            Some(g) => return bad(format!("--flight-gap-ms {g} out of range 0.1..1000")),
            None => default_flight_gap_us(c2s.delay_us + s2c.delay_us),
        };
        let rule = FlightRule::parse(&self.drop_rule, proto, gap_us).map_err(LabError::Config)?;
        Ok(EmuConfig {
            c2s,
            s2c,
            seed: self.seed,
            rule,
        })
    }
}

#[derive(Subcommand, Debug)]
pub enum LabCommand {
    /// Create the namespaces and start the router (or reconfigure a running one).
    Up {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        emu: EmuArgs,
    },
    /// Stop the router, end processes left in the lab namespaces, delete the namespaces.
    Down {
        #[command(flatten)]
        common: Common,
    },
    /// The router itself (foreground, long-running); `lab up` starts it in the background.
    Router {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        emu: EmuArgs,
        /// Full emulator configuration as JSON (used by `lab up`; overrides the flags).
        #[arg(long, hide = true)]
        config_json: Option<String>,
    },
    /// Print the router's counters (and its configuration) as JSON.
    Counters {
        #[command(flatten)]
        common: Common,
        /// Zero the counters after reading them.
        #[arg(long)]
        reset: bool,
    },
    /// Bulk TCP transfer through the router (iperf-style), prints Mbit/s.
    Throughput(throughput::ThroughputArgs),
    /// The benchmark: HTTP/2 vs HTTP/3 servers through the emulated paths.
    Bench(bench::BenchArgs),
    /// One download per scenario with counter checks; for CI (< 2 minutes).
    Smoke(smoke::SmokeArgs),
}

pub fn run(command: LabCommand) -> Result<(), LabError> {
    match command {
        LabCommand::Up { common, emu } => {
            let names = LabNames::new(&common.prefix)?;
            let cfg = emu.to_config()?;
            let r = up(&names, &cfg)?;
            println!("{}", describe(&names, &cfg, r));
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
    }
}

/// Whether `lab up` started a router or reconfigured a running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpResult {
    Started(u32),
    Reconfigured(u32),
}

fn describe(names: &LabNames, cfg: &EmuConfig, r: UpResult) -> String {
    let what = match r {
        UpResult::Started(pid) => format!("router started (pid {pid})"),
        UpResult::Reconfigured(pid) => format!("router reconfigured (pid {pid})"),
    };
    format!(
        "{what}\n  client: ip netns exec {} ...   {} {}\n  server: ip netns exec {} ...   {} {}\n  config: {}\n  counters: h3-ingress-lab counters --prefix {}",
        names.client_ns,
        topology::CLIENT_V4,
        topology::CLIENT_V6,
        names.server_ns,
        topology::SERVER_V4,
        topology::SERVER_V6,
        serde_json::to_string(cfg).unwrap_or_default(),
        names.prefix
    )
}

fn pid_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks for existence and permission.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

fn read_pid(names: &LabNames) -> Option<i32> {
    std::fs::read_to_string(names.pid_file())
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Is a router answering on this lab's control socket?
pub fn router_pid(names: &LabNames) -> Option<u32> {
    control::request(&names.control_socket(), &Request::Ping)
        .ok()
        .map(|r| r.pid)
}

/// Starts the router in the background (or reconfigures the running one) and waits until
/// its control socket answers.
pub fn up(names: &LabNames, cfg: &EmuConfig) -> Result<UpResult, LabError> {
    netns::require_root("lab up")?;
    if let Some(pid) = router_pid(names) {
        set_config(names, cfg)?;
        return Ok(UpResult::Reconfigured(pid));
    }
    std::fs::create_dir_all(&names.state_dir)
        .map_err(|e| LabError::io(format!("create {}", names.state_dir.display()), e))?;
    let exe = std::env::current_exe().map_err(|e| LabError::io("current_exe", e))?;
    let log = std::fs::File::create(names.log_file())
        .map_err(|e| LabError::io("create router log", e))?;
    let log2 = log.try_clone().map_err(|e| LabError::io("router log", e))?;
    let json = serde_json::to_string(cfg).map_err(|e| LabError::Failed(e.to_string()))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["router", "--prefix", &names.prefix, "--config-json", &json])
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log2);
    // Own session: the router outlives `lab up` and ignores the terminal's signals.
    // SAFETY: setsid is async-signal-safe and runs in the child between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| LabError::io("spawn router", e))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = router_pid(names) {
            return Ok(UpResult::Started(pid));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(names.log_file()).unwrap_or_default();
            return Err(LabError::Failed(format!(
                "router exited with {status} during start:\n{log}"
            )));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(LabError::Failed("router did not answer within 10 s".into()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn set_config(names: &LabNames, cfg: &EmuConfig) -> Result<(), LabError> {
    control::request(
        &names.control_socket(),
        &Request::Set {
            config: cfg.clone(),
        },
    )?;
    Ok(())
}

/// Stops the router and deletes the namespaces; safe to call when parts are already gone.
pub fn down(names: &LabNames) -> Result<(), LabError> {
    netns::require_root("lab down")?;
    let pid = router_pid(names)
        .map(|p| p as i32)
        .or_else(|| read_pid(names));
    let _ = control::request(&names.control_socket(), &Request::Quit);
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(3);
        while pid_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if pid_alive(pid) {
            // SAFETY: signalling the router pid we started (read from its own pid file).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    // A bench killed before its cleanup leaves the work directory bind-mounted in a chroot.
    let suffix = format!("/mnt/{}", names.prefix);
    if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
        for mp in mounts.lines().filter_map(|l| l.split_whitespace().nth(1)) {
            if mp.ends_with(&suffix) {
                let _ = netns::run("umount", &["-l", mp]);
            }
        }
    }
    // Processes still inside the lab namespaces were started by lab users (bench, smoke).
    for ns in [&names.client_ns, &names.server_ns] {
        kill_ns_processes(ns);
        netns::delete_ns(ns)?;
    }
    let _ = std::fs::remove_dir_all(&names.state_dir);
    Ok(())
}

fn kill_ns_processes(ns: &str) {
    let pids = netns::ns_pids(ns);
    for &p in &pids {
        // SAFETY: signalling a pid that `ip netns pids` reported for our own namespace.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|&p| pid_alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in &pids {
        if pid_alive(p) {
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// Counters as the bench and `lab counters` see them: the router's plus the kernel's view of
/// the TUN devices (drops before the router could read).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    pub counters: emu::Counters,
    pub config: Option<EmuConfig>,
    pub uptime_ms: u64,
    pub queued: u64,
    pub tun_client_tx_dropped: u64,
    pub tun_server_tx_dropped: u64,
}

pub fn snapshot(names: &LabNames, reset: bool) -> Result<Snapshot, LabError> {
    let sock = names.control_socket();
    if !sock.exists() {
        return Err(LabError::NotUp(names.prefix.clone()));
    }
    let req = if reset {
        Request::Reset
    } else {
        Request::Counters
    };
    let r = control::request(&sock, &req)?;
    let config = match r.config {
        Some(c) => Some(c),
        None => control::request(&sock, &Request::Get)?.config,
    };
    Ok(Snapshot {
        counters: r.counters.unwrap_or_default(),
        config,
        uptime_ms: r.uptime_ms,
        queued: r.queued,
        tun_client_tx_dropped: tun_tx_dropped(&names.client_ns, &names.client_tun),
        tun_server_tx_dropped: tun_tx_dropped(&names.server_ns, &names.server_tun),
    })
}

/// TX drops of a lab TUN device as its namespace's kernel counts them (queue overflow).
fn tun_tx_dropped(ns: &str, dev: &str) -> u64 {
    let Ok(text) = netns::read_proc_net(ns, "dev") else {
        return 0;
    };
    parse_net_dev_tx_dropped(&text, dev).unwrap_or(0)
}

/// Field 12 (tx drop) of a `/proc/net/dev` line. Pure.
pub fn parse_net_dev_tx_dropped(text: &str, dev: &str) -> Option<u64> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{dev}:")))?;
    let (_, rest) = line.split_once(':')?;
    rest.split_whitespace().nth(11)?.parse().ok()
}

/// Where the bench and smoke keep their output: `target/lab/` of the current directory.
pub fn output_dir() -> PathBuf {
    PathBuf::from("target").join("lab")
}

/// The emulator settings of one bench/smoke step: symmetric delay, loss and MTU, an optional
/// first-flight rule (which datagram, for one protocol), an optional bottleneck. Pure.
pub fn path_config(
    rtt_ms: f64,
    loss: f64,
    mtu: u32,
    icmp: bool,
    rule: Option<(emu::Position, RuleProto)>,
    rate_mbit: Option<f64>,
    seed: u64,
) -> EmuConfig {
    let link = LinkConfig {
        delay_us: ms_to_us(rtt_ms / 2.0),
        loss,
        rate_kbit: rate_mbit.map(|r| (r * 1000.0).round() as u64),
        // A bottleneck queue of about 100 ms at the rate, at least 64 KB.
        queue_bytes: rate_mbit
            .map(|r| ((r * 1e6 / 8.0 * 0.1) as u64).max(65_536))
            .unwrap_or(1_000_000),
        mtu,
        icmp,
    };
    EmuConfig {
        c2s: link.clone(),
        s2c: link,
        seed,
        rule: rule.map(|(position, proto)| emu::FlightRule {
            positions: vec![position],
            proto,
            gap_us: default_flight_gap_us(ms_to_us(rtt_ms)),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        emu: EmuArgs,
    }

    fn cfg(args: &[&str]) -> Result<EmuConfig, LabError> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        T::parse_from(v).emu.to_config()
    }

    #[test]
    fn flags_build_per_direction_links() {
        let c = cfg(&[
            "--rtt",
            "200",
            "--loss",
            "0.01",
            "--mtu",
            "1280",
            "--icmp",
            "off",
            "--drop-rule",
            "first-flight-last",
            "--drop-proto",
            "udp",
            "--delay-c2s",
            "10",
            "--rate-mbit",
            "50",
        ])
        .unwrap();
        assert_eq!(c.s2c.delay_us, 100_000);
        assert_eq!(c.c2s.delay_us, 10_000);
        assert_eq!(c.c2s.loss, 0.01);
        assert_eq!(c.s2c.mtu, 1280);
        assert!(!c.s2c.icmp);
        assert_eq!(c.c2s.rate_kbit, Some(50_000));
        let r = c.rule.unwrap();
        assert_eq!(r.proto, RuleProto::Udp);
        assert_eq!(r.gap_us, 27_500, "a quarter of the 10 + 100 ms round trip");
    }

    #[test]
    fn rejects_out_of_range_settings() {
        assert!(cfg(&["--loss", "1.5"]).is_err());
        assert!(cfg(&["--mtu", "9000"]).is_err());
        assert!(cfg(&["--mtu-s2c", "500"]).is_err());
        assert!(cfg(&["--drop-rule", "sometimes"]).is_err());
        assert!(cfg(&["--rate-mbit", "0"]).is_err());
        assert!(cfg(&[]).unwrap().rule.is_none());
    }

    #[test]
    fn names_fit_interface_limits() {
        assert!(LabNames::new("h3lab").is_ok());
        assert!(LabNames::new("way-too-long-prefix").is_err());
        assert!(LabNames::new("Bad").is_err());
        assert_eq!(LabNames::new("abcdefghijkl").unwrap().client_tun.len(), 15);
    }

    #[test]
    fn parses_proc_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\nh3lab-ts: 123 4 0 0 0 0 0 0 999 9 0 17 0 0 0 0\n";
        assert_eq!(parse_net_dev_tx_dropped(text, "h3lab-ts"), Some(17));
        assert_eq!(parse_net_dev_tx_dropped(text, "lo"), Some(0));
        assert_eq!(parse_net_dev_tx_dropped(text, "eth0"), None);
    }
}
