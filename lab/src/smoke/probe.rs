//! The emulator's own mechanics, checked before any scenario: delay, an MTU black hole, IPv4
//! fragmentation without DF, and ICMP errors the sender's kernel accepts.

use std::io::ErrorKind;
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::Report;
use crate::emu::{Counters, RuleProto};
use crate::netns;
use crate::scenario::PathSpec;
use crate::servers::INGRESS_PORT;
use crate::session::Session;
use crate::topology::{CLIENT_V4, CLIENT_V6, SERVER_V4, SERVER_V6};
use crate::LabError;

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

/// Waits until the router has seen no packet for `quiet` (at most `limit`); returns how long
/// that took, or `None` when traffic still flowed at the limit. A step whose flows end at a
/// time limit (S6) leaves the server sending into a dead connection for a while (QUIC has no
/// RST: it backs off until its idle timeout), and the next step's router counts must not see it.
pub(super) fn wait_quiet(
    s: &Session,
    quiet: Duration,
    limit: Duration,
) -> Result<Option<Duration>, LabError> {
    let start = Instant::now();
    let packets = |c: &Counters| c.c2s.rx_packets + c.s2c.rx_packets;
    let mut last = packets(&s.snapshot()?.counters);
    let mut since = Instant::now();
    while start.elapsed() < limit {
        std::thread::sleep(Duration::from_millis(100));
        let now = packets(&s.snapshot()?.counters);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet {
            return Ok(Some(start.elapsed()));
        }
    }
    Ok(None)
}

pub(super) fn counted<T>(
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

pub(super) fn mechanics(s: &mut Session, report: &mut Report) -> Result<(), LabError> {
    // Delay: a TCP handshake takes at least one emulated round trip.
    s.set(&PathSpec::rtt(100.0).emu(RuleProto::Any, None, 1))?;
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
    s.set(
        &PathSpec::CLEAN
            .black_hole(1280)
            .emu(RuleProto::Any, None, 1),
    )?;
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
    s.set(
        &PathSpec::CLEAN
            .black_hole(1280)
            .with_icmp()
            .emu(RuleProto::Any, None, 1),
    )?;
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
