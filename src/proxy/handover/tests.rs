//! The fallback when the process holding the name does not answer: the new one starts solo
//! at the end of the group and, once ready, takes the new connections while the slots below
//! it keep theirs (real sockets, real kernel).

use std::net::{Ipv4Addr, UdpSocket};
use std::time::Duration;

use super::*;
use crate::proxy::quic::cid::SlotCids;

const M: u16 = 0x7833;

fn cid(slot: usize) -> Vec<u8> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[3; 32]);
    SlotCids::new(slot, M, key)
        .with_random([9, 9, 9, 9])
        .to_vec()
}

fn datagram(first: u8, dcid: &[u8]) -> Vec<u8> {
    let mut p = vec![first];
    if first & 0x80 != 0 {
        p.extend_from_slice(&1u32.to_be_bytes());
        p.push(dcid.len() as u8);
    }
    p.extend_from_slice(dcid);
    p.resize(1200, 0);
    p
}

/// Which of `socks` receives `payload` sent to their address.
fn receiver(socks: &[&UdpSocket], payload: &[u8]) -> Option<usize> {
    let to = socks[0].local_addr().unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.send_to(payload, to).unwrap();
    let mut buf = [0u8; 2048];
    for _ in 0..1000 {
        for (i, s) in socks.iter().enumerate() {
            if s.recv_from(&mut buf).is_ok() {
                return Some(i);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

#[test]
fn names_are_short_and_differ_by_port_addresses_and_identity() {
    let listen = |port, v6: Option<&str>| ListenConfig {
        port,
        ipv4: Some(Ipv4Addr::UNSPECIFIED),
        ipv6: v6.map(|a| a.parse().unwrap()),
        receive_buffer_bytes: 1 << 20,
        send_buffer_bytes: 1 << 20,
        force_buffers: false,
    };
    let long = "l".repeat(63);
    let a = name(&listen(443, Some("::")), Some(&long));
    assert!(a.starts_with("h3-ingress/udp/443/") && a.len() < 50, "{a}");
    let others = [
        name(&listen(443, Some("::")), Some("other")),
        name(&listen(443, None), Some(&long)),
        name(&listen(8443, Some("::")), Some(&long)),
        name(&listen(443, Some("::")), None),
    ];
    assert!(others.iter().all(|o| *o != a), "{others:?}");
    // A buffer setting is no part of it: the process with new settings takes over.
    let mut bigger = listen(443, Some("::"));
    bigger.receive_buffer_bytes *= 2;
    assert_eq!(name(&bigger, Some(&long)), a);
}

#[tokio::test]
async fn without_an_answer_a_new_process_starts_solo_and_takes_the_new_connections() {
    let old = crate::proxy::quic::socket::group_socket("127.0.0.1:0".parse().unwrap()).unwrap();
    old.set_nonblocking(true).unwrap();
    let port = old.local_addr().unwrap().port();
    let listen = ListenConfig {
        port,
        ipv4: Some(Ipv4Addr::LOCALHOST),
        ipv6: None,
        receive_buffer_bytes: 1 << 20,
        send_buffer_bytes: 1 << 20,
        force_buffers: false,
    };
    let mut spec = Spec::new(&listen, Some("test"), "127.0.0.1:1".parse().unwrap(), 0);
    spec.entry_bound = Duration::from_millis(300);
    // A process holds the name and never answers (its kernel backlog accepts us).
    let _hung = unix::Listener::bind(&spec.name).unwrap();
    let mut h = start(spec);
    let joined = h.joined().await.unwrap();
    assert_eq!(joined.slot, 1, "appended after the old process's socket");
    let ours = h.sockets().await.unwrap().remove(0);
    ours.set_nonblocking(true).unwrap();
    assert!(h.view.borrow().solo);
    h.tell(Local::Ready { marker: M });
    let mut view = h.view.clone();
    tokio::time::timeout(
        Duration::from_secs(5),
        view.wait_for(|v| v.role == Role::Newest),
    )
    .await
    .expect("newest")
    .unwrap();
    let socks = [&old, &ours];
    let (initial, short) = (0xc3, 0x43);
    assert_eq!(receiver(&socks, &datagram(initial, &[0x11; 8])), Some(1));
    assert_eq!(receiver(&socks, &datagram(short, &cid(0))), Some(0));
    assert_eq!(receiver(&socks, &datagram(short, &cid(1))), Some(1));
    assert_eq!(receiver(&socks, &datagram(initial, &cid(0))), Some(0));
}
