//! Debian's Knot DNS as the user's authoritative server: one zone, one TSIG key allowed to
//! update it, listening on the host's bridge address (which the operator's pod reaches, as it
//! reaches the API server there); `kdig` reads the zone back over TCP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use h3i_scenarios::cmd::output;
use h3i_scenarios::{fail, Error, Result};

/// The server's TCP and UDP port on the host's address.
pub const PORT: u16 = 10053;

pub struct Knot {
    child: Option<Child>,
    ip: String,
    dir: PathBuf,
}

/// The server's configuration: `zone` updatable with `key` (HMAC-SHA256, base64 `secret`).
pub fn config(dir: &Path, ip: &str, zone: &str, key: &str, secret: &str) -> String {
    let d = dir.display();
    format!(
        "server:\n    rundir: \"{d}\"\n    listen: {ip}@{PORT}\n    udp-workers: 1\n    \
         tcp-workers: 1\n    background-workers: 1\n\
         database:\n    storage: \"{d}\"\n\
         key:\n  - id: {key}\n    algorithm: hmac-sha256\n    secret: {secret}\n\
         acl:\n  - id: update\n    key: {key}\n    action: update\n\
         zone:\n  - domain: {zone}\n    storage: \"{d}\"\n    file: \"{zone}.zone\"\n    \
         acl: update\n    zonefile-sync: -1\n"
    )
}

/// The zone as it starts: its SOA and NS, nothing for the hosts.
pub fn zone_file(zone: &str, ip: &str) -> String {
    format!(
        "$ORIGIN {zone}.\n$TTL 300\n@ SOA ns.{zone}. admin.{zone}. 1 3600 900 604800 60\n\
         @ NS ns\nns A {ip}\n"
    )
}

impl Knot {
    /// Starts `knotd` in `dir` and waits until it answers for the zone's SOA.
    pub async fn start(dir: &Path, ip: &str, zone: &str, key: &str, secret: &str) -> Result<Knot> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            context: format!("mkdir {}", dir.display()),
            source,
        })?;
        let write = |name: &str, text: String| {
            std::fs::write(dir.join(name), text).map_err(|source| Error::Io {
                context: format!("write {name}"),
                source,
            })
        };
        write("knot.conf", config(dir, ip, zone, key, secret))?;
        write(&format!("{zone}.zone"), zone_file(zone, ip))?;
        let log = std::fs::File::create(dir.join("knotd.log")).map_err(|source| Error::Io {
            context: "knotd.log".into(),
            source,
        })?;
        let child = Command::new("knotd")
            .arg("-c")
            .arg(dir.join("knot.conf"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|source| Error::Io {
                context: "spawn knotd (knot: scripts/setup.sh installs it)".into(),
                source,
            })?;
        let k = Knot {
            child: Some(child),
            ip: ip.to_string(),
            dir: dir.to_path_buf(),
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if !k.query(zone, "SOA").await?.is_empty() {
                return Ok(k);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fail(format!(
            "knotd does not serve {zone} on {ip}@{PORT} after 10 s: {}",
            k.log()
        ))
    }

    /// `kdig +short +tcp NAME TYPE`: one line per record.
    pub async fn query(&self, name: &str, rtype: &str) -> Result<Vec<String>> {
        let at = format!("@{}", self.ip);
        let port = PORT.to_string();
        let args = [
            at.as_str(),
            "-p",
            port.as_str(),
            "+short",
            "+tcp",
            name,
            rtype,
        ];
        let out = output("kdig", &args).await?;
        Ok(out
            .stdout
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(String::from)
            .collect())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("knotd.log")).unwrap_or_default()
    }

    pub fn address(&self) -> String {
        format!("{}:{PORT}", self.ip)
    }

    /// Leaves knotd running after this handle goes (a kept run).
    pub fn keep_running(mut self) {
        self.child.take();
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Kills a previous run's `knotd` (its configuration under `/tmp/PREFIX`): the port is fixed.
pub async fn stop_leftovers(prefix: &str) {
    let pattern = format!("knotd -c /tmp/{prefix}");
    let _ = output("pkill", &["-f", &pattern]).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_names_the_key_and_lets_it_update_the_zone() {
        let c = config(Path::new("/tmp/x"), "10.0.0.1", "z.test", "k1", "c2VjcmV0");
        assert!(c.contains("listen: 10.0.0.1@10053"));
        assert!(c.contains("  - id: k1\n    algorithm: hmac-sha256\n    secret: c2VjcmV0"));
        assert!(c.contains("key: k1\n    action: update"));
        assert!(c.contains("  - domain: z.test\n"));
        let z = zone_file("z.test", "10.0.0.1");
        assert!(z.contains("@ SOA ns.z.test. admin.z.test. 1"));
        assert!(z.ends_with("ns A 10.0.0.1\n"));
    }
}
