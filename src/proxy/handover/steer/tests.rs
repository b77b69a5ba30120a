//! The program against the real kernel: a reuseport group of UDP sockets on loopback (no
//! root needed), the program attached, crafted datagrams sent, and which socket received
//! each one.

use super::*;
use crate::proxy::quic::cid::{marker_of, SlotCids};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use ring::hmac;
use socket2::{Domain, Protocol, Socket, Type};

const M: u16 = 0xa8cd;

fn cid(slot: usize, marker: u16) -> Vec<u8> {
    let key = hmac::Key::new(hmac::HMAC_SHA256, &[9; 32]);
    SlotCids::new(slot, marker, key)
        .with_random([slot as u8, 1, 2, 3])
        .to_vec()
}

/// `n` sockets in one reuseport group on `ip`, in join order.
fn group(ip: &str, n: usize) -> Vec<UdpSocket> {
    let mut addr: SocketAddr = format!("{ip}:0").parse().unwrap();
    (0..n)
        .map(|_| {
            let s =
                Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            let s: UdpSocket = s.into();
            addr = s.local_addr().unwrap();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

/// Which socket of `g` receives `payload` (None: nobody within a second).
fn receiver(g: &[UdpSocket], payload: &[u8]) -> Option<usize> {
    let to = g[0].local_addr().unwrap();
    let client = UdpSocket::bind(SocketAddr::new(to.ip(), 0)).unwrap();
    client.send_to(payload, to).unwrap();
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        for (i, s) in g.iter().enumerate() {
            if let Ok((n, _)) = s.recv_from(&mut buf) {
                assert_eq!(&buf[..n], payload, "socket {i} got another datagram");
                return Some(i);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn short(dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![0x43];
    p.extend_from_slice(dcid);
    p.resize(40, 0xee);
    p
}

/// A long header: `first` byte, `version`, the destination CID, an empty source CID, padding.
fn long(first: u8, version: u32, dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![first];
    p.extend_from_slice(&version.to_be_bytes());
    p.push(dcid.len() as u8);
    p.extend_from_slice(dcid);
    p.push(0);
    p.resize(1200, 0);
    p
}

const INITIAL: u8 = 0xc3;
const ZERO_RTT: u8 = 0xd3;
const HANDSHAKE: u8 = 0xe3;
const RETRY: u8 = 0xf0;

/// Slots 0, 1, 2, 3 live at indices 0..4 (slot 3 under another key's marker), slot 1 the
/// newest; slots 4..8 dead.
fn table() -> RoutingTable {
    let other = marker_of([0x55, 0x66]);
    RoutingTable {
        newest: 1,
        routes: vec![
            Route {
                slot: 0,
                index: 0,
                marker: M,
            },
            Route {
                slot: 1,
                index: 1,
                marker: M,
            },
            Route {
                slot: 2,
                index: 2,
                marker: M,
            },
            Route {
                slot: 3,
                index: 3,
                marker: other,
            },
        ],
    }
}

fn check_routing(ip: &str) {
    let g = group(ip, 4);
    attach(g[2].as_fd(), &program(&table())).expect("SO_ATTACH_REUSEPORT_CBPF");
    let other = marker_of([0x55, 0x66]);
    let mut random = vec![0x3d, 0x11, 7, 7, 7, 7, 7, 7];
    random[1] = !(M as u8); // not our marker
    let cases: Vec<(&str, Vec<u8>, usize)> = vec![
        ("empty", vec![], 1),
        ("1 byte short header", vec![0x40], 1),
        ("5 bytes long header", vec![0xc0, 0, 0, 0, 1], 1),
        (
            "short header, 7 CID bytes",
            short(&cid(2, M))[..8].to_vec(),
            1,
        ),
        ("short header slot 0", short(&cid(0, M)), 0),
        ("short header slot 1", short(&cid(1, M)), 1),
        ("short header slot 2", short(&cid(2, M)), 2),
        (
            "short header slot 3, its own marker",
            short(&cid(3, other)),
            3,
        ),
        ("short header slot 3, slot 0's marker", short(&cid(3, M)), 1),
        ("short header dead slot 5", short(&cid(5, M)), 1),
        ("short header dead slot 7", short(&cid(7, M)), 1),
        ("short header random CID", short(&random), 1),
        (
            "first Initial, random 8-byte CID",
            long(INITIAL, 1, &random),
            1,
        ),
        ("first Initial, 16-byte CID", long(INITIAL, 1, &[0; 16]), 1),
        ("Initial to our CID slot 2", long(INITIAL, 1, &cid(2, M)), 2),
        ("Initial to our CID slot 0", long(INITIAL, 1, &cid(0, M)), 0),
        ("Initial dead slot 6", long(INITIAL, 1, &cid(6, M)), 1),
        ("Handshake slot 0", long(HANDSHAKE, 1, &cid(0, M)), 0),
        ("Handshake slot 3", long(HANDSHAKE, 1, &cid(3, other)), 3),
        ("Handshake dead slot 4", long(HANDSHAKE, 1, &cid(4, M)), 1),
        ("Handshake, random CID", long(HANDSHAKE, 1, &random), 1),
        (
            "draft-29 Handshake slot 2",
            long(HANDSHAKE, 0xff00_001d, &cid(2, M)),
            2,
        ),
        (
            "draft-34 Initial slot 0",
            long(INITIAL, 0xff00_0022, &cid(0, M)),
            0,
        ),
        ("0-RTT slot 2", long(ZERO_RTT, 1, &cid(2, M)), 1),
        ("Retry-typed slot 2", long(RETRY, 1, &cid(2, M)), 1),
        (
            "version negotiation (version 0)",
            long(0x80, 0, &cid(2, M)),
            1,
        ),
        (
            "unknown version 0x1a2a3a4a",
            long(INITIAL, 0x1a2a_3a4a, &cid(2, M)),
            1,
        ),
        ("QUIC v2", long(0xd3, 0x6b33_43cf, &cid(2, M)), 1),
        (
            "draft-35 (not spoken)",
            long(HANDSHAKE, 0xff00_0023, &cid(2, M)),
            1,
        ),
    ];
    for (name, payload, want) in cases {
        assert_eq!(receiver(&g, &payload), Some(want), "{ip}: {name}");
    }
}

#[test]
fn the_program_routes_crafted_datagrams_on_ipv4() {
    check_routing("127.0.0.1");
}

#[test]
fn the_program_routes_crafted_datagrams_on_ipv6() {
    check_routing("[::1]");
}

/// What the hand-over relies on: a new program replaces the old one at once, a socket that
/// joins gets nothing the program does not send it, and closing a socket moves the LAST one
/// into its place (which is why no slot socket is ever closed while a process lives).
#[test]
fn the_kernel_replaces_programs_and_compacts_the_array_on_close() {
    let mut g = group("127.0.0.1", 3);
    let only = |newest| RoutingTable {
        newest,
        routes: vec![],
    };
    attach(g[0].as_fd(), &program(&only(0))).unwrap();
    for i in 0..20u8 {
        assert_eq!(receiver(&g, &short(&[i; 9])), Some(0));
    }
    attach(g[1].as_fd(), &program(&only(2))).unwrap();
    assert_eq!(receiver(&g, &short(&cid(0, M))), Some(2));
    // A fourth socket joins: the program never names index 3, so it gets nothing.
    g.extend(group_join(&g[0], 1));
    for i in 0..20u8 {
        assert_eq!(receiver(&g, &long(INITIAL, 1, &[i; 8])), Some(2));
    }
    // Close index 1: the last socket (index 3) takes its place, so index 2 stays and the
    // program's "1" now reaches the former index 3.
    attach(g[0].as_fd(), &program(&only(1))).unwrap();
    let last = g.pop().unwrap();
    drop(g.remove(1));
    let g = vec![g.remove(0), last, g.remove(0)];
    assert_eq!(receiver(&g, &short(&cid(0, M))), Some(1));
}

/// `n` more sockets joining the group of `first`.
fn group_join(first: &UdpSocket, n: usize) -> Vec<UdpSocket> {
    let addr = first.local_addr().unwrap();
    (0..n)
        .map(|_| {
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.bind(&addr.into()).unwrap();
            let s: UdpSocket = s.into();
            s.set_nonblocking(true).unwrap();
            s
        })
        .collect()
}

#[test]
fn the_program_is_small_and_jumps_stay_in_range_with_every_slot_live() {
    let t = RoutingTable {
        newest: 7,
        routes: (0..MAX_SLOTS)
            .map(|s| Route {
                slot: s,
                index: s as u32,
                marker: M,
            })
            .collect(),
    };
    let p = program(&t);
    assert!(p.len() < 128, "{}", p.len());
    let g = group("127.0.0.1", MAX_SLOTS);
    attach(g[0].as_fd(), &p).unwrap();
    for s in 0..MAX_SLOTS {
        assert_eq!(receiver(&g, &short(&cid(s, M))), Some(s));
        assert_eq!(receiver(&g, &long(HANDSHAKE, 1, &cid(s, M))), Some(s));
    }
}
