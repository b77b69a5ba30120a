//! A lab's life: `up` starts the router in the background (or reconfigures it), `down`
//! stops it and deletes the namespaces, `snapshot` reads the counters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::control::{self, Request};
use crate::emu::{self, EmuConfig};
use crate::netns::{self, LabNames};
use crate::{topology, LabError};

/// Whether `lab up` started a router or reconfigured a running one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpResult {
    Started(u32),
    Reconfigured(u32),
}

pub(crate) fn describe(names: &LabNames, cfg: &EmuConfig, r: UpResult) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
