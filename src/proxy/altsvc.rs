//! Probes the TCP ingress for each host: does it advertise us with `Alt-Svc: h3=":PORT"`?
//!
//! Browsers only find HTTP/3 through that header (or a DNS HTTPS record), and it must come
//! from the TCP ingress, which this proxy does not control. `/hosts` and metrics say per host
//! whether it is there and, when not, how to add it.
//!
//! One process per listener probes (`Shared::alt_svc_prober`: under Kubernetes the pod the
//! listener's status names, standalone the proxy itself), so the applications' logs see one
//! prober, not one per node, and the per-host Alt-Svc series come from one pod. A pod that
//! stops being the prober forgets its results and their series.
//!
//! The probes' cost must not grow with the hosts either: one `HEAD` of `altSvc.probePath` per
//! [`INTERVAL`] at most, hosts never probed first (in name order), then the host probed
//! longest ago, and no host more often than every [`PERIOD`]. Up to `PERIOD / INTERVAL` (300)
//! hosts, each is probed every 5 minutes; beyond that each host's turn comes every
//! `hosts x INTERVAL` (10,000 hosts: 2 h 47 min; a new host is probed within seconds unless
//! thousands of hosts arrive at once).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{header, Method, Request};
use http_body_util::{BodyExt, Empty};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::http3::serving::Generation;
use super::observe::logs::{self, CauseLog};
use super::state::{AltSvcProbe, Shared};
use crate::config::HostTable;

/// A host is probed again at most this often.
pub const PERIOD: Duration = Duration::from_secs(300);
/// At most one probe per this interval, whatever the number of hosts.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// The probes' `User-Agent`, for the TCP ingress's and the applications' logs.
pub const USER_AGENT: &str = concat!("h3-ingress-alt-svc-probe/", env!("CARGO_PKG_VERSION"));

/// Asks the probe loop to look for new hosts now (after a configuration change).
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

/// The host to probe at `now`: one never probed first (in name order), else the one probed
/// longest ago if that was at least [`PERIOD`] ago. Pure.
pub fn next_host<'a>(
    hosts: &'a HostTable,
    probed: &HashMap<String, AltSvcProbe>,
    now: Instant,
) -> Option<&'a str> {
    let mut oldest: Option<(&str, Instant)> = None;
    for name in hosts.names() {
        let Some(p) = probed.get(name) else {
            return Some(name);
        };
        if oldest.is_none_or(|(_, at)| p.at < at) {
            oldest = Some((name, p.at));
        }
    }
    oldest
        .filter(|(_, at)| now.saturating_duration_since(*at) >= PERIOD)
        .map(|(name, _)| name)
}

/// Waits until `role` changes; forever once nobody can change it (a standalone proxy).
async fn role_change(role: &mut tokio::sync::watch::Receiver<bool>) {
    if role.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// What a pod that is not (or no longer) the prober shows: no probe results, no series.
fn forget(shared: &Shared) {
    shared.alt_svc_probes.lock().expect("probe lock").clear();
    shared.serving.metrics.per_host.forget_probes();
}

pub async fn probe_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    // Give the ingress a moment after start-up.
    tokio::select! {
        _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        _ = shutdown.cancelled() => return,
    }
    let mut role = shared.alt_svc_prober.clone();
    let mut log = CauseLog::new(logs::WINDOW);
    let mut budget = tokio::time::interval(INTERVAL);
    budget.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if !*role.borrow_and_update() {
            forget(&shared);
            tokio::select! {
                _ = role_change(&mut role) => continue,
                _ = shutdown.cancelled() => return,
            }
        }
        let gen = shared.serving.current.load_full();
        let host = {
            let mut probed = shared.alt_svc_probes.lock().expect("probe lock");
            probed.retain(|name, _| gen.config.hosts.get(name).is_some());
            next_host(&gen.config.hosts, &probed, Instant::now()).map(str::to_string)
        };
        match host {
            Some(host) => {
                probe(&shared, &gen, &host, &mut log).await;
                tokio::select! {
                    _ = budget.tick() => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            // Nothing due: wait for a turn, a new configuration or another prober.
            None => tokio::select! {
                _ = budget.tick() => {}
                _ = shared.probe_now.notified() => {}
                _ = role_change(&mut role) => {}
                _ = shutdown.cancelled() => return,
            },
        }
    }
}

/// Probes one configured host and records the result.
async fn probe(shared: &Shared, gen: &Generation, name: &str, log: &mut CauseLog) {
    let Some(entry) = gen.config.hosts.get(name) else {
        return;
    };
    let port = shared.serving.port;
    // A wildcard host is probed under a name it covers.
    let host = match name.strip_prefix("*.") {
        Some(parent) => format!("h3-ingress-probe.{parent}"),
        None => name.to_string(),
    };
    let req = Request::builder()
        .method(Method::HEAD)
        .uri(format!(
            "{}://{host}{}",
            gen.upstream.scheme(),
            gen.config.alt_svc_probe_path
        ))
        .header(header::USER_AGENT, USER_AGENT)
        .body(Empty::new().map_err(|never| match never {}).boxed())
        .expect("probe request is valid");
    // The probe has no body: the response timeout runs from the start.
    let sent = CancellationToken::new();
    sent.cancel();
    let limit = gen.upstream.response_timeout();
    let (advertised, failure) = match gen.upstream.send(req, sent, limit).await {
        Ok((resp, _lease)) => {
            let ok = resp
                .headers()
                .get_all(header::ALT_SVC)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .any(|v| advertises_h3(v, port));
            (ok, None)
        }
        Err(e) => {
            debug!(host = %name, error = %e, "Alt-Svc probe failed");
            (false, Some(e.to_string()))
        }
    };
    let probe = AltSvcProbe {
        advertised,
        failure,
        at: Instant::now(),
    };
    shared
        .serving
        .metrics
        .per_host
        .probed(name, entry.not_after, advertised);
    let before = shared
        .alt_svc_probes
        .lock()
        .expect("probe lock")
        .insert(name.to_string(), probe.clone())
        .map(|p| p.advertised);
    // Log transitions only (the probe repeats), and at most one line a minute per kind of
    // result: at 10,000 hosts an ingress without Alt-Svc would otherwise log one a second.
    if before == Some(advertised) {
        return;
    }
    let cause = match (advertised, probe.failure.is_some()) {
        (true, _) => "advertised",
        (false, false) => "not advertised",
        (false, true) => "probe failed",
    };
    let Some(held) = log.allow(cause, Instant::now()) else {
        return;
    };
    let others = if held > 0 {
        format!(" ({held} more hosts since the last such line; /hosts lists them)")
    } else {
        String::new()
    };
    if advertised {
        info!(host = %name, "TCP ingress advertises HTTP/3 (Alt-Svc) for this host{others}");
    } else {
        let max_age = gen.config.alt_svc_max_age;
        warn!(host = %name, "{}{others}", probe.message(name, port, max_age));
    }
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

    fn table(names: &[&str]) -> HostTable {
        let ck = rcgen::generate_simple_self_signed(
            names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let cert = crate::config::Certificate::from_pem(
            ck.cert.pem().as_bytes(),
            ck.signing_key.serialize_pem().as_bytes(),
        )
        .unwrap();
        let mut t = HostTable::default();
        for n in names {
            t.insert(cert.entry(n.to_string()));
        }
        t
    }

    fn probed(at: Instant) -> AltSvcProbe {
        AltSvcProbe {
            advertised: true,
            failure: None,
            at,
        }
    }

    #[test]
    fn new_hosts_first_then_the_oldest_probe_and_never_before_its_period() {
        let t = table(&["a.test", "b.test", "c.test"]);
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        // Never probed: in name order.
        assert_eq!(next_host(&t, &seen, t0), Some("a.test"));
        seen.insert("a.test".to_string(), probed(t0));
        seen.insert("c.test".to_string(), probed(t0 + Duration::from_secs(1)));
        assert_eq!(next_host(&t, &seen, t0), Some("b.test"));
        seen.insert("b.test".to_string(), probed(t0 + Duration::from_secs(2)));
        // Everything probed recently: nothing is due.
        assert_eq!(next_host(&t, &seen, t0 + Duration::from_secs(10)), None);
        // After the period, the oldest first.
        let later = t0 + PERIOD + Duration::from_secs(1);
        assert_eq!(next_host(&t, &seen, later), Some("a.test"));
        seen.insert("a.test".to_string(), probed(later));
        assert_eq!(next_host(&t, &seen, later), Some("c.test"));
    }
}
