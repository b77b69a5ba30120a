//! The messages between the processes sharing a port, pure: JSON in one unix datagram each,
//! descriptors attached in the order the message lists them. Everything read from a peer is
//! checked here (sizes, slots, descriptor counts) before anything acts on it.

use serde::{Deserialize, Serialize};

use super::table::{Member, Table};
use crate::proxy::quic::cid::MAX_SLOTS;

/// Bumped on any incompatible change; a peer speaking another version is not coordinated
/// with (the new process starts on its own, see [`super`]).
pub const PROTOCOL: u32 = 1;

/// One socket descriptor attached to a message: the family of its group and its index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdTag {
    pub family: String,
    pub index: usize,
}

/// From a process to the one coordinating the port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ToHub {
    /// A new process asks for a slot; `admin` is its metrics address, to share the
    /// listener when it is the same.
    #[serde(rename_all = "camelCase")]
    Join {
        protocol: u32,
        rank: u64,
        admin: String,
    },
    /// A process that was already sharing the port, to a new coordinator; it attaches every
    /// socket it holds (`sockets`, then the admin listener when `admin`).
    #[serde(rename_all = "camelCase")]
    Rejoin {
        protocol: u32,
        member: Member,
        sockets: Vec<FdTag>,
        admin: bool,
    },
    /// The sender's own state changed.
    #[serde(rename_all = "camelCase")]
    Update {
        ready: bool,
        terminating: bool,
        marker: u16,
    },
}

/// From the coordinating process to the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum ToMember {
    /// The joiner's slot and generation, the endpoint secret to use without a keys file
    /// (hex, empty when the coordinator has none yet), and every socket of the group (then
    /// the admin listener when `admin`).
    #[serde(rename_all = "camelCase")]
    Welcome {
        protocol: u32,
        slot: usize,
        generation: u64,
        secret: String,
        sockets: Vec<FdTag>,
        admin: bool,
    },
    /// Not now (no free slot, the group is not bound yet): ask again later.
    Wait { reason: String },
    /// Never (another protocol, a slot taken by another process): go on without this hub.
    Refused { reason: String },
    /// The live generations and the slot of the coordinating process, after every change.
    Table { table: Table, hub: usize },
    /// Sockets added to the group (a new slot): every process holds every socket.
    Sockets { sockets: Vec<FdTag> },
}

/// Why a peer's message is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("malformed message: {0}")]
    Json(String),
    #[error("protocol {0}, this process speaks {PROTOCOL}")]
    Protocol(u32),
    #[error("slot or index {0} out of range (0-{max})", max = MAX_SLOTS - 1)]
    Slot(usize),
    #[error("{got} descriptors attached, the message lists {want}")]
    Descriptors { got: usize, want: usize },
    #[error("unknown address family {0:?}")]
    Family(String),
}

pub fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    serde_json::to_vec(m).expect("messages serialise")
}

fn slot(s: usize) -> Result<(), WireError> {
    if s < MAX_SLOTS {
        Ok(())
    } else {
        Err(WireError::Slot(s))
    }
}

fn tags(t: &[FdTag], admin: bool, fds: usize) -> Result<(), WireError> {
    for tag in t {
        slot(tag.index)?;
        if tag.family != "ipv4" && tag.family != "ipv6" {
            return Err(WireError::Family(tag.family.clone()));
        }
    }
    let want = t.len() + usize::from(admin);
    if want != fds {
        return Err(WireError::Descriptors { got: fds, want });
    }
    Ok(())
}

fn protocol(p: u32) -> Result<(), WireError> {
    if p == PROTOCOL {
        Ok(())
    } else {
        Err(WireError::Protocol(p))
    }
}

/// A message to the coordinator with `fds` descriptors attached, checked.
pub fn to_hub(bytes: &[u8], fds: usize) -> Result<ToHub, WireError> {
    let m: ToHub = serde_json::from_slice(bytes).map_err(|e| WireError::Json(e.to_string()))?;
    match &m {
        ToHub::Join { protocol: p, .. } => {
            protocol(*p)?;
            tags(&[], false, fds)?;
        }
        ToHub::Rejoin {
            protocol: p,
            member,
            sockets,
            admin,
        } => {
            protocol(*p)?;
            slot(member.slot)?;
            tags(sockets, *admin, fds)?;
        }
        ToHub::Update { .. } => tags(&[], false, fds)?,
    }
    Ok(m)
}

/// A message from the coordinator with `fds` descriptors attached, checked.
pub fn to_member(bytes: &[u8], fds: usize) -> Result<ToMember, WireError> {
    let m: ToMember = serde_json::from_slice(bytes).map_err(|e| WireError::Json(e.to_string()))?;
    match &m {
        ToMember::Welcome {
            protocol: p,
            slot: s,
            sockets,
            admin,
            ..
        } => {
            protocol(*p)?;
            slot(*s)?;
            tags(sockets, *admin, fds)?;
        }
        ToMember::Table { table, hub } => {
            slot(*hub)?;
            for m in &table.members {
                slot(m.slot)?;
            }
            tags(&[], false, fds)?;
        }
        ToMember::Sockets { sockets } => tags(sockets, false, fds)?,
        ToMember::Wait { .. } | ToMember::Refused { .. } => tags(&[], false, fds)?,
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_name_the_problem() {
        let join = ToHub::Join {
            protocol: PROTOCOL,
            rank: 3,
            admin: "[::]:9476".into(),
        };
        assert_eq!(to_hub(&encode(&join), 0), Ok(join.clone()));
        assert_eq!(
            to_hub(&encode(&join), 1),
            Err(WireError::Descriptors { got: 1, want: 0 })
        );
        let welcome = ToMember::Welcome {
            protocol: PROTOCOL,
            slot: 1,
            generation: 2,
            secret: String::new(),
            sockets: vec![
                FdTag {
                    family: "ipv4".into(),
                    index: 0,
                },
                FdTag {
                    family: "ipv4".into(),
                    index: 1,
                },
            ],
            admin: true,
        };
        assert_eq!(to_member(&encode(&welcome), 3), Ok(welcome.clone()));
        assert!(matches!(
            to_member(&encode(&welcome), 2),
            Err(WireError::Descriptors { got: 2, want: 3 })
        ));
        let future = br#"{"type":"join","protocol":2,"rank":0,"admin":""}"#;
        assert_eq!(to_hub(future, 0), Err(WireError::Protocol(2)));
        let bad_slot = br#"{"type":"sockets","sockets":[{"family":"ipv4","index":8}]}"#;
        assert_eq!(to_member(bad_slot, 1), Err(WireError::Slot(8)));
        let bad_family = br#"{"type":"sockets","sockets":[{"family":"unix","index":0}]}"#;
        assert_eq!(
            to_member(bad_family, 1),
            Err(WireError::Family("unix".into()))
        );
        assert!(matches!(to_hub(b"\xff", 0), Err(WireError::Json(_))));
        assert!(WireError::Slot(9).to_string().contains("0-7"));
    }
}
