//! The journey's serving half: HTTP/3 with both clients, `kubectl get h3l`, the kubectl
//! plugin, the admin endpoints, steady traffic, a certificate rotation, the per-host switch and
//! a rolling socket change.

use h3_ingress::api::{annotations, host_states, reasons};
use h3_ingress::operator::resources::SOCKET_HASH_ANNOTATION;
use h3i_scenarios::cmd::{output, run as sh};
use h3i_scenarios::k8s;
use h3i_scenarios::k8s::Apis;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::prom::{http_get, metric};
use h3i_scenarios::{ensure, expect_eq, info, ok, Result, Run};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::Ingress;
use kube::ResourceExt;
use serde_json::json;

use super::*;

impl Journey {
    pub(super) async fn http3(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("HTTP/3 to {HOST} on each node address: aioquic and trixie curl (status, certificate, body, Alt-Svc)"));
        let what = format!("{HOST} answers over HTTP/3 on {}", self.env.ips.join(" "));
        wait_ok(60, &what, || self.h3_all_nodes(HOST, &self.cert_v1)).await?;
        self.h3_both(HOST, &self.cert_v1).await
    }

    /// Ready=True, hosts 1/1, pods 2/2.
    async fn h3l_ready(&self) -> Result<bool> {
        let (status, _, _) = self.ready(LISTENER).await?;
        Ok(status == "True" && self.summaries(LISTENER).await? == ("1/1".into(), "2/2".into()))
    }

    pub(super) async fn columns(&mut self, run: &mut Run) -> Result<()> {
        run.step("kubectl get h3l: the columns and the Ready condition");
        wait_ok(
            60,
            &format!("h3l/{LISTENER} Ready=True, hosts 1/1, pods 2/2"),
            || self.h3l_ready(),
        )
        .await?;
        let table = sh("kubectl", &["get", "h3l"]).await?;
        indent(&table);
        let squeeze = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        let header = squeeze(table.lines().next().unwrap_or_default());
        expect_eq(
            "kubectl get h3l columns",
            "NAME PORT HOSTS PODS READY UDP-DROPS AGE",
            header.as_str(),
        )?;
        let row = table
            .lines()
            .map(squeeze)
            .find(|l| l.starts_with(&format!("{LISTENER} ")))
            .unwrap_or_default();
        let row: Vec<&str> = row.split(' ').take(5).collect();
        expect_eq(
            "kubectl get h3l row",
            format!("{LISTENER} 443 1/1 2/2 True").as_str(),
            row.join(" ").as_str(),
        )?;
        indent(sh("kubectl", &["get", "h3l", "-o", "wide"]).await?);
        let (s, r, m) = self.ready(LISTENER).await?;
        ok(format!("Ready={s} reason {r}: {m}"));
        Ok(())
    }

    /// `kubectl h3-ingress status ARGS` with the binary as the plugin on PATH.
    async fn plugin_status(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["h3-ingress", "status"];
        all.extend(args);
        sh("kubectl", &all).await
    }

    pub(super) async fn plugin(&mut self, run: &mut Run) -> Result<()> {
        run.step("kubectl h3-ingress status (the binary as the kubectl plugin kubectl-h3_ingress on PATH)");
        let dir = self.tmp.join("plugin");
        std::fs::create_dir_all(&dir).map_err(|source| h3i_scenarios::Error::Io {
            context: "mkdir plugin".into(),
            source,
        })?;
        let link = dir.join("kubectl-h3_ingress");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&self.env.binary, &link).map_err(|source| {
            h3i_scenarios::Error::Io {
                context: "plugin link".into(),
                source,
            }
        })?;
        // Subprocesses only start after this (the runtime's threads never read PATH).
        let path = format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        std::env::set_var("PATH", path);
        let list = output("kubectl", &["plugin", "list"]).await?.stdout;
        ensure!(
            list.contains("kubectl-h3_ingress"),
            "kubectl plugin list does not find kubectl-h3_ingress: {list}"
        );
        let status = self.plugin_status(&[]).await?;
        indent(&status);
        let serving = status.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() >= 4
                && f[0] == HOST
                && f[1] == host_states::SERVING
                && f[2] == reasons::SERVING
                && f[3] == "yes"
        });
        ensure!(serving, "kubectl h3-ingress status does not show {HOST} Serving with Alt-Svc advertised (nginx sends {ALT_SVC})");
        let record = status.lines().find(|l| {
            l.contains(&format!("{HOST}. ")) && l.contains("IN HTTPS 1 . alpn=\"h3,h2\"")
        });
        let Some(record) = record else {
            return h3i_scenarios::fail(format!(
                "kubectl h3-ingress status lacks the DNS HTTPS record of {HOST}"
            ));
        };
        ok(format!("{HOST} Serving (read from a pod's /hosts through the API server), Alt-Svc advertised, DNS HTTPS record:{record}"));
        let st = self
            .listener_obj(LISTENER)
            .await?
            .and_then(|l| l.status)
            .unwrap_or_default();
        // One pod per listener probes the TCP ingress for Alt-Svc; the plugin read its /hosts.
        let pods = k8s::names(&self.ns::<Pod>(NS_OP), &self.dp_selector()).await?;
        let prober = st.alt_svc_prober.clone().unwrap_or_default();
        ensure!(
            pods.contains(&prober),
            "status.altSvcProber {prober:?} is not one of the data plane pods {pods:?}"
        );
        ok(format!(
            "status.altSvcProber: {prober}, one of {} data plane pods",
            pods.len()
        ));
        ensure!(
            st.hosts.is_empty(),
            "the status lists hosts although every host is served: {:?}",
            st.hosts
        );
        let counts: Vec<String> = st
            .host_counts
            .iter()
            .map(|c| format!("{} {} {}", c.state, c.reason, c.count))
            .collect();
        ok(format!(
            "status: {} (served hosts are counted, not listed)",
            counts.join(", ")
        ));
        Ok(())
    }

    pub(super) async fn admin(&mut self, run: &mut Run) -> Result<()> {
        run.step("admin endpoints on IPv6: the data plane on [node]:9476, the operator on its pod's IPv6 address");
        for ip6 in &self.env.ips6 {
            let addr = format!("[{ip6}]:{DP_ADMIN_PORT}");
            let (code, _) = http_get(&addr, "/healthz").await?;
            expect_eq(&format!("data plane /healthz on {addr}"), &200, &code)?;
            let (ready, _) = http_get(&addr, "/readyz").await?;
            ok(format!(
                "http://{addr}/healthz -> 200 (and /readyz {ready})"
            ));
        }
        let addr = format!("[{}]:{DP_ADMIN_PORT}", self.env.ips6[0]);
        for m in [
            "h3_ingress_config_reloads_total",
            "h3_ingress_rejected_requests_total",
            "h3_ingress_upstream_errors_total",
        ] {
            metric(&addr, m, &[]).await.map_err(|e| {
                h3i_scenarios::Error::Check(format!(
                    "the dashboard's {m} is absent from a real scrape: {e}"
                ))
            })?;
        }
        ok(format!("a scrape of {addr}/metrics has the dashboard's config_reloads_total, rejected_requests_total and upstream_errors_total series (known label values start at 0)"));
        let p = self.ns::<Pod>(NS_OP).get(&self.op_pod).await?;
        let ips = p.status.and_then(|s| s.pod_ips).unwrap_or_default();
        let ip6 = ips.get(1).map(|i| i.ip.clone()).unwrap_or_default();
        ensure!(
            ip6.contains(':'),
            "operator pod has no IPv6 address: {ips:?}"
        );
        let addr = format!("[{ip6}]:{OP_ADMIN_PORT}");
        let (code, _) = http_get(&addr, "/healthz").await?;
        expect_eq(&format!("operator /healthz on {addr}"), &200, &code)?;
        ok(format!("operator http://{addr}/healthz -> 200"));
        Ok(())
    }

    pub(super) async fn steady(&mut self, run: &mut Run) -> Result<()> {
        run.step(
            "60 s of steady HTTP/3 traffic: at most a handful of reconciles and status writes",
        );
        let rec0 = self
            .operator_metric("h3_ingress_operator_reconciles_total")
            .await?;
        let wr0 = self
            .operator_metric("h3_ingress_operator_status_writes_total")
            .await?;
        let targets: Vec<Target> = self
            .env
            .ips
            .iter()
            .map(|ip| self.target(ip, HOST, "/whoami"))
            .collect();
        indent(h3::load(&targets, 60, 5).await?);
        let rec1 = self
            .operator_metric("h3_ingress_operator_reconciles_total")
            .await?;
        let wr1 = self
            .operator_metric("h3_ingress_operator_status_writes_total")
            .await?;
        info(format!(
            "operator reconciles_total {rec0} -> {rec1}, status_writes_total {wr0} -> {wr1}"
        ));
        let (rec, wr) = (rec1 - rec0, wr1 - wr0);
        ensure!(rec <= 5.0 && wr <= 2.0, "under steady traffic the operator reconciled {rec} times and wrote the status {wr} times in 60 s (want <= 5 and <= 2)");
        ok(format!(
            "{rec} reconciles and {wr} status writes in 60 s of traffic"
        ));
        // By the header's name, not its position: columns come and go (PUBLIC-ROOT did).
        let status = self.plugin_status(&[LISTENER]).await?;
        let mut col = None;
        let mut requests = None;
        for line in status.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.first() == Some(&"HOST") {
                col = f.iter().position(|h| *h == "H3-REQUESTS");
            } else if let (Some(c), Some(&HOST)) = (col, f.first()) {
                requests = f.get(c).and_then(|v| v.parse::<u64>().ok());
            }
        }
        ensure!(
            requests.is_some_and(|r| r > 0),
            "kubectl h3-ingress status shows no h3 requests for {HOST}: {requests:?}"
        );
        ok(format!(
            "h3 requests for {HOST} on the pod kubectl h3-ingress status read: {}",
            requests.unwrap_or(0)
        ));
        Ok(())
    }

    pub(super) async fn rotate(&mut self, run: &mut Run) -> Result<()> {
        run.step("rotate the Secret (and nginx's certificate, as the TCP ingress would): new connections get it, no pod restarts");
        let before = self.pods_state().await?;
        let v2 = h3i_scenarios::pki::Leaf {
            crt: self.tmp.join(format!("pki/{HOST}.v2.crt")),
            key: self.tmp.join(format!("pki/{HOST}.v2.key")),
            sha256: self.cert_v2.clone(),
        };
        self.nginx.use_cert(&self.env.nodes, HOST, &v2).await?;
        self.tls_secret(NS_APP, "shop-tls", &format!("{HOST}.v2"))
            .await?;
        let what = format!(
            "new connections on both nodes get certificate {}",
            &self.cert_v2[..12]
        );
        wait_ok(60, &what, || self.h3_all_nodes(HOST, &self.cert_v2)).await?;
        self.h3_both(HOST, &self.cert_v2).await?;
        let after = self.pods_state().await?;
        ensure!(
            before == after,
            "data plane pods changed during the rotation:\n{before:?}\n->\n{after:?}"
        );
        for (pod, pid) in &self.dp_pid {
            ensure!(
                std::path::Path::new(&format!("/proc/{pid}")).exists(),
                "{pod}'s process {pid} is gone"
            );
        }
        let same: Vec<String> = after
            .iter()
            .map(|(n, u, r, _)| format!("{n} uid {} restarts {r}", &u[..8.min(u.len())]))
            .collect();
        ok(format!(
            "same pods, UIDs, restartCounts and processes: {}",
            same.join("; ")
        ));
        Ok(())
    }

    pub(super) async fn annotation(&mut self, run: &mut Run) -> Result<()> {
        run.step("remove the annotation: the host stops being served");
        let ing = self.ns::<Ingress>(NS_APP);
        k8s::merge(
            &ing,
            "shop",
            &json!({"metadata": {"annotations": {annotations::ENABLED: null}}}),
        )
        .await?;
        let what = format!(
            "handshakes for SNI {HOST} refused with a TLS alert on {}",
            self.env.ips.join(" ")
        );
        wait_ok(60, &what, || {
            self.refused_all_nodes(HOST, Refusal::TlsAlert)
        })
        .await?;
        for ip in &self.env.ips {
            indent(h3::refused(&self.target(ip, HOST, "/"), Refusal::TlsAlert).await?);
        }
        let not_listed = || async {
            let status = self.plugin_status(&[]).await.unwrap_or_default();
            let serving = status.lines().any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() >= 2 && f[0] == HOST && f[1] == host_states::SERVING
            });
            Ok(!serving && self.summaries(LISTENER).await?.0 == "0/0")
        };
        wait_ok(
            30,
            &format!("{HOST} no longer Serving in kubectl h3-ingress status (hosts 0/0)"),
            not_listed,
        )
        .await?;
        indent(sh("kubectl", &["get", "h3l", LISTENER]).await?);
        k8s::merge(
            &ing,
            "shop",
            &json!({"metadata": {"annotations": {annotations::ENABLED: "true"}}}),
        )
        .await?;
        wait_ok(
            60,
            &format!("annotated again: {HOST} served again on both nodes"),
            || self.h3_all_nodes(HOST, &self.cert_v2),
        )
        .await?;
        wait_ok(
            15,
            &format!("h3l/{LISTENER} hosts 1/1, Ready True again"),
            || self.h3l_ready(),
        )
        .await
    }

    async fn socket_hash(&self) -> Result<String> {
        let ds = self.ns::<DaemonSet>(NS_OP).get(&self.dp()).await?;
        let t = ds.spec.template.metadata.unwrap_or_default();
        Ok(t.annotations
            .unwrap_or_default()
            .get(SOCKET_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default())
    }

    async fn revisions(&self) -> Result<Vec<String>> {
        let pods = self.ds_pods().await?;
        Ok(pods
            .iter()
            .map(|p| {
                p.labels()
                    .get("controller-revision-hash")
                    .cloned()
                    .unwrap_or_default()
            })
            .collect())
    }

    pub(super) async fn socket_roll(&mut self, run: &mut Run) -> Result<()> {
        run.step("change a socket setting (socket.receiveBufferBytes 4 MiB -> 2 MiB): the DaemonSet rolls");
        let before = self.pods_state().await?;
        let hash0 = self.socket_hash().await?;
        let rev0 = self.revisions().await?.first().cloned().unwrap_or_default();
        k8s::merge(
            &self.all::<Http3Listener>(),
            LISTENER,
            &json!({"spec": {"socket": {"receiveBufferBytes": 2_097_152}}}),
        )
        .await?;
        let dp = self.dp();
        let rolled = || async {
            Ok(self.socket_hash().await? != hash0
                && self.ds_rolled_out(&dp).await?
                && self.ds_pods().await?.len() == 2
                && !self.revisions().await?.contains(&rev0))
        };
        wait_ok(
            120,
            "DaemonSet rolled: new socket-hash, both pods replaced and Ready",
            rolled,
        )
        .await?;
        let after = self.pods_state().await?;
        let short = |v: &[(String, String, i32, String)]| {
            v.iter()
                .map(|(n, u, _, _)| format!("{n}({})", &u[..8.min(u.len())]))
                .collect::<Vec<_>>()
                .join(" ")
        };
        info(format!("before: {}", short(&before)));
        info(format!("after:  {}", short(&after)));
        for (_, uid, _, _) in &before {
            ensure!(
                !after.iter().any(|a| &a.1 == uid),
                "pod uid {uid} survived the roll"
            );
        }
        let rev1 = self.revisions().await?.first().cloned().unwrap_or_default();
        ok(format!(
            "socket-hash {hash0} -> {}, revision {rev0} -> {rev1}",
            self.socket_hash().await?
        ));
        for ip in &self.env.ips {
            let m = "h3_ingress_udp_socket_receive_buffer_requested_bytes";
            let req = metric(&format!("{ip}:{DP_ADMIN_PORT}"), m, &[("family", "ipv4")]).await?;
            ensure!(
                req == 2_097_152.0,
                "{ip}: receive buffer requested {req}, want 2097152"
            );
        }
        ok("both new pods request a 2 MiB receive buffer (h3_ingress_udp_socket_receive_buffer_requested_bytes)");
        wait_ok(
            60,
            &format!("{HOST} served on both nodes by the new pods"),
            || self.h3_all_nodes(HOST, &self.cert_v2),
        )
        .await
    }
}
