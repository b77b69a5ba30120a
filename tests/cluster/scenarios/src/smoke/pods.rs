//! The smoke's pods: the hostNetwork DaemonSet, a Deployment pod with its own network
//! namespace, a crashing container, Pod Security, an API server restart, status restored
//! after others overwrote it, and garbage collection.

use h3i_scenarios::pods::{args_of, environ_of, exe_of, netns_of, pid};
use h3i_scenarios::poll::until;
use h3i_scenarios::prom::http_get;
use h3i_scenarios::{expect_eq, fail, info, Error};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{ListParams, LogParams, Patch, PatchParams};
use kube::ResourceExt;

use super::*;

/// The DaemonSet's pods: hostNetwork, an init container, env from fields and resources,
/// probes, a ConfigMap, a Secret and emptyDirs.
fn daemonset() -> serde_json::Value {
    let field = |name: &str, path: &str| json!({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "smoke", "namespace": NS},
      "spec": {"selector": {"matchLabels": {"app": "smoke"}}, "template": {"metadata": {"labels": {"app": "smoke"}},
        "spec": {"hostNetwork": true, "serviceAccountName": "smoke", "terminationGracePeriodSeconds": 10,
          "initContainers": [{"name": "prepare", "image": "busybox:1.36.1",
            "command": ["sh", "-c", "echo prepared on $(NODE_NAME) > /srv/h3i-smoke/prepared"],
            "env": [field("NODE_NAME", "spec.nodeName")],
            "volumeMounts": [{"name": "work", "mountPath": "/srv/h3i-smoke"}]}],
          "containers": [{"name": "proxy", "image": "ghcr.io/h3-ingress/h3-ingress:0.1.0",
            "args": ["proxy", "--config", "/etc/h3i-smoke/config/config.yaml"],
            "env": [field("NODE_NAME", "spec.nodeName"), field("POD_NAME", "metadata.name"),
              field("POD_NAMESPACE", "metadata.namespace"), field("POD_IP", "status.podIP"),
              field("HOST_IP", "status.hostIP"),
              {"name": "MEMORY_LIMIT_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
              {"name": "GREETING", "value": "node=$(NODE_NAME)"}, {"name": "RUST_LOG", "value": "info"}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
            "ports": [{"name": "metrics", "containerPort": 9476}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": "metrics"}, "periodSeconds": 2},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 5},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/h3i-smoke/config"},
              {"name": "tls", "mountPath": "/etc/h3i-smoke/tls"}, {"name": "tmp", "mountPath": "/tmp"},
              {"name": "work", "mountPath": "/srv/h3i-smoke"}]}],
          "volumes": [{"name": "config", "configMap": {"name": "smoke-config"}},
            {"name": "tls", "secret": {"secretName": "smoke-tls"}},
            {"name": "tmp", "emptyDir": {"medium": "Memory"}}, {"name": "work", "emptyDir": {}}]}}}})
}

/// The pod's status as `phase ready podIP hostIP restarts`.
fn pod_line(p: &Pod) -> (String, String, String, String, i32) {
    let st = p.status.clone().unwrap_or_default();
    let ready = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY)
        .map(|c| c.status.clone());
    let restarts = st
        .container_statuses
        .iter()
        .flatten()
        .map(|c| c.restart_count)
        .next()
        .unwrap_or(0);
    (
        st.phase.unwrap_or_default(),
        ready.unwrap_or_default(),
        st.pod_ip.unwrap_or_default(),
        st.host_ip.unwrap_or_default(),
        restarts,
    )
}

impl Smoke {
    pub(super) async fn daemonset(&mut self, run: &mut Run) -> Result<()> {
        run.step("DaemonSet: hostNetwork, image ghcr.io/h3-ingress/h3-ingress:0.1.0 = the current binary");
        k8s::apply(&self.ns::<DaemonSet>(NS), "smoke", &daemonset()).await?;
        until(90, "DaemonSet smoke: 2 pods Ready", || self.ds_ready()).await?;
        let api_host = self
            .env
            .apiserver
            .trim_start_matches("https://")
            .rsplit_once(':')
            .map(|(h, _)| h.to_string())
            .unwrap_or_default();
        // What the process should be: the agent runs H3I_BINARY with KUBECONFIG and the API
        // server's address; a real kubelet runs the image's /h3-ingress with the kubernetes
        // Service's ClusterIP and a mounted token.
        let exe = h3i_scenarios::pods::exe(&self.env);
        let svc_host = if self.env.real_nodes {
            let svc = self.ns::<Service>("default").get("kubernetes").await?;
            svc.spec.and_then(|s| s.cluster_ip).unwrap_or_default()
        } else {
            api_host
        };
        let podapi = self.ns::<Pod>(NS);
        for (i, n) in self.env.nodes.clone().iter().enumerate() {
            let lp = ListParams::default()
                .labels("app=smoke")
                .fields(&format!("spec.nodeName={n}"));
            let Some(p) = podapi.list(&lp).await?.items.into_iter().next() else {
                return fail(format!("no smoke pod on {n}"));
            };
            let pod = p.name_any();
            let (phase, ready, podip, hostip, restarts) = pod_line(&p);
            let ip = &self.env.ips[i];
            ensure!(phase == "Running" && ready == "True" && &podip == ip && &hostip == ip && restarts == 0,
                "{pod}: phase={phase} ready={ready} podIP={podip} hostIP={hostip} restarts={restarts}");
            let pid = pid(&self.env, &podapi, NS, &pod, "proxy").await?;
            self.pod_pid.insert(pod.clone(), pid);
            ensure!(
                exe_of(pid) == exe,
                "{pod} runs {}, not {}",
                exe_of(pid).display(),
                exe.display()
            );
            expect_eq(
                &format!("{pod} (pid {pid}) netns"),
                n.as_str(),
                netns_of(pid).await?.as_str(),
            )?;
            let environ = environ_of(pid);
            let dir = self.env.pod_logs.join(NS).join(&pod);
            let mut want = vec![
                format!("NODE_NAME={n}"),
                format!("POD_NAME={pod}"),
                format!("POD_NAMESPACE={NS}"),
                format!("POD_IP={ip}"),
                format!("HOST_IP={ip}"),
                "MEMORY_LIMIT_MI=128".into(),
                format!("GREETING=node={n}"),
                format!("KUBERNETES_SERVICE_HOST={svc_host}"),
            ];
            if !self.env.real_nodes {
                want.push(format!("KUBECONFIG={}", dir.join("kubeconfig").display()));
            }
            for kv in &want {
                ensure!(environ.contains(kv), "{pod}: env lacks {kv}");
            }
            expect_eq(
                &format!("{pod}: args"),
                "proxy --config /etc/h3i-smoke/config/config.yaml",
                args_of(pid).as_str(),
            )?;
            let (code, _) = http_get(&format!("{ip}:9476"), "/readyz").await?;
            expect_eq(&format!("{pod}: /readyz on {ip}:9476"), &200, &code)?;
            let prepared = if self.env.real_nodes {
                PathBuf::from(format!("/proc/{pid}/root/srv/h3i-smoke/prepared"))
            } else {
                dir.join("volumes/work/prepared")
            };
            let text = std::fs::read_to_string(&prepared).unwrap_or_default();
            ensure!(
                text.contains(&format!("prepared on {n}")),
                "{pod}: init container output missing ({})",
                prepared.display()
            );
            ok(format!("{pod} on {n}: Running, Ready, podIP=hostIP={ip}, pid {pid} in netns {n} running {}, env and volumes as specified, /readyz 200", exe.display()));
        }
        Ok(())
    }

    pub(super) async fn deployment(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "Deployment pod without hostNetwork: own network namespace and address, probed there",
        );
        let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": NS},
          "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web"}},
            "spec": {"automountServiceAccountToken": false, "containers": [{"name": "proxy", "image": "h3-ingress:0.1.0",
              "args": ["proxy", "--config", "/etc/h3i-smoke/config/config.yaml"],
              "readinessProbe": {"httpGet": {"path": "/readyz", "port": 9476}, "periodSeconds": 2},
              "volumeMounts": [{"name": "config", "mountPath": "/etc/h3i-smoke/config"}, {"name": "tls", "mountPath": "/etc/h3i-smoke/tls"}]}],
              "volumes": [{"name": "config", "configMap": {"name": "smoke-config"}}, {"name": "tls", "secret": {"secretName": "smoke-tls"}}]}}}});
        let deploys = self.ns::<Deployment>(NS);
        k8s::apply(&deploys, "web", &d).await?;
        until(60, "Deployment web available", || async {
            let d = deploys.get("web").await?;
            let conds = d.status.and_then(|s| s.conditions).unwrap_or_default();
            Ok(conds.iter().any(|c| {
                c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")
            }))
        })
        .await?;
        let podapi = self.ns::<Pod>(NS);
        let Some(p) = k8s::list(&podapi, "app=web").await?.into_iter().next() else {
            return fail("no web pod");
        };
        let web = p.name_any();
        let st = p.status.clone().unwrap_or_default();
        let webip = st.pod_ip.clone().unwrap_or_default();
        let webpid = pid(&self.env, &podapi, NS, &web, "proxy").await?;
        let mut webns = netns_of(webpid).await.unwrap_or_default();
        ensure!(
            !self.env.ips.contains(&webip),
            "web pod: podIP {webip} is a node's"
        );
        if self.env.real_nodes {
            // containerd keeps pod netns files under its state dir, so no name; not the node's.
            let node = p.spec.clone().and_then(|s| s.node_name).unwrap_or_default();
            let ino = |path: String| {
                std::fs::metadata(path)
                    .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
                    .unwrap_or(0)
            };
            let same = ino(format!("/proc/{webpid}/ns/net")) == ino(format!("/run/netns/{node}"));
            ensure!(
                webns.is_empty() && !same,
                "web pod: netns '{webns}' is the node's"
            );
            webns = format!("(unnamed, not {node}'s)");
        } else {
            ensure!(
                webns.starts_with("h3ic-p-"),
                "web pod: netns '{webns}' podIP {webip}"
            );
        }
        let (code, _) = http_get(&format!("{webip}:9476"), "/readyz").await?;
        expect_eq(&format!("web /readyz on {webip}"), &200, &code)?;
        let ips: Vec<String> = st.pod_ips.iter().flatten().map(|i| i.ip.clone()).collect();
        let v6 = ips.get(1).is_some_and(|i| i.contains(':'));
        ensure!(
            ips.first() == Some(&webip)
                && v6
                && (self.env.real_nodes
                    || ips[1].starts_with(self.env.ips6[0].split("::").next().unwrap_or("fd77"))),
            "web pod should be dual-stack, podIPs: {ips:?}"
        );
        ensure!(
            !environ_of(webpid)
                .iter()
                .any(|l| l.starts_with("KUBECONFIG=")),
            "automountServiceAccountToken: false, yet KUBECONFIG is set"
        );
        ok(format!("{web}: podIPs {} in netns {webns}, Ready; no token and no KUBECONFIG (automountServiceAccountToken: false)", ips.join(" ")));
        Ok(())
    }

    async fn crasher_state(&self) -> Result<(i32, Option<i32>, serde_json::Value)> {
        let p = self.ns::<Pod>(NS).get("crasher").await?;
        let cs = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .unwrap_or_default();
        let last = cs
            .last_state
            .and_then(|s| s.terminated)
            .map(|t| t.exit_code);
        let state = serde_json::to_value(cs.state).unwrap_or_default();
        Ok((cs.restart_count, last, state))
    }

    pub(super) async fn crasher(&mut self, run: &mut Run) -> Result<()> {
        run.step("a crashing container restarts with backoff (busybox image run as a host shell)");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crasher", "namespace": NS},
            "spec": {"restartPolicy": "Always", "containers": [{"name": "crasher", "image": "busybox:1.36.1",
                "command": ["sh", "-c", "echo \"run at $(date +%s)\"; exit 3"]}]}});
        let podapi = self.ns::<Pod>(NS);
        k8s::apply(&podapi, "crasher", &pod).await?;
        until(60, "crasher restarted twice", || async {
            Ok(self.crasher_state().await?.0 >= 2)
        })
        .await?;
        let (_, last, _) = self.crasher_state().await?;
        expect_eq("crasher lastState exit code", &Some(3), &last)?;
        if self.env.real_nodes {
            // CRI log lines carry a timestamp and stream prefix. The kubelet's container GC
            // keeps one dead instance (and its log file) besides the current one: one run in
            // the files, and the last finished run through the kubelet's API. During the
            // back-off this kubelet reports the finished instance as the current state
            // (terminated), while lastState names the one before, which the GC may have
            // removed: the finished run is the current log then, and the previous one once
            // the state is waiting or running again.
            let files_hold_run = || async {
                let files =
                    h3i_scenarios::pods::log_files(&self.env, &podapi, NS, "crasher", "crasher")
                        .await?;
                Ok(files.iter().any(|f| {
                    std::fs::read_to_string(f)
                        .unwrap_or_default()
                        .contains(" run at")
                }))
            };
            until(30, "crasher log files hold a run", files_hold_run).await?;
            let finished_run = || async {
                let (_, _, state) = self.crasher_state().await?;
                let previous = state.get("terminated").is_none();
                let lp = LogParams {
                    previous,
                    ..Default::default()
                };
                Ok(podapi
                    .logs("crasher", &lp)
                    .await?
                    .lines()
                    .any(|l| l.starts_with("run at")))
            };
            until(
                30,
                "the logs API shows the last finished instance's run",
                finished_run,
            )
            .await?;
        } else {
            let log =
                std::fs::read_to_string(self.env.pod_logs.join(NS).join("crasher/crasher.log"))
                    .unwrap_or_default();
            ensure!(
                log.lines().filter(|l| l.starts_with("run at")).count() >= 3,
                "crasher log should hold 3 runs"
            );
        }
        // Now: waiting CrashLoopBackOff (the agent), or terminated Error during the back-off (a kubelet).
        let (restarts, _, state) = self.crasher_state().await?;
        let reason = ["waiting", "terminated"]
            .iter()
            .find_map(|k| state[k]["reason"].as_str())
            .unwrap_or("running");
        ok(format!(
            "crasher: restartCount {restarts}, lastState exit 3, now {reason}"
        ));
        k8s::delete(&podapi, "crasher").await
    }

    pub(super) async fn pod_security(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "Pod Security admission: a hostNetwork pod in a 'restricted' namespace is rejected",
        );
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": NS_RESTRICTED, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
        k8s::apply(&self.all::<Namespace>(), NS_RESTRICTED, &ns).await?;
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hostnet", "namespace": NS_RESTRICTED},
            "spec": {"hostNetwork": true, "containers": [{"name": "hostnet", "image": "h3-ingress:0.1.0", "args": ["demo"]}]}});
        match k8s::apply(&self.ns::<Pod>(NS_RESTRICTED), "hostnet", &pod).await {
            Ok(_) => fail("the restricted namespace accepted a hostNetwork pod"),
            Err(Error::Kube(kube::Error::Api(e))) => {
                let m = &e.message;
                ensure!(
                    m.contains("violates PodSecurity \"restricted:latest\"")
                        && m.contains("hostNetwork=true"),
                    "unexpected rejection: {m}"
                );
                let why = m
                    .split("violates PodSecurity")
                    .nth(1)
                    .and_then(|s| s.split(';').next())
                    .unwrap_or_default();
                ok(format!("rejected: violates PodSecurity{why}"));
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn processes_alive(&self) -> Result<()> {
        for (pod, pid) in &self.pod_pid {
            ensure!(
                std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{pod}'s process died during the API server restart"
            );
        }
        Ok(())
    }

    pub(super) async fn apiserver_restart(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "kube-apiserver restart: pods keep running, the {} catches up",
            self.node_daemon()
        ));
        indent(cluster(&["restart-apiserver", "3"]).await?);
        self.processes_alive()?;
        until(60, "DaemonSet Ready after the restart", || self.ds_ready()).await?;
        let nodes = self.all::<Node>().list(&ListParams::default()).await?;
        for n in &nodes.items {
            let ready = n
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .find(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY)
                .map(|c| c.status.clone());
            info(format!(
                "{} Ready={}",
                n.name_any(),
                ready.unwrap_or_default()
            ));
        }
        // Real kubelets, kube-proxies and controllers reconnect with client-go back-off:
        // status may stay unhealthy a few seconds after /readyz.
        let secs = if self.env.real_nodes { 60 } else { 1 };
        until(secs, "status healthy after the restart", || async {
            Ok(cluster(&["status"]).await.is_ok())
        })
        .await?;
        let pids: Vec<String> = self.pod_pid.values().map(u32::to_string).collect();
        ok(format!(
            "same processes ({}), nodes Ready, DaemonSet Ready",
            pids.join(" ")
        ));
        Ok(())
    }

    pub(super) async fn status_restored(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("the {} restores node and pod status that others overwrote (as the node-lifecycle controller does after a long outage)", self.node_daemon()));
        let node = self.env.nodes[0].clone();
        let podapi = self.ns::<Pod>(NS);
        let lp = ListParams::default()
            .labels("app=smoke")
            .fields(&format!("spec.nodeName={node}"));
        let pod = podapi
            .list(&lp)
            .await?
            .items
            .first()
            .map(|p| p.name_any())
            .unwrap_or_default();
        let pp = PatchParams::default();
        let node_patch = json!({"status": {"conditions": [{"type": h3i_scenarios::k8s::KUBE_READY, "status": "Unknown", "reason": "NodeStatusUnknown", "message": "set by the smoke"}]}});
        self.all::<Node>()
            .patch_status(&node, &pp, &Patch::Strategic(node_patch))
            .await?;
        let pod_patch = json!({"status": {"conditions": [{"type": h3i_scenarios::k8s::KUBE_READY, "status": "False", "reason": "NodeNotReady", "message": "set by the smoke"}]}});
        podapi
            .patch_status(&pod, &pp, &Patch::Strategic(pod_patch))
            .await?;
        until(30, &format!("{node} Ready again"), || async {
            let n = self.all::<Node>().get(&node).await?;
            Ok(n.status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| c.type_ == h3i_scenarios::k8s::KUBE_READY && c.status == "True"))
        })
        .await?;
        until(30, &format!("{pod} Ready again"), || async {
            Ok(pod_line(&podapi.get(&pod).await?).1 == "True")
        })
        .await?;
        ok(format!(
            "{node} and {pod} were set Unknown/False, and are Ready=True again"
        ));
        Ok(())
    }

    pub(super) async fn garbage_collection(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("delete the DaemonSet: the garbage collector removes its pods, the {} stops the processes", self.node_daemon()));
        k8s::delete(&self.ns::<DaemonSet>(NS), "smoke").await?;
        let podapi = self.ns::<Pod>(NS);
        until(60, "smoke pods removed", || async {
            Ok(k8s::names(&podapi, "app=smoke").await?.is_empty())
        })
        .await?;
        for (pod, pid) in &self.pod_pid {
            ensure!(
                !std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{pod}'s process {pid} still runs"
            );
            if self.env.real_nodes {
                ok(format!("{pod}: process {pid} gone"));
                continue;
            }
            let events =
                std::fs::read_to_string(self.env.pod_logs.join(NS).join(pod).join("_events.log"))
                    .unwrap_or_default();
            ensure!(
                events.contains("removed"),
                "{pod}: agent did not record the removal"
            );
            let exit = events
                .lines()
                .rev()
                .find(|l| l.contains("container proxy exited with"))
                .unwrap_or_default();
            ok(format!("{pod}: process {pid} gone; {}", exit.trim()));
        }
        Ok(())
    }
}
