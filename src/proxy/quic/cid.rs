//! Connection IDs that say which process generation on the host owns the connection.
//!
//! During a rollout two or more processes share the listener's UDP port (SO_REUSEPORT), and
//! the kernel's socket-selection program ([`crate::proxy::handover::steer`]) must send every datagram of a
//! connection to the process that owns it, reading nothing but the first bytes of the UDP
//! payload. So every connection ID we issue (the handshake's source CID, every
//! NEW_CONNECTION_ID, the Retry's source CID) has a fixed layout of [`CID_LEN`] bytes:
//!
//! ```text
//! byte 0     : marker (5 high bits) | slot (3 low bits)
//! byte 1     : marker (8 bits)
//! bytes 2..6 : random
//! bytes 6..8 : keyed check, HMAC-SHA256(cid key, bytes 0..6), first 2 bytes
//! ```
//!
//! The slot is the process's place in the port's socket group. The 13 marker bits come from
//! the listener's key, so a client's random first destination CID (often 8 bytes too) looks
//! like ours only once in 8192: those are the only packets the program routes by slot before
//! a handshake has started. The check lets quinn's `validate` recognise our CIDs of any slot
//! and any process with the same key, so the stateless reset of a connection whose process
//! is gone is sent by the newest process, and junk is not answered.
//!
//! The 32 random bits keep CIDs of one connection unlinkable to an observer; the slot and
//! marker only say "this server", as a load balancer's server ID would.

use quinn_proto::{ConnectionId, ConnectionIdGenerator, InvalidCid};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

/// Length of every connection ID we issue.
pub const CID_LEN: usize = 8;
/// Bits of byte 0 that carry the slot.
pub const SLOT_BITS: u32 = 3;
/// Process generations that can share a port: one per slot.
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;
/// The marker's bits within the first two bytes read as a big-endian u16.
pub const MARKER_MASK: u16 = !((MAX_SLOTS as u16 - 1) << 8);
const RANDOM: std::ops::Range<usize> = 2..6;
const CHECK: std::ops::Range<usize> = 6..CID_LEN;

/// The marker of a listener key: its first two bytes, masked to the marker bits.
pub fn marker_of(key_bytes: [u8; 2]) -> u16 {
    u16::from_be_bytes(key_bytes) & MARKER_MASK
}

/// The slot a CID of ours names, or `None` when it is not one of ours (length or marker).
pub fn slot_of(cid: &[u8], marker: u16) -> Option<usize> {
    if cid.len() != CID_LEN || u16::from_be_bytes([cid[0], cid[1]]) & MARKER_MASK != marker {
        return None;
    }
    Some(usize::from(cid[0]) & (MAX_SLOTS - 1))
}

/// The generator of one process: CIDs of its slot, marked and checked with the listener key.
pub struct SlotCids {
    slot: u8,
    marker: u16,
    key: hmac::Key,
    rng: SystemRandom,
}

impl SlotCids {
    /// CIDs for `slot` (below [`MAX_SLOTS`]) under `marker` and check key `key`.
    pub fn new(slot: usize, marker: u16, key: hmac::Key) -> Self {
        assert!(slot < MAX_SLOTS, "slot {slot} out of range");
        Self {
            slot: slot as u8,
            marker: marker & MARKER_MASK,
            key,
            rng: SystemRandom::new(),
        }
    }

    fn check(&self, head: &[u8]) -> [u8; 2] {
        let tag = hmac::sign(&self.key, head);
        [tag.as_ref()[0], tag.as_ref()[1]]
    }

    /// A CID of this generator's slot with `random` as its random bytes.
    pub fn with_random(&self, random: [u8; 4]) -> ConnectionId {
        let [hi, lo] = self.marker.to_be_bytes();
        let mut b = [0u8; CID_LEN];
        b[0] = hi | self.slot;
        b[1] = lo;
        b[RANDOM].copy_from_slice(&random);
        let check = self.check(&b[..CHECK.start]);
        b[CHECK].copy_from_slice(&check);
        ConnectionId::new(&b)
    }
}

impl ConnectionIdGenerator for SlotCids {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut random = [0u8; 4];
        // ring's system random source does not fail on Linux once the process has started;
        // zeros would still be unique enough for quinn, which retries a CID it has in use.
        let _ = self.rng.fill(&mut random);
        self.with_random(random)
    }

    /// Ours, of any slot: marker and keyed check (quinn sends a stateless reset only then).
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        if slot_of(cid, self.marker).is_none() || cid[CHECK] != self.check(&cid[..CHECK.start]) {
            return Err(InvalidCid);
        }
        Ok(())
    }

    fn cid_len(&self) -> usize {
        CID_LEN
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(b: u8) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &[b; 32])
    }

    #[test]
    fn every_cid_carries_its_slot_and_marker_and_validates_in_any_slot() {
        let marker = marker_of([0xab, 0xcd]);
        assert_eq!(marker, 0xa8cd);
        let mut slot5 = SlotCids::new(5, marker, key(1));
        let slot0 = SlotCids::new(0, marker, key(1));
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let cid = slot5.generate_cid();
            assert_eq!(cid.len(), CID_LEN);
            assert_eq!(slot_of(&cid, marker), Some(5));
            assert!(slot0.validate(&cid).is_ok(), "another slot, same key");
            seen.insert(cid);
        }
        assert!(seen.len() > 195, "random bytes vary: {}", seen.len());
        // Another key's check accepts one CID in 2^16 (fixed inputs: no flake).
        let other_key = SlotCids::new(5, marker, key(2));
        let foreign = (0u32..4000)
            .filter(|i| {
                other_key
                    .validate(&slot5.with_random(i.to_be_bytes()))
                    .is_ok()
            })
            .count();
        assert!(foreign < 5, "{foreign}");
    }

    #[test]
    fn foreign_and_tampered_cids_are_not_ours() {
        let marker = marker_of([0x12, 0x34]);
        let g = SlotCids::new(3, marker, key(7));
        let cid = g.with_random([1, 2, 3, 4]);
        assert_eq!(&cid[..2], &[0x10 | 3, 0x34]);
        let mut tampered = cid.to_vec();
        tampered[3] ^= 1;
        assert!(g.validate(&ConnectionId::new(&tampered)).is_err());
        // Another marker, another length: not ours, whatever the check says.
        let mut other_marker = cid.to_vec();
        other_marker[1] ^= 0x80;
        assert_eq!(slot_of(&other_marker, marker), None);
        assert!(g.validate(&ConnectionId::new(&other_marker)).is_err());
        assert_eq!(slot_of(&cid[..7], marker), None);
        assert!(g.validate(&ConnectionId::new(&[0u8; 20])).is_err());
        // A random 8-byte CID looks like ours once in 2^13 by its marker alone.
        assert_eq!(MARKER_MASK.count_ones(), 13);
    }
}
