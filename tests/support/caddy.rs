//! `CaddyFixture`: Caddy 2.6 (quic-go) as an independent HTTP/3 server, reverse-proxying
//! to an HTTPS upstream. Used to prove our HTTP/3 test client against a server we did
//! not write, and as a reference point in comparisons.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::error::{read_to_string_lossy, write_file, HarnessError, IoContext, Result};
use super::net::{free_tcp_port, free_tcp_udp_port, udp_port_bound, Family};
use super::pki::TestPki;
use super::process::Daemon;

pub struct CaddyOptions<'a> {
    /// Certificates for the sites (each host in `hosts` must have a leaf).
    pub pki: &'a TestPki,
    pub hosts: Vec<String>,
    /// HTTPS upstream on 127.0.0.1; it must present a certificate for each host, signed
    /// by `upstream_ca`. The upstream sees the client's Host and SNI = host.
    pub upstream_port: u16,
    pub upstream_ca: PathBuf,
    pub start_timeout: Duration,
}

pub struct CaddyFixture {
    daemon: Daemon,
    dir: tempfile::TempDir,
    port: u16,
}

impl CaddyFixture {
    pub fn start(opts: CaddyOptions) -> Result<CaddyFixture> {
        let dir = tempfile::Builder::new()
            .prefix("h3i-caddy-")
            .tempdir()
            .ctx(|| "caddy temp dir".into())?;
        let port = free_tcp_udp_port();
        let http_port = free_tcp_port();
        write_file(
            &dir.path().join("Caddyfile"),
            render_caddyfile(dir.path(), port, http_port, &opts),
        )?;
        let log =
            std::fs::File::create(dir.path().join("caddy.stderr")).ctx(|| "caddy.stderr".into())?;
        let mut cmd = Command::new("caddy");
        cmd.args(["run", "--adapter", "caddyfile", "--config"])
            .arg(dir.path().join("Caddyfile"))
            // Caddy keeps certificates/OCSP state under XDG dirs; keep them per test.
            .env("HOME", dir.path())
            .env("XDG_DATA_HOME", dir.path().join("data"))
            .env("XDG_CONFIG_HOME", dir.path().join("config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let mut daemon = Daemon::spawn("caddy", cmd)?;
        let start = Instant::now();
        loop {
            if let Some(status) = daemon.exited() {
                return Err(HarnessError::Exited {
                    name: "caddy".into(),
                    status,
                    log: read_to_string_lossy(&dir.path().join("caddy.stderr")),
                });
            }
            let tcp = std::net::TcpStream::connect_timeout(
                &Family::V4.addr(port),
                Duration::from_millis(100),
            )
            .is_ok();
            // Caddy binds the wildcard address; the UDP listener shows in udp6 (dual
            // stack) or udp, depending on the host.
            let udp = udp_port_bound(Family::V6, port) || udp_port_bound(Family::V4, port);
            if tcp && udp {
                break;
            }
            if start.elapsed() > opts.start_timeout {
                return Err(HarnessError::NotReady {
                    name: "caddy".into(),
                    waited: start.elapsed(),
                    detail: format!(
                        "tcp={tcp} udp={udp}; log:\n{}",
                        read_to_string_lossy(&dir.path().join("caddy.stderr"))
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        Ok(CaddyFixture { daemon, dir, port })
    }

    /// The port Caddy serves HTTPS (TCP) and HTTP/3 (UDP) on.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    pub fn resolve(&self, host: &str, family: Family) -> String {
        format!("{host}:{}:{}", self.port, family.loopback_literal())
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log(&self) -> String {
        read_to_string_lossy(&self.dir.path().join("caddy.stderr"))
    }

    /// Caddy's JSON access log entries (one per request it handled).
    pub fn access_log_entries(&self) -> Vec<serde_json::Value> {
        read_to_string_lossy(&self.dir.path().join("access.log"))
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    pub fn stop(&mut self) {
        self.daemon.stop();
    }
}

fn render_caddyfile(dir: &Path, port: u16, http_port: u16, o: &CaddyOptions) -> String {
    let d = dir.display();
    let mut sites = String::new();
    for host in &o.hosts {
        let leaf = o.pki.leaf(host);
        sites.push_str(&format!(
            r#"https://{host}:{port} {{
	tls {cert} {key}
	log {{
		output file {d}/access.log
		format json
	}}
	reverse_proxy https://127.0.0.1:{up} {{
		transport http {{
			tls_trusted_ca_certs {ca}
			tls_server_name {host}
		}}
	}}
}}
"#,
            cert = leaf.cert_path.display(),
            key = leaf.key_path.display(),
            up = o.upstream_port,
            ca = o.upstream_ca.display(),
        ));
    }
    // admin off: no shared :2019 listener between parallel tests. auto_https off: the
    // certificates are given; no ACME, no :80 redirect listener.
    format!(
        r#"{{
	admin off
	auto_https off
	skip_install_trust
	http_port {http_port}
	https_port {port}
	storage file_system {d}/data
	servers {{
		protocols h1 h2 h3
	}}
}}

{sites}"#
    )
}
