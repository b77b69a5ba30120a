//! What Prometheus scrapes and evaluates while everything runs: the targets, each target's
//! series, the PrometheusRule's rules, the quiet alerts and every dashboard query.

use std::collections::{BTreeMap, BTreeSet};

use h3_ingress::operator::metrics::OperatorMetrics;
use h3_ingress::proxy::observe::metrics::Metrics;
use h3i_scenarios::{ensure, ok, Result, Run};

use super::checks::poll;
use super::*;

/// The names of the series a scrape holds (`h3_ingress_*`; a histogram's `_bucket`, `_sum` and
/// `_count` each).
fn series_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .filter(|n| n.starts_with("h3_ingress_"))
        .map(String::from)
        .collect()
}

/// How long a monitor created after Prometheus started may take to be scraped: the Prometheus
/// Operator writes the config into a Secret, and Prometheus sees it once the kubelet has synced
/// that Secret into its pod, minutes at worst (166 s measured once for the ScrapeConfig). The
/// chart's monitors come in one `helm install`, yet the operator may write them in two configs:
/// once the PodMonitor's data-plane targets were scraped at once and the ServiceMonitor's
/// operator target not within 150 s.
const CONFIG_SYNC_SECS: u64 = 300;

/// An alert's state as `ALERTS` has it; inactive alerts have no series.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AlertState {
    Inactive,
    Pending,
    Firing,
}

impl AlertState {
    fn word(self) -> &'static str {
        match self {
            AlertState::Inactive => "inactive",
            AlertState::Pending => "pending",
            AlertState::Firing => "firing",
        }
    }
}

impl Monitoring {
    /// Every node's data plane (node and listener labels, the node's address and the
    /// annotation's port, no pod label) and the operator are scraped, each with `up == 1`.
    pub(super) async fn targets_up(&mut self, secs: u64) -> Result<()> {
        let q_dp = format!("up{{job=\"{}\"}}", self.jobs.data_plane);
        let q_op = format!("up{{job=\"{}\"}}", self.jobs.operator);
        let mut want: Vec<String> = (self.env.nodes.iter().zip(&self.env.ips))
            .map(|(node, ip)| format!("{node} {LISTENER} {ip}:{METRICS_PORT} pod='' up=1"))
            .collect();
        want.sort();
        let answer = poll(secs, || async {
            let dp = self.prom.query(&q_dp).await?;
            let mut dp: Vec<String> = (dp.iter())
                .map(|s| {
                    let (node, l, i) = (s.label("node"), s.label("listener"), s.label("instance"));
                    format!("{node} {l} {i} pod='{}' up={}", s.label("pod"), s.value)
                })
                .collect();
            dp.sort();
            let op = self.prom.query(&q_op).await?;
            let op: Vec<&str> = op.iter().map(|s| s.value.as_str()).collect();
            let mut got = format!("data plane {dp:?}; operator {op:?}");
            if op.is_empty() {
                // Whether Prometheus has the ServiceMonitor's job yet, should this fail.
                let pool = &self.jobs.operator_pool;
                let n = self.prom.active_targets(pool).await?.len();
                got.push_str(&format!(" ({n} active targets in {pool})"));
            }
            Ok((dp == want && op == ["1"], got))
        })
        .await;
        let expected = format!("data plane {want:?}; operator [\"1\"]");
        let query = format!("{q_dp}; {q_op}");
        self.checks.record(
            "data plane and operator targets up",
            &query,
            &expected,
            answer,
        )
    }

    /// The TCP ingress's exporters (the share's denominator) scraped through the ScrapeConfig,
    /// waited for on its own ([`CONFIG_SYNC_SECS`]) before any query needs its series.
    async fn exporters_up(&mut self, secs: u64) -> Result<()> {
        let q = format!("up{{job=\"scrapeConfig/{PROM_NS}/{SCRAPE_CONFIG}\"}}");
        let mut want: Vec<String> = (self.env.ips.iter())
            .map(|ip| format!("{ip}:{EXPORTER_PORT} up=1"))
            .collect();
        want.sort();
        let answer = poll(secs, || async {
            let mut got: Vec<String> = (self.prom.query(&q).await?.iter())
                .map(|s| format!("{} up={}", s.label("instance"), s.value))
                .collect();
            got.sort();
            Ok((got == want, format!("{got:?}")))
        })
        .await;
        let expected = format!("{want:?}");
        self.checks
            .record("TCP ingress exporters up", &q, &expected, answer)
    }

    /// Each data plane target has every series the product's data plane registry exports
    /// before any traffic, the operator's every series of its registry.
    async fn series(&mut self) -> Result<()> {
        let dp_names = series_names(&Metrics::new().render());
        let op_names = series_names(&OperatorMetrics::new().render());
        ensure!(
            dp_names.len() >= 20 && op_names.len() >= 5,
            "the product's registries export {} data plane and {} operator series names: the exposition parser lost track",
            dp_names.len(),
            op_names.len()
        );
        let job = &self.jobs.data_plane;
        let q =
            format!("count by (node, __name__) ({{__name__=~\"h3_ingress_.+\", job=\"{job}\"}})");
        let nodes: BTreeSet<String> = self.env.nodes.iter().cloned().collect();
        let answer = poll(60, || async {
            let mut by_node: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for s in self.prom.query(&q).await? {
                let set = by_node.entry(s.label("node").to_string()).or_default();
                set.insert(s.label("__name__").to_string());
            }
            let missing: BTreeMap<&String, Vec<&String>> = (by_node.iter())
                .map(|(n, have)| (n, dp_names.difference(have).collect()))
                .collect();
            let complete = missing.values().all(|m| m.is_empty());
            let counts: Vec<String> = (by_node.iter())
                .map(|(n, have)| format!("{n}: {} names", have.len()))
                .collect();
            let same_nodes = by_node.keys().cloned().collect::<BTreeSet<_>>() == nodes;
            Ok((
                same_nodes && complete,
                format!("{}; missing {missing:?}", counts.join(", ")),
            ))
        })
        .await;
        let expected = format!(
            "for each of {nodes:?} all {} series names of Metrics::new()",
            dp_names.len()
        );
        self.checks.record(
            "h3_ingress_* series per data plane pod",
            &q,
            &expected,
            answer,
        )?;
        let q = format!(
            "count by (__name__) ({{__name__=~\"h3_ingress_operator_.+\", job=\"{}\"}})",
            self.jobs.operator
        );
        let answer = poll(60, || async {
            let have: BTreeSet<String> = (self.prom.query(&q).await?.iter())
                .map(|s| s.label("__name__").to_string())
                .collect();
            let missing: Vec<&String> = op_names.difference(&have).collect();
            Ok((
                missing.is_empty(),
                format!("{} names; missing {missing:?}", have.len()),
            ))
        })
        .await;
        let expected = format!(
            "all {} series names of OperatorMetrics::new()",
            op_names.len()
        );
        self.checks.record(
            "h3_ingress_operator_* series of the operator",
            &q,
            &expected,
            answer,
        )
    }

    pub(super) async fn targets(&mut self, run: &mut Run) -> Result<()> {
        run.step("targets: every data plane pod, the operator and the TCP ingress's exporters scraped (up == 1), each with its series");
        self.targets_up(CONFIG_SYNC_SECS).await?;
        self.exporters_up(CONFIG_SYNC_SECS).await?;
        self.series().await
    }

    /// `ALERTS{alertname=NAME}` reaches `state` within `secs`.
    pub(super) async fn alert(&mut self, name: &str, state: AlertState, secs: u64) -> Result<()> {
        let q = format!("ALERTS{{alertname=\"{name}\"}}");
        let answer = poll(secs, || async {
            let states: BTreeSet<String> = (self.prom.query(&q).await?.iter())
                .map(|s| s.label("alertstate").to_string())
                .collect();
            let ok = match state {
                AlertState::Inactive => states.is_empty(),
                s => states.len() == 1 && states.contains(s.word()),
            };
            let got = if states.is_empty() {
                "no series (inactive)".to_string()
            } else {
                format!("alertstate {states:?}")
            };
            Ok((ok, got))
        })
        .await;
        let check = format!("{name} {}", state.word());
        self.checks
            .record(&check, &q, &format!("alertstate {}", state.word()), answer)
    }

    pub(super) async fn rules(&mut self, run: &mut Run) -> Result<()> {
        run.step("rules: the PrometheusRule's recording rules and alerts loaded by Prometheus");
        let api = self.monitoring_api(NS_OP, "v1", "PrometheusRule", "prometheusrules");
        let rule = api.get(&self.jobs.rule).await?;
        let mut want = BTreeSet::new();
        for g in rule.data["spec"]["groups"].as_array().into_iter().flatten() {
            for r in g["rules"].as_array().into_iter().flatten() {
                let name = r["record"]
                    .as_str()
                    .or(r["alert"].as_str())
                    .unwrap_or_default();
                want.insert((
                    g["name"].as_str().unwrap_or_default().to_string(),
                    name.to_string(),
                ));
            }
        }
        ensure!(
            want.iter().any(|(_, r)| r == ALERT_DATA_PLANE)
                && want.iter().any(|(_, r)| r == ALERT_OPERATOR),
            "prometheusrule/{} lacks {ALERT_DATA_PLANE} or {ALERT_OPERATOR}",
            self.jobs.rule
        );
        let answer = poll(150, || async {
            let loaded = self.prom.rules().await?;
            let missing: Vec<_> = want.iter().filter(|w| !loaded.contains_key(*w)).collect();
            let unhealthy: Vec<_> = (want.iter())
                .filter(|w| loaded.get(*w).is_some_and(|h| h != "ok"))
                .collect();
            let got = format!(
                "{}/{} loaded; missing {missing:?}; health not ok {unhealthy:?}",
                want.len() - missing.len(),
                want.len()
            );
            Ok((missing.is_empty() && unhealthy.is_empty(), got))
        })
        .await;
        let expected = format!(
            "all {} rules of prometheusrule/{}, health ok",
            want.len(),
            self.jobs.rule
        );
        self.checks.record(
            "recording rules and alerts loaded",
            "GET /api/v1/rules",
            &expected,
            answer,
        )?;
        self.alert(ALERT_DATA_PLANE, AlertState::Inactive, 60)
            .await?;
        self.alert(ALERT_OPERATOR, AlertState::Inactive, 60).await
    }

    pub(super) async fn dashboard(&mut self, run: &mut Run) -> Result<()> {
        run.step("dashboard: HTTP/3 requests to every node, then every query of deploy/grafana/h3-ingress.json returns data");
        let spec = r#"[{"path": "/whoami"}, {"path": "/whoami"}, {"path": "/missing"}, {"path": "/whoami"}]"#;
        let mut statuses = BTreeMap::new();
        for _round in 0..3 {
            for ip in &self.env.ips {
                let rep = h3::h3client(&self.target(ip, "/whoami"), &["--requests", spec]).await?;
                let got: Vec<u64> = (rep["requests"].as_array().into_iter().flatten())
                    .filter_map(|r| r["status"].as_u64())
                    .collect();
                ensure!(
                    got == [200, 200, 404, 200],
                    "h3client.py to {ip}: statuses {got:?}, want [200, 200, 404, 200]"
                );
                for s in got {
                    *statuses.entry(s).or_insert(0) += 1;
                }
            }
        }
        ok(format!(
            "{} HTTP/3 connections of 4 requests: statuses {statuses:?}",
            3 * self.env.ips.len()
        ));
        let queries = dashboard::queries()?;
        let answer = poll(150, || async {
            let mut empty = Vec::new();
            for (place, q) in &queries {
                if self.prom.query(q).await?.is_empty() {
                    empty.push(format!("{place}: {q}"));
                }
            }
            let got = format!(
                "{}/{} with data; empty: {empty:?}",
                queries.len() - empty.len(),
                queries.len()
            );
            Ok((empty.is_empty(), got))
        })
        .await;
        let what = format!(
            "{} queries of deploy/grafana/h3-ingress.json",
            queries.len()
        );
        let expected = format!("each of the {} returns at least one series", queries.len());
        self.checks
            .record("dashboard queries return data", &what, &expected, answer)
    }
}

use h3i_scenarios::h3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_names_come_from_the_product_registries() {
        let dp = series_names(&Metrics::new().render());
        assert!(dp.contains("h3_ingress_build_info"), "{dp:?}");
        assert!(
            dp.contains("h3_ingress_request_duration_seconds_bucket"),
            "{dp:?}"
        );
        let op = series_names(&OperatorMetrics::new().render());
        assert!(op.contains("h3_ingress_operator_build_info"), "{op:?}");
        assert!(
            op.iter().all(|n| n.starts_with("h3_ingress_operator_")),
            "{op:?}"
        );
    }
}
