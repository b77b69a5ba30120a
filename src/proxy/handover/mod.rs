//! Hitless restarts and rollouts on one host: process generations share the UDP port, and
//! each datagram reaches the generation that owns its connection.
//!
//! Every process serving the same port and addresses on a host (two DaemonSet pods under
//! hostNetwork during a roll, or `h3-ingress proxy --config X` started again) has a *slot*:
//! its sockets in the port's SO_REUSEPORT groups (one per address family) and the number in
//! every connection ID it issues ([`crate::proxy::quic::cid`]). A socket-selection program
//! ([`steer`]) sends each datagram to the slot in its connection ID, and the
//! connections nobody owns yet to the newest generation.
//!
//! - **Coordination.** One process, the *hub*, listens on an abstract unix socket named
//!   after the port and addresses ([`name`]); every other one has a connection to it. A new
//!   process connects (the peer must have its uid), gets a slot and a copy of every slot
//!   socket of the group (`SCM_RIGHTS`), re-applies its own socket settings to its slot's
//!   sockets, loads its configuration, and says when it is ready; only then does the hub
//!   make it the newest and attach the new program, and every process learns its role from
//!   the table the hub sends ([`table`]): the previous newest is superseded and drains.
//! - **Nothing moves.** Every process holds every slot socket, so no socket leaves a group
//!   while any process lives, and slot N stays at index N of the kernel's array (closing a
//!   socket would move the group's last one into its place). A free slot (its owner gone)
//!   is reused by the next process; at most [`crate::proxy::quic::cid::MAX_SLOTS`]
//!   generations live at once, a process beyond that waits (not ready) until one exits.
//! - **Deaths.** The hub sees a process die (its connection closes), frees its slot and
//!   re-attaches the program. When the hub dies, the survivors take over in the order of
//!   [`table::Table::takeover_order`] (the next newest first): the first binds the name and
//!   re-attaches the program, the others reconnect to it with every socket they hold.
//! - **No predecessor.** The first process creates the group (retrying every second while
//!   the port is held by a socket it cannot join, e.g. h3-ingress 0.1.0's) and attaches a
//!   program too, so a socket that joins later receives nothing until its owner is ready.
//! - **No answer.** A process that cannot get a slot from a process holding the name within
//!   [`ENTRY_BOUND`] starts on its own ("solo"): it adds its sockets to the group at the end,
//!   routes new connections to itself and the slots below it by their number, and logs why.
//!
//! Every line a peer can cause is rate-limited ([`crate::proxy::observe::logs`]).

pub mod group;
mod hub;
mod member;
mod membership;
pub mod steer;
pub mod table;
pub mod unix;
pub mod wire;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

pub use table::{Member, Role};

use crate::config::ListenConfig;
use crate::proxy::quic::socket;

/// How long a new process tries to get a slot from a process that holds the name before it
/// starts on its own.
pub const ENTRY_BOUND: Duration = Duration::from_secs(10);
/// How long a process waits for a peer's answer.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a new hub keeps the slots of processes that have not reconnected yet.
pub const REJOIN_GRACE: Duration = Duration::from_secs(3);
/// Pause between the attempts of a process that was told to wait, and of a first process
/// whose port is held.
pub const RETRY: Duration = Duration::from_secs(1);

/// The abstract socket name of a listen configuration: one per port and address set, and
/// per `identity` (the listener's name under Kubernetes, so the pods of two listeners that
/// were given the same port never hand it over to each other: the second one waits).
/// The port stays readable (`ss -xl`); addresses and identity are hashed, so the name fits
/// the 107 bytes of an abstract address whatever they are.
pub fn name(listen: &ListenConfig, identity: Option<&str>) -> String {
    use sha2::Digest;
    let v4 = listen.ipv4.map_or("-".to_string(), |a| a.to_string());
    let v6 = listen.ipv6.map_or("-".to_string(), |a| a.to_string());
    let what = format!("{v4}|{v6}|{}", identity.unwrap_or(""));
    let digest = sha2::Sha256::digest(what.as_bytes());
    format!(
        "h3-ingress/udp/{}/{}",
        listen.port,
        hex::encode(&digest[..8])
    )
}

/// What a process is, as the server needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub role: Role,
    pub slot: Option<usize>,
    pub generation: u64,
    /// Live generations sharing the port, this one included.
    pub generations: usize,
    /// Holds the name (coordinates the others).
    pub hub: bool,
    /// Started without a hand-over (no answer from the process holding the name).
    pub solo: bool,
    /// Why the process does not serve yet, while it waits.
    pub waiting: Option<String>,
    /// Configured addresses the port's first process could not bind, with the error.
    pub unbound: Vec<(SocketAddr, String)>,
}

impl Default for View {
    fn default() -> Self {
        View {
            role: Role::Pending,
            slot: None,
            generation: 0,
            generations: 0,
            hub: false,
            solo: false,
            waiting: Some("joining the processes sharing the port".into()),
            unbound: Vec::new(),
        }
    }
}

/// What the server tells the coordinator about its own process.
#[derive(Debug)]
pub enum Local {
    /// Loaded and serving: may take new connections; its CIDs carry `marker`.
    Ready { marker: u16 },
    /// Shutting down on a signal.
    Terminating,
    /// The endpoint secret, for processes that join later without a keys file.
    Secret(Vec<u8>),
    /// The admin listener this process bound, to share.
    Admin(OwnedFd),
}

/// The slot a process got.
#[derive(Debug)]
pub struct Joined {
    pub slot: usize,
    pub generation: u64,
    /// The endpoint secret of the process it joined (used without a keys file).
    pub secret: Option<Vec<u8>>,
    /// The shared admin listener, when its address is this process's too.
    pub admin: Option<TcpListener>,
}

/// What a process brings: its addresses, admin address and rank.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub addrs: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub rank: u64,
    /// [`ENTRY_BOUND`], shorter in tests.
    pub entry_bound: Duration,
}

impl Spec {
    pub fn new(
        listen: &ListenConfig,
        identity: Option<&str>,
        admin: SocketAddr,
        rank: u64,
    ) -> Spec {
        Spec {
            name: name(listen, identity),
            addrs: socket::addresses(listen),
            admin,
            rank,
            entry_bound: ENTRY_BOUND,
        }
    }
}

/// The server's side of the coordination.
pub struct Handle {
    pub view: watch::Receiver<View>,
    joined: Option<oneshot::Receiver<Joined>>,
    sockets: Option<oneshot::Receiver<Vec<UdpSocket>>>,
    tx: mpsc::UnboundedSender<Local>,
}

/// The coordinator's side: where it reports.
pub(crate) struct Report {
    pub view: watch::Sender<View>,
    pub joined: Option<oneshot::Sender<Joined>>,
    pub sockets: Option<oneshot::Sender<Vec<UdpSocket>>>,
    pub local: mpsc::UnboundedReceiver<Local>,
}

impl Report {
    pub fn view(&self, f: impl FnOnce(&mut View)) {
        self.view.send_modify(f);
    }

    pub fn joined(&mut self, j: Joined) {
        if let Some(tx) = self.joined.take() {
            let _ = tx.send(j);
        }
    }

    pub fn sockets(&mut self, s: Vec<UdpSocket>) {
        if let Some(tx) = self.sockets.take() {
            let _ = tx.send(s);
        }
    }

    /// This process will get no sockets ([`View::waiting`] says why).
    pub fn sockets_failed(&mut self) {
        self.sockets = None;
    }
}

/// Why the process cannot take part at all.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("the coordination of the processes sharing the port ended before this one joined")]
    Ended,
}

impl Handle {
    /// The slot this process got (after waiting, if it was told to).
    pub async fn joined(&mut self) -> Result<Joined, HandoverError> {
        let rx = self.joined.take().ok_or(HandoverError::Ended)?;
        rx.await.map_err(|_| HandoverError::Ended)
    }

    /// This process's own sockets, once the group exists.
    pub async fn sockets(&mut self) -> Result<Vec<UdpSocket>, HandoverError> {
        let rx = self.sockets.take().ok_or(HandoverError::Ended)?;
        rx.await.map_err(|_| HandoverError::Ended)
    }

    pub fn tell(&self, l: Local) {
        let _ = self.tx.send(l);
    }

    /// The channel of [`Handle::tell`], for code that holds the handle mutably elsewhere.
    pub fn tx(&self) -> mpsc::UnboundedSender<Local> {
        self.tx.clone()
    }
}

/// Starts the coordination of this process with the others sharing its port.
pub fn start(spec: Spec) -> Handle {
    let (view_tx, view) = watch::channel(View::default());
    let (joined_tx, joined) = oneshot::channel();
    let (sockets_tx, sockets) = oneshot::channel();
    let (tx, local) = mpsc::unbounded_channel();
    let report = Report {
        view: view_tx,
        joined: Some(joined_tx),
        sockets: Some(sockets_tx),
        local,
    };
    tokio::spawn(member::run(spec, report));
    Handle {
        view,
        joined: Some(joined),
        sockets: Some(sockets),
        tx,
    }
}

#[cfg(test)]
mod tests;
