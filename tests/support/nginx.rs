//! `NginxFixture`: Debian's nginx as the TCP ingress the proxy forwards to.
//!
//! One private nginx per fixture: its own prefix directory, config, logs, temp paths and
//! document roots, run in the foreground as our child, so tests never depend on or
//! disturb a system nginx. TLS + HTTP/2 on 127.0.0.1 and [::1] on one port, one
//! `server` per virtual host with its own certificate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::{read_to_string_lossy, write_file, HarnessError, IoContext, Result};
use super::net::{free_tcp_port, Family};
use super::pki::{TestPki, DEFAULT_HOSTS};
use super::process::Daemon;
use super::sha256_hex;

/// Environment variable naming the nginx binary (default `nginx` from PATH).
pub const NGINX_BIN_ENV: &str = "H3I_NGINX";
/// Set to keep fixture directories (config, logs, uploads) after the test for debugging.
pub const KEEP_ENV: &str = "H3I_KEEP_FIXTURES";

/// Static files every virtual host serves: (URL path, size). Content is pseudo-random
/// but the same on every run, so digests can be compared across processes and runs.
pub const CONTENT_FILES: [(&str, usize); 2] = [("/1m.bin", 1 << 20), ("/5m.bin", 5 << 20)];

/// What `/echo-headers` reports, one `name: value` line each, in this order. The values
/// are nginx variables: what nginx saw after the proxy, which is the point.
pub const ECHO_FIELDS: [(&str, &str); 22] = [
    ("host", "$host"),
    ("http-host", "$http_host"),
    ("x-forwarded-for", "$http_x_forwarded_for"),
    ("x-forwarded-proto", "$http_x_forwarded_proto"),
    ("x-forwarded-host", "$http_x_forwarded_host"),
    ("x-real-ip", "$http_x_real_ip"),
    ("forwarded", "$http_forwarded"),
    ("via", "$http_via"),
    ("cookie", "$http_cookie"),
    ("user-agent", "$http_user_agent"),
    ("content-length", "$http_content_length"),
    ("transfer-encoding", "$http_transfer_encoding"),
    ("te", "$http_te"),
    ("connection", "$http_connection"),
    ("alt-used", "$http_alt_used"),
    ("early-data", "$http_early_data"),
    ("method", "$request_method"),
    ("request-uri", "$request_uri"),
    ("server-name", "$server_name"),
    ("ssl-server-name", "$ssl_server_name"),
    ("server-protocol", "$server_protocol"),
    ("remote-addr", "$remote_addr"),
];

/// Parses an `/echo-headers` body into field → value (absent headers are "").
pub fn parse_echo(body: &str) -> BTreeMap<String, String> {
    body.lines()
        .filter_map(|l| {
            l.split_once(": ")
                .or_else(|| l.strip_suffix(':').map(|k| (k, "")))
        })
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[derive(Clone)]
pub struct NginxOptions {
    /// Virtual hosts, one `server` block each; the first is the default server unless
    /// `reject_unknown_sni` is set.
    pub hosts: Vec<String>,
    /// Certificates to use; by default a fresh [`TestPki`] for `hosts`. Pass the same
    /// PKI to the proxy so both present the same certificates, as in production.
    pub pki: Option<Arc<TestPki>>,
    /// `add_header Alt-Svc <value> always;` in every server when set.
    pub alt_svc: Option<String>,
    /// Also listen on [::1] (same port). On by default: the proxy must reach both.
    pub ipv6: bool,
    /// Add a default server that refuses TLS handshakes with an SNI naming none of the
    /// hosts (`ssl_reject_handshake on`), like an ingress with no catch-all.
    pub reject_unknown_sni: bool,
    pub error_log_level: String,
    /// Raw directives appended inside `http { }` and inside every `server { }`.
    pub extra_http: String,
    pub extra_server: String,
    pub start_timeout: Duration,
}

impl Default for NginxOptions {
    fn default() -> Self {
        NginxOptions {
            hosts: DEFAULT_HOSTS.iter().map(|s| s.to_string()).collect(),
            pki: None,
            alt_svc: None,
            ipv6: true,
            reject_unknown_sni: false,
            error_log_level: "info".into(),
            extra_http: String::new(),
            extra_server: String::new(),
            start_timeout: Duration::from_secs(15),
        }
    }
}

/// A running nginx. Stopped (SIGTERM, then SIGKILL) and its directory removed on drop.
pub struct NginxFixture {
    // Field order matters: the daemon must stop before its directory is deleted.
    daemon: Daemon,
    dir: tempfile::TempDir,
    pki: Arc<TestPki>,
    port: u16,
    hosts: Vec<String>,
    ipv6: bool,
    version: (u32, u32, u32),
    content_sha256: BTreeMap<String, String>,
}

/// Start-up attempts: another process may take the free port between our probe and
/// nginx's bind; a new port fixes that.
const START_ATTEMPTS: usize = 4;

impl NginxFixture {
    /// Generates content and config, starts nginx and waits until it accepts
    /// connections on every listen address.
    pub fn start(opts: NginxOptions) -> Result<NginxFixture> {
        let bin = nginx_bin();
        let version = nginx_version(&bin)?;
        let pki = match &opts.pki {
            Some(p) => p.clone(),
            None => {
                let names: Vec<&str> = opts.hosts.iter().map(String::as_str).collect();
                Arc::new(TestPki::generate_for(&names)?)
            }
        };
        let mut dir = tempfile::Builder::new()
            .prefix("h3i-nginx-")
            .tempdir()
            .ctx(|| "creating nginx temp dir".into())?;
        if std::env::var_os(KEEP_ENV).is_some() {
            dir.disable_cleanup(true);
            super::loud(&format!("nginx fixture kept in {}", dir.path().display()));
        }
        let content_sha256 = write_content(dir.path(), &opts.hosts)?;
        for sub in ["tmp", "logs"] {
            std::fs::create_dir_all(dir.path().join(sub)).ctx(|| format!("mkdir {sub}"))?;
        }

        let families = if opts.ipv6 {
            vec![Family::V4, Family::V6]
        } else {
            vec![Family::V4]
        };
        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_tcp_port();
            let conf = render_config(&ConfigInputs {
                dir: dir.path(),
                port,
                opts: &opts,
                pki: &pki,
                version,
                run_as_root: super::is_root(),
            });
            write_file(&dir.path().join("nginx.conf"), conf)?;
            let _ = std::fs::remove_file(dir.path().join("logs/error.log"));
            let mut daemon = spawn_nginx(&bin, dir.path())?;
            match wait_listening(&mut daemon, dir.path(), port, &families, opts.start_timeout) {
                Ok(()) => {
                    return Ok(NginxFixture {
                        daemon,
                        dir,
                        pki,
                        port,
                        hosts: opts.hosts.clone(),
                        ipv6: opts.ipv6,
                        version,
                        content_sha256,
                    })
                }
                Err(e) => {
                    daemon.stop();
                    if !startup_log(dir.path()).contains("Address already in use") {
                        return Err(e);
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| HarnessError::Invalid("nginx did not start".into())))
    }

    /// Waits until nginx accepts TCP connections on every listen address, or fails with
    /// its log if it exited.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let families = self.families();
        wait_listening(
            &mut self.daemon,
            self.dir.path(),
            self.port,
            &families,
            timeout,
        )
    }

    pub fn families(&self) -> Vec<Family> {
        if self.ipv6 {
            vec![Family::V4, Family::V6]
        } else {
            vec![Family::V4]
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self, family: Family) -> std::net::SocketAddr {
        family.addr(self.port)
    }

    /// `https://<host>:<port><path>`; pair it with [`Self::curl_resolve`].
    pub fn url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.port)
    }

    /// The `--resolve` argument pointing `host` at this nginx over `family`.
    pub fn curl_resolve(&self, host: &str, family: Family) -> String {
        format!("{host}:{}:{}", self.port, family.loopback_literal())
    }

    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    pub fn pki(&self) -> &Arc<TestPki> {
        &self.pki
    }

    pub fn cert_path(&self, host: &str) -> &Path {
        &self.pki.leaf(host).cert_path
    }

    pub fn key_path(&self, host: &str) -> &Path {
        &self.pki.leaf(host).key_path
    }

    /// The CA that signed every host's certificate (for `--cacert`).
    pub fn ca_path(&self) -> &Path {
        &self.pki.ca_cert_path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Document root of `host`.
    pub fn docroot(&self, host: &str) -> PathBuf {
        self.dir.path().join("html").join(host)
    }

    /// Where a `PUT /upload/<name>` to `host` lands on disk.
    pub fn uploaded_path(&self, host: &str, name: &str) -> PathBuf {
        self.docroot(host).join("upload").join(name)
    }

    /// Hex SHA-256 of a static file, e.g. `content_sha256("/1m.bin")`.
    pub fn content_sha256(&self, path: &str) -> &str {
        self.content_sha256
            .get(path)
            .unwrap_or_else(|| panic!("no static content {path:?}"))
    }

    pub fn content_len(path: &str) -> usize {
        CONTENT_FILES
            .iter()
            .find(|(p, _)| *p == path)
            .unwrap_or_else(|| panic!("no static content {path:?}"))
            .1
    }

    pub fn version(&self) -> (u32, u32, u32) {
        self.version
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }

    pub fn access_log_path(&self) -> PathBuf {
        self.dir.path().join("logs/access.log")
    }

    pub fn error_log_path(&self) -> PathBuf {
        self.dir.path().join("logs/error.log")
    }

    pub fn error_log(&self) -> String {
        read_to_string_lossy(&self.error_log_path())
    }

    /// Every access-log line parsed as JSON (see the `log_format` in the config for the
    /// fields). Panics on a line that is not JSON: that is a fixture bug.
    pub fn access_log_entries(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.access_log_path()).unwrap_or_default();
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("access log line is not JSON ({e}): {l}"))
            })
            .collect()
    }

    /// nginx writes the access log after the response has gone out, so a client can see
    /// its answer before the line exists; this polls until `pred` holds.
    pub fn wait_for_access_log(
        &self,
        timeout: Duration,
        pred: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let start = Instant::now();
        loop {
            let entries = self.access_log_entries();
            if pred(&entries) {
                return entries;
            }
            if start.elapsed() > timeout {
                panic!(
                    "access log condition not met after {timeout:?}; entries:\n{}",
                    entries
                        .iter()
                        .map(|e| e.to_string())
                        .collect::<Vec<_>>()
                        .join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Reloads the configuration (SIGHUP), e.g. after editing files in [`Self::dir`].
    pub fn reload(&self) {
        self.daemon.signal(libc::SIGHUP);
    }

    /// Stops nginx now (also done on drop). Lets a test turn a working upstream into
    /// a dead one mid-test.
    pub fn stop(&mut self) {
        self.daemon.stop();
    }
}

fn startup_log(dir: &Path) -> String {
    format!(
        "{}{}",
        read_to_string_lossy(&dir.join("logs/error.log")),
        read_to_string_lossy(&dir.join("logs/stderr.log"))
    )
}

fn wait_listening(
    daemon: &mut Daemon,
    dir: &Path,
    port: u16,
    families: &[Family],
    timeout: Duration,
) -> Result<()> {
    let start = Instant::now();
    let mut pending: Vec<Family> = families.to_vec();
    loop {
        if let Some(status) = daemon.exited() {
            return Err(HarnessError::Exited {
                name: "nginx".into(),
                status,
                log: startup_log(dir),
            });
        }
        pending.retain(|f| {
            std::net::TcpStream::connect_timeout(&f.addr(port), Duration::from_millis(100)).is_err()
        });
        if pending.is_empty() {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(HarnessError::NotReady {
                name: "nginx".into(),
                waited: start.elapsed(),
                detail: format!("no listener for {pending:?}; log:\n{}", startup_log(dir)),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn nginx_bin() -> PathBuf {
    std::env::var_os(NGINX_BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("nginx"))
}

fn nginx_version(bin: &Path) -> Result<(u32, u32, u32)> {
    let out = Command::new(bin).arg("-v").output().ctx(|| {
        format!(
            "running `{} -v` (is nginx installed? scripts/setup.sh)",
            bin.display()
        )
    })?;
    let text = String::from_utf8_lossy(&out.stderr);
    parse_nginx_version(&text)
        .ok_or_else(|| HarnessError::Invalid(format!("cannot parse nginx version from {text:?}")))
}

pub fn parse_nginx_version(text: &str) -> Option<(u32, u32, u32)> {
    let v = text.split("nginx/").nth(1)?.split_whitespace().next()?;
    let mut it = v.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

fn spawn_nginx(bin: &Path, dir: &Path) -> Result<Daemon> {
    let stderr = std::fs::File::create(dir.join("logs/stderr.log")).ctx(|| "stderr.log".into())?;
    let mut cmd = Command::new(bin);
    // -e: Debian's nginx is built with the error log on stderr until the config is
    // read; point that early log into our dir too.
    cmd.arg("-p")
        .arg(format!("{}/", dir.display()))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-e")
        .arg(dir.join("logs/error.log"))
        .args(["-g", "daemon off;"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    Daemon::spawn("nginx", cmd)
}

/// SplitMix64: deterministic filler so content digests are stable across runs. Not
/// for anything but test bytes.
pub fn deterministic_bytes(seed: &str, len: usize) -> Vec<u8> {
    let mut state: u64 = seed.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Writes the static files once and hard-links them into each host's docroot.
fn write_content(dir: &Path, hosts: &[String]) -> Result<BTreeMap<String, String>> {
    let master = dir.join("content");
    std::fs::create_dir_all(&master).ctx(|| "mkdir content".into())?;
    let mut digests = BTreeMap::new();
    for (path, len) in CONTENT_FILES {
        let bytes = deterministic_bytes(path, len);
        digests.insert(path.to_string(), sha256_hex(&bytes));
        write_file(&master.join(path.trim_start_matches('/')), &bytes)?;
    }
    for host in hosts {
        let root = dir.join("html").join(host);
        std::fs::create_dir_all(root.join("upload")).ctx(|| format!("mkdir {}", root.display()))?;
        for (path, _) in CONTENT_FILES {
            let name = path.trim_start_matches('/');
            std::fs::hard_link(master.join(name), root.join(name))
                .ctx(|| format!("linking {name} into {}", root.display()))?;
        }
        write_file(&root.join("host.txt"), format!("{host}\n"))?;
    }
    Ok(digests)
}

pub struct ConfigInputs<'a> {
    pub dir: &'a Path,
    pub port: u16,
    pub opts: &'a NginxOptions,
    pub pki: &'a TestPki,
    pub version: (u32, u32, u32),
    pub run_as_root: bool,
}

/// The JSON access-log format. `escape=json` makes every variable safe inside quotes;
/// numeric variables are emitted bare so they parse as numbers.
const LOG_FORMAT: &str = concat!(
    r#"'{"time":"$time_iso8601","msec":$msec,"remote_addr":"$remote_addr","#,
    r#""method":"$request_method","uri":"$request_uri","status":$status,"#,
    r#""host":"$host","server_name":"$server_name","ssl_server_name":"$ssl_server_name","#,
    r#""ssl_protocol":"$ssl_protocol","protocol":"$server_protocol","#,
    r#""request_length":$request_length,"body_bytes_sent":$body_bytes_sent,"#,
    r#""bytes_sent":$bytes_sent,"request_time":$request_time,"#,
    r#""x_forwarded_for":"$http_x_forwarded_for","x_forwarded_proto":"$http_x_forwarded_proto","#,
    r#""x_real_ip":"$http_x_real_ip","#,
    r#""forwarded":"$http_forwarded","via":"$http_via","cookie":"$http_cookie","#,
    r#""user_agent":"$http_user_agent","content_length":"$http_content_length","#,
    r#""connection":$connection,"connection_requests":$connection_requests}'"#
);

/// Renders nginx.conf. Pure, so the config shape can be read and tested on its own.
pub fn render_config(c: &ConfigInputs) -> String {
    let d = c.dir.display();
    let o = c.opts;
    // `listen ... http2` is the only form nginx < 1.25.1 knows; newer versions want
    // `http2 on;` and warn about the old one.
    let new_http2 = c.version >= (1, 25, 1);
    let listen_opts = if new_http2 { "ssl" } else { "ssl http2" };
    let http2_directive = if new_http2 { "http2 on;" } else { "" };
    let mut listens: Vec<String> = vec![format!("127.0.0.1:{}", c.port)];
    if o.ipv6 {
        listens.push(format!("[::1]:{}", c.port));
    }
    let listen_lines = |default: bool| -> String {
        listens
            .iter()
            .map(|a| {
                format!(
                    "        listen {a} {listen_opts}{};\n",
                    if default { " default_server" } else { "" }
                )
            })
            .collect()
    };
    let echo_body: String = ECHO_FIELDS
        .iter()
        .map(|(name, var)| format!("{name}: {var}\\n"))
        .collect();
    let alt_svc = o
        .alt_svc
        .as_ref()
        .map(|v| format!("        add_header Alt-Svc '{v}' always;\n"))
        .unwrap_or_default();
    // Workers must read the docroots and write uploads inside a 0700 temp dir owned by
    // the test user; as root that means running them as root too. Unprivileged, nginx
    // cannot switch users and the directive would only produce a warning.
    let user = if c.run_as_root { "user root;" } else { "" };

    let mut servers = String::new();
    if o.reject_unknown_sni {
        servers.push_str(&format!(
            "    server {{\n{}        ssl_reject_handshake on;\n    }}\n",
            listen_lines(true)
        ));
    }
    for (i, host) in o.hosts.iter().enumerate() {
        let leaf = c.pki.leaf(host);
        servers.push_str(&format!(
            r#"    server {{
{listen}        server_name {host};
        {http2_directive}
        ssl_certificate {cert};
        ssl_certificate_key {key};
        root {d}/html/{host};
{alt_svc}
        location / {{
        }}
        location /upload/ {{
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
            client_max_body_size 1g;
        }}
        location = /echo-headers {{
            client_max_body_size 1g;
            default_type text/plain;
            return 200 "{echo_body}";
        }}
        location = /whoami {{
            default_type text/plain;
            return 200 "{host}\n";
        }}
        location = /redirect {{
            return 302 https://$host/1m.bin;
        }}
{extra_server}
    }}
"#,
            listen = listen_lines(i == 0 && !o.reject_unknown_sni),
            cert = leaf.cert_path.display(),
            key = leaf.key_path.display(),
            extra_server = o.extra_server,
        ));
    }

    format!(
        r#"# Generated by tests/support/nginx.rs for one test; deleted afterwards.
{user}
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/logs/error.log {level};

events {{
    worker_connections 1024;
}}

http {{
    types {{
        text/plain txt;
        application/octet-stream bin;
    }}
    default_type application/octet-stream;
    sendfile on;
    server_tokens off;
    client_body_temp_path {d}/tmp/client_body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    log_format h3i_json escape=json {LOG_FORMAT};
    access_log {d}/logs/access.log h3i_json;
    ssl_protocols TLSv1.2 TLSv1.3;
{extra_http}
{servers}}}
"#,
        level = o.error_log_level,
        extra_http = o.extra_http,
    )
}
