//! What only a real node can answer (real kubelets, containerd, runc, CNI and kube-proxy): the
//! chart installed with the registry's pull secret, a Debian nginx on each node standing in for
//! the TCP ingress, an Http3Listener serving shop.h3i.test. Checks: the image digest and a pod
//! without the pull secret; the containers runc made (capabilities, no new privileges,
//! seccomp, read-only root); HTTP/3 through a NodePort via kube-proxy; Debian's Chromium
//! through a node address; the termination grace under a slow download; the liveness probe on a
//! hung process; an OOM kill and its reason in the status; `socket.forceBuffers` and
//! NET_ADMIN. `H3I_NODE_CHECKS_KEEP=1` keeps its objects.

mod checks;
mod procs;

use std::path::PathBuf;

use h3i_scenarios::app::{self, NS_OP};
use h3i_scenarios::h3::{self, Expect, Target};
use h3i_scenarios::{Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt};
use tokio::process::Child;

use crate::FromEnv;

const NS_APP: &str = "h3i-nodes";
/// tests/browser/chromium.py's host.
const HOST: &str = "shop.h3i.test";
const CLASS: &str = "h3i-nodes";
const LISTENER: &str = "nodes";
/// The listener whose pods the kernel OOM-kills.
const TINY: &str = "tiny";
const TINY_MEMORY: &str = "8Mi";
/// http.drainTimeoutSeconds; the pods' grace period is this plus the margin.
const DRAIN: u32 = 30;
/// 512 KiB at 32 KiB/s: a download of about 16 s that spans a pod deletion.
const SLOW_BYTES: usize = 524_288;
const SLOW_RATE: &str = "32k";
const CAP_NET_BIND_SERVICE: u64 = 1 << 10;
const CAP_NET_ADMIN: u64 = 1 << 12;

/// The run's state: the cluster, the scratch directory, nginx, the background processes.
pub struct Nodes {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    ca: PathBuf,
    slow_sha: String,
    /// Clients and stalled upstreams still running (killed at clean-up).
    children: Vec<Child>,
}

impl FromEnv for Nodes {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-node-checks")
            .unwrap_or_else(|_| "/tmp/h3i-node-checks".into());
        let extra = format!(
            "location /slow/ {{ limit_rate {SLOW_RATE}; }} location = /index.html {{ default_type text/html; }}"
        );
        Nodes {
            nginx: Nginx::new(&tmp, app::ALT_SVC, &extra),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            slow_sha: String::new(),
            children: Vec::new(),
        }
    }
}

impl Scenario for Nodes {
    const TITLE: &'static str = "NODE CHECKS";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        self.image(run).await?;
        self.containers(run).await?;
        self.node_port(run).await?;
        self.browser(run).await?;
        self.grace(run).await?;
        self.liveness(run).await?;
        self.oom(run).await?;
        self.force_buffers(run).await?;
        run.step("done: real-node checks");
        Ok(())
    }

    async fn cleanup(&mut self) {
        for c in &mut self.children {
            let _ = c.start_kill();
        }
        let ls = Api::<h3_ingress::api::Http3Listener>::all(self.client.clone());
        let _ = h3i_scenarios::k8s::delete(&ls, TINY).await;
        if app::keep("H3I_NODE_CHECKS_KEEP") {
            println!(
                "H3I_NODE_CHECKS_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        app::remove_objects(&self.client, &[NS_APP]).await;
        let classes =
            Api::<k8s_openapi::api::networking::v1::IngressClass>::all(self.client.clone());
        let _ = h3i_scenarios::k8s::delete(&classes, CLASS).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Nodes {
    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS_OP)
    }

    /// The data plane pods of the listener: (name, node, Ready).
    async fn pods_state(&self) -> Result<Vec<(String, String, bool)>> {
        let pods = app::pods(&self.client, &app::dp_selector(LISTENER)).await?;
        Ok(pods
            .iter()
            .map(|p| (p.name_any(), app::node_of(p), app::pod_ready(p)))
            .collect())
    }

    async fn ready_pods(&self) -> Result<usize> {
        Ok(self.pods_state().await?.iter().filter(|p| p.2).count())
    }

    /// The listener's data plane pod on `node`.
    async fn pod_on(&self, node: &str) -> Result<String> {
        let st = self.pods_state().await?;
        match st.into_iter().find(|p| p.1 == node) {
            Some(p) => Ok(p.0),
            None => h3i_scenarios::fail(format!("no data plane pod of {LISTENER} on {node}")),
        }
    }

    async fn pid(&self, pod: &str, container: &str) -> Result<u32> {
        h3i_scenarios::pods::pid(&self.env, &self.pods_api(), NS_OP, pod, container).await
    }

    /// One aioquic GET /whoami to `addr:port` answered 200.
    async fn h3_ok(&self, addr: &str, port: u16) -> Result<bool> {
        let t = Target {
            addr,
            host: HOST,
            port,
            path: "/whoami",
            cacert: &self.ca,
        };
        h3::get(h3::Client::Aioquic, &t, &Expect::default()).await?;
        Ok(true)
    }

    async fn served_everywhere(&self) -> Result<bool> {
        for ip in &self.env.ips {
            self.h3_ok(ip, 443).await?;
        }
        Ok(true)
    }

    /// The listener's condition of this type as (status, reason, message).
    async fn cond(&self, listener: &str, type_: &str) -> Result<(String, String, String)> {
        let c = h3i_scenarios::k8s::condition(&self.client, listener, type_).await?;
        Ok(c.map(|c| (c.status, c.reason, c.message))
            .unwrap_or_default())
    }
}
