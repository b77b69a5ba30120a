//! Ports and misbehaving upstreams.

use std::io::Read;
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use socket2::{Domain, Protocol, Socket, Type};

use super::error::{HarnessError, IoContext, Result};

/// Address family, for tests that must exercise IPv4 and IPv6 separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub const BOTH: [Family; 2] = [Family::V4, Family::V6];

    pub fn loopback(self) -> IpAddr {
        match self {
            Family::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Family::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
        }
    }

    /// The loopback address as curl's `--resolve` and URLs want it (`[::1]` bracketed).
    pub fn loopback_literal(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.1",
            Family::V6 => "[::1]",
        }
    }

    pub fn addr(self, port: u16) -> SocketAddr {
        SocketAddr::new(self.loopback(), port)
    }
}

/// Attempts used to find a free port; collisions are rare, a handful of tries makes
/// them irrelevant.
const PORT_ATTEMPTS: usize = 200;
/// Lowest port handed out: clear of the well-known and common service ports.
const PORT_FLOOR: u32 = 10_000;

/// Candidate ports come from below the kernel's ephemeral range. Ports from bind(0)
/// are ephemeral, and the many client connections tests make (curl, readiness polls)
/// draw their source ports from that same range: a port "free" a moment ago is then
/// taken by some connection before the server binds it. Below the range only
/// explicit binds compete, and the per-process sequence starting at a random offset
/// keeps concurrent tests and concurrent test binaries apart.
fn next_candidate() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    static CEILING: OnceLock<u32> = OnceLock::new();
    let ceiling = *CEILING.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
            .filter(|lo| *lo > PORT_FLOOR + 1_000)
            .unwrap_or(32_768)
    });
    let span = ceiling - PORT_FLOOR;
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
        let _ = NEXT.compare_exchange(u32::MAX, seed % span, Ordering::Relaxed, Ordering::Relaxed);
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    (PORT_FLOOR + n % span) as u16
}

fn tcp_free(port: u16) -> bool {
    // Both held at once, so the answer is about the pair.
    let v4 = TcpListener::bind((Ipv4Addr::LOCALHOST, port));
    let v6 = TcpListener::bind((Ipv6Addr::LOCALHOST, port));
    v4.is_ok() && v6.is_ok()
}

fn udp_free(port: u16) -> bool {
    let v4 = UdpSocket::bind((Ipv4Addr::LOCALHOST, port));
    let v6 = UdpSocket::bind((Ipv6Addr::LOCALHOST, port));
    v4.is_ok() && v6.is_ok()
}

fn find_port(what: &str, free: impl Fn(u16) -> bool) -> u16 {
    for _ in 0..PORT_ATTEMPTS {
        let port = next_candidate();
        if free(port) {
            return port;
        }
    }
    panic!("no {what} port free on both 127.0.0.1 and [::1] after {PORT_ATTEMPTS} attempts");
}

/// A TCP port free on both 127.0.0.1 and [::1] at the time of the call, so a fixture can
/// listen on "the same port in both families" as the data plane does. The port is
/// released before returning; fixtures retry with a new one if it is taken meanwhile.
pub fn free_tcp_port() -> u16 {
    find_port("TCP", tcp_free)
}

/// A UDP port free on both 127.0.0.1 and [::1] (see [`free_tcp_port`]).
pub fn free_udp_port() -> u16 {
    find_port("UDP", udp_free)
}

/// A port free for both TCP and UDP on both loopbacks: an HTTPS server that also speaks
/// HTTP/3 (Caddy, the proxy) uses the same number for both.
pub fn free_tcp_udp_port() -> u16 {
    find_port("TCP+UDP", |p| tcp_free(p) && udp_free(p))
}

/// Polls until a TCP connect to `addr` succeeds.
pub fn wait_tcp(addr: SocketAddr, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(_) => return Ok(()),
            Err(e) if start.elapsed() >= timeout => {
                return Err(HarnessError::NotReady {
                    name: format!("tcp {addr}"),
                    waited: start.elapsed(),
                    detail: e.to_string(),
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Whether some socket is bound to UDP `port` in `family`, read from /proc/net/udp{,6}.
/// Lets a test wait for an HTTP/3 listener without sending it anything.
pub fn udp_port_bound(family: Family, port: u16) -> bool {
    let file = match family {
        Family::V4 => "/proc/net/udp",
        Family::V6 => "/proc/net/udp6",
    };
    let Ok(text) = std::fs::read_to_string(file) else {
        return false;
    };
    let wanted = format!("{port:04X}");
    text.lines().skip(1).any(|line| {
        line.split_whitespace()
            .nth(1)
            .and_then(|local| local.rsplit(':').next())
            .is_some_and(|p| p == wanted)
    })
}

/// Polls [`udp_port_bound`].
pub fn wait_udp_bound(family: Family, port: u16, timeout: Duration) -> Result<()> {
    let start = Instant::now();
    while !udp_port_bound(family, port) {
        if start.elapsed() >= timeout {
            return Err(HarnessError::NotReady {
                name: format!("udp {:?} port {port}", family),
                waited: start.elapsed(),
                detail: "nothing bound the port".into(),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A TCP upstream that accepts connections and never answers: the proxy's upstream
/// timeout must fire (504). It drains whatever the proxy sends so the proxy is never
/// blocked on a full send buffer, which would test a different code path.
pub struct StalledUpstream {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    bytes_received: Arc<AtomicU64>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

impl StalledUpstream {
    /// Listens on 127.0.0.1 on a free port.
    pub fn start() -> Result<Self> {
        Self::start_on(Family::V4)
    }

    pub fn start_on(family: Family) -> Result<Self> {
        let listener =
            TcpListener::bind(family.addr(0)).ctx(|| format!("StalledUpstream bind {family:?}"))?;
        let addr = listener
            .local_addr()
            .ctx(|| "StalledUpstream local_addr".into())?;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let bytes_received = Arc::new(AtomicU64::new(0));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, accepted, bytes, conns) = (
                stop.clone(),
                accepted.clone(),
                bytes_received.clone(),
                conns.clone(),
            );
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    if let Ok(reader) = conn.try_clone() {
                        let bytes = bytes.clone();
                        std::thread::spawn(move || drain(reader, &bytes));
                    }
                    conns.lock().unwrap().push(conn);
                }
            })
        };
        Ok(StalledUpstream {
            addr,
            stop,
            accepted,
            bytes_received,
            conns,
            thread: Some(thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Connections accepted so far: proves the proxy really reached this upstream.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn bytes_received(&self) -> u64 {
        self.bytes_received.load(Ordering::SeqCst)
    }
}

fn drain(mut conn: TcpStream, bytes: &AtomicU64) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
        bytes.fetch_add(n as u64, Ordering::SeqCst);
    }
}

impl Drop for StalledUpstream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The accept loop is blocked in accept(); one connection wakes it to see `stop`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// An HTTP/1.1 backend stuck mid-response: each connection gets a response head declaring
/// a 10 MB body and its first 100 bytes, then nothing more. Counts its connections and how
/// many are still open (a connection is open until its peer closes it), so a test sees
/// when whoever connected let go.
pub struct HeadersThenStall {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

/// The bytes of the body [`HeadersThenStall`] sends before it stalls.
pub const STALL_BODY_BYTES: u64 = 100;

impl HeadersThenStall {
    /// Listens on 127.0.0.1 on a free port.
    pub fn start() -> Result<Self> {
        let listener =
            TcpListener::bind(Family::V4.addr(0)).ctx(|| "HeadersThenStall bind".into())?;
        let addr = listener
            .local_addr()
            .ctx(|| "HeadersThenStall local_addr".into())?;
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicUsize::new(0));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, accepted, open, conns) =
                (stop.clone(), accepted.clone(), open.clone(), conns.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    accepted.fetch_add(1, Ordering::SeqCst);
                    open.fetch_add(1, Ordering::SeqCst);
                    if let Ok(c) = conn.try_clone() {
                        let open = open.clone();
                        std::thread::spawn(move || {
                            answer_then_stall(c);
                            open.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    conns.lock().unwrap().push(conn);
                }
            })
        };
        Ok(HeadersThenStall {
            addr,
            stop,
            accepted,
            open,
            conns,
            thread: Some(thread),
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Connections whose peer has not closed them yet.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Reads one request head, answers with a head and the first bytes of the body, then reads
/// (and discards) until the peer closes.
fn answer_then_stall(mut conn: TcpStream) {
    use std::io::Write;
    let mut head = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\n{}",
        "x".repeat(STALL_BODY_BYTES as usize)
    );
    if conn.write_all(response.as_bytes()).is_err() {
        return;
    }
    while let Ok(n) = conn.read(&mut buf) {
        if n == 0 {
            break;
        }
    }
}

impl Drop for HeadersThenStall {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// A port on which connecting is refused (502 tests). The port stays reserved by a
/// socket that is bound but never listens, so no other test can start a server on it
/// while this value lives, and the kernel answers SYNs with RST.
pub struct ClosedPort {
    addr: SocketAddr,
    _reservation: Socket,
}

impl ClosedPort {
    pub fn new() -> Result<Self> {
        Self::on(Family::V4)
    }

    pub fn on(family: Family) -> Result<Self> {
        let domain = match family {
            Family::V4 => Domain::IPV4,
            Family::V6 => Domain::IPV6,
        };
        let sock = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))
            .ctx(|| "ClosedPort socket".into())?;
        sock.bind(&family.addr(0).into())
            .ctx(|| "ClosedPort bind".into())?;
        let addr = sock
            .local_addr()
            .ctx(|| "ClosedPort local_addr".into())?
            .as_socket()
            .ok_or_else(|| HarnessError::Invalid("ClosedPort: not an inet socket".into()))?;
        Ok(ClosedPort {
            addr,
            _reservation: sock,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

/// A UDP relay between one client and a server on loopback that drops the client's datagrams
/// a rule picks (called with each datagram and how many the client sent before it): a loss
/// placed exactly, where the lab's random loss only sometimes hits the packet that matters.
pub struct LossyRelay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    dropped: Arc<AtomicUsize>,
    threads: Vec<JoinHandle<()>>,
}

type DropRule = dyn Fn(&[u8], usize) -> bool + Send + Sync;

impl LossyRelay {
    pub fn start(server: SocketAddr, drop_c2s: Box<DropRule>) -> Result<Self> {
        let front = UdpSocket::bind("127.0.0.1:0").ctx(|| "LossyRelay bind".into())?;
        let back = UdpSocket::bind("127.0.0.1:0").ctx(|| "LossyRelay bind".into())?;
        back.connect(server).ctx(|| "LossyRelay connect".into())?;
        let addr = front.local_addr().ctx(|| "LossyRelay local_addr".into())?;
        for s in [&front, &back] {
            s.set_read_timeout(Some(Duration::from_millis(50)))
                .ctx(|| "LossyRelay timeout".into())?;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicUsize::new(0));
        let client: Arc<Mutex<Option<SocketAddr>>> = Arc::default();
        let (front2, back2) = (
            front.try_clone().ctx(|| "LossyRelay clone".into())?,
            back.try_clone().ctx(|| "LossyRelay clone".into())?,
        );
        let c2s = {
            let (stop, dropped, client) = (stop.clone(), dropped.clone(), client.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut seen = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Ok((n, from)) = front.recv_from(&mut buf) else {
                        continue;
                    };
                    *client.lock().unwrap() = Some(from);
                    if drop_c2s(&buf[..n], seen) {
                        dropped.fetch_add(1, Ordering::SeqCst);
                    } else {
                        let _ = back.send(&buf[..n]);
                    }
                    seen += 1;
                }
            })
        };
        let s2c = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::SeqCst) {
                    let Ok(n) = back2.recv(&mut buf) else {
                        continue;
                    };
                    if let Some(to) = *client.lock().unwrap() {
                        let _ = front2.send_to(&buf[..n], to);
                    }
                }
            })
        };
        Ok(LossyRelay {
            addr,
            stop,
            dropped,
            threads: vec![c2s, s2c],
        })
    }

    /// Where the client sends.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
