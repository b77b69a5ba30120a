//! Reads `GET http://POD_IP:METRICS_PORT/status` from the data plane pods.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::api::StatusReport;

/// A `/status` document larger than this is not a status document.
pub const MAX_REPORT_BYTES: usize = 1 << 20;
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(3);

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
