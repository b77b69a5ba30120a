//! Debian's Knot DNS as an authoritative server taking RFC 2136 updates signed with TSIG:
//! the DNS server a user names in `spec.advertise.dns`. One zone, one key, a free port on
//! 127.0.0.1; `kdig` (knot-dnsutils) reads the zone back.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::error::{HarnessError, IoContext, Result};
use super::net::free_tcp_port;
use super::process::Daemon;

pub struct KnotFixture {
    pub port: u16,
    pub zone: String,
    pub key_name: String,
    /// The key's secret as the server's configuration holds it (base64).
    pub secret_b64: String,
    dir: tempfile::TempDir,
    daemon: Daemon,
}

/// `records`: zone-file lines added after the SOA and NS (relative names are in the zone).
pub struct KnotOptions<'a> {
    pub zone: &'a str,
    pub records: &'a [&'a str],
    pub key_name: &'a str,
    /// base64 of a 32-byte secret.
    pub secret_b64: &'a str,
}

impl KnotFixture {
    pub fn start(o: KnotOptions<'_>) -> Result<KnotFixture> {
        let dir = tempfile::tempdir().ctx(|| "knot temp dir".to_string())?;
        let port = free_tcp_port();
        let d = dir.path().display();
        let conf = format!(
            "server:\n    rundir: \"{d}\"\n    listen: 127.0.0.1@{port}\n    udp-workers: 1\n    \
             tcp-workers: 1\n    background-workers: 1\n\
             database:\n    storage: \"{d}\"\n\
             key:\n  - id: {key}\n    algorithm: hmac-sha256\n    secret: {secret}\n\
             acl:\n  - id: update\n    key: {key}\n    action: update\n\
             zone:\n  - domain: {zone}\n    storage: \"{d}\"\n    file: \"{zone}.zone\"\n    \
             acl: update\n    zonefile-sync: -1\n",
            key = o.key_name,
            secret = o.secret_b64,
            zone = o.zone,
        );
        let mut zonefile = format!(
            "$ORIGIN {z}.\n$TTL 300\n@ SOA ns.{z}. admin.{z}. 1 3600 900 604800 60\n@ NS ns\nns A 127.0.0.1\n",
            z = o.zone
        );
        for r in o.records {
            zonefile.push_str(r);
            zonefile.push('\n');
        }
        let write = |name: &str, text: &str| {
            let p: PathBuf = dir.path().join(name);
            std::fs::write(&p, text).ctx(|| format!("writing {}", p.display()))
        };
        write("knot.conf", &conf)?;
        write(&format!("{}.zone", o.zone), &zonefile)?;
        let mut cmd = Command::new("knotd");
        cmd.arg("-c").arg(dir.path().join("knot.conf"));
        cmd.stdout(std::process::Stdio::null());
        cmd.stderr(std::fs::File::create(dir.path().join("knotd.log")).ctx(|| "log".into())?);
        let daemon = Daemon::spawn("knotd", cmd)?;
        let k = KnotFixture {
            port,
            zone: o.zone.to_string(),
            key_name: o.key_name.to_string(),
            secret_b64: o.secret_b64.to_string(),
            dir,
            daemon,
        };
        k.wait_ready()?;
        Ok(k)
    }

    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self
                .query(&self.zone, "SOA")
                .map(|a| !a.is_empty())
                .unwrap_or(false)
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(HarnessError::NotReady {
            name: "knotd".into(),
            waited: Duration::from_secs(10),
            detail: format!("zone {} not served; log: {}", self.zone, self.log()),
        })
    }

    /// The answer's records for `name TYPE`, one per line as `kdig +short` prints them.
    pub fn query(&self, name: &str, rtype: &str) -> Result<Vec<String>> {
        let out = Command::new("kdig")
            .args([
                "@127.0.0.1",
                "-p",
                &self.port.to_string(),
                "+short",
                "+tcp",
                name,
                rtype,
            ])
            .output()
            .ctx(|| "running kdig".into())?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("knotd.log")).unwrap_or_default()
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}
