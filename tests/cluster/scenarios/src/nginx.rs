//! The TCP ingress the data plane proxies to: Debian nginx in each node's network namespace on
//! TCP 443 (v4 and v6), serving the given hosts with their certificates (copied per node so a
//! rotation can replace them), advertising an Alt-Svc, refusing other names; `/whoami` says
//! which host and node answered, other paths are files under the run's `www/`. A run may add to
//! every server block (a throttled location) and to the `http` block (another server, e.g.
//! `stub_status` for an exporter).

use std::path::{Path, PathBuf};

use crate::cmd::netns;
use crate::error::IoContext;
use crate::pki::Leaf;
use crate::Result;

/// The nginx instances of a run, under `DIR/nginx-NODE/`.
pub struct Nginx {
    dir: PathBuf,
    alt_svc: String,
    /// Added to every server block (e.g. a throttled location).
    extra: String,
    /// Added to the `http` block (e.g. a plain-HTTP server with `stub_status`).
    http_extra: String,
}

/// What a run adds to nginx's configuration: `server` to every server block of a host,
/// `http` to the `http` block.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extra<'a> {
    pub server: &'a str,
    pub http: &'a str,
}

/// nginx's configuration for `node`, its files in `d`, serving `hosts` from `www`.
pub fn conf(
    node: &str,
    d: &Path,
    hosts: &[&str],
    alt_svc: &str,
    www: &Path,
    extra: Extra<'_>,
) -> String {
    let d = d.display();
    let mut c = format!(
        "user root;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\nhttp {{\n    access_log {d}/access.log;\n    \
         client_body_temp_path {d}/tmp/body;\n    proxy_temp_path {d}/tmp/proxy;\n    \
         fastcgi_temp_path {d}/tmp/fastcgi;\n    uwsgi_temp_path {d}/tmp/uwsgi;\n    \
         scgi_temp_path {d}/tmp/scgi;\n    default_type application/octet-stream;\n    \
         server {{\n        listen 443 ssl http2 default_server;\n        \
         listen [::]:443 ssl http2 default_server;\n        ssl_reject_handshake on;\n    }}\n    \
         {http}\n",
        http = extra.http
    );
    for h in hosts {
        c += &format!(
            "    server {{\n        listen 443 ssl http2;\n        listen [::]:443 ssl http2;\n        \
             server_name {h};\n        ssl_certificate {d}/{h}.crt;\n        \
             ssl_certificate_key {d}/{h}.key;\n        add_header Alt-Svc '{alt_svc}' always;\n        \
             root {www};\n        location = /whoami {{ default_type text/plain; return 200 \"{h} on {node}\\n\"; }}\n        \
             {server}\n    }}\n",
            www = www.display(),
            server = extra.server
        );
    }
    c + "}\n"
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .map(|_| ())
        .context(|| format!("copy {} to {}", from.display(), to.display()))
}

impl Nginx {
    /// Instances under `dir` (the run's scratch directory), advertising `alt_svc`.
    pub fn new(dir: &Path, alt_svc: &str, extra: &str) -> Nginx {
        Nginx {
            dir: dir.to_path_buf(),
            alt_svc: alt_svc.to_string(),
            extra: extra.to_string(),
            http_extra: String::new(),
        }
    }

    /// The same, with `http` added to nginx's `http` block.
    pub fn with_http(mut self, http: &str) -> Nginx {
        self.http_extra = http.to_string();
        self
    }

    /// The files served (`DIR/www`).
    pub fn www(&self) -> PathBuf {
        self.dir.join("www")
    }

    /// The directory of `node`'s instance (its `access.log` is there).
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.join(format!("nginx-{node}"))
    }

    /// Starts nginx in `node`'s namespace for `hosts` (each with its certificate).
    pub async fn start(&self, node: &str, hosts: &[(&str, &Leaf)]) -> Result<()> {
        let d = self.node_dir(node);
        std::fs::create_dir_all(d.join("tmp")).context(|| format!("mkdir {}", d.display()))?;
        std::fs::create_dir_all(self.www()).context(|| "mkdir www".into())?;
        for (host, leaf) in hosts {
            copy(&leaf.crt, &d.join(format!("{host}.crt")))?;
            copy(&leaf.key, &d.join(format!("{host}.key")))?;
        }
        let names: Vec<&str> = hosts.iter().map(|(h, _)| *h).collect();
        let extra = Extra {
            server: &self.extra,
            http: &self.http_extra,
        };
        let text = conf(node, &d, &names, &self.alt_svc, &self.www(), extra);
        let file = d.join("nginx.conf");
        std::fs::write(&file, text).context(|| format!("write {}", file.display()))?;
        let prefix = format!("{}/", d.display());
        let started = netns(
            node,
            "nginx",
            &["-p", &prefix, "-c", &file.to_string_lossy()],
        )
        .await;
        if let Err(e) = started {
            let log = std::fs::read_to_string(d.join("error.log")).unwrap_or_default();
            return crate::fail(format!("nginx did not start in {node}: {e} {log}"));
        }
        Ok(())
    }

    /// Points every node's nginx at another certificate for `host` and reloads it.
    pub async fn use_cert(&self, nodes: &[String], host: &str, leaf: &Leaf) -> Result<()> {
        for node in nodes {
            let d = self.node_dir(node);
            copy(&leaf.crt, &d.join(format!("{host}.crt")))?;
            copy(&leaf.key, &d.join(format!("{host}.key")))?;
            let prefix = format!("{}/", d.display());
            let conf = d.join("nginx.conf");
            netns(
                node,
                "nginx",
                &["-p", &prefix, "-c", &conf.to_string_lossy(), "-s", "reload"],
            )
            .await?;
        }
        Ok(())
    }

    /// Stops every instance of the run (SIGQUIT to each master); never fails.
    pub fn stop(&self) {
        let Ok(dirs) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for d in dirs.flatten() {
            if !d.file_name().to_string_lossy().starts_with("nginx-") {
                continue;
            }
            if let Ok(pid) = std::fs::read_to_string(d.path().join("nginx.pid")) {
                let _ = std::process::Command::new("kill")
                    .args(["-QUIT", pid.trim()])
                    .status();
            }
        }
    }
}

/// Stops the nginx masters in `node`'s namespace whose command line starts with `prefix`
/// (what a kept or interrupted run left); returns their pids.
pub fn stop_leftovers(node: &str, prefix: &str) -> Vec<u32> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "pids", node])
        .output()
    else {
        return Vec::new();
    };
    let mut stopped = Vec::new();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.starts_with(&format!("nginx: master process nginx -p {prefix}")) {
            let _ = std::process::Command::new("kill")
                .args(["-QUIT", pid])
                .status();
            stopped.extend(pid.parse::<u32>().ok());
        }
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_serves_each_host_and_refuses_others() {
        let c = conf(
            "n1",
            Path::new("/t/nginx-n1"),
            &["a.test"],
            "h3=\":443\"; ma=3600",
            Path::new("/t/www"),
            Extra {
                server: "location /slow/ { limit_rate 32k; }",
                http: "server { listen 127.0.0.1:8080; location = /stub_status { stub_status; } }",
            },
        );
        assert!(c.contains("ssl_reject_handshake on;"));
        assert!(c.contains("server_name a.test;"));
        assert!(c.contains("ssl_certificate /t/nginx-n1/a.test.crt;"));
        assert!(c.contains("add_header Alt-Svc 'h3=\":443\"; ma=3600' always;"));
        assert!(c.contains("return 200 \"a.test on n1\\n\";"));
        assert!(c.contains("location /slow/ { limit_rate 32k; }"));
        assert!(c.contains("location = /stub_status { stub_status; }"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }

    /// Debian nginx (scripts/setup.sh installs it) takes the configuration as written.
    #[test]
    fn debian_nginx_accepts_it() {
        let dir = std::env::temp_dir().join(format!("h3i-nginx-test-{}", std::process::id()));
        let pki = crate::Pki::new(&dir, "ca").unwrap();
        let leaf = pki.leaf("a.test", "a.test").unwrap();
        let d = dir.join("nginx-n1");
        std::fs::create_dir_all(d.join("tmp")).unwrap();
        std::fs::copy(&leaf.crt, d.join("a.test.crt")).unwrap();
        std::fs::copy(&leaf.key, d.join("a.test.key")).unwrap();
        let extra = Extra {
            server: "location /slow/ { limit_rate 32k; }",
            http: "server { listen 127.0.0.1:8080; location = /stub_status { stub_status; } }",
        };
        let c = conf(
            "n1",
            &d,
            &["a.test"],
            "h3=\":443\"",
            &dir.join("www"),
            extra,
        );
        std::fs::write(d.join("nginx.conf"), c).unwrap();
        let out = std::process::Command::new("nginx")
            .arg("-t")
            .arg("-p")
            .arg(&d)
            .arg("-c")
            .arg(d.join("nginx.conf"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
