//! What the bench's header says about the run's conditions: machine, versions, client, rate
//! limits, the kernel's TCP congestion control. Facts are read, never assumed; a missing one
//! shows as the command's error or "?".

use std::collections::BTreeMap;
use std::path::Path;

use super::{BenchArgs, ClientArg};
use crate::netns;
use crate::session::Session;
use crate::LabError;

/// Key-value facts of one run, as `BenchReport::env` stores them.
pub type Env = BTreeMap<String, String>;

/// The first line a command prints (stdout, else stderr), or why it could not run.
pub fn first_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            let t = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&t)
                .lines()
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        })
        .unwrap_or_else(|e| format!("{cmd}: {e}"))
}

/// The 1, 5 and 15 minute load averages: other work on this shared machine shows up here.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The machine, the servers' versions, the client and the rate limits. `env` already holds
/// `chroot_curl` when the trixie chroot was found.
pub fn describe_run(env: &mut Env, a: &BenchArgs, proxy_bin: Option<&Path>) {
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("kernel", first_line("uname", &["-r"]));
    set("loadavg_start", loadavg());
    set(
        "cpus",
        std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .unwrap_or_default(),
    );
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    set("profile", profile.into());
    set(
        "commit",
        first_line("git", &["rev-parse", "--short", "HEAD"]),
    );
    set(
        "proxy_bin",
        proxy_bin.map_or("not used".into(), |p| p.display().to_string()),
    );
    set(
        "rmem_max",
        std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap_or_default()
            .trim()
            .to_string(),
    );
    set("nginx", first_line("nginx", &["-v"]));
    set(
        "tcp_pacing",
        match a.tcp_pacing {
            true => "paced by the kernel (SO_MAX_PACING_RATE on accepted sockets)",
            false => "not paced (the lab installs no fq qdisc, so the kernel paces only BBR)",
        }
        .into(),
    );
    set(
        "caddy",
        format!(
            "Caddy {} (reverse proxy to the ingress)",
            first_line("caddy", &["version"])
        ),
    );
    set("rate", rate_note(a));
    let client = match a.client {
        ClientArg::Curl => format!(
            "{} (trixie chroot)",
            env.get("chroot_curl").cloned().unwrap_or_default()
        ),
        // The h2 rows keep curl: the chroot's when there is one (as the runner does).
        ClientArg::Aioquic => format!(
            "aioquic {} via lab/scripts/h3get.py (h3) + {} (h2)",
            first_line(
                "python3",
                &["-c", "import aioquic; print(aioquic.__version__)"]
            ),
            env.get("chroot_curl")
                .map(|c| format!("{c} (trixie chroot)"))
                .unwrap_or_else(|| first_line("curl", &["--version"]))
        ),
    };
    env.insert("client".into(), client);
}

fn rate_note(a: &BenchArgs) -> String {
    let mbit = |r: Option<f64>| r.map_or("none".to_string(), |r| format!("{r} Mbit/s"));
    format!(
        "rate limit (both directions, drop-tail queue of 100 ms at the rate): {} outside S4; in S4 {} (the curl h3 client cannot receive much above 150 Mbit/s on this machine), except the upload case marked 'no rate limit', which runs at the client's full speed so the server's UDP socket buffer is what is tested",
        mbit(a.rate_mbit),
        mbit(a.s4_rate().or(a.rate_mbit))
    )
}

/// Sets the kernel's TCP congestion control for the h2 rows in both lab namespaces, if asked,
/// and returns the one in effect. The h2 rows are only as good as it: BBR shrugs off random
/// loss that any loss-based controller (ours included) must answer, so the header names it.
pub fn tcp_congestion_control(s: &Session, wanted: Option<&str>) -> Result<String, LabError> {
    if let Some(cc) = wanted {
        // Namespaces may only pick controllers on the host's allowed list; widen it (that is
        // all it does: no existing socket changes), then set it on both sides.
        let allowed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
            .map_err(|e| LabError::io("read tcp_allowed_congestion_control", e))?;
        if !allowed.split_whitespace().any(|x| x == cc) {
            let set = format!(
                "net.ipv4.tcp_allowed_congestion_control={} {cc}",
                allowed.trim()
            );
            netns::run("sysctl", &["-q", "-w", &set])?;
        }
        let set = format!("net.ipv4.tcp_congestion_control={cc}");
        for ns in [&s.names.server_ns, &s.names.client_ns] {
            netns::run("ip", &["netns", "exec", ns, "sysctl", "-q", "-w", &set])?;
        }
    }
    let ns = &s.names.server_ns;
    let path = "/proc/sys/net/ipv4/tcp_congestion_control";
    Ok(netns::run("ip", &["netns", "exec", ns, "cat", path])?
        .trim()
        .to_string())
}
