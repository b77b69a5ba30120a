//! The upgrade scenario's steps: the release installed, each change under clients with the
//! listener's Ready condition polled beside it, and the verdicts.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use h3i_scenarios::cmd::{repo, run as sh};
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::roll::{self, RollApp, Want};
use h3i_scenarios::{ensure, fail, indent, info, ok, Result, Run};

use super::*;
use crate::rollout::epoch;

/// One observation of the listener's Ready condition: when, and `STATUS|REASON|MESSAGE` (or
/// why it could not be read).
type Observation = (f64, String);

/// What the Ready observations say: the lines to print, and whether every one was True.
pub fn ready_report(rows: &[Observation], t0: f64) -> (Vec<String>, bool) {
    let bad: Vec<&Observation> = rows
        .iter()
        .filter(|(_, v)| !v.starts_with("True|"))
        .collect();
    let span = match (rows.first(), rows.last()) {
        (Some(a), Some(b)) => (a.0 - t0, b.0 - t0),
        _ => (0.0, 0.0),
    };
    let mut lines = vec![format!(
        "Ready polled {} times from {:+.1} s to {:+.1} s: {} True, {} not",
        rows.len(),
        span.0,
        span.1,
        rows.len() - bad.len(),
        bad.len()
    )];
    // First and last sighting and count of each distinct value, in order of first sighting.
    let mut seen: Vec<(String, f64, f64, usize)> = Vec::new();
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (t, v) in &bad {
        match index.get(v.as_str()) {
            Some(&i) => {
                seen[i].2 = *t;
                seen[i].3 += 1;
            }
            None => {
                index.insert(v, seen.len());
                seen.push((v.clone(), *t, *t, 1));
            }
        }
    }
    for (v, first, last, n) in seen {
        lines.push(format!(
            "not Ready {n}x from {:+.1} s to {:+.1} s: {v}",
            first - t0,
            last - t0
        ));
    }
    (lines, bad.is_empty() && !rows.is_empty())
}

impl Upgrade {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        let (tag, bin) = pinned::from_tag_binaries();
        let env_tags = std::env::var("H3I_TAG_BINARIES").unwrap_or_default();
        let want = std::env::var(pinned::WANT_TAG_BINARIES).unwrap_or_default();
        ensure!(
            !tag.is_empty() && env_tags == want && want == format!("{tag}={}", bin.display()),
            "the cluster's agent does not map {want} (env: {env_tags})"
        );
        self.work.tag = pinned::tag_of(&self.work.bin)?;
        let c12 = std::env::var("H3I_UPGRADE_PINNED_COMMIT").unwrap_or_default();
        let dir = self.tmp.join("pinned");
        std::fs::create_dir_all(&dir).map_err(|source| h3i_scenarios::Error::Io {
            context: "mkdir pinned".into(),
            source,
        })?;
        let script = format!(
            "git -C {} archive {c12} charts/h3-ingress | tar -x -C {}",
            repo().display(),
            dir.display()
        );
        sh("sh", &["-c", &script]).await?;
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        k8s::delete(&classes, CLASS).await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-upgrade.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        Ok(())
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        let p = self.pinned.clone();
        run.step(format!(
            "helm install of the previous release ({}); nginx on both nodes serving {HOST} (/slow/ at {SLOW_RATE}/s); an Http3Listener",
            p.tag
        ));
        app::helm_install(
            &self.env,
            &self.client,
            &p.chart,
            &[format!("image.tag={}", p.tag)],
        )
        .await?;
        let a = RollApp {
            name: "upgrade",
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
        wait_ok(
            120,
            "the operator and both data plane pods run the previous release",
            || async { Ok(self.operator_runs(&p).await?.is_some() && self.rolled(&[], &p).await?) },
        )
        .await?;
        self.op_pod = self.operator_runs(&p).await?.unwrap_or_default();
        let what = format!("{HOST} served over HTTP/3 on {}", self.env.ips.join(" "));
        wait_ok(60, &what, || self.served_everywhere()).await?;
        wait_ok(
            60,
            &format!("the listener {}=True", conditions::READY),
            || async { Ok(self.cond_line(conditions::READY).await?.0 == "True") },
        )
        .await?;
        info(format!(
            "{}: {}",
            conditions::CRD_CURRENT,
            self.crd_current().await?.1
        ));
        Ok(())
    }

    /// The listener's Ready condition every 0.5 s until `stop`.
    async fn poll_ready(&self, stop: &AtomicBool) -> Vec<Observation> {
        let mut rows = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let got = match k8s::condition(&self.client, LISTENER, conditions::READY).await {
                Ok(Some(c)) => format!("{}|{}|{}", c.status, c.reason, c.message),
                Ok(None) => "||".to_string(),
                Err(e) => e.to_string(),
            };
            rows.push((epoch(), got));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        rows
    }

    /// The change to `side` (`via` helm upgrade or rollback) and the waits for the roll: (helm,
    /// operator, new pods Ready, roll done) in seconds after the change began, and the new
    /// operator pod.
    async fn change_body(
        &self,
        old: &[String],
        side: &Side,
        via: Via,
        t_change: f64,
    ) -> Result<([f64; 4], String)> {
        match via {
            Via::Upgrade => {
                let sets = [
                    format!("image.repository={}", app::IMAGE_REPO),
                    format!("image.tag={}", side.tag),
                ];
                app::helm_upgrade(&side.chart, false, &sets, "180s").await?;
            }
            Via::Rollback => {
                app::helm_rollback(INSTALL_REVISION, "180s").await?;
            }
        }
        let t_helm = epoch() - t_change;
        wait_ok(120, &format!("the operator runs {}", side.tag), || async {
            Ok(self.operator_runs(side).await?.is_some())
        })
        .await?;
        let op = self.operator_runs(side).await?.unwrap_or_default();
        let t_op = epoch() - t_change;
        wait_ok(
            120,
            &format!("a pod of {} Ready on both nodes", side.tag),
            || self.taken_over(side),
        )
        .await?;
        let t_new = epoch() - t_change;
        let what = format!(
            "the roll done: the old data plane pods gone, two of {} Ready running {}",
            side.tag,
            side.bin.display()
        );
        wait_ok(240, &what, || self.rolled(old, side)).await?;
        Ok(([t_helm, t_op, t_new, epoch() - t_change], op))
    }

    /// The change to `side` under three clients per node, until the operator and both data
    /// plane pods run its binary; then the verdicts.
    pub(super) async fn change(
        &mut self,
        run: &mut Run,
        name: &str,
        side: &Side,
        via: Via,
    ) -> Result<()> {
        let shown = side
            .chart
            .strip_prefix(&self.tmp)
            .unwrap_or(&side.chart)
            .display()
            .to_string();
        let how = match via {
            Via::Upgrade => format!("helm upgrade to the chart of {shown} with image tag"),
            Via::Rollback => format!(
                "helm rollback to revision {INSTALL_REVISION} (the install: the chart of {shown}, image tag"
            ),
        };
        let close = if via == Via::Rollback { ")" } else { "" };
        run.step(format!(
            "{name}: three clients on each node; {how} {}{close} under them",
            side.tag
        ));
        let old: Vec<String> = self.dp_pods().await?.iter().map(|p| p.name_any()).collect();
        let old_op = self.op_pod.clone();
        let loops_end = epoch() + CLIENT_SECONDS as f64;
        let prefix = format!("{name}-");
        self.clients =
            Some(Clients::start(&self.env, &self.tmp, HOST, &prefix, CLIENT_SECONDS, DRAIN).await?);
        let stop = AtomicBool::new(false);
        let t_change = epoch() + 3.0;
        let body = async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let r = self.change_body(&old, side, via, t_change).await;
            stop.store(true, Ordering::Relaxed);
            r
        };
        let (rows, done) = tokio::join!(self.poll_ready(&stop), body);
        let ([t_helm, t_op, t_new, t_rolled], op) = done?;
        if let Some(c) = &mut self.clients {
            c.done().await?;
        }
        let rolled_at = t_change + t_rolled;
        ensure!(
            rolled_at < loops_end,
            "{name}: the request loops ended {:.1} s before the roll was done: raise CLIENT_SECONDS",
            rolled_at - loops_end
        );
        let new = app::pod_names(&self.dp_pods().await?);
        ok(format!(
            "{name}: helm {} --wait returned after {t_helm:.1} s; operator {old_op} -> {op} ({}) after {t_op:.1} s; new data plane pods Ready on both nodes after {t_new:.1} s; the old ones gone (drained) after {t_rolled:.1} s: {} -> {new}",
            via.verb(),
            side.tag,
            old.join(" ")
        ));
        self.op_pod = op;
        self.verdicts(run, name, t_change, t_rolled, side, &rows)
            .await
    }

    /// What the clients saw, the Ready observations, CRDCurrent; a missed target goes to
    /// `misses`.
    async fn verdicts(
        &mut self,
        run: &mut Run,
        name: &str,
        t_change: f64,
        t_rolled: f64,
        side: &Side,
        rows: &[Observation],
    ) -> Result<()> {
        run.step(format!(
            "{name}: what the clients saw per node; the listener's {} condition during the change; {}",
            conditions::READY,
            conditions::CRD_CURRENT
        ));
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
            self.misses.push(format!("{name}: {}", bad.join(" ")));
        }
        let ends: Vec<String> = c
            .slow_ends()?
            .iter()
            .map(|e| format!("+{:.1} s", e - t_change))
            .collect();
        info(format!(
            "slow downloads ended at {} after the change began (the roll done at +{t_rolled:.1} s)",
            ends.join(" ")
        ));
        let (lines, all_true) = ready_report(rows, t_change);
        indent(lines.join("\n"));
        if !all_true {
            self.misses.push(format!(
                "{name}: the listener was not {}=True throughout: {}",
                conditions::READY,
                lines[1..].join(" ")
            ));
        }
        let marker = format!("({})", side.tag);
        let what = format!(
            "{} written by the operator of {}",
            conditions::CRD_CURRENT,
            side.tag
        );
        wait_ok(60, &what, || async {
            Ok(self.crd_current().await?.1.contains(&marker))
        })
        .await?;
        let (status, line) = self.crd_current().await?;
        info(format!("{}: {line}", conditions::CRD_CURRENT));
        let crds = Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(self.client.clone());
        let crd = crds.get(h3_ingress::api::schema::CRD_NAME).await?;
        info(format!(
            "the CRD's schema revision annotation: {:?}",
            crd.metadata.annotations.unwrap_or_default()
        ));
        if status != "True" {
            self.misses.push(format!(
                "{name}: {} is not True: {line}",
                conditions::CRD_CURRENT
            ));
        }
        Ok(())
    }

    pub(super) async fn after(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "after both changes: {HOST} still served on both nodes"
        ));
        let what = format!("{HOST} served over HTTP/3 on {}", self.env.ips.join(" "));
        until(30, &what, || self.served_everywhere()).await?;
        ok(&what);
        if !self.misses.is_empty() {
            for m in &self.misses {
                println!("    MISSED: {m}");
            }
            return fail(format!("{} target(s) missed (above)", self.misses.len()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_observation_must_be_true() {
        let rows = vec![
            (10.0, "True|a|x".to_string()),
            (10.5, "True|a|x".to_string()),
        ];
        let (lines, ok) = ready_report(&rows, 9.0);
        assert!(ok);
        assert_eq!(
            lines,
            ["Ready polled 2 times from +1.0 s to +1.5 s: 2 True, 0 not"]
        );
        let rows = vec![
            (10.0, "True|a|x".to_string()),
            (10.5, "False|b|y".to_string()),
            (11.0, "False|b|y".to_string()),
            (11.5, "kubernetes API: timeout".to_string()),
        ];
        let (lines, ok) = ready_report(&rows, 10.0);
        assert!(!ok);
        assert_eq!(lines[1], "not Ready 2x from +0.5 s to +1.0 s: False|b|y");
        assert_eq!(
            lines[2],
            "not Ready 1x from +1.5 s to +1.5 s: kubernetes API: timeout"
        );
        assert!(!ready_report(&[], 0.0).1);
    }
}
