//! The operator's own metrics (`h3_ingress_operator_*`) and what it answers on the shared
//! admin endpoint ([`crate::admin`]): ready once its caches are filled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::admin::AdminSource;

/// Reconcile outcomes, the only values of the `result` label.
pub mod results {
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
    /// Not the leader: nothing written.
    pub const STANDBY: &str = "standby";
}

/// Outcomes of the operator's upgrades of the CRD, the values of the `result` label.
pub mod crd_upgrade {
    pub const OK: &str = "ok";
    pub const ERROR: &str = "error";
}

pub struct OperatorMetrics {
    registry: Registry,
    pub reconciles: IntCounterVec,
    pub reconcile_seconds: Histogram,
    pub status_writes: IntCounter,
    pub events: IntCounterVec,
    pub pod_report_errors: IntCounter,
    pub leader: IntGauge,
    /// Objects applied (only those that changed: zero at steady state).
    pub applies: IntCounter,
    /// Certificate mirrors written and deleted.
    pub mirror_writes: IntCounter,
    pub mirror_deletes: IntCounter,
    /// Source Secrets read (a GET only when its resourceVersion moved).
    pub secret_reads: IntCounter,
    /// Of those, reads that failed (not a 404): the hosts keep the last good certificate.
    pub secret_read_errors: IntCounter,
    /// Hosts wanted, summed over listeners (set by each reconcile).
    pub hosts: IntGauge,
    /// Schema revision of the served CRD (`of="served"`, -1 when unreadable) and of this
    /// operator (`of="operator"`).
    pub crd_revision: IntGaugeVec,
    pub crd_upgrades: IntCounterVec,
    /// Traefik objects in the operator's cache, by kind (`Middleware`, `TLSOption`).
    pub traefik_objects: IntGaugeVec,
    /// The DNS publishers' work (`spec.advertise.dns`).
    pub dns: DnsMetrics,
}

/// What the listeners' DNS publishing tasks did: RFC 2136 UPDATE messages sent, and the
/// attempts that failed by the status reason they gave (a fixed set, every one exported
/// from 0). Clones share the counters.
#[derive(Clone)]
pub struct DnsMetrics {
    pub updates: IntCounter,
    pub failures: IntCounterVec,
}

/// The reasons a DNS publishing attempt fails with, the values of the `reason` label.
pub const DNS_FAILURE_REASONS: [&str; 4] = [
    crate::api::reasons::SERVER_UNREACHABLE,
    crate::api::reasons::TSIG_REFUSED,
    crate::api::reasons::UPDATE_REFUSED,
    crate::api::reasons::TSIG_KEY_UNAVAILABLE,
];

impl DnsMetrics {
    /// Counters not (yet) in a registry: what a publisher counts into by default.
    pub fn unregistered() -> Self {
        let updates = IntCounter::new(
            "h3_ingress_operator_dns_updates_total",
            "RFC 2136 UPDATE messages sent to the authoritative servers of spec.advertise.dns (zero at rest)",
        )
        .expect("metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "h3_ingress_operator_dns_failures_total",
                "DNS publishing attempts that failed, by the reason the listener's status gives",
            ),
            &["reason"],
        )
        .expect("metric");
        for r in DNS_FAILURE_REASONS {
            failures.with_label_values(&[r]);
        }
        Self { updates, failures }
    }

    /// Counts a failure; a reason outside the known set is counted under none (it would
    /// be an unbounded label).
    pub fn failed(&self, reason: &str) {
        if DNS_FAILURE_REASONS.contains(&reason) {
            self.failures.with_label_values(&[reason]).inc();
        }
    }
}

/// The kinds of `h3_ingress_operator_traefik_objects`.
pub mod traefik_kinds {
    pub const MIDDLEWARE: &str = "Middleware";
    pub const TLS_OPTION: &str = "TLSOption";
}

impl OperatorMetrics {
    pub fn new() -> Arc<Self> {
        let registry = Registry::new();
        let reconciles = IntCounterVec::new(
            Opts::new(
                "h3_ingress_operator_reconciles_total",
                "Reconciliations of Http3Listeners by result",
            ),
            &["result"],
        )
        .expect("metric");
        let reconcile_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "h3_ingress_operator_reconcile_duration_seconds",
                "Time per reconciliation",
            )
            .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
        )
        .expect("metric");
        let counter = |name: &str, help: &str| IntCounter::new(name, help).expect("metric");
        let status_writes = counter(
            "h3_ingress_operator_status_writes_total",
            "Http3Listener status patches (written only when the status changed)",
        );
        let events = events_metric();
        let pod_report_errors = counter(
            "h3_ingress_operator_pod_report_errors_total",
            "Data plane /status reads that failed",
        );
        let gauge = |name: &str, help: &str| IntGauge::new(name, help).expect("metric");
        let leader = gauge(
            "h3_ingress_operator_leader",
            "1 while this replica holds the leader Lease",
        );
        let applies = counter(
            "h3_ingress_operator_applies_total",
            "Objects applied because they changed (an unchanged object is not applied)",
        );
        let mirror_writes = counter(
            "h3_ingress_operator_mirror_writes_total",
            "Certificate mirrors written to the hosts namespace",
        );
        let mirror_deletes = counter(
            "h3_ingress_operator_mirror_deletes_total",
            "Certificate mirrors deleted from the hosts namespace",
        );
        let secret_reads = counter(
            "h3_ingress_operator_secret_reads_total",
            "Source Secrets read (once per resourceVersion)",
        );
        let secret_read_errors = counter(
            "h3_ingress_operator_secret_read_errors_total",
            "Source Secret reads that failed (an error or a timeout, not a 404); their hosts keep the last good certificate",
        );
        let hosts = gauge(
            "h3_ingress_operator_hosts",
            "Hosts the listeners want, served or not",
        );
        let (build_info, crd_revision, crd_upgrades) = crd_metrics();
        let traefik_objects = traefik_metric();
        let dns = DnsMetrics::unregistered();
        for c in [
            Box::new(dns.updates.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(dns.failures.clone()),
            Box::new(traefik_objects.clone()),
            Box::new(applies.clone()),
            Box::new(mirror_writes.clone()),
            Box::new(mirror_deletes.clone()),
            Box::new(secret_reads.clone()),
            Box::new(secret_read_errors.clone()),
            Box::new(hosts.clone()),
            Box::new(build_info),
            Box::new(crd_revision.clone()),
            Box::new(crd_upgrades.clone()),
            Box::new(reconciles.clone()),
            Box::new(reconcile_seconds.clone()),
            Box::new(status_writes.clone()),
            Box::new(events.clone()),
            Box::new(pod_report_errors.clone()),
            Box::new(leader.clone()),
            Box::new(crate::memory::HeapCollector::new(
                crate::memory::OPERATOR_HEAP_BYTES,
            )),
            Box::new(crate::fds::FdCollector::new(
                crate::fds::OPERATOR_ACCEPT_ERRORS,
            )),
        ] {
            registry.register(c).expect("unique metric names");
        }
        for r in [results::OK, results::ERROR, results::STANDBY] {
            reconciles.with_label_values(&[r]);
        }
        Arc::new(Self {
            registry,
            reconciles,
            reconcile_seconds,
            status_writes,
            events,
            pod_report_errors,
            leader,
            applies,
            mirror_writes,
            mirror_deletes,
            secret_reads,
            secret_read_errors,
            hosts,
            crd_revision,
            crd_upgrades,
            traefik_objects,
            dns,
        })
    }

    /// Counts the cached Traefik objects.
    pub fn set_traefik_objects(&self, o: &crate::operator::hosts::TraefikObjects) {
        let set = |kind: &str, n: usize| {
            self.traefik_objects
                .with_label_values(&[kind])
                .set(i64::try_from(n).unwrap_or(i64::MAX))
        };
        set(traefik_kinds::MIDDLEWARE, o.middlewares.len());
        set(traefik_kinds::TLS_OPTION, o.tls_options.len());
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

/// `h3_ingress_operator_events_total{type}`, both types exported from 0.
fn events_metric() -> IntCounterVec {
    let events = IntCounterVec::new(
        Opts::new(
            "h3_ingress_operator_events_total",
            "Kubernetes Events published, by type",
        ),
        &["type"],
    )
    .expect("metric");
    for t in ["Normal", "Warning"] {
        events.with_label_values(&[t]);
    }
    events
}

/// `h3_ingress_operator_traefik_objects{kind}`, every kind exported from 0.
fn traefik_metric() -> IntGaugeVec {
    let g = IntGaugeVec::new(
        Opts::new(
            "h3_ingress_operator_traefik_objects",
            "Traefik Middlewares and TLSOptions in the operator's cache (names and the fields the per-host policy reads), by kind",
        ),
        &["kind"],
    )
    .expect("metric");
    for k in [traefik_kinds::MIDDLEWARE, traefik_kinds::TLS_OPTION] {
        g.with_label_values(&[k]);
    }
    g
}

/// The build and CRD metrics: `h3_ingress_operator_build_info{version,commit}`, the schema
/// revisions (`of` served, -1 until read, and operator) and the CRD upgrades by result.
fn crd_metrics() -> (IntGaugeVec, IntGaugeVec, IntCounterVec) {
    let build_info = IntGaugeVec::new(
        Opts::new(
            "h3_ingress_operator_build_info",
            "Always 1; the labels name the build: the crate version and the git commit",
        ),
        &["version", "commit"],
    )
    .expect("metric");
    build_info
        .with_label_values(&[crate::version::VERSION, crate::version::COMMIT])
        .set(1);
    let crd_revision = IntGaugeVec::new(
        Opts::new(
            "h3_ingress_operator_crd_schema_revision",
            "Schema revision of the served Http3Listener CRD (of=served; -1 until read) and of this operator (of=operator); served below operator means the API server drops fields",
        ),
        &["of"],
    )
    .expect("metric");
    crd_revision.with_label_values(&["served"]).set(-1);
    crd_revision.with_label_values(&["operator"]);
    let crd_upgrades = IntCounterVec::new(
        Opts::new(
            "h3_ingress_operator_crd_upgrades_total",
            "Server-side applies of this operator's CRD over an older served one, by result",
        ),
        &["result"],
    )
    .expect("metric");
    for r in [crd_upgrade::OK, crd_upgrade::ERROR] {
        crd_upgrades.with_label_values(&[r]);
    }
    (build_info, crd_revision, crd_upgrades)
}

/// The operator's [`AdminSource`]: `/readyz` answers 200 once the caches are filled.
#[derive(Clone)]
pub struct AdminState {
    pub metrics: Arc<OperatorMetrics>,
    pub ready: Arc<AtomicBool>,
}

impl AdminSource for AdminState {
    fn readiness(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err("caches not synced yet".into())
        }
    }

    fn metrics(&self) -> String {
        self.metrics.render()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::route;
    use http::{Method, StatusCode};
    use http_body_util::BodyExt;

    #[test]
    fn dns_metrics_start_at_zero_for_every_reason_and_keep_the_label_bounded() {
        let m = OperatorMetrics::new();
        let text = m.render();
        assert!(text.contains("h3_ingress_operator_dns_updates_total 0"));
        for r in DNS_FAILURE_REASONS {
            let line = format!("h3_ingress_operator_dns_failures_total{{reason=\"{r}\"}} 0");
            assert!(text.contains(&line), "{line} missing");
        }
        m.dns.failed(crate::api::reasons::TSIG_REFUSED);
        m.dns.failed("SomethingElse");
        m.dns.updates.inc_by(3);
        let text = m.render();
        assert!(text.contains("h3_ingress_operator_dns_failures_total{reason=\"TsigRefused\"} 1"));
        assert!(!text.contains("SomethingElse"));
        assert!(text.contains("h3_ingress_operator_dns_updates_total 3"));
    }

    #[tokio::test]
    async fn routes_and_metric_names() {
        let state = AdminState {
            metrics: OperatorMetrics::new(),
            ready: Arc::new(AtomicBool::new(false)),
        };
        let get = |path: &str| route(&state, &Method::GET, path);
        assert_eq!(get("/healthz").status(), StatusCode::OK);
        assert_eq!(get("/readyz").status(), StatusCode::SERVICE_UNAVAILABLE);
        state.ready.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").status(), StatusCode::OK);
        assert_eq!(get("/nope").status(), StatusCode::NOT_FOUND);
        // The operator has no status document.
        assert_eq!(get("/status").status(), StatusCode::NOT_FOUND);
        state.metrics.status_writes.inc();
        let body = get("/metrics")
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(
            text.contains("h3_ingress_operator_status_writes_total 1"),
            "{text}"
        );
        assert!(
            text.contains("h3_ingress_operator_reconciles_total{result=\"standby\"} 0"),
            "{text}"
        );
        // The two standard process metrics keep the name every client library gives them.
        let standard = [crate::fds::OPEN_FDS, crate::fds::MAX_FDS];
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(
                line.starts_with("h3_ingress_operator_")
                    || standard.iter().any(|s| line.starts_with(&format!("{s} "))),
                "{line}"
            );
        }
    }
}
