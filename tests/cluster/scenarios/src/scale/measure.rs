//! The scale harness's steps: the set-up, the baseline and the scale phases (create, served,
//! peak memory, series, the steady window, latencies, a pod restart, logs), and the table.

use std::time::Duration;

use h3i_scenarios::cmd::run as sh;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{info, ok, Pki};
use serde_json::json;

use super::*;

/// Seconds the steady window may run past `--window` for the upstream pool to empty.
const SETTLE_CAP: u64 = 150;
/// The data plane returns freed memory every 30 s (src/memory.rs PERIOD).
const TRIM_WAIT: u64 = 35;
/// Upstream connections at the window's start below which it does not wait.
const SETTLE_MIN: u64 = 100;

/// The hard limit on open files (`ulimit -Hn`), from `/proc/self/limits`; `None` when
/// unlimited.
fn nofile_hard(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(4)?.parse().ok()
}

/// nginx's configuration for `node`: one catch-all server presenting each host's own
/// certificate, loaded per handshake from `CERTS/HOST.pem` (so it refuses names without a file
/// and a rotation needs no reload).
pub fn nginx_conf(node: &str, d: &str, certs: &str, nofile: u64) -> String {
    format!(
        "user root;\nworker_processes 1;\nworker_rlimit_nofile {nofile};\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections {}; }}\nhttp {{\n    access_log off;\n    client_body_temp_path {d}/tmp/body;\n    \
         proxy_temp_path {d}/tmp/proxy;\n    fastcgi_temp_path {d}/tmp/fastcgi;\n    uwsgi_temp_path {d}/tmp/uwsgi;\n    \
         scgi_temp_path {d}/tmp/scgi;\n    server {{\n        listen 443 ssl http2 default_server;\n        \
         listen [::]:443 ssl http2 default_server;\n        ssl_certificate {certs}/$ssl_server_name.pem;\n        \
         ssl_certificate_key {certs}/$ssl_server_name.pem;\n        add_header Alt-Svc '{}' always;\n        \
         location / {{ default_type text/plain; return 200 \"$host on {node}\\n\"; }}\n    }}\n}}\n",
        nofile - 100,
        app::ALT_SVC
    )
}

/// Stops the run's nginx masters (SIGQUIT); never fails.
pub fn stop_nginx(tmp: &std::path::Path) {
    h3i_scenarios::Nginx::new(tmp, "", "").stop();
}

impl Scale {
    async fn start_nginx(&self, node: &str) -> Result<()> {
        let d = self.tmp.join(format!("nginx-{node}"));
        std::fs::create_dir_all(d.join("tmp")).map_err(|e| io("mkdir nginx", e))?;
        // One connection from the data plane per host (its pool keeps them 60 s): as many files
        // as the hard limit allows.
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let nofile = nofile_hard(&limits).unwrap_or(200_000);
        let certs = self.tmp.join("nginx-certs");
        let conf = nginx_conf(node, &d.to_string_lossy(), &certs.to_string_lossy(), nofile);
        let file = d.join("nginx.conf");
        std::fs::write(&file, conf).map_err(|e| io("write nginx.conf", e))?;
        let prefix = format!("{}/", d.display());
        if let Err(e) = h3i_scenarios::cmd::netns(
            node,
            "nginx",
            &["-p", &prefix, "-c", &file.to_string_lossy()],
        )
        .await
        {
            let log = std::fs::read_to_string(d.join("error.log")).unwrap_or_default();
            return fail(format!("nginx did not start in {node}: {e} {log}"));
        }
        Ok(())
    }

    /// Both data-plane pods run and answer /healthz (not Ready: no host yet).
    async fn dp_pods_up(&self) -> Result<bool> {
        for ip in &self.env.ips {
            let (status, _) =
                h3i_scenarios::prom::http_get(&format!("{ip}:9476"), "/healthz").await?;
            if status != 200 {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(super) async fn set_up(&mut self, run: &mut Run) -> Result<()> {
        run.step("the harness's tool (tests/cluster/scale: client-go, quic-go)");
        self.build_tool().await?;
        run.step(format!(
            "the Gateway API {} standard-channel CRDs",
            h3i_scenarios::gateway_api::VERSION
        ));
        h3i_scenarios::gateway_api::install_crds(&self.client, &self.tmp).await?;
        run.step(format!(
            "helm install the chart (image {} = {})",
            app::IMAGE_REPO,
            self.env.image_source()
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        ok("operator running");
        run.step("the TCP ingress: a catch-all Debian nginx per node presenting each host's own certificate");
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-scale-ca")?;
        pki.write_ca_key()?;
        std::fs::create_dir_all(self.tmp.join("nginx-certs"))
            .map_err(|e| io("mkdir nginx-certs", e))?;
        for node in self.env.nodes.clone() {
            self.start_nginx(&node).await?;
        }
        ok(format!("nginx on TCP 443 in {}", self.env.nodes.join(" ")));
        run.step(format!(
            "IngressClass {CLASS}, GatewayClass {GW_CLASS}, Http3Listener {LISTENER} (upstream 127.0.0.1:443, verify servedCertificate)"
        ));
        app::ingress_class(&self.client, CLASS, "k8s.io/ingress-nginx").await?;
        let gw = h3i_scenarios::gateway_api::api(
            &self.client,
            "v1",
            "GatewayClass",
            "gatewayclasses",
            None,
        );
        let class = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
            "metadata": {"name": GW_CLASS}, "spec": {"controllerName": "example.com/h3i-scale-gateway"}});
        h3i_scenarios::k8s::apply(&gw, GW_CLASS, &class).await?;
        app::listener(&self.client, LISTENER, json!({"ingressClassName": CLASS, "gatewayClassName": GW_CLASS,
            "port": 443, "upstream": {"address": "127.0.0.1:443"}, "metrics": {"address": "[::]:9476"},
            "http": {"drainTimeoutSeconds": 2}}))
        .await?;
        let what = format!(
            "both data-plane pods answer /healthz on {}:9476",
            self.env.ips.join(" ")
        );
        wait_ok(90, &what, || self.dp_pods_up()).await
    }

    fn share(&self) -> String {
        self.opts.route_share.to_string()
    }

    async fn create(&self, col: &str, from: u32, to: u32) -> Result<()> {
        let (f, t, share) = (from.to_string(), to.to_string(), self.share());
        let mut args = vec![
            "--col",
            col,
            "--from",
            &f,
            "--to",
            &t,
            "--route-share",
            &share,
        ];
        if self.opts.rsa {
            args.push("--rsa");
        }
        self.tool("create", &args, &format!("create ({col})")).await
    }

    pub(super) async fn baseline(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "baseline: 4 annotated Ingresses with their Secrets in one namespace (load {})",
            load()
        ));
        let t_base = now_ms();
        self.create("base", 0, 4).await?;
        self.nginx_presents().await?;
        self.measure(run, "base", t_base).await?;
        run.step(format!(
            "baseline: {} rounds of new host, rotated Secret, removed annotation",
            self.opts.base_rounds
        ));
        self.latency("base", self.opts.base_rounds).await?;
        if self.opts.base_restart {
            run.step(format!(
                "baseline: delete the data-plane pod on {}",
                self.env.nodes[0]
            ));
            self.restart("base").await?;
        }
        self.logs("base", t_base).await
    }

    /// nginx presents the first host's certificate over h2 (and refuses names without one).
    async fn nginx_presents(&self) -> Result<()> {
        let state = std::fs::read_to_string(self.state()).map_err(|e| io("read state.json", e))?;
        let state: serde_json::Value =
            serde_json::from_str(&state).map_err(|source| Error::Json {
                context: "state.json".into(),
                source,
            })?;
        let h = state["hosts"][0]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let (ca, resolve, url) = (
            self.tmp.join("pki/ca.crt"),
            format!("{h}:443:{}", self.env.ips[0]),
            format!("https://{h}/"),
        );
        let ca = ca.to_string_lossy();
        let args = [
            "-sS",
            "--http2",
            "--max-time",
            "5",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{response_code}",
            &url,
        ];
        let out = output("curl", &args).await?;
        if out.stdout != "2 200" {
            return fail(format!(
                "nginx on {} for {h}: {} {}",
                self.env.ips[0],
                out.stdout,
                out.stderr.trim()
            ));
        }
        ok(format!(
            "nginx presents {h}'s certificate over h2 (and refuses names without one)"
        ));
        Ok(())
    }

    pub(super) async fn at_scale(&mut self, run: &mut Run) -> Result<()> {
        let n = self.opts.hosts;
        run.step(format!(
            "scale: {} more hosts in {} more namespaces, {}% of namespaces HTTPRoutes (load {})",
            n - 4,
            n / 4 - 1,
            self.opts.route_share,
            load()
        ));
        let t_scale = now_ms();
        self.create("scale", 4, n).await?;
        run.step(format!(
            "scale: every host served over HTTP/3 on both nodes, and the listener's status (cap {}s)",
            self.opts.served_timeout
        ));
        self.measure(run, "scale", t_scale).await?;
        run.step(format!(
            "scale: {} rounds of new host, rotated Secret, removed annotation (load {})",
            self.opts.rounds,
            load()
        ));
        self.latency("scale", self.opts.rounds).await?;
        run.step(format!(
            "scale: delete the data-plane pod on {} (cap {}s)",
            self.env.nodes[0], self.opts.restart_timeout
        ));
        self.restart("scale").await?;
        self.logs("scale", t_scale).await
    }

    /// What follows each batch of creates: every host served and the status, peak memory,
    /// series, the steady window (API requests, watches, memory), the listener's size.
    async fn measure(&self, run: &mut Run, col: &str, load_from: u64) -> Result<()> {
        let timeout = format!("{}s", self.opts.served_timeout);
        self.tool(
            "served",
            &["--col", col, "--listener", LISTENER, "--timeout", &timeout],
            &format!("served ({col})"),
        )
        .await?;
        let load_to = now_ms();
        self.tool("procs", &["--col", col, "--phase", "peak"], "procs")
            .await?;
        if self
            .tool(
                "series",
                &["--col", col, "--node", &self.env.ips[0]],
                "series",
            )
            .await
            .is_err()
        {
            info(format!("no scrape of {}:9476/metrics", self.env.ips[0]));
        }
        let phase = if col == "base" { "baseline" } else { "scale" };
        run.step(format!(
            "{phase}: steady state, a {}s window (no request from the harness meanwhile; load {})",
            self.opts.window,
            load()
        ));
        let before = self.tmp.join(format!("api-{col}-before.txt"));
        let after = self.tmp.join(format!("api-{col}-after.txt"));
        self.api_metrics(&before).await?;
        let rest_from = now_ms();
        self.rest_window(rest_from).await;
        let rest_to = now_ms();
        self.api_metrics(&after).await?;
        let secs = ((rest_to - rest_from) / 1000).to_string();
        let (b, a) = (before.to_string_lossy(), after.to_string_lossy());
        self.tool(
            "apirate",
            &[
                "--col",
                col,
                "--before",
                &b,
                "--after",
                &a,
                "--seconds",
                &secs,
            ],
            "apirate",
        )
        .await?;
        self.tool("watches", &["--col", col, "--scrape", &a], "watches")
            .await?;
        self.tool("procs", &["--col", col, "--phase", "steady"], "procs")
            .await?;
        self.heap_info().await;
        let bytes = self.listener_bytes().await?;
        let results = self.results();
        let set = [
            "set".to_string(),
            "--results".into(),
            results.to_string_lossy().to_string(),
            "--col".into(),
            col.into(),
            format!("listener_bytes={bytes}"),
            format!("load_from_ms={load_from}"),
            format!("load_to_ms={load_to}"),
            format!("rest_from_ms={rest_from}"),
            format!("rest_to_ms={rest_to}"),
        ];
        sh(&self.tool.to_string_lossy(), &set).await?;
        let l = h3i_scenarios::k8s::get(
            &Api::<h3_ingress::api::Http3Listener>::all(self.client.clone()),
            LISTENER,
        )
        .await?;
        let st = l.and_then(|l| l.status).unwrap_or_default();
        let ready = st
            .conditions
            .iter()
            .find(|c| c.type_ == h3_ingress::api::conditions::READY);
        let (rs, rr) = ready
            .map(|c| (c.status.clone(), c.reason.clone()))
            .unwrap_or_default();
        ok(format!(
            "listener object: {bytes} bytes; status: {} {}={rs} {rr}",
            st.hosts_summary.unwrap_or_default(),
            h3_ingress::api::conditions::READY
        ));
        Ok(())
    }

    /// The API server's /metrics into `file` (the tool compares two scrapes).
    async fn api_metrics(&self, file: &std::path::Path) -> Result<()> {
        let text = sh("kubectl", &["get", "--raw", "/metrics"]).await?;
        std::fs::write(file, text).map_err(|e| io("write the API server's metrics", e))
    }

    /// The listener as `kubectl get h3l -o json` prints it, in bytes (what the table reports).
    async fn listener_bytes(&self) -> Result<usize> {
        Ok(sh("kubectl", &["get", "h3l", LISTENER, "-o", "json"])
            .await?
            .len())
    }

    /// The data plane's connections to the TCP ingress (in use or idle in its pool), the most
    /// of any pod.
    async fn upstream_open(&self) -> u64 {
        let mut most = 0;
        for ip in &self.env.ips {
            let n = h3i_scenarios::prom::metric(
                &format!("{ip}:9476"),
                "h3_ingress_upstream_connections",
                &[],
            )
            .await;
            most = most.max(n.unwrap_or(0.0) as u64);
        }
        most
    }

    /// The steady window, `--window` seconds from `from`, and longer if needed until the
    /// pool's connections from the harness's requests to every host have closed (idle timeout;
    /// fewer than SETTLE_MIN left) and a trim (every 30 s) has run since, so the memory read
    /// after it is the steady state and not the tail of that burst (cap SETTLE_CAP seconds past
    /// the window).
    async fn rest_window(&self, from: u64) {
        let end = from + self.opts.window * 1000;
        let cap = from + (self.opts.window + SETTLE_CAP) * 1000;
        let (mut empty_at, mut first) = (None, None);
        loop {
            let open = self.upstream_open().await;
            first.get_or_insert(open);
            // A few connections weigh nothing (the baseline's pool; the Alt-Svc probe, one
            // host a second, keeps 30 to 60 open per pod): only the pool of a burst is awaited.
            if open < SETTLE_MIN {
                empty_at.get_or_insert(now_ms());
            } else {
                empty_at = None;
            }
            let t = now_ms();
            if t >= end && empty_at.is_some_and(|e| t - e >= TRIM_WAIT * 1000) {
                break;
            }
            if t >= cap {
                info(format!("upstream connections still open ({open}) {SETTLE_CAP}s after the window: memory read anyway"));
                break;
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        let (secs, first) = ((now_ms() - from) / 1000, first.unwrap_or(0));
        if first < SETTLE_MIN {
            info(format!("steady window: {secs} s ({first} upstream connections at its start, the most of any pod)"));
        } else {
            let settled = (empty_at.unwrap_or_else(now_ms) - from) / 1000;
            info(format!(
                "steady window: {secs} s ({first} upstream connections at its start, the most of any pod; fewer than {SETTLE_MIN} from {settled} s into it)"
            ));
        }
    }

    /// What each process's allocator says it holds (`*heap_bytes`): live data against what
    /// it keeps, next to the RSS the table shows.
    async fn heap_info(&self) {
        let heap = |addr: String, name: &'static str| async move {
            let Ok((200, text)) = h3i_scenarios::prom::http_get(&addr, "/metrics").await else {
                return "?".to_string();
            };
            let used = h3i_scenarios::prom::sum(&text, name, &[("state", "in_use")]);
            let free = h3i_scenarios::prom::sum(&text, name, &[("state", "free")]);
            match used {
                Some(u) => format!(
                    "{:.0} MiB in use, {:.0} MiB free",
                    u / 1048576.0,
                    free.unwrap_or(0.0) / 1048576.0
                ),
                None => "?".to_string(),
            }
        };
        let mut line = String::new();
        let ops = app::pods(&self.client, &app::op_selector())
            .await
            .unwrap_or_default();
        let op_ip = ops
            .first()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.pod_ip.clone());
        if let Some(ip) = op_ip {
            line = format!(
                "operator {}",
                heap(format!("{ip}:9477"), "h3_ingress_operator_heap_bytes").await
            );
        }
        for ip in &self.env.ips {
            line += &format!(
                "; data plane {ip} {}",
                heap(format!("{ip}:9476"), "h3_ingress_heap_bytes").await
            );
        }
        info(format!("heap: {line}"));
    }

    /// Log lines per pod per minute in the col's windows, and repeats from `repeat_from` until
    /// now.
    async fn logs(&self, col: &str, repeat_from: u64) -> Result<()> {
        let text =
            std::fs::read_to_string(self.results()).map_err(|e| io("read results.json", e))?;
        let r: serde_json::Value = serde_json::from_str(&text).map_err(|source| Error::Json {
            context: "results.json".into(),
            source,
        })?;
        let get = |k: &str| format!("{:.0}", r[format!("{col}.{k}")].as_f64().unwrap_or(0.0));
        let (lf, lt, rf, rt) = (
            get("load_from_ms"),
            get("load_to_ms"),
            get("rest_from_ms"),
            get("rest_to_ms"),
        );
        let (from, to) = (repeat_from.to_string(), now_ms().to_string());
        let args = [
            "--col",
            col,
            "--load-from",
            &lf,
            "--load-to",
            &lt,
            "--rest-from",
            &rf,
            "--rest-to",
            &rt,
            "--repeat-from",
            &from,
            "--repeat-to",
            &to,
        ];
        self.tool("logs", &args, "logs").await
    }

    async fn latency(&self, col: &str, rounds: u32) -> Result<()> {
        let (r, t, share) = (
            rounds.to_string(),
            format!("{}s", self.opts.latency_timeout),
            self.share(),
        );
        let mut args = vec![
            "--col",
            col,
            "--rounds",
            &r,
            "--timeout",
            &t,
            "--route-share",
            &share,
        ];
        if self.opts.rsa {
            args.push("--rsa");
        }
        self.tool("latency", &args, &format!("latency ({col})"))
            .await
    }

    async fn restart(&self, col: &str) -> Result<()> {
        let t = format!("{}s", self.opts.restart_timeout);
        let args = [
            "--col",
            col,
            "--node",
            &self.env.nodes[0],
            "--node-ip",
            &self.env.ips[0],
            "--timeout",
            &t,
        ];
        self.tool("restart", &args, &format!("restart ({col})"))
            .await
    }

    pub(super) async fn table(&mut self, run: &mut Run) -> Result<()> {
        run.step("the table");
        let elapsed = self.started.elapsed().as_secs().to_string();
        let results = self.results().to_string_lossy().to_string();
        let hosts = self.opts.hosts.to_string();
        let assert = format!("--assert={}", self.opts.assert);
        let mut args = vec![
            "report",
            "--results",
            &results,
            "--hosts",
            &hosts,
            &assert,
            "--elapsed",
            &elapsed,
        ];
        if let Some(out) = &self.opts.out {
            args.extend(["--out", out]);
        }
        let out = output(&self.tool.to_string_lossy(), &args).await?;
        print!("{}", out.stdout);
        eprint!("{}", out.stderr);
        println!(
            "load average: at the start {}, at the end {}; binary {}",
            self.load_start,
            load(),
            self.env.binary.display()
        );
        if !out.success() {
            return fail(format!(
                "targets missed at {} hosts (see above)",
                self.opts.hosts
            ));
        }
        if !self.opts.assert {
            println!("--no-assert: targets reported, not enforced");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hard_open_files_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(nofile_hard(limits), Some(524288));
        assert_eq!(
            nofile_hard(
                "Max open files            unlimited            unlimited            files\n"
            ),
            None
        );
    }

    #[test]
    fn the_catch_all_server_loads_the_certificate_named_by_sni() {
        let c = nginx_conf("n1", "/t/nginx-n1", "/t/certs", 1124);
        assert!(c.contains("ssl_certificate /t/certs/$ssl_server_name.pem;"));
        assert!(c.contains("worker_connections 1024;"));
        assert!(c.contains("return 200 \"$host on n1\\n\";"));
        assert_eq!(c.matches('{').count(), c.matches('}').count());
    }
}
