//! Network namespaces and the `ip` commands that wire the TUN devices into them.

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::LabError;

/// Names derived from one prefix, so several labs (bench, smoke) can coexist.
#[derive(Debug, Clone)]
pub struct LabNames {
    pub prefix: String,
    pub client_ns: String,
    pub server_ns: String,
    pub client_tun: String,
    pub server_tun: String,
    pub state_dir: PathBuf,
}

impl LabNames {
    pub fn new(prefix: &str) -> Result<Self, LabError> {
        // The TUN name `<prefix>-tc` must fit in IFNAMSIZ - 1 = 15 bytes.
        if prefix.is_empty()
            || prefix.len() > 12
            || !prefix
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(LabError::Config(format!(
                "prefix {prefix:?} must be 1-12 characters of a-z, 0-9 or -"
            )));
        }
        Ok(Self {
            prefix: prefix.to_string(),
            client_ns: format!("{prefix}-c"),
            server_ns: format!("{prefix}-s"),
            client_tun: format!("{prefix}-tc"),
            server_tun: format!("{prefix}-ts"),
            state_dir: PathBuf::from("/run").join(prefix),
        })
    }

    pub fn control_socket(&self) -> PathBuf {
        self.state_dir.join("router.sock")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.state_dir.join("router.pid")
    }
    pub fn log_file(&self) -> PathBuf {
        self.state_dir.join("router.log")
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn require_root(what: &str) -> Result<(), LabError> {
    if is_root() {
        Ok(())
    } else {
        Err(LabError::NotRoot(what.to_string()))
    }
}

/// Runs a command, returning stdout; a non-zero exit is an error carrying stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String, LabError> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::io(format!("running {cmd}"), e))?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: format!("{cmd} {}", args.join(" ")),
            status: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn ip(args: &[&str]) -> Result<String, LabError> {
    run("ip", args)
}

pub fn ns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

pub fn ensure_ns(name: &str) -> Result<(), LabError> {
    if !ns_exists(name) {
        ip(&["netns", "add", name])?;
    }
    ip(&["-n", name, "link", "set", "lo", "up"])?;
    Ok(())
}

pub fn delete_ns(name: &str) -> Result<(), LabError> {
    if ns_exists(name) {
        ip(&["netns", "del", name])?;
    }
    Ok(())
}

/// Pids of processes running in a namespace (what `ip netns pids` reports).
pub fn ns_pids(name: &str) -> Vec<i32> {
    if !ns_exists(name) {
        return Vec::new();
    }
    ip(&["netns", "pids", name])
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Moves a TUN device into `ns` and gives it the side's addresses and a default route.
pub fn wire_tun(
    dev: &str,
    ns: &str,
    v4: IpAddr,
    v4_prefix: u8,
    v6: IpAddr,
    v6_prefix: u8,
    mtu: u32,
) -> Result<(), LabError> {
    // A long transmit queue: the router drains it in batches, a 500-packet default would
    // drop bursts (counted by the kernel as TX drops, not by us) before we see them.
    ip(&["link", "set", "dev", dev, "txqueuelen", "10000"])?;
    ip(&["link", "set", "dev", dev, "netns", ns])?;
    let v4 = format!("{v4}/{v4_prefix}");
    let v6 = format!("{v6}/{v6_prefix}");
    let mtu = mtu.to_string();
    ip(&["-n", ns, "addr", "add", &v4, "dev", dev])?;
    // nodad: no duplicate address detection on a point-to-point link, usable at once.
    ip(&["-n", ns, "-6", "addr", "add", &v6, "dev", dev, "nodad"])?;
    ip(&["-n", ns, "link", "set", "dev", dev, "mtu", &mtu, "up"])?;
    ip(&["-n", ns, "route", "replace", "default", "dev", dev])?;
    ip(&["-n", ns, "-6", "route", "replace", "default", "dev", dev])?;
    Ok(())
}

/// Moves the calling thread into a named network namespace. Sockets it creates afterwards
/// live there; other threads of the process are unaffected.
pub fn enter(name: &str) -> Result<(), LabError> {
    let path = Path::new("/run/netns").join(name);
    let f = File::open(&path).map_err(|e| LabError::io(format!("open {}", path.display()), e))?;
    // SAFETY: setns on a namespace file descriptor we hold open.
    let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        return Err(LabError::io(
            format!("setns {name}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Runs `f` on a new thread inside namespace `ns`.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T, LabError> + Send + 'static,
) -> std::thread::JoinHandle<Result<T, LabError>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
}

/// Reads a file of /proc/net as seen from inside a namespace.
pub fn read_proc_net(ns: &str, file: &str) -> Result<String, LabError> {
    let path = format!("/proc/net/{file}");
    spawn_in(ns, move || {
        // /proc/self/net follows the calling thread's namespace only via /proc/thread-self.
        let p = path.replace("/proc/net/", "/proc/thread-self/net/");
        std::fs::read_to_string(&p).map_err(|e| LabError::io(format!("read {p}"), e))
    })
    .join()
    .map_err(|_| LabError::Control("namespace reader thread panicked".into()))?
}
