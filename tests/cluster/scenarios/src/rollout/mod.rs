//! A DaemonSet roll that keeps every QUIC connection: the chart, a Debian nginx on each node
//! (a throttled `/slow/` path), an Http3Listener serving one annotated Ingress's host, and on
//! each node three clients (`h3i_scenarios::roll`). While they run, a socket setting changes
//! (`socket.receiveBufferBytes`): the pod template changes and the DaemonSet rolls both nodes
//! with surge. Verdicts per node (`roll::verdict`), then the old processes drained: gone only
//! after their last connection ended, and within the drain deadline.
//! `H3I_ROLLOUT_KEEP=1` keeps its objects and nginx.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use h3_ingress::api::Http3Listener;
use h3_ingress::operator::resources::data_plane_name;
use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::h3::{self, Expect};
use h3i_scenarios::k8s;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::roll::{self, Clients, RollApp, Want};
use h3i_scenarios::{ensure, expect_eq, fail, indent, info, ok, Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use serde_json::json;

use crate::FromEnv;

const NS_APP: &str = "h3i-roll";
const HOST: &str = "roll.h3i.test";
const CLASS: &str = "h3i-roll";
const LISTENER: &str = "roll";
/// http.drainTimeoutSeconds: the slow download must finish within it.
const DRAIN: u32 = 90;
const SLOW_BYTES: usize = 2_097_152;
/// nginx limit_rate: 2 MiB at 48 KiB/s is about 43 s.
const SLOW_RATE: &str = "48k";
const CLIENT_SECONDS: u64 = 50;

/// The run's state: the cluster, the scratch directory, nginx, the clients.
pub struct Rollout {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    slow_sha: String,
    clients: Option<Clients>,
}

impl FromEnv for Rollout {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-rollout").unwrap_or_else(|_| "/tmp/h3i-rollout".into());
        Rollout {
            nginx: Nginx::new(
                &tmp,
                app::ALT_SVC,
                &format!("location /slow/ {{ limit_rate {SLOW_RATE}; }}"),
            ),
            env,
            client,
            tmp,
            slow_sha: String::new(),
            clients: None,
        }
    }
}

/// Seconds since the epoch, as rollclient.py stamps its requests.
pub fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Scenario for Rollout {
    const TITLE: &'static str = "ROLLOUT";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        let old = self.install(run).await?;
        let (t_roll, t_rolled) = self.roll(run, &old).await?;
        let ends = self.verdict(run, t_roll, t_rolled)?;
        self.drained(run, &old, &ends, t_roll, t_rolled)
    }

    async fn cleanup(&mut self) {
        if let Some(c) = &mut self.clients {
            c.kill();
        }
        if app::keep("H3I_ROLLOUT_KEEP") {
            println!(
                "H3I_ROLLOUT_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        app::remove_objects(&self.client, &[NS_APP]).await;
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        let _ = k8s::delete(&classes, CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Rollout {
    async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.binary.exists(),
            "H3I_BINARY={} does not exist (cargo build first)",
            self.env.binary.display()
        );
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        k8s::delete(&classes, CLASS).await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-rollout.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        Ok(())
    }

    async fn dp_pods(&self) -> Result<Vec<Pod>> {
        app::pods(&self.client, &app::dp_selector(LISTENER)).await
    }

    async fn served_everywhere(&self) -> Result<bool> {
        let ca = self.tmp.join("pki/ca.crt");
        h3::get_all(&self.env.ips, HOST, 443, "/whoami", &ca, &Expect::default()).await?;
        Ok(true)
    }

    /// Returns the pods before the roll.
    async fn install(&mut self, run: &mut Run) -> Result<Vec<String>> {
        run.step(format!(
            "helm install; nginx on both nodes serving {HOST} (/slow/ throttled to {SLOW_RATE}/s); an Http3Listener"
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        let a = RollApp {
            name: "roll",
            host: HOST,
            ns_app: NS_APP,
            class: CLASS,
            listener: LISTENER,
            drain: DRAIN,
            slow_bytes: SLOW_BYTES,
        };
        self.slow_sha = a
            .stand_up(&self.env, &self.client, &self.tmp, &self.nginx)
            .await?;
        let sel = app::dp_selector(LISTENER);
        wait_ok(120, "both data plane pods Ready", || async {
            Ok(self
                .dp_pods()
                .await?
                .iter()
                .filter(|p| app::pod_ready(p))
                .count()
                == 2)
        })
        .await?;
        let what = format!("{HOST} served over HTTP/3 on {}", self.env.ips.join(" "));
        wait_ok(60, &what, || self.served_everywhere()).await?;
        let ds = Api::<DaemonSet>::namespaced(self.client.clone(), NS_OP)
            .get(&data_plane_name(LISTENER))
            .await?;
        let ru = ds
            .spec
            .update_strategy
            .and_then(|u| u.rolling_update)
            .unwrap_or_default();
        let show = |v: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>| match v {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i)) => {
                i.to_string()
            }
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => s,
            None => String::new(),
        };
        let strategy = format!("{}/{}", show(ru.max_surge), show(ru.max_unavailable));
        expect_eq(
            "DaemonSet maxSurge/maxUnavailable (the defaults)",
            "10%/0",
            strategy.as_str(),
        )?;
        ok(format!(
            "DaemonSet rolls with maxSurge/maxUnavailable {strategy}"
        ));
        let old: Vec<String> =
            k8s::names(&Api::<Pod>::namespaced(self.client.clone(), NS_OP), &sel).await?;
        info(format!("pods before the roll: {}", old.join(" ")));
        Ok(old)
    }

    /// The roll under clients: when it began and when it was done (seconds since the epoch).
    async fn roll(&mut self, run: &mut Run, old: &[String]) -> Result<(f64, f64)> {
        run.step("three clients on each node; a socket setting changes under them: the DaemonSet rolls with surge");
        self.clients =
            Some(Clients::start(&self.env, &self.tmp, HOST, "", CLIENT_SECONDS, DRAIN).await?);
        tokio::time::sleep(Duration::from_secs(3)).await;
        let t_roll = epoch();
        let ls = Api::<Http3Listener>::all(self.client.clone());
        k8s::merge(
            &ls,
            LISTENER,
            &json!({"spec": {"socket": {"receiveBufferBytes": 2097152}}}),
        )
        .await?;
        let pods = Api::<Pod>::namespaced(self.client.clone(), NS_OP);
        wait_ok(
            120,
            "the roll done: the old pods gone, two new pods Ready",
            || async {
                for p in old {
                    if k8s::exists(&pods, p).await? {
                        return Ok(false);
                    }
                }
                Ok(self
                    .dp_pods()
                    .await?
                    .iter()
                    .filter(|p| app::pod_ready(p))
                    .count()
                    == 2)
            },
        )
        .await?;
        let t_rolled = epoch();
        let new = app::pod_names(&self.dp_pods().await?);
        ok(format!(
            "rolled in {:.1} s: {} -> {new}",
            t_rolled - t_roll,
            old.join(" ")
        ));
        if let Some(c) = &mut self.clients {
            c.done().await?;
        }
        Ok((t_roll, t_rolled))
    }

    /// The clients' verdict; returns when each slow download ended.
    fn verdict(&mut self, run: &mut Run, t_roll: f64, t_rolled: f64) -> Result<Vec<f64>> {
        run.step("what the clients saw, per node: no failed request, the kept connection kept or closed only by GOAWAY, the download complete");
        let Some(c) = &self.clients else {
            return fail("no clients");
        };
        let logs: Vec<PathBuf> = self
            .env
            .nodes
            .iter()
            .map(|n| self.nginx.node_dir(n).join("access.log"))
            .collect();
        let want = Want {
            slow_bytes: SLOW_BYTES as u64,
            slow_sha256: &self.slow_sha,
            max_new_ms: 3000.0,
        };
        let (lines, bad) = roll::verdict(&c.results()?, &logs, &want)?;
        indent(lines.join("\n"));
        if !bad.is_empty() {
            return fail(format!("rollout clients: {}", bad.join("; ")));
        }
        let ends = c.slow_ends()?;
        let at: Vec<String> = ends
            .iter()
            .map(|e| format!("{:.1} s", e - t_roll))
            .collect();
        info(format!(
            "slow downloads ended at +{} after the roll started (the roll took {:.1} s)",
            at.join(" "),
            t_rolled - t_roll
        ));
        Ok(ends)
    }

    fn drained(
        &mut self,
        run: &mut Run,
        old: &[String],
        ends: &[f64],
        t_roll: f64,
        t_rolled: f64,
    ) -> Result<()> {
        run.step("the old processes drained: gone after their last connection ended, within the drain deadline");
        if !self.env.real_nodes {
            for p in old {
                let ev = self.env.pod_logs.join(NS_OP).join(p).join("_events.log");
                let text = std::fs::read_to_string(&ev).map_err(|_| {
                    h3i_scenarios::Error::Check(format!("no node agent record of {p}"))
                })?;
                let lines: Vec<&str> = text
                    .lines()
                    .filter(|l| ["exit", "stopp", "removed"].iter().any(|w| l.contains(w)))
                    .collect();
                indent(lines[lines.len().saturating_sub(3)..].join("\n"));
            }
        }
        let last_end = ends.iter().copied().fold(0.0, f64::max);
        ensure!(
            t_rolled + 1.0 >= last_end,
            "the old pods were gone before the slow downloads they carried ended"
        );
        ensure!(
            t_rolled - t_roll <= f64::from(DRAIN) + 60.0,
            "the old pods outlived the drain deadline"
        );
        ok(format!(
            "old pods gone after the last slow download ended and within {DRAIN} s of drain"
        ));
        Ok(())
    }
}
