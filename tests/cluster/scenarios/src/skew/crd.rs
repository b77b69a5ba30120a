//! The skew scenario's set-up and its CRD parts: (a) a newer CRD under the running binary and
//! its pods restarted under it; (b) an older CRD, then the operator's own CRD upgrade.

use std::time::{Duration, Instant};

use h3_ingress::api::reasons;
use h3_ingress::operator::FIELD_MANAGER;
use h3i_scenarios::cmd::{output, run as sh};
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, fail, info, ok, Error};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{ListParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::*;

/// A `transport.congestionControl` value only the newer CRD admits.
pub const FUTURE_CC: &str = "l4s";

/// The binary's CRD one schema revision later, with a defaulted `spec.upstream.futureSetting`
/// and a [`FUTURE_CC`] value for `spec.transport.congestionControl` (`newer`), or one earlier
/// (revision 0: not annotated, as before revisions) without
/// `spec.upstream.servedCertificateGraceSeconds`.
pub fn crd_variant(newer: bool) -> Result<Value> {
    let mut crd = serde_json::to_value(h3_ingress::api::crd()).map_err(|source| Error::Json {
        context: "the binary's CRD".into(),
        source,
    })?;
    const SPEC: &str = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties";
    let upstream = format!("{SPEC}/upstream/properties");
    let cc = format!("{SPEC}/transport/properties/congestionControl/enum");
    let Some(ann) = crd
        .pointer_mut("/metadata/annotations")
        .and_then(Value::as_object_mut)
    else {
        return fail("the binary's CRD has no annotations");
    };
    if newer {
        let rev = schema::SCHEMA_REVISION + 1;
        ann.insert(
            schema::annotations::SCHEMA_REVISION.into(),
            json!(rev.to_string()),
        );
        ann.insert(
            schema::annotations::SCHEMA_HASH.into(),
            json!("sha256:a-later-release"),
        );
    } else {
        ann.remove(schema::annotations::SCHEMA_REVISION);
        ann.remove(schema::annotations::SCHEMA_HASH);
    }
    if newer {
        let Some(values) = crd.pointer_mut(&cc).and_then(Value::as_array_mut) else {
            return fail("the binary's CRD has no spec.transport.congestionControl enum");
        };
        values.push(json!(FUTURE_CC));
    }
    let Some(up) = crd.pointer_mut(&upstream).and_then(Value::as_object_mut) else {
        return fail("the binary's CRD has no spec.upstream properties");
    };
    if newer {
        up.insert(
            "futureSetting".into(),
            json!({"type": "integer", "default": 7, "description": "added by a later release"}),
        );
    } else {
        up.remove("servedCertificateGraceSeconds");
    }
    Ok(crd)
}

impl Skew {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.binary.exists(),
            "H3I_BINARY={} does not exist (cargo build first)",
            self.env.binary.display()
        );
        // The CRD variants are made from this build's CRD: the binary the pods run must print
        // the same one.
        let printed = sh(&self.env.binary.to_string_lossy(), &["crd"]).await?;
        ensure!(
            printed == h3_ingress::api::crd_yaml(),
            "{} crd prints another CRD than this runner's build: rebuild one of them",
            self.env.binary.display()
        );
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        k8s::delete(&classes, CLASS).await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-skew.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        let version = output(&self.env.binary.to_string_lossy(), &["--version"])
            .await?
            .stdout;
        ok(format!(
            "binary {} ({}), CRD schema revision {}",
            self.env.binary.display(),
            version.trim(),
            self.rev
        ));
        Ok(())
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install the chart; nginx on both nodes serving {}; an Http3Listener with two annotated Ingresses",
            HOSTS.join(" ")
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        let rev = self.crd_revision().await?;
        ensure!(
            rev == self.rev.to_string(),
            "the chart's CRD has revision '{rev}', want {}",
            self.rev
        );
        self.pki = Some(Pki::new(&self.tmp.join("pki"), "h3i-skew-ca")?);
        let leaves = [
            self.chained_leaf(HOSTS[0], HOSTS[0])?,
            self.chained_leaf(HOSTS[1], HOSTS[1])?,
        ];
        self.certs = [leaves[0].sha256.clone(), leaves[1].sha256.clone()];
        for node in &self.env.nodes {
            self.nginx
                .start(node, &[(HOSTS[0], &leaves[0]), (HOSTS[1], &leaves[1])])
                .await?;
        }
        app::namespace(&self.client, NS_APP, &[]).await?;
        app::ingress_class(&self.client, CLASS, "example.com/h3i-skew").await?;
        for (h, leaf) in HOSTS.iter().zip(&leaves) {
            let name = first_label(h);
            app::tls_secret(&self.client, NS_APP, &format!("{name}-tls"), leaf).await?;
            app::ingress(&self.client, NS_APP, name, CLASS, h, &format!("{name}-tls")).await?;
        }
        app::listener(
            &self.client,
            LISTENER,
            json!({"ingressClassName": CLASS,
            "upstream": {"address": "127.0.0.1:443"}, "http": {"drainTimeoutSeconds": 2}}),
        )
        .await?;
        let dp = app::dp_selector(LISTENER);
        wait_ok(120, "both data plane pods Ready", || {
            app::pods_ready(&self.client, &dp, 2)
        })
        .await?;
        let what = format!(
            "{} served over HTTP/3 on {}",
            HOSTS.join(" "),
            self.env.ips.join(" ")
        );
        wait_ok(60, &what, || self.all_served()).await?;
        let what = format!(
            "the listener says {}=True/{}",
            conditions::CRD_CURRENT,
            reasons::CRD_MATCHES
        );
        wait_ok(30, &what, || self.crd_is("True", reasons::CRD_MATCHES)).await?;
        let l = self.raw_listeners().get(LISTENER).await?;
        let verify = l.data["spec"]["upstream"]["verify"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(
            verify == "servedCertificate",
            "upstream.verify is '{verify}', not servedCertificate"
        );
        Ok(())
    }

    /// Replaces the served CRD with `crd` (as `kubectl replace`).
    async fn replace_crd(&self, mut crd: Value) -> Result<()> {
        let served = self.crds().get(schema::CRD_NAME).await?;
        crd["metadata"]["resourceVersion"] = json!(served.resource_version());
        let crd: CustomResourceDefinition =
            serde_json::from_value(crd).map_err(|source| Error::Json {
                context: "the CRD variant".into(),
                source,
            })?;
        self.crds()
            .replace(schema::CRD_NAME, &PostParams::default(), &crd)
            .await?;
        Ok(())
    }

    pub(super) async fn newer_crd(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(a) a newer CRD (revision {}, defaulted spec.upstream.futureSetting, transport.congestionControl may be {FUTURE_CC}) replaces the served one",
            self.rev + 1
        ));
        self.replace_crd(crd_variant(true)?).await?;
        wait_ok(
            30,
            "the API server fills futureSetting=7 into the listener",
            || async {
                let l = self.raw_listeners().get(LISTENER).await?;
                Ok(l.data["spec"]["upstream"]["futureSetting"] == 7)
            },
        )
        .await?;
        let what = format!(
            "the running operator says {}=True/{}",
            conditions::CRD_CURRENT,
            reasons::CRD_NEWER
        );
        wait_ok(30, &what, || self.crd_is("True", reasons::CRD_NEWER)).await?;
        info(self.crd_current().await?.2);
        Ok(())
    }

    pub(super) async fn newer_crd_restart(&mut self, run: &mut Run) -> Result<()> {
        run.step("(a) the operator and both data plane pods restarted under the newer CRD");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS_OP);
        let old: Vec<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        let t_restart = Instant::now();
        let (op, dp) = (app::op_selector(), app::dp_selector(LISTENER));
        for sel in [&op, &dp] {
            for p in k8s::names(&pods, sel).await? {
                k8s::delete(&pods, &p).await?;
            }
        }
        wait_ok(
            120,
            "a new operator pod and two new data plane pods, all Ready",
            || async {
                for p in &old {
                    if k8s::exists(&pods, p).await? {
                        return Ok(false);
                    }
                }
                Ok(app::pods_ready(&self.client, &op, 1).await?
                    && app::pods_ready(&self.client, &dp, 2).await?)
            },
        )
        .await?;
        wait_ok(
            60,
            "every host served over HTTP/3 on both nodes by the new pods",
            || self.all_served(),
        )
        .await?;
        let op_pod = k8s::names(&pods, &op)
            .await?
            .into_iter()
            .next()
            .unwrap_or_default();
        let what =
            format!("the new operator {op_pod} judged the CRD newer and reconciled the listener");
        wait_ok(60, &what, || async {
            Ok(self
                .log_has(&op_pod, "operator", "newer than this operator")
                .await?
                && self.unknown_field_lines(&op_pod, "operator").await? >= 1
                && self.crd_is("True", reasons::CRD_NEWER).await?)
        })
        .await?;
        let a_took = t_restart.elapsed().as_secs();
        // Time to crash, as the old binaries did here (CrashLoopBackOff within seconds).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (r_op, op_fine) = self.restarts(&op).await?;
        let (r_dp, dp_fine) = self.restarts(&dp).await?;
        ensure!(
            op_fine && dp_fine,
            "pods restarted under the newer CRD: {r_op}{r_dp}"
        );
        ok(format!("no restarts: {r_op}{r_dp}"));
        let rev = self.crd_revision().await?;
        ensure!(
            rev == (self.rev + 1).to_string(),
            "the operator changed the newer CRD (revision now {rev})"
        );
        ok(format!(
            "the newer CRD is left alone (revision {})",
            self.rev + 1
        ));
        let n = self.unknown_field_lines(&op_pod, "operator").await?;
        ensure!(
            n == 1,
            "operator {op_pod} logged the unknown field {n} times, want once"
        );
        for pod in k8s::names(&pods, &dp).await? {
            let n = self.unknown_field_lines(&pod, "h3-ingress").await?;
            ensure!(
                n == 1,
                "data plane {pod} logged the unknown field {n} times, want once"
            );
        }
        ok("the operator and each data plane pod logged spec.upstream.futureSetting once");
        self.plugin_reads_it().await?;
        self.summary.push(format!(
            "(a) newer CRD: 2/2 hosts served on 2/2 nodes by restarted pods {a_took}s after the restart, 0 restarts, {}",
            reasons::CRD_NEWER
        ));
        Ok(())
    }

    /// `kubectl h3-ingress status LISTENER` (the binary as the plugin) notes the unknown field
    /// and prints both hosts.
    async fn plugin_reads_it(&self) -> Result<()> {
        let dir = self.tmp.join("bin");
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            context: "mkdir bin".into(),
            source,
        })?;
        let link = dir.join("kubectl-h3_ingress");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&self.env.binary, &link).map_err(|source| Error::Io {
            context: "plugin link".into(),
            source,
        })?;
        let path = format!(
            "PATH={}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = output(
            "env",
            &[path.as_str(), "kubectl", "h3-ingress", "status", LISTENER],
        )
        .await?;
        ensure!(out.success(), "kubectl h3-ingress status: {}", out.stderr);
        ensure!(
            out.stderr.contains("spec.upstream.futureSetting"),
            "the plugin did not note the unknown field: {}",
            out.stderr
        );
        for h in HOSTS {
            ensure!(
                out.stdout.contains(h),
                "the plugin's table lacks {h}: {}",
                out.stdout
            );
        }
        ok(format!(
            "kubectl h3-ingress status reads it: {}",
            h3i_scenarios::cmd::head(&out.stderr, 160)
        ));
        Ok(())
    }

    pub(super) async fn older_crd(&mut self, run: &mut Run) -> Result<()> {
        run.step("(b) crd.upgrade=false, then an older CRD (revision 0, without servedCertificateGraceSeconds)");
        app::helm_upgrade(&app::chart(), true, &["crd.upgrade=false".into()], "120s").await?;
        let op = app::op_selector();
        wait_ok(
            60,
            "one operator pod, running with --no-crd-upgrade",
            || async {
                let pods = app::pods(&self.client, &op).await?;
                let args = |p: &Pod| {
                    p.spec
                        .as_ref()
                        .and_then(|s| s.containers[0].args.clone())
                        .unwrap_or_default()
                };
                Ok(pods
                    .iter()
                    .all(|p| args(p).iter().any(|a| a == "--no-crd-upgrade"))
                    && app::pods_ready(&self.client, &op, 1).await?)
            },
        )
        .await?;
        self.replace_crd(crd_variant(false)?).await?;
        let t_old = Instant::now();
        let what = format!(
            "{}=False/{}",
            conditions::CRD_CURRENT,
            reasons::CRD_OUTDATED
        );
        wait_ok(60, &what, || self.crd_is("False", reasons::CRD_OUTDATED)).await?;
        let b_took = t_old.elapsed().as_secs();
        let message = self.crd_current().await?.2;
        ensure!(
            message.contains("drops spec.upstream.servedCertificateGraceSeconds"),
            "the message does not name the dropped field: {message}"
        );
        info(&message);
        let uid = self
            .raw_listeners()
            .get(LISTENER)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        wait_ok(
            30,
            &format!("a Warning Event {} on the listener", reasons::CRD_OUTDATED),
            || async {
                let ev: Vec<Event> = k8s::events(
                    &self.client,
                    "Http3Listener",
                    &uid,
                    Some("Warning"),
                    Some(reasons::CRD_OUTDATED),
                )
                .await?;
                Ok(!ev.is_empty())
            },
        )
        .await?;
        wait_ok(30, "still served on both nodes", || self.all_served()).await?;
        self.summary.push(format!(
            "(b) older CRD: {} after {b_took}s (the CRD watch reconciles at once), Warning Event",
            reasons::CRD_OUTDATED
        ));
        Ok(())
    }

    pub(super) async fn crd_upgrade(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(b) crd.upgrade=true: the operator upgrades the CRD to revision {}",
            self.rev
        ));
        let t_up = Instant::now();
        app::helm_upgrade(&app::chart(), true, &["crd.upgrade=true".into()], "120s").await?;
        let rev = self.rev.to_string();
        wait_ok(90, &format!("the CRD has revision {rev} again"), || async {
            Ok(self.crd_revision().await? == rev)
        })
        .await?;
        let crd =
            serde_json::to_value(self.crds().get(schema::CRD_NAME).await?).map_err(|source| {
                Error::Json {
                    context: "the served CRD".into(),
                    source,
                }
            })?;
        let grace = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["upstream"]["properties"]["servedCertificateGraceSeconds"]["default"];
        ensure!(
            grace == 300,
            "the upgraded CRD lacks servedCertificateGraceSeconds (default '{grace}')"
        );
        let managers: Vec<&str> = crd["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["manager"].as_str())
            .collect();
        ensure!(
            managers.contains(&FIELD_MANAGER),
            "the CRD was not applied by {FIELD_MANAGER}: {managers:?}"
        );
        let what = format!("{}=True/{}", conditions::CRD_CURRENT, reasons::CRD_MATCHES);
        wait_ok(30, &what, || self.crd_is("True", reasons::CRD_MATCHES)).await?;
        self.summary.push(format!(
            "(b) crd.upgrade=true: CRD back to revision {rev} by the operator's server-side apply {}s after helm upgrade",
            t_up.elapsed().as_secs()
        ));
        Ok(())
    }
}

/// `skew1` of `skew1.h3i.test`.
pub fn first_label(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variants_move_the_revision_and_the_fields() {
        let newer = crd_variant(true).unwrap();
        let ann = &newer["metadata"]["annotations"];
        assert_eq!(
            ann[schema::annotations::SCHEMA_REVISION],
            (schema::SCHEMA_REVISION + 1).to_string()
        );
        let up = &newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["upstream"]["properties"];
        assert_eq!(up["futureSetting"]["default"], 7);
        assert!(up.get("servedCertificateGraceSeconds").is_some());
        let cc = newer["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["transport"]["properties"]["congestionControl"]["enum"]
            .as_array()
            .unwrap();
        assert!(cc.contains(&json!(FUTURE_CC)) && cc.contains(&json!("cubic")));
        let older = crd_variant(false).unwrap();
        assert!(older["metadata"]["annotations"]
            .get(schema::annotations::SCHEMA_REVISION)
            .is_none());
        let up = &older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["upstream"]["properties"];
        assert!(up.get("servedCertificateGraceSeconds").is_none());
        assert!(up.get("futureSetting").is_none());
        assert_eq!(first_label("skew1.h3i.test"), "skew1");
    }
}
