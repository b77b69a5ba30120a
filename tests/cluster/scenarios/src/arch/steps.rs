//! The architecture scenario's steps, in the order `Arch::run` takes them.

use h3_ingress::api::{conditions, reasons, Http3Listener};
use h3_ingress::operator::placement::ARCH_LABEL;
use h3_ingress::operator::resources::{data_plane_name, CONTAINER_NAME};
use h3_ingress::operator::{labels, ARCHITECTURES};
use h3i_scenarios::cmd::{repo, run as sh};
use h3i_scenarios::k8s::Apis;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{ensure, expect_eq, fail, indent, info, k8s, ok, Pki, Result, Run};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Affinity, Namespace, Pod, Secret};
use kube::ResourceExt;
use serde_json::json;

use super::image::{executable, read_layout, unpack_binary, NodeCtr};
use super::{Arch, HOST, IMAGE_REPO, LISTENER, NS_HOSTS, NS_OP, OP_DEPLOY, RELEASE};

/// The operator's container in the chart's Deployment.
const OPERATOR_CONTAINER: &str = "operator";

/// The values of the first `kubernetes.io/arch In [...]` a required node affinity holds.
fn arch_values(affinity: Option<&Affinity>) -> Vec<String> {
    let terms = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    let exprs = terms
        .into_iter()
        .flat_map(|t| t.match_expressions.unwrap_or_default());
    exprs
        .filter(|e| e.key == ARCH_LABEL && e.operator == "In")
        .find_map(|e| e.values)
        .unwrap_or_default()
}

fn all_architectures() -> Vec<String> {
    ARCHITECTURES.iter().map(|a| a.to_string()).collect()
}

impl Arch {
    pub(super) async fn prepare(&mut self, run: &mut Run) -> Result<()> {
        run.step("the image index the cluster pushed; a previous run's objects removed");
        ensure!(
            self.env.real_nodes,
            "the architecture scenario needs real nodes (H3I_NODES=real scripts/cluster.sh up)"
        );
        let index = read_layout(&self.env.state.join("image/oci"))?;
        let archs: Vec<&String> = index.platforms.keys().collect();
        ensure!(
            archs == ["amd64", "arm64"],
            "the registry's image index has {archs:?}, want amd64 and arm64 \
             (scripts/build-static.sh --arch arm64, then scripts/cluster.sh up)"
        );
        ok(format!("image index {} in {IMAGE_REPO}", index.digest));
        for (arch, p) in &index.platforms {
            info(format!(
                "linux/{arch}: manifest {}, config {}, binary layer {}",
                p.manifest, p.config, p.binary_layer
            ));
        }
        self.index = Some(index);
        self.ctr = Some(NodeCtr::new(&self.env.state).await?);
        self.remove_objects(true).await;
        let nss = self.all::<Namespace>();
        until(120, "the previous run's namespaces deleted", || async {
            Ok(!k8s::exists(&nss, NS_OP).await? && !k8s::exists(&nss, NS_HOSTS).await?)
        })
        .await?;
        self.show_nodes().await
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install (image {IMAGE_REPO}, default image.architectures), a pull secret"
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_OP,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        k8s::apply(&self.all::<Namespace>(), NS_OP, &ns).await?;
        self.pull_secret().await?;
        self.helm_defaults("install").await?;
        let deploy = self.ns::<Deployment>(NS_OP).get(OP_DEPLOY).await?;
        let spec = deploy.spec.template.spec;
        let got = arch_values(spec.as_ref().and_then(|s| s.affinity.as_ref()));
        expect_eq(
            "the operator's required architectures",
            &all_architectures(),
            &got,
        )?;
        ok(format!(
            "operator Ready; its pods require {ARCH_LABEL} In {got:?}"
        ));
        Ok(())
    }

    /// `helm VERB` of the release with the chart's defaults and only the image's repository
    /// and pull secret set (`upgrade` resets every other value), waiting for the operator.
    async fn helm_defaults(&self, verb: &str) -> Result<()> {
        let chart = repo().join("charts/h3-ingress");
        let repo_set = format!("image.repository={IMAGE_REPO}");
        let mut args = vec![verb, RELEASE];
        let chart = chart.to_string_lossy();
        args.extend([&*chart, "-n", NS_OP, "--set", &repo_set]);
        args.extend(["--set", "imagePullSecrets[0].name=regcred"]);
        args.extend(["--wait", "--timeout", "180s"]);
        if verb == "upgrade" {
            args.push("--reset-values");
        }
        sh("helm", &args)
            .await
            .map_err(|e| h3i_scenarios::Error::Check(format!("helm {verb}: {e}")))?;
        info(format!("helm {}", args.join(" ")));
        Ok(())
    }

    async fn pull_secret(&self) -> Result<()> {
        let user = &self.env.registry_user;
        let password = std::fs::read_to_string(&self.env.registry_password_file)
            .unwrap_or_default()
            .trim()
            .to_string();
        let auth = h3i_scenarios::pods::base64(format!("{user}:{password}").as_bytes());
        let config = json!({"auths": {"registry.h3i.test":
            {"username": user, "password": password, "auth": auth}}});
        let data = h3i_scenarios::pods::base64(config.to_string().as_bytes());
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "regcred", "namespace": NS_OP},
            "data": {".dockerconfigjson": data}});
        k8s::apply(&self.ns::<Secret>(NS_OP), "regcred", &secret).await?;
        Ok(())
    }

    pub(super) async fn listener(&mut self, run: &mut Run) -> Result<()> {
        run.step("a listener with one host: the data plane on both (amd64) nodes");
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-arch-ca")?;
        let leaf = pki.leaf("tls", HOST)?;
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "arch-tls", "namespace": NS_OP},
            "stringData": {"tls.crt": read(&leaf.crt), "tls.key": read(&leaf.key)}});
        k8s::apply(&self.ns::<Secret>(NS_OP), "arch-tls", &secret).await?;
        let listener = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
            "metadata": {"name": LISTENER},
            "spec": {"port": 8443, "upstream": {"address": "127.0.0.1:443"},
                "metrics": {"address": "[::]:9486"}, "http": {"drainTimeoutSeconds": 2},
                "hosts": [{"name": HOST, "secretRef": {"namespace": NS_OP, "name": "arch-tls"}}]}});
        k8s::apply(&self.all::<Http3Listener>(), LISTENER, &listener).await?;
        self.ds_is(180, "2 2 2").await?;
        let got = self.ds_architectures().await?;
        expect_eq(
            "the data plane's required architectures",
            &all_architectures(),
            &got,
        )?;
        ok(format!(
            "the data plane's pods require {ARCH_LABEL} In {got:?}"
        ));
        Ok(())
    }

    /// The `kubernetes.io/arch In [...]` of the data plane's DaemonSet.
    async fn ds_architectures(&self) -> Result<Vec<String>> {
        let ds = self
            .ns::<DaemonSet>(NS_OP)
            .get(&data_plane_name(LISTENER))
            .await?;
        let spec = ds.spec.template.spec;
        Ok(arch_values(spec.as_ref().and_then(|s| s.affinity.as_ref())))
    }

    /// `(node, image, imageID)` of a pod's container `container`.
    async fn pod_image(&self, pod: &str, container: &str) -> Result<(String, String, String)> {
        let p = self.ns::<Pod>(NS_OP).get(pod).await?;
        let node = p.spec.and_then(|s| s.node_name).unwrap_or_default();
        let statuses = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let Some(c) = statuses.into_iter().find(|c| c.name == container) else {
            return fail(format!("{pod}: no status of container {container}"));
        };
        Ok((node, c.image, c.image_id))
    }

    pub(super) async fn pulled(&mut self, run: &mut Run) -> Result<()> {
        run.step("each node pulled the amd64 platform of the index, and its pod runs that binary");
        let index = self.index().clone();
        let (amd, arm) = (&index.platforms["amd64"], &index.platforms["arm64"]);
        let layout = self.env.state.join("image/oci");
        let amd_bin = unpack_binary(&layout, &amd.binary_layer, &self.tmp.join("amd64")).await?;
        let (_, amd_sha) = executable(&amd_bin)?;
        let want_id = format!("{IMAGE_REPO}@{}", index.digest);
        let ctr = self.ctr.as_ref().expect("prepare made it");
        let pods = self.ns::<Pod>(NS_OP);
        for (pod, _) in self.dp_pods().await? {
            let (node, image, image_id) = self.pod_image(&pod, CONTAINER_NAME).await?;
            expect_eq(&format!("{pod} on {node}: imageID"), &want_id, &image_id)?;
            let content = ctr.content(&node).await?;
            for (what, d) in [("manifest", &amd.manifest), ("config", &amd.config)] {
                ensure!(
                    content.contains(d),
                    "{node}: no amd64 {what} {d} in containerd"
                );
            }
            ensure!(
                content.contains(&amd.binary_layer),
                "{node}: no amd64 binary layer {} in containerd",
                amd.binary_layer
            );
            // containerd reads every manifest of an index to choose among them (a few
            // hundred bytes each); what it must not fetch is another platform's image.
            for (what, d) in [("config", &arm.config), ("binary layer", &arm.binary_layer)] {
                ensure!(
                    !content.contains(d),
                    "{node}: containerd fetched the arm64 {what} {d}"
                );
            }
            let arm_manifest = if content.contains(&arm.manifest) {
                "its manifest only"
            } else {
                "not even its manifest"
            };
            let ids = ctr.image_names(&node).await?;
            ensure!(
                ids.contains(&amd.config) && !ids.contains(&arm.config),
                "{node}: CRI image IDs {ids:?}, want {} (amd64 config) and not {}",
                amd.config,
                arm.config
            );
            let pid =
                h3i_scenarios::pods::pid(&self.env, &pods, NS_OP, &pod, CONTAINER_NAME).await?;
            let (arch, sha) = executable(std::path::Path::new(&format!("/proc/{pid}/exe")))?;
            ensure!(
                arch == "amd64" && sha == amd_sha,
                "{pod}: pid {pid} runs a {arch} executable sha256 {sha}, want the amd64 layer's {amd_sha}"
            );
            ok(format!(
                "{pod} on {node}: imageID {image_id}; containerd holds the amd64 manifest, config \
                 (CRI image ID) and binary layer; of arm64 {arm_manifest}, no config or binary \
                 layer; pid {pid}: {arch} executable, sha256 {} = the amd64 layer's /h3-ingress",
                &sha[..12]
            ));
            info(format!(
                "{node}: ctr images ls, the names of the index (kubelet: image {image}):"
            ));
            indent(ctr.images_of(&node, &index.digest).await?);
        }
        let op = self.operator_pods().await?;
        for (pod, _) in &op {
            let (node, _, image_id) = self.pod_image(pod, OPERATOR_CONTAINER).await?;
            expect_eq(
                &format!("operator {pod} on {node}: imageID"),
                &want_id,
                &image_id,
            )?;
        }
        ok(format!("the operator pod runs {want_id} too"));
        Ok(())
    }

    pub(super) async fn arm64_binary(&mut self, run: &mut Run) -> Result<()> {
        run.step("the index's arm64 binary runs under qemu-user-static (no node here is arm64)");
        let index = self.index().clone();
        let layout = self.env.state.join("image/oci");
        let arm_bin = unpack_binary(
            &layout,
            &index.platforms["arm64"].binary_layer,
            &self.tmp.join("arm64"),
        )
        .await?;
        let amd_bin = self.tmp.join("amd64/h3-ingress");
        let (arch, sha) = executable(&arm_bin)?;
        expect_eq("the arm64 layer's /h3-ingress", "arm64", arch.as_str())?;
        let qemu = "qemu-aarch64-static";
        let (arm_s, amd_s) = (arm_bin.to_string_lossy(), amd_bin.to_string_lossy());
        for args in [&["--version"][..], &["crd"][..]] {
            let emulated = sh(qemu, &[&arm_s, args[0]]).await.map_err(|e| {
                h3i_scenarios::Error::Check(format!(
                    "{qemu} (Debian's qemu-user-static; scripts/setup.sh installs it) {} {}: {e}",
                    arm_s, args[0]
                ))
            })?;
            let native = sh(&amd_s, args).await?;
            ensure!(
                emulated == native,
                "`{}` differs: arm64 under qemu {:?}, amd64 {:?}",
                args[0],
                h3i_scenarios::cmd::head(&emulated, 200),
                h3i_scenarios::cmd::head(&native, 200)
            );
            ok(format!(
                "`h3-ingress {}` under {qemu}: the same {} bytes as the amd64 binary's ({})",
                args[0],
                emulated.len(),
                h3i_scenarios::cmd::head(emulated.trim(), 60)
            ));
        }
        info(format!("arm64 /h3-ingress sha256 {sha}"));
        Ok(())
    }

    pub(super) async fn user_selector(&mut self, run: &mut Run) -> Result<()> {
        run.step("a listener's spec.nodeSelector narrows the data plane further (one node)");
        let node1 = self.env.nodes[0].clone();
        let ls = self.all::<Http3Listener>();
        let patch = json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": node1}}});
        k8s::merge(&ls, LISTENER, &patch).await?;
        self.ds_is(120, "1 1 1").await?;
        self.only_on(&node1).await?;
        k8s::merge(&ls, LISTENER, &json!({"spec": {"nodeSelector": null}})).await?;
        self.ds_is(180, "2 2 2").await
    }

    /// Waits until the data plane's only pod runs on `node`.
    async fn only_on(&self, node: &str) -> Result<()> {
        wait_ok(
            120,
            &format!("the data plane's only pod is on {node}"),
            || async {
                let pods = self.dp_pods().await?;
                ensure!(pods.len() == 1 && pods[0].1 == node, "{pods:?}");
                Ok(true)
            },
        )
        .await
    }

    /// Waits until the operator runs one updated, ready pod (after a `helm upgrade`).
    async fn operator_ready(&self) -> Result<()> {
        let deploys = self.ns::<Deployment>(NS_OP);
        wait_ok(
            120,
            "the operator rolled: 1/1/1 updated/ready/replicas",
            || async {
                let d = deploys.get(OP_DEPLOY).await?;
                let s = d.status.unwrap_or_default();
                let got = (s.updated_replicas, s.ready_replicas, s.replicas);
                ensure!(got == (Some(1), Some(1), Some(1)), "{got:?}");
                Ok(true)
            },
        )
        .await
    }

    /// Waits until the data plane's DaemonSet requires exactly `want`.
    async fn ds_requires(&self, want: &[&str]) -> Result<()> {
        let what = format!("the DaemonSet requires {ARCH_LABEL} In {want:?}");
        wait_ok(60, &what, || async {
            let got = self.ds_architectures().await?;
            ensure!(got == want, "{got:?}");
            Ok(true)
        })
        .await
    }

    pub(super) async fn narrowed(&mut self, run: &mut Run) -> Result<()> {
        run.step("an image of arm64 only (--architectures=arm64): no pod, and Ready says why");
        self.helm_upgrade(&["operator.extraArgs={--architectures=arm64}"], true)
            .await?;
        self.operator_ready().await?;
        self.ds_requires(&["arm64"]).await?;
        self.ds_is(120, "0 0 0").await?;
        wait_ok(120, "no data plane pod left", || async {
            Ok(self.dp_pods().await?.is_empty())
        })
        .await?;
        wait_ok(
            60,
            "the listener's Ready names the architecture",
            || async {
                let c = k8s::condition(&self.client, LISTENER, conditions::READY).await?;
                let c = c.map(|c| (c.reason, c.message)).unwrap_or_default();
                ensure!(
                    c.0 == reasons::PODS_NOT_READY && c.1.contains("architecture arm64"),
                    "{c:?}"
                );
                Ok(true)
            },
        )
        .await?;
        self.show_ready().await?;
        self.show().await
    }

    async fn show_ready(&self) -> Result<()> {
        let c = k8s::condition(&self.client, LISTENER, conditions::READY).await?;
        let Some(c) = c else {
            return fail(format!(
                "listener {LISTENER} has no {} condition",
                conditions::READY
            ));
        };
        ok(format!(
            "Ready={} reason {}: {}",
            c.status, c.reason, c.message
        ));
        Ok(())
    }

    pub(super) async fn refused(&mut self, run: &mut Run) -> Result<()> {
        run.step("then a spec.nodeSelector for amd64 is refused as InvalidSpec, naming the field");
        let ls = self.all::<Http3Listener>();
        let patch = json!({"spec": {"nodeSelector": {ARCH_LABEL: "amd64"}}});
        k8s::merge(&ls, LISTENER, &patch).await?;
        wait_ok(
            60,
            "Ready=False InvalidSpec naming nodeSelector",
            || async {
                let c = k8s::condition(&self.client, LISTENER, conditions::READY).await?;
                let c = c.map(|c| (c.reason, c.message)).unwrap_or_default();
                ensure!(
                    c.0 == reasons::INVALID_SPEC && c.1.contains("nodeSelector"),
                    "{c:?}"
                );
                Ok(true)
            },
        )
        .await?;
        self.show_ready().await?;
        k8s::merge(&ls, LISTENER, &json!({"spec": {"nodeSelector": null}})).await?;
        Ok(())
    }

    /// The operator's pods: `(name, phase)`.
    async fn operator_pods(&self) -> Result<Vec<(String, String)>> {
        let sel = format!("{}={}", labels::COMPONENT, labels::COMPONENT_OPERATOR);
        let pods = k8s::list(&self.ns::<Pod>(NS_OP), &sel).await?;
        Ok(pods
            .iter()
            .map(|p| {
                let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                (p.name_any(), phase.unwrap_or_default())
            })
            .collect())
    }

    pub(super) async fn operator_narrowed(&mut self, run: &mut Run) -> Result<()> {
        run.step("image.architectures=[arm64]: the operator's new pod is not scheduled on amd64");
        let before = self.operator_pods().await?;
        let [(old, _)] = &before[..] else {
            return fail(format!("operator pods {before:?}, want one"));
        };
        self.helm_upgrade(
            &["image.architectures={arm64}", "operator.extraArgs=null"],
            false,
        )
        .await?;
        let pods = self.ns::<Pod>(NS_OP);
        let why = std::cell::RefCell::new(String::new());
        let (this, pods_ref, why_ref) = (&*self, &pods, &why);
        wait_ok(
            90,
            "a new operator pod, Pending: FailedScheduling",
            || async move {
                let now = this.operator_pods().await?;
                let pending = "Pending"; // kubernetes' own pod phase
                let Some((new, _)) = now.iter().find(|(n, ph)| n != old && ph == pending) else {
                    return fail(format!("{now:?}"));
                };
                let uid = pods_ref.get(new).await?.uid().unwrap_or_default();
                let ev = k8s::events(&this.client, "Pod", &uid, None, Some("FailedScheduling"));
                let line = ev.await?.last().map(k8s::event_line).unwrap_or_default();
                ensure!(
                    !line.is_empty(),
                    "{new} Pending, no FailedScheduling event yet"
                );
                *why_ref.borrow_mut() = format!("{new}: {line}");
                Ok(true)
            },
        )
        .await?;
        let why = why.into_inner();
        ensure!(
            why.contains("didn't match Pod's node affinity/selector"),
            "FailedScheduling, but not for the node affinity: {why}"
        );
        ok(why);
        let phase = pods.get(old).await?.status.and_then(|s| s.phase);
        expect_eq(
            &format!("the running operator {old}"),
            &Some("Running".to_string()),
            &phase,
        )?;
        ok(format!(
            "{old} still Running (the rolling update waits for a pod that can be scheduled)"
        ));
        Ok(())
    }

    pub(super) async fn defaults_again(&mut self, run: &mut Run) -> Result<()> {
        run.step("back to the defaults: both nodes run the data plane again");
        self.helm_defaults("upgrade").await?;
        self.operator_ready().await?;
        self.ds_requires(ARCHITECTURES).await?;
        self.ds_is(180, "2 2 2").await?;
        let want = format!("{IMAGE_REPO}@{}", self.index().digest);
        for (pod, _) in self.dp_pods().await? {
            let (node, _, image_id) = self.pod_image(&pod, CONTAINER_NAME).await?;
            expect_eq(&format!("{pod} on {node}: imageID"), &want, &image_id)?;
        }
        ok(format!("both data plane pods Ready again from {want}"));
        self.show().await
    }

    async fn show_nodes(&self) -> Result<()> {
        let arch = format!("-L{ARCH_LABEL}");
        indent(sh("kubectl", &["get", "nodes", &arch]).await?);
        Ok(())
    }
}
