//! The user's journey (`tests/cluster/README.md` lists its steps): helm install, a TCP ingress
//! (Debian nginx) on each node, an annotated Ingress, an Http3Listener, HTTP/3 on every node
//! address with two independent clients, status and the kubectl plugin, certificate rotation,
//! the per-host switch, a rolling socket change, leader hand-over, garbage collection, the
//! CRD's CEL rule, an API server outage, RBAC as the API server judges it, and the operator's
//! fixes a real cluster needs. `H3I_JOURNEY_KEEP=1` keeps its objects and nginx afterwards.

mod control;
mod install;
mod serve;

use h3i_scenarios::k8s::Apis;
use std::collections::BTreeMap;
use std::path::PathBuf;

use h3_ingress::api::{conditions, Http3Listener};
use h3_ingress::operator::labels;
use h3_ingress::operator::resources::{cluster_rbac_name, data_plane_name, rbac_name};
use h3i_scenarios::h3::{self, Expect, Refusal, Target};
use h3i_scenarios::k8s::{self, controller_of};
use h3i_scenarios::{fail, indent, Env, Nginx, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{json, Value};

use crate::FromEnv;

/// The release namespace: operator and data plane.
const NS_OP: &str = "h3-ingress";
const RELEASE: &str = "h3-ingress";
const NS_APP: &str = "h3i-journey-shop";
/// The certificate mirrors (chart default: `<release namespace>-hosts`).
const NS_HOSTS: &str = "h3-ingress-hosts";
const HOST: &str = "shop.h3i.test";
const HOST2: &str = "shop2.h3i.test";
const LISTENER: &str = "journey";
/// The chart's operator ServiceAccount (the release name).
const OP_SA: &str = "h3-ingress";
/// The chart's namespaced Role of the operator, and its Deployment.
const OP_ROLE: &str = "h3-ingress-operator";
const OP_DEPLOY: &str = "h3-ingress-operator";
const LEASE: &str = "h3-ingress-operator";
const IMAGE_REPO: &str = "registry.h3i.test/h3-ingress";
/// What nginx advertises (the proxy's own default differs).
const ALT_SVC: &str = "h3=\":443\"; ma=3600";
const OP_ADMIN_PORT: u16 = 9477;
const DP_ADMIN_PORT: u16 = 9476;

/// The run's state: the cluster, the scratch directory, nginx and what earlier steps found.
pub struct Journey {
    env: Env,
    client: Client,
    tmp: PathBuf,
    nginx: Nginx,
    ca: PathBuf,
    cert_v1: String,
    cert_v2: String,
    cert_host2: String,
    body_sha: String,
    app_version: String,
    op_pod: String,
    listener_uid: String,
    /// Data plane pod name to its process.
    dp_pid: BTreeMap<String, u32>,
    /// The privileged init container's image, pinned by digest as a mirror would (never
    /// pulled: only the Pod Security step's listener, whose pods admission refuses, uses it).
    tune_image: String,
}

impl FromEnv for Journey {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp =
            h3i_scenarios::scratch_dir("h3i-journey").unwrap_or_else(|_| "/tmp/h3i-journey".into());
        let digest = h3i_scenarios::pki::sha256_hex(b"h3i-journey");
        Journey {
            nginx: Nginx::new(&tmp, ALT_SVC, ""),
            ca: tmp.join("pki/ca.crt"),
            env,
            client,
            tmp,
            cert_v1: String::new(),
            cert_v2: String::new(),
            cert_host2: String::new(),
            body_sha: String::new(),
            app_version: String::new(),
            op_pod: String::new(),
            listener_uid: String::new(),
            dp_pid: BTreeMap::new(),
            tune_image: format!("registry.h3i.test/mirror/busybox@sha256:{digest}"),
        }
    }
}

impl Scenario for Journey {
    const TITLE: &'static str = "JOURNEY";

    fn namespace(&self) -> &str {
        NS_OP
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        self.prepare().await?;
        self.install(run).await?;
        self.tcp_ingress(run).await?;
        self.application(run).await?;
        self.listener(run).await?;
        self.data_plane(run).await?;
        self.http3(run).await?;
        self.columns(run).await?;
        self.plugin(run).await?;
        self.admin(run).await?;
        self.steady(run).await?;
        self.rotate(run).await?;
        self.annotation(run).await?;
        self.socket_roll(run).await?;
        self.port_conflicts(run).await?;
        self.hand_over(run).await?;
        self.service(run).await?;
        self.cel(run).await?;
        self.apiserver_restart(run).await?;
        self.rbac(run).await?;
        self.garbage_collection(run).await?;
        self.pod_security(run).await
    }

    async fn cleanup(&mut self) {
        if std::env::var("H3I_JOURNEY_KEEP").is_ok_and(|v| v == "1") {
            println!(
                "H3I_JOURNEY_KEEP=1: objects, nginx and {} left in place",
                self.tmp.display()
            );
            return;
        }
        self.nginx.stop();
        self.remove_objects(false).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

impl Apis for Journey {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Journey {
    fn dp(&self) -> String {
        data_plane_name(LISTENER)
    }

    /// The data plane's Role(Binding) in the hosts namespace.
    fn dp_rbac(&self) -> String {
        rbac_name(LISTENER)
    }

    /// Its ClusterRole(Binding): named after the operator's namespace too, so a second
    /// installation's listener of the same name never shares it.
    fn dp_cluster_rbac(&self) -> String {
        cluster_rbac_name(LISTENER, NS_OP)
    }

    fn dp_user(&self) -> String {
        format!("system:serviceaccount:{NS_OP}:{}", self.dp())
    }

    fn op_user(&self) -> String {
        format!("system:serviceaccount:{NS_OP}:{OP_SA}")
    }

    /// `app.kubernetes.io/instance=LISTENER,app.kubernetes.io/component=data-plane`
    fn dp_selector(&self) -> String {
        format!(
            "{}={LISTENER},{}={}",
            labels::INSTANCE,
            labels::COMPONENT,
            labels::COMPONENT_DATA_PLANE
        )
    }

    async fn listener_obj(&self, name: &str) -> Result<Option<Http3Listener>> {
        k8s::get(&self.all::<Http3Listener>(), name).await
    }

    /// The listener's Ready condition as (status, reason, message), empty when absent.
    async fn ready(&self, name: &str) -> Result<(String, String, String)> {
        let c = k8s::condition(&self.client, name, conditions::READY).await?;
        Ok(c.map(|c| (c.status, c.reason, c.message))
            .unwrap_or_default())
    }

    /// `hostsSummary` and `nodes.summary` of a listener.
    async fn summaries(&self, name: &str) -> Result<(String, String)> {
        let s = self
            .listener_obj(name)
            .await?
            .and_then(|l| l.status)
            .unwrap_or_default();
        Ok((
            s.hosts_summary.unwrap_or_default(),
            s.nodes.map(|n| n.summary).unwrap_or_default(),
        ))
    }

    async fn ds_pods(&self) -> Result<Vec<Pod>> {
        k8s::list(&self.ns::<Pod>(NS_OP), &self.dp_selector()).await
    }

    /// `name uid restarts node` per data plane pod, sorted.
    async fn pods_state(&self) -> Result<Vec<(String, String, i32, String)>> {
        let mut v: Vec<_> = self
            .ds_pods()
            .await?
            .iter()
            .map(|p| {
                let restarts = p
                    .status
                    .iter()
                    .flat_map(|s| s.container_statuses.iter().flatten())
                    .map(|c| c.restart_count)
                    .next();
                let node = p
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.clone())
                    .unwrap_or_default();
                (
                    p.name_any(),
                    p.uid().unwrap_or_default(),
                    restarts.unwrap_or(0),
                    node,
                )
            })
            .collect();
        v.sort();
        Ok(v)
    }

    /// All pods of the DaemonSet updated, available and ready.
    async fn ds_rolled_out(&self, name: &str) -> Result<bool> {
        let Some(ds) = k8s::get(&self.ns::<DaemonSet>(NS_OP), name).await? else {
            return Ok(false);
        };
        let st = ds.status.unwrap_or_default();
        let want = st.desired_number_scheduled;
        Ok(ds.metadata.generation == st.observed_generation
            && want > 0
            && st.updated_number_scheduled == Some(want)
            && st.number_ready == want
            && st.number_available == Some(want))
    }

    /// The pod named by the operator's Lease, if someone holds it.
    async fn leader_pod(&self) -> Result<Option<String>> {
        let lease = k8s::get(&self.ns::<Lease>(NS_OP), LEASE).await?;
        let holder = lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default();
        Ok(holder
            .rsplit_once('_')
            .map(|(pod, _)| pod.to_string())
            .filter(|p| !p.is_empty()))
    }

    /// A replica that still exists holds the Lease (not empty after a release, not a deleted pod).
    async fn leader_running(&self) -> Result<bool> {
        let Some(pod) = self.leader_pod().await? else {
            return Ok(false);
        };
        let Some(p) = k8s::get(&self.ns::<Pod>(NS_OP), &pod).await? else {
            return Ok(false);
        };
        let phase = p.status.and_then(|s| s.phase).unwrap_or_default();
        Ok(p.metadata.deletion_timestamp.is_none() && phase == "Running")
    }

    /// A metric summed over its labels, from the leader's admin endpoint.
    async fn operator_metric(&self, name: &str) -> Result<f64> {
        let Some(pod) = self.leader_pod().await? else {
            return fail("nobody holds the operator's Lease");
        };
        let p = self.ns::<Pod>(NS_OP).get(&pod).await?;
        let ip = p.status.and_then(|s| s.pod_ip).unwrap_or_default();
        h3i_scenarios::prom::metric(&format!("{ip}:{OP_ADMIN_PORT}"), name, &[]).await
    }

    /// The object has a controller owner reference to the listener.
    fn owned_by_listener<K: Resource>(&self, what: &str, object: &K) -> Result<()> {
        let want = format!("Http3Listener/{LISTENER}/{}", self.listener_uid);
        let got = controller_of(object);
        if got != want {
            return fail(format!("{what}: controller owner '{got}', want {want}"));
        }
        Ok(())
    }

    /// Applies an Http3Listener (ingress class nginx, upstream the node's nginx).
    async fn apply_listener(
        &self,
        name: &str,
        port: u16,
        metrics_port: u16,
        extra: Value,
    ) -> Result<()> {
        let mut spec = json!({
            "ingressClassName": "nginx",
            "port": port,
            "upstream": {"address": "127.0.0.1:443"},
            "metrics": {"address": format!("[::]:{metrics_port}")},
            "http": {"drainTimeoutSeconds": 2},
        });
        if let (Some(s), Value::Object(more)) = (spec.as_object_mut(), extra) {
            s.extend(more);
        }
        let obj = json!({"apiVersion": "h3-ingress.dev/v1alpha1", "kind": "Http3Listener", "metadata": {"name": name}, "spec": spec});
        k8s::apply(&self.all::<Http3Listener>(), name, &obj).await?;
        indent(format!("http3listener.h3-ingress.dev/{name} applied (port {port}, metrics [::]:{metrics_port})"));
        Ok(())
    }

    /// An Ingress with the h3 annotation for `host` (Secret `<first label>-tls`).
    fn ingress(name: &str, class: Option<&str>, host: &str) -> Value {
        let secret = format!("{}-tls", host.split('.').next().unwrap_or(host));
        let mut spec = json!({
            "tls": [{"hosts": [host], "secretName": secret}],
            "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}],
        });
        if let Some(c) = class {
            spec["ingressClassName"] = json!(c);
        }
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS_APP,
                "annotations": {h3_ingress::api::annotations::ENABLED: "true"}},
            "spec": spec})
    }

    /// A `kubernetes.io/tls` Secret from the PKI's files `NAME.crt` and `.key`.
    async fn tls_secret(&self, ns: &str, name: &str, files: &str) -> Result<()> {
        let read = |ext: &str| {
            let p = self.tmp.join(format!("pki/{files}.{ext}"));
            std::fs::read(&p).map_err(|source| h3i_scenarios::Error::Io {
                context: format!("read {}", p.display()),
                source,
            })
        };
        let s = Secret {
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("tls.crt".to_string(), k8s_openapi::ByteString(read("crt")?)),
                ("tls.key".to_string(), k8s_openapi::ByteString(read("key")?)),
            ])),
            ..Default::default()
        };
        let mut v = serde_json::to_value(&s).map_err(|source| h3i_scenarios::Error::Json {
            context: "Secret".into(),
            source,
        })?;
        v["apiVersion"] = json!("v1");
        v["kind"] = json!("Secret");
        v["metadata"] = json!({"name": name, "namespace": ns});
        k8s::apply(&self.ns::<Secret>(ns), name, &v).await?;
        Ok(())
    }

    fn target<'a>(&'a self, addr: &'a str, host: &'a str, path: &'a str) -> Target<'a> {
        Target {
            addr,
            host,
            port: 443,
            path,
            cacert: &self.ca,
        }
    }

    /// Both clients on every node address (IPv4), then aioquic on the first node's IPv6
    /// address: status 200, the certificate, /1m.bin's hash and nginx's Alt-Svc.
    async fn h3_both(&self, host: &str, cert: &str) -> Result<()> {
        let full = Expect {
            cert_sha256: Some(cert),
            body_sha256: Some(&self.body_sha),
            alt_svc: Some(ALT_SVC),
        };
        for ip in &self.env.ips {
            let t = self.target(ip, host, "/1m.bin");
            indent(h3::get(h3::Client::Aioquic, &t, &full).await?);
            indent(h3::get(h3::Client::Curl, &t, &full).await?);
        }
        let t = self.target(&self.env.ips6[0], host, "/whoami");
        let want = Expect {
            cert_sha256: Some(cert),
            body_sha256: None,
            alt_svc: Some(ALT_SVC),
        };
        indent(h3::get(h3::Client::Aioquic, &t, &want).await?);
        Ok(())
    }

    /// One aioquic GET /whoami on every node with this certificate (for polling).
    async fn h3_all_nodes(&self, host: &str, cert: &str) -> Result<bool> {
        let want = Expect {
            cert_sha256: Some(cert),
            ..Default::default()
        };
        for ip in &self.env.ips {
            h3::get(
                h3::Client::Aioquic,
                &self.target(ip, host, "/whoami"),
                &want,
            )
            .await?;
        }
        Ok(true)
    }

    async fn refused_all_nodes(&self, host: &str, kind: Refusal) -> Result<bool> {
        for ip in &self.env.ips {
            h3::refused(&self.target(ip, host, "/"), kind).await?;
        }
        Ok(true)
    }
}
