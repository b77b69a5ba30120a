//! The smoke: the test cluster of `scripts/cluster.sh` works end to end: control plane up,
//! both nodes Ready, a hostNetwork DaemonSet of the project's image running the current binary
//! on both nodes (env, volumes, readiness probe, the pod's ServiceAccount token), a Deployment
//! pod in its own network namespace, container restarts, logs through the kubelet API, Pod
//! Security admission, an API server restart that the pods survive, node and pod status
//! restored after others overwrote it, and garbage collection of the pods when the DaemonSet
//! goes. `H3I_SMOKE_KEEP=1` leaves a cluster it brought up running afterwards.

mod pods;

use std::collections::BTreeMap;
use std::path::PathBuf;

use h3i_scenarios::cmd::repo;
use h3i_scenarios::env::cluster;
use h3i_scenarios::k8s;
use h3i_scenarios::poll::until;
use h3i_scenarios::{ensure, indent, ok, Env, Pki, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Secret, ServiceAccount};
use kube::{Api, Client};
use serde_json::json;

use crate::FromEnv;

const NS: &str = "h3i-smoke";
const NS_RESTRICTED: &str = "h3i-smoke-restricted";
const HOST: &str = "smoke.h3i.test";

/// The run's state: the cluster, its scratch directory, the DaemonSet's processes.
pub struct Smoke {
    env: Env,
    client: Client,
    tmp: PathBuf,
    /// Smoke pod name to its process.
    pod_pid: BTreeMap<String, u32>,
}

impl FromEnv for Smoke {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-smoke").unwrap_or_else(|_| "/tmp/h3i-smoke".into());
        Smoke {
            env,
            client,
            tmp,
            pod_pid: BTreeMap::new(),
        }
    }
}

impl Scenario for Smoke {
    const TITLE: &'static str = "SMOKE";

    fn namespace(&self) -> &str {
        NS
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        ok(format!(
            "cluster was already up: {}",
            u8::from(self.env.was_up)
        ));
        self.agent_tests(run).await?;
        self.up_again(run).await?;
        self.nodes(run).await?;
        self.objects(run).await?;
        self.daemonset(run).await?;
        self.token(run).await?;
        self.logs(run).await?;
        self.deployment(run).await?;
        self.crasher(run).await?;
        self.pod_security(run).await?;
        self.apiserver_restart(run).await?;
        self.status_restored(run).await?;
        self.garbage_collection(run).await?;
        run.step("done");
        Ok(())
    }

    async fn cleanup(&mut self) {
        let _ = std::fs::remove_dir_all(&self.tmp);
        for n in [NS, NS_RESTRICTED] {
            let _ = k8s::delete(&self.all::<Namespace>(), n).await;
        }
        let keep = std::env::var("H3I_SMOKE_KEEP").is_ok_and(|v| v == "1");
        if !self.env.was_up && !keep {
            match cluster(&["down"]).await {
                Ok(out) => indent(out),
                Err(e) => eprintln!("scripts/cluster.sh down: {e}"),
            }
        }
    }
}

impl Smoke {
    fn ns<K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>>(
        &self,
        ns: &str,
    ) -> Api<K> {
        Api::namespaced(self.client.clone(), ns)
    }

    fn all<K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>>(
        &self,
    ) -> Api<K> {
        Api::all(self.client.clone())
    }

    /// Who runs the pods, for the step titles.
    fn node_daemon(&self) -> &'static str {
        if self.env.real_nodes {
            "kubelet"
        } else {
            "agent"
        }
    }

    async fn agent_tests(&mut self, run: &mut Run) -> Result<()> {
        run.step("node agent unit tests (go test, with the cluster's module and build cache)");
        let cache =
            std::env::var("H3I_CLUSTER_CACHE").unwrap_or_else(|_| "/var/cache/h3-ingress".into());
        let dir = repo().join("tests/cluster/agent");
        let script = format!(
            "cd {} && GOMODCACHE={cache}/gomod GOCACHE={cache}/gocache GOFLAGS=-mod=readonly GOTOOLCHAIN=local nice -n 10 go test -trimpath -count=1 -v ./... 2>&1",
            dir.display()
        );
        let out = h3i_scenarios::cmd::output("bash", &["-c", &script]).await?;
        let lines: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| {
                ["--- ", "ok", "FAIL", "PASS"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .collect();
        for l in &lines {
            println!("    {l}");
        }
        ensure!(out.success(), "agent unit tests: exit {:?}", out.status);
        Ok(())
    }

    async fn up_again(&mut self, run: &mut Run) -> Result<()> {
        run.step("up again is a no-op health check");
        let t0 = std::time::Instant::now();
        let out = cluster(&["up"]).await?;
        indent(&out);
        ensure!(
            out.contains("already up and healthy"),
            "second up did not report an existing healthy cluster"
        );
        ok(format!("second up: {}s", t0.elapsed().as_secs()));
        let status = cluster(&["status"])
            .await
            .map_err(|e| h3i_scenarios::Error::Check(format!("status reports a problem: {e}")))?;
        indent(status);
        Ok(())
    }

    async fn nodes(&mut self, run: &mut Run) -> Result<()> {
        run.step("nodes Ready, labelled, with their namespace addresses");
        ensure!(
            self.env.nodes.len() == 2,
            "H3I_NODES should name two nodes: {:?}",
            self.env.nodes
        );
        for (i, n) in self.env.nodes.iter().enumerate() {
            let node = self.all::<Node>().get(n).await?;
            let st = node.status.clone().unwrap_or_default();
            let conds = st.conditions.unwrap_or_default();
            let ready = conds
                .iter()
                .find(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY)
                .map(|c| c.status.clone())
                .unwrap_or_default();
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let (os, host) = (
                labels.get("kubernetes.io/os").cloned().unwrap_or_default(),
                labels
                    .get("kubernetes.io/hostname")
                    .cloned()
                    .unwrap_or_default(),
            );
            let addrs: Vec<String> = st
                .addresses
                .iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP")
                .map(|a| a.address.clone())
                .collect();
            let want = [self.env.ips[i].clone(), self.env.ips6[i].clone()];
            ensure!(
                ready == "True" && os == "linux" && &host == n && addrs == want,
                "node {n}: Ready={ready} os={os} hostname={host} InternalIP={}",
                addrs.join(" ")
            );
            let eth0 =
                h3i_scenarios::cmd::netns(n, "ip", &["-o", "addr", "show", "dev", "eth0"]).await?;
            ensure!(
                eth0.contains(&format!("inet {}/", self.env.ips[i])),
                "netns {n} lacks {}",
                self.env.ips[i]
            );
            // A kubelet reports Ready a moment before its lease controller has created the
            // lease (seen once: the second node Ready 8 s after registering, no lease yet).
            let leases = self.ns::<Lease>("kube-node-lease");
            let what = format!("{n}'s Lease in kube-node-lease");
            until(30, &what, || async { k8s::exists(&leases, n).await }).await?;
            let lease = leases.get(n).await?;
            let renew = lease
                .spec
                .and_then(|s| s.renew_time)
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            ok(format!(
                "{n} Ready, os=linux, InternalIP {}, lease {renew}",
                addrs.join(" ")
            ));
        }
        Ok(())
    }

    async fn objects(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "namespace (pod-security enforce=privileged), ServiceAccount, TLS Secret, ConfigMap",
        );
        // A previous run deletes its namespaces without waiting; a new one cannot create
        // objects in a namespace that is still terminating.
        let nss = self.all::<Namespace>();
        let _ = until(120, "the previous run's namespaces deleted", || async {
            Ok(!k8s::exists(&nss, NS).await? && !k8s::exists(&nss, NS_RESTRICTED).await?)
        })
        .await;
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        k8s::apply(&nss, NS, &ns).await?;
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "smoke", "namespace": NS}});
        k8s::apply(&self.ns::<ServiceAccount>(NS), "smoke", &sa).await?;
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-smoke-ca")?;
        let leaf = pki.leaf("tls", HOST)?;
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": "smoke-tls", "namespace": NS},
            "stringData": {"tls.crt": read(&leaf.crt), "tls.key": read(&leaf.key)}});
        k8s::apply(&self.ns::<Secret>(NS), "smoke-tls", &secret).await?;
        let config = "port: 8443\naddresses: {ipv4: \"0.0.0.0\", ipv6: \"::\"}\nupstream: {address: \"127.0.0.1:9443\"}\n\
            metrics: {address: \"0.0.0.0:9476\"}\nhosts:\n  - name: smoke.h3i.test\n    certFile: /etc/h3i-smoke/tls/tls.crt\n    \
            keyFile: /etc/h3i-smoke/tls/tls.key\n";
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "smoke-config", "namespace": NS},
            "data": {"config.yaml": config}});
        k8s::apply(&self.ns::<ConfigMap>(NS), "smoke-config", &cm).await?;
        ok("created");
        Ok(())
    }

    async fn ds_ready(&self) -> Result<bool> {
        let ds = k8s::get(&self.ns::<DaemonSet>(NS), "smoke").await?;
        Ok(ds
            .and_then(|d| d.status)
            .is_some_and(|s| s.number_ready == 2))
    }

    async fn token(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "the pod's ServiceAccount token (TokenRequest bound to the pod) in its KUBECONFIG",
        );
        let (pod, pid) = self
            .pod_pid
            .iter()
            .next()
            .map(|(p, pid)| (p.clone(), *pid))
            .unwrap_or_default();
        let kc = h3i_scenarios::pods::kubeconfig(
            &self.env,
            NS,
            &pod,
            pid,
            &self.tmp.join(format!("{pod}.kubeconfig")),
        )?;
        let who = h3i_scenarios::pods::whoami(kc.clone()).await?;
        let bound = who
            .extra
            .as_ref()
            .and_then(|e| e.get("authentication.kubernetes.io/pod-name"))
            .and_then(|v| v.first().cloned())
            .unwrap_or_default();
        let who = format!("{} {bound}", who.username.unwrap_or_default());
        ensure!(
            who == format!("system:serviceaccount:{NS}:smoke {pod}"),
            "auth whoami with the pod kubeconfig: '{who}'"
        );
        ok(format!("auth whoami (SelfSubjectReview): {who}"));
        let may = h3i_scenarios::pods::can_i(kc, "list", "secrets", NS).await?;
        ensure!(!may, "the smoke ServiceAccount may list secrets?");
        ok("and it holds no extra rights (cannot list secrets)");
        Ok(())
    }

    async fn logs(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "container logs: files on the node and the kubelet API's logs (served by the {})",
            self.node_daemon()
        ));
        let pod = self.pod_pid.keys().next().cloned().unwrap_or_default();
        let api = self.ns::<k8s_openapi::api::core::v1::Pod>(NS);
        let files = h3i_scenarios::pods::log_files(&self.env, &api, NS, &pod, "proxy").await?;
        let file = files.last().cloned().unwrap_or_default();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        ensure!(!text.is_empty(), "{} is empty", file.display());
        let lp = kube::api::LogParams {
            container: Some("proxy".into()),
            ..Default::default()
        };
        let lines = api.logs(&pod, &lp).await?.lines().count();
        ensure!(lines >= 1, "the logs API returned nothing");
        ok(format!(
            "{} has {} lines; the logs API (kubectl logs) returned {lines}",
            file.display(),
            text.lines().count()
        ));
        Ok(())
    }
}
