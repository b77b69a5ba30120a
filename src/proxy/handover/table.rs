//! Who shares the port, pure: the live process generations ([`Member`]), which of them takes
//! new connections, the routing table the program is built from, the slot a new process
//! gets, and the order in which survivors take over the coordination when its holder dies.
//!
//! Every slot socket is held by every process (see [`super`]), so the sockets of the group
//! never move and slot N is always at index N of the group's array: the routing table maps a
//! slot to the index of the same number.

use serde::{Deserialize, Serialize};

use super::steer::{Route, RoutingTable};
use crate::proxy::quic::cid::MAX_SLOTS;

/// One live process generation sharing the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Member {
    /// Its slot: the number in its connection IDs and the index of its sockets.
    pub slot: usize,
    /// Join order on this host, assigned by the coordinating process; higher is newer.
    pub generation: u64,
    /// What outranks join order: the pod template generation under Kubernetes (so a
    /// restarted container of an old pod never takes new connections from a newer pod), 0
    /// standalone.
    pub rank: u64,
    /// The marker of its connection IDs (its keys).
    pub marker: u16,
    /// Loaded and serving: may take new connections.
    pub ready: bool,
    /// Shutting down on a signal: never takes new connections again.
    pub terminating: bool,
}

impl Member {
    fn key(&self) -> (u64, u64) {
        (self.rank, self.generation)
    }

    fn eligible(&self) -> bool {
        self.ready && !self.terminating
    }
}

/// What a process does, as the table says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Role {
    /// Not ready yet; another generation (or nobody) takes new connections.
    Pending,
    /// Takes new connections.
    Newest,
    /// Ready, but a newer generation takes new connections: drain.
    Superseded,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Pending => "pending",
            Role::Newest => "newest",
            Role::Superseded => "superseded",
        }
    }
}

/// Where a new process goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// A slot whose socket exists and whose owner is gone.
    Reuse(usize),
    /// A new slot: sockets to be added to the group.
    Append(usize),
    /// Every slot has a live owner.
    Full,
}

/// The live generations, one per slot.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Table {
    pub members: Vec<Member>,
}

impl Table {
    pub fn get(&self, slot: usize) -> Option<&Member> {
        self.members.iter().find(|m| m.slot == slot)
    }

    /// Adds or replaces the member of `m.slot`.
    pub fn upsert(&mut self, m: Member) {
        self.members.retain(|x| x.slot != m.slot);
        self.members.push(m);
        self.members.sort_by_key(|m| m.slot);
    }

    pub fn remove(&mut self, slot: usize) -> Option<Member> {
        let i = self.members.iter().position(|m| m.slot == slot)?;
        Some(self.members.remove(i))
    }

    /// The generation that takes new connections: the newest ready one that is not shutting
    /// down; failing that the newest not shutting down (a first process still loading);
    /// failing that the newest.
    pub fn newest(&self) -> Option<&Member> {
        let best = |f: &dyn Fn(&Member) -> bool| {
            self.members.iter().filter(|m| f(m)).max_by_key(|m| m.key())
        };
        best(&Member::eligible)
            .or_else(|| best(&|m| !m.terminating))
            .or_else(|| best(&|_| true))
    }

    pub fn role(&self, slot: usize) -> Role {
        match (self.newest(), self.get(slot)) {
            (Some(n), _) if n.slot == slot => Role::Newest,
            (_, Some(m)) if m.ready => Role::Superseded,
            _ => Role::Pending,
        }
    }

    /// The program's table: every live slot that has served (is or was ready: the others
    /// have no connection and no marker yet) routed to its own index, new connections to
    /// the newest. `None` without members.
    pub fn routing(&self) -> Option<RoutingTable> {
        let newest = self.newest()?;
        Some(RoutingTable {
            newest: newest.slot as u32,
            routes: self
                .members
                .iter()
                .filter(|m| m.ready)
                .map(|m| Route {
                    slot: m.slot,
                    index: m.slot as u32,
                    marker: m.marker,
                })
                .collect(),
        })
    }

    /// The slot for a new process when the group has `existing` slots: the lowest one
    /// without a live owner, else a new one, else none.
    pub fn allocate(&self, existing: usize) -> Allocation {
        match (0..existing).find(|s| self.get(*s).is_none()) {
            Some(s) => Allocation::Reuse(s),
            None if existing < MAX_SLOTS => Allocation::Append(existing),
            None => Allocation::Full,
        }
    }

    /// A generation number above every one in the table and above `floor`.
    pub fn next_generation(&self, floor: u64) -> u64 {
        let top = self.members.iter().map(|m| m.generation).max().unwrap_or(0);
        top.max(floor) + 1
    }

    /// The survivors of `dead`'s death, in the order they try to take over the coordination:
    /// newest first, so the process that takes new connections next also coordinates.
    pub fn takeover_order(&self, dead: usize) -> Vec<usize> {
        let mut rest: Vec<&Member> = self.members.iter().filter(|m| m.slot != dead).collect();
        rest.sort_by_key(|m| std::cmp::Reverse((m.eligible(), m.key())));
        rest.iter().map(|m| m.slot).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(slot: usize, generation: u64, ready: bool) -> Member {
        Member {
            slot,
            generation,
            rank: 0,
            marker: 0x1800 | slot as u16,
            ready,
            terminating: false,
        }
    }

    #[test]
    fn the_newest_ready_generation_takes_new_connections() {
        let mut t = Table::default();
        assert_eq!(t.newest(), None);
        assert_eq!(t.routing(), None);
        // A first process still loading takes them: nobody else would.
        t.upsert(m(0, 1, false));
        assert_eq!(t.role(0), Role::Newest);
        t.upsert(m(0, 1, true));
        // A joiner loading does not take them from a ready one.
        t.upsert(m(1, 2, false));
        assert_eq!((t.role(0), t.role(1)), (Role::Newest, Role::Pending));
        t.upsert(m(1, 2, true));
        assert_eq!((t.role(0), t.role(1)), (Role::Superseded, Role::Newest));
        let r = t.routing().unwrap();
        assert_eq!(r.newest, 1);
        assert_eq!(r.routes.len(), 2);
        assert_eq!(r.routes[1].marker, 0x1801);
        // The newest shuts down: the previous one takes them back.
        let mut n = *t.get(1).unwrap();
        n.terminating = true;
        t.upsert(n);
        assert_eq!((t.role(0), t.role(1)), (Role::Newest, Role::Superseded));
        // It dies: its slot is free for the next process, and only slot 0 is routed.
        t.remove(1);
        assert_eq!(t.allocate(2), Allocation::Reuse(1));
        assert_eq!(t.routing().unwrap().routes.len(), 1);
        assert_eq!(t.next_generation(0), 2);
        assert_eq!(t.next_generation(7), 8);
    }

    #[test]
    fn rank_outranks_join_order() {
        let mut t = Table::default();
        let mut new_pod = m(0, 1, true);
        new_pod.rank = 5;
        t.upsert(new_pod);
        // An old pod's container restarted: it joins later but with a lower rank.
        let mut old_pod = m(1, 2, true);
        old_pod.rank = 4;
        t.upsert(old_pod);
        assert_eq!((t.role(0), t.role(1)), (Role::Newest, Role::Superseded));
        assert_eq!(t.takeover_order(7), vec![0, 1]);
    }

    #[test]
    fn slots_are_reused_lowest_first_and_bounded() {
        let mut t = Table::default();
        for s in 0..MAX_SLOTS {
            assert_eq!(t.allocate(s), Allocation::Append(s));
            t.upsert(m(s, s as u64 + 1, true));
        }
        assert_eq!(t.allocate(MAX_SLOTS), Allocation::Full);
        t.remove(5);
        t.remove(2);
        assert_eq!(t.allocate(MAX_SLOTS), Allocation::Reuse(2));
        // Survivors of the newest's death: ready ones newest first.
        t.upsert(m(2, 20, false));
        assert_eq!(t.takeover_order(7), vec![6, 4, 3, 1, 0, 2]);
    }
}
