//! The h3-ingress binary under test, run as a real process from a YAML file, the way users
//! run it standalone.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{HarnessError, IoContext, Result};
use super::net::free_tcp_port;
use super::process::Daemon;

/// The binary under test: this build's, or `H3I_PROXY_BINARY` (another build, e.g. the
/// previous commit's, to show that a test fails without a fix).
pub fn binary() -> PathBuf {
    std::env::var_os("H3I_PROXY_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_h3-ingress")))
}

pub struct ProxyProcess {
    daemon: Daemon,
    /// Shared by the processes started again on the same configuration.
    dir: std::sync::Arc<tempfile::TempDir>,
    /// `proxy.log`, then `proxy-2.log`, ... for processes started again.
    log_name: String,
    /// The process's own `--probe-socket`.
    pub probe_socket: PathBuf,
    pub port: u16,
    pub admin: SocketAddr,
}

/// A plain HTTP/1.0 GET against the admin endpoint: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

impl ProxyProcess {
    /// Starts `h3-ingress proxy --config` with `config` (a JSON value, which is valid YAML);
    /// `metrics.address` is filled in with a free loopback port. Waits for `/readyz`. Logs
    /// with `RUST_LOG` from `H3I_PROXY_LOG`, by default `info,h3_ingress=debug`.
    pub fn start(config: serde_json::Value) -> Result<ProxyProcess> {
        let log = std::env::var("H3I_PROXY_LOG").unwrap_or_else(|_| "info,h3_ingress=debug".into());
        Self::start_logging(config, Some(log))
    }

    /// Like [`ProxyProcess::start`], without `RUST_LOG`: the binary's own default log filter,
    /// as users run it.
    pub fn start_with_default_log(config: serde_json::Value) -> Result<ProxyProcess> {
        Self::start_logging(config, None)
    }

    fn start_logging(config: serde_json::Value, rust_log: Option<String>) -> Result<ProxyProcess> {
        let mut p = Self::launch(config, rust_log, None)?;
        p.wait_ready(Duration::from_secs(20))?;
        Ok(p)
    }

    /// Like [`ProxyProcess::start`], started under `prlimit --nofile=SOFT:HARD` (as a
    /// container runtime starts it with its own limits).
    pub fn start_limited(config: serde_json::Value, soft: u64, hard: u64) -> Result<ProxyProcess> {
        let log = std::env::var("H3I_PROXY_LOG").unwrap_or_else(|_| "info,h3_ingress=debug".into());
        let mut p = Self::launch(config, Some(log), Some((soft, hard)))?;
        p.wait_ready(Duration::from_secs(20))?;
        Ok(p)
    }

    /// Starts the proxy like [`ProxyProcess::start`] without waiting for it to be ready.
    pub fn start_unready(config: serde_json::Value) -> Result<ProxyProcess> {
        let log = std::env::var("H3I_PROXY_LOG").unwrap_or_else(|_| "info,h3_ingress=debug".into());
        Self::launch(config, Some(log), None)
    }

    fn launch(
        mut config: serde_json::Value,
        rust_log: Option<String>,
        nofile: Option<(u64, u64)>,
    ) -> Result<ProxyProcess> {
        let dir = tempfile::Builder::new()
            .prefix("h3i-proxy-")
            .tempdir()
            .ctx(|| "creating the proxy directory".to_string())?;
        let admin: SocketAddr = format!("127.0.0.1:{}", free_tcp_port())
            .parse()
            .expect("literal address");
        config["metrics"] = serde_json::json!({ "address": admin.to_string() });
        let port = config["port"].as_u64().unwrap_or(443) as u16;
        let path = dir.path().join("h3-ingress.yaml");
        std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap())
            .ctx(|| format!("writing {}", path.display()))?;
        let dir = std::sync::Arc::new(dir);
        let names = ("proxy.log", "probe.sock");
        Self::spawn(dir, names, port, admin, rust_log, nofile)
    }

    fn spawn(
        dir: std::sync::Arc<tempfile::TempDir>,
        (log_name, probe): (&str, &str),
        port: u16,
        admin: SocketAddr,
        rust_log: Option<String>,
        nofile: Option<(u64, u64)>,
    ) -> Result<ProxyProcess> {
        let log = std::fs::File::create(dir.path().join(log_name))
            .ctx(|| format!("creating {log_name}"))?;
        let probe_socket = dir.path().join(probe);
        // prlimit sets the limits and execs the binary: same process, same pid.
        let mut cmd = match nofile {
            Some((soft, hard)) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={soft}:{hard}")).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.arg("proxy")
            .arg("--config")
            .arg(dir.path().join("h3-ingress.yaml"))
            .arg("--probe-socket")
            .arg(&probe_socket);
        match rust_log {
            Some(filter) => cmd.env("RUST_LOG", filter),
            None => cmd.env_remove("RUST_LOG"),
        };
        cmd.stdin(Stdio::null())
            .stdout(log.try_clone().ctx(|| "log handle".to_string())?)
            .stderr(log);
        let daemon = Daemon::spawn("h3-ingress", cmd)?;
        Ok(ProxyProcess {
            daemon,
            dir,
            log_name: log_name.to_string(),
            probe_socket,
            port,
            admin,
        })
    }

    /// Starts another `h3-ingress proxy` on this one's configuration file (a restart of the
    /// standalone proxy: `n` numbers its log and probe socket) and waits until it says it is
    /// ready on its own probe socket.
    pub fn start_again(&self, n: u32) -> Result<ProxyProcess> {
        let log = std::env::var("H3I_PROXY_LOG").unwrap_or_else(|_| "info,h3_ingress=debug".into());
        let (log_name, probe) = (format!("proxy-{n}.log"), format!("probe-{n}.sock"));
        let mut p = Self::spawn(
            self.dir.clone(),
            (&log_name, &probe),
            self.port,
            self.admin,
            Some(log),
            None,
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !p.probe("ready") {
            if let Some(status) = p.daemon.exited() {
                return Err(HarnessError::Invalid(format!(
                    "h3-ingress (again) exited with {status}:\n{}",
                    p.log()
                )));
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Invalid(format!(
                    "h3-ingress (again) not ready after 20 s:\n{}",
                    p.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(p)
    }

    /// `h3-ingress probe CHECK` against this process: true when it answers ok.
    pub fn probe(&self, check: &str) -> bool {
        self.probe_output(check).0
    }

    /// `h3-ingress probe CHECK`: whether it answered ok, and what it printed.
    pub fn probe_output(&self, check: &str) -> (bool, String) {
        match Command::new(binary())
            .args(["probe", check, "--socket"])
            .arg(&self.probe_socket)
            .output()
        {
            Ok(o) => (
                o.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                ),
            ),
            Err(e) => (false, e.to_string()),
        }
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.daemon.exited() {
                return Err(HarnessError::Invalid(format!(
                    "h3-ingress exited with {status} before it was ready:\n{}",
                    self.log()
                )));
            }
            if let Ok((200, _)) = http_get(self.admin, "/readyz") {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Invalid(format!(
                    "h3-ingress not ready after {timeout:?}:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    pub fn signal(&self, sig: libc::c_int) {
        self.daemon.signal(sig);
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(&self.log_name)).unwrap_or_default()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("h3-ingress.yaml")
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Rewrites the configuration file (keeping the admin address) for a SIGHUP reload.
    pub fn rewrite_config(&self, mut config: serde_json::Value) {
        config["metrics"] = serde_json::json!({ "address": self.admin.to_string() });
        std::fs::write(
            self.config_path(),
            serde_json::to_string_pretty(&config).unwrap(),
        )
        .expect("rewrite config");
    }

    pub fn metrics(&self) -> String {
        http_get(self.admin, "/metrics").expect("scrape /metrics").1
    }

    pub fn status(&self) -> serde_json::Value {
        let body = http_get(self.admin, "/status").expect("GET /status").1;
        serde_json::from_str(&body).expect("status is JSON")
    }

    /// `/hosts`: one entry per host.
    pub fn hosts(&self) -> serde_json::Value {
        let body = http_get(self.admin, "/hosts").expect("GET /hosts").1;
        serde_json::from_str(&body).expect("/hosts is JSON")
    }

    /// Waits for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(s) = self.daemon.exited() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn still_running(&mut self) -> bool {
        self.daemon.exited().is_none()
    }
}

/// The value of one sample in a text exposition, e.g.
/// `sample(&text, "h3_ingress_requests_total", &[("host", "a.test")])`; labels not given
/// are not checked, and matching samples are summed.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let ok = labels
                .iter()
                .all(|(k, v)| rest.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
            ok.then(|| value.parse::<f64>().ok())?
        })
        .sum()
}
