//! The smoke steps of the scenario table (`scenario::Scenario::smoke`): one function per
//! [`SmokeStep`] kind, each a few transfers with counter checks.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use super::probe::{counted, wait_quiet};
use super::{H3Target, Report};
use crate::client::{self, Expect, Proto, Sample};
use crate::emu::{Counters, EmuConfig, RuleProto};
use crate::scenario::{FileSpec, PathSpec, SmokeStep, TcpCc, BULK, MB1, MB4, MB5_7, SCENARIOS};
use crate::servers::INGRESS_PORT;
use crate::session::Session;
use crate::share::{self, ShareSample, Window};
use crate::topology::{CLIENT2_V4, SERVER_V4, SERVER_V6};
use crate::LabError;

/// The h3 servers and the aioquic client that talks to them.
pub(super) struct H3<'a> {
    pub servers: &'a [H3Target],
    pub client: &'a client::AioquicClient,
}

/// One request: what to fetch (or upload) and how long it may take.
struct Get {
    path: String,
    upload: Option<PathBuf>,
    bytes: u64,
    max_time: f64,
}

impl Get {
    fn download(f: &FileSpec, max_time: f64) -> Get {
        Get {
            path: format!("/{}", f.name),
            upload: None,
            bytes: f.bytes,
            max_time,
        }
    }
    /// A PUT of `f` (from the document root) to `/upload/<name>`.
    fn upload(s: &Session, f: &FileSpec, name: &str, max_time: f64) -> Get {
        Get {
            path: format!("/upload/{name}"),
            upload: Some(s.work.path("www").join(f.name)),
            bytes: f.bytes,
            max_time,
        }
    }
}

const V4: IpAddr = IpAddr::V4(SERVER_V4);
const V6: IpAddr = IpAddr::V6(SERVER_V6);

/// Every scenario's smoke steps, in the table's order.
pub(super) fn run_all(s: &mut Session, r: &mut Report, h3: &H3) -> Result<(), LabError> {
    for sc in SCENARIOS {
        for step in sc.smoke {
            let id = sc.id;
            match *step {
                SmokeStep::CleanDownload(p) => clean_download(s, r, h3, id, p)?,
                SmokeStep::FirstFlightDrop(p) => first_flight_drop(s, r, h3, id, p)?,
                SmokeStep::RandomLoss { path, seed } => random_loss(s, r, h3, id, path, seed)?,
                SmokeStep::LargeTransfers(p) => large_transfers(s, r, h3, id, p)?,
                SmokeStep::MtuBlackHole(p) => mtu_black_hole(s, r, h3, id, p)?,
                SmokeStep::Share {
                    path,
                    rate_mbit,
                    window_s,
                } => share_step(s, r, h3, id, path, (rate_mbit, window_s))?,
                SmokeStep::LoopbackCpu { file } => loopback_cpu(s, r, h3, id, file)?,
            }
        }
    }
    Ok(())
}

fn h2(s: &Session, addr: IpAddr, g: &Get) -> Result<Sample, LabError> {
    h2_from(s, addr, g, None)
}

/// An h2 transfer; with `from`, curl binds that client address.
fn h2_from(s: &Session, addr: IpAddr, g: &Get, from: Option<Ipv4Addr>) -> Result<Sample, LabError> {
    let ca = s.pki.root.to_string_lossy().into_owned();
    let up = g.upload.as_ref().map(|p| p.to_string_lossy().into_owned());
    let mut args = client::curl_args(
        Proto::H2,
        addr,
        INGRESS_PORT,
        &g.path,
        &ca,
        up.as_deref(),
        g.max_time,
    );
    if let Some(ip) = from {
        args.splice(0..0, ["--interface".to_string(), ip.to_string()]);
    }
    let expect = Expect {
        proto: Proto::H2,
        bytes: g.bytes,
        upload: g.upload.is_some(),
    };
    client::run_curl(&s.names.client_ns, None, &args, expect)
}

fn h3_get(s: &Session, h3: &H3, t: &H3Target, g: &Get) -> Result<Sample, LabError> {
    h3_get_in(s, h3, t, g, &s.names.client_ns)
}

/// An h3 transfer by the aioquic client in namespace `ns`.
fn h3_get_in(s: &Session, h3: &H3, t: &H3Target, g: &Get, ns: &str) -> Result<Sample, LabError> {
    let req = client::H3Get {
        script: h3.client.script(),
        ca: &s.pki.root,
        port: t.port,
        path: &g.path,
        upload: g.upload.as_deref(),
        max_time: g.max_time,
        bind: None,
    };
    let expect = Expect {
        proto: Proto::H3,
        bytes: g.bytes,
        upload: g.upload.is_some(),
    };
    match h3.client {
        client::AioquicClient::Harness(_) => client::run_h3client(ns, &req, expect),
        client::AioquicClient::Own(_) => client::run_h3get(ns, &req, expect),
    }
}

/// The router settings of a smoke step: the drop rule for `proto`, no bottleneck.
fn emu(p: PathSpec, proto: RuleProto, seed: u64) -> EmuConfig {
    p.emu(proto, None, seed)
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

fn clean_download(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
) -> Result<(), LabError> {
    s.set(&emu(p, RuleProto::Any, 1))?;
    let s = &*s;
    let get = Get::download(&MB1, 30.0);
    for (fam, addr) in [("IPv4", V4), ("IPv6", V6)] {
        let (x, c) = counted(s, || h2(s, addr, &get))?;
        let fam_ok = if fam == "IPv6" {
            c.c2s.ipv6_packets > 0 && c.c2s.ipv4_packets == 0
        } else {
            c.c2s.ipv4_packets > 0
        };
        r.check(
            &format!("{id} h2 {fam} {} at {:.0} ms", MB1.label, p.rtt_ms),
            x.ok && no_drops(&c) && fam_ok,
            format!("{}, {} TCP packets s2c", describe(&x), c.s2c.tcp_packets),
        );
    }
    for t in h3.servers {
        let (x, c) = counted(s, || h3_get(s, h3, t, &get))?;
        r.check(
            &format!(
                "{id} h3 {} {} at {:.0} ms, DF on every server datagram",
                t.name, MB1.label, p.rtt_ms
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
    Ok(())
}

fn first_flight_drop(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
) -> Result<(), LabError> {
    let get = Get::download(&MB1, 30.0);
    s.set(&emu(p, RuleProto::Udp, 1))?;
    for t in h3.servers {
        let (x, c) = counted(s, || h3_get(s, h3, t, &get))?;
        let rule = &c.rule;
        r.check(
            &format!(
                "{id} h3 {}: first-flight rule dropped exactly one datagram",
                t.name
            ),
            x.ok && rule.flights == 1
                && rule.drops == 1
                && rule.connections_with_drop == 1
                && c.s2c.drop_rule == 1,
            format!(
                "{}, flights {}, flight sizes {:?}, rule drops {}",
                describe(&x),
                rule.flights,
                rule.flight_sizes,
                rule.drops
            ),
        );
    }
    s.set(&emu(p, RuleProto::Tcp, 1))?;
    let (x, c) = counted(s, || h2(s, V4, &get))?;
    let rule = &c.rule;
    r.check(
        &format!("{id} h2: first-flight rule dropped exactly one TLS segment"),
        x.ok && rule.flights == 1 && rule.drops == 1 && c.s2c.drop_rule == 1,
        format!(
            "{}, flight sizes {:?} segments, rule drops {}",
            describe(&x),
            rule.flight_sizes,
            rule.drops
        ),
    );
    Ok(())
}

fn random_loss(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
    seed: u64,
) -> Result<(), LabError> {
    s.set(&emu(p, RuleProto::Any, seed))?;
    let s = &*s;
    let get = Get::download(&MB1, 30.0);
    let loss = format!("{} with {:.0} % loss", MB1.label, p.loss * 100.0);
    let drops = |c: &Counters| format!("random drops {}+{}", c.c2s.drop_random, c.s2c.drop_random);
    let (x, c) = counted(s, || h2(s, V4, &get))?;
    r.check(
        &format!("{id} h2 {loss}"),
        x.ok,
        format!("{}, {}", describe(&x), drops(&c)),
    );
    let mut random = c.c2s.drop_random + c.s2c.drop_random;
    for t in h3.servers {
        let (x, c) = counted(s, || h3_get(s, h3, t, &get))?;
        random += c.c2s.drop_random + c.s2c.drop_random;
        r.check(
            &format!("{id} h3 {} {loss}", t.name),
            x.ok,
            format!("{}, {}", describe(&x), drops(&c)),
        );
    }
    r.check(
        &format!("{id} random loss actually dropped packets"),
        random > 0,
        format!("{random} packets"),
    );
    Ok(())
}

fn large_transfers(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
) -> Result<(), LabError> {
    s.set(&emu(p, RuleProto::Any, 1))?;
    let down = Get::download(&MB5_7, 60.0);
    let at = format!("at {:.0} ms", p.rtt_ms);
    let x = h2(s, V4, &down)?;
    r.check(&format!("{id} h2 {} {at}", MB5_7.label), x.ok, describe(&x));
    let up = Get::upload(s, &MB4, "smoke-h2.bin", 60.0);
    let x = h2(s, V4, &up)?;
    r.check(
        &format!("{id} h2 {} upload (WebDAV PUT) stored intact", MB4.label),
        x.ok && uploaded_size(s, "smoke-h2.bin") == MB4.bytes,
        describe(&x),
    );
    for t in h3.servers {
        let x = h3_get(s, h3, t, &down)?;
        r.check(
            &format!("{id} h3 {} {} {at}", t.name, MB5_7.label),
            x.ok,
            describe(&x),
        );
        let name = format!("smoke-{}.bin", t.name);
        let up = Get::upload(s, &MB4, &name, 60.0);
        let before = s.udp_stats(true)?;
        let x = h3_get(s, h3, t, &up)?;
        let d = s.udp_stats(true)?.delta(&before);
        r.check(
            &format!("{id} h3 {} {} upload stored intact", t.name, MB4.label),
            x.ok && uploaded_size(s, &name) == MB4.bytes,
            format!(
                "{}, server UDP RcvbufErrors +{} (reported, not asserted)",
                describe(&x),
                d.rcvbuf_errors
            ),
        );
    }
    Ok(())
}

fn mtu_black_hole(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
) -> Result<(), LabError> {
    let mtu = p.mtu;
    s.set(&emu(p, RuleProto::Any, 1))?;
    let get = Get::download(&MB1, 30.0);
    for t in h3.servers {
        let (x, c) = counted(s, || h3_get(s, h3, t, &get))?;
        let frags = c.s2c.fragments_created + c.s2c.ipv4_fragments_in;
        r.check(
            &format!(
                "{id} h3 {} through an MTU {mtu} black hole: no fragments, DF everywhere",
                t.name
            ),
            x.ok && frags == 0 && c.s2c.ipv4_udp_no_df == 0 && c.s2c.ipv4_udp_df > 0,
            format!(
                "{}, fragments {frags}, server datagrams without DF {}, oversized dropped {}",
                describe(&x),
                c.s2c.ipv4_udp_no_df,
                c.s2c.drop_mtu
            ),
        );
    }
    // TCP with a 1460-byte MSS cannot cross the black hole: it needs the ICMP error to learn
    // the smaller MTU (docs/field-reports.md, "003 ICMP-blind MTU black hole") ...
    let stall = Get::download(&MB1, 5.0);
    let (x, c) = counted(s, || h2(s, V4, &stall))?;
    r.check(
        &format!("{id} h2 stalls in the MTU {mtu} black hole (TCP needs ICMP)"),
        !x.ok && c.s2c.drop_mtu > 0 && c.s2c.icmp_sent == 0,
        format!("{}, oversized dropped {}", describe(&x), c.s2c.drop_mtu),
    );
    // ... and gets through once the router sends frag-needed.
    s.set(&emu(p.with_icmp(), RuleProto::Any, 1))?;
    let (x, c) = counted(s, || h2(s, V4, &get))?;
    r.check(
        &format!("{id} h2 with ICMP on: PMTU discovery works through the router"),
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

/// S6 in short: our proxy's download (aioquic, first client address) beside an h2 one over TCP
/// CUBIC (second address) through one bottleneck: the run counts (both flows outlast the
/// window, both handshakes done before it, the competing socket ran CUBIC), both flows move
/// data, and together they fill the bottleneck without exceeding it. Both flows start at once,
/// so a handshake may race a queue the other flow already fills; a run in which one did not
/// finish before the window measured that race (S2's question), not the share, and is run
/// once more, its outcome printed.
fn share_step(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    p: PathSpec,
    (rate_mbit, window_s): (f64, f64),
) -> Result<(), LabError> {
    let Some(ours) = h3.servers.iter().find(|t| t.name == "h3-ingress") else {
        return Ok(());
    };
    crate::servers::make_file(&s.work, BULK.name, BULK.bytes)?;
    share::add_second_client(s)?;
    share::set_route_cc(s, CLIENT2_V4, TcpCc::Cubic.name())?;
    s.set(&p.emu(RuleProto::Any, Some(rate_mbit), 1))?;
    let s = &*s;
    let run = || share_run(s, h3, ours, window_s);
    let mut attempt = run();
    if let Ok((x, detail)) = &attempt {
        if x.handshake_late {
            let why = x.invalid.as_deref().unwrap_or_default();
            println!("RERUN {id}: the run did not count ({why}): {detail}");
            attempt = run();
        }
    }
    share::clear_route_cc(s);
    let (x, detail) = attempt?;
    let (a, b) = (x.row_mbit(), x.other_mbit());
    r.check(
        &format!("{id} h3 h3-ingress beside h2 (TCP CUBIC) through {rate_mbit} Mbit/s"),
        x.invalid.is_none()
            && x.other_tcp_cc == TcpCc::Cubic.name()
            && a > 0.05 * rate_mbit
            && b > 0.05 * rate_mbit
            && a + b <= 1.05 * rate_mbit
            && a + b >= 0.7 * rate_mbit,
        detail,
    );
    Ok(())
}

/// One S6 run and its printed outcome; waits for the router to go quiet after it, so neither a
/// re-run nor the next step counts what the ended flows left in flight.
fn share_run(
    s: &Session,
    h3: &H3,
    ours: &H3Target,
    window_s: f64,
) -> Result<(ShareSample, String), LabError> {
    let w = Window {
        warm_up_s: 3.0,
        window_s,
    };
    let get = Get::download(&BULK, w.warm_up_s + w.window_s + 2.0);
    let (x, row, _) = share::measure(
        s,
        w,
        Box::new(|| h3_get(s, h3, ours, &get)),
        Box::new(|| h2_from(s, V4, &get, Some(CLIENT2_V4))),
    )?;
    let settled = wait_quiet(s, Duration::from_secs(1), Duration::from_secs(20))?;
    let detail = format!(
        "h3 {:.1} Mbit/s, h2 {:.1} Mbit/s (TCP {}), share {}, queue drops {}/{}{}; {}; {}",
        x.row_mbit(),
        x.other_mbit(),
        x.other_tcp_cc,
        x.share().map_or("–".into(), |v| format!("{v:.2}")),
        x.row_drops,
        x.other_drops,
        x.invalid
            .as_ref()
            .map(|w| format!("; {w}"))
            .unwrap_or_default(),
        row_outcome(&row),
        settled.map_or("router still busy 20 s after the flows ended".into(), |d| {
            format!("router quiet {:.1} s after", d.as_secs_f64())
        }),
    );
    Ok((x, detail))
}

/// What S6's h3 flow did as a whole (the check reads only the window): when its handshake
/// completed, how many bytes it got, how it ended.
fn row_outcome(x: &Sample) -> String {
    let handshake = match x.time_appconnect {
        t if t > 0.0 => format!("handshake {t:.2} s"),
        _ => "no handshake".to_string(),
    };
    let ended = match (&x.error, x.ok) {
        (Some(e), _) => e.as_str(),
        (None, true) => "complete",
        (None, false) => "time limit",
    };
    format!(
        "h3 flow: {handshake}, {} bytes in {:.1} s, ended: {ended:.120}",
        x.bytes, x.time_total
    )
}

/// One transfer of a smoke step, run when the step is ready to count it.
type Fetch<'a> = Box<dyn Fn() -> Result<Sample, LabError> + 'a>;

/// E1 in short: h2 from the ingress and h3 from our proxy, the client in the server namespace;
/// the router sees none of it, the body is complete, and the server's CPU time is readable
/// before and after (the delta is shown; a few MB may take less than one clock tick).
fn loopback_cpu(
    s: &mut Session,
    r: &mut Report,
    h3: &H3,
    id: &str,
    file: &FileSpec,
) -> Result<(), LabError> {
    let s = &*s;
    let get = Get::download(file, 30.0);
    let ns = s.names.server_ns.clone();
    let ours = h3.servers.iter().find(|t| t.name == "h3-ingress");
    let mut runs: Vec<(&str, &str, Fetch)> = vec![(
        "h2",
        "nginx-ingress",
        Box::new(|| {
            let ca = s.pki.root.to_string_lossy().into_owned();
            let args = client::curl_args(Proto::H2, V4, INGRESS_PORT, &get.path, &ca, None, 30.0);
            let expect = Expect {
                proto: Proto::H2,
                bytes: get.bytes,
                upload: false,
            };
            client::run_curl(&ns, None, &args, expect)
        }),
    )];
    if let Some(t) = ours {
        runs.push((
            "h3",
            "h3-ingress",
            Box::new(|| h3_get_in(s, h3, t, &get, &ns)),
        ));
    }
    for (proto, server, fetch) in runs {
        let pid = s
            .pid(server)
            .ok_or_else(|| LabError::Failed(format!("no process {server}")))?;
        let before = crate::procstat::tree_cpu_seconds(pid)?;
        let (x, c) = counted(s, fetch)?;
        let cpu = crate::procstat::tree_cpu_seconds(pid)? - before;
        let crossed = c.c2s.rx_packets + c.s2c.rx_packets;
        r.check(
            &format!(
                "{id} {proto} {} over loopback from {server}, its CPU time read",
                file.label
            ),
            x.ok && crossed <= stray_packets(get.bytes) && cpu >= 0.0,
            format!(
                "{}, {server} CPU {cpu:.3} s, router packets {crossed} (at most {})",
                describe(&x),
                stray_packets(get.bytes)
            ),
        );
    }
    Ok(())
}

/// How many router packets an E1 transfer of `bytes` may see and still count as a loopback
/// one: 1 % of its datagrams at QUIC's smallest size. A transfer routed through the router
/// would cross it thousands of times; the few that do cross likely come from earlier steps'
/// connections (S6's flows end at a time limit, and the proxy keeps probing their client until
/// its idle timeout).
fn stray_packets(bytes: u64) -> u64 {
    bytes / u64::from(h3_ingress::proxy::quic::transport::INITIAL_MTU) / 100
}
