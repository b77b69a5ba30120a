//! What a process knows as a member of the processes sharing the port, shared by the
//! member's loop and the hub it may become: its membership, and how it applies what its own
//! server tells it.

use std::sync::Arc;

use super::group::Group;
use super::table::{Member, Table};
use super::unix::Conn;
use super::{Local, Spec};

/// A process's membership of a hub.
pub(super) struct Membership {
    pub conn: Arc<Conn>,
    pub group: Group,
    pub table: Table,
    pub hub: usize,
    pub me: Member,
    pub secret: Option<Vec<u8>>,
    pub spec: Spec,
}

/// Applies one message of the server to `me` (and the group); `true` when the hub must hear.
pub(super) fn apply_local(
    me: &mut Member,
    secret: &mut Option<Vec<u8>>,
    group: &mut Group,
    l: Local,
) -> bool {
    match l {
        Local::Ready { marker } => {
            me.ready = true;
            me.marker = marker;
            true
        }
        Local::Terminating => {
            me.terminating = true;
            true
        }
        Local::Secret(s) => {
            *secret = Some(s);
            false
        }
        Local::Admin(fd) => {
            group.admin.get_or_insert(fd);
            false
        }
    }
}
