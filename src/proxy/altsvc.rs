//! Probes the TCP ingress for each host: does it advertise us with `Alt-Svc: h3=":PORT"`?
//!
//! Browsers only find HTTP/3 through that header (or a DNS HTTPS record), and it must come
//! from the TCP ingress, which this proxy does not control. Status and metrics say per host
//! whether it is there and, when not, how to add it.

use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request};
use http_body_util::{BodyExt, Empty};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::state::{AltSvcProbe, Shared};

const PERIOD: Duration = Duration::from_secs(300);

/// Asks the probe loop to run now (after a configuration change).
pub fn probe_soon(shared: &Shared) {
    shared.probe_now.notify_one();
}

/// True when an Alt-Svc value offers h3 on `port` (any `ma`, any other alternatives).
pub fn advertises_h3(value: &str, port: u16) -> bool {
    let want = format!("h3=\":{port}\"");
    value.split(',').any(|alt| {
        alt.trim()
            .split(';')
            .next()
            .is_some_and(|a| a.trim() == want)
    })
}

pub async fn probe_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    // Give the ingress a moment after start-up.
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        _ = shutdown.cancelled() => return,
    }
    loop {
        probe_all(&shared).await;
        tokio::select! {
            _ = tokio::time::sleep(PERIOD) => {}
            _ = shared.probe_now.notified() => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

async fn probe_all(shared: &Arc<Shared>) {
    let gen = shared.current.load_full();
    let port = shared.port;
    let mut results = std::collections::BTreeMap::new();
    let previous = shared.alt_svc_probes.lock().expect("probe lock").clone();
    for entry in gen.config.hosts.iter() {
        // A wildcard host is probed under a name it covers.
        let host = match entry.name.strip_prefix("*.") {
            Some(parent) => format!("h3-ingress-probe.{parent}"),
            None => entry.name.clone(),
        };
        let req = Request::builder()
            .method(Method::HEAD)
            .uri(format!("{}://{host}/", gen.upstream.scheme()))
            .header(header::USER_AGENT, "h3-ingress-alt-svc-probe")
            .body(Empty::new().map_err(|never| match never {}).boxed())
            .expect("probe request is valid");
        // The probe has no body: the response timeout runs from the start.
        let sent = tokio_util::sync::CancellationToken::new();
        sent.cancel();
        let probe = match gen.upstream.send(req, sent).await {
            Ok((resp, _lease)) => {
                let values: Vec<String> = resp
                    .headers()
                    .get_all(header::ALT_SVC)
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(String::from))
                    .collect();
                let ok = values.iter().any(|v| advertises_h3(v, port));
                AltSvcProbe {
                    advertised: ok,
                    message: if ok {
                        String::new()
                    } else {
                        // No controller: the data plane cannot tell which one the ingress is.
                        crate::api::altsvc::advice(
                            None,
                            &entry.name,
                            port,
                            gen.config.alt_svc_max_age,
                        )
                    },
                }
            }
            Err(e) => {
                debug!(host = %entry.name, error = %e, "Alt-Svc probe failed");
                AltSvcProbe {
                    advertised: false,
                    message: format!("probing the TCP ingress failed: {e}"),
                }
            }
        };
        shared
            .metrics
            .alt_svc_advertised
            .with_label_values(&[&entry.name])
            .set(probe.advertised as i64);
        // Log transitions only: the probe repeats every few minutes.
        let before = previous.get(&entry.name).map(|p| p.advertised);
        if before != Some(probe.advertised) {
            if probe.advertised {
                info!(host = %entry.name, "TCP ingress advertises HTTP/3 (Alt-Svc) for this host");
            } else {
                warn!(host = %entry.name, "{}", probe.message);
            }
        }
        results.insert(entry.name.clone(), probe);
    }
    *shared.alt_svc_probes.lock().expect("probe lock") = results;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alt_svc_parsing() {
        assert!(advertises_h3("h3=\":443\"; ma=86400", 443));
        assert!(advertises_h3("h2=\":443\", h3=\":443\"; ma=60", 443));
        assert!(!advertises_h3("h3=\":8443\"; ma=86400", 443));
        assert!(!advertises_h3("h3-29=\":443\"", 443));
        assert!(!advertises_h3("clear", 443));
    }
}
