//! What runs in the lab's server namespace, shared by the bench and the smoke test: the
//! content files, the TCP ingress (Debian nginx, TLS +
//! h2), Caddy as an HTTP/3 reverse proxy, nginx with HTTP/3 from a trixie chroot, and our own
//! proxy. Config generators are pure functions; processes are stopped on drop.

use std::fs;
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use super::netns;
use super::pki::Pki;
use super::topology::{SERVER_V4, SERVER_V6};
use super::LabError;
use h3_ingress::api::FileConfig;

/// The virtual host every server in the lab serves.
pub const HOST: &str = "lab.test";
/// Port of the TCP ingress (nginx, TLS + h2). Our proxy and Caddy forward to it.
pub const INGRESS_PORT: u16 = 443;

fn io(ctx: impl Into<String>) -> impl FnOnce(std::io::Error) -> LabError {
    let ctx = ctx.into();
    move |e| LabError::io(ctx, e)
}

/// The working directory of one lab run: pki/, www/, upload/, logs/, tmp/.
#[derive(Debug, Clone)]
pub struct Work {
    pub dir: PathBuf,
}

impl Work {
    pub fn create(dir: &Path) -> Result<Work, LabError> {
        for sub in ["pki", "www", "upload", "logs", "tmp"] {
            fs::create_dir_all(dir.join(sub)).map_err(io(format!("mkdir {}", dir.display())))?;
        }
        Ok(Work {
            dir: dir.to_path_buf(),
        })
    }
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join("logs").join(format!("{name}.log"))
    }
}

/// Writes incompressible pseudo-random content (deterministic per name) unless present.
pub fn make_file(work: &Work, name: &str, size: u64) -> Result<PathBuf, LabError> {
    let path = work.path("www").join(name);
    if fs::metadata(&path)
        .map(|m| m.len() == size)
        .unwrap_or(false)
    {
        return Ok(path);
    }
    let mut f = std::io::BufWriter::new(fs::File::create(&path).map_err(io("create content"))?);
    let mut x: u64 = name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let mut left = size;
    let mut block = [0u8; 8192];
    while left > 0 {
        for chunk in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).map_err(io("write content"))?;
        left -= n as u64;
    }
    f.flush().map_err(io("write content"))?;
    Ok(path)
}

/// A server process in a namespace; stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(
        name: &str,
        ns: &str,
        argv: &[String],
        env: &[(&str, String)],
        log: PathBuf,
    ) -> Result<Proc, LabError> {
        let out = fs::File::create(&log).map_err(io(format!("create {}", log.display())))?;
        let err = out.try_clone().map_err(io("log file"))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(io(format!("start {name}")))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(reason)` if the process has exited.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(s)) => Some(format!(
                "{} exited ({s}); log {}",
                self.name,
                self.log.display()
            )),
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", self.name)),
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let v: Vec<&str> = text.lines().collect();
        v[v.len().saturating_sub(lines)..].join("\n")
    }

    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        // SAFETY: SIGTERM to the pid of a child we spawned and have not reaped yet. `ip netns
        // exec` and `chroot` exec in place, so this is the server itself (nginx's master then
        // stops its workers).
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Waits until a TCP port accepts connections inside namespace `ns`.
pub fn wait_tcp(ns: &str, addr: SocketAddr, timeout: Duration) -> Result<(), LabError> {
    netns::spawn_in(ns, move || {
        let deadline = Instant::now() + timeout;
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(LabError::Failed(format!("nothing listens on {addr}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .join()
    .map_err(|_| LabError::Failed("wait thread panicked".into()))?
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// nginx 1.22 (bookworm) as the TCP ingress: TLS 1.3 + h2 on all addresses, static files,
/// WebDAV PUT for uploads. Pure.
pub fn nginx_ingress_conf(work: &Path, pki: &Pki) -> String {
    let w = |r: &str| s(&work.join(r));
    format!(
        r#"user root;
worker_processes 1;
pid {pid};
error_log {err} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    types {{ application/octet-stream bin; }}
    default_type application/octet-stream;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 100000;
    server {{
        listen {port} ssl http2;
        listen [::]:{port} ssl http2;
        server_name {HOST};
        ssl_certificate {chain};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        root {www};
        location /upload/ {{
            alias {upload}/;
            dav_methods PUT;
            create_full_put_path on;
            client_max_body_size 1g;
            client_body_buffer_size 1m;
        }}
    }}
}}
"#,
        pid = w("nginx-ingress.pid"),
        err = s(&work.join("logs").join("nginx-ingress-error.log")),
        tmp = w("tmp"),
        port = INGRESS_PORT,
        chain = s(&pki.fullchain),
        key = s(&pki.key),
        www = w("www"),
        upload = w("upload"),
    )
}

/// The TCP pacing shim (`lab/scripts/tcp-pacing.c`), compiled with the system's `cc` into the
/// work directory: preloaded into the ingress nginx, it turns on the kernel's own pacing for
/// every connection nginx accepts.
pub fn build_pacing_shim(work: &Work) -> Result<PathBuf, LabError> {
    let src = work.path("tcp-pacing.c");
    let lib = work.path("tcp-pacing.so");
    fs::write(&src, crate::TCP_PACING_SHIM).map_err(io("write the pacing shim"))?;
    netns::run(
        "cc",
        &["-O2", "-shared", "-fPIC", "-o", &s(&lib), &s(&src), "-ldl"],
    )?;
    Ok(lib)
}

/// Starts the ingress nginx; `pacing_shim` preloads [`build_pacing_shim`]'s library.
pub fn start_ingress(
    ns: &str,
    work: &Work,
    pki: &Pki,
    pacing_shim: Option<&Path>,
) -> Result<Proc, LabError> {
    let conf = work.path("nginx-ingress.conf");
    fs::write(&conf, nginx_ingress_conf(&work.dir, pki)).map_err(io("write nginx conf"))?;
    let env: Vec<(&str, String)> = pacing_shim
        .map(|p| ("LD_PRELOAD", s(p)))
        .into_iter()
        .collect();
    let p = Proc::spawn(
        "nginx-ingress",
        ns,
        &[
            "nginx".into(),
            "-c".into(),
            s(&conf),
            "-g".into(),
            "daemon off;".into(),
        ],
        &env,
        work.log("nginx-ingress"),
    )?;
    wait_tcp(
        ns,
        SocketAddr::new(IpAddr::V4(SERVER_V4), INGRESS_PORT),
        Duration::from_secs(10),
    )
    .map_err(|e| LabError::Failed(format!("{e}: {}", p.log_tail(10))))?;
    Ok(p)
}

/// Caddy 2.6 as an HTTP/3 (and h2) reverse proxy in front of the same nginx. Pure.
pub fn caddyfile(port: u16, pki: &Pki) -> String {
    format!(
        r#"{{
	admin off
	auto_https disable_redirects
	skip_install_trust
	servers {{
		protocols h1 h2 h3
	}}
}}
https://{HOST}:{port} {{
	bind {v4} [{v6}]
	tls {chain} {key}
	reverse_proxy https://127.0.0.1:{ingress} {{
		transport http {{
			tls_server_name {HOST}
			tls_trusted_ca_certs {root}
		}}
	}}
}}
"#,
        v4 = SERVER_V4,
        v6 = SERVER_V6,
        chain = s(&pki.fullchain),
        key = s(&pki.key),
        root = s(&pki.root),
        ingress = INGRESS_PORT,
    )
}

pub fn start_caddy(ns: &str, work: &Work, pki: &Pki, port: u16) -> Result<Proc, LabError> {
    let conf = work.path("Caddyfile");
    fs::write(&conf, caddyfile(port, pki)).map_err(io("write Caddyfile"))?;
    let home = work.path("caddy-home");
    fs::create_dir_all(&home).map_err(io("mkdir caddy home"))?;
    let p = Proc::spawn(
        "caddy",
        ns,
        &[
            "caddy".into(),
            "run".into(),
            "--config".into(),
            s(&conf),
            "--adapter".into(),
            "caddyfile".into(),
        ],
        &[
            ("HOME", s(&home)),
            ("XDG_DATA_HOME", s(&home.join("data"))),
            ("XDG_CONFIG_HOME", s(&home.join("config"))),
        ],
        work.log("caddy"),
    )?;
    wait_tcp(
        ns,
        SocketAddr::new(IpAddr::V4(SERVER_V4), port),
        Duration::from_secs(15),
    )
    .map_err(|e| LabError::Failed(format!("{e}: {}", p.log_tail(10))))?;
    Ok(p)
}

/// The work directory seen from inside the trixie chroot (bind-mounted at `/mnt/<prefix>`).
pub struct ChrootView {
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// The work directory's path as programs inside the chroot see it.
    pub inside: PathBuf,
}

impl ChrootView {
    pub fn mount(root: &Path, prefix: &str, work: &Work) -> Result<ChrootView, LabError> {
        let inside = PathBuf::from("/mnt").join(prefix);
        let mount_point = root.join(inside.strip_prefix("/").unwrap_or(&inside));
        fs::create_dir_all(&mount_point).map_err(io("mkdir chroot mount point"))?;
        let mp = s(&mount_point);
        // A leftover mount from an interrupted run would shadow this one.
        let _ = netns::run("umount", &["-l", &mp]);
        netns::run("mount", &["--bind", &s(&work.dir), &mp])?;
        Ok(ChrootView {
            root: root.to_path_buf(),
            mount_point,
            inside,
        })
    }
}

impl Drop for ChrootView {
    fn drop(&mut self) {
        let _ = netns::run("umount", &["-l", &s(&self.mount_point)]);
        let _ = fs::remove_dir(&self.mount_point);
    }
}

/// Checks a trixie chroot has what the bench needs; returns curl's and nginx's versions.
pub fn probe_chroot(root: &Path) -> Result<(String, String), String> {
    if !root.join("usr/bin/curl").exists() || !root.join("usr/sbin/nginx").exists() {
        return Err(format!(
            "no trixie chroot with curl and nginx at {} (create it with scripts/trixie-chroot.sh {})",
            root.display(),
            root.display()
        ));
    }
    let r = s(root);
    let curl = netns::run("chroot", &[&r, "curl", "--version"]).map_err(|e| e.to_string())?;
    if !curl.contains("HTTP3") {
        return Err("the chroot's curl has no HTTP3 feature".into());
    }
    let nginx = Command::new("chroot")
        .args([&r, "/usr/sbin/nginx", "-V"])
        .output()
        .map_err(|e| e.to_string())?;
    let nginx_v = String::from_utf8_lossy(&nginx.stderr).into_owned();
    if !nginx_v.contains("--with-http_v3_module") {
        return Err("the chroot's nginx has no http_v3 module".into());
    }
    Ok((
        curl.lines().next().unwrap_or_default().to_string(),
        nginx_v.lines().next().unwrap_or_default().to_string(),
    ))
}

/// nginx 1.26 (trixie) with native HTTP/3 serving the same files itself: one UDP socket per
/// family (a single dual-stack socket would send IPv4 without DF, docs/field-reports.md, "000
/// dual-stack socket without DF") and `http3_stream_buffer_size 1m` instead of the 64 KB
/// default that limits every stream to 64 KB per round trip ("002 64 KB / 208 KB brakes").
/// Paths are as seen inside the chroot. Pure.
pub fn nginx_h3_conf(inside: &Path, port: u16) -> String {
    let w = |r: &str| s(&inside.join(r));
    format!(
        r#"user root;
worker_processes 1;
pid {pid};
error_log {err} warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    types {{ application/octet-stream bin; }}
    default_type application/octet-stream;
    client_body_temp_path {tmp}/body-h3;
    proxy_temp_path {tmp}/proxy-h3;
    fastcgi_temp_path {tmp}/fastcgi-h3;
    uwsgi_temp_path {tmp}/uwsgi-h3;
    scgi_temp_path {tmp}/scgi-h3;
    server {{
        listen {v4}:{port} quic reuseport;
        listen [{v6}]:{port} quic reuseport;
        listen {v4}:{port} ssl;
        listen [{v6}]:{port} ssl;
        http2 on;
        http3 on;
        http3_stream_buffer_size 1m;
        server_name {HOST};
        ssl_certificate {chain};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.3;
        root {www};
        location /upload/ {{
            alias {upload}/;
            dav_methods PUT;
            create_full_put_path on;
            client_max_body_size 1g;
            client_body_buffer_size 1m;
        }}
    }}
}}
"#,
        pid = w("nginx-h3.pid"),
        err = w("logs/nginx-h3-error.log"),
        tmp = w("tmp"),
        v4 = SERVER_V4,
        v6 = SERVER_V6,
        chain = w("pki/fullchain.pem"),
        key = w("pki/leaf.key"),
        www = w("www"),
        upload = w("upload"),
    )
}

/// Starts the trixie nginx; `inside` is where the work directory is mounted in chroot `root`.
pub fn start_nginx_h3(
    ns: &str,
    work: &Work,
    root: &Path,
    inside: &Path,
    port: u16,
) -> Result<Proc, LabError> {
    fs::write(work.path("nginx-h3.conf"), nginx_h3_conf(inside, port))
        .map_err(io("write nginx-h3.conf"))?;
    let p = Proc::spawn(
        "nginx-h3",
        ns,
        &[
            "chroot".into(),
            s(root),
            "/usr/sbin/nginx".into(),
            "-c".into(),
            s(&inside.join("nginx-h3.conf")),
            "-g".into(),
            "daemon off;".into(),
        ],
        &[],
        work.log("nginx-h3"),
    )?;
    wait_tcp(
        ns,
        SocketAddr::new(IpAddr::V4(SERVER_V4), port),
        Duration::from_secs(10),
    )
    .map_err(|e| LabError::Failed(format!("{e}: {}", p.log_tail(10))))?;
    Ok(p)
}

/// The product binary the lab runs as the proxy: `--proxy-bin` (or `H3LAB_PROXY_BIN`) when
/// given, else `h3-ingress` beside the lab's own executable, which is where
/// `cargo build [--release] --workspace` puts both.
#[derive(Args, Debug, Clone)]
pub struct ProxyBinArg {
    /// The h3-ingress binary to run as the proxy (default: `h3-ingress` next to this program).
    #[arg(long, env = "H3LAB_PROXY_BIN")]
    pub proxy_bin: Option<PathBuf>,
}

impl ProxyBinArg {
    /// The proxy binary, checked to run and to have `proxy --config`.
    pub fn resolve(&self) -> Result<PathBuf, LabError> {
        let path = match &self.proxy_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(io("current_exe"))?
                .with_file_name("h3-ingress"),
        };
        proxy_supported(&path).map_err(|why| {
            LabError::Failed(format!(
                "{why}; build it with `cargo build --release --workspace` (or `-p h3-ingress`) or pass --proxy-bin"
            ))
        })?;
        Ok(path)
    }
}

/// Why `exe` cannot serve as the proxy, or `Ok` when it runs and has `proxy --config`.
pub fn proxy_supported(exe: &Path) -> Result<(), String> {
    let out = Command::new(exe)
        .args(["proxy", "--help"])
        .output()
        .map_err(|e| format!("cannot run the proxy binary {}: {e}", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && text.contains("--config") {
        Ok(())
    } else {
        Err(format!("{} has no `proxy --config`", exe.display()))
    }
}

/// One of our proxy's bench variants.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyVariant {
    pub congestion_control: &'static str,
    /// Requested SO_RCVBUF/SO_SNDBUF; `None` keeps the product default.
    pub buffer_bytes: Option<u32>,
    /// `transport.initialWindowPackets`; `None` keeps the product default.
    pub initial_window_packets: Option<u32>,
}

/// The proxy's YAML configuration, built through [`FileConfig`] so a field the data plane does
/// not know fails here, not at run time. Pure.
pub fn proxy_config(
    v: &ProxyVariant,
    port: u16,
    metrics_port: u16,
    pki: &Pki,
) -> Result<String, LabError> {
    let mut cfg = json!({
        "port": port,
        "addresses": { "ipv4": SERVER_V4.to_string(), "ipv6": SERVER_V6.to_string() },
        "upstream": { "address": format!("127.0.0.1:{INGRESS_PORT}"), "tls": true },
        "transport": { "congestionControl": v.congestion_control },
        "metrics": { "address": format!("127.0.0.1:{metrics_port}") },
        "hosts": [ { "name": HOST, "certFile": s(&pki.fullchain), "keyFile": s(&pki.key) } ],
    });
    if let Some(b) = v.buffer_bytes {
        cfg["socket"] = json!({ "receiveBufferBytes": b, "sendBufferBytes": b });
    }
    if let Some(iw) = v.initial_window_packets {
        cfg["transport"]["initialWindowPackets"] = json!(iw);
    }
    let parsed: FileConfig =
        serde_json::from_value(cfg).map_err(|e| LabError::Config(format!("proxy config: {e}")))?;
    serde_norway::to_string(&parsed).map_err(|e| LabError::Config(format!("proxy config: {e}")))
}

pub fn start_proxy(
    ns: &str,
    work: &Work,
    exe: &Path,
    name: &str,
    yaml: &str,
    metrics_port: u16,
) -> Result<Proc, LabError> {
    let conf = work.path(&format!("{name}.yaml"));
    fs::write(&conf, yaml).map_err(io("write proxy config"))?;
    let p = Proc::spawn(
        name,
        ns,
        &[s(exe), "proxy".into(), "--config".into(), s(&conf)],
        // RUST_LOG passes through so a bench can be rerun with e.g. h3_ingress::proxy::quic::cc=debug.
        &[(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )],
        work.log(name),
    )?;
    wait_tcp(
        ns,
        SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), metrics_port),
        Duration::from_secs(15),
    )
    .map_err(|e| LabError::Failed(format!("{e}: {}", p.log_tail(10))))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pki() -> Pki {
        Pki {
            root: "/w/pki/root.pem".into(),
            fullchain: "/w/pki/fullchain.pem".into(),
            key: "/w/pki/leaf.key".into(),
            chain_der_bytes: 0,
        }
    }

    #[test]
    fn ingress_conf_is_tls_h2_with_webdav() {
        let c = nginx_ingress_conf(Path::new("/w"), &pki());
        assert!(c.contains("listen 443 ssl http2;"));
        assert!(c.contains("listen [::]:443 ssl http2;"));
        assert!(c.contains("dav_methods PUT;"));
        assert!(c.contains("ssl_certificate /w/pki/fullchain.pem;"));
        assert!(!c.contains("quic"));
    }

    #[test]
    fn nginx_h3_conf_splits_families_and_sets_stream_buffer() {
        let c = nginx_h3_conf(Path::new("/mnt/x"), 9443);
        assert!(c.contains("listen 10.77.2.2:9443 quic reuseport;"));
        assert!(c.contains("listen [fd77:2::2]:9443 quic reuseport;"));
        assert!(c.contains("http3_stream_buffer_size 1m;"));
        assert!(c.contains("root /mnt/x/www;"));
        assert!(!c.contains("ipv6only=off"));
    }

    #[test]
    fn caddyfile_proxies_to_the_ingress() {
        let c = caddyfile(8443, &pki());
        assert!(c.contains("https://lab.test:8443"));
        assert!(c.contains("reverse_proxy https://127.0.0.1:443"));
        assert!(c.contains("protocols h1 h2 h3"));
    }

    #[test]
    fn proxy_config_round_trips_through_file_config() {
        let v = ProxyVariant {
            congestion_control: "cubic-hs",
            buffer_bytes: Some(106_496),
            initial_window_packets: Some(10),
        };
        let y = proxy_config(&v, 443, 9480, &pki()).unwrap();
        let back = h3_ingress::config::file::parse(&y).unwrap();
        assert_eq!(back.transport.congestion_control.as_str(), "cubic-hs");
        assert_eq!(back.socket.receive_buffer_bytes, 106_496);
        assert_eq!(back.transport.initial_window_packets, 10);
        assert_eq!(back.addresses.ipv4.as_deref(), Some("10.77.2.2"));
        assert_eq!(back.hosts[0].name, HOST);
        let bad = ProxyVariant {
            congestion_control: "vegas",
            buffer_bytes: None,
            initial_window_packets: None,
        };
        assert!(proxy_config(&bad, 443, 9480, &pki()).is_err());
    }
}
