//! The chart's monitoring under a real Prometheus Operator, on real nodes
//! (`tests/cluster/README.md` lists the checks). `tests/cluster/prometheus-up.sh` sets up the
//! Prometheus Operator and a Prometheus as kube-prometheus-stack's defaults do (monitors and
//! rules selected by `release: kube-prometheus-stack` in every namespace); the chart goes in as
//! its user would install it, with the ServiceMonitor, PodMonitor and PrometheusRule enabled and
//! that label on each; Debian nginx on each node is the TCP ingress, its stub_status exported by
//! Debian's prometheus-nginx-exporter through a ScrapeConfig (the share's denominator); one
//! Http3Listener serves `shop.h3i.test` with its metrics on a port other than the default, so
//! that only the pods' annotation can lead Prometheus to it. Then each check is a query and the
//! answer it must give: every data plane pod and the operator scraped with `up == 1`, each
//! one's `h3_ingress_*` series (every series the product's registries export before any
//! traffic), the PrometheusRule's rules loaded, every dashboard query answered after HTTP/3
//! requests, one target per node through a surge roll, and the two missing-target alerts
//! pending and firing when the listener's pods or the operator go, quiet again when they come
//! back. `H3I_MONITORING_KEEP=1` keeps the objects, nginx and the monitoring stack (the
//! exporters and clients stop with the run).

mod checks;
mod dashboard;
mod scrape;
mod stack;
mod vanish;

use h3i_scenarios::k8s::Apis;
use std::path::PathBuf;

use h3_ingress::operator::labels;
use h3i_scenarios::promapi::Prometheus;
use h3i_scenarios::{info, Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

use crate::FromEnv;
use checks::Checks;

/// The release namespace: operator and data plane.
const NS_OP: &str = "h3-ingress";
const RELEASE: &str = "h3-ingress";
const NS_APP: &str = "h3i-monitoring";
const HOST: &str = "shop.h3i.test";
const CLASS: &str = "h3i-monitoring";
const LISTENER: &str = "mon";
/// Not the default 9476: a monitor that guessed the port instead of reading the pod's
/// annotation would find nothing.
const METRICS_PORT: u16 = 9486;
const IMAGE_REPO: &str = "registry.h3i.test/h3-ingress";
const ALT_SVC: &str = "h3=\":443\"; ma=3600";
/// The chart's operator Deployment.
const OP_DEPLOY: &str = "h3-ingress-operator";
/// Where tests/cluster/prometheus-up.sh puts the stack, and the release label its Prometheus
/// selects (kube-prometheus-stack's default: its release name).
const PROM_NS: &str = "monitoring";
const PROM_RELEASE: &str = "kube-prometheus-stack";
/// The two alerts on missing targets, from charts/h3-ingress/rules/h3-ingress.rules.yaml.
const ALERT_DATA_PLANE: &str = "H3IngressDataPlaneTargetsMissing";
const ALERT_OPERATOR: &str = "H3IngressOperatorDown";
/// nginx's stub_status (127.0.0.1 of each node) and the exporter's port (the node's address).
const STUB_PORT: u16 = 8080;
const EXPORTER_PORT: u16 = 9113;
/// The ScrapeConfig (in `PROM_NS`) that has Prometheus scrape those exporters.
const SCRAPE_CONFIG: &str = "nginx-stub-status";
/// The roll's old pods drain a slow download beside the new ones: 640 KiB at 32 KiB/s, about
/// 20 s, within `http.drainTimeoutSeconds` (an old pod without requests in flight leaves at once).
const SLOW_BYTES: usize = 640 << 10;
const SLOW_RATE: &str = "32k";
const DRAIN_SECS: u64 = 30;

/// What the chart's monitors make Prometheus call its jobs, read from the installed objects.
#[derive(Clone, Debug, Default)]
struct Jobs {
    /// The PodMonitor's: `NAMESPACE/NAME`.
    data_plane: String,
    /// Its scrape pool: `podMonitor/NAMESPACE/NAME/0`.
    pool: String,
    /// The ServiceMonitor's: the name of the Service it selects.
    operator: String,
    /// Its scrape pool: `serviceMonitor/NAMESPACE/NAME/0`.
    operator_pool: String,
    /// The PrometheusRule's name.
    rule: String,
}

/// The run's state: the cluster, the scratch directory, nginx, the exporters, Prometheus and
/// the checks so far.
pub struct Monitoring {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    ca: PathBuf,
    prom: Prometheus,
    jobs: Jobs,
    checks: Checks,
    /// The exporters and held downloads this run started (killed on drop and in cleanup).
    children: Vec<tokio::process::Child>,
    passed: bool,
}

impl FromEnv for Monitoring {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-monitoring")
            .unwrap_or_else(|_| "/tmp/h3i-monitoring".into());
        let server = format!("location /slow/ {{ limit_rate {SLOW_RATE}; }}");
        let http = format!(
            "server {{ listen 127.0.0.1:{STUB_PORT}; location = /stub_status {{ stub_status; }} }}"
        );
        Monitoring {
            nginx: Nginx::new(&tmp, ALT_SVC, &server).with_http(&http),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            prom: Prometheus::new(""),
            jobs: Jobs::default(),
            checks: Checks::default(),
            children: Vec::new(),
            passed: false,
        }
    }
}

impl Scenario for Monitoring {
    const TITLE: &'static str = "MONITORING";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.prometheus_up(run).await?;
        self.install(run).await?;
        self.application(run).await?;
        self.targets(run).await?;
        self.rules(run).await?;
        self.dashboard(run).await?;
        self.roll(run).await?;
        self.pods_vanish(run).await?;
        self.operator_down(run).await?;
        run.step("done: the checks");
        print!("{}", self.checks.table());
        self.passed = true;
        Ok(())
    }

    async fn cleanup(&mut self) {
        if !self.passed && !self.checks.is_empty() {
            eprint!("{}", self.checks.table());
            eprintln!("expected:\n{}", self.checks.expectations());
        }
        for c in &mut self.children {
            let _ = c.start_kill();
        }
        if std::env::var("H3I_MONITORING_KEEP").is_ok_and(|v| v == "1") {
            println!(
                "H3I_MONITORING_KEEP=1: objects, nginx, the monitoring stack and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        self.remove_objects(false).await;
        stack::prometheus_down().await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Apis for Monitoring {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Monitoring {
    /// The Prometheus Operator's objects of `kind` (`plural`) in `ns`.
    fn monitoring_api(
        &self,
        ns: &str,
        version: &str,
        kind: &str,
        plural: &str,
    ) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("monitoring.coreos.com", version, kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        Api::namespaced_with(self.client.clone(), ns, &ar)
    }

    /// `app.kubernetes.io/instance=LISTENER,app.kubernetes.io/component=data-plane`
    fn dp_selector(&self) -> String {
        format!(
            "{}={LISTENER},{}={}",
            labels::INSTANCE,
            labels::COMPONENT,
            labels::COMPONENT_DATA_PLANE
        )
    }

    async fn dp_pods(&self) -> Result<Vec<Pod>> {
        h3i_scenarios::k8s::list(&self.ns::<Pod>(NS_OP), &self.dp_selector()).await
    }

    /// Every pod of the listener's DaemonSet updated, available and ready, on every node.
    async fn rolled_out(&self) -> Result<bool> {
        let name = h3_ingress::operator::resources::data_plane_name(LISTENER);
        let Some(ds) = h3i_scenarios::k8s::get(&self.ns::<DaemonSet>(NS_OP), &name).await? else {
            return Ok(false);
        };
        let st = ds.status.unwrap_or_default();
        let want = st.desired_number_scheduled;
        Ok(ds.metadata.generation == st.observed_generation
            && want == self.env.nodes.len() as i32
            && st.updated_number_scheduled == Some(want)
            && st.number_ready == want
            && st.number_available == Some(want)
            && self.dp_pods().await?.len() == self.env.nodes.len())
    }

    /// Deletes the listener, the release, the namespaces, the CRD and the IngressClass
    /// (waiting for the namespaces when `wait`); never fails.
    async fn remove_objects(&self, wait: bool) {
        use h3i_scenarios::k8s;
        use k8s_openapi::api::core::v1::Namespace;
        let ls = self.all::<h3_ingress::api::Http3Listener>();
        for l in k8s::names(&ls, "").await.unwrap_or_default() {
            let _ = k8s::delete(&ls, &l).await;
        }
        let w = if wait { "--wait" } else { "--wait=false" };
        let _ = h3i_scenarios::cmd::output("helm", &["uninstall", RELEASE, "-n", NS_OP, w]).await;
        for n in [NS_APP, NS_OP] {
            let _ = k8s::delete(&self.all::<Namespace>(), n).await;
        }
        let crds = self.all::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>();
        let _ = k8s::delete(&crds, "http3listeners.h3-ingress.dev").await;
        let classes = self.all::<k8s_openapi::api::networking::v1::IngressClass>();
        let _ = k8s::delete(&classes, CLASS).await;
        if wait {
            let ns = self.all::<Namespace>();
            for n in [NS_APP, NS_OP] {
                let what = format!("namespace {n} deleted");
                let gone = h3i_scenarios::poll::until(90, &what, || async {
                    Ok(!k8s::exists(&ns, n).await?)
                });
                if let Err(e) = gone.await {
                    info(format!("{e}"));
                }
            }
        }
    }
}
