//! The monitoring scenario's setting: the monitoring stack (tests/cluster/prometheus-up.sh), the
//! chart with its monitors, nginx and its exporters on each node, the application's objects and
//! the listener.

use h3i_scenarios::k8s::Apis;
use std::collections::BTreeMap;
use std::process::Stdio;

use h3_ingress::api::{annotations, Http3Listener};
use h3_ingress::operator::resources::METRICS_PORT_ANNOTATION;
use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::error::IoContext;
use h3i_scenarios::h3::{self, Expect, Target};
use h3i_scenarios::k8s;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::promapi::Prometheus;
use h3i_scenarios::{ensure, fail, indent, info, ok, Error, Pki, Result, Run};
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::DynamicObject;
use kube::ResourceExt;
use serde_json::{json, Value};

use super::*;

const PROMETHEUS_UP: &str = "tests/cluster/prometheus-up.sh";

/// `tests/cluster/prometheus-up.sh ARGS` with the scenario's namespace and release label: its
/// stdout; its stderr indented.
async fn prometheus_up_sh(args: &[&str]) -> Result<String> {
    let script = repo().join(PROMETHEUS_UP).to_string_lossy().to_string();
    let ns = format!("H3I_PROM_NAMESPACE={PROM_NS}");
    let release = format!("H3I_PROM_RELEASE={PROM_RELEASE}");
    let mut all = vec![ns.as_str(), release.as_str(), script.as_str()];
    all.extend(args);
    let out = output("env", &all).await?;
    indent(out.stderr.trim_end());
    if !out.success() {
        return fail(format!(
            "{PROMETHEUS_UP} {} exited {:?}",
            args.join(" "),
            out.status
        ));
    }
    Ok(out.stdout)
}

/// Removes the monitoring stack without waiting for it; never fails.
pub(super) async fn prometheus_down() {
    if let Err(e) = prometheus_up_sh(&["down", "--no-wait"]).await {
        eprintln!("{e}");
    }
}

/// The exporters a kept or interrupted run left in `node`'s namespace (listening on `ip`).
fn stop_exporters(node: &str, ip: &str) -> Vec<String> {
    let Ok(out) = std::process::Command::new("ip")
        .args(["netns", "pids", node])
        .output()
    else {
        return Vec::new();
    };
    let listen = format!("-web.listen-address={ip}:{EXPORTER_PORT}");
    let mut stopped = Vec::new();
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.starts_with("prometheus-nginx-exporter ") && cmdline.contains(&listen) {
            let _ = std::process::Command::new("kill").arg(pid).status();
            stopped.push(pid.to_string());
        }
    }
    stopped
}

impl Monitoring {
    /// What a kept or interrupted run left (the release, the listener, nginx, exporters) would
    /// confuse every check.
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "the monitoring checks need real nodes (H3I_NODES=real scripts/cluster.sh up): the node agent runs no images, and Prometheus is one"
        );
        let ns = self.all::<Namespace>();
        if k8s::exists(&ns, NS_OP).await? || k8s::exists(&ns, NS_APP).await? {
            info("removing a previous run's objects");
            self.remove_objects(true).await;
            for n in [NS_APP, NS_OP] {
                until(90, &format!("namespace {n} deleted"), || async {
                    Ok(!k8s::exists(&ns, n).await?)
                })
                .await?;
            }
        }
        k8s::delete(&self.all::<IngressClass>(), CLASS).await?;
        for (node, ip) in self.env.nodes.iter().zip(&self.env.ips) {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-monitoring.") {
                info(format!(
                    "stopped a previous run's nginx in {node} (pid {pid})"
                ));
            }
            for pid in stop_exporters(node, ip) {
                info(format!(
                    "stopped a previous run's exporter in {node} (pid {pid})"
                ));
            }
        }
        Ok(())
    }

    pub(super) async fn prometheus_up(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "the Prometheus Operator and a Prometheus as kube-prometheus-stack sets them up ({PROMETHEUS_UP})"
        ));
        let stdout = prometheus_up_sh(&["up"]).await?;
        let Some(url) = stdout.lines().rev().find(|l| l.starts_with("http://")) else {
            return fail(format!("{PROMETHEUS_UP} printed no URL: {stdout:?}"));
        };
        self.prom = Prometheus::new(url);
        let (version, go) = self.prom.build().await?;
        ok(format!(
            "Prometheus {version} ({go}) at {}",
            self.prom.url()
        ));
        // Now, though the exporters start later: Prometheus sees a new ScrapeConfig only
        // when the kubelet next syncs the operator-written config Secret into its pod (166 s
        // measured here once), so the sooner it exists the sooner the share has data.
        let sc = json!({"apiVersion": "monitoring.coreos.com/v1alpha1", "kind": "ScrapeConfig",
            "metadata": {"name": SCRAPE_CONFIG, "namespace": PROM_NS,
                "labels": {"release": PROM_RELEASE}},
            "spec": {"scrapeInterval": "15s",
                "staticConfigs": [{"targets": self.exporter_targets(), "labels": {"tcp_ingress": "nginx"}}]}});
        let api = self.monitoring_api(PROM_NS, "v1alpha1", "ScrapeConfig", "scrapeconfigs");
        k8s::apply(&api, SCRAPE_CONFIG, &sc).await?;
        ok(format!(
            "scrapeconfig/{SCRAPE_CONFIG} in {PROM_NS} for the TCP ingress's exporters"
        ));
        Ok(())
    }

    /// Where each node's prometheus-nginx-exporter listens.
    fn exporter_targets(&self) -> Vec<String> {
        (self.env.ips.iter())
            .map(|ip| format!("{ip}:{EXPORTER_PORT}"))
            .collect()
    }

    /// The chart's values: the three monitoring objects labelled as kube-prometheus-stack
    /// selects them, the share over nginx's stub_status (NGINX Open Source has no per-host
    /// counter: preset generic, not per host), short `for:` on the two alerts this run waits for.
    fn values(&self) -> Value {
        let release = json!({"release": PROM_RELEASE});
        json!({
            "image": {"repository": IMAGE_REPO},
            "imagePullSecrets": [{"name": "regcred"}],
            "metrics": {
                "serviceMonitor": {"enabled": true, "labels": release},
                "podMonitor": {"enabled": true, "labels": release},
                "prometheusRule": {
                    "enabled": true,
                    "labels": release,
                    "share": {"preset": "generic", "generic": {
                        "expr": "sum(rate(nginx_http_requests_total[5m]))", "perHost": false}},
                    "alertFor": {ALERT_DATA_PLANE: "30s", ALERT_OPERATOR: "30s"},
                },
            },
        })
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("helm install with metrics.serviceMonitor, podMonitor and prometheusRule enabled, labelled release={PROM_RELEASE}"));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_OP,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        k8s::apply(&self.all::<Namespace>(), NS_OP, &ns).await?;
        let password = std::fs::read_to_string(&self.env.registry_password_file)
            .context(|| format!("read {}", self.env.registry_password_file.display()))?;
        let secrets = self.ns::<Secret>(NS_OP);
        let user = &self.env.registry_user;
        k8s::pull_secret(
            &secrets,
            "regcred",
            "registry.h3i.test",
            user,
            password.trim(),
        )
        .await?;
        let values = self.tmp.join("values.json");
        std::fs::write(&values, self.values().to_string())
            .context(|| format!("write {}", values.display()))?;
        let chart = repo().join("charts/h3-ingress");
        let (chart, values) = (chart.to_string_lossy(), values.to_string_lossy());
        let args = ["install", RELEASE, &chart, "-n", NS_OP, "-f", &values];
        let t0 = std::time::Instant::now();
        sh(
            "helm",
            &[&args[..], &["--wait", "--timeout", "120s"]].concat(),
        )
        .await
        .map_err(|e| Error::Check(format!("helm install: {e}")))?;
        ok(format!("helm install --wait: {}s", t0.elapsed().as_secs()));
        self.monitors().await
    }

    /// The one object of `kind` the release made, labelled `release: PROM_RELEASE`.
    async fn one_monitor(&self, version: &str, kind: &str, plural: &str) -> Result<DynamicObject> {
        let api = self.monitoring_api(NS_OP, version, kind, plural);
        let mut all = api.list(&Default::default()).await?.items;
        let names: Vec<String> = all.iter().map(|o| o.name_any()).collect();
        ensure!(
            all.len() == 1,
            "{kind}s in {NS_OP}: {names:?}, want one (the chart's)"
        );
        let o = all.remove(0);
        let release = o.labels().get("release").cloned().unwrap_or_default();
        expect_eq(
            &format!("{kind} {}: label release", o.name_any()),
            PROM_RELEASE,
            &release,
        )?;
        Ok(o)
    }

    /// The chart's PodMonitor, ServiceMonitor and PrometheusRule, and the jobs they make.
    async fn monitors(&mut self) -> Result<()> {
        let pm = self.one_monitor("v1", "PodMonitor", "podmonitors").await?;
        let sm = self
            .one_monitor("v1", "ServiceMonitor", "servicemonitors")
            .await?;
        let rule = self
            .one_monitor("v1", "PrometheusRule", "prometheusrules")
            .await?;
        let selector: BTreeMap<String, String> =
            serde_json::from_value(sm.data["spec"]["selector"]["matchLabels"].clone())
                .unwrap_or_default();
        let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let services = k8s::names(&self.ns::<Service>(NS_OP), &selector.join(",")).await?;
        ensure!(
            services.len() == 1,
            "ServiceMonitor {} selects the Services {services:?} ({}), want one",
            sm.name_any(),
            selector.join(",")
        );
        self.jobs = Jobs {
            data_plane: format!("{NS_OP}/{}", pm.name_any()),
            pool: format!("podMonitor/{NS_OP}/{}/0", pm.name_any()),
            operator: services[0].clone(),
            operator_pool: format!("serviceMonitor/{NS_OP}/{}/0", sm.name_any()),
            rule: rule.name_any(),
        };
        ok(format!(
            "podmonitor/{} (job {}), servicemonitor/{} (job {}, Service {}), prometheusrule/{}: each labelled release={PROM_RELEASE}",
            pm.name_any(),
            self.jobs.data_plane,
            sm.name_any(),
            self.jobs.operator,
            services[0],
            self.jobs.rule
        ));
        Ok(())
    }

    /// nginx on every node (with a throttled `/slow/` and stub_status) and an exporter per node
    /// (the ScrapeConfig that scrapes them is applied with Prometheus).
    async fn tcp_ingress(&mut self) -> Result<()> {
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-monitoring-ca")?;
        let leaf = pki.leaf(HOST, HOST)?;
        let slow = self.nginx.www().join("slow");
        std::fs::create_dir_all(&slow).context(|| format!("mkdir {}", slow.display()))?;
        let body: Vec<u8> = (0..SLOW_BYTES).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(slow.join("roll.bin"), body).context(|| "write roll.bin".into())?;
        for (node, ip) in self.env.nodes.iter().zip(&self.env.ips) {
            self.nginx.start(node, &[(HOST, &leaf)]).await?;
            let log = self.tmp.join(format!("exporter-{node}.log"));
            let log =
                std::fs::File::create(&log).context(|| format!("create {}", log.display()))?;
            let err = log.try_clone().context(|| "exporter log".into())?;
            let child = tokio::process::Command::new("ip")
                .args(["netns", "exec", node, "prometheus-nginx-exporter"])
                .arg(format!(
                    "-nginx.scrape-uri=http://127.0.0.1:{STUB_PORT}/stub_status"
                ))
                .arg(format!("-web.listen-address={ip}:{EXPORTER_PORT}"))
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                .kill_on_drop(true)
                .spawn()
                .context(|| format!("start prometheus-nginx-exporter in {node}"))?;
            self.children.push(child);
        }
        let targets = self.exporter_targets();
        for addr in &targets {
            let what = format!("prometheus-nginx-exporter answers on {addr}");
            until(30, &what, || async {
                let (status, _) = h3i_scenarios::prom::http_get(addr, "/metrics").await?;
                Ok(status == 200)
            })
            .await?;
        }
        ok(format!(
            "nginx for {HOST} on {}; prometheus-nginx-exporter on {} (scrapeconfig/{SCRAPE_CONFIG} in {PROM_NS})",
            self.env.nodes.join(", "),
            targets.join(", ")
        ));
        Ok(())
    }

    pub(super) async fn application(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("nginx and its exporter on every node, an Ingress annotated {}, an Http3Listener '{LISTENER}' with metrics on port {METRICS_PORT}", annotations::ENABLED));
        self.tcp_ingress().await?;
        let nsapp = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_APP}});
        k8s::apply(&self.all::<Namespace>(), NS_APP, &nsapp).await?;
        let read = |ext: &str| {
            let p = self.tmp.join(format!("pki/{HOST}.{ext}"));
            std::fs::read(&p).context(|| format!("read {}", p.display()))
        };
        let data = json!({"tls.crt": h3i_scenarios::pods::base64(&read("crt")?),
            "tls.key": h3i_scenarios::pods::base64(&read("key")?)});
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "shop-tls", "namespace": NS_APP}, "data": data});
        k8s::apply(&self.ns::<Secret>(NS_APP), "shop-tls", &secret).await?;
        let class = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": CLASS}, "spec": {"controller": "example.com/h3i-monitoring"}});
        k8s::apply(&self.all::<IngressClass>(), CLASS, &class).await?;
        let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "shop", "namespace": NS_APP,
                "annotations": {annotations::ENABLED: "true"}},
            "spec": {"ingressClassName": CLASS,
                "tls": [{"hosts": [HOST], "secretName": "shop-tls"}],
                "rules": [{"host": HOST, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}});
        k8s::apply(&self.ns::<Ingress>(NS_APP), "shop", &ingress).await?;
        let listener = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener",
            "metadata": {"name": LISTENER},
            "spec": {"ingressClassName": CLASS, "upstream": {"address": "127.0.0.1:443"},
                "metrics": {"address": format!("[::]:{METRICS_PORT}")},
                "http": {"drainTimeoutSeconds": DRAIN_SECS}}});
        k8s::apply(&self.all::<Http3Listener>(), LISTENER, &listener).await?;
        let n = self.env.nodes.len();
        wait_ok(
            120,
            &format!("the listener's DaemonSet: {n} of {n} pods Ready"),
            || self.rolled_out(),
        )
        .await?;
        wait_ok(
            60,
            &format!("{HOST} served over HTTP/3 on {}", self.env.ips.join(", ")),
            || self.served(),
        )
        .await?;
        let ports: Vec<String> = (self.dp_pods().await?.iter())
            .map(|p| {
                p.annotations()
                    .get(METRICS_PORT_ANNOTATION)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        ensure!(
            ports.iter().all(|p| *p == METRICS_PORT.to_string()),
            "the data plane pods' annotation {METRICS_PORT_ANNOTATION}: {ports:?}, want {METRICS_PORT} (the listener's metrics.address)"
        );
        ok(format!(
            "the data plane pods carry {METRICS_PORT_ANNOTATION}: {}",
            ports.join(" ")
        ));
        Ok(())
    }

    pub(super) fn target<'a>(&'a self, addr: &'a str, path: &'a str) -> Target<'a> {
        Target {
            addr,
            host: HOST,
            port: 443,
            path,
            cacert: &self.ca,
        }
    }

    /// One GET /whoami over HTTP/3 answered 200 on every node.
    async fn served(&self) -> Result<bool> {
        for ip in &self.env.ips {
            h3::get(
                h3::Client::Aioquic,
                &self.target(ip, "/whoami"),
                &Expect::default(),
            )
            .await?;
        }
        Ok(true)
    }
}

use h3i_scenarios::expect_eq;
