//! Targets that change: a surge roll (two pods of the listener on a node, one target), the
//! listener's pods gone (H3IngressDataPlaneTargetsMissing) and the operator gone
//! (H3IngressOperatorDown), each alert pending, firing, then quiet once they are back.

use h3i_scenarios::k8s::Apis;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use h3_ingress::api::Http3Listener;
use h3_ingress::operator::resources::{data_plane_name, SOCKET_HASH_ANNOTATION};
use h3i_scenarios::error::IoContext;
use h3i_scenarios::k8s;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ok, Result, Run};
use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use serde_json::json;

use super::checks::Answer;
use super::scrape::AlertState;
use super::*;

/// Prometheus applies discovery changes to its scrape pools at most every 5 s: a node that ran
/// two pods and had one target for twice that long had both pods discovered.
const ROLL_PROOF_SECS: f64 = 10.0;

/// What the roll's sampling saw.
#[derive(Default)]
struct RollSeen {
    samples: u32,
    /// The most targets one node had.
    most: usize,
    /// The longest time a node ran two pods and had one target, and what it was.
    longest: (f64, String),
    /// Since when each node has run two pods with one target.
    since: BTreeMap<String, (Instant, Vec<String>)>,
    /// A node ran two pods at some point.
    surged: bool,
}

impl RollSeen {
    fn add(&mut self, pods: &BTreeMap<String, Vec<String>>, targets: &BTreeMap<String, usize>) {
        let now = Instant::now();
        self.samples += 1;
        self.most = self.most.max(targets.values().copied().max().unwrap_or(0));
        for (node, running) in pods {
            if running.len() >= 2 && targets.get(node) == Some(&1) {
                let (t0, names) = self
                    .since
                    .entry(node.clone())
                    .or_insert((now, running.clone()));
                let span = now.duration_since(*t0).as_secs_f64();
                if span > self.longest.0 {
                    let what = format!("{node}: {names:?} Running, 1 target for {span:.1} s");
                    self.longest = (span, what);
                }
            } else {
                self.since.remove(node);
            }
        }
        self.surged |= pods.values().any(|r| r.len() >= 2);
    }

    /// The roll is over (every node back to one pod) and proved what it had to.
    fn done(&self, pods: &BTreeMap<String, Vec<String>>) -> bool {
        self.surged && pods.values().all(|r| r.len() == 1) && self.longest.0 >= ROLL_PROOF_SECS
    }
}

impl Monitoring {
    /// Node name to the listener's pods Running there (a draining old pod is Running until it
    /// exits, and Prometheus's pod discovery keeps it as long).
    async fn running_by_node(&self) -> Result<BTreeMap<String, Vec<String>>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in self.dp_pods().await? {
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            let node = p
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            if phase == "Running" {
                out.entry(node).or_default().push(p.name_any());
            }
        }
        Ok(out)
    }

    /// Node name to its active targets in the PodMonitor's scrape pool.
    async fn targets_by_node(&self) -> Result<BTreeMap<String, usize>> {
        let mut out = BTreeMap::new();
        for t in self.prom.active_targets(&self.jobs.pool).await? {
            *out.entry(t.get("node").cloned().unwrap_or_default())
                .or_insert(0) += 1;
        }
        Ok(out)
    }

    /// A slow download on every node, so that each old pod drains beside its new one.
    fn hold_downloads(&mut self) -> Result<()> {
        let script = h3i_scenarios::cmd::repo().join("tests/py/h3client.py");
        for ip in self.env.ips.clone() {
            let child = tokio::process::Command::new(h3::python())
                .arg(&script)
                .arg(format!("https://{HOST}/slow/roll.bin"))
                .arg("--resolve")
                .arg(format!("{HOST}:443:{ip}"))
                .arg("--cacert")
                .arg(&self.ca)
                .args(["--timeout", "60"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context(|| "start h3client.py".into())?;
            self.children.push(child);
        }
        Ok(())
    }

    async fn socket_hash(&self) -> Result<String> {
        let ds = self
            .ns::<DaemonSet>(NS_OP)
            .get(&data_plane_name(LISTENER))
            .await?;
        let t = ds.spec.template.metadata.unwrap_or_default();
        Ok(t.annotations
            .unwrap_or_default()
            .get(SOCKET_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default())
    }

    pub(super) async fn roll(&mut self, run: &mut Run) -> Result<()> {
        run.step("a surge roll (socket.receiveBufferBytes changed) under slow downloads: one target per node while a node runs the old and the new pod");
        let hash0 = self.socket_hash().await?;
        let held = self.children.len();
        self.hold_downloads()?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let patch = json!({"spec": {"socket": {"receiveBufferBytes": 3_145_728}}});
        k8s::merge(&self.all::<Http3Listener>(), LISTENER, &patch).await?;
        let t0 = Instant::now();
        let mut seen = RollSeen::default();
        while t0.elapsed() < Duration::from_secs(90) {
            let pods = self.running_by_node().await?;
            seen.add(&pods, &self.targets_by_node().await?);
            if seen.done(&pods) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        for c in self.children.drain(held..) {
            drop(c); // kill_on_drop
        }
        let longest = if seen.longest.1.is_empty() {
            "no node with two Running pods and one target".to_string()
        } else {
            seen.longest.1.clone()
        };
        let answer = Answer {
            ok: seen.longest.0 >= ROLL_PROOF_SECS && seen.most == 1,
            got: format!(
                "{} samples; most targets on one node {}; longest: {longest}",
                seen.samples, seen.most
            ),
            secs: t0.elapsed().as_secs_f64(),
        };
        let query = format!(
            "GET /api/v1/targets?scrapePool={} and the Running pods, every 0.5 s",
            self.jobs.pool
        );
        let expected = format!(
            "1 target per node, also while a node runs 2 pods (for >= {ROLL_PROOF_SECS} s)"
        );
        self.checks.record(
            "one target per node during a surge roll",
            &query,
            &expected,
            answer,
        )?;
        let rolled =
            || async { Ok(self.socket_hash().await? != hash0 && self.rolled_out().await?) };
        wait_ok(
            120,
            "the roll done on every node (new socket hash, every pod updated and Ready)",
            rolled,
        )
        .await
    }

    pub(super) async fn pods_vanish(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("the listener's nodeSelector matches no node: its data plane pods go, {ALERT_DATA_PLANE}"));
        let listeners = self.all::<Http3Listener>();
        let away = json!({"spec": {"nodeSelector": {"h3i-monitoring/none": "true"}}});
        k8s::merge(&listeners, LISTENER, &away).await?;
        wait_ok(90, "no data plane pod of the listener left", || async {
            Ok(self.dp_pods().await?.is_empty())
        })
        .await?;
        self.alert(ALERT_DATA_PLANE, AlertState::Pending, 90)
            .await?;
        self.alert(ALERT_DATA_PLANE, AlertState::Firing, 60).await?;
        k8s::merge(
            &listeners,
            LISTENER,
            &json!({"spec": {"nodeSelector": null}}),
        )
        .await?;
        let n = self.env.nodes.len();
        wait_ok(
            120,
            &format!("the listener's pods back: {n} of {n} Ready"),
            || self.rolled_out(),
        )
        .await?;
        self.alert(ALERT_DATA_PLANE, AlertState::Inactive, 90)
            .await?;
        self.targets_up(90).await
    }

    pub(super) async fn operator_down(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("the operator scaled to 0: {ALERT_OPERATOR}"));
        let deploys = self.ns::<Deployment>(NS_OP);
        k8s::merge(&deploys, OP_DEPLOY, &json!({"spec": {"replicas": 0}})).await?;
        self.alert(ALERT_OPERATOR, AlertState::Pending, 120).await?;
        self.alert(ALERT_OPERATOR, AlertState::Firing, 60).await?;
        k8s::merge(&deploys, OP_DEPLOY, &json!({"spec": {"replicas": 1}})).await?;
        self.alert(ALERT_OPERATOR, AlertState::Inactive, 150)
            .await?;
        self.targets_up(90).await?;
        ok("the operator scraped again");
        Ok(())
    }
}

use h3i_scenarios::h3;
