//! The sockets a process holds for the port: per address family, every slot's UDP socket in
//! the order they joined the kernel's SO_REUSEPORT group (so the position is the array index
//! the program returns), and the shared admin listener.
//!
//! Every process holds every socket: a socket leaves its group only when its last
//! descriptor closes, and the kernel then moves the group's last socket into its place,
//! which would silently re-number a live slot. Held by all, a socket closes only when every
//! process sharing the port is gone.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::steer::{self, RoutingTable};
use super::unix::{dup, inode};
use super::wire::FdTag;
use crate::proxy::observe::metrics::{family_of, FAMILY_IPV4};
use crate::proxy::quic::socket::{self, SocketError};

/// One family's group.
pub struct FamilyGroup {
    pub family: &'static str,
    /// The bound address (with the port the kernel chose if the configuration said 0).
    pub addr: SocketAddr,
    /// Index = slot.
    pub sockets: Vec<OwnedFd>,
}

/// Everything a process holds for the port.
#[derive(Default)]
pub struct Group {
    pub families: Vec<FamilyGroup>,
    pub admin: Option<OwnedFd>,
}

/// Why the first slot could not be bound.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    /// Held by a socket we cannot join (no SO_REUSEPORT, another user) or by sockets we did
    /// not create: wait for them to go.
    #[error("{0}")]
    Busy(String),
    /// No address could be bound, each with its error.
    #[error("{0}")]
    Failed(String),
}

impl Group {
    /// Binds slot 0 for `addrs` (one socket each). An address held by anyone else makes the
    /// whole attempt [`CreateError::Busy`] (nothing stays bound); an address that cannot be
    /// bound for another reason (no IPv6 on the host) is left out and returned with its error.
    pub fn create(
        addrs: &[SocketAddr],
        bound_to: impl Fn(SocketAddr) -> usize,
    ) -> Result<(Group, Vec<(SocketAddr, SocketError)>), CreateError> {
        let mut group = Group::default();
        let mut failed = Vec::new();
        let mut port = addrs.first().map(|a| a.port()).unwrap_or(0);
        for a in addrs {
            let addr = SocketAddr::new(a.ip(), port);
            match socket::group_socket(addr) {
                Ok(s) => {
                    let addr = s.local_addr().unwrap_or(addr);
                    port = addr.port();
                    if bound_to(addr) > 1 {
                        return Err(CreateError::Busy(format!(
                            "UDP {addr} is shared with sockets of a process this one has no \
                             hand-over with (other addresses, or no answer); waiting for them \
                             to close"
                        )));
                    }
                    group.families.push(FamilyGroup {
                        family: family_of(&addr),
                        addr,
                        sockets: vec![s.into()],
                    });
                }
                Err(e) if in_use(&e) => {
                    return Err(CreateError::Busy(format!(
                        "{e}: the port is held by a socket without SO_REUSEPORT (h3-ingress \
                         0.1.0, another server) or of another user; retrying every second"
                    )))
                }
                Err(e) => failed.push((addr, e)),
            }
        }
        if group.families.is_empty() {
            let why: Vec<String> = failed.iter().map(|(_, e)| e.to_string()).collect();
            return Err(CreateError::Failed(why.join("; ")));
        }
        Ok((group, failed))
    }

    /// Slots the group has (every family has the same number).
    pub fn slots(&self) -> usize {
        self.families
            .iter()
            .map(|f| f.sockets.len())
            .min()
            .unwrap_or(0)
    }

    /// Adds one slot: a socket per family. Returns the new slot.
    pub fn append(&mut self) -> Result<usize, SocketError> {
        let slot = self.slots();
        let new: Vec<UdpSocket> = self
            .families
            .iter()
            .map(|f| socket::group_socket(f.addr))
            .collect::<Result<_, _>>()?;
        for (f, s) in self.families.iter_mut().zip(new) {
            f.sockets.push(s.into());
        }
        Ok(slot)
    }

    /// Every socket, tagged, from slot `from` on (then the admin listener when `admin`).
    pub fn tagged(&self, from: usize, admin: bool) -> (Vec<FdTag>, Vec<BorrowedFd<'_>>) {
        let mut tags = Vec::new();
        let mut fds = Vec::new();
        for f in &self.families {
            for (index, s) in f.sockets.iter().enumerate().skip(from) {
                tags.push(FdTag {
                    family: f.family.to_string(),
                    index,
                });
                fds.push(s.as_fd());
            }
        }
        if let (true, Some(a)) = (admin, &self.admin) {
            fds.push(a.as_fd());
        }
        (tags, fds)
    }

    /// Takes the sockets of `tags` (and the admin listener after them when `admin`) that this
    /// group does not hold yet; the ones it holds must be the same sockets. Returns how many
    /// were added; a descriptor out of order is refused with the reason.
    pub fn merge(
        &mut self,
        tags: &[FdTag],
        fds: Vec<OwnedFd>,
        admin: bool,
    ) -> Result<usize, String> {
        let mut fds = fds.into_iter();
        let mut pairs: Vec<(&FdTag, OwnedFd)> = tags.iter().zip(fds.by_ref()).collect();
        pairs.sort_by_key(|(t, _)| (t.family.clone(), t.index));
        let mut added = 0;
        for (tag, fd) in pairs {
            let f = self.family_mut(&tag.family, &fd)?;
            if tag.index < f.sockets.len() {
                if inode(f.sockets[tag.index].as_fd()) != inode(fd.as_fd()) {
                    return Err(format!("{} socket {} differs", tag.family, tag.index));
                }
            } else if tag.index == f.sockets.len() {
                f.sockets.push(fd);
                added += 1;
            } else {
                return Err(format!("{} socket {} out of order", tag.family, tag.index));
            }
        }
        if let (true, Some(a), None) = (admin, fds.next(), &self.admin) {
            self.admin = Some(a);
        }
        Ok(added)
    }

    fn family_mut(&mut self, family: &str, fd: &OwnedFd) -> Result<&mut FamilyGroup, String> {
        if let Some(i) = self.families.iter().position(|f| f.family == family) {
            return Ok(&mut self.families[i]);
        }
        // A family this process does not have yet: the socket tells its address.
        let s = UdpSocket::from(dup(fd).map_err(|e| e.to_string())?);
        let addr = s.local_addr().map_err(|e| e.to_string())?;
        if family_of(&addr) != family {
            return Err(format!("a socket tagged {family} is bound to {addr}"));
        }
        self.families.push(FamilyGroup {
            family: family_of(&addr),
            addr,
            sockets: Vec::new(),
        });
        self.families.sort_by_key(|f| f.family != FAMILY_IPV4);
        Ok(self
            .families
            .iter_mut()
            .find(|f| f.family == family)
            .unwrap())
    }

    /// Attaches the program of `table` to every family's group.
    pub fn attach(&self, table: &RoutingTable) -> io::Result<()> {
        let prog = steer::program(table);
        for f in &self.families {
            if let Some(s) = f.sockets.first() {
                steer::attach(s.as_fd(), &prog)?;
            }
        }
        Ok(())
    }

    /// Copies of `slot`'s sockets for the process's own endpoints, per family.
    pub fn slot_sockets(&self, slot: usize) -> io::Result<Vec<UdpSocket>> {
        self.families
            .iter()
            .filter_map(|f| f.sockets.get(slot))
            .map(|s| dup(s).map(UdpSocket::from))
            .collect()
    }

    /// A copy of the shared admin listener.
    pub fn admin_listener(&self) -> Option<TcpListener> {
        self.admin
            .as_ref()
            .and_then(|a| dup(a).ok())
            .map(TcpListener::from)
    }
}

fn in_use(e: &SocketError) -> bool {
    matches!(e, SocketError::Bind { source, .. } if source.raw_os_error() == Some(libc::EADDRINUSE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> Vec<SocketAddr> {
        vec!["127.0.0.1:0".parse().unwrap(), "[::1]:0".parse().unwrap()]
    }

    #[test]
    fn slots_grow_in_both_families_and_merge_by_index() {
        let (mut g, failed) = Group::create(&loopback(), |_| 1).unwrap();
        assert!(failed.is_empty());
        let port = g.families[0].addr.port();
        assert_eq!(g.families[1].addr.port(), port);
        assert_eq!(g.append().unwrap(), 1);
        assert_eq!(g.slots(), 2);
        // Another process receives them all and then the one appended later.
        let (tags, fds) = g.tagged(0, false);
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|f| f.try_clone_to_owned().unwrap())
            .collect();
        let mut other = Group::default();
        assert_eq!(other.merge(&tags, owned, false), Ok(4));
        assert_eq!(other.slots(), 2);
        assert_eq!(other.families[0].family, FAMILY_IPV4);
        assert_eq!(g.append().unwrap(), 2);
        let (tags, fds) = g.tagged(2, false);
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|f| f.try_clone_to_owned().unwrap())
            .collect();
        assert_eq!(other.merge(&tags, owned, false), Ok(2));
        // Merging again adds nothing; a foreign socket under a known tag is refused.
        let (tags, fds) = g.tagged(0, false);
        let owned: Vec<OwnedFd> = fds
            .iter()
            .map(|f| f.try_clone_to_owned().unwrap())
            .collect();
        assert_eq!(other.merge(&tags, owned, false), Ok(0));
        let stray: OwnedFd = UdpSocket::bind("127.0.0.1:0").unwrap().into();
        let tag = FdTag {
            family: "ipv4".into(),
            index: 0,
        };
        assert!(other.merge(&[tag], vec![stray], false).is_err());
        assert_eq!(other.slot_sockets(2).unwrap().len(), 2);
    }

    #[test]
    fn a_port_held_without_reuseport_is_busy_and_nothing_stays_bound() {
        let held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let e = Group::create(&[addr], |_| 1).err().unwrap();
        assert!(
            matches!(&e, CreateError::Busy(m) if m.contains("SO_REUSEPORT")),
            "{e}"
        );
        // Foreign members of the group (a process without a hand-over): busy too.
        let e = Group::create(&loopback()[..1], |_| 2).err().unwrap();
        assert!(matches!(e, CreateError::Busy(_)));
    }
}
