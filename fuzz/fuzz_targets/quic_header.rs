//! The QUIC header reader (src/proxy/quic/header.rs) and the amplification guard's use of it
//! (src/proxy/quic/amplification.rs), on datagrams a client or a spoofer sends. Input: one byte
//! `n` (mod 21), `n` bytes of the connection ID our first datagram gave the client, then the
//! client's datagram. The reader must agree with an independent cursor reading
//! (`h3_ingress_fuzz::expected_packets`), and the guard must stop limiting the address
//! exactly when the datagram holds a Handshake packet addressed to our connection ID (a
//! non-empty one).
#![no_main]

use std::net::SocketAddr;
use std::time::Instant;

use h3_ingress::proxy::quic::amplification::Ledger;
use h3_ingress::proxy::quic::header::{coalesced, TYPE_HANDSHAKE};
use h3_ingress_fuzz::{expected_packets, Packet};
use libfuzzer_sys::fuzz_target;

/// Our Initial to the client: v1, from `ours`, with a one-byte payload.
fn our_initial(ours: &[u8]) -> Vec<u8> {
    let mut p = vec![0xc0, 0, 0, 0, 1, 0, ours.len() as u8];
    p.extend_from_slice(ours);
    p.extend_from_slice(&[0, 1, 0]);
    p
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n) % 21;
    if rest.len() < n {
        return;
    }
    let (ours, datagram) = rest.split_at(n);
    let got: Vec<Packet> = coalesced(datagram)
        .map(|h| Packet {
            ty: h.ty,
            dcid: h.dcid.to_vec(),
            scid: h.scid.to_vec(),
            len: h.len,
        })
        .collect();
    let expected = expected_packets(datagram);
    assert_eq!(got, expected);

    let mut ledger = Ledger::default();
    let client: SocketAddr = "192.0.2.1:443".parse().unwrap();
    let t = Instant::now();
    ledger.received(client, 1200, true, t);
    ledger.pin(client, t);
    ledger.allow(client, &our_initial(ours), std::iter::empty(), t);
    ledger.received_datagram(client, datagram, t);
    let validated = ledger
        .allow(client, &[], [1200; 100].into_iter(), t)
        .is_none();
    // An empty ID is no secret: it never validates.
    let proof = !ours.is_empty()
        && expected
            .iter()
            .any(|p| p.ty == TYPE_HANDSHAKE && p.dcid == ours);
    assert_eq!(validated, proof, "ours {ours:02x?}, packets {expected:?}");
});
