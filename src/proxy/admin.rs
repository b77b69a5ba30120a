//! The admin endpoint: `/metrics`, `/healthz`, `/readyz`, `/status`.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::server::Shared;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(s) => s,
                Err(e) => {
                    debug!(error = %e, "admin accept failed");
                    continue;
                }
            },
            _ = shutdown.cancelled() => return,
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| {
                let shared = shared.clone();
                async move { Ok::<_, Infallible>(route(&shared, &req)) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
                debug!(%peer, error = %e, "admin connection ended");
            }
        });
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

fn route(shared: &Shared, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => {
            sync_cc_counters(shared);
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                shared.metrics.render(),
            )
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            if shared.is_ready() {
                text(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                let why = if shared.draining.load(Ordering::Relaxed) {
                    "draining"
                } else if shared.current.load().config.hosts.is_empty() {
                    "no host loaded"
                } else {
                    "no UDP socket bound"
                };
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    format!("not ready: {why}\n"),
                )
            }
        }
        "/status" => {
            let report = shared.status_report();
            text(
                StatusCode::OK,
                "application/json",
                serde_json::to_string_pretty(&report).expect("status serialises"),
            )
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "try /metrics /healthz /readyz /status\n".into(),
        ),
    }
}

/// The congestion controllers count into atomics; mirror them into the registry on scrape.
fn sync_cc_counters(shared: &Shared) {
    let stats = &shared.cc_stats;
    let metrics = &shared.metrics;
    for (total, counter) in [
        (
            stats.handshake_losses_forgiven(),
            &metrics.handshake_losses_forgiven,
        ),
        (
            stats.random_losses_tolerated(),
            &metrics.random_losses_tolerated,
        ),
        (
            stats.slow_start_delay_exits(),
            &metrics.slow_start_delay_exits,
        ),
    ] {
        let seen = counter.get();
        if total > seen {
            counter.inc_by(total - seen);
        }
    }
}
