//! The skew scenario's part (c): a host's certificate rotated in both orders under
//! `upstream.verify: servedCertificate` while HTTP/3 requests run on both nodes, and the control
//! without a grace.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use h3i_scenarios::h3::Target;
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, indent, info};
use serde_json::json;

use super::crd::first_label;
use super::*;

const GRACE: &str = "h3_ingress_upstream_certificate_grace_total";
const UPSTREAM_ERRORS: &str = "h3_ingress_upstream_errors_total";

impl Skew {
    fn secret_name(&self) -> String {
        format!("{}-tls", first_label(HOSTS[0]))
    }

    /// nginx first (the Secret 5 s later), then the Secret first (nginx 5 s after both nodes
    /// serve it).
    async fn rotate_both_orders(&self, v2: &Leaf, v3: &Leaf) -> Result<()> {
        let sleep = |s| tokio::time::sleep(Duration::from_secs(s));
        sleep(3).await;
        info("nginx first: both nodes' nginx present v2, the Secret follows 5 s later");
        self.nginx.use_cert(&self.env.nodes, HOSTS[0], v2).await?;
        sleep(5).await;
        app::tls_secret(&self.client, NS_APP, &self.secret_name(), v2).await?;
        wait_ok(60, "both nodes serve v2", || {
            self.served_everywhere(HOSTS[0], &v2.sha256)
        })
        .await?;
        sleep(3).await;
        info("the Secret first: v3, nginx follows 5 s after both nodes serve it");
        app::tls_secret(&self.client, NS_APP, &self.secret_name(), v3).await?;
        wait_ok(60, "both nodes serve v3", || {
            self.served_everywhere(HOSTS[0], &v3.sha256)
        })
        .await?;
        sleep(5).await;
        self.nginx.use_cert(&self.env.nodes, HOSTS[0], v3).await?;
        sleep(3).await;
        Ok(())
    }

    pub(super) async fn rotation(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "(c) {} rotated in both orders under servedCertificate, HTTP/3 requests running on both nodes",
            HOSTS[0]
        ));
        let v2 = self.chained_leaf("v2", HOSTS[0])?;
        let v3 = self.chained_leaf("v3", HOSTS[0])?;
        let targets: Vec<Target> = self
            .env
            .ips
            .iter()
            .map(|ip| Target {
                addr: ip,
                host: HOSTS[0],
                port: 443,
                path: "/whoami",
                cacert: &self.ca,
            })
            .collect();
        let stop = AtomicBool::new(false);
        let load = h3::load_until(&targets, 300, 2, Duration::from_millis(200), &stop);
        let rotate = async {
            let r = self.rotate_both_orders(&v2, &v3).await;
            stop.store(true, Ordering::Relaxed);
            r
        };
        let (load, rotated) = tokio::join!(load, rotate);
        rotated?;
        let load = load.map_err(|e| {
            h3i_scenarios::Error::Check(format!("requests failed during the rotation: {e}"))
        })?;
        indent(&load);
        self.certs[0] = v3.sha256.clone();
        let next = self.dp_metric(GRACE, ("leaf", "next")).await?;
        let previous = self.dp_metric(GRACE, ("leaf", "previous")).await?;
        let tls_errors = self.dp_metric(UPSTREAM_ERRORS, ("kind", "tls")).await?;
        info(format!(
            "data plane, both nodes: handshakes accepted with the next leaf {next}, the previous leaf {previous}; upstream TLS errors {tls_errors}"
        ));
        ensure!(
            next > 0.0 && previous > 0.0,
            "both orders should have used the grace (next {next}, previous {previous})"
        );
        ensure!(tls_errors == 0.0, "{tls_errors} upstream TLS errors");
        let counts = load.split(',').next().unwrap_or_default();
        self.summary.push(format!(
            "(c) rotation both orders: {counts}, grace next {next} / previous {previous}, TLS errors {tls_errors}"
        ));
        Ok(())
    }

    pub(super) async fn control(&mut self, run: &mut Run) -> Result<()> {
        run.step("(c) control: with upstream.servedCertificateGraceSeconds 0 the same nginx-first switch fails until the Secret follows");
        let ls = Api::<Http3Listener>::all(self.client.clone());
        k8s::merge(
            &ls,
            LISTENER,
            &json!({"spec": {"upstream": {"servedCertificateGraceSeconds": 0}}}),
        )
        .await?;
        let v4 = self.chained_leaf("v4", HOSTS[0])?;
        // The data plane applies the listener change live.
        tokio::time::sleep(Duration::from_secs(3)).await;
        self.nginx.use_cert(&self.env.nodes, HOSTS[0], &v4).await?;
        let mut refused = 0;
        for ip in &self.env.ips {
            let t = Target {
                addr: ip,
                host: HOSTS[0],
                port: 443,
                path: "/whoami",
                cacert: &self.ca,
            };
            let line = match h3::aioquic(&t).await {
                Ok(a) => {
                    if a.status == Some(502) {
                        refused += 1;
                    }
                    format!(
                        "status {:?}, cert {} ({})",
                        a.status,
                        h3i_scenarios::cmd::head(&a.cert_sha256, 12),
                        a.detail
                    )
                }
                Err(e) => e.to_string(),
            };
            info(format!("{ip}: {}", h3i_scenarios::cmd::head(&line, 150)));
        }
        let n = self.env.ips.len();
        ensure!(
            refused == n,
            "without the grace the nginx-first switch should get 502 on every node ({refused} of {n})"
        );
        app::tls_secret(&self.client, NS_APP, &self.secret_name(), &v4).await?;
        wait_ok(60, "both nodes serve v4 once the Secret follows", || {
            self.served_everywhere(HOSTS[0], &v4.sha256)
        })
        .await?;
        self.summary.push(format!(
            "(c) control, grace 0: the nginx-first switch got 502 on {refused} of {n} nodes until the Secret followed"
        ));
        Ok(())
    }
}
