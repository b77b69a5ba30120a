//! A process's way into the port (join the hub, become it, or start solo), its life as a
//! member of a hub, and the take-over when the hub dies.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn, Level};

use super::group::Group;
use super::hub::{self, Hub};
use super::membership::{apply_local, Membership};
use super::steer::{Route, RoutingTable};
use super::table::{Member, Table};
use super::unix::{own_uid, Conn, Connected, Listener};
use super::wire::{self, FdTag, ToHub, ToMember, PROTOCOL};
use super::{Joined, Local, Report, Spec, ANSWER_TIMEOUT, ENTRY_BOUND, RETRY};
use crate::proxy::observe::logs::{limited, Reason};
use crate::proxy::observe::procnet::SocketTables;
use crate::proxy::quic::cid::MAX_SLOTS;
use crate::proxy::quic::socket;

/// How long each survivor ahead in the take-over order gets before the next one tries.
const TAKEOVER_STEP: Duration = Duration::from_millis(150);

/// What a Welcome brought.
struct Welcome {
    slot: usize,
    generation: u64,
    secret: String,
    sockets: Vec<FdTag>,
    admin: bool,
    fds: Vec<std::os::fd::OwnedFd>,
}

enum Entry {
    Hub(Listener),
    Member(Arc<Conn>, Welcome),
    Solo(String),
}

/// The coordination task of one process, until the process exits.
pub(super) async fn run(spec: Spec, mut report: Report) {
    let me = Member {
        slot: 0,
        generation: 1,
        rank: spec.rank,
        marker: 0,
        ready: false,
        terminating: false,
    };
    let mut m = match enter(&spec, &mut report).await {
        Entry::Hub(listener) => return hub::run(Hub::first(spec, listener, me), &mut report).await,
        Entry::Solo(why) => return solo(spec, report, why).await,
        Entry::Member(conn, w) => match welcomed(conn, w, spec, me, &mut report) {
            Some(m) => m,
            None => return,
        },
    };
    loop {
        if !serve(&mut m, &mut report).await {
            return;
        }
        match take_over(m, &mut report).await {
            Next::Member(next) => m = next,
            Next::Hub(h) => return hub::run(h, &mut report).await,
            Next::Alone(group) => return alone(group, report).await,
        }
    }
}

/// Joins the hub, becomes it, or gives up and goes solo after [`ENTRY_BOUND`] without an
/// answer; a hub that says "wait" is asked again every [`RETRY`] for as long as it says so.
async fn enter(spec: &Spec, report: &mut Report) -> Entry {
    let mut deadline = Instant::now() + spec.entry_bound;
    loop {
        if Instant::now() > deadline {
            return Entry::Solo(format!(
                "no process answered on {} within {:?}",
                spec.name, spec.entry_bound
            ));
        }
        match Conn::connect(&spec.name, spec.entry_bound.min(ANSWER_TIMEOUT)).await {
            Err(e) => return Entry::Solo(format!("connecting to {}: {e}", spec.name)),
            Ok(Connected::NoListener) => match Listener::bind(&spec.name) {
                Ok(l) => return Entry::Hub(l),
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Entry::Solo(format!("listening on {}: {e}", spec.name)),
            },
            Ok(Connected::Yes(conn)) => match ask(&conn, spec).await {
                Answer::Welcome(w) => return Entry::Member(Arc::new(conn), w),
                Answer::Wait(reason) => {
                    report.view(|v| v.waiting = Some(reason));
                    tokio::time::sleep(RETRY).await;
                    deadline = Instant::now() + spec.entry_bound;
                }
                Answer::Gone => tokio::time::sleep(Duration::from_millis(50)).await,
                Answer::Refused(why) => return Entry::Solo(why),
            },
        }
    }
}

enum Answer {
    Welcome(Welcome),
    Wait(String),
    Gone,
    Refused(String),
}

/// Asks the process holding the name for a slot.
async fn ask(conn: &Conn, spec: &Spec) -> Answer {
    match conn.peer_uid() {
        Ok(uid) if uid == own_uid() => {}
        Ok(uid) => return Answer::Refused(format!("{} is held by uid {uid}", spec.name)),
        Err(e) => return Answer::Refused(format!("{}: {e}", spec.name)),
    }
    let join = ToHub::Join {
        protocol: PROTOCOL,
        rank: spec.rank,
        admin: spec.admin.to_string(),
    };
    if let Err(e) = conn.send(&wire::encode(&join), &[]).await {
        return Answer::Refused(format!("asking {} for a slot: {e}", spec.name));
    }
    let reply = match tokio::time::timeout(spec.entry_bound.min(ANSWER_TIMEOUT), conn.recv()).await
    {
        Err(_) => return Answer::Refused(format!("{} did not answer", spec.name)),
        Ok(Ok(None)) => return Answer::Gone,
        Ok(Err(e)) => return Answer::Refused(format!("{}: {e}", spec.name)),
        Ok(Ok(Some(r))) => r,
    };
    let (bytes, fds) = reply;
    match wire::to_member(&bytes, fds.len()) {
        Ok(ToMember::Welcome {
            slot,
            generation,
            secret,
            sockets,
            admin,
            ..
        }) => Answer::Welcome(Welcome {
            slot,
            generation,
            secret,
            sockets,
            admin,
            fds,
        }),
        Ok(ToMember::Wait { reason }) => Answer::Wait(reason),
        Ok(ToMember::Refused { reason }) => Answer::Refused(format!("{}: {reason}", spec.name)),
        Ok(other) => Answer::Refused(format!("{}: unexpected answer {other:?}", spec.name)),
        Err(e) => Answer::Refused(format!("{}: {e}", spec.name)),
    }
}

/// Takes the sockets of a Welcome and tells the server its slot.
fn welcomed(
    conn: Arc<Conn>,
    w: Welcome,
    spec: Spec,
    mut me: Member,
    report: &mut Report,
) -> Option<Membership> {
    let mut group = Group::default();
    if let Err(e) = group.merge(&w.sockets, w.fds, w.admin) {
        limited!(Level::WARN, Reason::Handover, error = %e, "the hub's sockets are unusable");
    }
    let own = match group.slot_sockets(w.slot) {
        Ok(s) if !s.is_empty() => s,
        _ => {
            limited!(
                Level::WARN,
                Reason::Handover,
                slot = w.slot,
                "no socket for the slot given"
            );
            return None;
        }
    };
    me.slot = w.slot;
    me.generation = w.generation;
    let secret = hex::decode(&w.secret).ok().filter(|s| !s.is_empty());
    info!(
        slot = w.slot,
        generation = w.generation,
        "joined the processes sharing the port"
    );
    report.joined(Joined {
        slot: w.slot,
        generation: w.generation,
        secret: secret.clone(),
        admin: group.admin_listener(),
    });
    report.sockets(own);
    report.view(|v| {
        v.slot = Some(w.slot);
        v.generation = w.generation;
        v.waiting = None;
    });
    Some(Membership {
        conn,
        group,
        table: Table::default(),
        hub: usize::MAX,
        me,
        secret,
        spec,
    })
}

fn update(me: &Member) -> Vec<u8> {
    wire::encode(&ToHub::Update {
        ready: me.ready,
        terminating: me.terminating,
        marker: me.marker,
    })
}

/// Serves the membership until the hub goes (`true`) or the process ends (`false`).
async fn serve(m: &mut Membership, report: &mut Report) -> bool {
    loop {
        tokio::select! {
            r = m.conn.recv() => match r {
                Ok(Some((bytes, fds))) => match wire::to_member(&bytes, fds.len()) {
                    Ok(ToMember::Table { table, hub }) => {
                        m.table = table;
                        m.hub = hub;
                        report.view(|v| {
                            v.role = m.table.role(m.me.slot);
                            v.generations = m.table.members.len();
                            v.hub = false;
                        });
                    }
                    Ok(ToMember::Sockets { sockets }) => {
                        if let Err(e) = m.group.merge(&sockets, fds, false) {
                            limited!(Level::WARN, Reason::Handover, error = %e, "new sockets unusable");
                        }
                    }
                    Ok(ToMember::Wait { reason } | ToMember::Refused { reason }) => {
                        limited!(Level::WARN, Reason::Handover, %reason, "the hub dropped this process");
                        return true;
                    }
                    Ok(other) => {
                        limited!(Level::WARN, Reason::Handover, message = ?other, "unexpected message");
                    }
                    Err(e) => limited!(Level::WARN, Reason::Handover, error = %e, "bad message"),
                },
                Ok(None) => return true,
                Err(e) => {
                    limited!(Level::WARN, Reason::Handover, error = %e, "connection to the hub failed");
                    return true;
                }
            },
            l = report.local.recv() => {
                let Some(l) = l else { return false };
                if apply_local(&mut m.me, &mut m.secret, &mut m.group, l) {
                    let _ = m.conn.send(&update(&m.me), &[]).await;
                }
            }
        }
    }
}

enum Next {
    Member(Membership),
    Hub(Hub),
    Alone(Group),
}

/// After the hub's death: the survivors, next newest first, try to become the hub; the
/// others reconnect to whoever did, with every socket they hold.
async fn take_over(mut m: Membership, report: &mut Report) -> Next {
    let dead = m.hub;
    let order = m.table.takeover_order(dead);
    let pos = order
        .iter()
        .position(|s| *s == m.me.slot)
        .unwrap_or(order.len());
    limited!(
        Level::INFO,
        Reason::Rollout,
        dead_slot = dead,
        position = pos,
        "the coordinating process is gone; taking over"
    );
    tokio::time::sleep(TAKEOVER_STEP * pos as u32).await;
    let deadline = Instant::now() + ENTRY_BOUND;
    while Instant::now() < deadline {
        match Conn::connect(&m.spec.name, ANSWER_TIMEOUT).await {
            Ok(Connected::Yes(conn)) => {
                if conn.peer_uid().ok() == Some(own_uid()) && rejoin(&conn, &m).await.is_ok() {
                    m.conn = Arc::new(conn);
                    return Next::Member(m);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Connected::NoListener) => match Listener::bind(&m.spec.name) {
                Ok(l) => return Next::Hub(Hub::after(m, l, dead)),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    warn!("no coordinating process after {ENTRY_BOUND:?}; serving on without one");
    report.view(|v| v.hub = false);
    Next::Alone(m.group)
}

async fn rejoin(conn: &Conn, m: &Membership) -> std::io::Result<()> {
    let admin = m.group.admin.is_some();
    let (sockets, fds) = m.group.tagged(0, admin);
    let msg = ToHub::Rejoin {
        protocol: PROTOCOL,
        member: m.me,
        sockets,
        admin,
    };
    conn.send(&wire::encode(&msg), &fds).await
}

/// Holds the sockets (so none leaves the group) until the process ends.
async fn alone(group: Group, mut report: Report) {
    while report.local.recv().await.is_some() {}
    drop(group);
}

/// Without a hand-over: joins the group at its end, and once ready routes new connections
/// to itself and every lower slot to its own index (the scheme of the processes already
/// there, whose markers it assumes are its own).
async fn solo(spec: Spec, mut report: Report, why: String) {
    warn!(reason = %why, "starting without a hand-over from the process holding the port");
    let sockets = loop {
        let bound: Result<Vec<_>, _> = spec
            .addrs
            .iter()
            .map(|a| socket::group_socket(*a))
            .collect();
        match bound {
            Ok(s) => break s,
            Err(e) => {
                report.view(|v| v.waiting = Some(e.to_string()));
                tokio::time::sleep(RETRY).await;
            }
        }
    };
    let index = sockets
        .first()
        .and_then(|s| s.local_addr().ok())
        .map(|a| SocketTables::read().bound_to(a).saturating_sub(1))
        .unwrap_or(0);
    let slot = index.min(MAX_SLOTS - 1);
    let group_fds: Vec<_> = sockets
        .iter()
        .filter_map(|s| super::unix::dup(s).ok())
        .collect();
    report.joined(Joined {
        slot,
        generation: 0,
        secret: None,
        admin: None,
    });
    report.sockets(sockets);
    report.view(|v| {
        v.slot = Some(slot);
        v.solo = true;
        v.waiting = None;
    });
    while let Some(l) = report.local.recv().await {
        let Local::Ready { marker } = l else { continue };
        report.view(|v| v.role = super::Role::Newest);
        if index >= MAX_SLOTS {
            warn!(
                index,
                "too many sockets in the port's group to route by slot"
            );
            continue;
        }
        let table = RoutingTable {
            newest: index as u32,
            routes: (0..=index)
                .map(|s| Route {
                    slot: s,
                    index: s as u32,
                    marker,
                })
                .collect(),
        };
        let prog = super::steer::program(&table);
        for fd in &group_fds {
            use std::os::fd::AsFd;
            if let Err(e) = super::steer::attach(fd.as_fd(), &prog) {
                warn!(error = %e, "socket-selection program not attached");
            }
        }
    }
}
