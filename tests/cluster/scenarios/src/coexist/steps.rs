//! The coexistence scenario's steps, in the order of the module's list.

use std::collections::BTreeSet;
use std::time::Duration;

use h3_ingress::api::{reasons, Http3Listener};
use h3_ingress::operator::labels;
use h3_ingress::operator::resources::{cluster_rbac_name, data_plane_name};
use h3_ingress::operator::FIELD_MANAGER;
use h3i_scenarios::cmd::run as sh;
use h3i_scenarios::h3::{h3client, Target};
use h3i_scenarios::pods::{log_files, pid};
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{app, ensure, fail, indent, info, ok, Nginx, Pki, Result, Run};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::record::{now, one_value, Recorder};
use super::*;

fn dp_label() -> String {
    format!("{}={}", labels::COMPONENT, labels::COMPONENT_DATA_PLANE)
}

impl Coexist {
    /// What a previous run left goes; so must the operator objects of the scenarios before
    /// this one, which uninstall without waiting: their ClusterRole would make `helm install`
    /// refuse the default controller name, and their Lease is an operator with it.
    pub(super) async fn prepare(&mut self) -> Result<()> {
        let nss = self.all::<Namespace>();
        let crds = self.all::<CustomResourceDefinition>();
        let crd = h3_ingress::api::schema::CRD_NAME;
        let mut left = k8s::exists(&crds, crd).await?;
        for ns in [NS_A, NS_B, NS_APP] {
            left |= k8s::exists(&nss, ns).await?;
        }
        if left {
            info("removing what a previous run left");
            self.remove_objects(true).await;
            until(90, "the previous run's namespaces and CRD gone", || async {
                for ns in [NS_A, NS_B, NS_APP] {
                    if k8s::exists(&nss, ns).await? {
                        return Ok(false);
                    }
                }
                Ok(!k8s::exists(&crds, crd).await?)
            })
            .await?;
        }
        // `name=h3-ingress,component=operator`: every installation's operator objects (the
        // operator labels its Leases with the same pair).
        let sel = h3_ingress::operator::watches::operator_lease_selector();
        wait_ok(
            120,
            "no other installation's operator ClusterRole or Lease left",
            || async {
                let roles = k8s::names(&self.all::<ClusterRole>(), &sel).await?;
                let leases = Api::<Lease>::all(self.client.clone())
                    .list(&ListParams::default().labels(&sel))
                    .await?;
                ensure!(
                    roles.is_empty() && leases.items.is_empty(),
                    "ClusterRoles {roles:?}, {} Lease(s)",
                    leases.items.len()
                );
                Ok(true)
            },
        )
        .await
    }

    pub(super) async fn install_a_and_refuse_twin(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("release {RELEASE} in {NS_A} (controllerName {NAME_A}), then the same release name in {NS_B} with the same controllerName: refused by helm"));
        let a = self.install(NS_A, NAME_A).await?;
        ensure!(
            a.success(),
            "helm install in {NS_A}: {}{}",
            a.stdout,
            a.stderr
        );
        ok(format!("helm install -n {NS_A} --wait"));
        let twin = self.install(NS_B, NAME_A).await?;
        ensure!(
            !twin.success(),
            "a second release with controllerName {NAME_A} was installed"
        );
        let why = format!("controllerName \"{NAME_A}\" is already the controller name of release {RELEASE} in namespace {NS_A}");
        let said = format!("{}{}", twin.stdout, twin.stderr);
        let Some(at) = said.find(&why) else {
            return fail(format!(
                "the duplicate install failed for another reason: {said}"
            ));
        };
        ok(format!(
            "refused: {}",
            h3i_scenarios::cmd::head(&said[at..], 160)
        ));
        k8s::delete(&self.all::<Namespace>(), NS_B).await?;
        let nss = self.all::<Namespace>();
        until(60, &format!("namespace {NS_B} deleted"), || async {
            Ok(!k8s::exists(&nss, NS_B).await?)
        })
        .await?;
        Ok(())
    }

    pub(super) async fn install_b(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "release {RELEASE} in {NS_B} with controllerName {NAME_B}"
        ));
        let b = self.install(NS_B, NAME_B).await?;
        ensure!(
            b.success(),
            "helm install in {NS_B}: {}{}",
            b.stdout,
            b.stderr
        );
        for ns in [NS_A, NS_B] {
            let name = format!("{ns}.{RELEASE}-operator");
            let role = k8s::get(&self.all::<ClusterRole>(), &name).await?;
            let owner = role
                .and_then(|r| {
                    r.annotations()
                        .get("meta.helm.sh/release-namespace")
                        .cloned()
                })
                .unwrap_or_default();
            ensure!(
                owner == ns,
                "ClusterRole {name} is not release {ns}'s ({owner:?})"
            );
        }
        let pcs = k8s::names(&self.all::<PriorityClass>(), "").await?;
        let ours = pcs.iter().filter(|n| n.contains("h3i-co-")).count();
        ok(format!("ClusterRole(Binding) {NS_A}.{RELEASE}-operator and {NS_B}.{RELEASE}-operator, PriorityClasses {ours} (one per release)"));
        Ok(())
    }

    pub(super) async fn application(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("nginx on TCP 443 of both nodes for {HOST_A} and {HOST_B}; listener {LISTENER_A} (UDP {PORT_A}, {NAME_A}) and {LISTENER_B} (UDP {PORT_B}, {NAME_B})"));
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-coexist-ca")?;
        let (a, b) = (pki.leaf(HOST_A, HOST_A)?, pki.leaf(HOST_B, HOST_B)?);
        let nginx = Nginx::new(&self.tmp, app::ALT_SVC, "");
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-coexist.") {
                info(format!(
                    "stopped a previous run's nginx (pid {pid}) in {node}"
                ));
            }
            nginx.start(node, &[(HOST_A, &a), (HOST_B, &b)]).await?;
        }
        self.nginx = Some(nginx);
        let c = &self.client;
        app::namespace(c, NS_APP, &[]).await?;
        app::tls_secret(c, NS_APP, "a-tls", &a).await?;
        app::tls_secret(c, NS_APP, "b-tls", &b).await?;
        app::ingress_class(c, "co-a", "example.com/h3i-co-a").await?;
        app::ingress_class(c, "co-b", "example.com/h3i-co-b").await?;
        app::ingress(c, NS_APP, "a", "co-a", HOST_A, "a-tls").await?;
        app::ingress(c, NS_APP, "b", "co-b", HOST_B, "b-tls").await?;
        let common =
            json!({"upstream": {"address": "127.0.0.1:443"}, "http": {"drainTimeoutSeconds": 10}});
        let mut spec_a = json!({"ingressClassName": "co-a", "port": PORT_A});
        let mut spec_b = json!({"controllerName": NAME_B, "ingressClassName": "co-b", "port": PORT_B,
            "metrics": {"address": "0.0.0.0:9486"}});
        for spec in [&mut spec_a, &mut spec_b] {
            if let (Some(s), Some(more)) = (spec.as_object_mut(), common.as_object()) {
                s.extend(more.clone());
            }
        }
        app::listener(c, LISTENER_A, spec_a).await?;
        app::listener(c, LISTENER_B, spec_b).await?;
        for l in [LISTENER_A, LISTENER_B] {
            let what = format!("{l} Ready=True/{}", reasons::ALL_HOSTS_SERVING);
            wait_ok(150, &what, || {
                self.ready_is(l, "True", reasons::ALL_HOSTS_SERVING)
            })
            .await?;
        }
        let ips = self.env.ips.join(" ");
        for (host, port) in [(HOST_A, PORT_A), (HOST_B, PORT_B)] {
            let what = format!("{host} over HTTP/3 on UDP {port} of {ips}");
            wait_ok(60, &what, || self.served(host, port)).await?;
        }
        indent(sh("kubectl", &["get", "h3l", "-o", "wide"]).await?);
        Ok(())
    }

    pub(super) async fn own_objects(&mut self, run: &mut Run) -> Result<()> {
        run.step("each installation ran only its own listener: DaemonSets, ClusterRole(Binding)s");
        let dss = Api::<DaemonSet>::all(self.client.clone())
            .list(&ListParams::default().labels(&dp_label()))
            .await?;
        let mut got: Vec<String> = dss
            .iter()
            .map(|d| format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any()))
            .collect();
        got.sort();
        let want = vec![
            format!("{NS_A}/{}", data_plane_name(LISTENER_A)),
            format!("{NS_B}/{}", data_plane_name(LISTENER_B)),
        ];
        ensure!(got == want, "data plane DaemonSets: {got:?}, want {want:?}");
        let managed = format!("{}={}", labels::MANAGED_BY, labels::MANAGED_BY_VALUE);
        let mut roles = k8s::names(&self.all::<ClusterRole>(), &managed).await?;
        roles.sort();
        let want_roles = vec![
            cluster_rbac_name(LISTENER_A, NS_A),
            cluster_rbac_name(LISTENER_B, NS_B),
        ];
        ensure!(
            roles == want_roles,
            "data plane ClusterRoles: {roles:?}, want {want_roles:?}"
        );
        let bindings = k8s::list(&self.all::<ClusterRoleBinding>(), &managed).await?;
        let mut got_b: Vec<String> = bindings
            .iter()
            .map(|b| {
                let ns = b
                    .subjects
                    .as_ref()
                    .and_then(|s| s.first()?.namespace.clone());
                format!("{}={}", b.name_any(), ns.unwrap_or_default())
            })
            .collect();
        got_b.sort();
        let want_b = vec![
            format!("{}={NS_A}", want_roles[0]),
            format!("{}={NS_B}", want_roles[1]),
        ];
        ensure!(got_b == want_b, "data plane ClusterRoleBindings: {got_b:?}");
        ok(format!("DaemonSets {got:?}; ClusterRoleBindings {got_b:?}"));
        for l in [LISTENER_A, LISTENER_B] {
            let obj = k8s::get(&self.all::<Http3Listener>(), l).await?;
            let managers: BTreeSet<String> = obj
                .and_then(|o| o.metadata.managed_fields)
                .unwrap_or_default()
                .into_iter()
                .filter(|m| m.subresource.as_deref() == Some("status"))
                .filter_map(|m| m.manager)
                .collect();
            let want = BTreeSet::from([FIELD_MANAGER.to_string()]);
            ensure!(managers == want, "{l}'s status written by {managers:?}");
        }
        ok(format!(
            "each listener's status has one writer (field manager {FIELD_MANAGER})"
        ));
        Ok(())
    }

    /// Warning events on listeners, each with its counts and uid: the start-up ones are there
    /// already; none may be added or repeated from here on.
    async fn listener_warnings(&self) -> Result<BTreeSet<String>> {
        let lp = ListParams::default().fields("involvedObject.kind=Http3Listener,type=Warning");
        let events = Api::<Event>::all(self.client.clone()).list(&lp).await?;
        Ok(events
            .iter()
            .map(|e| {
                let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(0);
                format!(
                    "{} {} {}/{series} {}",
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.count.unwrap_or(0),
                    e.uid().unwrap_or_default()
                )
            })
            .collect())
    }

    pub(super) async fn side_by_side(&mut self, run: &mut Run) -> Result<()> {
        let secs = self.side_by_side;
        run.step(format!("side by side for {secs}s: both listeners' conditions every second, HTTP/3 to both every 15 s"));
        let before = self.listener_warnings().await?;
        self.t_side = now();
        for l in [LISTENER_A, LISTENER_B] {
            self.recorders
                .push(Recorder::start(self.all::<Http3Listener>(), l));
        }
        self.pods_a = self.pods_of_a().await?;
        let (mut rounds, mut failed) = (0, Vec::new());
        while now() < self.t_side + secs {
            for ip in &self.env.ips {
                for (host, port) in [(HOST_A, PORT_A), (HOST_B, PORT_B)] {
                    let t = Target {
                        addr: ip,
                        host,
                        port,
                        path: "/whoami",
                        cacert: &self.ca,
                    };
                    let status = aioquic(&t).await.ok().and_then(|a| a.status);
                    if status != Some(200) {
                        let at = now() - self.t_side;
                        failed.push(format!("+{at}s {host}@{ip}:{port} ({status:?})"));
                    }
                }
            }
            rounds += 1;
            tokio::time::sleep(Duration::from_secs(15)).await;
        }
        self.recorders[1].stop();
        ensure!(
            failed.is_empty(),
            "HTTP/3 requests failed side by side: {failed:?}"
        );
        let requests = rounds * 2 * self.env.ips.len();
        ok(format!(
            "{requests} HTTP/3 requests in {rounds} rounds over {}s: all 200",
            now() - self.t_side
        ));
        for (r, l) in self.recorders.iter().zip([LISTENER_A, LISTENER_B]) {
            let (lines, held) = one_value(&r.snapshot(), self.t_side);
            if !held {
                lines.iter().for_each(indent);
                return fail(format!("{l}'s conditions changed side by side"));
            }
            ok(format!("{l}: {}: {}", lines[0], lines[lines.len() - 1]));
        }
        let after = self.listener_warnings().await?;
        let new: Vec<&String> = after.difference(&before).collect();
        ensure!(
            new.is_empty(),
            "Warning events on the listeners side by side: {new:?}"
        );
        ok(format!(
            "no Warning event on either listener side by side ({} from their start-up, none since)",
            before.len()
        ));
        Ok(())
    }

    /// Lines of a container's log files naming a 403 or Forbidden; fails without a file.
    async fn forbidden_lines(
        &self,
        ns: &str,
        pod: &str,
        container: &str,
    ) -> Result<(usize, Vec<String>)> {
        let files = log_files(&self.env, &self.ns::<Pod>(ns), ns, pod, container).await?;
        ensure!(!files.is_empty(), "no log file of {ns}/{pod}");
        let (mut total, mut bad) = (0, Vec::new());
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for line in text.lines() {
                total += 1;
                let lower = line.to_ascii_lowercase();
                let word_403 = lower
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .any(|w| w == "403");
                if lower.contains("forbidden") || word_403 {
                    bad.push(line.to_string());
                }
            }
        }
        Ok((total, bad))
    }

    pub(super) async fn logs_clean(&mut self, run: &mut Run) -> Result<()> {
        run.step("no 403/Forbidden line in either data plane's log (nor the operators')");
        for ns in [NS_A, NS_B] {
            let mut pods: Vec<(String, &str)> = self
                .dp_pods(ns)
                .await?
                .iter()
                .map(|p| (p.name_any(), DP_CONTAINER))
                .collect();
            let ops = k8s::names(&self.ns::<Pod>(ns), &app::op_selector()).await?;
            let op = ops.first().cloned().unwrap_or_default();
            pods.push((op, "operator"));
            for (pod, container) in pods {
                let (total, bad) = self.forbidden_lines(ns, &pod, container).await?;
                ensure!(
                    bad.is_empty(),
                    "{ns}/{pod} ({container}) logged {} 403/Forbidden line(s): {:?}",
                    bad.len(),
                    &bad[..bad.len().min(3)]
                );
                info(format!(
                    "{ns}/{pod} ({container}): {total} log lines, 0 with 403/Forbidden"
                ));
            }
        }
        ok("no data plane or operator log has a 403/Forbidden line");
        Ok(())
    }

    /// `runAsUser` of a pod's first container (`-` when unset).
    fn run_as_user(p: &Pod) -> String {
        let c = p.spec.as_ref().and_then(|s| s.containers.first());
        let uid = c.and_then(|c| c.security_context.as_ref()?.run_as_user);
        uid.map_or("-".into(), |u| u.to_string())
    }

    pub(super) async fn force_buffers_roll(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("socket.forceBuffers on {LISTENER_B} (UDP {PORT_B}): the surge roll completes under one uid"));
        let old = self.dp_pods(NS_B).await?;
        let old_names: Vec<String> = old.iter().map(|p| p.name_any()).collect();
        let uid_before = old.first().map(Self::run_as_user).unwrap_or_default();
        let t_roll = now();
        let patch = json!({"spec": {"socket": {"forceBuffers": true}}});
        k8s::merge(&self.all::<Http3Listener>(), LISTENER_B, &patch).await?;
        let pods = self.ns::<Pod>(NS_B);
        let what = format!(
            "the old pods ({}) replaced by two Ready pods",
            old_names.join(" ")
        );
        wait_ok(180, &what, || async {
            for p in &old_names {
                if k8s::exists(&pods, p).await? {
                    return Ok(false);
                }
            }
            let now = self.dp_pods(NS_B).await?;
            Ok(now.iter().filter(|p| app::pod_ready(p)).count() == 2)
        })
        .await?;
        let new = self.dp_pods(NS_B).await?;
        for p in &new {
            let (pod, uid) = (p.name_any(), Self::run_as_user(p));
            ensure!(
                uid == "0" && uid_before == "0",
                "{pod} runs as uid {uid} (the old pods as {uid_before}): one uid for the data plane"
            );
            let pid = pid(&self.env, &pods, NS_B, &pod, DP_CONTAINER).await?;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let cap = status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
            ensure!(
                cap == Some(1 << 12),
                "{pod} (pid {pid}): CapEff {cap:x?}, want NET_ADMIN alone (0x1000)"
            );
            info(format!(
                "{pod} on {}: uid 0, CapEff 0x1000 (NET_ADMIN)",
                app::node_of(p)
            ));
        }
        let what = format!("{HOST_B} over HTTP/3 on UDP {PORT_B}");
        wait_ok(60, &what, || self.served(HOST_B, PORT_B)).await?;
        let new_names: Vec<String> = new.iter().map(|p| p.name_any()).collect();
        ok(format!(
            "rolled in {}s: {} -> {}, uid {uid_before} before and after",
            now() - t_roll,
            old_names.join(" "),
            new_names.join(" ")
        ));
        Ok(())
    }

    /// Nothing of B's release left: pods, data plane objects, cluster-scoped objects, Lease,
    /// its UDP port.
    async fn nothing_of_b_left(&self) -> Result<()> {
        let sel = dp_label();
        let pods = k8s::names(&self.ns::<Pod>(NS_B), &sel).await?;
        ensure!(pods.is_empty(), "data plane pods left in {NS_B}: {pods:?}");
        let mut objs = k8s::names(&self.ns::<DaemonSet>(NS_B), &sel).await?;
        objs.extend(k8s::names(&self.ns::<ServiceAccount>(NS_B), &sel).await?);
        objs.extend(k8s::names(&self.ns::<Service>(NS_B), &sel).await?);
        ensure!(
            objs.is_empty(),
            "data plane objects left in {NS_B}: {objs:?}"
        );
        let prefix = format!("{NS_B}.");
        let mut cluster = k8s::names(&self.all::<ClusterRole>(), "").await?;
        cluster.extend(k8s::names(&self.all::<ClusterRoleBinding>(), "").await?);
        cluster.extend(k8s::names(&self.all::<PriorityClass>(), "").await?);
        cluster.retain(|n| n.starts_with(&prefix));
        ensure!(
            cluster.is_empty(),
            "cluster-scoped objects of {NS_B} left: {cluster:?}"
        );
        let leases = k8s::names(&self.ns::<Lease>(NS_B), "").await?;
        ensure!(leases.is_empty(), "Lease left in {NS_B}: {leases:?}");
        let holders = self.udp_holders(PORT_B).await?;
        ensure!(holders.is_empty(), "UDP {PORT_B} still held: {holders:?}");
        ok(format!("no pod, DaemonSet, ServiceAccount, ClusterRole(Binding), PriorityClass or Lease of {NS_B}; nothing bound to UDP {PORT_B} on {}", self.env.nodes.join(" ")));
        Ok(())
    }

    pub(super) async fn uninstall_b(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("helm uninstall of {NS_B}: its data plane, RBAC and Lease gone, UDP {PORT_B} free; {LISTENER_A} untouched"));
        let t_un = now();
        let args = [
            "uninstall",
            RELEASE,
            "-n",
            NS_B,
            "--wait",
            "--timeout",
            "300s",
        ];
        sh("helm", &args).await?;
        ok(format!(
            "helm uninstall -n {NS_B} returned after {}s",
            now() - t_un
        ));
        self.nothing_of_b_left().await?;
        let what = format!("{LISTENER_B} Ready=False/{}", reasons::NO_CONTROLLER);
        wait_ok(60, &what, || {
            self.ready_is(LISTENER_B, "False", reasons::NO_CONTROLLER)
        })
        .await?;
        let c = k8s::condition(&self.client, LISTENER_B, conditions::READY).await?;
        let message = c.map(|c| c.message).unwrap_or_default();
        info(format!(
            "{LISTENER_B}: {}",
            h3i_scenarios::cmd::head(&message, 200)
        ));
        self.recorders[0].stop();
        let (lines, held) = one_value(&self.recorders[0].snapshot(), self.t_side);
        if !held {
            lines.iter().for_each(indent);
            return fail(format!("{LISTENER_A}'s conditions changed from the side-by-side start through B's uninstall"));
        }
        ok(format!(
            "{LISTENER_A} from the side-by-side start through B's roll and uninstall: {}",
            lines[0]
        ));
        let pods_a = self.pods_of_a().await?;
        ensure!(
            pods_a == self.pods_a,
            "{LISTENER_A}'s pods changed: {pods_a:?}, were {:?}",
            self.pods_a
        );
        ok(format!(
            "{LISTENER_A}'s pods unchanged (same names and UIDs): {}",
            pods_a.join("; ")
        ));
        for ip in &self.env.ips {
            let t = Target {
                addr: ip,
                host: HOST_A,
                port: PORT_A,
                path: "/whoami",
                cacert: &self.ca,
            };
            let rep = h3client(&t, &[]).await?;
            let status = rep["requests"][0]["status"].as_u64();
            ensure!(
                status == Some(200),
                "h3client to {HOST_A} on {ip}: status {status:?}"
            );
        }
        ok(format!(
            "{HOST_A} still served over HTTP/3 (h3client.py, 200) on {}",
            self.env.ips.join(" ")
        ));
        indent(sh("kubectl", &["get", "h3l", "-o", "wide"]).await?);
        Ok(())
    }
}
