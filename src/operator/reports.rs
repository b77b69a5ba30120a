//! Reads `GET http://POD_IP:METRICS_PORT/status` from the data plane pods, at most
//! [`STATUS_FAN_OUT`]`.max_in_flight` at once in the whole operator, each given up after its
//! `timeout`: a listener on a thousand nodes, or many listeners reconciled together, cost a
//! bounded number of connections, and a node that does not answer a bounded wait.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;

use crate::api::StatusReport;

/// A `/status` document larger than this is not a status document.
pub const MAX_REPORT_BYTES: usize = 1 << 20;

/// How the operator reads its pods' reports: the one source of both bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOut {
    /// Fetches in flight at once, over every reconcile of the operator.
    pub max_in_flight: usize,
    /// Each fetch, from its connect to its last byte, once it has its turn.
    pub timeout: Duration,
}

/// A reconcile of a listener on N nodes whose pods all hang waits at most
/// ceil(N / 32) x 3 s for their reports (a thousand nodes: 96 s; answering pods take
/// milliseconds each); a pod answers in well under a second on a loaded node.
pub const STATUS_FAN_OUT: FanOut = FanOut {
    max_in_flight: 32,
    timeout: Duration::from_secs(3),
};
/// [`STATUS_FAN_OUT`]'s timeout, which the HTTP fetcher applies to its connect as well.
pub const FETCH_TIMEOUT: Duration = STATUS_FAN_OUT.timeout;

/// The operator-wide gate of [`FanOut`]: every fetch waits for a turn, then gets `timeout`.
#[derive(Clone)]
pub struct Gate {
    turns: Arc<Semaphore>,
    timeout: Duration,
}

impl Gate {
    pub fn new(f: FanOut) -> Self {
        Self {
            turns: Arc::new(Semaphore::new(f.max_in_flight)),
            timeout: f.timeout,
        }
    }

    /// `fetcher.fetch(address)` in its turn, within the timeout.
    pub async fn fetch(
        &self,
        fetcher: &dyn ReportFetcher,
        address: SocketAddr,
    ) -> Result<StatusReport, String> {
        let _turn = self
            .turns
            .acquire()
            .await
            .expect("the gate is never closed");
        tokio::time::timeout(self.timeout, fetcher.fetch(address))
            .await
            .unwrap_or_else(|_| Err(format!("GET /status: no answer within {:?}", self.timeout)))
    }
}

pub type ReportFuture = Pin<Box<dyn Future<Output = Result<StatusReport, String>> + Send>>;

/// Where reports come from; a trait so tests can answer without pods.
pub trait ReportFetcher: Send + Sync {
    fn fetch(&self, address: SocketAddr) -> ReportFuture;
}

/// Plain HTTP to the pod's metrics endpoint (it serves no TLS; it carries no secrets).
pub struct HttpReportFetcher {
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl Default for HttpReportFetcher {
    fn default() -> Self {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(FETCH_TIMEOUT));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

impl ReportFetcher for HttpReportFetcher {
    fn fetch(&self, address: SocketAddr) -> ReportFuture {
        let client = self.client.clone();
        Box::pin(async move {
            let uri: http::Uri = format!("http://{address}/status")
                .parse()
                .map_err(|e| format!("bad address {address}: {e}"))?;
            let work = async {
                let resp = client
                    .get(uri)
                    .await
                    .map_err(|e| format!("GET /status: {e}"))?;
                let status = resp.status();
                let body = Limited::new(resp.into_body(), MAX_REPORT_BYTES)
                    .collect()
                    .await
                    .map_err(|e| format!("reading /status: {e}"))?
                    .to_bytes();
                if !status.is_success() {
                    return Err(format!("GET /status: HTTP {status}"));
                }
                serde_json::from_slice::<StatusReport>(&body)
                    .map_err(|e| format!("/status is not a status report: {e}"))
            };
            tokio::time::timeout(FETCH_TIMEOUT, work)
                .await
                .map_err(|_| format!("GET /status: no answer within {FETCH_TIMEOUT:?}"))?
        })
    }
}

/// Where to reach a pod's `/status`: the pod IP (the node's, under hostNetwork) and the
/// metrics port, unless the endpoint is bound to an address the operator cannot reach.
pub fn status_address(pod_ip: &str, metrics: SocketAddr) -> Result<SocketAddr, String> {
    let ip: IpAddr = pod_ip
        .parse()
        .map_err(|_| format!("pod IP {pod_ip:?} is not an IP address"))?;
    if metrics.ip().is_loopback() {
        return Err(format!(
            "spec.metrics.address {metrics} is loopback; the operator cannot read /status (use 0.0.0.0:{})",
            metrics.port()
        ));
    }
    Ok(SocketAddr::new(ip, metrics.port()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn addresses() {
        let any: SocketAddr = "0.0.0.0:9476".parse().unwrap();
        assert_eq!(
            status_address("10.0.0.7", any).unwrap().to_string(),
            "10.0.0.7:9476"
        );
        assert_eq!(
            status_address("fd00::7", any).unwrap().to_string(),
            "[fd00::7]:9476"
        );
        assert!(status_address("", any).is_err());
        let lo: SocketAddr = "127.0.0.1:9476".parse().unwrap();
        assert!(status_address("10.0.0.7", lo)
            .unwrap_err()
            .contains("loopback"));
    }

    async fn serve_once(response: String) -> SocketAddr {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /status HTTP/1.1"));
            s.write_all(response.as_bytes()).await.unwrap();
        });
        addr
    }

    /// Answers after `delay` (never, without one), counting the fetches in flight.
    #[derive(Default)]
    struct Counting {
        delay: Option<Duration>,
        now: std::sync::atomic::AtomicUsize,
        peak: std::sync::atomic::AtomicUsize,
        started: std::sync::atomic::AtomicUsize,
    }

    impl ReportFetcher for Arc<Counting> {
        fn fetch(&self, _: SocketAddr) -> ReportFuture {
            use std::sync::atomic::Ordering::SeqCst;
            let me = self.clone();
            Box::pin(async move {
                me.started.fetch_add(1, SeqCst);
                let n = me.now.fetch_add(1, SeqCst) + 1;
                me.peak.fetch_max(n, SeqCst);
                // Decremented on drop, so a fetch the gate gave up on counts out too.
                struct Out(Arc<Counting>);
                impl Drop for Out {
                    fn drop(&mut self) {
                        self.0.now.fetch_sub(1, SeqCst);
                    }
                }
                let _out = Out(me.clone());
                match me.delay {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending::<()>().await,
                }
                Ok(StatusReport::default())
            })
        }
    }

    /// `pods` fetches through one gate, as reconciles of `listeners` listeners at once would
    /// issue them: the peak in flight, the wall time (tokio's paused clock) and the errors.
    async fn fan_out(
        pods: usize,
        listeners: usize,
        delay: Option<Duration>,
    ) -> (usize, Duration, usize) {
        use std::sync::atomic::Ordering::SeqCst;
        let gate = Gate::new(STATUS_FAN_OUT);
        let fetcher = Arc::new(Counting {
            delay,
            ..Default::default()
        });
        let addr: SocketAddr = "10.0.0.1:9476".parse().unwrap();
        let start = tokio::time::Instant::now();
        let per = pods / listeners;
        let reconciles = (0..listeners).map(|_| {
            let (gate, fetcher) = (gate.clone(), fetcher.clone());
            async move {
                let all = (0..per).map(|_| gate.fetch(&fetcher, addr));
                futures_util::future::join_all(all).await
            }
        });
        let out = futures_util::future::join_all(reconciles).await;
        let errors = out.iter().flatten().filter(|r| r.is_err()).count();
        assert_eq!(fetcher.started.load(SeqCst), pods, "every pod was asked");
        assert_eq!(fetcher.now.load(SeqCst), 0);
        (fetcher.peak.load(SeqCst), start.elapsed(), errors)
    }

    /// The fan-out against many pods: the peak in flight is the bound, and hanging pods cost
    /// the timeout per turn, not a wait without end. The figures are printed
    /// (`cargo test --lib fan_out -- --nocapture`).
    #[tokio::test(start_paused = true)]
    async fn the_status_fan_out_is_bounded_in_flight_and_in_time() {
        let FanOut {
            max_in_flight,
            timeout,
        } = STATUS_FAN_OUT;
        let rounds = |pods: usize| pods.div_ceil(max_in_flight) as u32;
        let answer = Duration::from_millis(20);
        for (pods, listeners) in [(10, 1), (1000, 1), (5000, 10)] {
            let (peak, took, errors) = fan_out(pods, listeners, Some(answer)).await;
            println!(
                "status fan-out: {pods} pods answering in {answer:?} over {listeners} listener(s): \
                 peak {peak} in flight (bound {max_in_flight}), {took:?}, {errors} errors"
            );
            assert_eq!(peak, pods.min(max_in_flight));
            assert_eq!(errors, 0);
            assert_eq!(took, answer * rounds(pods));
        }
        let (peak, took, errors) = fan_out(1000, 1, None).await;
        println!(
            "status fan-out: 1000 pods that never answer: peak {peak} in flight, all given up \
             after {took:?} ({} turns of {timeout:?}), {errors} errors",
            rounds(1000)
        );
        assert_eq!((peak, errors), (max_in_flight, 1000));
        assert_eq!(took, timeout * rounds(1000));
    }

    #[tokio::test]
    async fn fetches_and_parses_a_report_over_real_http() {
        let report = StatusReport {
            version: "0.1.0".into(),
            port: 443,
            udp_drops: 7,
            ..Default::default()
        };
        let body = serde_json::to_string(&report).unwrap();
        let addr = serve_once(format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ))
        .await;
        let got = HttpReportFetcher::default().fetch(addr).await.unwrap();
        assert_eq!(got, report);

        let addr = serve_once(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                .into(),
        )
        .await;
        let e = HttpReportFetcher::default().fetch(addr).await.unwrap_err();
        assert!(e.contains("503"), "{e}");

        let addr = serve_once(
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\n\"x\"".into(),
        )
        .await;
        let e = HttpReportFetcher::default().fetch(addr).await.unwrap_err();
        assert!(e.contains("not a status report"), "{e}");
    }
}
