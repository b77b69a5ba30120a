//! Architectures on real nodes: the image in the cluster's registry is an index of linux/amd64
//! and linux/arm64 (`scripts/image.sh` of both static binaries), and
//!
//! 1. with the chart's defaults both (amd64) nodes run the operator and the data plane from
//!    that index: each pod's imageID is the index, each node's containerd holds the amd64
//!    manifest, config and binary layer and not arm64's config or layer, and the pod's
//!    process is the amd64 binary of the index's layer (same SHA-256);
//! 2. the index's arm64 binary (its layer, checked against its digest) runs `--version` and
//!    `crd` under Debian's qemu-user-static with the amd64 binary's output;
//! 3. a listener's own `spec.nodeSelector` narrows the data plane further (one node);
//! 4. with the data plane narrowed to arm64 (the operator's `--architectures`, what
//!    `image.architectures` passes), no pod runs on the amd64 nodes and the listener's `Ready` says why; a
//!    `spec.nodeSelector` for amd64 is then refused as an invalid spec naming the field;
//! 5. `image.architectures=[arm64]` keeps the operator's own new pod off the amd64 nodes
//!    (FailedScheduling: node affinity) while the running one stays;
//! 6. back to the defaults, both nodes run the data plane again.
//!
//! The nodes are amd64 machines and no node here pulls or runs the arm64 platform (that binary
//! runs under emulation only). A node cannot be passed off as arm64 through the API either:
//! the kubelet sets `kubernetes.io/arch` back from its own build within seconds (measured: a
//! `kubectl label --overwrite` to arm64 was amd64 again at the next read, 4 s later), so the
//! selectors are proven by a list that matches no node.
//! `H3I_ARCH_KEEP=1` keeps the objects.

mod image;
mod steps;

use h3i_scenarios::k8s::Apis;
use std::path::PathBuf;

use h3_ingress::api::Http3Listener;
use h3_ingress::operator::labels;
use h3_ingress::operator::placement::ARCH_LABEL;
use h3_ingress::operator::resources::data_plane_name;
use h3i_scenarios::cmd::output;
use h3i_scenarios::k8s;
use h3i_scenarios::poll::until;
use h3i_scenarios::{ensure, info, Env, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Client, ResourceExt};

use crate::FromEnv;
use image::{Index, NodeCtr};

/// The release namespace: operator and data plane.
const NS_OP: &str = "h3i-arch";
/// The chart's default hosts namespace for it.
const NS_HOSTS: &str = "h3i-arch-hosts";
const RELEASE: &str = "h3-ingress";
const OP_DEPLOY: &str = "h3-ingress-operator";
const LISTENER: &str = "arch";
const HOST: &str = "arch.h3i.test";
const IMAGE_REPO: &str = "registry.h3i.test/h3-ingress";
const CRD: &str = "http3listeners.h3-ingress.dev";

/// The run's state: the cluster, its scratch directory and what the first steps found.
pub struct Arch {
    env: Env,
    client: Client,
    tmp: PathBuf,
    /// The image index the cluster pushed (read in `prepare`).
    index: Option<Index>,
    ctr: Option<NodeCtr>,
}

impl FromEnv for Arch {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-arch").unwrap_or_else(|_| "/tmp/h3i-arch".into());
        Arch {
            env,
            client,
            tmp,
            index: None,
            ctr: None,
        }
    }
}

impl Scenario for Arch {
    const TITLE: &'static str = "ARCH";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare(run).await?;
        self.install(run).await?;
        self.listener(run).await?;
        self.pulled(run).await?;
        self.arm64_binary(run).await?;
        self.user_selector(run).await?;
        self.narrowed(run).await?;
        self.refused(run).await?;
        self.operator_narrowed(run).await?;
        self.defaults_again(run).await
    }

    async fn cleanup(&mut self) {
        if std::env::var("H3I_ARCH_KEEP").is_ok_and(|v| v == "1") {
            println!(
                "H3I_ARCH_KEEP=1: objects and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.remove_objects(false).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Apis for Arch {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Arch {
    fn index(&self) -> &Index {
        self.index.as_ref().expect("prepare reads the index first")
    }

    /// Deletes the listener, the release, the namespaces and the CRD (waiting when `wait`);
    /// never fails.
    async fn remove_objects(&self, wait: bool) {
        let _ = k8s::delete(&self.all::<Http3Listener>(), LISTENER).await;
        if wait {
            let ls = self.all::<Http3Listener>();
            let _ = until(60, "listener deleted", || async {
                // Without the CRD (a first run) the get fails: nothing to wait for.
                Ok(!k8s::exists(&ls, LISTENER).await.unwrap_or(false))
            })
            .await;
        }
        let w = if wait { "--wait" } else { "--wait=false" };
        let _ = output("helm", &["uninstall", RELEASE, "-n", NS_OP, w]).await;
        for n in [NS_OP, NS_HOSTS] {
            let _ = k8s::delete(&self.all::<Namespace>(), n).await;
        }
        let _ = k8s::delete(&self.all::<CustomResourceDefinition>(), CRD).await;
    }

    /// `desired ready current` of the data plane's DaemonSet, or `none`.
    async fn ds_state(&self) -> Result<String> {
        let ds = k8s::get(&self.ns::<DaemonSet>(NS_OP), &data_plane_name(LISTENER)).await?;
        Ok(match ds.and_then(|d| d.status) {
            Some(s) => format!(
                "{} {} {}",
                s.desired_number_scheduled, s.number_ready, s.current_number_scheduled
            ),
            None => "none".into(),
        })
    }

    /// Waits until the DaemonSet's `desired ready current` is `want`.
    async fn ds_is(&self, secs: u64, want: &str) -> Result<()> {
        let what = format!(
            "DaemonSet {}: desired/ready/current {want}",
            data_plane_name(LISTENER)
        );
        h3i_scenarios::poll::wait_ok(secs, &what, || async {
            let got = self.ds_state().await?;
            ensure!(got == want, "{got}");
            Ok(true)
        })
        .await
    }

    /// The data plane's pods: `(name, node)`.
    async fn dp_pods(&self) -> Result<Vec<(String, String)>> {
        let sel = format!(
            "{}={LISTENER},{}={}",
            labels::INSTANCE,
            labels::COMPONENT,
            labels::COMPONENT_DATA_PLANE
        );
        let pods = k8s::list(&self.ns::<Pod>(NS_OP), &sel).await?;
        Ok(pods
            .iter()
            .map(|p| {
                let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
                (p.name_any(), node.unwrap_or_default())
            })
            .collect())
    }

    /// What a user sees: `kubectl get h3l` and the nodes with their architecture.
    async fn show(&self) -> Result<()> {
        let h3l = h3i_scenarios::cmd::run("kubectl", &["get", "h3l", LISTENER]).await?;
        h3i_scenarios::indent(h3l);
        let arch = format!("-L{ARCH_LABEL}");
        let nodes = h3i_scenarios::cmd::run("kubectl", &["get", "nodes", &arch]).await?;
        h3i_scenarios::indent(nodes);
        Ok(())
    }

    /// `helm upgrade` of the release with the install's values and these `--set`s.
    async fn helm_upgrade(&self, sets: &[&str], wait: bool) -> Result<()> {
        let chart = h3i_scenarios::cmd::repo().join("charts/h3-ingress");
        let chart = chart.to_string_lossy();
        let mut args = vec!["upgrade", RELEASE, &chart, "-n", NS_OP, "--reuse-values"];
        for s in sets {
            args.extend(["--set", s]);
        }
        if wait {
            args.extend(["--wait", "--timeout", "180s"]);
        }
        h3i_scenarios::cmd::run("helm", &args)
            .await
            .map_err(|e| h3i_scenarios::Error::Check(format!("helm upgrade {sets:?}: {e}")))?;
        info(format!(
            "helm upgrade --reuse-values --set {}",
            sets.join(" --set ")
        ));
        Ok(())
    }
}
