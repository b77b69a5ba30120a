//! The front door's stage: the chart, the two TCP ingresses on every node (Debian nginx with
//! ingress-nginx's allowlist directives, Traefik through tests/cluster/traefik.sh), the
//! application's Secrets, Ingresses, Middleware and TLSOption, and the two listeners.

use h3i_scenarios::k8s::Apis;
use std::collections::BTreeMap;

use h3i_scenarios::cmd::{output, repo, run as sh};
use h3i_scenarios::poll::until;
use h3i_scenarios::{ensure, indent, info, ok, Error, Pki, Result, Run};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use serde_json::json;

use super::slow::{SLOW_PATH, SLOW_SECONDS};
use super::*;

/// Every host of the run, with the ingress (class) serving it over TCP.
const NGINX_HOSTS: [&str; 4] = [GUARDED, OPEN, MTLS, SLOW];
const TRAEFIK_HOSTS: [&str; 3] = [T_GUARDED, T_MTLS, T_RATE];

pub(super) fn io(context: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        context: context.to_string(),
        source,
    }
}

/// nginx's configuration for `node`: each host on TCP 443 with its certificate, the
/// allowlist ingress-nginx writes for `whitelist-source-range` on the guarded and open hosts
/// (`allow`, then `deny all` at the server, judged in the access phase before `/` is served),
/// and with `real_ip` the real-IP module ingress-nginx configures for `use-forwarded-headers`
/// (trusting only 127.0.0.1, where the data plane connects from). Every answer names the
/// address nginx judged in `X-Judged`. The slow host proxies [`SLOW_PATH`] to `slow`
/// with a 120 s read timeout, as ingress-nginx renders `proxy-read-timeout: "120"`.
pub fn nginx_conf(dir: &std::path::Path, allow: &[&str], real_ip: bool, slow: &str) -> String {
    let d = dir.display();
    let mut c = format!(
        "user root;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 256; }}\nhttp {{\n    access_log {d}/access.log;\n    \
         client_body_temp_path {d}/tmp/body;\n    proxy_temp_path {d}/tmp/proxy;\n    \
         fastcgi_temp_path {d}/tmp/fastcgi;\n    uwsgi_temp_path {d}/tmp/uwsgi;\n    \
         scgi_temp_path {d}/tmp/scgi;\n    default_type text/plain;\n    \
         server {{\n        listen {TCP_NGINX} ssl http2 default_server;\n        \
         listen [::]:{TCP_NGINX} ssl http2 default_server;\n        ssl_reject_handshake on;\n    }}\n"
    );
    for h in NGINX_HOSTS {
        let mut rules = String::new();
        if real_ip {
            rules += "set_real_ip_from 127.0.0.1; real_ip_header X-Forwarded-For; real_ip_recursive on; ";
        }
        if h == GUARDED || h == OPEN {
            for a in allow {
                rules += &format!("allow {a}; ");
            }
            rules += "deny all; ";
        }
        if h == SLOW {
            rules += &format!(
                "location {SLOW_PATH} {{ proxy_pass http://{slow}; proxy_read_timeout 120s; }} "
            );
        }
        c += &format!(
            "    server {{\n        listen {TCP_NGINX} ssl http2;\n        \
             listen [::]:{TCP_NGINX} ssl http2;\n        server_name {h};\n        \
             ssl_certificate {d}/{h}.crt;\n        ssl_certificate_key {d}/{h}.key;\n        \
             {rules}\n        add_header X-Judged $remote_addr always;\n        \
             root {d}/www;\n    }}\n"
        );
    }
    c + "}\n"
}

impl Frontdoor {
    fn nginx_dir(&self, node: &str) -> PathBuf {
        self.tmp.join(format!("nginx-{node}"))
    }

    /// The allowlist of the guarded hosts: the host, and the node's loopback (where the data
    /// plane connects from: forwarded as-is, the TCP ingress would admit every HTTP/3 client).
    pub(super) fn allowlist(&self) -> Vec<String> {
        vec![format!("{}/32", self.inside), "127.0.0.1/32".to_string()]
    }

    /// Writes every node's nginx configuration and starts nginx, or reloads it.
    pub(super) async fn nginx(&self, real_ip: bool, reload: bool) -> Result<()> {
        let allow = self.allowlist();
        let allow: Vec<&str> = allow.iter().map(String::as_str).collect();
        let slow = self.slow_backend.as_ref().map(|b| b.address.clone());
        let slow = slow.unwrap_or_default();
        for node in &self.env.nodes {
            let d = self.nginx_dir(node);
            let conf = d.join("nginx.conf");
            std::fs::write(&conf, nginx_conf(&d, &allow, real_ip, &slow))
                .map_err(io("nginx.conf"))?;
            let (prefix, conf) = (
                format!("{}/", d.display()),
                conf.to_string_lossy().to_string(),
            );
            let mut args = vec!["-p", &prefix, "-c", &conf];
            if reload {
                args.extend(["-s", "reload"]);
            }
            h3i_scenarios::cmd::netns(node, "nginx", &args).await?;
        }
        Ok(())
    }

    /// What a kept or interrupted run left would confuse every check.
    pub(super) async fn prepare(&mut self) -> Result<()> {
        let ns = self.all::<Namespace>();
        if k8s::exists(&ns, NS_OP).await? || k8s::exists(&ns, NS_APP).await? {
            info("removing a previous run's objects");
            self.remove_objects().await;
            self.namespaces_gone().await?;
        }
        for node in &self.env.nodes {
            for pid in h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-frontdoor.") {
                info(format!(
                    "stopped a previous run's nginx in {node} (pid {pid})"
                ));
            }
        }
        ensure!(
            !self.inside.is_empty(),
            "H3I_HOST_IP is not set (scripts/cluster.sh env)"
        );
        Ok(())
    }

    /// Waits for both namespaces to be gone: their data-plane pods with them, so the next
    /// test on these nodes finds UDP 443 and 9443 free.
    pub(super) async fn namespaces_gone(&self) -> Result<()> {
        let ns = self.all::<Namespace>();
        for n in [NS_APP, NS_OP] {
            until(90, &format!("namespace {n} deleted"), || async {
                Ok(!k8s::exists(&ns, n).await?)
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes the listeners, the release, the namespaces, nginx and Traefik; never fails.
    pub(super) async fn remove_objects(&self) {
        let ls = self.all::<Http3Listener>();
        for l in [L_NGINX, L_TRAEFIK] {
            let _ = k8s::delete(&ls, l).await;
        }
        let _ = output("helm", &["uninstall", RELEASE, "-n", NS_OP, "--wait"]).await;
        for n in [NS_APP, NS_OP] {
            let _ = k8s::delete(&self.all::<Namespace>(), n).await;
        }
        let _ = k8s::delete(&self.all::<IngressClass>(), "nginx").await;
        for node in &self.env.nodes {
            h3i_scenarios::nginx::stop_leftovers(node, "/tmp/h3i-frontdoor.");
        }
        let traefik = repo().join("tests/cluster/traefik.sh");
        let _ = output(&traefik.to_string_lossy(), &["down"]).await;
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install the chart (image {IMAGE_REPO}, a pull secret)"
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_OP,
            "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}});
        k8s::apply(&self.all::<Namespace>(), NS_OP, &ns).await?;
        let password =
            std::fs::read_to_string(&self.env.registry_password_file).unwrap_or_default();
        let user = self.env.registry_user.clone();
        let auth = h3i_scenarios::pods::base64(format!("{user}:{}", password.trim()).as_bytes());
        let config = json!({"auths": {"registry.h3i.test": {"username": user,
            "password": password.trim(), "auth": auth}}});
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "regcred", "namespace": NS_OP},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": config.to_string()}});
        k8s::apply(&self.ns::<Secret>(NS_OP), "regcred", &secret).await?;
        let chart = repo().join("charts/h3-ingress");
        let set = format!("image.repository={IMAGE_REPO}");
        let args = [
            "install",
            RELEASE,
            &chart.to_string_lossy(),
            "-n",
            NS_OP,
            "--set",
            &set,
            "--set",
            "imagePullSecrets[0].name=regcred",
            "--wait",
            "--timeout",
            "120s",
        ];
        let t0 = std::time::Instant::now();
        sh("helm", &args)
            .await
            .map_err(|e| Error::Check(format!("helm install: {e}")))?;
        ok(format!("helm install --wait: {}s", t0.elapsed().as_secs()));
        Ok(())
    }

    /// The PKI (a CA and one leaf per host), nginx on every node, Traefik on every node.
    pub(super) async fn ingresses(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "the TCP ingresses: Debian nginx on TCP {TCP_NGINX} (allowlist {} on {GUARDED} and {OPEN}, \
             no real-IP module yet) and Traefik on TCP {TCP_TRAEFIK} (h3proxy {TCP_TRAEFIK_PROXY} \
             takes PROXY protocol from 127.0.0.1; forwarded headers trusted from 127.0.0.1)",
            self.allowlist().join(", ")
        ));
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-frontdoor-ca")?;
        let mut leaves = BTreeMap::new();
        for h in NGINX_HOSTS.iter().chain(&TRAEFIK_HOSTS) {
            leaves.insert(*h, pki.leaf(h, h)?);
        }
        for node in &self.env.nodes {
            let d = self.nginx_dir(node);
            std::fs::create_dir_all(d.join("tmp")).map_err(io("mkdir nginx"))?;
            std::fs::create_dir_all(d.join("www")).map_err(io("mkdir www"))?;
            std::fs::write(d.join("www/index.html"), format!("nginx on {node}\n"))
                .map_err(io("index.html"))?;
            for h in NGINX_HOSTS {
                std::fs::copy(&leaves[h].crt, d.join(format!("{h}.crt"))).map_err(io("crt"))?;
                std::fs::copy(&leaves[h].key, d.join(format!("{h}.key"))).map_err(io("key"))?;
            }
        }
        let backend = super::slow::SlowBackend::start(&self.inside).await?;
        ok(format!(
            "a backend answering after {SLOW_SECONDS} s on {}, nginx's upstream for {SLOW}{SLOW_PATH}",
            backend.address
        ));
        self.slow_backend = Some(backend);
        self.nginx(false, false).await?;
        ok(format!("nginx runs in {}", self.env.nodes.join(", ")));
        let traefik = repo().join("tests/cluster/traefik.sh");
        let (port, proxy) = (TCP_TRAEFIK.to_string(), TCP_TRAEFIK_PROXY.to_string());
        let args = [
            "up",
            "--port",
            &port,
            "--trusted-ips",
            "127.0.0.1/32",
            "--proxy-trusted-ips",
            "127.0.0.1/32",
            "--proxy-port",
            &proxy,
        ];
        indent(sh(&traefik.to_string_lossy(), &args).await?);
        Ok(())
    }

    async fn tls_secret(&self, host: &str) -> Result<()> {
        let read = |ext: &str| std::fs::read(self.tmp.join(format!("pki/{host}.{ext}")));
        let name = format!("{}-tls", host.split('.').next().unwrap_or(host));
        let crt = read("crt").map_err(io("leaf"))?;
        let key = read("key").map_err(io("key"))?;
        let s = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": NS_APP},
            "stringData": {"tls.crt": String::from_utf8_lossy(&crt), "tls.key": String::from_utf8_lossy(&key)}});
        k8s::apply(&self.ns::<Secret>(NS_APP), &name, &s).await?;
        Ok(())
    }

    /// An Ingress switched on for HTTP/3, of `class`, for `host`, with `annotations`.
    async fn ingress(&self, class: &str, host: &str, annotations: Value) -> Result<()> {
        let name = host.split('.').next().unwrap_or(host);
        let mut ann = json!({h3_ingress::api::annotations::ENABLED: "true"});
        if let (Some(a), Value::Object(more)) = (ann.as_object_mut(), annotations) {
            a.extend(more);
        }
        let ing = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS_APP, "annotations": ann},
            "spec": {"ingressClassName": class,
                "tls": [{"hosts": [host], "secretName": format!("{name}-tls")}],
                "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "backend", "port": {"number": 80}}}}]}}]}});
        k8s::apply(&self.ns::<Ingress>(NS_APP), name, &ing).await?;
        Ok(())
    }

    /// A Traefik object (`Middleware`, `TLSOption`) in the application's namespace.
    async fn traefik_object(&self, kind: &str, name: &str, spec: Value) -> Result<()> {
        let gvk = GroupVersionKind::gvk("traefik.io", "v1alpha1", kind);
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            NS_APP,
            &ApiResource::from_gvk_with_plural(&gvk, &format!("{}s", kind.to_lowercase())),
        );
        let obj = json!({"apiVersion": "traefik.io/v1alpha1", "kind": kind,
            "metadata": {"name": name, "namespace": NS_APP}, "spec": spec});
        k8s::apply(&api, name, &obj).await?;
        Ok(())
    }
}

impl Frontdoor {
    /// The application: TLS Secrets, IngressClass nginx, a backend for Traefik, the Ingresses,
    /// the Middleware and the TLSOption; then the two listeners, as installed (no
    /// `clientAddress`).
    pub(super) async fn objects(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "namespace {NS_APP}: an Ingress per host (class nginx: {GUARDED} with {WHITELIST}, \
             {OPEN} without, {MTLS} with auth-tls-verify-client, {SLOW} with proxy-read-timeout \
             \"120\"; class traefik: {T_GUARDED} with an ipAllowList Middleware, {T_MTLS} with \
             a clientAuth TLSOption, {T_RATE} with a rateLimit Middleware); listeners {L_NGINX} \
             and {L_TRAEFIK} as installed"
        ));
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_APP}});
        k8s::apply(&self.all::<Namespace>(), NS_APP, &ns).await?;
        for h in NGINX_HOSTS.iter().chain(&TRAEFIK_HOSTS) {
            self.tls_secret(h).await?;
        }
        let ca = std::fs::read_to_string(&self.ca).map_err(io("ca.crt"))?;
        let ca_secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "client-ca", "namespace": NS_APP}, "stringData": {"ca.crt": ca}});
        k8s::apply(&self.ns::<Secret>(NS_APP), "client-ca", &ca_secret).await?;
        let class = json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "nginx"}, "spec": {"controller": "k8s.io/ingress-nginx"}});
        k8s::apply(&self.all::<IngressClass>(), "nginx", &class).await?;
        h3i_scenarios::app::backend(&self.client, NS_APP, "traefik backend").await?;
        let allow = self.allowlist();
        self.ingress("nginx", GUARDED, json!({WHITELIST: allow.join(",")}))
            .await?;
        self.ingress("nginx", OPEN, json!({})).await?;
        let mtls = json!({"nginx.ingress.kubernetes.io/auth-tls-verify-client": "on",
            "nginx.ingress.kubernetes.io/auth-tls-secret": format!("{NS_APP}/client-ca")});
        self.ingress("nginx", MTLS, mtls).await?;
        let slow = json!({"nginx.ingress.kubernetes.io/proxy-read-timeout": "120"});
        self.ingress("nginx", SLOW, slow).await?;
        self.traefik_object(
            "Middleware",
            "allow",
            json!({"ipAllowList": {"sourceRange": allow}}),
        )
        .await?;
        let rate = json!({"rateLimit": {"average": 1, "period": "1m", "burst": RATE_BURST}});
        self.traefik_object("Middleware", "rate", rate).await?;
        let limited = json!({"traefik.ingress.kubernetes.io/router.middlewares":
            format!("{NS_APP}-rate@kubernetescrd")});
        self.ingress("traefik", T_RATE, limited).await?;
        let tls = json!({"clientAuth": {"secretNames": ["client-ca"],
            "clientAuthType": "RequireAndVerifyClientCert"}});
        self.traefik_object("TLSOption", "mtls", tls).await?;
        let routed = json!({"traefik.ingress.kubernetes.io/router.middlewares":
            format!("{NS_APP}-allow@kubernetescrd")});
        self.ingress("traefik", T_GUARDED, routed).await?;
        let options = json!({"traefik.ingress.kubernetes.io/router.tls.options":
            format!("{NS_APP}-mtls@kubernetescrd")});
        self.ingress("traefik", T_MTLS, options).await?;
        let nginx_up = json!({"address": format!("127.0.0.1:{TCP_NGINX}")});
        self.apply_listener(L_NGINX, "nginx", UDP_NGINX, 9476, nginx_up)
            .await?;
        let traefik_up = json!({"address": format!("127.0.0.1:{TCP_TRAEFIK}")});
        self.apply_listener(L_TRAEFIK, "traefik", UDP_TRAEFIK, 9486, traefik_up)
            .await?;
        ok(format!(
            "7 Ingresses, Middlewares {NS_APP}/allow (ipAllowList {}) and {NS_APP}/rate \
             (rateLimit {RATE_BURST}/min), TLSOption {NS_APP}/mtls; \
             listeners {L_NGINX} (UDP {UDP_NGINX} -> 127.0.0.1:{TCP_NGINX}) and {L_TRAEFIK} \
             (UDP {UDP_TRAEFIK} -> 127.0.0.1:{TCP_TRAEFIK})",
            allow.join(", ")
        ));
        Ok(())
    }
}
