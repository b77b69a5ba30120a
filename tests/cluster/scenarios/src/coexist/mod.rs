//! Two installations side by side on the real nodes: the chart installed twice under one
//! release name, in namespaces A and B, each operator with its own controller name and its own
//! listener on its own UDP port (A: 443, B: 8443), both serving over HTTP/3 through Debian
//! nginx on every node. Then:
//!
//! 1. a second release with A's controller name is refused by `helm install` itself;
//! 2. side by side for `H3I_COEXIST_SECONDS` (300; `tests/cluster/run.sh` gives 120): both
//!    listeners' conditions recorded every second (one value each the whole time: no flip),
//!    HTTP/3 to both on both nodes every 15 s, no new Warning event on either listener, then no
//!    403/Forbidden line in either data plane's or operator's log; each DaemonSet and
//!    ClusterRole(Binding) exists once, in its own installation's names;
//! 3. `socket.forceBuffers` toggled on B's listener (UDP 8443): the surge roll completes (one
//!    uid for the data plane: the new pods join the old ones' SO_REUSEPORT group), the new pods
//!    run as uid 0 with NET_ADMIN alone, and B still serves;
//! 4. `helm uninstall` of B: its pre-delete hook leaves no DaemonSet, pod, ClusterRole or Lease
//!    of B and nothing bound to UDP 8443 on any node; B's listener says `NoController`; A's
//!    listener keeps its pods (same UIDs) and its conditions (recorded throughout) and serves.
//!
//! Real nodes only (the uid of a SO_REUSEPORT group is the kernel's rule). `H3I_COEXIST_KEEP=1`
//! keeps the objects and nginx.

mod record;
mod steps;

use std::path::PathBuf;

use h3_ingress::api::{conditions, Http3Listener};
use h3i_scenarios::cmd::{output, run as sh};
use h3i_scenarios::h3::{aioquic, Target};
use h3i_scenarios::k8s::{self, Apis};
use h3i_scenarios::{app, ensure, Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::IngressClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Client, ResourceExt};

use crate::FromEnv;
use record::Recorder;

/// The same release name in both namespaces: cluster-scoped names must differ.
const RELEASE: &str = app::RELEASE;
const NS_A: &str = "h3i-co-a";
const NS_B: &str = "h3i-co-b";
const NS_APP: &str = "h3i-co-app";
const NAME_A: &str = h3_ingress::api::DEFAULT_CONTROLLER_NAME;
const NAME_B: &str = "example.com/team-b";
const LISTENER_A: &str = "co-a";
const LISTENER_B: &str = "co-b";
const PORT_A: u16 = 443;
const PORT_B: u16 = 8443;
const HOST_A: &str = "a.h3i.test";
const HOST_B: &str = "b.h3i.test";
/// The data plane container (its log files, its process).
const DP_CONTAINER: &str = "h3-ingress";

pub struct Coexist {
    env: Env,
    client: Client,
    tmp: PathBuf,
    ca: PathBuf,
    nginx: Option<Nginx>,
    side_by_side: u64,
    recorders: Vec<Recorder>,
    /// When the side-by-side stretch began (epoch seconds).
    t_side: u64,
    /// A's data plane pods (`name uid`) at that moment.
    pods_a: Vec<String>,
}

impl FromEnv for Coexist {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-coexist").unwrap_or_else(|_| "/tmp/h3i-coexist".into());
        let side_by_side = std::env::var("H3I_COEXIST_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(300);
        Coexist {
            env,
            client,
            ca: tmp.join("pki/ca.crt"),
            tmp,
            nginx: None,
            side_by_side,
            recorders: Vec::new(),
            t_side: 0,
            pods_a: Vec::new(),
        }
    }
}

impl Apis for Coexist {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Scenario for Coexist {
    const TITLE: &'static str = "COEXIST TEST";

    fn namespace(&self) -> &str {
        NS_A
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "real nodes only (H3I_NODES=real): the uid of a SO_REUSEPORT group is the kernel's rule"
        );
        self.prepare().await?;
        self.install_a_and_refuse_twin(run).await?;
        self.install_b(run).await?;
        self.application(run).await?;
        self.own_objects(run).await?;
        self.side_by_side(run).await?;
        self.logs_clean(run).await?;
        self.force_buffers_roll(run).await?;
        self.uninstall_b(run).await
    }

    async fn cleanup(&mut self) {
        for r in &self.recorders {
            r.stop();
        }
        if app::keep("H3I_COEXIST_KEEP") {
            println!(
                "H3I_COEXIST_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        if let Some(n) = &self.nginx {
            n.stop();
        }
        self.remove_objects(false).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Coexist {
    /// Both releases, the listeners, the namespaces, the IngressClasses and the CRD; waits for
    /// the releases and namespaces when `wait`. Never fails.
    async fn remove_objects(&self, wait: bool) {
        let w = if wait { "--wait" } else { "--wait=false" };
        for ns in [NS_B, NS_A] {
            let _ = output(
                "helm",
                &["uninstall", RELEASE, "-n", ns, w, "--timeout", "120s"],
            )
            .await;
        }
        let ls = self.all::<Http3Listener>();
        for l in [LISTENER_A, LISTENER_B] {
            let _ = k8s::delete(&ls, l).await;
        }
        for ns in [NS_A, NS_B, NS_APP] {
            let _ = k8s::delete(&self.all::<Namespace>(), ns).await;
        }
        for c in ["co-a", "co-b"] {
            let _ = k8s::delete(&self.all::<IngressClass>(), c).await;
        }
        let _ = k8s::delete(
            &self.all::<CustomResourceDefinition>(),
            h3_ingress::api::schema::CRD_NAME,
        )
        .await;
    }

    /// `helm install` of the working tree's chart into `ns` with `controllerName`; the
    /// outcome as helm printed it.
    async fn install(&self, ns: &str, controller: &str) -> Result<h3i_scenarios::cmd::Output> {
        let privileged = [("pod-security.kubernetes.io/enforce", "privileged")];
        app::namespace(&self.client, ns, &privileged).await?;
        let mut sets = vec![
            format!("image.repository={}", app::IMAGE_REPO),
            format!("controllerName={controller}"),
        ];
        let password =
            std::fs::read_to_string(&self.env.registry_password_file).unwrap_or_default();
        app::pull_secret(&self.client, ns, &self.env.registry_user, password.trim()).await?;
        sets.push(format!("imagePullSecrets[0].name={}", app::PULL_SECRET));
        let chart = app::chart();
        let chart = chart.to_string_lossy();
        let mut args = vec!["install", RELEASE, &chart, "-n", ns];
        for s in &sets {
            args.extend(["--set", s]);
        }
        args.extend(["--wait", "--timeout", "120s"]);
        output("helm", &args).await
    }

    /// The listener's `Ready` is `status/reason`.
    async fn ready_is(&self, listener: &str, status: &str, reason: &str) -> Result<bool> {
        k8s::condition_is(&self.client, listener, conditions::READY, status, reason).await
    }

    /// `host` answers 200 over HTTP/3 on `port` of every node.
    async fn served(&self, host: &str, port: u16) -> Result<bool> {
        for ip in &self.env.ips {
            let t = Target {
                addr: ip,
                host,
                port,
                path: "/whoami",
                cacert: &self.ca,
            };
            if aioquic(&t).await?.status != Some(200) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The data plane's pods in `ns` that are not being deleted.
    async fn dp_pods(&self, ns: &str) -> Result<Vec<Pod>> {
        let sel = format!(
            "{}={}",
            h3_ingress::operator::labels::COMPONENT,
            h3_ingress::operator::labels::COMPONENT_DATA_PLANE
        );
        let pods = k8s::list(&self.ns::<Pod>(ns), &sel).await?;
        Ok(pods
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// `name uid` of each of A's data plane pods, sorted.
    async fn pods_of_a(&self) -> Result<Vec<String>> {
        let mut v: Vec<String> = self
            .dp_pods(NS_A)
            .await?
            .iter()
            .map(|p| format!("{} {}", p.name_any(), p.uid().unwrap_or_default()))
            .collect();
        v.sort();
        Ok(v)
    }

    /// What holds UDP `port` in each node's namespace (`ss` lines).
    async fn udp_holders(&self, port: u16) -> Result<Vec<String>> {
        let filter = format!("sport = :{port}");
        let mut out = Vec::new();
        for node in &self.env.nodes {
            let text = sh("ip", &["netns", "exec", node, "ss", "-Hulpn", &filter]).await?;
            out.extend(text.lines().map(|l| format!("{node}: {l}")));
        }
        Ok(out)
    }
}
