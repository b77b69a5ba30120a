//! `lab bench`: HTTP/2 to nginx vs HTTP/3 through our proxy, Caddy and nginx 1.26, through the
//! emulated paths of the issue's scenarios S1-S5. Cells alternate round-robin across rows
//! within a case so drift of this shared 2-core machine hits every row alike; every transfer is
//! a fresh curl process and connection; the router's counters are attributed per cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};

use super::client::{self, Expect, Proto, Sample};
use super::emu::{Position, RuleProto};
use super::netns;
use super::report::{
    self, BenchReport, Case, Cell, ProxyStats, RowInfo, H2, LOSS_TOLERANT, OURS, RFC_IW,
    SMALL_BUFFERS,
};
use super::servers::{self, ProxyBinArg, ProxyVariant, INGRESS_PORT};
use super::session::Session;
use super::topology::SERVER_V4;
use super::{path_config, throughput, LabError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClientArg {
    /// curl 8.14 from the trixie chroot for every row (h2 and h3).
    Curl,
    /// aioquic (scripts/lab/h3get.py) for h3 rows, the system curl for h2.
    Aioquic,
}

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Fewer transfers (3 per cell, 10 in S3) and fewer cases: a quick look, not the protocol.
    #[arg(long)]
    pub quick: bool,
    /// Scenarios to run.
    #[arg(long, value_delimiter = ',', default_value = "S1,S2,S3,S4,S5")]
    pub scenarios: Vec<String>,
    /// Transfers per cell (default 10, and 40 in S3).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Rows to run (default all): h2-nginx, h3-ingress-cubic-hs, h3-ingress-cubic-hs-lt,
    /// h3-ingress-cubic, h3-ingress-bbr, h3-ingress-208k, h3-ingress-iw10, caddy, nginx-1.26.
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
    /// Debian trixie chroot with curl 8.14 (HTTP/3) and nginx 1.26 (http_v3).
    #[arg(long, env = "H3LAB_CHROOT", default_value = "/work/trixie-root")]
    pub chroot: PathBuf,
    #[arg(long, value_enum, default_value_t = ClientArg::Curl)]
    pub client: ClientArg,
    /// Name prefix of the bench's lab (namespaces, TUN devices, /run/<prefix>).
    #[arg(long, default_value = "h3bench")]
    pub prefix: String,
    /// Bottleneck rate in Mbit/s (each direction) for every case.
    #[arg(long)]
    pub rate_mbit: Option<f64>,
    /// Bottleneck rate in Mbit/s for S4's downloads and first upload case (0: none), so the
    /// machine's CPU (curl's QUIC receive path) is not what S4 measures. S4 also runs the
    /// upload without any limit, to stress the server's UDP socket buffers.
    #[arg(long, default_value_t = 100.0)]
    pub s4_rate_mbit: f64,
    /// Time limit per transfer in seconds (S5 uses at most 10 s, uploads at least 60 s).
    #[arg(long, default_value_t = 30.0)]
    pub max_time: f64,
    /// Initial congestion window (packets) for the h3-ingress rows that do not pin one;
    /// default: the product's default (`transport.initialWindowPackets`).
    #[arg(long)]
    pub initial_window_packets: Option<u32>,
    /// TCP congestion control for the HTTP/2 rows (both lab namespaces), e.g. `cubic`;
    /// default: the machine's (`net.ipv4.tcp_congestion_control`), named in the report.
    #[arg(long)]
    pub tcp_congestion_control: Option<String>,
    /// Where the JSON and markdown results go.
    #[arg(long, default_value = "target/lab")]
    pub out: PathBuf,
    #[command(flatten)]
    pub proxy: ProxyBinArg,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub id: &'static str,
    pub label: &'static str,
    pub proto: Proto,
    pub port: u16,
    pub server: ServerKind,
    /// Measured only in this scenario (rows that answer one question).
    pub only_in: Option<&'static str>,
}

#[derive(Debug, Clone)]
pub enum ServerKind {
    Ingress,
    Ours {
        variant: ProxyVariant,
        metrics_port: u16,
    },
    Caddy,
    NginxH3,
}

/// 104 KiB requested; the kernel doubles it (socket(7)), so the socket holds 208 KiB: Linux's
/// default that dropped 284 datagrams in seed 002.
pub const SMALL_BUFFER_REQUEST: u32 = 106_496;

pub fn all_rows() -> Vec<Row> {
    let ours = |id, label, cc, buf, iw, port, metrics_port, only_in| Row {
        id,
        label,
        proto: Proto::H3,
        port,
        server: ServerKind::Ours {
            variant: ProxyVariant {
                congestion_control: cc,
                buffer_bytes: buf,
                initial_window_packets: iw,
            },
            metrics_port,
        },
        only_in,
    };
    vec![
        Row {
            id: H2,
            label: "h2 nginx 1.22",
            proto: Proto::H2,
            port: INGRESS_PORT,
            server: ServerKind::Ingress,
            only_in: None,
        },
        ours(
            OURS,
            "h3 h3-ingress cubic-hs",
            "cubic-hs",
            None,
            None,
            4431,
            9481,
            None,
        ),
        // Random loss read as random: the setting for lossy radio paths (S3).
        ours(
            LOSS_TOLERANT,
            "h3 h3-ingress cubic-hs-lt",
            "cubic-hs-lt",
            None,
            None,
            4436,
            9486,
            None,
        ),
        ours(
            "h3-ingress-cubic",
            "h3 h3-ingress cubic",
            "cubic",
            None,
            None,
            4432,
            9482,
            None,
        ),
        ours(
            "h3-ingress-bbr",
            "h3 h3-ingress bbr",
            "bbr",
            None,
            None,
            4433,
            9483,
            None,
        ),
        ours(
            SMALL_BUFFERS,
            "h3 h3-ingress cubic-hs, 208 KB buffers",
            "cubic-hs",
            Some(SMALL_BUFFER_REQUEST),
            None,
            4434,
            9484,
            Some("S4"),
        ),
        // The RFC 9002 initial window next to our default, so the table shows what the larger
        // window buys on a long fat path and what it does not.
        ours(
            RFC_IW,
            "h3 h3-ingress cubic-hs, IW 10",
            "cubic-hs",
            None,
            Some(10),
            4435,
            9485,
            Some("S1"),
        ),
        Row {
            id: "caddy",
            label: "h3 Caddy 2.6",
            proto: Proto::H3,
            port: 8443,
            server: ServerKind::Caddy,
            only_in: None,
        },
        Row {
            id: "nginx-1.26",
            label: "h3 nginx 1.26",
            proto: Proto::H3,
            port: 9443,
            server: ServerKind::NginxH3,
            only_in: None,
        },
    ]
}

struct FileSpec {
    name: &'static str,
    bytes: u64,
    label: &'static str,
}

const MB1: FileSpec = FileSpec {
    name: "1m.bin",
    bytes: 1 << 20,
    label: "1 MB",
};
const MB4: FileSpec = FileSpec {
    name: "4m.bin",
    bytes: 4 << 20,
    label: "4 MB",
};
const MB5_7: FileSpec = FileSpec {
    name: "5.7m.bin",
    bytes: 5_700_000,
    label: "5.7 MB",
};
const MB50: FileSpec = FileSpec {
    name: "50m.bin",
    bytes: 50 << 20,
    label: "50 MB",
};
const MB20_UP: FileSpec = FileSpec {
    name: "20m.bin",
    bytes: 20 << 20,
    label: "20 MB upload",
};

/// The cases of the selected scenarios. Pure.
pub fn plan(
    scenarios: &[String],
    quick: bool,
    runs: Option<usize>,
    rate: Option<f64>,
    s4_rate: Option<f64>,
    max_time: f64,
) -> Result<Vec<Case>, LabError> {
    let mut out = Vec::new();
    let n = |full: usize| runs.unwrap_or(if quick { full.div_ceil(4).max(3) } else { full });
    #[allow(clippy::too_many_arguments)]
    let mk = |sc: &str,
              rtt: f64,
              loss: f64,
              mtu: u32,
              icmp: bool,
              rule: bool,
              f: &FileSpec,
              runs: usize| {
        let mut label = format!("{rtt:.0} ms, {}", f.label);
        if loss > 0.0 {
            label.push_str(&format!(", {:.0} % loss", loss * 100.0));
        }
        if rule {
            label.push_str(", first-flight drop");
        }
        if mtu < 1500 {
            label.push_str(&format!(
                ", MTU {mtu}{}",
                if icmp { "" } else { " no ICMP" }
            ));
        }
        let upload = f.label.contains("upload");
        Case {
            scenario: sc.to_string(),
            id: format!(
                "{sc}-{rtt:.0}ms-{}{}{}{}",
                f.name.trim_end_matches(".bin"),
                if loss > 0.0 {
                    format!("-loss{:.0}", loss * 100.0)
                } else {
                    String::new()
                },
                if rule { "-drop" } else { "" },
                if mtu < 1500 {
                    format!("-mtu{mtu}")
                } else {
                    String::new()
                }
            ),
            label,
            rtt_ms: rtt,
            loss,
            mtu,
            icmp,
            rule: rule.then_some(Position::Last),
            file: f.name.to_string(),
            bytes: f.bytes,
            upload,
            runs,
            rate_mbit: None,
            max_time: if upload {
                max_time.max(60.0)
            } else if sc == "S5" {
                max_time.min(10.0)
            } else {
                max_time
            },
        }
    };
    for sc in scenarios {
        let sc = sc.trim().to_ascii_uppercase();
        match sc.as_str() {
            "S1" => {
                out.push(mk("S1", 200.0, 0.0, 1500, true, false, &MB1, n(10)));
                if !quick {
                    out.push(mk("S1", 200.0, 0.0, 1500, true, false, &MB4, n(10)));
                }
                out.push(mk("S1", 100.0, 0.0, 1500, true, false, &MB1, n(10)));
            }
            "S2" => {
                out.push(mk("S2", 200.0, 0.0, 1500, true, true, &MB1, n(10)));
                out.push(mk("S2", 100.0, 0.0, 1500, true, true, &MB1, n(10)));
                // The issue's rule takes the flight's last datagram, which for a server that
                // sends its HTTP/3 SETTINGS right after the handshake is that 1-RTT datagram;
                // this case takes the last one with handshake data, as in seed 004.
                let mut hs = mk("S2", 200.0, 0.0, 1500, true, true, &MB1, n(10));
                hs.rule = Some(Position::LastHandshake);
                hs.id.push_str("hs");
                hs.label = hs
                    .label
                    .replace("first-flight drop", "last handshake datagram dropped");
                out.push(hs);
            }
            "S3" => {
                out.push(mk("S3", 200.0, 0.01, 1500, true, false, &MB1, n(40)));
                out.push(mk("S3", 200.0, 0.02, 1500, true, false, &MB1, n(40)));
            }
            "S4" => {
                for rtt in [11.0, 42.0] {
                    if !quick || rtt == 42.0 {
                        out.push(mk("S4", rtt, 0.0, 1500, true, false, &MB5_7, n(10)));
                    }
                    if !quick {
                        out.push(mk("S4", rtt, 0.0, 1500, true, false, &MB50, n(10)));
                    }
                }
                let up = mk("S4", 42.0, 0.0, 1500, true, false, &MB20_UP, n(10));
                if s4_rate.is_some() {
                    out.push(up.clone());
                }
                // At the client's full speed: the server's socket buffer is what is tested.
                let mut free = up;
                free.id.push_str("-unlimited");
                free.label.push_str(", no rate limit");
                free.rate_mbit = Some(0.0);
                out.push(free);
            }
            "S5" => {
                out.push(mk("S5", 42.0, 0.0, 1500, true, false, &MB4, n(10)));
                if !quick {
                    out.push(mk("S5", 42.0, 0.0, 1400, false, false, &MB4, n(10)));
                }
                out.push(mk("S5", 42.0, 0.0, 1280, false, false, &MB4, n(10)));
            }
            other => {
                return Err(LabError::Config(format!(
                    "unknown scenario {other:?} (S1..S5)"
                )))
            }
        }
    }
    for c in &mut out {
        // Some(0.0) marks a case that must run without a limit whatever the flags say.
        let r = match c.rate_mbit {
            Some(_) => None,
            None if c.scenario == "S4" => s4_rate.or(rate),
            None => rate,
        };
        c.rate_mbit = r;
        if let Some(r) = r {
            c.label.push_str(&format!(", {r} Mbit/s"));
            c.id.push_str(&format!("-{r}mbit"));
        }
    }
    Ok(out)
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only stores to an atomic.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_interrupt as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn first_line(cmd: &str, args: &[&str]) -> String {
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
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Runner<'a> {
    s: Session,
    args: &'a BenchArgs,
    chroot: Option<PathBuf>,
    script: PathBuf,
}

impl Runner<'_> {
    fn transfer(&self, row: &Row, case: &Case) -> Result<Sample, LabError> {
        let expect = Expect {
            proto: row.proto,
            bytes: case.bytes,
            upload: case.upload,
        };
        let path = if case.upload {
            format!("/upload/{}.bin", row.id)
        } else {
            format!("/{}", case.file)
        };
        if row.proto == Proto::H3 && self.args.client == ClientArg::Aioquic {
            let src = self.s.work.path("www").join(&case.file);
            return client::run_h3get(
                &self.s.names.client_ns,
                &client::H3Get {
                    script: &self.script,
                    ca: &self.s.pki.root,
                    port: row.port,
                    path: &path,
                    upload: case.upload.then_some(src.as_path()),
                    max_time: case.max_time,
                },
                expect,
            );
        }
        // Paths as the client sees them: inside the chroot, the work dir is under /mnt/<prefix>.
        let (ca, upload) = match &self.chroot {
            Some(_) => {
                let inside = PathBuf::from("/mnt").join(&self.s.names.prefix);
                (
                    inside.join("pki/root.pem"),
                    inside.join("www").join(&case.file),
                )
            }
            None => (
                self.s.pki.root.clone(),
                self.s.work.path("www").join(&case.file),
            ),
        };
        let upload = upload.to_string_lossy().into_owned();
        let a = client::curl_args(
            row.proto,
            std::net::IpAddr::V4(SERVER_V4),
            row.port,
            &path,
            &ca.to_string_lossy(),
            case.upload.then_some(upload.as_str()),
            case.max_time,
        );
        client::run_curl(&self.s.names.client_ns, self.chroot.as_deref(), &a, expect)
    }

    /// One transfer with its counters: router deltas and UDP stats of both namespaces.
    fn measured(&mut self, row: &Row, case: &Case, cell: &mut Cell) -> Result<Sample, LabError> {
        let before = self.s.snapshot()?;
        let proxy_before = self.proxy_stats(row);
        let srv = self.s.udp_stats(true)?;
        let cli = self.s.udp_stats(false)?;
        let sample = self.transfer(row, case)?;
        // Let the delay line empty so late packets of this connection count here, not in the
        // next row's cell, and do not compete with it.
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.s.snapshot()?.queued > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let after = self.s.snapshot()?;
        cell.counters.add(&after.counters.delta(&before.counters));
        cell.server_udp.add(&self.s.udp_stats(true)?.delta(&srv));
        cell.client_udp.add(&self.s.udp_stats(false)?.delta(&cli));
        cell.tun_client_tx_dropped += after
            .tun_client_tx_dropped
            .saturating_sub(before.tun_client_tx_dropped);
        cell.tun_server_tx_dropped += after
            .tun_server_tx_dropped
            .saturating_sub(before.tun_server_tx_dropped);
        if let (Some(b), Some(a)) = (proxy_before, self.proxy_stats(row)) {
            cell.proxy
                .get_or_insert_with(Default::default)
                .add(&a.delta(&b));
        }
        Ok(sample)
    }

    /// Our proxy's counters from its /metrics inside the server namespace; `None` for other
    /// rows or when the scrape fails (the cell then simply has no proxy notes).
    fn proxy_stats(&self, row: &Row) -> Option<ProxyStats> {
        let ServerKind::Ours { metrics_port, .. } = &row.server else {
            return None;
        };
        let url = format!("http://127.0.0.1:{metrics_port}/metrics");
        let ns = &self.s.names.server_ns;
        netns::run(
            "ip",
            &["netns", "exec", ns, "curl", "-sf", "--max-time", "2", &url],
        )
        .ok()
        .map(|t| ProxyStats::parse(&t))
    }
}

pub fn run(a: &BenchArgs) -> Result<(), LabError> {
    netns::require_root("lab bench")?;
    catch_interrupts();
    let s4_rate = (a.s4_rate_mbit > 0.0).then_some(a.s4_rate_mbit);
    let cases = plan(
        &a.scenarios,
        a.quick,
        a.runs,
        a.rate_mbit,
        s4_rate,
        a.max_time,
    )?;
    let mut rows = all_rows();
    if !a.rows.is_empty() {
        for r in &a.rows {
            if !rows.iter().any(|x| x.id == r) {
                return Err(LabError::Config(format!("unknown row {r:?}")));
            }
        }
        rows.retain(|r| a.rows.iter().any(|x| x == r.id));
    }
    if let Some(iw) = a.initial_window_packets {
        for r in &mut rows {
            if let ServerKind::Ours { variant, .. } = &mut r.server {
                variant.initial_window_packets.get_or_insert(iw);
            }
        }
    }
    rows.retain(|r| {
        r.only_in
            .is_none_or(|sc| cases.iter().any(|c| c.scenario == sc))
    });

    let mut env = BTreeMap::new();
    let mut not_run: BTreeMap<&'static str, String> = BTreeMap::new();
    let chroot = match servers::probe_chroot(&a.chroot) {
        Ok((curl, nginx)) => {
            env.insert("chroot_curl".to_string(), curl);
            env.insert(
                "nginx_h3".to_string(),
                format!(
                    "{nginx} (trixie chroot, serves the files itself, http3_stream_buffer_size 1m)"
                ),
            );
            Some(a.chroot.clone())
        }
        Err(why) => {
            if a.client == ClientArg::Curl {
                return Err(LabError::Failed(format!(
                    "the bench's client is curl 8.14 from a trixie chroot: {why}; or run with --client aioquic"
                )));
            }
            not_run.insert("nginx-1.26", why);
            None
        }
    };
    let exe = if rows
        .iter()
        .any(|r| matches!(r.server, ServerKind::Ours { .. }))
    {
        a.proxy.resolve()?
    } else {
        PathBuf::new()
    };

    env.insert("kernel".into(), first_line("uname", &["-r"]));
    env.insert("loadavg_start".into(), loadavg());
    env.insert(
        "cpus".into(),
        std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .unwrap_or_default(),
    );
    env.insert(
        "profile".into(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .into(),
    );
    env.insert(
        "commit".into(),
        first_line("git", &["rev-parse", "--short", "HEAD"]),
    );
    env.insert(
        "rmem_max".into(),
        std::fs::read_to_string("/proc/sys/net/core/rmem_max")
            .unwrap_or_default()
            .trim()
            .to_string(),
    );
    env.insert("nginx".into(), first_line("nginx", &["-v"]));
    env.insert(
        "caddy".into(),
        format!(
            "Caddy {} (reverse proxy to the ingress)",
            first_line("caddy", &["version"])
        ),
    );
    env.insert(
        "client".into(),
        match (a.client, &chroot) {
            (ClientArg::Curl, _) => format!(
                "{} (trixie chroot)",
                env.get("chroot_curl").cloned().unwrap_or_default()
            ),
            (ClientArg::Aioquic, _) => {
                format!("aioquic (h3) + {} (h2)", first_line("curl", &["--version"]))
            }
        },
    );
    env.insert(
        "rate".into(),
        format!(
            "rate limit (both directions, drop-tail queue of 100 ms at the rate): {} outside S4; in S4 {} (the curl h3 client cannot receive much above 150 Mbit/s on this machine), except the upload case marked 'no rate limit', which runs at the client's full speed so the server's UDP socket buffer is what is tested",
            a.rate_mbit.map(|r| format!("{r} Mbit/s")).unwrap_or_else(|| "none".into()),
            s4_rate.or(a.rate_mbit).map(|r| format!("{r} Mbit/s")).unwrap_or_else(|| "none".into())
        ),
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; numbers need a release build (`cargo build --release --workspace`)");
    }

    let mut s = Session::start(&a.prefix, &path_config(0.0, 0.0, 1500, true, None, None, 1))?;
    env.insert("chain_der_bytes".into(), s.pki.chain_der_bytes.to_string());
    // The h2 rows are only as good as the kernel's TCP controller: BBR shrugs off random
    // loss that any loss-based controller (ours included) must answer, so say which ran.
    if let Some(cc) = &a.tcp_congestion_control {
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
    let tcp_cc = netns::run(
        "ip",
        &[
            "netns",
            "exec",
            &s.names.server_ns,
            "cat",
            "/proc/sys/net/ipv4/tcp_congestion_control",
        ],
    )?;
    env.insert("tcp_cc".into(), tcp_cc.trim().to_string());
    let mut report = BenchReport {
        started: first_line("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
        quick: a.quick,
        cases: cases.clone(),
        ..BenchReport::default()
    };

    // Router capacity first, on a quiet lab.
    for (reverse, dir) in [(false, "client->server"), (true, "server->client")] {
        match throughput::measure(&s.names, Duration::from_secs(3), false, reverse) {
            Ok(t) => {
                eprintln!("router throughput {dir}: {:.0} Mbit/s", t.mbit_per_s);
                report.router_mbit.insert(dir.into(), t.mbit_per_s);
            }
            Err(e) => eprintln!("router throughput {dir}: {e}"),
        }
    }

    for f in [&MB1, &MB4, &MB5_7, &MB50, &MB20_UP] {
        if cases.iter().any(|c| c.file == f.name) {
            servers::make_file(&s.work, f.name, f.bytes)?;
        }
    }
    let script = s.work.path("h3get.py");
    std::fs::write(&script, include_str!("../scripts/h3get.py"))
        .map_err(|e| LabError::io("write h3get.py", e))?;
    let ns = s.names.server_ns.clone();
    let ingress = servers::start_ingress(&ns, &s.work, &s.pki)?;
    s.keep(ingress);
    let inside = match &chroot {
        Some(root) => Some((root.clone(), s.mount_chroot(root)?.inside.clone())),
        None => None,
    };
    for r in &rows {
        if not_run.contains_key(r.id) {
            continue;
        }
        let started = match &r.server {
            ServerKind::Ingress => Ok(None),
            ServerKind::Caddy => servers::start_caddy(&ns, &s.work, &s.pki, r.port).map(Some),
            ServerKind::NginxH3 => match &inside {
                Some((root, inside)) => {
                    servers::start_nginx_h3(&ns, &s.work, root, inside, r.port).map(Some)
                }
                None => Err(LabError::Failed("no trixie chroot".into())),
            },
            ServerKind::Ours {
                variant,
                metrics_port,
            } => servers::proxy_config(variant, r.port, *metrics_port, &s.pki).and_then(|y| {
                servers::start_proxy(&ns, &s.work, &exe, r.id, &y, *metrics_port).map(Some)
            }),
        };
        match started {
            Ok(Some(p)) => s.keep(p),
            Ok(None) => {}
            Err(e) => {
                not_run.insert(r.id, format!("server did not start: {e}"));
            }
        }
    }

    let mut runner = Runner {
        s,
        args: a,
        chroot: chroot.clone(),
        script,
    };
    // Warm-up: one clean 1 MB transfer per row proves the row works before it is measured.
    let warm = Case {
        scenario: "warm-up".into(),
        id: "warm-up".into(),
        label: "warm-up".into(),
        rtt_ms: 0.0,
        loss: 0.0,
        mtu: 1500,
        icmp: true,
        rule: None,
        file: MB1.name.into(),
        bytes: MB1.bytes,
        upload: false,
        runs: 1,
        rate_mbit: None,
        max_time: 15.0,
    };
    servers::make_file(&runner.s.work, MB1.name, MB1.bytes)?;
    for r in &rows {
        if not_run.contains_key(r.id) {
            continue;
        }
        let mut last = String::new();
        let mut ok = false;
        for _ in 0..3 {
            let x = runner.transfer(r, &warm)?;
            if x.ok {
                ok = true;
                break;
            }
            last = x.error.unwrap_or_default();
            std::thread::sleep(Duration::from_millis(500));
        }
        if !ok {
            not_run.insert(r.id, format!("warm-up transfer failed: {last}"));
        }
        eprintln!("warm-up {}: {}", r.id, if ok { "ok" } else { &last });
    }
    report.rows = rows
        .iter()
        .map(|r| RowInfo {
            id: r.id.into(),
            label: r.label.into(),
            proto: r.proto,
            only_in: r.only_in.map(str::to_string),
            not_run: not_run.get(r.id).cloned(),
        })
        .collect();

    // Why the run stopped early, if it did; results so far are written either way.
    let mut abort: Option<String> = None;
    'cases: for (ci, case) in cases.iter().enumerate() {
        let active: Vec<&Row> = rows
            .iter()
            .filter(|r| {
                !not_run.contains_key(r.id) && r.only_in.is_none_or(|sc| sc == case.scenario)
            })
            .collect();
        let mut cells: Vec<Cell> = active
            .iter()
            .map(|r| Cell {
                case_id: case.id.clone(),
                row: r.id.into(),
                ..Cell::default()
            })
            .collect();
        for run in 0..case.runs {
            let seed = (ci as u64 + 1) * 1000 + run as u64 + 1;
            for k in 0..active.len() {
                // Rotate the starting row every run so no row always goes first.
                let i = (k + run) % active.len();
                let row = active[i];
                if INTERRUPTED.load(Ordering::SeqCst) {
                    abort = Some("interrupted".into());
                    report.cells.extend(cells);
                    break 'cases;
                }
                let rule = case.rule.map(|position| {
                    let proto = match row.proto {
                        Proto::H2 => RuleProto::Tcp,
                        Proto::H3 => RuleProto::Udp,
                    };
                    (position, proto)
                });
                let cfg = path_config(
                    case.rtt_ms,
                    case.loss,
                    case.mtu,
                    case.icmp,
                    rule,
                    case.rate_mbit,
                    seed,
                );
                let x = match runner
                    .s
                    .set(&cfg)
                    .and_then(|()| runner.measured(row, case, &mut cells[i]))
                {
                    Ok(x) => x,
                    Err(e) => {
                        abort = Some(format!("lab error: {e}"));
                        report.cells.extend(cells);
                        break 'cases;
                    }
                };
                eprintln!(
                    "[{} {} {}/{}] {:<22} {}",
                    case.scenario,
                    case.label,
                    run + 1,
                    case.runs,
                    row.id,
                    if x.ok {
                        format!("{:.3} s", x.time_total)
                    } else {
                        format!("FAILED {}", x.error.clone().unwrap_or_default())
                    }
                );
                cells[i].samples.push(x);
            }
            if let Some(dead) = runner.s.dead_process() {
                abort = Some(format!("a server died: {dead}"));
                report.cells.extend(cells);
                break 'cases;
            }
        }
        report.cells.extend(cells);
    }
    env.insert("loadavg_end".into(), loadavg());
    if let Some(why) = &abort {
        env.insert("aborted".into(), why.clone());
        report.interrupted = true;
    }
    report.env = env;

    let md = report::render_markdown(&report);
    write_results(&a.out, &report, &md)?;
    println!("{md}");
    drop(runner);
    match abort {
        Some(why) => Err(LabError::Failed(format!(
            "bench stopped early ({why}); partial results written"
        ))),
        None => Ok(()),
    }
}

fn write_results(out: &Path, report: &BenchReport, md: &str) -> Result<(), LabError> {
    std::fs::create_dir_all(out)
        .map_err(|e| LabError::io(format!("mkdir {}", out.display()), e))?;
    let stamp: String = report
        .started
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let json = serde_json::to_string_pretty(report).map_err(|e| LabError::Failed(e.to_string()))?;
    for name in [format!("bench-{stamp}"), "bench-latest".to_string()] {
        std::fs::write(out.join(format!("{name}.json")), &json)
            .map_err(|e| LabError::io("write bench json", e))?;
        std::fs::write(out.join(format!("{name}.md")), md)
            .map_err(|e| LabError::io("write bench markdown", e))?;
    }
    eprintln!("results: {}/bench-{stamp}.{{json,md}}", out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sc(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn full_plan_matches_the_issue() {
        let p = plan(
            &sc(&["S1", "S2", "S3", "S4", "S5"]),
            false,
            None,
            None,
            Some(100.0),
            30.0,
        )
        .unwrap();
        let ids: Vec<&str> = p.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(
            ids,
            vec![
                "S1-200ms-1m",
                "S1-200ms-4m",
                "S1-100ms-1m",
                "S2-200ms-1m-drop",
                "S2-100ms-1m-drop",
                "S2-200ms-1m-drophs",
                "S3-200ms-1m-loss1",
                "S3-200ms-1m-loss2",
                "S4-11ms-5.7m-100mbit",
                "S4-11ms-50m-100mbit",
                "S4-42ms-5.7m-100mbit",
                "S4-42ms-50m-100mbit",
                "S4-42ms-20m-100mbit",
                "S4-42ms-20m-unlimited",
                "S5-42ms-4m",
                "S5-42ms-4m-mtu1400",
                "S5-42ms-4m-mtu1280",
            ]
        );
        assert!(p
            .iter()
            .filter(|c| c.scenario == "S3")
            .all(|c| c.runs == 40));
        assert!(p
            .iter()
            .filter(|c| c.scenario != "S3")
            .all(|c| c.runs >= 10));
        let up: Vec<&Case> = p.iter().filter(|c| c.upload).collect();
        assert_eq!(up.len(), 2);
        assert!(up.iter().all(|c| c.bytes == 20 << 20 && c.max_time >= 60.0));
        assert_eq!(up[0].rate_mbit, Some(100.0));
        assert_eq!(
            up[1].rate_mbit, None,
            "the buffer-stress upload has no limit"
        );
        assert!(p
            .iter()
            .filter(|c| c.scenario != "S4")
            .all(|c| c.rate_mbit.is_none()));
        assert!(p.iter().filter(|c| c.mtu < 1500).all(|c| !c.icmp));
    }

    #[test]
    fn quick_plan_and_overrides() {
        let p = plan(&sc(&["s3"]), true, None, None, None, 30.0).unwrap();
        assert!(p.iter().all(|c| c.runs == 10));
        let p = plan(&sc(&["S4"]), false, Some(2), None, Some(200.0), 30.0).unwrap();
        assert!(p.iter().all(|c| c.runs == 2));
        assert!(p
            .iter()
            .filter(|c| !c.id.ends_with("unlimited"))
            .all(|c| c.rate_mbit == Some(200.0)));
        let p = plan(&sc(&["S4"]), false, None, None, None, 30.0).unwrap();
        assert_eq!(p.iter().filter(|c| c.upload).count(), 1);
        assert!(p.iter().all(|c| c.rate_mbit.is_none()));
        assert!(plan(&sc(&["S9"]), false, None, None, None, 30.0).is_err());
    }

    #[test]
    fn rows_have_distinct_ports() {
        let rows = all_rows();
        let mut ports: Vec<u16> = rows.iter().map(|r| r.port).collect();
        ports.sort();
        ports.dedup();
        assert_eq!(ports.len(), rows.len());
        assert_eq!(rows.iter().filter(|r| r.only_in == Some("S4")).count(), 1);
    }
}
