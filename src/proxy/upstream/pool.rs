//! The pooled hyper client of one configuration generation: lanes of connections per host,
//! the response timeout, and upstream failures as the client sees them (502 or 504).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::pki_types::UnixTime;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::connect::{ConnectError, Connector, ConnectorInner, ProxyAddrs, Routes};
use super::lanes::{Lanes, Lease};
use super::renewal::Renewals;
use super::resolve::{system_lookup, Target};
use super::retained::Retained;
use super::verify::{client_tls, UpstreamSetupError};
use super::UpstreamBody;
use crate::config::{HostTable, UpstreamAddress, UpstreamConfig};
use crate::proxy::observe::metrics::LaneMetrics;
use crate::proxy::observe::metrics::UpstreamMetrics;

/// The h2 window of one upstream stream: what a response whose client does not read can hold
/// in this process. 512 KiB is a brake on no hop inside a cluster (512 MB/s per request at
/// 1 ms RTT, above what one QUIC stream carries). On loopback 256 KiB cost the proxy 10 % and
/// nginx a quarter more CPU per byte than 4 MiB did; 1 MiB saved the proxy nothing more.
const UPSTREAM_STREAM_WINDOW: u32 = 512 * 1024;

/// How long an idle upstream connection is kept for its host; evicted within twice that.
/// Each host has its own (SNI), so a burst over many hosts (a monitor checking every one)
/// leaves one connection per host, held this long (after a request to each of 10,000 hosts
/// the data plane was at 184-197 MiB while they were open, 92 MiB once they had closed).
/// 30 s keeps a connection across a page's requests and a visitor's next click; nginx keeps
/// its own side 75 s, HAProxy purges idle server connections within seconds.
const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

type PooledClient = Client<Connector, UpstreamBody>;

/// A request's place on an upstream connection, held until the request ends.
pub type UpstreamLease = Lease<PooledClient>;

/// A pooled hyper client for one configuration generation.
#[derive(Clone)]
pub struct Upstream {
    lanes: Arc<Lanes<PooledClient>>,
    config: Arc<UpstreamConfig>,
    routes: Option<Arc<Routes>>,
    /// Where a client's PROXY protocol connections go (`UpstreamConfig::proxy_protocol`).
    proxy_target: Option<Arc<Target>>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The hosts this generation serves, to tell the next one which leaves changed.
    hosts: HostTable,
    /// Shared with every later generation (see [`Upstream::successor`]).
    renewals: Arc<Renewals>,
    metrics: UpstreamMetrics,
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("address", &self.config.address.to_string())
            .finish()
    }
}

/// A lane's client. Its connection window covers every stream's window, so streams whose
/// clients stop reading cannot use up the connection's window and stall the other requests.
fn build_client(connector: Connector, streams: u32) -> PooledClient {
    Client::builder(TokioExecutor::new())
        // Without a timer the pool never evicts: an idle connection stays until the same host
        // asks for one again, so every host that ever had a request kept its connections
        // (10,000 hosts: 10,000 sockets and 280 MB, tests/dataplane_scale.rs).
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(UPSTREAM_IDLE_TIMEOUT)
        .pool_max_idle_per_host(64)
        // Fixed windows, not adaptive: hyper's adaptive window replaces these with the
        // 64 KiB default and grows from there, which made every new upstream connection stall
        // for window updates at loopback speed.
        .http2_initial_stream_window_size(UPSTREAM_STREAM_WINDOW)
        .http2_initial_connection_window_size(UPSTREAM_STREAM_WINDOW * streams)
        .build(connector)
}

fn lanes(connector: Connector, streams: u32, metrics: LaneMetrics) -> Arc<Lanes<PooledClient>> {
    Arc::new(Lanes::new(streams as usize, metrics, move || {
        build_client(connector.clone(), streams)
    }))
}

impl Upstream {
    /// The first generation's upstream.
    pub fn new(
        config: &UpstreamConfig,
        hosts: &HostTable,
        metrics: UpstreamMetrics,
    ) -> Result<Self, UpstreamSetupError> {
        let renewals = Renewals::new(metrics.certificate_grace.clone());
        renewals.recall(hosts);
        Self::build(config, hosts, metrics, renewals)
    }

    /// The upstream of the generation that replaces this one: it remembers the leaves this
    /// one served that `hosts` changes, so `servedCertificate` still accepts them for the grace
    /// period while the TCP ingress catches up.
    pub fn successor(
        &self,
        config: &UpstreamConfig,
        hosts: &HostTable,
    ) -> Result<Self, UpstreamSetupError> {
        let now = UnixTime::now().as_secs() as i64;
        self.renewals.switched(&self.hosts, hosts, now);
        self.renewals.recall(hosts);
        Self::build(config, hosts, self.metrics.clone(), self.renewals.clone())
    }

    fn build(
        config: &UpstreamConfig,
        hosts: &HostTable,
        metrics: UpstreamMetrics,
        renewals: Arc<Renewals>,
    ) -> Result<Self, UpstreamSetupError> {
        let tls = if config.tls {
            Some(client_tls(config, hosts, &renewals)?)
        } else {
            None
        };
        let lookup = system_lookup();
        let resolutions = &metrics.resolutions;
        let target = |a: &UpstreamAddress| {
            let t = Arc::new(Target::new(a, lookup.clone(), resolutions.clone()));
            t.prefetch();
            t
        };
        let main = target(&config.address);
        let proxy_target = config
            .proxy_protocol
            .as_ref()
            .map(|a| match *a == config.address {
                true => main.clone(),
                false => target(a),
            });
        let routes = super::connect::routes(hosts, &lookup, resolutions);
        let connector = Connector {
            inner: Arc::new(ConnectorInner {
                target: main,
                routes: routes.clone(),
                tls: tls.clone(),
                connect_timeout: config.connect_timeout,
                proxy: None,
                open: metrics.connections.clone(),
            }),
        };
        Ok(Self {
            lanes: lanes(
                connector,
                config.max_streams_per_connection,
                metrics.lanes.clone(),
            ),
            config: Arc::new(config.clone()),
            routes,
            proxy_target,
            tls,
            hosts: hosts.clone(),
            renewals,
            metrics,
        })
    }

    /// The client to use for one QUIC connection: shared, or its own with PROXY protocol.
    pub fn for_connection(&self, client: SocketAddr, local: SocketAddr) -> Upstream {
        let Some(target) = &self.proxy_target else {
            return self.clone();
        };
        let connector = Connector {
            inner: Arc::new(ConnectorInner {
                target: target.clone(),
                routes: self.routes.clone(),
                tls: self.tls.clone(),
                connect_timeout: self.config.connect_timeout,
                proxy: Some(ProxyAddrs { client, local }),
                open: self.metrics.connections.clone(),
            }),
        };
        Upstream {
            lanes: lanes(
                connector,
                self.config.max_streams_per_connection,
                self.lanes.metrics().clone(),
            ),
            config: self.config.clone(),
            routes: self.routes.clone(),
            proxy_target: self.proxy_target.clone(),
            tls: self.tls.clone(),
            hosts: self.hosts.clone(),
            renewals: self.renewals.clone(),
            metrics: self.metrics.clone(),
        }
    }

    pub fn scheme(&self) -> &'static str {
        if self.config.tls {
            "https"
        } else {
            "http"
        }
    }

    /// Sends a request; the error says which status the client should get. The response
    /// timeout (`limit`: the host's, else [`Self::response_timeout`]) runs from `body_sent`
    /// (the upstream has read the whole request body, or dropped it unread), so an upload of
    /// any length gets its full time for the answer. Keep the lease until the response body
    /// is done: it is the request's place on its upstream connection.
    ///
    /// A request the upstream did not process (GOAWAY, REFUSED_STREAM) is sent again, [`MAX_SENDS`]
    /// times in all, while the upstream has taken nothing from its body ([`Retained`]). nginx
    /// ends every HTTP/2 connection with GOAWAY after `keepalive_requests` (1000 by default):
    /// the requests we had sent past its last stream ID were answered 502 (4-30 of 4000 in
    /// tests/access_log_cost.rs) although RFC 9113 8.7 lets them be retried. Each try takes a
    /// lease anew, after a turn for the connection's task to take the GOAWAY in, so the pool
    /// hands out another connection; that one can reach its own GOAWAY first when many
    /// requests are in flight (tests/proxy_e2e.rs `requests_past_two_upstream_goaways_are_sent_again`).
    pub async fn send(
        &self,
        req: http::Request<UpstreamBody>,
        body_sent: CancellationToken,
        limit: Duration,
    ) -> Result<(http::Response<hyper::body::Incoming>, UpstreamLease), UpstreamError> {
        let (parts, mut body) = req.into_parts();
        for sends in 1.. {
            let (e, back) = match self.send_once(&parts, body, &body_sent, limit).await {
                Sent::Answered(r, lease) => return Ok((r, lease)),
                Sent::TimedOut => return Err(UpstreamError::Timeout(limit)),
                Sent::Failed(e, back) => (e, back),
            };
            match back {
                Some(b) if sends < MAX_SENDS && unprocessed(&e) => body = b,
                _ => return Err(classify(e)),
            }
            debug!(error = %e, "the upstream did not process the request: sending it again");
            tokio::task::yield_now().await;
        }
        unreachable!("the loop returns by its last send")
    }

    /// One send of a request, on a lease of its own.
    async fn send_once(
        &self,
        parts: &http::request::Parts,
        body: UpstreamBody,
        body_sent: &CancellationToken,
        limit: Duration,
    ) -> Sent {
        let (retained, mut back, unread) = Retained::new(body);
        let lease = self.lanes.lease();
        let req = http::Request::from_parts(parts.clone(), retained.boxed());
        let request = lease.client().request(req);
        let deadline = async {
            tokio::select! {
                _ = body_sent.cancelled() => {}
                _ = unread.cancelled() => {}
            }
            tokio::time::sleep(limit).await;
        };
        // The body given back while the request is under way: the HTTP/2 client drops a
        // refused stream's body a moment before or after the response fails; the HTTP/1
        // client drops the body of a GET it sends without one and goes on, and then the body
        // must go soon, or its pump would wait on it.
        let mut returned: Option<UpstreamBody> = None;
        let mut back_done = false;
        let forget = tokio::time::sleep(Duration::MAX);
        tokio::pin!(request, deadline, forget);
        loop {
            tokio::select! {
                r = &mut request => {
                    let e = match r {
                        Ok(r) => return Sent::Answered(r, lease),
                        Err(e) => e,
                    };
                    let body = match returned {
                        Some(b) => Some(b),
                        // Only a request the upstream did not process may go again.
                        None if back_done || !unprocessed(&e) => None,
                        None => {
                            let b = tokio::time::timeout(BODY_RETURN_WAIT, back).await;
                            b.ok().and_then(Result::ok)
                        }
                    };
                    return Sent::Failed(e, body);
                }
                b = &mut back, if !back_done => {
                    back_done = true;
                    returned = b.ok();
                    forget.as_mut().reset(tokio::time::Instant::now() + BODY_RETURN_WAIT);
                }
                _ = &mut forget, if returned.is_some() => returned = None,
                _ = &mut deadline => return Sent::TimedOut,
            }
        }
    }

    /// Where `host`'s requests go (`host:port` as configured), for the access log.
    pub fn target_name(&self, host: &str) -> String {
        let own = self.routes.as_ref().and_then(|r| r.own(host));
        own.unwrap_or_else(|| match &self.proxy_target {
            Some(t) => t.name().to_string(),
            None => self.config.address.to_string(),
        })
    }

    /// The listener's response timeout (`upstream.responseTimeoutSeconds`).
    pub fn response_timeout(&self) -> Duration {
        self.config.response_timeout
    }

    /// How long the response body may make no progress (the listener's).
    pub fn body_idle_timeout(&self) -> Duration {
        self.config.response_body_idle_timeout
    }
}

/// Sends of one request, at most, while the upstream says it did not process it: a GOAWAY
/// or REFUSED_STREAM each time (the bound keeps an upstream that refuses every stream from
/// holding the request in a loop).
pub const MAX_SENDS: usize = 3;

/// How long a refused send may take to give the body back: the HTTP/2 client drops the
/// stream's body task when the stream ends, a moment after the response future fails.
const BODY_RETURN_WAIT: Duration = Duration::from_secs(1);

/// Upstream failures as the client sees them.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("connecting to the upstream timed out: {0}")]
    ConnectTimeout(String),
    #[error("upstream refused the connection: {0}")]
    Connect(String),
    #[error("TLS with the upstream failed: {0}")]
    Tls(String),
    #[error("upstream reset or closed the connection: {0}")]
    Reset(String),
    #[error("upstream protocol error: {0}")]
    Protocol(String),
}

impl UpstreamError {
    /// 504 for time-outs, 502 for everything else (RFC 9110 15.6.3 and 15.6.5).
    pub fn status(&self) -> http::StatusCode {
        match self {
            UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) => {
                http::StatusCode::GATEWAY_TIMEOUT
            }
            _ => http::StatusCode::BAD_GATEWAY,
        }
    }

    pub fn metric_kind(&self) -> &'static str {
        use crate::proxy::observe::metrics::upstream_error as k;
        match self {
            UpstreamError::Timeout(_) | UpstreamError::ConnectTimeout(_) => k::TIMEOUT,
            UpstreamError::Connect(_) => k::CONNECT,
            UpstreamError::Tls(_) => k::TLS,
            UpstreamError::Reset(_) => k::RESET,
            UpstreamError::Protocol(_) => k::PROTOCOL,
        }
    }
}

type ClientError = hyper_util::client::legacy::Error;

/// How one send of a request ended.
enum Sent {
    Answered(http::Response<hyper::body::Incoming>, UpstreamLease),
    TimedOut,
    /// The error, and the body if the upstream took nothing from it.
    Failed(ClientError, Option<UpstreamBody>),
}

/// Whether the upstream said it did not process the request (RFC 9113 8.7): its stream was
/// above the last stream ID of a GOAWAY the upstream sent, or was refused (REFUSED_STREAM). h2
/// hands a GOAWAY's error only to those streams, and to streams opened after it (never sent);
/// a stream below the last ID that the closing connection cuts gets a broken pipe instead.
fn unprocessed(e: &ClientError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(h2) = s.downcast_ref::<h2::Error>() {
            let refused = h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            return h2.is_remote() && (h2.is_go_away() || refused);
        }
        source = s.source();
    }
    false
}

fn classify(e: ClientError) -> UpstreamError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(&e);
    while let Some(s) = source {
        if let Some(c) = s.downcast_ref::<ConnectError>() {
            return match c {
                ConnectError::Timeout(_) => UpstreamError::ConnectTimeout(c.to_string()),
                ConnectError::Tls { .. } => UpstreamError::Tls(c.to_string()),
                _ => UpstreamError::Connect(c.to_string()),
            };
        }
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() || h.is_closed() {
                return UpstreamError::Reset(h.to_string());
            }
        }
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionAborted
            ) {
                return UpstreamError::Reset(io.to_string());
            }
        }
        source = s.source();
    }
    if e.is_connect() {
        UpstreamError::Connect(format!("{e:?}"))
    } else {
        UpstreamError::Protocol(format!("{e}: {:?}", std::error::Error::source(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::UpstreamVerify;
    use bytes::Bytes;
    use hyper_util::rt::TokioIo;

    #[tokio::test]
    async fn a_lane_holds_max_streams_per_connection_requests() {
        let config = UpstreamConfig {
            address: crate::config::parse_host_port("127.0.0.1:9").unwrap(),
            tls: false,
            verify: UpstreamVerify::ServedCertificate,
            proxy_protocol: None,
            forwarded_for: crate::api::ClientForwardedFor::Replace,
            max_streams_per_connection: 2,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            response_body_idle_timeout: Duration::from_secs(1),
            served_certificate_grace: Duration::ZERO,
        };
        let metrics = UpstreamMetrics::unregistered();
        let upstream = Upstream::new(&config, &HostTable::default(), metrics.clone()).unwrap();
        let metrics = metrics.lanes;
        let held: Vec<_> = (0..5).map(|_| upstream.lanes.lease()).collect();
        assert_eq!(upstream.lanes.count(), 3, "2 + 2 + 1");
        assert_eq!(metrics.in_flight.get(), 5);
        drop(held);
        assert_eq!(metrics.in_flight.get(), 0);
    }

    /// A plain HTTP server answering every request with `body`.
    async fn answering(body: &'static str) -> std::net::SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |_req| async move {
                        let b = http_body_util::Full::new(Bytes::from_static(body.as_bytes()));
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(b))
                    });
                    let io = TokioIo::new(s);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
        addr
    }

    /// A host with its own upstream (a Gateway run by its own proxy) is connected there, over
    /// real sockets; the others, wildcards included, go to the configuration's upstream.
    #[tokio::test]
    async fn a_host_with_its_own_upstream_is_sent_there() {
        use http_body_util::{BodyExt, Empty};
        let (shared, own) = (answering("shared").await, answering("own").await);
        let ck = rcgen::generate_simple_self_signed(vec!["*.test".to_string()]).unwrap();
        let cert = crate::config::Certificate::from_pem(
            ck.cert.pem().as_bytes(),
            ck.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let mut hosts = HostTable::default();
        let mut gw = cert.entry("gw.test".into());
        gw.upstream = Some(crate::config::parse_host_port(&own.to_string()).unwrap());
        hosts.insert(gw);
        hosts.insert(cert.entry("*.test".into()));
        let config = UpstreamConfig {
            address: crate::config::parse_host_port(&shared.to_string()).unwrap(),
            tls: false,
            verify: UpstreamVerify::ServedCertificate,
            proxy_protocol: None,
            forwarded_for: crate::api::ClientForwardedFor::Replace,
            max_streams_per_connection: 100,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            response_body_idle_timeout: Duration::from_secs(5),
            served_certificate_grace: Duration::ZERO,
        };
        let metrics = UpstreamMetrics::unregistered();
        let upstream = Upstream::new(&config, &hosts, metrics.clone()).unwrap();
        for (host, want) in [("gw.test", "own"), ("a.test", "shared")] {
            let req = http::Request::get(format!("http://{host}/"))
                .body(Empty::new().map_err(|never| match never {}).boxed())
                .unwrap();
            let sent = CancellationToken::new();
            sent.cancel();
            let limit = upstream.response_timeout();
            let (resp, _lease) = upstream.send(req, sent, limit).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(body, want.as_bytes(), "{host}");
        }
        // One pooled connection per host, counted until the pool closes them.
        assert_eq!(metrics.connections.get(), 2);
        drop(upstream);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while metrics.connections.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.connections.get(), 0, "closed with the pool");
        // Without any host of its own, no table is kept for the connector.
        let lookup = super::super::resolve::system_lookup();
        let none =
            super::super::connect::routes(&HostTable::default(), &lookup, &metrics.resolutions);
        assert!(none.is_none());
    }

    /// An upstream named by a DNS name (`localhost`, from /etc/hosts) is looked up once for
    /// the generation, not per connection: 1,000 requests for 1,000 hosts open 1,000 upstream
    /// connections (one pool per host) and make one lookup.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_connections_make_one_lookup() {
        use http_body_util::{BodyExt, Empty};
        let port = answering("ok").await.port();
        let config = UpstreamConfig {
            address: crate::config::parse_host_port(&format!("localhost:{port}")).unwrap(),
            tls: false,
            verify: UpstreamVerify::ServedCertificate,
            proxy_protocol: None,
            forwarded_for: crate::api::ClientForwardedFor::Replace,
            max_streams_per_connection: 100,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(5),
            response_body_idle_timeout: Duration::from_secs(5),
            served_certificate_grace: Duration::ZERO,
        };
        let metrics = UpstreamMetrics::unregistered();
        let upstream = Upstream::new(&config, &HostTable::default(), metrics.clone()).unwrap();
        for i in 0..1000 {
            let req = http::Request::get(format!("http://h{i}.test/"))
                .body(Empty::new().map_err(|never| match never {}).boxed())
                .unwrap();
            let sent = CancellationToken::new();
            sent.cancel();
            let (resp, _lease) = upstream
                .send(req, sent, Duration::from_secs(5))
                .await
                .unwrap();
            assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");
        }
        assert_eq!(metrics.connections.get(), 1000, "one connection per host");
        let ok = metrics.resolutions.with_label_values(&["ok"]).get();
        let failed = metrics.resolutions.with_label_values(&["failed"]).get();
        assert_eq!((ok, failed), (1, 0));
    }

    #[test]
    fn error_statuses() {
        assert_eq!(UpstreamError::Timeout(Duration::from_secs(1)).status(), 504);
        assert_eq!(UpstreamError::Connect("x".into()).status(), 502);
        assert_eq!(UpstreamError::Reset("x".into()).status(), 502);
    }
}
