//! The socket-selection program of a port's SO_REUSEPORT group: which process generation
//! gets each datagram.
//!
//! The kernel runs a classic BPF program attached with `SO_ATTACH_REUSEPORT_CBPF` on every
//! datagram for the group (net/core/sock_reuseport.c: the skb is pulled past the UDP
//! header, so offset 0 is the first payload byte and `len` the payload length). The value it
//! returns is an index into the group's socket array (join order); an index past the end
//! makes the kernel fall back to hashing, and a load past the end of the payload ends the
//! program with 0, which is why every load here is preceded by a length check.
//!
//! [`program`] is pure: from a [`RoutingTable`] (the array index of the newest generation,
//! and for every live slot its index and CID marker, see [`crate::proxy::quic::cid`]) it builds:
//!
//! - empty payload → newest;
//! - short header: a destination CID of ours (length, marker of that slot) names a live slot
//!   → that slot; anything else (a CID no live process owns, junk) → newest, whose quinn
//!   answers an old CID of ours with a stateless reset;
//! - long header of QUIC v1 or its drafts, Initial or Handshake, whose destination CID is
//!   ours for a live slot → that slot (a handshake in progress when the newest changed stays
//!   with its process; a client's first Initial carries a random CID and goes to the newest
//!   unless it looks like ours by chance, one in 8192);
//! - every other long header (0-RTT, Retry, version negotiation, unknown versions) → newest.
//!
//! cBPF has no maps, so the table is compiled into the program, and every change of the
//! table (a generation joins, becomes ready, dies) attaches a new program. [`attach`] is the
//! one system call.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use crate::proxy::quic::cid::{CID_LEN, MARKER_MASK, MAX_SLOTS};
use crate::proxy::quic::header::{DRAFTS, QUIC_V1, TYPE_HANDSHAKE, TYPE_INITIAL, TYPE_MASK};

/// `SO_ATTACH_REUSEPORT_CBPF` (Linux 4.5+), as asm-generic (x86, arm64) numbers it.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// One live generation: its slot (the number in its CIDs), the index of its socket in the
/// group, and the marker its CIDs carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub slot: usize,
    pub index: u32,
    pub marker: u16,
}

/// What the program routes by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTable {
    /// Socket index of the generation that takes new connections.
    pub newest: u32,
    /// The live generations, at most one per slot.
    pub routes: Vec<Route>,
}

// Classic BPF encoding (linux/bpf_common.h, linux/filter.h).
const LD: u16 = 0x00;
const ALU: u16 = 0x04;
const JMP: u16 = 0x05;
const RET: u16 = 0x06;
const W: u16 = 0x00;
const H: u16 = 0x08;
const B: u16 = 0x10;
const ABS: u16 = 0x20;
const LEN: u16 = 0x80;
const AND: u16 = 0x50;
const JA: u16 = 0x00;
const JEQ: u16 = 0x10;
const JGT: u16 = 0x20;
const JGE: u16 = 0x30;
const JSET: u16 = 0x40;
const K: u16 = 0x00;

/// Offsets of the destination CID: after the first byte (short header), after first byte,
/// version and length byte (long header).
const SHORT_DCID: u32 = 1;
const LONG_DCID_LEN: u32 = 5;
const LONG_DCID: u32 = 6;

/// A jump target: the next instruction or a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum To {
    Next,
    L(Label),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    Newest,
    Long,
    Known,
    LongCid,
    Short(usize),
    LongSlot(usize),
    Ret(usize),
}

/// One instruction with symbolic targets, or a label's position.
#[derive(Debug, Clone, Copy)]
enum Op {
    Here(Label),
    Stmt(u16, u32),
    Jump(u16, u32, To, To),
    Goto(Label),
}

use Op::*;
use To::{Next, L};

/// Steers on the slot in the CID at `offset`: one comparison per live route, then newest.
fn dispatch(ops: &mut Vec<Op>, t: &RoutingTable, offset: u32, to: fn(usize) -> Label) {
    ops.push(Stmt(LD | B | ABS, offset));
    ops.push(Stmt(ALU | AND | K, MAX_SLOTS as u32 - 1));
    for (i, r) in t.routes.iter().enumerate() {
        ops.push(Jump(JEQ | K, r.slot as u32, L(to(i)), Next));
    }
    ops.push(Goto(Label::Newest));
    for (i, r) in t.routes.iter().enumerate() {
        ops.push(Here(to(i)));
        ops.push(Stmt(LD | H | ABS, offset));
        ops.push(Stmt(ALU | AND | K, u32::from(MARKER_MASK)));
        ops.push(Jump(
            JEQ | K,
            u32::from(r.marker & MARKER_MASK),
            L(Label::Ret(i)),
            L(Label::Newest),
        ));
    }
}

fn symbolic(t: &RoutingTable) -> Vec<Op> {
    let cid = CID_LEN as u32;
    let mut ops = vec![
        Stmt(LD | W | LEN, 0),
        Jump(JGE | K, 1, Next, L(Label::Newest)),
        Stmt(LD | B | ABS, 0),
        Jump(JSET | K, 0x80, L(Label::Long), Next),
        // Short header.
        Stmt(LD | W | LEN, 0),
        Jump(JGE | K, SHORT_DCID + cid, Next, L(Label::Newest)),
    ];
    dispatch(&mut ops, t, SHORT_DCID, Label::Short);
    ops.extend([
        Here(Label::Long),
        Stmt(LD | W | LEN, 0),
        Jump(JGE | K, LONG_DCID + cid, Next, L(Label::Newest)),
        Stmt(LD | W | ABS, 1),
        Jump(JEQ | K, QUIC_V1, L(Label::Known), Next),
        Jump(JGE | K, *DRAFTS.start(), Next, L(Label::Newest)),
        Jump(JGT | K, *DRAFTS.end(), L(Label::Newest), Next),
        Here(Label::Known),
        Stmt(LD | B | ABS, 0),
        Stmt(ALU | AND | K, TYPE_MASK),
        Jump(JEQ | K, TYPE_INITIAL, L(Label::LongCid), Next),
        Jump(JEQ | K, TYPE_HANDSHAKE, Next, L(Label::Newest)),
        Here(Label::LongCid),
        Stmt(LD | B | ABS, LONG_DCID_LEN),
        Jump(JEQ | K, cid, Next, L(Label::Newest)),
    ]);
    dispatch(&mut ops, t, LONG_DCID, Label::LongSlot);
    for (i, r) in t.routes.iter().enumerate() {
        ops.push(Here(Label::Ret(i)));
        ops.push(Stmt(RET | K, r.index));
    }
    ops.push(Here(Label::Newest));
    ops.push(Stmt(RET | K, t.newest));
    ops
}

/// The program for `t`. At most [`MAX_SLOTS`] routes are used (a table never holds more).
pub fn program(t: &RoutingTable) -> Vec<libc::sock_filter> {
    let mut t = t.clone();
    t.routes.truncate(MAX_SLOTS);
    let ops = symbolic(&t);
    let mut at = Vec::new();
    let mut pc = 0usize;
    for op in &ops {
        match op {
            Here(l) => at.push((*l, pc)),
            _ => pc += 1,
        }
    }
    let target = |l: Label| at.iter().find(|(x, _)| *x == l).map(|(_, p)| *p).unwrap();
    let mut out = Vec::with_capacity(pc);
    for op in ops {
        let here = out.len();
        // Jumps are relative to the next instruction and only go forward.
        let rel = |to: To| match to {
            Next => 0,
            L(l) => target(l) - here - 1,
        };
        let insn = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
        match op {
            Here(_) => continue,
            Stmt(code, k) => out.push(insn(code, 0, 0, k)),
            Jump(code, k, t, f) => {
                let (jt, jf) = (rel(t), rel(f));
                assert!(jt < 256 && jf < 256, "jump too far: {jt} {jf}");
                out.push(insn(JMP | code, jt as u8, jf as u8, k));
            }
            Goto(l) => out.push(insn(JMP | JA, 0, 0, rel(L(l)) as u32)),
        }
    }
    out
}

/// Attaches `prog` to the reuseport group of the socket `fd` (any member socket will do);
/// it replaces the group's previous program at once.
pub fn attach(fd: BorrowedFd<'_>, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fd is a live socket; fprog points to `prog`, which outlives the call, and the
    // kernel copies the instructions before returning.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests;
