//! The one admin HTTP endpoint of the long-running commands (`proxy` and `operator`):
//! `/healthz`, `/readyz`, `/metrics` and, where the component has one, `/status`.
//!
//! It knows nothing about what it reports on: each component hands it an [`AdminSource`].
//! [`route`] is pure, so every answer can be tested without a socket; [`serve`] is the thin
//! I/O around it and stops accepting when its shutdown token is cancelled.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Response, StatusCode};
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::fds::{AcceptBackoff, AcceptSocket};

/// The Prometheus text exposition format, version 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the admin endpoint asks the component it serves.
pub trait AdminSource: Send + Sync + 'static {
    /// `Ok` when the component should receive traffic; otherwise why not (`/readyz` says it
    /// with a 503).
    fn readiness(&self) -> Result<(), String>;
    /// Every metric in the text exposition format.
    fn metrics(&self) -> String;
    /// The `/status` JSON document; `None` when the component has none (`/status` is 404).
    fn status(&self) -> Option<String> {
        None
    }
    /// The `/hosts` JSON document (one entry per host); `None` when there is none (404).
    fn hosts(&self) -> Option<String> {
        None
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// Binds the admin endpoint at `addr`: `[::]` is one dual-stack socket (IPv4 and IPv6 probes
/// both reach it) that falls back to `0.0.0.0` on a host without IPv6
/// ([`crate::config::bind`]); any other address binds as given. Returns the listener and
/// the address really bound.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<(TcpListener, std::net::SocketAddr)> {
    let (std_listener, bound) = crate::config::bind::bind_admin(addr)?;
    Ok((TcpListener::from_std(std_listener)?, bound))
}

/// The answer to one admin request. Pure apart from what `source` computes.
pub fn route(source: &dyn AdminSource, method: &Method, path: &str) -> Response<Full<Bytes>> {
    if method != Method::GET && method != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    match path {
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match source.readiness() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        "/metrics" => text(StatusCode::OK, METRICS_CONTENT_TYPE, source.metrics()),
        "/status" => match source.status() {
            Some(json) => text(StatusCode::OK, "application/json", json),
            None => not_found(),
        },
        "/hosts" => match source.hosts() {
            Some(json) => text(StatusCode::OK, "application/json", json),
            None => not_found(),
        },
        _ => not_found(),
    }
}

fn not_found() -> Response<Full<Bytes>> {
    text(
        StatusCode::NOT_FOUND,
        "text/plain",
        "not found; try /metrics /healthz /readyz (and /status, /hosts on the data plane)\n".into(),
    )
}

/// Serves the admin endpoint on a bound listener until `shutdown` is cancelled; connections
/// still open then are closed gracefully (an answer being written is finished). A failed
/// accept pauses the loop ([`AcceptBackoff`]) instead of spinning on a full descriptor table.
pub async fn serve(
    listener: TcpListener,
    source: Arc<dyn AdminSource>,
    shutdown: CancellationToken,
) {
    let mut backoff = AcceptBackoff::new(AcceptSocket::Admin);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => {
                    backoff.accepted();
                    s
                }
                Err(e) => {
                    let pause = backoff.failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => continue,
                        _ = shutdown.cancelled() => return,
                    }
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let source = source.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let resp = route(source.as_ref(), req.method(), req.uri().path());
                async move { Ok::<_, Infallible>(resp) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            let result = tokio::select! {
                r = conn.as_mut() => r,
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = result {
                debug!(%peer, error = %e, "admin connection ended");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Fake {
        ready: AtomicBool,
        status: bool,
    }

    impl AdminSource for Fake {
        fn readiness(&self) -> Result<(), String> {
            if self.ready.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("warming up".into())
            }
        }
        fn metrics(&self) -> String {
            "fake_total 1\n".into()
        }
        fn status(&self) -> Option<String> {
            self.status.then(|| "{\"ok\":true}".into())
        }
    }

    async fn body(r: Response<Full<Bytes>>) -> String {
        let b = r.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(b.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn routes() {
        let f = Fake {
            ready: AtomicBool::new(false),
            status: false,
        };
        let get = |p: &str| route(&f, &Method::GET, p);
        assert_eq!(get("/healthz").status(), StatusCode::OK);
        let r = get("/readyz");
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(body(r).await, "not ready: warming up\n");
        f.ready.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").status(), StatusCode::OK);
        let m = get("/metrics");
        assert_eq!(m.headers()[header::CONTENT_TYPE], METRICS_CONTENT_TYPE);
        assert_eq!(body(m).await, "fake_total 1\n");
        // No status document: /status is not a route, nor /hosts.
        assert_eq!(get("/status").status(), StatusCode::NOT_FOUND);
        assert_eq!(get("/hosts").status(), StatusCode::NOT_FOUND);
        assert_eq!(
            route(&f, &Method::POST, "/metrics").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        let with_status = Fake {
            ready: AtomicBool::new(true),
            status: true,
        };
        let r = route(&with_status, &Method::GET, "/status");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(body(r).await, "{\"ok\":true}");
        let r = route(&with_status, &Method::HEAD, "/nope");
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(body(r).await.contains("/readyz"));
    }

    /// A connection left open (keep-alive) must not keep the server alive past shutdown.
    #[tokio::test]
    async fn shutdown_stops_accepting_and_closes_idle_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let source = Arc::new(Fake {
            ready: AtomicBool::new(true),
            status: false,
        });
        let server = tokio::spawn(serve(listener, source, shutdown.clone()));
        let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
        idle.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = idle.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));

        shutdown.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), server)
            .await
            .expect("serve returns on shutdown")
            .unwrap();
        // The kept-alive connection is closed by the server, not left hanging.
        let n = tokio::time::timeout(std::time::Duration::from_secs(5), idle.read(&mut buf))
            .await
            .expect("idle connection closed after shutdown")
            .unwrap_or(0);
        assert_eq!(n, 0);
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
