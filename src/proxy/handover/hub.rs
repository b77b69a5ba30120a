//! The coordinating process: it hands slots and sockets to new processes, keeps the table of
//! live generations, attaches the program whenever the table changes and tells every process
//! its role.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::{debug, info, warn, Level};

use super::group::{CreateError, Group};
use super::membership::{apply_local, Membership};
use super::steer::RoutingTable;
use super::table::{Allocation, Member, Table};
use super::unix::{own_uid, Conn, Listener};
use super::wire::{self, ToHub, ToMember, PROTOCOL};
use super::{Joined, Report, Spec, ANSWER_TIMEOUT, REJOIN_GRACE, RETRY};
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::procnet::SocketTables;
use crate::proxy::quic::cid::MAX_SLOTS;

/// How long one message to a member may take before the member counts as gone (a stuck
/// process must not stall the hub).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// Connections still to say who they are; more are closed at once.
const MAX_GREETINGS: usize = 16;

pub(super) struct Hub {
    listener: Listener,
    spec: Spec,
    group: Group,
    table: Table,
    me: Member,
    secret: Option<Vec<u8>>,
    links: HashMap<usize, Arc<Conn>>,
    /// The highest generation handed out, so numbers keep growing across hubs.
    floor: u64,
    /// Members of the previous hub that have not reconnected yet, and until when they may.
    awaiting: HashMap<usize, Instant>,
    attached: Option<RoutingTable>,
    /// Why new processes cannot get a slot now (the group is not bound yet, the program
    /// cannot be attached).
    blocked: Option<String>,
    broadcast: Option<Table>,
}

enum Event {
    Greeted(Arc<Conn>, ToHub, Vec<OwnedFd>),
    Message(usize, ToHub),
    Gone(usize),
}

impl Hub {
    /// The first process on the port: slot 0 of a group still to be bound.
    pub fn first(spec: Spec, listener: Listener, me: Member) -> Hub {
        info!(name = %spec.name, "first process on the port: coordinating");
        Hub {
            listener,
            spec,
            group: Group::default(),
            table: Table::default(),
            me,
            secret: None,
            links: HashMap::new(),
            floor: me.generation,
            awaiting: HashMap::new(),
            attached: None,
            blocked: Some("binding the UDP sockets".into()),
            broadcast: None,
        }
    }

    /// A member taking over after the hub `dead` died: the others keep their slots for
    /// [`REJOIN_GRACE`] to reconnect.
    pub fn after(m: Membership, listener: Listener, dead: usize) -> Hub {
        info!(
            slot = m.me.slot,
            "coordinating the port after the previous coordinator died"
        );
        let mut table = m.table;
        table.remove(dead);
        let until = Instant::now() + REJOIN_GRACE;
        let awaiting = table
            .members
            .iter()
            .filter(|x| x.slot != m.me.slot)
            .map(|x| (x.slot, until))
            .collect();
        let floor = table.next_generation(m.me.generation);
        Hub {
            listener,
            spec: m.spec,
            group: m.group,
            table,
            me: m.me,
            secret: m.secret,
            links: HashMap::new(),
            floor,
            awaiting,
            attached: None,
            blocked: None,
            broadcast: None,
        }
    }
}

/// Coordinates until the process ends.
pub(super) async fn run(mut hub: Hub, report: &mut Report) {
    let (tx, mut rx) = mpsc::channel(64);
    if hub.group.slots() == 0 {
        report.joined(Joined {
            slot: 0,
            generation: hub.me.generation,
            secret: None,
            admin: None,
        });
        report.view(|v| v.slot = Some(0));
        hub.create(report);
    }
    hub.recompute(report).await;
    let mut tick = tokio::time::interval(RETRY);
    let greeting = Arc::new(tokio::sync::Semaphore::new(MAX_GREETINGS));
    loop {
        tokio::select! {
            c = hub.listener.accept() => match c {
                Ok(c) => match greeting.clone().try_acquire_owned() {
                    Ok(permit) => {
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            greet(c, tx).await;
                            drop(permit);
                        });
                    }
                    Err(_) => limited!(Level::WARN, Reason::Handover, "too many processes connecting at once; closed one"),
                },
                Err(e) => limited!(Level::WARN, Reason::Handover, error = %e, "accept failed"),
            },
            Some(ev) = rx.recv() => hub.event(ev, &tx).await,
            l = report.local.recv() => {
                let Some(l) = l else {
                    // The process is ending: the members must see it now (their readers
                    // hold the connections too).
                    for c in hub.links.values() {
                        c.shutdown();
                    }
                    return;
                };
                apply_local(&mut hub.me, &mut hub.secret, &mut hub.group, l);
            }
            _ = tick.tick() => hub.tick(report),
        }
        hub.recompute(report).await;
    }
}

/// Reads a new connection's first message (from a process of our uid, within the timeout).
async fn greet(conn: Conn, tx: mpsc::Sender<Event>) {
    match conn.peer_uid() {
        Ok(uid) if uid == own_uid() => {}
        other => {
            limited!(Level::WARN, Reason::Handover, peer = ?other, "refused a connection from another user");
            return;
        }
    }
    let first = tokio::time::timeout(ANSWER_TIMEOUT, conn.recv()).await;
    let Ok(Ok(Some((bytes, fds)))) = first else {
        limited!(
            Level::WARN,
            Reason::Handover,
            "a process connected and said nothing"
        );
        return;
    };
    match wire::to_hub(&bytes, fds.len()) {
        Ok(m @ (ToHub::Join { .. } | ToHub::Rejoin { .. })) => {
            let _ = tx.send(Event::Greeted(Arc::new(conn), m, fds)).await;
        }
        Ok(_) => limited!(
            Level::WARN,
            Reason::Handover,
            "a process began with an update"
        ),
        Err(e) => {
            limited!(Level::WARN, Reason::Handover, error = %e, "refused a process");
            let refused = ToMember::Refused {
                reason: e.to_string(),
            };
            let _ = conn.send(&wire::encode(&refused), &[]).await;
        }
    }
}

/// Forwards a member's messages to the hub until it goes.
async fn read(slot: usize, conn: Arc<Conn>, tx: mpsc::Sender<Event>) {
    loop {
        match conn.recv().await {
            Ok(Some((bytes, fds))) => match wire::to_hub(&bytes, fds.len()) {
                Ok(m) => {
                    if tx.send(Event::Message(slot, m)).await.is_err() {
                        return;
                    }
                }
                Err(e) => limited!(Level::WARN, Reason::Handover, slot, error = %e, "bad message"),
            },
            Ok(None) | Err(_) => {
                let _ = tx.send(Event::Gone(slot)).await;
                return;
            }
        }
    }
}

async fn send(conn: &Conn, msg: &ToMember, fds: &[std::os::fd::BorrowedFd<'_>]) -> bool {
    matches!(
        tokio::time::timeout(SEND_TIMEOUT, conn.send(&wire::encode(msg), fds)).await,
        Ok(Ok(()))
    )
}

impl Hub {
    /// Tries to bind the group's first slot; on success this process gets its sockets.
    fn create(&mut self, report: &mut Report) {
        match Group::create(&self.spec.addrs, |a| SocketTables::read().bound_to(a)) {
            Ok((group, failed)) => {
                let unbound = failed.iter().map(|(a, e)| (*a, e.to_string())).collect();
                report.view(|v| v.unbound = unbound);
                self.group = group;
                self.blocked = None;
                match self.group.slot_sockets(0) {
                    Ok(s) => report.sockets(s),
                    Err(e) => warn!(error = %e, "copying the sockets failed"),
                }
            }
            Err(CreateError::Busy(why)) => {
                if self.blocked.as_deref() != Some(why.as_str()) {
                    warn!("UDP sockets not bound: {why}");
                }
                self.blocked = Some(why);
            }
            // No address can be bound at all (none on this host, no permission): as before
            // the hand-over, the process fails with the reason rather than wait forever.
            Err(CreateError::Failed(why)) => {
                self.blocked = Some(why.clone());
                report.view(|v| v.waiting = Some(why));
                report.sockets_failed();
            }
        }
    }

    fn tick(&mut self, report: &mut Report) {
        if self.group.slots() == 0 {
            self.create(report);
        }
        let now = Instant::now();
        let late: Vec<usize> = self
            .awaiting
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(s, _)| *s)
            .collect();
        for slot in late {
            self.awaiting.remove(&slot);
            if !self.links.contains_key(&slot) {
                limited!(
                    Level::INFO,
                    Reason::Rollout,
                    slot,
                    "a process did not reconnect after the take-over; slot freed"
                );
                self.table.remove(slot);
            }
        }
    }

    async fn event(&mut self, ev: Event, tx: &mpsc::Sender<Event>) {
        match ev {
            Event::Greeted(conn, ToHub::Join { rank, admin, .. }, _) => {
                self.join(conn, rank, &admin, tx).await
            }
            Event::Greeted(
                conn,
                ToHub::Rejoin {
                    member,
                    sockets,
                    admin,
                    ..
                },
                fds,
            ) => self.rejoin(conn, member, &sockets, fds, admin, tx).await,
            Event::Greeted(..) => {}
            Event::Message(
                slot,
                ToHub::Update {
                    ready,
                    terminating,
                    marker,
                },
            ) => {
                if let Some(mut m) = self.table.get(slot).copied() {
                    (m.ready, m.terminating, m.marker) = (ready, terminating, marker);
                    self.table.upsert(m);
                }
            }
            Event::Message(slot, _) => {
                limited!(
                    Level::WARN,
                    Reason::Handover,
                    slot,
                    "unexpected message from a member"
                );
            }
            Event::Gone(slot) => {
                self.awaiting.remove(&slot);
                if self.links.remove(&slot).is_some() {
                    limited!(
                        Level::INFO,
                        Reason::Rollout,
                        slot,
                        "a process sharing the port is gone; slot freed"
                    );
                    self.table.remove(slot);
                }
            }
        }
    }

    /// Why a new process cannot have a slot now, if it cannot.
    fn refusal(&self) -> Option<String> {
        if let Some(b) = &self.blocked {
            return Some(b.clone());
        }
        (self.table.allocate(self.group.slots()) == Allocation::Full).then(|| {
            format!(
                "all {MAX_SLOTS} slots of the port have a live process; waiting for one to exit"
            )
        })
    }

    async fn join(&mut self, conn: Arc<Conn>, rank: u64, admin: &str, tx: &mpsc::Sender<Event>) {
        if let Some(reason) = self.refusal() {
            let _ = send(&conn, &ToMember::Wait { reason }, &[]).await;
            return;
        }
        let slot = match self.table.allocate(self.group.slots()) {
            Allocation::Reuse(s) => s,
            Allocation::Append(_) => match self.group.append() {
                Ok(s) => {
                    let (tags, fds) = self.group.tagged(s, false);
                    let msg = ToMember::Sockets { sockets: tags };
                    for c in self.links.values() {
                        send(c, &msg, &fds).await;
                    }
                    s
                }
                Err(e) => {
                    let reason = format!("adding a slot: {e}");
                    limited!(Level::WARN, Reason::Handover, %reason, "a new process gets no slot");
                    let _ = send(&conn, &ToMember::Wait { reason }, &[]).await;
                    return;
                }
            },
            Allocation::Full => return,
        };
        let generation = self.table.next_generation(self.floor);
        self.floor = generation;
        let share_admin = admin == self.spec.admin.to_string() && self.group.admin.is_some();
        let (sockets, fds) = self.group.tagged(0, share_admin);
        let welcome = ToMember::Welcome {
            protocol: PROTOCOL,
            slot,
            generation,
            secret: self.secret.as_deref().map(hex::encode).unwrap_or_default(),
            sockets,
            admin: share_admin,
        };
        if !send(&conn, &welcome, &fds).await {
            return;
        }
        limited!(
            Level::INFO,
            Reason::Rollout,
            slot,
            generation,
            rank,
            "a new process joined the port"
        );
        self.table.upsert(Member {
            slot,
            generation,
            rank,
            marker: 0,
            ready: false,
            terminating: false,
        });
        self.links.insert(slot, conn.clone());
        tokio::spawn(read(slot, conn, tx.clone()));
    }

    async fn rejoin(
        &mut self,
        conn: Arc<Conn>,
        member: Member,
        sockets: &[wire::FdTag],
        fds: Vec<OwnedFd>,
        admin: bool,
        tx: &mpsc::Sender<Event>,
    ) {
        let taken = self.links.contains_key(&member.slot)
            || member.slot == self.me.slot
            || self
                .table
                .get(member.slot)
                .is_some_and(|m| m.generation != member.generation);
        if taken {
            let reason = format!("slot {} belongs to another process", member.slot);
            limited!(
                Level::WARN,
                Reason::Handover,
                slot = member.slot,
                "refused a rejoin"
            );
            let _ = send(&conn, &ToMember::Wait { reason }, &[]).await;
            return;
        }
        match self.group.merge(sockets, fds, admin) {
            Ok(0) => {}
            Ok(n) => limited!(
                Level::INFO,
                Reason::Rollout,
                slot = member.slot,
                sockets = n,
                "took sockets from a reconnecting process"
            ),
            Err(e) => limited!(Level::WARN, Reason::Handover, error = %e, "its sockets differ"),
        }
        self.awaiting.remove(&member.slot);
        self.floor = self.floor.max(member.generation);
        self.table.upsert(member);
        self.links.insert(member.slot, conn.clone());
        self.broadcast = None;
        tokio::spawn(read(member.slot, conn, tx.clone()));
    }

    /// Attaches the program and tells everyone when the table changed.
    async fn recompute(&mut self, report: &mut Report) {
        self.table.upsert(self.me);
        let routing = self.table.routing().filter(|_| self.group.slots() > 0);
        if routing.is_some() && routing != self.attached {
            let r = routing.clone().expect("checked");
            match self.group.attach(&r) {
                Ok(()) => {
                    debug!(
                        newest_slot = r.newest,
                        live = r.routes.len(),
                        "socket-selection program attached"
                    );
                    self.attached = routing;
                }
                Err(e) => {
                    let why = format!(
                        "SO_ATTACH_REUSEPORT_CBPF failed ({e}; it needs Linux 4.5+): no other \
                         process can share the port until this one exits"
                    );
                    if self.blocked.as_deref() != Some(why.as_str()) {
                        warn!("{why}");
                    }
                    self.blocked = Some(why);
                }
            }
        }
        if self.broadcast.as_ref() != Some(&self.table) {
            let msg = ToMember::Table {
                table: self.table.clone(),
                hub: self.me.slot,
            };
            let mut dead = Vec::new();
            for (slot, c) in &self.links {
                if !send(c, &msg, &[]).await {
                    dead.push(*slot);
                }
            }
            for slot in dead {
                limited!(
                    Level::WARN,
                    Reason::Handover,
                    slot,
                    "a process does not read; dropped"
                );
                if let Some(c) = self.links.remove(&slot) {
                    c.shutdown();
                }
                self.table.remove(slot);
            }
            self.broadcast = Some(self.table.clone());
        }
        let (table, me) = (&self.table, self.me);
        let waiting = self.blocked.clone().filter(|_| self.group.slots() == 0);
        report.view(|v| {
            v.role = table.role(me.slot);
            v.slot = Some(me.slot);
            v.generation = me.generation;
            v.generations = table.members.len();
            v.hub = true;
            v.waiting = waiting;
        });
    }
}
