//! `lab smoke`: the CI proof that the lab works end to end, with what CI has (system curl for
//! h2, aioquic for h3, Caddy as the independent h3 server, our proxy when the binary has one).
//! One transfer per scenario, no timing assertions except lower bounds the emulator
//! guarantees; the router's counters are checked after every step.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use super::client::{self, Expect, Proto, Sample};
use super::emu::{Counters, EmuConfig, Position, RuleProto};
use super::netns;
use super::servers::{self, ProxyBinArg, ProxyVariant, INGRESS_PORT};
use super::session::Session;
use super::topology::{CLIENT_V4, CLIENT_V6, SERVER_V4, SERVER_V6};
use super::{path_config, LabError};

#[derive(Args, Debug, Clone)]
pub struct SmokeArgs {
    /// Name prefix of the smoke lab (kept apart from a lab or bench that may be running).
    #[arg(long, default_value = "h3smoke")]
    pub prefix: String,
    #[command(flatten)]
    pub proxy: ProxyBinArg,
}

const CADDY_PORT: u16 = 8443;
const PROXY_PORT: u16 = 4433;
const PROXY_METRICS_PORT: u16 = 9480;
const H3GET: &str = include_str!("../scripts/h3get.py");

#[derive(Debug, Clone, Serialize)]
struct Check {
    name: String,
    ok: bool,
    detail: String,
}

#[derive(Default, Serialize)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) {
        let detail = detail.into();
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        self.checks.push(Check {
            name: name.to_string(),
            ok,
            detail,
        });
    }
    fn failures(&self) -> Vec<&Check> {
        self.checks.iter().filter(|c| !c.ok).collect()
    }
}

/// An HTTP/3 server the smoke downloads from with aioquic.
struct H3Target {
    name: &'static str,
    port: u16,
}

pub fn run(a: &SmokeArgs) -> Result<(), LabError> {
    if !netns::is_root() {
        eprintln!("SKIPPED: needs root: `lab smoke` creates network namespaces and TUN devices");
        return Err(LabError::NotRoot("lab smoke".into()));
    }
    let exe = a.proxy.resolve()?;
    let started = Instant::now();
    let mut report = Report::default();
    let result = smoke(a, &exe, &mut report);
    let secs = started.elapsed().as_secs_f64();
    let out = super::output_dir();
    if std::fs::create_dir_all(&out).is_ok() {
        let _ = std::fs::write(
            out.join("smoke-latest.json"),
            serde_json::to_string_pretty(&report).unwrap_or_default(),
        );
    }
    result?;
    let failed = report.failures();
    if failed.is_empty() {
        println!(
            "smoke: all {} checks passed in {secs:.1} s",
            report.checks.len()
        );
        Ok(())
    } else {
        Err(LabError::Failed(format!(
            "smoke: {} of {} checks failed in {secs:.1} s: {}",
            failed.len(),
            report.checks.len(),
            failed
                .iter()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )))
    }
}

/// The project's aioquic test client when the source tree has it, else the lab's own script.
fn h3_client(s: &Session) -> Result<client::AioquicClient, LabError> {
    let candidates = [
        std::env::current_dir()
            .unwrap_or_default()
            .join("tests/py/h3client.py"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/py/h3client.py"),
    ];
    if let Some(p) = candidates.into_iter().find(|p| p.exists()) {
        return Ok(client::AioquicClient::Harness(p));
    }
    let own = s.work.path("h3get.py");
    std::fs::write(&own, H3GET).map_err(|e| LabError::io("write h3get.py", e))?;
    Ok(client::AioquicClient::Own(own))
}

fn clean() -> EmuConfig {
    path_config(0.0, 0.0, 1500, true, None, None, 1)
}

fn smoke(a: &SmokeArgs, exe: &Path, report: &mut Report) -> Result<(), LabError> {
    let mut s = Session::start(&a.prefix, &clean())?;
    println!(
        "lab {} up; certificate chain {} DER bytes",
        s.names.prefix, s.pki.chain_der_bytes
    );
    for (name, size) in [
        ("1m.bin", 1u64 << 20),
        ("4m.bin", 4 << 20),
        ("5.7m.bin", 5_700_000),
    ] {
        servers::make_file(&s.work, name, size)?;
    }
    let script = h3_client(&s)?;
    println!("h3 client: {}", script.script().display());

    let ingress = servers::start_ingress(&s.names.server_ns, &s.work, &s.pki)?;
    s.keep(ingress);
    let caddy = servers::start_caddy(&s.names.server_ns, &s.work, &s.pki, CADDY_PORT)?;
    s.keep(caddy);
    let mut targets = vec![H3Target {
        name: "caddy",
        port: CADDY_PORT,
    }];
    let yaml = servers::proxy_config(
        &ProxyVariant {
            congestion_control: "cubic-hs",
            buffer_bytes: None,
            initial_window_packets: None,
        },
        PROXY_PORT,
        PROXY_METRICS_PORT,
        &s.pki,
    )?;
    let p = servers::start_proxy(
        &s.names.server_ns,
        &s.work,
        exe,
        "h3-ingress",
        &yaml,
        PROXY_METRICS_PORT,
    )?;
    s.keep(p);
    targets.push(H3Target {
        name: "h3-ingress",
        port: PROXY_PORT,
    });

    mechanics(&mut s, report)?;
    scenarios(&mut s, report, &targets, &script)?;
    if let Some(dead) = s.dead_process() {
        report.check("servers stayed up", false, dead);
    }
    Ok(())
}

// ---------------------------------------------------------------- emulator mechanics

/// Result of sending one UDP datagram from the server namespace to the client namespace.
struct Probe {
    received: Option<usize>,
    /// IP_MTU / IPV6_MTU of the sender's connected socket afterwards (the learned path MTU).
    sender_path_mtu: i32,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: setsockopt with a pointer to a live c_int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getsockopt_int(fd: i32, level: i32, name: i32) -> std::io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: getsockopt into a live c_int with its size.
    let rc = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) };
    if rc == 0 {
        Ok(v)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn udp_probe(s: &Session, size: usize, df: bool, v6: bool) -> Result<Probe, LabError> {
    let (client, server) = if v6 {
        (IpAddr::V6(CLIENT_V6), IpAddr::V6(SERVER_V6))
    } else {
        (IpAddr::V4(CLIENT_V4), IpAddr::V4(SERVER_V4))
    };
    let (tx, rx) = mpsc::channel::<u16>();
    let receiver = netns::spawn_in(&s.names.client_ns, move || {
        let sock = UdpSocket::bind(SocketAddr::new(client, 0))
            .map_err(|e| LabError::io("probe bind", e))?;
        let _ = tx.send(sock.local_addr().map(|a| a.port()).unwrap_or(0));
        sock.set_read_timeout(Some(Duration::from_millis(800)))
            .map_err(|e| LabError::io("probe timeout", e))?;
        let mut buf = vec![0u8; 65536];
        match sock.recv(&mut buf) {
            Ok(n) => Ok(Some(n)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(LabError::io("probe recv", e)),
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(5))
        .map_err(|_| LabError::Failed("probe receiver did not start".into()))?;
    let sender = netns::spawn_in(&s.names.server_ns, move || {
        let sock = UdpSocket::bind(SocketAddr::new(server, 0))
            .map_err(|e| LabError::io("probe bind", e))?;
        sock.connect(SocketAddr::new(client, port))
            .map_err(|e| LabError::io("probe connect", e))?;
        let fd = sock.as_raw_fd();
        let (level, opt, mtu_opt, val) = match (v6, df) {
            (false, true) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_MTU,
                libc::IP_PMTUDISC_DO,
            ),
            (false, false) => (
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_MTU,
                libc::IP_PMTUDISC_DONT,
            ),
            (true, _) => (
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_MTU,
                libc::IPV6_PMTUDISC_DO,
            ),
        };
        setsockopt_int(fd, level, opt, val).map_err(|e| LabError::io("IP_MTU_DISCOVER", e))?;
        sock.send(&vec![0x42u8; size])
            .map_err(|e| LabError::io("probe send", e))?;
        // The router answers at once; give the kernel a moment to process the ICMP error.
        std::thread::sleep(Duration::from_millis(300));
        getsockopt_int(fd, level, mtu_opt).map_err(|e| LabError::io("IP_MTU", e))
    });
    let sender_path_mtu = sender
        .join()
        .map_err(|_| LabError::Failed("probe sender panicked".into()))??;
    let received = receiver
        .join()
        .map_err(|_| LabError::Failed("probe receiver panicked".into()))??;
    Ok(Probe {
        received,
        sender_path_mtu,
    })
}

fn counted<T>(
    s: &Session,
    f: impl FnOnce() -> Result<T, LabError>,
) -> Result<(T, Counters), LabError> {
    let before = s.snapshot()?.counters;
    let r = f()?;
    // Let the delay line drain, so released (or rule-dropped) packets are counted.
    let deadline = Instant::now() + Duration::from_secs(2);
    while s.snapshot()?.queued > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let after = s.snapshot()?.counters;
    Ok((r, after.delta(&before)))
}

fn mechanics(s: &mut Session, report: &mut Report) -> Result<(), LabError> {
    // Delay: a TCP handshake takes at least one emulated round trip.
    s.set(&path_config(100.0, 0.0, 1500, true, None, None, 1))?;
    let t = netns::spawn_in(&s.names.client_ns, || {
        let start = Instant::now();
        TcpStream::connect_timeout(
            &SocketAddr::new(IpAddr::V4(SERVER_V4), INGRESS_PORT),
            Duration::from_secs(5),
        )
        .map_err(|e| LabError::io("connect", e))?;
        Ok(start.elapsed())
    })
    .join()
    .map_err(|_| LabError::Failed("connect thread panicked".into()))??;
    report.check(
        "delay: TCP connect over a 100 ms RTT path takes >= 100 ms",
        t >= Duration::from_millis(100),
        format!("{:.1} ms", t.as_secs_f64() * 1000.0),
    );

    // MTU black hole: DF datagram above the MTU vanishes, no ICMP, sender learns nothing.
    s.set(&path_config(0.0, 0.0, 1280, false, None, None, 1))?;
    let (p, c) = counted(s, || udp_probe(s, 1400, true, false))?;
    report.check(
        "MTU 1280 black hole drops a 1428-byte DF datagram silently",
        p.received.is_none()
            && c.s2c.drop_mtu == 1
            && c.s2c.icmp_sent == 0
            && p.sender_path_mtu == 1500,
        format!(
            "received {:?}, drop_mtu {}, icmp_sent {}, sender path MTU {}",
            p.received, c.s2c.drop_mtu, c.s2c.icmp_sent, p.sender_path_mtu
        ),
    );

    // No DF: the router fragments, the receiver's kernel reassembles.
    let (p, c) = counted(s, || udp_probe(s, 1400, false, false))?;
    report.check(
        "IPv4 without DF above the MTU is fragmented and reassembled",
        p.received == Some(1400) && c.s2c.fragments_created == 2 && c.s2c.ipv4_udp_no_df == 1,
        format!(
            "received {:?}, fragments_created {}, ipv4_udp_no_df {}",
            p.received, c.s2c.fragments_created, c.s2c.ipv4_udp_no_df
        ),
    );

    // ICMP on: the sender's kernel accepts our frag-needed / packet-too-big and lowers its PMTU.
    s.set(&path_config(0.0, 0.0, 1280, true, None, None, 1))?;
    for v6 in [false, true] {
        let (p, c) = counted(s, || udp_probe(s, 1400, true, v6))?;
        let fam = if v6 {
            "IPv6 packet-too-big"
        } else {
            "IPv4 frag-needed"
        };
        report.check(
            &format!("{fam} reaches the sender, which learns path MTU 1280"),
            p.received.is_none() && c.s2c.icmp_sent == 1 && p.sender_path_mtu == 1280,
            format!(
                "received {:?}, icmp_sent {}, sender path MTU {}",
                p.received, c.s2c.icmp_sent, p.sender_path_mtu
            ),
        );
    }
    s.flush_route_caches()?;
    Ok(())
}

// ---------------------------------------------------------------- scenario downloads

fn h2_fetch(
    s: &Session,
    addr: IpAddr,
    path: &str,
    upload: Option<&Path>,
    bytes: u64,
    max_time: f64,
) -> Result<Sample, LabError> {
    let ca = s.pki.root.to_string_lossy().into_owned();
    let up = upload.map(|p| p.to_string_lossy().into_owned());
    let args = client::curl_args(
        Proto::H2,
        addr,
        INGRESS_PORT,
        path,
        &ca,
        up.as_deref(),
        max_time,
    );
    client::run_curl(
        &s.names.client_ns,
        None,
        &args,
        Expect {
            proto: Proto::H2,
            bytes,
            upload: upload.is_some(),
        },
    )
}

fn h3_fetch(
    s: &Session,
    h3: &client::AioquicClient,
    t: &H3Target,
    path: &str,
    upload: Option<&Path>,
    bytes: u64,
    max_time: f64,
) -> Result<Sample, LabError> {
    let req = client::H3Get {
        script: h3.script(),
        ca: &s.pki.root,
        port: t.port,
        path,
        upload,
        max_time,
    };
    let expect = Expect {
        proto: Proto::H3,
        bytes,
        upload: upload.is_some(),
    };
    match h3 {
        client::AioquicClient::Harness(_) => client::run_h3client(&s.names.client_ns, &req, expect),
        client::AioquicClient::Own(_) => client::run_h3get(&s.names.client_ns, &req, expect),
    }
}

fn describe(x: &Sample) -> String {
    if x.ok {
        format!("{:.2} s", x.time_total)
    } else {
        format!("failed: {}", x.error.clone().unwrap_or_default())
    }
}

fn no_drops(c: &Counters) -> bool {
    [&c.c2s, &c.s2c]
        .iter()
        .all(|d| d.drop_random + d.drop_rule + d.drop_queue + d.drop_mtu + d.drop_write == 0)
}

fn uploaded_size(s: &Session, name: &str) -> u64 {
    std::fs::metadata(s.work.path("upload").join(name))
        .map(|m| m.len())
        .unwrap_or(0)
}

fn scenarios(
    s: &mut Session,
    report: &mut Report,
    targets: &[H3Target],
    script: &client::AioquicClient,
) -> Result<(), LabError> {
    let v4 = IpAddr::V4(SERVER_V4);
    let v6 = IpAddr::V6(SERVER_V6);
    const MB1: u64 = 1 << 20;

    // S1: clean 200 ms path.
    s.set(&path_config(200.0, 0.0, 1500, true, None, None, 1))?;
    for (fam, addr) in [("IPv4", v4), ("IPv6", v6)] {
        let (x, c) = counted(s, || h2_fetch(s, addr, "/1m.bin", None, MB1, 30.0))?;
        let fam_ok = if fam == "IPv6" {
            c.c2s.ipv6_packets > 0 && c.c2s.ipv4_packets == 0
        } else {
            c.c2s.ipv4_packets > 0
        };
        report.check(
            &format!("S1 h2 {fam} 1 MB at 200 ms"),
            x.ok && no_drops(&c) && fam_ok,
            format!("{}, {} TCP packets s2c", describe(&x), c.s2c.tcp_packets),
        );
    }
    for t in targets {
        let (x, c) = counted(s, || h3_fetch(s, script, t, "/1m.bin", None, MB1, 30.0))?;
        report.check(
            &format!(
                "S1 h3 {} 1 MB at 200 ms, DF on every server datagram",
                t.name
            ),
            x.ok && no_drops(&c) && c.s2c.ipv4_udp_df > 0 && c.s2c.ipv4_udp_no_df == 0,
            format!(
                "{}, server UDP/IPv4 datagrams with DF {} without {}",
                describe(&x),
                c.s2c.ipv4_udp_df,
                c.s2c.ipv4_udp_no_df
            ),
        );
    }

    // S2: the last datagram of the server's first flight is dropped, once per connection.
    for t in targets {
        s.set(&path_config(
            100.0,
            0.0,
            1500,
            true,
            Some((Position::Last, RuleProto::Udp)),
            None,
            1,
        ))?;
        let (x, c) = counted(s, || h3_fetch(s, script, t, "/1m.bin", None, MB1, 30.0))?;
        let r = &c.rule;
        report.check(
            &format!(
                "S2 h3 {}: first-flight rule dropped exactly one datagram",
                t.name
            ),
            x.ok && r.flights == 1
                && r.drops == 1
                && r.connections_with_drop == 1
                && c.s2c.drop_rule == 1,
            format!(
                "{}, flights {}, flight sizes {:?}, rule drops {}",
                describe(&x),
                r.flights,
                r.flight_sizes,
                r.drops
            ),
        );
    }
    s.set(&path_config(
        100.0,
        0.0,
        1500,
        true,
        Some((Position::Last, RuleProto::Tcp)),
        None,
        1,
    ))?;
    let (x, c) = counted(s, || h2_fetch(s, v4, "/1m.bin", None, MB1, 30.0))?;
    let r = &c.rule;
    report.check(
        "S2 h2: first-flight rule dropped exactly one TLS segment",
        x.ok && r.flights == 1 && r.drops == 1 && c.s2c.drop_rule == 1,
        format!(
            "{}, flight sizes {:?} segments, rule drops {}",
            describe(&x),
            r.flight_sizes,
            r.drops
        ),
    );

    // S3: 1 % random loss both ways.
    s.set(&path_config(100.0, 0.01, 1500, true, None, None, 3))?;
    let (x, c2) = counted(s, || h2_fetch(s, v4, "/1m.bin", None, MB1, 30.0))?;
    report.check(
        "S3 h2 1 MB with 1 % loss",
        x.ok,
        format!(
            "{}, random drops {}+{}",
            describe(&x),
            c2.c2s.drop_random,
            c2.s2c.drop_random
        ),
    );
    let mut random = c2.c2s.drop_random + c2.s2c.drop_random;
    for t in targets {
        let (x, c) = counted(s, || h3_fetch(s, script, t, "/1m.bin", None, MB1, 30.0))?;
        random += c.c2s.drop_random + c.s2c.drop_random;
        report.check(
            &format!("S3 h3 {} 1 MB with 1 % loss", t.name),
            x.ok,
            format!(
                "{}, random drops {}+{}",
                describe(&x),
                c.c2s.drop_random,
                c.s2c.drop_random
            ),
        );
    }
    report.check(
        "S3 random loss actually dropped packets",
        random > 0,
        format!("{random} packets"),
    );

    // S4: bigger transfers at 42 ms, uploads with UDP buffer counters.
    s.set(&path_config(42.0, 0.0, 1500, true, None, None, 1))?;
    let x = h2_fetch(s, v4, "/5.7m.bin", None, 5_700_000, 60.0)?;
    report.check("S4 h2 5.7 MB at 42 ms", x.ok, describe(&x));
    let up_src = s.work.path("www").join("4m.bin");
    let up_len = 4u64 << 20;
    let x = h2_fetch(s, v4, "/upload/smoke-h2.bin", Some(&up_src), up_len, 60.0)?;
    report.check(
        "S4 h2 4 MB upload (WebDAV PUT) stored intact",
        x.ok && uploaded_size(s, "smoke-h2.bin") == up_len,
        describe(&x),
    );
    for t in targets {
        let x = h3_fetch(s, script, t, "/5.7m.bin", None, 5_700_000, 60.0)?;
        report.check(
            &format!("S4 h3 {} 5.7 MB at 42 ms", t.name),
            x.ok,
            describe(&x),
        );
        let name = format!("smoke-{}.bin", t.name);
        let before = s.udp_stats(true)?;
        let x = h3_fetch(
            s,
            script,
            t,
            &format!("/upload/{name}"),
            Some(&up_src),
            up_len,
            60.0,
        )?;
        let d = s.udp_stats(true)?.delta(&before);
        report.check(
            &format!("S4 h3 {} 4 MB upload stored intact", t.name),
            x.ok && uploaded_size(s, &name) == up_len,
            format!(
                "{}, server UDP RcvbufErrors +{} (reported, not asserted)",
                describe(&x),
                d.rcvbuf_errors
            ),
        );
    }

    // S5: path MTU 1280, ICMP dropped.
    s.set(&path_config(42.0, 0.0, 1280, false, None, None, 1))?;
    for t in targets {
        let (x, c) = counted(s, || h3_fetch(s, script, t, "/1m.bin", None, MB1, 30.0))?;
        report.check(
            &format!(
                "S5 h3 {} through an MTU 1280 black hole: no fragments, DF everywhere",
                t.name
            ),
            x.ok && c.s2c.fragments_created + c.s2c.ipv4_fragments_in == 0
                && c.s2c.ipv4_udp_no_df == 0
                && c.s2c.ipv4_udp_df > 0,
            format!(
                "{}, fragments {}, server datagrams without DF {}, oversized dropped {}",
                describe(&x),
                c.s2c.fragments_created + c.s2c.ipv4_fragments_in,
                c.s2c.ipv4_udp_no_df,
                c.s2c.drop_mtu
            ),
        );
    }
    // TCP with a 1460-byte MSS cannot cross the black hole (seed 003) ...
    let (x, c) = counted(s, || h2_fetch(s, v4, "/1m.bin", None, MB1, 5.0))?;
    report.check(
        "S5 h2 stalls in the MTU 1280 black hole (TCP needs ICMP)",
        !x.ok && c.s2c.drop_mtu > 0 && c.s2c.icmp_sent == 0,
        format!("{}, oversized dropped {}", describe(&x), c.s2c.drop_mtu),
    );
    // ... and gets through once the router sends frag-needed.
    s.set(&path_config(42.0, 0.0, 1280, true, None, None, 1))?;
    let (x, c) = counted(s, || h2_fetch(s, v4, "/1m.bin", None, MB1, 30.0))?;
    report.check(
        "S5 h2 with ICMP on: PMTU discovery works through the router",
        x.ok && c.s2c.icmp_sent > 0,
        format!(
            "{}, ICMP frag-needed sent {}",
            describe(&x),
            c.s2c.icmp_sent
        ),
    );
    s.flush_route_caches()?;
    Ok(())
}
