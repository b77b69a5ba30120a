//! `cubic-hs` inside real quinn connections on 127.0.0.1.
//!
//! 1. Field report 004 (docs/field-reports.md, "004 cwnd pinned after one lost handshake
//!    packet") replayed through the `Controller` trait against both `cubic-hs` and quinn's
//!    stock CUBIC, with an `RttEstimator` taken from a live connection (quinn offers no public
//!    constructor for one).
//! 2. A server using the controller factory behind a UDP relay that adds 10 ms each way and
//!    drops the last datagram of the server's first flight, then streams 1 MB. Run once with
//!    `cubic-hs` and once with stock CUBIC, same relay logic.
//! 3. The same relay also dropping every 50th later server datagram (2 % loss, no queue):
//!    `cubic-hs-lt` reads those losses as random, `cubic-hs` reduces for them.
//! 4. A relay with a bottleneck (rate limit and drop-tail queue, as the lab's S4): slow start
//!    with HyStart++ against plain slow start, same `cubic-hs` otherwise.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use h3_ingress::api::CongestionControl;
use h3_ingress::proxy::quic::cc::{self, CcStats, CubicHs, CubicHsConfig};
use quinn::congestion::{Controller, ControllerFactory, NewRenoConfig};
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn_proto::RttEstimator;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::UdpSocket;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

const ALPN: &[u8] = b"cc-test";
const PKT: u64 = 1200;
const IW: u64 = 10 * PKT;
const BODY_LEN: usize = 1024 * 1024;
const ONE_WAY_DELAY: Duration = Duration::from_millis(10);
/// The server's first flight is one burst; this much silence after it ends the flight.
const FLIGHT_QUIET_GAP: Duration = Duration::from_millis(30);

struct Tls {
    server: quinn::ServerConfig,
    client: quinn::ClientConfig,
}

/// A CA and a leaf with a handful of names, so the certificate flight spans more than one
/// datagram like a real chain does (field report 004's chain took six).
fn tls(transport: quinn::TransportConfig) -> Tls {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "h3-ingress cc test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, &ca_key);

    let names: Vec<String> = std::iter::once("localhost".to_string())
        .chain((0..24).map(|i| format!("host-{i}.cc-test.h3-ingress.example")))
        .collect();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names)
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = vec![leaf.der().clone(), ca_cert.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
    server.alpn_protocols = vec![ALPN.to_vec()];
    let mut server =
        quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(server).unwrap()));
    server.transport_config(Arc::new(transport));

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![ALPN.to_vec()];
    let client = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(client).unwrap()));
    Tls { server, client }
}

fn localhost() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

// ---------------------------------------------------------------------------------------------
// Field report 004 replayed through the trait, stock CUBIC vs cubic-hs.

/// Wraps NewReno and keeps a copy of the last `RttEstimator` quinn handed it.
struct CaptureRtt {
    slot: Arc<Mutex<Option<RttEstimator>>>,
}

struct CaptureRttController {
    inner: Box<dyn Controller>,
    slot: Arc<Mutex<Option<RttEstimator>>>,
}

impl ControllerFactory for CaptureRtt {
    fn build(self: Arc<Self>, now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(CaptureRttController {
            inner: Arc::new(NewRenoConfig::default()).build(now, current_mtu),
            slot: self.slot.clone(),
        })
    }
}

impl Controller for CaptureRttController {
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        *self.slot.lock().unwrap() = Some(*rtt);
        self.inner.on_ack(now, sent, bytes, app_limited, rtt);
    }
    fn on_congestion_event(&mut self, now: Instant, sent: Instant, persistent: bool, lost: u64) {
        self.inner.on_congestion_event(now, sent, persistent, lost);
    }
    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.inner.on_mtu_update(new_mtu);
    }
    fn window(&self) -> u64 {
        self.inner.window()
    }
    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(CaptureRttController {
            inner: self.inner.clone_box(),
            slot: self.slot.clone(),
        })
    }
    fn initial_window(&self) -> u64 {
        self.inner.initial_window()
    }
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

/// An estimator from a real loopback connection (direct, no relay).
async fn live_rtt_estimator() -> RttEstimator {
    let slot = Arc::new(Mutex::new(None));
    let mut transport = quinn::TransportConfig::default();
    transport.congestion_controller_factory(Arc::new(CaptureRtt { slot: slot.clone() }));
    let tls = tls(transport);
    let server = quinn::Endpoint::server(tls.server, localhost()).unwrap();
    let server_addr = server.local_addr().unwrap();
    let serve = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let mut send = conn.open_uni().await.unwrap();
        send.write_all(b"hello").await.unwrap();
        send.finish().unwrap();
        conn.closed().await;
    });
    let client = quinn::Endpoint::client(localhost()).unwrap();
    let conn = client
        .connect_with(tls.client, server_addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let mut recv = conn.accept_uni().await.unwrap();
    assert_eq!(recv.read_to_end(64).await.unwrap(), b"hello");
    conn.close(0u32.into(), b"");
    // No wait_idle: the draining period (3 PTO) only costs test time here.
    drop(client);
    serve.await.unwrap();
    let captured = *slot.lock().unwrap();
    captured.expect("the server's controller saw no ACK")
}

/// Field report 004's events (docs/field-reports.md), exactly as quinn delivers them: six first-flight datagrams, five ACKed
/// one RTT later, the sixth found lost after a PTO probe's ACK with nothing left in flight.
fn replay_field_report_004(cc: &mut dyn Controller, rtt: &RttEstimator, t0: Instant) -> Instant {
    let path_rtt = Duration::from_millis(200);
    for pn in 0..6 {
        cc.on_sent(t0, PKT, pn);
    }
    let first_ack = t0 + path_rtt;
    for _ in 0..5 {
        cc.on_ack(first_ack, t0, PKT, false, rtt);
    }
    cc.on_end_acks(first_ack, PKT, false, Some(4));
    let probe = first_ack + 3 * path_rtt;
    cc.on_sent(probe, PKT, 6);
    let found = probe + path_rtt;
    cc.on_ack(found, probe, PKT, false, rtt);
    cc.on_end_acks(found, 0, false, Some(6));
    cc.on_congestion_event(found, t0, false, PKT);
    found
}

fn ssthresh(cc: &dyn Controller) -> u64 {
    cc.metrics()
        .ssthresh
        .expect("controller reports no ssthresh")
}

#[tokio::test]
async fn field_report_004_replay_stock_cubic_leaves_slow_start_cubic_hs_does_not() {
    let rtt = live_rtt_estimator().await;
    let stats = CcStats::new();
    let t0 = Instant::now();

    let mut stock = cc::factory(CongestionControl::Cubic, IW, stats.clone()).build(t0, PKT as u16);
    replay_field_report_004(stock.as_mut(), &rtt, t0);
    eprintln!(
        "stock cubic after the tail loss: window {} ssthresh {}",
        stock.window(),
        ssthresh(stock.as_ref())
    );
    assert!(
        stock.window() >= ssthresh(stock.as_ref()),
        "stock CUBIC stayed in slow start"
    );
    assert!(stock.window() < IW + 6 * PKT);

    let mut hs = cc::factory(CongestionControl::CubicHs, IW, stats.clone()).build(t0, PKT as u16);
    let found = replay_field_report_004(hs.as_mut(), &rtt, t0);
    eprintln!(
        "cubic-hs after the tail loss: window {} ssthresh {}",
        hs.window(),
        ssthresh(hs.as_ref())
    );
    assert!(hs.window() >= IW);
    assert_eq!(hs.window(), IW + 6 * PKT);
    assert!(
        hs.window() < ssthresh(hs.as_ref()),
        "cubic-hs left slow start"
    );
    assert_eq!(stats.handshake_losses_forgiven(), 1);

    // The next loss, of a packet sent after the first RTT sample, gets the normal response.
    let before = hs.window();
    let sent = found + Duration::from_millis(1);
    hs.on_end_acks(sent + Duration::from_millis(200), 0, false, None);
    hs.on_congestion_event(sent + Duration::from_millis(200), sent, false, PKT);
    assert_eq!(hs.window(), (before as f64 * 0.7) as u64);
    assert_eq!(ssthresh(hs.as_ref()), hs.window());
    assert_eq!(stats.congestion_events(), 1);
    let hs = hs.into_any().downcast::<CubicHs>().ok().unwrap();
    assert!(!hs.in_slow_start());
    assert_eq!(hs.losses_forgiven(), 1);
    assert_eq!(hs.congestion_events(), 1);
}

// ---------------------------------------------------------------------------------------------
// The relay and the transfers through it.

#[derive(Debug, Default)]
struct RelayReport {
    first_flight_datagrams: AtomicUsize,
    dropped: AtomicUsize,
    /// Server datagrams that reached the relay (before any drop).
    from_server: AtomicUsize,
    /// Of those, dropped because the bottleneck queue was full.
    queue_drops: AtomicUsize,
    forwarded_to_client: AtomicUsize,
    forwarded_to_server: AtomicUsize,
}

/// A rate limit with a drop-tail queue on the server-to-client direction, in virtual time:
/// each datagram leaves when the link has sent everything queued before it, and is dropped
/// if the bytes still waiting would exceed the queue. The relay's timer only delivers at the
/// computed times, so its own scheduling never shows up as queueing.
#[derive(Debug, Clone, Copy)]
struct Bottleneck {
    bytes_per_second: f64,
    queue_bytes: f64,
}

impl Bottleneck {
    /// `mbit` Mbit/s with a queue of `queue` at that rate (the lab's S4 uses 100 ms).
    fn new(mbit: f64, queue: Duration) -> Self {
        let bytes_per_second = mbit * 1e6 / 8.0;
        Self {
            bytes_per_second,
            queue_bytes: bytes_per_second * queue.as_secs_f64(),
        }
    }
}

/// The link's state: when it finishes sending what is queued.
struct Link {
    shape: Bottleneck,
    busy_until: Instant,
}

impl Link {
    /// When a datagram of `len` bytes arriving `now` has left the link, or `None` if the
    /// queue has no room for it.
    fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        let start = self.busy_until.max(now);
        let queued = (start - now).as_secs_f64() * self.shape.bytes_per_second;
        if queued + len as f64 > self.shape.queue_bytes {
            return None;
        }
        self.busy_until = start + Duration::from_secs_f64(len as f64 / self.shape.bytes_per_second);
        Some(self.busy_until)
    }
}

/// What the relay does to the path.
#[derive(Debug, Clone, Copy)]
struct PathShape {
    one_way_delay: Duration,
    /// Drop the last datagram of the server's first flight (field report 004).
    drop_first_flight_tail: bool,
    /// After the first flight, drop every n-th server datagram as well.
    drop_every: Option<usize>,
    bottleneck: Option<Bottleneck>,
}

impl PathShape {
    /// The relay of field report 004 (docs/field-reports.md): 10 ms each way, the first flight's tail dropped.
    fn field_report_004(drop_every: Option<usize>) -> Self {
        Self {
            one_way_delay: ONE_WAY_DELAY,
            drop_first_flight_tail: true,
            drop_every,
            bottleneck: None,
        }
    }
}

/// A one-connection UDP relay: client <-> `front` ... `back` <-> server, with a fixed delay
/// each way. It holds the server's first datagrams until the server has gone quiet (or the
/// client sent again), then forwards all of that first flight except, if asked, its last
/// datagram.
struct Relay {
    addr: SocketAddr,
    report: Arc<RelayReport>,
    _tasks: JoinSet<()>,
}

/// A FIFO delay line: each datagram leaves at the time it was queued with (in order). An OS
/// thread with precise sleeps, not a tokio timer: the timer wheel's 1 ms ticks would release
/// datagrams in clumps, and the client would acknowledge each clump with one ACK, a pattern
/// no real bottleneck produces (and one that starves HyStart++ of RTT samples).
fn delay_line(
    socket: std::net::UdpSocket,
    dest: Arc<OnceLock<SocketAddr>>,
    counter: Arc<RelayReport>,
    to_client: bool,
) -> mpsc::UnboundedSender<(Instant, Vec<u8>)> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        while let Some((due, datagram)) = rx.blocking_recv() {
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            let Some(&to) = dest.get() else { continue };
            let sent = loop {
                match socket.send_to(&datagram, to) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    other => break other,
                }
            };
            if sent.is_ok() {
                let c = if to_client {
                    &counter.forwarded_to_client
                } else {
                    &counter.forwarded_to_server
                };
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    tx
}

/// A loopback UDP socket with room for bursts (the relay's own socket must never be where a
/// datagram is lost), as a tokio socket for receiving and a clone for the delay line.
fn relay_socket() -> (Arc<UdpSocket>, std::net::UdpSocket) {
    let socket = socket2::Socket::new(
        socket2::Domain::IPV4,
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )
    .unwrap();
    socket.set_recv_buffer_size(4 << 20).unwrap();
    socket.set_send_buffer_size(4 << 20).unwrap();
    socket.bind(&localhost().into()).unwrap();
    // Non-blocking for tokio, and so for the clone too (they share the file description); the
    // delay line retries the rare full send buffer.
    socket.set_nonblocking(true).unwrap();
    let sender: std::net::UdpSocket = socket.try_clone().unwrap().into();
    let receiver = UdpSocket::from_std(socket.into()).unwrap();
    (Arc::new(receiver), sender)
}

async fn spawn_relay(server: SocketAddr, shape: PathShape) -> Relay {
    let (front, front_sender) = relay_socket();
    let (back, back_sender) = relay_socket();
    let addr = front.local_addr().unwrap();
    let client_addr = Arc::new(OnceLock::new());
    let server_addr = Arc::new(OnceLock::from(server));
    let client_datagrams = Arc::new(AtomicUsize::new(0));
    let report = Arc::new(RelayReport::default());
    let mut tasks = JoinSet::new();

    let to_server = delay_line(back_sender, server_addr, report.clone(), false);
    let to_client = delay_line(front_sender, client_addr.clone(), report.clone(), true);

    {
        let client_addr = client_addr.clone();
        let client_datagrams = client_datagrams.clone();
        tasks.spawn(async move {
            let mut buf = vec![0u8; 65536];
            while let Ok((n, from)) = front.recv_from(&mut buf).await {
                let _ = client_addr.set(from);
                client_datagrams.fetch_add(1, Ordering::SeqCst);
                let due = Instant::now() + shape.one_way_delay;
                if to_server.send((due, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        });
    }

    tasks.spawn(server_to_client(
        back,
        to_client,
        client_datagrams,
        report.clone(),
        shape,
    ));

    Relay {
        addr,
        report,
        _tasks: tasks,
    }
}

/// The server's datagrams: the first flight (held until it ends, its tail dropped if asked),
/// then every later one through the random drop and the bottleneck.
async fn server_to_client(
    back: Arc<UdpSocket>,
    to_client: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    client_datagrams: Arc<AtomicUsize>,
    report: Arc<RelayReport>,
    shape: PathShape,
) {
    let mut link = shape.bottleneck.map(|b| Link {
        shape: b,
        busy_until: Instant::now(),
    });
    let mut forward = |datagram: Vec<u8>, report: &RelayReport| {
        let now = Instant::now();
        let left = match link.as_mut() {
            None => Some(now),
            Some(link) => link.admit(now, datagram.len()),
        };
        match left {
            Some(left) => to_client
                .send((left + shape.one_way_delay, datagram))
                .is_ok(),
            None => {
                report.queue_drops.fetch_add(1, Ordering::SeqCst);
                report.dropped.fetch_add(1, Ordering::SeqCst);
                true
            }
        }
    };
    let mut buf = vec![0u8; 65536];
    // First flight: everything the server sends before it goes quiet, as long as the client
    // has not sent its second batch in the meantime.
    let Ok(n) = back.recv(&mut buf).await else {
        return;
    };
    let client_datagrams_at_start = client_datagrams.load(Ordering::SeqCst);
    let mut flight = vec![buf[..n].to_vec()];
    loop {
        match tokio::time::timeout(FLIGHT_QUIET_GAP, back.recv(&mut buf)).await {
            Ok(Ok(n)) => flight.push(buf[..n].to_vec()),
            Ok(Err(_)) => return,
            Err(_) => break,
        }
        if client_datagrams.load(Ordering::SeqCst) != client_datagrams_at_start {
            break;
        }
    }
    report.from_server.fetch_add(flight.len(), Ordering::SeqCst);
    report
        .first_flight_datagrams
        .store(flight.len(), Ordering::SeqCst);
    if shape.drop_first_flight_tail {
        flight.pop();
        report.dropped.fetch_add(1, Ordering::SeqCst);
    }
    for datagram in flight {
        forward(datagram, &report);
    }
    let mut later = 0usize;
    while let Ok(n) = back.recv(&mut buf).await {
        report.from_server.fetch_add(1, Ordering::SeqCst);
        later += 1;
        if shape.drop_every.is_some_and(|every| later % every == 0) {
            report.dropped.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        if !forward(buf[..n].to_vec(), &report) {
            break;
        }
    }
}

fn body_byte(i: usize) -> u8 {
    (i % 251) as u8 ^ (i / 251) as u8
}

struct Outcome {
    window: u64,
    ssthresh: u64,
    controller: Box<dyn Controller>,
    path: quinn::PathStats,
    first_flight_datagrams: usize,
    dropped: usize,
    from_server: usize,
    queue_drops: usize,
    transfer: Duration,
}

impl Outcome {
    /// The share of the server's datagrams the bottleneck queue dropped.
    fn queue_loss(&self) -> f64 {
        self.queue_drops as f64 / self.from_server.max(1) as f64
    }
}

/// A transfer of `PathShape`s default body size through the lossy relay, with one of the
/// listener's controllers.
async fn transfer_through_lossy_relay(
    kind: CongestionControl,
    stats: Arc<CcStats>,
    drop_every: Option<usize>,
) -> Outcome {
    transfer_through_relay(
        cc::factory(kind, IW, stats),
        PathShape::field_report_004(drop_every),
        BODY_LEN,
    )
    .await
}

/// One transfer through a relay at a time: two relays and two quinn endpoint pairs on the
/// two cores at once would time each other's scheduling, not the path.
static RELAY_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server streams `body_len` bytes to the client through a relay shaped as `shape`.
async fn transfer_through_relay(
    factory: Arc<dyn ControllerFactory + Send + Sync>,
    shape: PathShape,
    body_len: usize,
) -> Outcome {
    let _turn = RELAY_TURN.lock().await;
    let mut transport = quinn::TransportConfig::default();
    transport.congestion_controller_factory(factory);
    let tls = tls(transport);
    let server = quinn::Endpoint::server(tls.server, localhost()).unwrap();
    let relay = spawn_relay(server.local_addr().unwrap(), shape).await;

    let (sampled_tx, sampled_rx) = tokio::sync::oneshot::channel();
    let serve = tokio::spawn(async move {
        let conn = server.accept().await.unwrap().await.unwrap();
        let (mut send, mut recv) = conn.accept_bi().await.unwrap();
        let mut go = [0u8; 2];
        recv.read_exact(&mut go).await.unwrap();
        assert_eq!(&go, b"go");
        let body: Vec<u8> = (0..body_len).map(body_byte).collect();
        let started = Instant::now();
        send.write_all(&body).await.unwrap();
        send.finish().unwrap();
        let mut done = [0u8; 4];
        recv.read_exact(&mut done).await.unwrap();
        assert_eq!(&done, b"done");
        let transfer = started.elapsed();
        // The client has everything: this is the window the transfer ended with.
        let _ = sampled_tx.send((conn.congestion_state(), conn.stats().path, transfer));
        conn.closed().await;
    });

    let client = quinn::Endpoint::client(localhost()).unwrap();
    let conn = client
        .connect_with(tls.client, relay.addr, "localhost")
        .unwrap()
        .await
        .unwrap();
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(b"go").await.unwrap();
    let body = recv.read_to_end(2 * body_len).await.unwrap();
    assert_eq!(body.len(), body_len);
    assert!(
        body.iter().enumerate().all(|(i, &b)| b == body_byte(i)),
        "body corrupted"
    );
    send.write_all(b"done").await.unwrap();
    send.finish().unwrap();
    let (controller, path, transfer) = tokio::time::timeout(Duration::from_secs(5), sampled_rx)
        .await
        .expect("server never saw the client finish")
        .expect("server task failed");
    conn.close(0u32.into(), b"");
    // No wait_idle: the draining period (3 PTO) only costs test time here.
    drop(client);
    serve.await.unwrap();

    let metrics = controller.metrics();
    let report = &relay.report;
    Outcome {
        window: controller.window(),
        ssthresh: metrics.ssthresh.unwrap_or(u64::MAX),
        controller,
        path,
        first_flight_datagrams: report.first_flight_datagrams.load(Ordering::SeqCst),
        dropped: report.dropped.load(Ordering::SeqCst),
        from_server: report.from_server.load(Ordering::SeqCst),
        queue_drops: report.queue_drops.load(Ordering::SeqCst),
        transfer,
    }
}

#[tokio::test]
async fn handshake_tail_loss_through_relay_cubic_hs_keeps_a_large_window() {
    let started = Instant::now();
    let stats = CcStats::new();
    let hs = transfer_through_lossy_relay(CongestionControl::CubicHs, stats.clone(), None).await;
    let stock = transfer_through_lossy_relay(CongestionControl::Cubic, CcStats::new(), None).await;

    for (name, run) in [("cubic-hs", &hs), ("cubic", &stock)] {
        eprintln!(
            "{name}: first flight {} datagrams, dropped {}, 1 MB in {:?}, final window {} B \
             ({:.0} packets), ssthresh {}, quinn lost_packets {}, congestion_events {}, rtt {:?}",
            run.first_flight_datagrams,
            run.dropped,
            run.transfer,
            run.window,
            run.window as f64 / PKT as f64,
            run.ssthresh,
            run.path.lost_packets,
            run.path.congestion_events,
            run.path.rtt,
        );
        assert_eq!(
            run.dropped, 1,
            "{name}: the relay must drop exactly one datagram"
        );
        assert!(
            run.first_flight_datagrams >= 2,
            "{name}: first flight was {} datagram(s); the tail loss needs earlier datagrams to be ACKed",
            run.first_flight_datagrams
        );
        assert!(run.path.lost_packets >= 1, "{name}: quinn saw no loss");
    }

    let counters = cc::connection_counters(hs.controller.clone_box()).expect("not cubic-hs");
    eprintln!(
        "cubic-hs connection counters: {counters:?}; global forgiven {}",
        stats.handshake_losses_forgiven()
    );
    assert_eq!(counters.handshake_losses_forgiven, 1);
    assert_eq!(stats.handshake_losses_forgiven(), 1);
    assert!(
        hs.window >= 3 * stock.window,
        "cubic-hs window {} is not well above stock CUBIC's {}",
        hs.window,
        stock.window
    );
    assert!(stock.ssthresh < u64::MAX, "stock CUBIC never reduced");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn random_loss_through_relay_is_tolerated_by_cubic_hs_lt_only() {
    let started = Instant::now();
    let lt_stats = CcStats::new();
    let lt = transfer_through_lossy_relay(CongestionControl::CubicHsLt, lt_stats.clone(), Some(50))
        .await;
    let hs =
        transfer_through_lossy_relay(CongestionControl::CubicHs, CcStats::new(), Some(50)).await;
    let counters = |run: &Outcome| cc::connection_counters(run.controller.clone_box()).unwrap();
    let (lt_counters, hs_counters) = (counters(&lt), counters(&hs));
    for (name, run, c) in [
        ("cubic-hs-lt", &lt, lt_counters),
        ("cubic-hs", &hs, hs_counters),
    ] {
        eprintln!(
            "{name}: dropped {}, 1 MB in {:?}, final window {:.0} packets, quinn lost_packets \
             {}, counters {c:?}",
            run.dropped,
            run.transfer,
            run.window as f64 / PKT as f64,
            run.path.lost_packets,
        );
        // The first-flight tail plus one in 50 of the ~900 later datagrams.
        assert!(
            run.dropped >= 10,
            "{name}: the relay dropped only {}",
            run.dropped
        );
        assert_eq!(c.handshake_losses_forgiven, 1, "{name}");
    }
    // No queue anywhere on this path: the tolerant controller sees random loss. Scheduling
    // noise on a busy machine may still look like a queue now and then, hence no exact count.
    assert!(
        lt_counters.random_losses_tolerated >= 5,
        "cubic-hs-lt tolerated only {} losses",
        lt_counters.random_losses_tolerated
    );
    assert_eq!(
        lt_stats.random_losses_tolerated(),
        lt_counters.random_losses_tolerated
    );
    assert_eq!(hs_counters.random_losses_tolerated, 0);
    assert!(hs_counters.congestion_events >= 3, "{hs_counters:?}");
    assert!(
        lt_counters.congestion_events < hs_counters.congestion_events,
        "cubic-hs-lt {lt_counters:?} vs cubic-hs {hs_counters:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------------------------------------
// HyStart++ at a bottleneck.

/// The lab's S4 at a fifth of its rate, which the relay sustains on a loaded machine in a
/// debug build: 20 Mbit/s instead of 100, the same RTT and the same drop-tail queue of 100 ms
/// at the rate, and a fifth of the initial window and of the 5.7 MB download, so that window,
/// queue and download stand in the same proportion to the path's BDP as in S4.
fn s4_at_a_fifth(rtt: Duration) -> PathShape {
    PathShape {
        one_way_delay: rtt / 2,
        drop_first_flight_tail: false,
        drop_every: None,
        bottleneck: Some(Bottleneck::new(20.0, Duration::from_millis(100))),
    }
}

/// A fifth of S4's 5.7 MB.
const S4_FIFTH_BODY: usize = 1_140_000;
/// A fifth of the listener default (32 packets of the 1200-byte initial MTU).
const S4_FIFTH_IW: u64 = 32 * PKT / 5;

fn describe(name: &str, run: &Outcome) {
    let c = cc::connection_counters(run.controller.clone_box()).unwrap_or_default();
    eprintln!(
        "{name}: {} KB in {:?}; bottleneck dropped {} of {} server datagrams ({:.2} %); quinn \
         lost {} of {} packets; final window {:.0} KB, ssthresh {}; {c:?}",
        S4_FIFTH_BODY / 1000,
        run.transfer,
        run.queue_drops,
        run.from_server,
        100.0 * run.queue_loss(),
        run.path.lost_packets,
        run.path.sent_packets,
        run.window as f64 / 1e3,
        if run.ssthresh == u64::MAX {
            "none".to_string()
        } else {
            format!("{:.0} KB", run.ssthresh as f64 / 1e3)
        },
    );
}

/// The same download with plain slow start and with HyStart++, `cubic-hs` otherwise.
async fn slow_start_pair(rtt: Duration) -> (Outcome, Outcome) {
    let plain = transfer_through_relay(
        Arc::new(CubicHsConfig::new(S4_FIFTH_IW, CcStats::new()).without_hystart()),
        s4_at_a_fifth(rtt),
        S4_FIFTH_BODY,
    )
    .await;
    let hystart = transfer_through_relay(
        Arc::new(CubicHsConfig::new(S4_FIFTH_IW, CcStats::new())),
        s4_at_a_fifth(rtt),
        S4_FIFTH_BODY,
    )
    .await;
    describe(&format!("{rtt:?} plain slow start"), &plain);
    describe(&format!("{rtt:?} HyStart++"), &hystart);
    (plain, hystart)
}

/// HyStart++ must not cost time: leaving slow start early still keeps the link busy from the
/// queue. 10 % covers the run-to-run spread of the relay on a loaded machine.
fn assert_no_longer(plain: &Outcome, hystart: &Outcome) {
    assert!(
        hystart.transfer <= plain.transfer.mul_f64(1.1),
        "HyStart++ took {:?} against plain slow start's {:?}",
        hystart.transfer,
        plain.transfer
    );
}

#[tokio::test]
async fn hystart_cuts_slow_start_loss_at_s4_11ms() {
    let started = Instant::now();
    let (plain, hystart) = slow_start_pair(Duration::from_millis(11)).await;
    // Plain slow start doubles into the queue until it overflows (16-22 % on the machine
    // this was written on; S4 itself lost 13 %).
    assert!(
        plain.queue_loss() >= 0.10,
        "plain slow start lost only {:.2} %: the bottleneck does not bite",
        100.0 * plain.queue_loss()
    );
    let counters = cc::connection_counters(hystart.controller.clone_box()).unwrap();
    assert!(counters.css_entries >= 1, "{counters:?}");
    // With the RFC's round minimum 2-5.5 % was measured: HyStart++ saw the queue a round
    // after it began, at 4.4 BDP in flight here, and its five CSS rounds (x1.25 each) still
    // outgrew the 9-BDP queue. Seen within the round and with CSS paused while the RTT keeps
    // rising: 0 %. Asserted: less than 40 % of plain slow start's loss.
    assert!(
        hystart.queue_loss() <= 0.4 * plain.queue_loss(),
        "HyStart++ lost {:.2} % against plain slow start's {:.2} %",
        100.0 * hystart.queue_loss(),
        100.0 * plain.queue_loss()
    );
    assert_no_longer(&plain, &hystart);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn hystart_at_s4_42ms_loses_at_most_1_percent_and_takes_no_longer() {
    let (plain, hystart) = slow_start_pair(Duration::from_millis(42)).await;
    assert!(
        plain.queue_loss() >= 0.10,
        "{:.2} %",
        100.0 * plain.queue_loss()
    );
    // The queue is 2.4 BDP here. The RFC's round-minimum test saw it a round late, with up
    // to 4 BDP in flight, and its five CSS rounds then overran it (8.7-15 % measured against
    // 15-16 %). Seen within the round it shows in, with CSS growth paused while the RTT keeps
    // rising, the window stays near 2.4 BDP, inside BDP + queue (0 % measured).
    let counters = cc::connection_counters(hystart.controller.clone_box()).unwrap();
    assert!(counters.css_entries >= 1, "{counters:?}");
    assert!(
        hystart.queue_loss() <= 0.01,
        "HyStart++ lost {:.2} % against plain slow start's {:.2} %",
        100.0 * hystart.queue_loss(),
        100.0 * plain.queue_loss()
    );
    assert_no_longer(&plain, &hystart);
}
