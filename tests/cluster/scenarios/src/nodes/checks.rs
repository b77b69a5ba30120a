//! The node checks' steps, in order.

use std::process::Stdio;
use std::time::{Duration, Instant};

use h3_ingress::api::{conditions, reasons, Http3Listener};
use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::error::IoContext;
use h3i_scenarios::k8s;
use h3i_scenarios::poll::{until, wait_ok};
use h3i_scenarios::{ensure, fail, indent, info, ok, Error, Pki, Result, Run};
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::api::ListParams;
use serde_json::json;
use tokio::process::Command;

use super::procs::{caps_check, read_status, rootfs_check, status_field};
use super::*;

impl Nodes {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "node checks need real nodes: H3I_NODES=real scripts/cluster.sh up (this cluster runs the node agent)"
        );
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        k8s::delete(&classes, CLASS).await?;
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-node-checks.") {
                info(format!(
                    "stopping a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await?;
        let described: Vec<String> = nodes
            .items
            .iter()
            .map(|n| {
                let i = n
                    .status
                    .as_ref()
                    .and_then(|s| s.node_info.clone())
                    .unwrap_or_default();
                format!(
                    "{} {} {}",
                    n.name_any(),
                    i.kubelet_version,
                    i.container_runtime_version
                )
            })
            .collect();
        ok(format!("real nodes: {}", described.join("; ")));
        Ok(())
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install with the registry's pull secret; nginx on both nodes serving {HOST} (/, /1m.bin, /slow/ at {SLOW_RATE}/s); an Http3Listener"
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-nodes-ca")?;
        let leaf = pki.leaf(HOST, HOST)?;
        let www = self.nginx.www();
        std::fs::create_dir_all(www.join("slow")).context(|| "mkdir www/slow".into())?;
        let big = h3i_scenarios::random_bytes(1 << 20)?;
        std::fs::write(www.join("1m.bin"), big).context(|| "write 1m.bin".into())?;
        let slow = h3i_scenarios::random_bytes(SLOW_BYTES)?;
        self.slow_sha = h3i_scenarios::pki::sha256_hex(&slow);
        std::fs::write(www.join("slow/512k.bin"), slow).context(|| "write 512k.bin".into())?;
        // The browser test's own page, as tests/browser/chromium.py defines it.
        let py = h3::python().to_string_lossy().to_string();
        let browser = repo().join("tests/browser");
        let page = sh(&py, &["-c", "import sys; sys.path.insert(0, sys.argv[1]); import chromium; print(chromium.PAGE.format(fetch_path=chromium.FETCH_PATH))", &browser.to_string_lossy()]).await?;
        std::fs::write(www.join("index.html"), page).context(|| "write index.html".into())?;
        for node in &self.env.nodes {
            self.nginx.start(node, &[(HOST, &leaf)]).await?;
        }
        app::namespace(&self.client, NS_APP, &[]).await?;
        app::tls_secret(&self.client, NS_APP, "shop-tls", &leaf).await?;
        app::ingress_class(&self.client, CLASS, "example.com/h3i-shop").await?;
        app::ingress(&self.client, NS_APP, "shop", CLASS, HOST, "shop-tls").await?;
        app::listener(
            &self.client,
            LISTENER,
            json!({"ingressClassName": CLASS,
            "upstream": {"address": "127.0.0.1:443"}, "http": {"drainTimeoutSeconds": DRAIN}}),
        )
        .await?;
        wait_ok(120, "both data plane pods Ready", || async {
            Ok(self.ready_pods().await? == 2)
        })
        .await?;
        let what = format!("{HOST} served over HTTP/3 on {}", self.env.ips.join(" "));
        wait_ok(60, &what, || self.served_everywhere()).await
    }

    pub(super) async fn image(&mut self, run: &mut Run) -> Result<()> {
        run.step("the image: every pod runs the digest pushed to the authenticated registry; without the pull secret, ErrImagePull");
        let state = std::env::var("H3I_CLUSTER_STATE").unwrap_or_default();
        let index = format!("{state}/image/oci/index.json");
        let doc: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(&index).context(|| format!("read {index}"))?,
        )
        .map_err(|source| Error::Json {
            context: index.clone(),
            source,
        })?;
        let pushed = doc["manifests"][0]["digest"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for p in self.pods_api().list(&ListParams::default()).await?.items {
            let image = p
                .spec
                .as_ref()
                .map(|s| s.containers[0].image.clone().unwrap_or_default())
                .unwrap_or_default();
            let st = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first().cloned());
            let id = st.map(|c| c.image_id).unwrap_or_default();
            ensure!(
                id.ends_with(&format!("@{pushed}")),
                "pod {} runs {id}, not the pushed {pushed}",
                p.name_any()
            );
            info(format!(
                "{}: {image} -> {}",
                p.name_any(),
                id.rsplit('@').next().unwrap_or_default()
            ));
        }
        ok(format!("every pod of the release runs {pushed} (the digest scripts/image.sh built and scripts/registry.sh pushed)"));
        let chart = std::fs::read_to_string(app::chart().join("Chart.yaml")).unwrap_or_default();
        let version = chart
            .lines()
            .find_map(|l| l.strip_prefix("appVersion:"))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NS_APP);
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "no-pull-secret", "namespace": NS_APP},
            "spec": {"nodeName": self.env.nodes[0], "containers": [{"name": "c",
                "image": format!("{}:{version}", app::IMAGE_REPO), "imagePullPolicy": "Always", "args": ["version"]}]}});
        k8s::apply(&pods, "no-pull-secret", &pod).await?;
        wait_ok(60, "pod without imagePullSecrets: ErrImagePull", || async {
            let p = pods.get("no-pull-secret").await?;
            let st = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().cloned());
            let reason = st
                .and_then(|c| c.state)
                .and_then(|s| s.waiting)
                .and_then(|w| w.reason)
                .unwrap_or_default();
            Ok(reason == "ErrImagePull" || reason == "ImagePullBackOff")
        })
        .await?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS_APP);
        let lp = ListParams::default().fields("involvedObject.name=no-pull-secret,reason=Failed");
        if let Some(e) = events.list(&lp).await?.items.first() {
            info(h3i_scenarios::cmd::head(
                e.message.as_deref().unwrap_or_default(),
                300,
            ));
        }
        k8s::delete(&pods, "no-pull-secret").await
    }

    pub(super) async fn containers(&mut self, run: &mut Run) -> Result<()> {
        run.step("the containers runc made: capabilities, no new privileges, seccomp, read-only root filesystem");
        for (pod, node, _) in self.pods_state().await? {
            let pid = self.pid(&pod, "h3-ingress").await?;
            let exe = h3i_scenarios::pods::exe_of(pid);
            ensure!(
                exe.ends_with("h3-ingress"),
                "{pod}: pid {pid} runs {}",
                exe.display()
            );
            caps_check(
                pid,
                CAP_NET_BIND_SERVICE,
                &format!("data plane {pod} on {node}"),
            )?;
            rootfs_check(pid, &format!("data plane {pod}"), true)?;
        }
        let ops = app::pods(&self.client, &app::op_selector()).await?;
        let Some(op) = ops.first() else {
            return fail("no operator pod");
        };
        let op_pod = op.name_any();
        let op_pid = self.pid(&op_pod, "operator").await?;
        let uid = status_field(&read_status(op_pid), "Uid").unwrap_or_default();
        ensure!(uid == "65532", "operator runs as uid {uid}, want 65532");
        caps_check(op_pid, 0, &format!("operator {op_pod}"))?;
        rootfs_check(op_pid, &format!("operator {op_pod}"), false)
    }

    pub(super) async fn node_port(&mut self, run: &mut Run) -> Result<()> {
        run.step("HTTP/3 through spec.service (NodePort, externalTrafficPolicy Local) via kube-proxy's nftables rules");
        let ls = Api::<Http3Listener>::all(self.client.clone());
        k8s::merge(
            &ls,
            LISTENER,
            &json!({"spec": {"service": {"type": "NodePort"}}}),
        )
        .await?;
        let svc = format!("h3-ingress-{LISTENER}");
        let services: Api<Service> = Api::namespaced(self.client.clone(), NS_OP);
        let node_port = || async {
            let s = k8s::get(&services, &svc).await?;
            Ok::<_, Error>(
                s.and_then(|s| s.spec)
                    .and_then(|s| s.ports)
                    .and_then(|p| p.first().and_then(|p| p.node_port)),
            )
        };
        wait_ok(
            30,
            &format!("Service {NS_OP}/{svc} has a node port"),
            || async { Ok(node_port().await?.is_some()) },
        )
        .await?;
        let port = node_port().await?.unwrap_or_default() as u16;
        for ip in &self.env.ips {
            let what =
                format!("HTTP/3 to {ip}:{port} (kube-proxy DNAT to the node's pod on UDP 443)");
            wait_ok(30, &what, || self.h3_ok(ip, port)).await?;
        }
        let rules = output(
            "ip",
            &[
                "netns",
                "exec",
                &self.env.nodes[0],
                "nft",
                "list",
                "ruleset",
            ],
        )
        .await?
        .stdout;
        let lines: Vec<&str> = rules
            .lines()
            .filter(|l| l.contains(&port.to_string()))
            .take(2)
            .map(str::trim)
            .collect();
        info(lines.join(" "));
        Ok(())
    }

    pub(super) async fn browser(&mut self, run: &mut Run) -> Result<()> {
        let ip = self.env.ips[0].clone();
        run.step(format!("Debian's Chromium through {ip}: Alt-Svc discovery from nginx, then the page and 1 MiB over h3"));
        let script = repo().join("tests/browser/run.sh");
        let (ingress, ca, metrics) = (
            format!("{ip}:443"),
            self.ca.to_string_lossy().to_string(),
            format!("http://{ip}:9476/metrics"),
        );
        let out = output(
            &script.to_string_lossy(),
            &["--ingress", &ingress, "--ca", &ca, "--metrics", &metrics],
        )
        .await?;
        let text = out.stdout.clone() + &out.stderr;
        indent(&text);
        if !out.success() {
            return fail(format!(
                "tests/browser/chromium.py through {ip} (exit {:?})",
                out.status
            ));
        }
        let discovery = text
            .lines()
            .find(|l| l.starts_with("run 1 discovery:"))
            .unwrap_or_default();
        ok(format!("Chromium through {ip}: {discovery}"));
        Ok(())
    }

    /// `tests/py/h3client.py` as a child process writing its report to `out`.
    fn h3client_child(
        &self,
        url: &str,
        addr: &str,
        port: u16,
        extra: &[&str],
        out: &std::path::Path,
    ) -> Result<tokio::process::Child> {
        let host = url
            .split('/')
            .nth(2)
            .unwrap_or(HOST)
            .split(':')
            .next()
            .unwrap_or(HOST)
            .to_string();
        let file = std::fs::File::create(out).context(|| format!("create {}", out.display()))?;
        Command::new(h3::python())
            .arg(repo().join("tests/py/h3client.py"))
            .arg(url)
            .args(["--resolve", &format!("{host}:{port}:{addr}"), "--cacert"])
            .arg(&self.ca)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context(|| "spawn h3client.py".into())
    }

    pub(super) async fn grace(&mut self, run: &mut Run) -> Result<()> {
        run.step("termination grace: a pod deleted under a slow download keeps serving it, then exits by itself");
        let (node, ip) = (self.env.nodes[1].clone(), self.env.ips[1].clone());
        let pod = self.pod_on(&node).await?;
        let pid = self.pid(&pod, "h3-ingress").await?;
        let p = self.pods_api().get(&pod).await?;
        let grace = p
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(0) as u64;
        let report = self.tmp.join("slow.json");
        let url = format!("https://{HOST}/slow/512k.bin");
        let mut slow = self.h3client_child(&url, &ip, 443, &["--timeout", "60"], &report)?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let t_del = Instant::now();
        k8s::delete(&self.pods_api(), &pod).await?;
        let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
        until(10, "the kubelet saw the deletion", || async {
            let p = k8s::get(&self.pods_api(), &pod).await?;
            Ok(p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) || !alive(pid))
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        ensure!(
            alive(pid),
            "{pod}'s process {pid} gone 2 s after the deletion, with a download in flight"
        );
        ok(format!(
            "{pod} (pid {pid}) still runs 2 s after SIGTERM, draining"
        ));
        let status = slow
            .wait()
            .await
            .context(|| "wait for the slow download".into())?;
        let t_done = t_del.elapsed().as_secs_f64();
        let rep: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap_or_default())
                .unwrap_or_default();
        let r = &rep["requests"][0];
        let (code, sha, len) = (
            r["status"].as_u64(),
            r["body_sha256"].as_str().unwrap_or_default(),
            r["body_length"].as_u64().unwrap_or(0),
        );
        ensure!(
            status.success() && code == Some(200) && sha == self.slow_sha,
            "slow download through the draining pod: exit {status}, status {code:?}, {len} bytes, sha {sha}"
        );
        until(grace + 5, &format!("{pod}'s process exits"), || async {
            Ok(!alive(pid))
        })
        .await?;
        let t_exit = t_del.elapsed().as_secs_f64();
        ensure!(
            t_exit < grace as f64,
            "{pod} exited {t_exit:.1} s after the deletion: the grace period ({grace} s) ran out"
        );
        ok(format!(
            "download complete (200, {len} bytes, sha256 matches) {t_done:.1} s after the deletion; the process exited by itself {t_exit:.1} s after it (grace {grace} s)"
        ));
        let what = format!("the DaemonSet's new pod on {node} is Ready and serves");
        wait_ok(60, &what, || async {
            Ok(self.ready_pods().await? == 2 && self.h3_ok(&ip, 443).await?)
        })
        .await
    }

    /// The restart count of `pod`'s h3-ingress container and its last termination.
    async fn container_state(&self, pod: &str) -> Result<(i32, String)> {
        let p = self.pods_api().get(pod).await?;
        let st = p
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default();
        let c = st.into_iter().find(|c| c.name == "h3-ingress");
        let restarts = c.as_ref().map_or(0, |c| c.restart_count);
        let last = c.and_then(|c| c.last_state).and_then(|s| s.terminated);
        let last = last
            .map(|t| format!("{} exit {}", t.reason.unwrap_or_default(), t.exit_code))
            .unwrap_or_default();
        Ok((restarts, last))
    }

    pub(super) async fn liveness(&mut self, run: &mut Run) -> Result<()> {
        run.step("liveness probe: a hung data plane (SIGSTOP) is restarted by the kubelet");
        let (node, ip) = (self.env.nodes[0].clone(), self.env.ips[0].clone());
        let pod = self.pod_on(&node).await?;
        let pid = self.pid(&pod, "h3-ingress").await?;
        let (restarts, _) = self.container_state(&pod).await?;
        let t_stop = Instant::now();
        sh("kill", &["-STOP", &pid.to_string()]).await?;
        let what = format!("{pod} restarted by the kubelet (restartCount > {restarts})");
        wait_ok(150, &what, || async {
            Ok(self.container_state(&pod).await?.0 > restarts)
        })
        .await?;
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS_OP);
        let lp =
            ListParams::default().fields(&format!("involvedObject.name={pod},reason=Unhealthy"));
        let unhealthy = events.list(&lp).await?.items;
        if let Some(e) = unhealthy.iter().find(|e| {
            e.message
                .as_deref()
                .unwrap_or_default()
                .to_lowercase()
                .contains("liveness")
        }) {
            info(format!(
                "{}x {}",
                e.count.unwrap_or(1),
                e.message.as_deref().unwrap_or_default()
            ));
        }
        // Three failed probes 10 s apart, then the probe's own grace (not the pod's drain
        // grace): a stopped process cannot act on the kubelet's SIGTERM, so its SIGKILL after
        // the grace ends it.
        let p = self.pods_api().get(&pod).await?;
        let spec = p.spec.unwrap_or_default();
        let probe_grace = spec.containers[0]
            .liveness_probe
            .as_ref()
            .and_then(|l| l.termination_grace_period_seconds);
        let grace = probe_grace
            .or(spec.termination_grace_period_seconds)
            .unwrap_or(0);
        let (_, last) = self.container_state(&pod).await?;
        info(format!(
            "last state: {last}, {} s after SIGSTOP (3 probes 10 s apart, then a {grace} s grace before SIGKILL)",
            t_stop.elapsed().as_secs()
        ));
        let what = format!("the restarted container is Ready and serves {HOST} on {ip}");
        wait_ok(60, &what, || async {
            Ok(self.ready_pods().await? == 2 && self.h3_ok(&ip, 443).await?)
        })
        .await
    }

    pub(super) async fn oom(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "an OOM kill: listener '{TINY}' (UDP 8443, memory limit {TINY_MEMORY}) buffers uploads to a stalled upstream; the kubelet's reason in its status"
        ));
        // The upstream accepts TCP connections (the kernel's backlog) and never answers, so the
        // data plane holds what clients send, up to its default 2 MiB per stream: 8 uploads
        // are 16 MiB.
        let stalled = "import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind((\"127.0.0.1\", 9443)); s.listen(1024); time.sleep(3600)";
        for node in self.env.nodes.clone() {
            let child = Command::new("ip")
                .args(["netns", "exec", &node])
                .arg(h3::python())
                .args(["-c", stalled])
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .context(|| "spawn the stalled upstream".into())?;
            self.children.push(child);
        }
        app::listener(
            &self.client,
            TINY,
            json!({"ingressClassName": CLASS, "port": 8443,
            "metrics": {"address": "[::]:9486"}, "upstream": {"address": "127.0.0.1:9443"},
            "resources": {"requests": {"memory": TINY_MEMORY}, "limits": {"memory": TINY_MEMORY}}}),
        )
        .await?;
        let sel = format!("{}={TINY}", h3_ingress::operator::labels::INSTANCE);
        wait_ok(
            90,
            &format!("both '{TINY}' pods Ready under the {TINY_MEMORY} limit"),
            || async {
                let pods = app::pods(&self.client, &sel).await?;
                Ok(pods.len() == 2 && pods.iter().all(app::pod_ready))
            },
        )
        .await?;
        let node0 = self.env.nodes[0].clone();
        let tiny = app::pods(&self.client, &sel).await?;
        let Some(tiny_pod) = tiny
            .iter()
            .find(|p| app::node_of(p) == node0)
            .map(|p| p.name_any())
        else {
            return fail(format!("no '{TINY}' pod on {node0}"));
        };
        let upload = self.tmp.join("2m.bin");
        std::fs::write(&upload, h3i_scenarios::random_bytes(2 << 20)?)
            .context(|| "write 2m.bin".into())?;
        let up = upload.to_string_lossy().to_string();
        let mut uploads = Vec::new();
        for i in 1..=8 {
            let url = format!("https://{HOST}:8443/upload-{i}");
            let sink = self.tmp.join(format!("upload-{i}.json"));
            uploads.push(self.h3client_child(
                &url,
                &self.env.ips[0],
                8443,
                &["--upload", &up, "--timeout", "30"],
                &sink,
            )?);
        }
        let terminated = || async {
            let p = self.pods_api().get(&tiny_pod).await?;
            let st = p
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.first().cloned());
            Ok::<_, Error>(st)
        };
        wait_ok(
            60,
            &format!("the kernel OOM-killed {tiny_pod} (lastState.terminated.reason OOMKilled)"),
            || async {
                let st = terminated().await?;
                let reason = st
                    .and_then(|c| c.last_state)
                    .and_then(|s| s.terminated)
                    .and_then(|t| t.reason);
                Ok(reason.as_deref() == Some("OOMKilled"))
            },
        )
        .await?;
        for mut u in uploads {
            let _ = u.start_kill();
        }
        let st = terminated().await?.unwrap_or_default();
        let last = st.last_state.and_then(|s| s.terminated).unwrap_or_default();
        info(format!(
            "kubelet: {tiny_pod} {} exit {}, restartCount {}; limit {TINY_MEMORY}",
            last.reason.unwrap_or_default(),
            last.exit_code,
            st.restart_count
        ));
        let want = format!("{tiny_pod} on {node0}: last exit: OOMKilled (exit code 137)");
        let what = format!(
            "h3l/{TINY} {}=True {}, naming the pod and OOMKilled",
            conditions::DEGRADED,
            reasons::CONTAINER_EXITED
        );
        wait_ok(60, &what, || async {
            let (_, reason, message) = self.cond(TINY, conditions::DEGRADED).await?;
            Ok(reason == reasons::CONTAINER_EXITED && message.contains(&want))
        })
        .await?;
        let (s, r, m) = self.cond(TINY, conditions::DEGRADED).await?;
        info(format!("{}: {s} {r}: {m}", conditions::DEGRADED));
        k8s::delete(&Api::<Http3Listener>::all(self.client.clone()), TINY).await
    }

    /// Both data plane pods Ready, their processes with exactly these capabilities.
    async fn pods_with_caps(&self, want: u64) -> Result<bool> {
        let st = self.pods_state().await?;
        for (pod, _, _) in &st {
            let pid = self.pid(pod, "h3-ingress").await?;
            if super::procs::caps(&read_status(pid), "CapEff") != want {
                return Ok(false);
            }
        }
        Ok(st.len() == 2 && st.iter().all(|p| p.2))
    }

    pub(super) async fn force_buffers(&mut self, run: &mut Run) -> Result<()> {
        run.step("socket.forceBuffers: the rolled pods get NET_ADMIN too (SO_RCVBUFFORCE), and nothing else");
        let ls = Api::<Http3Listener>::all(self.client.clone());
        k8s::merge(
            &ls,
            LISTENER,
            &json!({"spec": {"socket": {"forceBuffers": true}}}),
        )
        .await?;
        let want = CAP_NET_BIND_SERVICE | CAP_NET_ADMIN;
        wait_ok(
            120,
            "both pods rolled with NET_BIND_SERVICE and NET_ADMIN",
            || self.pods_with_caps(want),
        )
        .await?;
        for (pod, node, _) in self.pods_state().await? {
            let pid = self.pid(&pod, "h3-ingress").await?;
            caps_check(
                pid,
                want,
                &format!("data plane {pod} on {node} (forceBuffers)"),
            )?;
        }
        let what = format!(
            "{HOST} served over HTTP/3 on {} after the roll",
            self.env.ips.join(" ")
        );
        wait_ok(60, &what, || self.served_everywhere()).await?;
        wait_ok(
            30,
            &format!("h3l/{LISTENER} {}=True", conditions::BUFFERS_APPLIED),
            || async { Ok(self.cond(LISTENER, conditions::BUFFERS_APPLIED).await?.0 == "True") },
        )
        .await?;
        let (_, r, m) = self.cond(LISTENER, conditions::BUFFERS_APPLIED).await?;
        info(format!("{}: {r}: {m}", conditions::BUFFERS_APPLIED));
        Ok(())
    }
}
