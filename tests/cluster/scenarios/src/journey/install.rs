//! The journey's first half: helm install, the CRD and the operator, nginx on each node, the
//! application's objects, the listener and what it owns, the data plane pods.

use h3_ingress::api::mirror;
use h3_ingress::api::Http3Listener;
use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::k8s;
use h3i_scenarios::k8s::Apis;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{ensure, expect_eq, fail, info, ok, pods, Pki, Result, Run};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use serde_json::json;

use super::*;

const CRD: &str = "http3listeners.h3-ingress.dev";

impl Journey {
    /// What a kept or interrupted journey left (objects, nginx) would confuse every check.
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.binary.exists(),
            "H3I_BINARY={} does not exist (cargo build first)",
            self.env.binary.display()
        );
        let trixie = h3::trixie_root();
        ensure!(
            trixie.join("usr/bin/curl").exists(),
            "no trixie chroot with curl at {0}: scripts/trixie-chroot.sh {0}",
            trixie.display()
        );
        let ns = self.all::<Namespace>();
        let left = k8s::exists(&ns, NS_OP).await? || k8s::exists(&ns, NS_APP).await?;
        if left || k8s::exists(&self.all::<CustomResourceDefinition>(), CRD).await? {
            info("removing a previous journey's objects");
            self.remove_objects(true).await;
            for n in [NS_APP, NS_OP] {
                until(90, &format!("namespace {n} deleted"), || async {
                    Ok(!k8s::exists(&ns, n).await?)
                })
                .await?;
            }
        }
        k8s::delete(
            &self.all::<k8s_openapi::api::networking::v1::IngressClass>(),
            "nginx",
        )
        .await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-journey.") {
                info(format!(
                    "stopping a previous journey's nginx in {node} (pid {pid})"
                ));
            }
        }
        let version = output(&self.env.binary.to_string_lossy(), &["--version"])
            .await?
            .stdout;
        ok(format!(
            "binary {} ({}), trixie curl in {}",
            self.env.binary.display(),
            version.trim(),
            trixie.display()
        ));
        Ok(())
    }

    /// Deletes the listeners, the release, the namespaces, the CRD and IngressClass nginx
    /// (waiting for the release and the listeners when `wait`); never fails.
    pub(super) async fn remove_objects(&self, wait: bool) {
        let ls = self.all::<Http3Listener>();
        for l in k8s::names(&ls, "").await.unwrap_or_default() {
            let _ = k8s::delete(&ls, &l).await;
        }
        if wait {
            let _ = until(60, "listeners deleted", || async {
                Ok(k8s::names(&ls, "").await?.is_empty())
            })
            .await;
        }
        let w = if wait { "--wait" } else { "--wait=false" };
        let _ = output("helm", &["uninstall", RELEASE, "-n", NS_OP, w]).await;
        for n in [NS_APP, NS_OP] {
            let _ = k8s::delete(&self.all::<Namespace>(), n).await;
        }
        let _ = k8s::delete(&self.all::<CustomResourceDefinition>(), CRD).await;
        let _ = k8s::delete(
            &self.all::<k8s_openapi::api::networking::v1::IngressClass>(),
            "nginx",
        )
        .await;
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install the chart (image {IMAGE_REPO} = {}, a pull secret)",
            self.env.image_source()
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_OP,
            // README: the data plane is hostNetwork, so its namespace must allow privileged pods.
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        k8s::apply(&self.all::<Namespace>(), NS_OP, &ns).await?;
        // The agent never pulls; real nodes pull from the cluster's registry with its credentials.
        let (user, password) = if self.env.real_nodes {
            let p = std::fs::read_to_string(&self.env.registry_password_file).unwrap_or_default();
            (self.env.registry_user.clone(), p.trim().to_string())
        } else {
            ("journey".to_string(), "not-a-real-one".to_string())
        };
        self.pull_secret(&user, &password).await?;
        let t0 = std::time::Instant::now();
        let chart = repo().join("charts/h3-ingress");
        let chart = chart.to_string_lossy();
        let repo_set = format!("image.repository={IMAGE_REPO}");
        let args = [
            "install",
            RELEASE,
            &chart,
            "-n",
            NS_OP,
            "--set",
            &repo_set,
            "--set",
            "imagePullSecrets[0].name=regcred",
            "--wait",
            "--timeout",
            "120s",
        ];
        sh("helm", &args)
            .await
            .map_err(|e| h3i_scenarios::Error::Check(format!("helm install: {e}")))?;
        let list: serde_json::Value =
            serde_json::from_str(&sh("helm", &["list", "-n", NS_OP, "-o", "json"]).await?)
                .map_err(|source| h3i_scenarios::Error::Json {
                    context: "helm list".into(),
                    source,
                })?;
        let r = &list[0];
        let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
        ok(format!(
            "helm install --wait: {}s; {} {} app {} {}",
            t0.elapsed().as_secs(),
            s("name"),
            s("chart"),
            s("app_version"),
            s("status")
        ));
        let chart_yaml = std::fs::read_to_string(repo().join("charts/h3-ingress/Chart.yaml"))
            .unwrap_or_default();
        self.app_version = chart_yaml
            .lines()
            .find_map(|l| l.strip_prefix("appVersion:"))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_default();
        self.operator_runs(run).await
    }

    async fn pull_secret(&self, user: &str, password: &str) -> Result<()> {
        let api = self.ns::<Secret>(NS_OP);
        k8s::pull_secret(&api, "regcred", "registry.h3i.test", user, password).await?;
        Ok(())
    }

    async fn operator_runs(&mut self, run: &mut Run) -> Result<()> {
        run.step("the CRD is established, the operator pod runs the binary and holds the Lease");
        let crds = self.all::<CustomResourceDefinition>();
        until(30, &format!("CRD {CRD} Established"), || async {
            let c = k8s::get(&crds, CRD).await?;
            let conds = c
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .unwrap_or_default();
            Ok(conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True"))
        })
        .await?;
        let crd = crds.get(CRD).await?;
        let names = &crd.spec.names;
        ok(format!(
            "crd/{CRD} Established; kind {} short name {}",
            names.kind,
            names.short_names.clone().unwrap_or_default().join(",")
        ));
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap_or_default();
        let c = &schema["openAPIV3Schema"]["properties"]["status"]["properties"]["conditions"];
        let got = format!(
            "{}/{}",
            c["x-kubernetes-list-type"].as_str().unwrap_or(""),
            c["x-kubernetes-list-map-keys"]
        );
        expect_eq(
            "status.conditions should be a list map keyed by type",
            "map/[\"type\"]",
            &got,
        )?;
        ok("status.conditions: x-kubernetes-list-type map keyed by type (as served by the API server)");
        let sel = format!(
            "{}={}",
            h3_ingress::operator::labels::COMPONENT,
            h3_ingress::operator::labels::COMPONENT_OPERATOR
        );
        let Some(op) = k8s::names(&self.ns::<Pod>(NS_OP), &sel)
            .await?
            .into_iter()
            .next()
        else {
            return fail("no operator pod");
        };
        self.op_pod = op.clone();
        let p = self.ns::<Pod>(NS_OP).get(&op).await?;
        let st = p.status.clone().unwrap_or_default();
        let phase = st.phase.unwrap_or_default();
        let ready = st
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY)
            .map(|c| c.status.clone())
            .unwrap_or_default();
        let spec = p.spec.clone().unwrap_or_default();
        let image = spec.containers[0].image.clone().unwrap_or_default();
        let pull = spec
            .image_pull_secrets
            .iter()
            .flatten()
            .next()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        ensure!(
            phase == "Running" && ready == "True",
            "operator pod {op}: phase {phase} Ready {ready}"
        );
        let want = format!("{IMAGE_REPO}:{}", self.app_version);
        ensure!(
            image == want,
            "operator image {image}, want {want} (the chart's appVersion)"
        );
        expect_eq("operator pod imagePullSecrets", "regcred", pull.as_str())?;
        let pid = pods::pid(&self.env, &self.ns::<Pod>(NS_OP), NS_OP, &op, "operator").await?;
        ensure!(
            pods::exe_of(pid) == pods::exe(&self.env),
            "operator pid {pid} runs {}, not {}",
            pods::exe_of(pid).display(),
            self.env.binary.display()
        );
        ok(format!(
            "{op} Running and Ready, image {image}, imagePullSecrets regcred, pid {pid} = {} {}",
            self.env.binary.display(),
            pods::args_of(pid)
        ));
        until(
            30,
            &format!("the operator holds Lease {NS_OP}/{LEASE}"),
            || async { Ok(self.leader_pod().await?.as_deref() == Some(op.as_str())) },
        )
        .await?;
        let lease = self
            .ns::<k8s_openapi::api::coordination::v1::Lease>(NS_OP)
            .get(LEASE)
            .await?;
        ok(format!(
            "Lease {NS_OP}/{LEASE} held by {}",
            lease
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default()
        ));
        Ok(())
    }

    pub(super) async fn tcp_ingress(&mut self, run: &mut Run) -> Result<()> {
        let v = output("nginx", &["-v"]).await?.stderr;
        run.step(format!(
            "the TCP ingress: Debian nginx {} on TCP 443 in each node's namespace",
            v.trim().rsplit('/').next().unwrap_or("?")
        ));
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-journey-ca")?;
        let v1 = pki.leaf(HOST, HOST)?;
        let v2 = pki.leaf(&format!("{HOST}.v2"), HOST)?;
        let h2 = pki.leaf(HOST2, HOST2)?;
        (self.cert_v1, self.cert_v2, self.cert_host2) =
            (v1.sha256.clone(), v2.sha256.clone(), h2.sha256.clone());
        let www = self.nginx.www();
        std::fs::create_dir_all(&www).map_err(|source| h3i_scenarios::Error::Io {
            context: "mkdir www".into(),
            source,
        })?;
        let mut body = vec![0u8; 1 << 20];
        use std::io::Read;
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut body))
            .map_err(|source| h3i_scenarios::Error::Io {
                context: "/dev/urandom".into(),
                source,
            })?;
        std::fs::write(www.join("1m.bin"), &body).map_err(|source| h3i_scenarios::Error::Io {
            context: "write 1m.bin".into(),
            source,
        })?;
        self.body_sha = h3i_scenarios::pki::sha256_hex(&body);
        for node in &self.env.nodes {
            self.nginx.start(node, &[(HOST, &v1), (HOST2, &h2)]).await?;
        }
        let ca = self.ca.to_string_lossy().to_string();
        for (node, ip) in self.env.nodes.iter().zip(&self.env.ips) {
            let resolve = format!("{HOST}:443:{ip}");
            let url = format!("https://{HOST}/1m.bin");
            let args = [
                "-sS",
                "--http2",
                "--max-time",
                "5",
                "--cacert",
                &ca,
                "--resolve",
                &resolve,
                "-D",
                "-",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{response_code}",
                &url,
            ];
            let out = sh("curl", &args)
                .await
                .map_err(|e| h3i_scenarios::Error::Check(format!("nginx on {node}: {e}")))?;
            ensure!(
                out.contains(&format!("alt-svc: {ALT_SVC}")) && out.ends_with("2 200"),
                "nginx on {ip}: {out}"
            );
            ok(format!(
                "{node}: https://{HOST}/1m.bin over h2 from {ip}:443 -> 200 with Alt-Svc {ALT_SVC}"
            ));
        }
        Ok(())
    }

    pub(super) async fn application(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "namespace {NS_APP}: TLS Secrets, an IngressClass, an Ingress annotated {}",
            h3_ingress::api::annotations::ENABLED
        ));
        k8s::apply(
            &self.all::<Namespace>(),
            NS_APP,
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_APP}}),
        )
        .await?;
        self.tls_secret(NS_APP, "shop-tls", HOST).await?;
        let other = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "other-secret", "namespace": NS_APP}, "stringData": {"password": "hunter2"}});
        k8s::apply(&self.ns::<Secret>(NS_APP), "other-secret", &other).await?;
        let class = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx"}});
        k8s::apply(
            &self.all::<k8s_openapi::api::networking::v1::IngressClass>(),
            "nginx",
            &class,
        )
        .await?;
        let ing = Self::ingress("shop", Some("nginx"), HOST);
        k8s::apply(
            &self.ns::<k8s_openapi::api::networking::v1::Ingress>(NS_APP),
            "shop",
            &ing,
        )
        .await?;
        ok(format!("secret/shop-tls (cert sha256 {}), secret/other-secret, ingressclass/nginx, ingress/shop for {HOST}", &self.cert_v1[..12]));
        Ok(())
    }

    pub(super) async fn listener(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("an Http3Listener '{LISTENER}': UDP 443 on every node, upstream 127.0.0.1:443 (the node's nginx)"));
        self.apply_listener(LISTENER, 443, DP_ADMIN_PORT, json!({}))
            .await?;
        self.listener_uid = self
            .listener_obj(LISTENER)
            .await?
            .and_then(|l| l.uid())
            .unwrap_or_default();
        let dss = self.ns::<DaemonSet>(NS_OP);
        let dp = self.dp();
        wait_ok(30, &format!("DaemonSet {NS_OP}/{dp} created"), || async {
            k8s::exists(&dss, &dp).await
        })
        .await?;
        run.step("the DaemonSet, ServiceAccount, least-privilege RBAC and the certificate mirror appear, owned by the listener");
        let rb = self.ns::<RoleBinding>(NS_HOSTS);
        let rbac = self.dp_rbac();
        until(
            30,
            &format!("Role/RoleBinding {rbac} in {NS_HOSTS}"),
            || async { k8s::exists(&rb, &rbac).await },
        )
        .await?;
        self.owned_by_listener("ds", &dss.get(&dp).await?)?;
        self.owned_by_listener("sa", &self.ns::<ServiceAccount>(NS_OP).get(&dp).await?)?;
        let cluster_rbac = self.dp_cluster_rbac();
        self.owned_by_listener(
            "clusterrole",
            &self.all::<ClusterRole>().get(&cluster_rbac).await?,
        )?;
        self.owned_by_listener(
            "clusterrolebinding",
            &self.all::<ClusterRoleBinding>().get(&cluster_rbac).await?,
        )?;
        let role = self.ns::<Role>(NS_HOSTS).get(&rbac).await?;
        self.owned_by_listener("role", &role)?;
        self.owned_by_listener("rolebinding", &rb.get(&rbac).await?)?;
        ok(format!("ds/{dp}, sa/{dp} (ns {NS_OP}), clusterrole+binding/{cluster_rbac}, role+rolebinding/{rbac} (ns {NS_HOSTS}): controller owner Http3Listener/{LISTENER}"));
        self.least_privilege(&role).await?;
        self.mirror().await?;
        self.pod_template().await
    }

    async fn least_privilege(&self, role: &Role) -> Result<()> {
        let rules = |r: &k8s_openapi::api::rbac::v1::PolicyRule| {
            format!(
                "{:?}{:?}{:?}{:?}",
                r.api_groups.clone().unwrap_or_default(),
                r.resources.clone().unwrap_or_default(),
                r.resource_names.clone().unwrap_or_default(),
                r.verbs
            )
        };
        let got: Vec<String> = role.rules.iter().flatten().map(rules).collect();
        let want = "[\"\"][\"secrets\"][][\"get\", \"list\", \"watch\"]";
        ensure!(
            got == [want],
            "Role {NS_HOSTS}/{} should grant only reading Secrets there: {got:?}",
            self.dp_rbac()
        );
        ok(format!("Role in {NS_HOSTS}: {}", got.join(" ")));
        let sel = format!("{}={LISTENER}", h3_ingress::operator::labels::INSTANCE);
        let in_app = k8s::names(&self.ns::<Role>(NS_APP), &sel).await?.len()
            + k8s::names(&self.ns::<RoleBinding>(NS_APP), &sel)
                .await?
                .len();
        ensure!(
            in_app == 0,
            "the data plane got RBAC in the application namespace {NS_APP}"
        );
        let cr = self
            .all::<ClusterRole>()
            .get(&self.dp_cluster_rbac())
            .await?;
        let got: Vec<String> = cr.rules.iter().flatten().map(rules).collect();
        indent(got.join("\n"));
        let want = format!("[\"h3-ingress.dev\"][\"http3listeners\"][\"{LISTENER}\"][\"get\", \"list\", \"watch\"]");
        ensure!(
            got == [want],
            "ClusterRole {} should grant only reading its listener: {got:?}",
            self.dp_cluster_rbac()
        );
        Ok(())
    }

    async fn mirror(&self) -> Result<()> {
        let secrets = self.ns::<Secret>(NS_HOSTS);
        let sel = format!("{}={LISTENER}", mirror::LISTENER_LABEL);
        let source = format!("{NS_APP}/shop-tls");
        let find = || async {
            let all = k8s::list(&secrets, &sel).await?;
            Ok::<_, h3i_scenarios::Error>(
                all.into_iter()
                    .find(|s| s.annotations().get(mirror::SOURCE_ANNOTATION) == Some(&source)),
            )
        };
        until(
            30,
            &format!("the certificate mirror of {source} in {NS_HOSTS}"),
            || async { Ok(find().await?.is_some()) },
        )
        .await?;
        let Some(m) = find().await? else {
            return fail("the mirror went away");
        };
        let hosts_json = m
            .data
            .as_ref()
            .and_then(|d| d.get(mirror::HOSTS_KEY))
            .map(|b| b.0.clone())
            .unwrap_or_default();
        let hosts: serde_json::Value = serde_json::from_slice(&hosts_json).unwrap_or_default();
        let names: Vec<&str> = hosts["hosts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|h| h["name"].as_str())
            .collect();
        let mtype = m.type_.clone().unwrap_or_default();
        ensure!(
            mtype == mirror::SECRET_TYPE && names == [HOST],
            "mirror {}: type {mtype}, hosts {names:?}",
            m.name_any()
        );
        self.owned_by_listener("the mirror", &m)?;
        ok(format!(
            "secret/{} (ns {NS_HOSTS}, type {mtype}): copy of {source} for {}",
            m.name_any(),
            names.join(",")
        ));
        Ok(())
    }

    async fn pod_template(&self) -> Result<()> {
        let dp = self.dp();
        let ds = self.ns::<DaemonSet>(NS_OP).get(&dp).await?;
        let ds_spec = ds.spec.clone();
        let t = ds_spec.template.spec.clone().unwrap_or_default();
        let sel = t.node_selector.clone().unwrap_or_default();
        ensure!(
            sel.get("kubernetes.io/os").map(String::as_str) == Some("linux"),
            "DaemonSet pods lack nodeSelector kubernetes.io/os=linux"
        );
        let pull = t
            .image_pull_secrets
            .iter()
            .flatten()
            .next()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        ensure!(
            pull == "regcred",
            "DaemonSet pods lack imagePullSecrets regcred (chart value -> operator -> data plane)"
        );
        let sa = self.ns::<ServiceAccount>(NS_OP).get(&dp).await?;
        let sa_pull = sa
            .image_pull_secrets
            .iter()
            .flatten()
            .next()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        ensure!(
            sa_pull == "regcred",
            "ServiceAccount {dp} lacks imagePullSecrets regcred"
        );
        let img = t.containers[0].image.clone().unwrap_or_default();
        let san = t.service_account_name.clone().unwrap_or_default();
        ensure!(
            san == dp && img == format!("{IMAGE_REPO}:{}", self.app_version),
            "DaemonSet: serviceAccountName {san} image {img}"
        );
        ok(format!("pod template: serviceAccountName {dp}, image {img}, nodeSelector kubernetes.io/os=linux, imagePullSecrets regcred (also on the ServiceAccount)"));
        let ru = ds_spec
            .update_strategy
            .and_then(|s| s.rolling_update)
            .unwrap_or_default();
        let s = |v: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>| match v {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i)) => {
                i.to_string()
            }
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => s,
            None => String::new(),
        };
        let (surge, unavail) = (s(ru.max_surge), s(ru.max_unavailable));
        ensure!(
            surge == "10%" && unavail == "0",
            "DaemonSet maxSurge '{surge}' maxUnavailable '{unavail}', want the defaults 10% and 0"
        );
        ok(format!(
            "rolling update maxSurge {surge}, maxUnavailable {unavail}"
        ));
        Ok(())
    }

    pub(super) async fn data_plane(&mut self, run: &mut Run) -> Result<()> {
        run.step("the data plane runs on both nodes with its own ServiceAccount's token");
        let dp = self.dp();
        wait_ok(90, &format!("DaemonSet {dp}: 2 of 2 pods Ready"), || {
            self.ds_rolled_out(&dp)
        })
        .await?;
        let podapi = self.ns::<Pod>(NS_OP);
        self.dp_pid.clear();
        for (pod, _uid, _restarts, node) in self.pods_state().await? {
            let pid = pods::pid(&self.env, &podapi, NS_OP, &pod, "h3-ingress").await?;
            self.dp_pid.insert(pod.clone(), pid);
            let (exe, netns) = (
                pods::exe_of(pid),
                pods::netns_of(pid).await.unwrap_or_default(),
            );
            ensure!(
                exe == pods::exe(&self.env) && netns == node,
                "{pod}: pid {pid} runs {} in netns {netns}, want {} in {node}",
                exe.display(),
                self.env.binary.display()
            );
            let kc = pods::kubeconfig(
                &self.env,
                NS_OP,
                &pod,
                pid,
                &self.tmp.join(format!("{pod}.kubeconfig")),
            )?;
            let who = pods::whoami(kc).await?;
            let bound = who
                .extra
                .as_ref()
                .and_then(|e| e.get("authentication.kubernetes.io/pod-name"))
                .and_then(|v| v.first().cloned())
                .unwrap_or_default();
            let who = format!("{} {bound}", who.username.unwrap_or_default());
            ensure!(
                who == format!("{} {pod}", self.dp_user()),
                "{pod}'s token is '{who}', want {} bound to {pod}",
                self.dp_user()
            );
            ok(format!(
                "{pod} on {node}: pid {pid} ({}), token of {who}",
                pods::args_of(pid)
            ));
        }
        ensure!(
            self.dp_pid.len() == 2,
            "want 2 data plane pods, have {}",
            self.dp_pid.len()
        );
        let early = k8s::events(
            &self.client,
            "Http3Listener",
            &self.listener_uid,
            None,
            None,
        )
        .await?;
        let early: Vec<String> = early.iter().map(k8s::event_line).collect();
        indent(early.join("\n"));
        ensure!(
            !early.iter().any(|e| e.contains("nodeSelector")),
            "an event blamed spec.nodeSelector while the DaemonSet was merely new"
        );
        ok("the listener's events so far do not send the user to spec.nodeSelector");
        Ok(())
    }
}
