//! Traefik (`tests/cluster/traefik.sh`) works as the cluster's TCP ingress on the real nodes,
//! with the rules the front-door scenario leans on (tests/cluster/README.md, "Traefik and
//! CoreDNS"): entryPoint websecure trusting the host's forwarded headers, entryPoint h3proxy
//! (8443) taking PROXY protocol from the host; a busybox httpd behind a ClusterIP Service that
//! Traefik reaches through kube-proxy (`service.nativelb`), and one Ingress of class traefik per
//! case:
//! - `open` no middleware: HTTPS on every node, IPv4 and IPv6;
//! - `allow` ipAllowList [host/32], default ipStrategy (the connection's address);
//! - `xff` ipAllowList [192.0.2.7/32], ipStrategy.depth 1 (X-Forwarded-For);
//! - `conn` ipAllowList [192.0.2.7/32, 2001:db8::7/128], default ipStrategy.
//!
//! Clients: curl on the host and in the other node's namespace, `tests/py/proxyv2_get.py` for
//! PROXY protocol v2 (and v1). Every verdict is checked against the line the request left in
//! that node's access log (ClientHost, ClientAddr, the X-Forwarded-For and X-Real-Ip Traefik
//! passed on, the entryPoint, the service address). Traefik goes at the end unless
//! `H3I_TRAEFIK_KEEP=1`. Real nodes only.

mod checks;

use std::path::PathBuf;

use h3i_scenarios::cmd::{repo, run as sh};
use h3i_scenarios::k8s::{self, Apis};
use h3i_scenarios::poll::wait_ok;
use h3i_scenarios::{ensure, indent, ok, Env, Pki, Result, Run, Scenario};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, Service};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};

use crate::FromEnv;

const NS: &str = "traefik-check";
/// In the allow lists of `xff` and `conn`: only ever a claimed address.
const CLIENT_OK: &str = "192.0.2.7";
const CLIENT_OK6: &str = "2001:db8::7";
/// In no list.
const CLIENT_OTHER: &str = "198.51.100.9";
const BODY: &str = "traefik-check backend";
/// The hosts (`NAME.traefik.h3i.test`) and the Middleware each Ingress names.
const HOSTS: [(&str, Option<&str>); 4] = [
    ("open", None),
    ("allow", Some("allow-host")),
    ("xff", Some("allow-xff")),
    ("conn", Some("allow-conn")),
];

pub struct TraefikCheck {
    env: Env,
    client: Client,
    tmp: PathBuf,
    ca: PathBuf,
    /// The host's addresses on the cluster's bridge.
    host4: String,
    host6: String,
    cluster_ip: String,
}

impl FromEnv for TraefikCheck {
    fn from_env(env: Env, client: Client) -> Self {
        let tmp = h3i_scenarios::scratch_dir("h3i-traefik-check")
            .unwrap_or_else(|_| "/tmp/h3i-traefik-check".into());
        TraefikCheck {
            env,
            client,
            ca: tmp.join("pki/ca.crt"),
            tmp,
            host4: std::env::var("H3I_HOST_IP").unwrap_or_default(),
            host6: std::env::var("H3I_HOST_IP6").unwrap_or_default(),
            cluster_ip: String::new(),
        }
    }
}

impl Apis for TraefikCheck {
    fn client(&self) -> &Client {
        &self.client
    }
}

impl Scenario for TraefikCheck {
    const TITLE: &'static str = "TRAEFIK CHECK";

    fn namespace(&self) -> &str {
        "traefik"
    }

    async fn run(&mut self, run: &mut Run) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
        );
        ensure!(
            !self.host4.is_empty() && !self.host6.is_empty(),
            "H3I_HOST_IP and H3I_HOST_IP6 are not set (scripts/cluster.sh env)"
        );
        self.traefik_up(run).await?;
        self.objects(run).await?;
        self.routing(run).await?;
        self.allow_list(run).await?;
        self.forwarded_headers(run).await?;
        self.proxy_protocol(run).await
    }

    async fn cleanup(&mut self) {
        if std::env::var("H3I_TRAEFIK_KEEP").is_ok_and(|v| v == "1") {
            println!(
                "H3I_TRAEFIK_KEEP=1: Traefik, namespace {NS} and {} left in place",
                self.tmp.display()
            );
            return;
        }
        let _ = k8s::delete(&self.all::<Namespace>(), NS).await;
        let _ = sh(&traefik_sh(), &["down"]).await;
        let _ = std::fs::remove_dir_all(&self.tmp);
    }
}

fn traefik_sh() -> String {
    repo()
        .join("tests/cluster/traefik.sh")
        .to_string_lossy()
        .into_owned()
}

fn fqdn(name: &str) -> String {
    format!("{name}.traefik.h3i.test")
}

impl TraefikCheck {
    async fn traefik_up(&self, run: &mut Run) -> Result<()> {
        let (h4, h6) = (&self.host4, &self.host6);
        run.step(format!("Traefik up: websecure trusts X-Forwarded-* from {h4}; h3proxy :8443 takes PROXY protocol from {h4}, {h6}"));
        let trusted = format!("{h4}/32");
        let proxy_trusted = format!("{h4}/32,{h6}/128");
        let args = [
            "up",
            "--trusted-ips",
            &trusted,
            "--proxy-trusted-ips",
            &proxy_trusted,
        ];
        indent(sh(&traefik_sh(), &args).await?);
        Ok(())
    }

    /// The namespace, a leaf and TLS Secret per host, the backend, the Middlewares and the
    /// Ingresses; waits for the backend.
    async fn objects(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "backend, TLS Secrets, Middlewares and Ingresses (class traefik) in {NS}"
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
        k8s::apply(&self.all::<Namespace>(), NS, &ns).await?;
        let pki = Pki::new(&self.tmp.join("pki"), "traefik-check-ca")?;
        for (name, middleware) in HOSTS {
            let leaf = pki.leaf(name, &fqdn(name))?;
            let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
            let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": format!("{name}-tls"), "namespace": NS},
                "stringData": {"tls.crt": read(&leaf.crt), "tls.key": read(&leaf.key)}});
            k8s::apply(&self.ns::<Secret>(NS), &format!("{name}-tls"), &secret).await?;
            self.ingress(name, middleware).await?;
        }
        self.backend().await?;
        let (h4, ok4, ok6) = (&self.host4, CLIENT_OK, CLIENT_OK6);
        self.middleware(
            "allow-host",
            json!({"ipAllowList": {"sourceRange": [format!("{h4}/32")]}}),
        )
        .await?;
        self.middleware(
            "allow-xff",
            json!({"ipAllowList": {"sourceRange": [format!("{ok4}/32")], "ipStrategy": {"depth": 1}}}),
        )
        .await?;
        self.middleware(
            "allow-conn",
            json!({"ipAllowList": {"sourceRange": [format!("{ok4}/32"), format!("{ok6}/128")]}}),
        )
        .await?;
        let deploys = self.ns::<Deployment>(NS);
        wait_ok(90, "backend Ready", || async {
            let d = k8s::get(&deploys, "backend").await?;
            Ok(d.and_then(|d| d.status?.available_replicas).unwrap_or(0) >= 1)
        })
        .await?;
        let svc = k8s::get(&self.ns::<Service>(NS), "backend").await?;
        self.cluster_ip = svc.and_then(|s| s.spec?.cluster_ip).unwrap_or_default();
        ok(format!("Service backend at {}", self.cluster_ip));
        Ok(())
    }

    /// busybox httpd serving [`BODY`], behind a Service Traefik reaches through its ClusterIP.
    async fn backend(&self) -> Result<()> {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "www", "namespace": NS},
            "data": {"index.html": format!("{BODY}\n")}});
        k8s::apply(&self.ns::<ConfigMap>(NS), "www", &cm).await?;
        let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "backend", "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "backend"}},
              "template": {"metadata": {"labels": {"app": "backend"}},
                "spec": {"containers": [{"name": "httpd", "image": "registry.h3i.test/busybox:1",
                  "imagePullPolicy": "IfNotPresent",
                  "command": ["/bin/busybox", "httpd", "-f", "-v", "-p", "8080", "-h", "/www"],
                  "ports": [{"containerPort": 8080}],
                  "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                  "volumeMounts": [{"name": "www", "mountPath": "/www"}]}],
                  "volumes": [{"name": "www", "configMap": {"name": "www"}}]}}}});
        k8s::apply(&self.ns::<Deployment>(NS), "backend", &deploy).await?;
        // Traefik sends to the ClusterIP (kube-proxy) instead of the pods' addresses.
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "backend", "namespace": NS,
              "annotations": {"traefik.ingress.kubernetes.io/service.nativelb": "true"}},
            "spec": {"selector": {"app": "backend"}, "ports": [{"port": 80, "targetPort": 8080}]}});
        k8s::apply(&self.ns::<Service>(NS), "backend", &svc).await?;
        Ok(())
    }

    async fn ingress(&self, name: &str, middleware: Option<&str>) -> Result<()> {
        let annotations = match middleware {
            Some(m) => json!({"traefik.ingress.kubernetes.io/router.middlewares":
                format!("{NS}-{m}@kubernetescrd")}),
            None => json!({}),
        };
        let host = fqdn(name);
        let ing = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"ingressClassName": "traefik",
              "tls": [{"hosts": [host], "secretName": format!("{name}-tls")}],
              "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": "backend", "port": {"number": 80}}}}]}}]}});
        k8s::apply(&self.ns::<Ingress>(NS), name, &ing).await?;
        Ok(())
    }

    async fn middleware(&self, name: &str, spec: Value) -> Result<()> {
        let gvk = GroupVersionKind::gvk("traefik.io", "v1alpha1", "Middleware");
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            NS,
            &ApiResource::from_gvk_with_plural(&gvk, "middlewares"),
        );
        let obj = json!({"apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
            "metadata": {"name": name, "namespace": NS}, "spec": spec});
        k8s::apply(&api, name, &obj).await?;
        Ok(())
    }
}
