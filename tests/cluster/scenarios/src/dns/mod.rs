//! The cluster DNS of the real nodes (CoreDNS, `scripts/cluster-nodes.sh`) works where the
//! product's pods need it: from a pod on the pod network, from a hostNetwork pod with
//! `dnsPolicy: ClusterFirstWithHostNet` (the data plane's), and a hostNetwork pod with the
//! default policy gets the node's resolver instead. Each client is a busybox pod that prints its
//! `/etc/resolv.conf` and runs `busybox nslookup`, read back through the logs API:
//! `kubernetes.default.svc.cluster.local` resolves to the `kubernetes` Service's ClusterIP, a
//! dual-stack Service without pods by its full and short name to its ClusterIPs (A and AAAA),
//! over both DNS Service addresses; no `MissingClusterDNS` event since the cluster came up.
//! Real nodes only; leaves nothing behind.

mod nslookup;

use h3i_scenarios::k8s::{self, Apis};
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, fail, indent, info, ok, Env, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service};
use kube::api::{ListParams, LogParams};
use kube::Client;
use serde_json::json;

use crate::FromEnv;
use nslookup::{answers, sorted};

/// The namespace of the test Service and the client pods.
const NS: &str = "dns-check";
/// The lookups of the clients that run them, in the order of the blocks they print.
const FULL_NAME: &str = "probe.dns-check.svc.cluster.local";
const KUBERNETES: &str = "kubernetes.default.svc.cluster.local";

/// A client pod: its name, whether on the host's network, its DNS policy and whether it looks
/// anything up (a hostNetwork pod with the default policy would ask the machine's resolver).
const CLIENTS: [(&str, bool, &str, bool); 3] = [
    ("pod-net", false, "ClusterFirst", true),
    ("host-net-cluster", true, "ClusterFirstWithHostNet", true),
    ("host-net-default", true, "ClusterFirst", false),
];

pub struct Dns {
    env: Env,
    client: Client,
    /// The DNS Service's addresses the kubelets hand out (`H3I_CLUSTER_DNS`).
    dns: Vec<String>,
    kubernetes_ip: String,
    probe_ips: Vec<String>,
}

impl FromEnv for Dns {
    fn from_env(env: Env, client: Client) -> Self {
        let dns = std::env::var("H3I_CLUSTER_DNS").unwrap_or_default();
        Dns {
            env,
            client,
            dns: dns.split_whitespace().map(String::from).collect(),
            kubernetes_ip: String::new(),
            probe_ips: Vec::new(),
        }
    }
}

impl Apis for Dns {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Scenario for Dns {
    const TITLE: &'static str = "DNS CHECK";

    /// A failure shows CoreDNS's logs.
    fn namespace(&self) -> &str {
        "kube-system"
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
        );
        ensure!(
            !self.dns.is_empty(),
            "scripts/cluster.sh env names no H3I_CLUSTER_DNS"
        );
        self.coredns(run).await?;
        self.clients(run).await?;
        let mut logs = Vec::new();
        for (name, ..) in CLIENTS {
            logs.push(self.log_of(name).await?);
        }
        run.step("a pod on the pod network (dnsPolicy ClusterFirst)");
        self.check_client(CLIENTS[0].0, &logs[0])?;
        run.step("a hostNetwork pod with dnsPolicy ClusterFirstWithHostNet");
        self.check_client(CLIENTS[1].0, &logs[1])?;
        run.step("a hostNetwork pod with the default dnsPolicy (ClusterFirst: for hostNetwork the node's resolv.conf)");
        let want = format!("nameserver {}", self.dns[0]);
        if logs[2].lines().any(|l| l.trim() == want) {
            return fail(format!("host-net-default got the cluster DNS: {}", logs[2]));
        }
        ok("host-net-default: the kubelet's resolvConf (the host's /etc/resolv.conf), no cluster DNS:");
        indent(&logs[2]);
        run.step("no MissingClusterDNS event");
        let lp = ListParams::default().fields("reason=MissingClusterDNS");
        let events = kube::Api::<Event>::all(self.client.clone())
            .list(&lp)
            .await?;
        ensure!(
            events.items.is_empty(),
            "{} MissingClusterDNS events",
            events.items.len()
        );
        ok("0 MissingClusterDNS events");
        Ok(())
    }

    async fn cleanup(&mut self) {
        let _ = k8s::delete(&self.all::<Namespace>(), NS).await;
    }
}

impl Dns {
    /// CoreDNS is up and its Service has the addresses the kubelets hand out.
    async fn coredns(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "CoreDNS: Deployment kube-system/coredns, Service kube-dns at {}",
            self.dns.join(" ")
        ));
        let deploy = k8s::get(&self.ns::<Deployment>("kube-system"), "coredns").await?;
        let Some(deploy) = deploy else {
            return fail("no Deployment kube-system/coredns");
        };
        let ready = deploy.status.and_then(|s| s.ready_replicas).unwrap_or(0);
        let image = deploy
            .spec
            .template
            .spec
            .and_then(|s| s.containers.first().and_then(|c| c.image.clone()))
            .unwrap_or_default();
        let ips = service_ips(&self.ns::<Service>("kube-system"), "kube-dns").await?;
        info(format!("{ready} Ready, image {image}; ClusterIPs {ips:?}"));
        ensure!(
            ips == self.dns,
            "Service kube-dns has the ClusterIPs {ips:?}, not the {:?} the kubelets hand out",
            self.dns
        );
        let pods = h3i_scenarios::cmd::run(
            "kubectl",
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "k8s-app=kube-dns",
                "-o",
                "wide",
            ],
        )
        .await?;
        indent(pods);
        let ips = service_ips(&self.ns::<Service>("default"), "kubernetes").await?;
        self.kubernetes_ip = ips.first().cloned().unwrap_or_default();
        Ok(())
    }

    /// The namespace, the dual-stack Service `probe` (no pods) and the three client pods,
    /// each run to completion.
    async fn clients(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "namespace {NS}: Service probe (dual-stack, no pods) and three client pods"
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        k8s::apply(&self.all::<Namespace>(), NS, &ns).await?;
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe", "namespace": NS},
            "spec": {"ipFamilyPolicy": "PreferDualStack", "selector": {"app": "nothing"}, "ports": [{"port": 80}]}});
        let services = self.ns::<Service>(NS);
        k8s::apply(&services, "probe", &svc).await?;
        self.probe_ips = service_ips(&services, "probe").await?;
        info(format!(
            "kubernetes: {}; probe: {}",
            self.kubernetes_ip,
            self.probe_ips.join(" ")
        ));
        let pods = self.ns::<Pod>(NS);
        for (name, host_network, policy, lookups) in CLIENTS {
            let script = if lookups {
                self.script()
            } else {
                "cat /etc/resolv.conf".to_string()
            };
            let node = self.env.nodes.first().cloned().unwrap_or_default();
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
                "spec": {"restartPolicy": "Never", "hostNetwork": host_network, "dnsPolicy": policy,
                  "nodeName": node, "containers": [{"name": "c", "image": "registry.h3i.test/busybox:1",
                    "imagePullPolicy": "IfNotPresent", "command": ["/bin/sh", "-c", script]}]}});
            k8s::apply(&pods, name, &pod).await?;
        }
        for (name, ..) in CLIENTS {
            wait_ok(60, &format!("pod {name} Succeeded"), || async {
                let phase = k8s::get(&pods, name).await?.and_then(|p| p.status?.phase);
                let phase = phase.unwrap_or_default();
                ensure!(phase != "Failed", "pod {name} Failed"); // kubernetes' own pod phase
                Ok(phase == "Succeeded") // kubernetes' own pod phase
            })
            .await?;
        }
        Ok(())
    }

    /// What a looking-up client runs: its resolv.conf, then one `=== NAME` block per lookup
    /// (busybox nslookup asks resolv.conf's first nameserver unless given one).
    fn script(&self) -> String {
        let mut s = String::from("cat /etc/resolv.conf; echo ===\n");
        for q in [KUBERNETES, FULL_NAME, "probe"] {
            s += &format!("echo '=== {q}'; busybox nslookup {q} || echo LOOKUP-FAILED\n");
        }
        s += &format!(
            "echo '=== aaaa'; busybox nslookup -type=aaaa {FULL_NAME} || echo LOOKUP-FAILED\n"
        );
        for d in &self.dns {
            s += &format!(
                "echo '=== via {d}'; busybox nslookup {KUBERNETES} {d} || echo LOOKUP-FAILED\n"
            );
        }
        s
    }

    async fn log_of(&self, pod: &str) -> Result<String> {
        Ok(self.ns::<Pod>(NS).logs(pod, &LogParams::default()).await?)
    }

    /// A looking-up client's resolv.conf names the cluster DNS and every lookup answered as
    /// the Services say.
    fn check_client(&self, pod: &str, log: &str) -> Result<()> {
        let want_ns = format!("nameserver {}", self.dns[0]);
        ensure!(
            log.lines().any(|l| l.trim() == want_ns),
            "{pod}: resolv.conf has no {want_ns}: {log}"
        );
        let got = answers(log, KUBERNETES);
        ensure!(
            got == [self.kubernetes_ip.clone()],
            "{pod}: {KUBERNETES} -> {got:?}, want {}",
            self.kubernetes_ip
        );
        // busybox nslookup asks for A and AAAA: every ClusterIP of the Service.
        let all = sorted(self.probe_ips.clone());
        for q in [FULL_NAME, "probe"] {
            let got = answers(log, q);
            ensure!(got == all, "{pod}: {q} -> {got:?}, want {all:?}");
        }
        if let Some(v6) = self.probe_ips.get(1) {
            let got = answers(log, "aaaa");
            ensure!(
                got == [v6.clone()],
                "{pod}: AAAA {FULL_NAME} -> {got:?}, want {v6}"
            );
        }
        for d in &self.dns {
            let got = answers(log, &format!("via {d}"));
            ensure!(
                got == [self.kubernetes_ip.clone()],
                "{pod}: {KUBERNETES} via {d} -> {got:?}"
            );
        }
        ok(format!(
            "{pod}: kubernetes.default -> {}; probe (full and short name) -> {}; via {} alike",
            self.kubernetes_ip,
            self.probe_ips.join(" "),
            self.dns.join(" ")
        ));
        indent(log.split("\n===\n").next().unwrap_or_default());
        Ok(())
    }
}

/// A Service's ClusterIPs, in its order (IPv4 first on this cluster).
async fn service_ips(api: &kube::Api<Service>, name: &str) -> Result<Vec<String>> {
    let svc = k8s::get(api, name).await?;
    let Some(svc) = svc else {
        return fail(format!("no Service {name}"));
    };
    Ok(svc.spec.and_then(|s| s.cluster_ips).unwrap_or_default())
}
