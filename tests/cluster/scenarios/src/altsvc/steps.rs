//! The alt-svc scenario's steps: the set-up, each change timed, and the reads (Traefik's
//! header over TCP on each node, the Ingress, the operator's Middleware, the status) that
//! every step repeats.

use std::time::Instant;

use h3_ingress::api::altsvc::header_value;
use h3_ingress::api::{annotations, AltSvcAdvertiseStatus, Http3Listener, DEFAULT_ALT_SVC_MAX_AGE};
use h3_ingress::operator::advertise::altsvc::CLEAR;
use h3_ingress::operator::hosts::policy::keys::TRAEFIK_ROUTER_MIDDLEWARES;
use h3_ingress::operator::hosts::traefik::{alt_svc_middleware, alt_svc_reference};
use h3i_scenarios::cmd::repo;
use h3i_scenarios::h3::{self, Expect};
use h3i_scenarios::poll::{first_true, wait_ok};
use h3i_scenarios::{ensure, info, ok, Pki};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Api;
use serde_json::{json, Value};

use super::*;

fn advertised() -> String {
    header_value(443, DEFAULT_ALT_SVC_MAX_AGE)
}

/// The backend Service of a host: the browser's page and 1 MiB for [`SHOP`], busybox's for the
/// others.
fn service_of(host: &str) -> &'static str {
    if host == SHOP {
        "shop"
    } else {
        "backend"
    }
}

fn name_of(host: &str) -> &str {
    host.split('.').next().unwrap_or(host)
}

impl AltSvc {
    pub(super) async fn prepare(&mut self) -> Result<()> {
        ensure!(
            self.env.real_nodes,
            "real nodes only (H3I_NODES=real scripts/cluster.sh up)"
        );
        if app::anything_left(&self.client, &[NS_APP]).await? {
            app::remove_leftovers(&self.client, &[NS_APP]).await?;
        }
        Ok(())
    }

    pub(super) async fn install(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!(
            "helm install; Traefik on TCP 443 of both nodes; a backend; Ingresses (class {CLASS}) for {WWW} (no Middleware, no h3 annotation yet) and {OWN} (the user's Middleware {TEAM}, h3 annotation); a listener on UDP 443 with advertise.altSvc"
        ));
        app::helm_install(&self.env, &self.client, &app::chart(), &[]).await?;
        indent(sh(&traefik_sh(), &["up"]).await?);
        app::namespace(&self.client, NS_APP, &[]).await?;
        let pki = Pki::new(&self.tmp.join("pki"), "h3i-altsvc-ca")?;
        for host in [WWW, OWN, SHOP] {
            let leaf = pki.leaf(name_of(host), host)?;
            app::tls_secret(
                &self.client,
                NS_APP,
                &format!("{}-tls", name_of(host)),
                &leaf,
            )
            .await?;
            self.certs.push((host, leaf.sha256.clone()));
        }
        app::backend(&self.client, NS_APP, "altsvc backend").await?;
        let team = json!({"headers": {"customResponseHeaders": {TEAM_HEADER: "shop"}}});
        self.team_middleware(team).await?;
        self.ingress(WWW, json!({})).await?;
        let theirs = format!("{NS_APP}-{TEAM}@kubernetescrd");
        let own = json!({annotations::ENABLED: "true", TRAEFIK_ROUTER_MIDDLEWARES: theirs});
        self.ingress(OWN, own).await?;
        self.shop_backend().await?;
        self.ingress(SHOP, json!({annotations::ENABLED: "true"}))
            .await?;
        let spec = json!({"ingressClassName": CLASS, "upstream": {"address": "127.0.0.1:443"},
            "http": {"drainTimeoutSeconds": 2}, "advertise": {"altSvc": {}}});
        app::listener(&self.client, LISTENER, spec.clone()).await?;
        wait_ok(
            90,
            "Traefik routes the three hosts over TCP on both nodes",
            || async {
                for host in [WWW, OWN, SHOP] {
                    for ip in &self.env.ips {
                        if self.tcp(host, ip).await?.0 != 200 {
                            return Ok(false);
                        }
                    }
                }
                Ok(true)
            },
        )
        .await?;
        ensure!(
            self.headers_everywhere(WWW)
                .await?
                .iter()
                .all(Option::is_none),
            "{WWW} has Alt-Svc before its annotation"
        );
        ok(format!(
            "Traefik answers the three hosts with 200 on {}; no Alt-Svc on {WWW}",
            self.env.ips.join(", ")
        ));
        Ok(())
    }

    /// The browser test's page (tests/browser/chromium.py's own) and a 1 MiB `/1m.bin`, from
    /// busybox httpd behind Service `shop`.
    async fn shop_backend(&self) -> Result<()> {
        let py = h3::python().to_string_lossy().to_string();
        let browser = repo().join("tests/browser");
        let page = sh(&py, &["-c", "import sys; sys.path.insert(0, sys.argv[1]); import chromium; print(chromium.PAGE.format(fetch_path=chromium.FETCH_PATH))", &browser.to_string_lossy()]).await?;
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "shop-page", "namespace": NS_APP}, "data": {"index.html": page}});
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), NS_APP);
        h3i_scenarios::k8s::apply(&api, "shop-page", &cm).await?;
        let start = "cp /page/index.html /www/ && dd if=/dev/urandom of=/www/1m.bin bs=1024 count=1024 2>/dev/null && exec httpd -f -p 8080 -h /www";
        let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "shop", "namespace": NS_APP},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "shop"}},
                "template": {"metadata": {"labels": {"app": "shop"}},
                    "spec": {"containers": [{"name": "httpd", "image": "registry.h3i.test/busybox:1",
                        "imagePullPolicy": "IfNotPresent", "command": ["/bin/busybox", "sh", "-c", start],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "page", "mountPath": "/page"}, {"name": "www", "mountPath": "/www"}]}],
                        "volumes": [{"name": "page", "configMap": {"name": "shop-page"}}, {"name": "www", "emptyDir": {}}]}}}});
        let api: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(self.client.clone(), NS_APP);
        h3i_scenarios::k8s::apply(&api, "shop", &deploy).await?;
        let svc = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "shop", "namespace": NS_APP,
                "annotations": {"traefik.ingress.kubernetes.io/service.nativelb": "true"}},
            "spec": {"selector": {"app": "shop"}, "ports": [{"port": 80, "targetPort": 8080}]}});
        let api: Api<k8s_openapi::api::core::v1::Service> =
            Api::namespaced(self.client.clone(), NS_APP);
        h3i_scenarios::k8s::apply(&api, "shop", &svc).await?;
        Ok(())
    }

    /// The user's own headers Middleware.
    async fn team_middleware(&self, spec: Value) -> Result<()> {
        let obj = json!({"apiVersion": "traefik.io/v1alpha1", "kind": "Middleware",
            "metadata": {"name": TEAM, "namespace": NS_APP}, "spec": spec});
        h3i_scenarios::k8s::apply(&self.middlewares(), TEAM, &obj).await?;
        Ok(())
    }

    fn middlewares(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("traefik.io", "v1alpha1", "Middleware");
        let ar = ApiResource::from_gvk_with_plural(&gvk, "middlewares");
        Api::namespaced_with(self.client.clone(), NS_APP, &ar)
    }

    async fn ingress(&self, host: &str, annotations: Value) -> Result<()> {
        let name = name_of(host);
        let ing = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": name, "namespace": NS_APP, "annotations": annotations},
            "spec": {"ingressClassName": CLASS,
                "tls": [{"hosts": [host], "secretName": format!("{name}-tls")}],
                "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": service_of(host), "port": {"number": 80}}}}]}}]}});
        h3i_scenarios::k8s::apply(&self.ingresses(), name, &ing).await?;
        Ok(())
    }

    fn ingresses(&self) -> Api<Ingress> {
        Api::namespaced(self.client.clone(), NS_APP)
    }

    /// A merge patch of the Ingress's annotations (`null` removes one), as a user's edit.
    async fn annotate(&self, host: &str, annotations: Value) -> Result<()> {
        let patch = json!({"metadata": {"annotations": annotations}});
        h3i_scenarios::k8s::merge(&self.ingresses(), name_of(host), &patch).await?;
        Ok(())
    }

    /// (status, alt-svc header, x-team header) of a GET over TCP to Traefik on `ip`.
    async fn tcp(&self, host: &str, ip: &str) -> Result<(u16, Option<String>, Option<String>)> {
        let ca = self.ca.to_string_lossy().into_owned();
        let resolve = format!("{host}:443:{ip}");
        let url = format!("https://{host}/");
        let args = [
            "-sS",
            "--http1.1",
            "--max-time",
            "3",
            "--cacert",
            &ca,
            "--resolve",
            &resolve,
            "-D",
            "-",
            "-o",
            "/dev/null",
            &url,
        ];
        let out = h3i_scenarios::cmd::output("curl", &args).await?;
        let text = out.stdout;
        let status = (text.lines().next().unwrap_or_default().split_whitespace())
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let header = |name: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_string())
            })
        };
        Ok((status, header("alt-svc"), header(TEAM_HEADER)))
    }

    /// The Alt-Svc header Traefik sends for `host` on each node (200s only).
    async fn headers_everywhere(&self, host: &str) -> Result<Vec<Option<String>>> {
        let mut out = Vec::new();
        for ip in &self.env.ips {
            let (status, alt, _) = self.tcp(host, ip).await?;
            ensure!(
                status == 200,
                "Traefik on {ip} answered {host} with {status}"
            );
            out.push(alt);
        }
        Ok(out)
    }

    /// Every node's Traefik sends exactly `want` (`None`: no header) for `host`.
    async fn header_is(&self, host: &str, want: Option<&str>) -> Result<bool> {
        Ok(self
            .headers_everywhere(host)
            .await?
            .iter()
            .all(|h| h.as_deref() == want))
    }

    /// Aioquic GET / on both nodes answered 200 with the host's certificate.
    async fn served(&self, host: &str) -> Result<bool> {
        let cert = self
            .certs
            .iter()
            .find(|(h, _)| *h == host)
            .map(|(_, c)| c.as_str());
        let want = Expect {
            cert_sha256: cert,
            ..Default::default()
        };
        h3::get_all(&self.env.ips, host, 443, "/", &self.ca, &want).await?;
        Ok(true)
    }

    async fn status(&self) -> Result<Option<AltSvcAdvertiseStatus>> {
        let l = Api::<Http3Listener>::all(self.client.clone())
            .get(LISTENER)
            .await?;
        Ok(l.status.and_then(|s| s.advertise).and_then(|a| a.alt_svc))
    }

    /// `status.advertise.altSvc` satisfies `cond` within 30 s; printed.
    async fn status_says(
        &self,
        what: &str,
        cond: impl Fn(&AltSvcAdvertiseStatus) -> bool,
    ) -> Result<()> {
        wait_ok(30, what, || async {
            Ok(self.status().await?.is_some_and(|s| cond(&s)))
        })
        .await?;
        info(format!(
            "status.advertise.altSvc: {:?}",
            self.status().await?
        ));
        Ok(())
    }

    /// The Ingress's `router.middlewares`.
    async fn router_middlewares(&self, host: &str) -> Result<Option<String>> {
        let ing = self.ingresses().get(name_of(host)).await?;
        Ok(ing
            .metadata
            .annotations
            .and_then(|a| a.get(TRAEFIK_ROUTER_MIDDLEWARES).cloned()))
    }

    /// The operator's Middleware for the host's Ingress: its Alt-Svc value, if it exists.
    async fn operator_middleware(&self, host: &str) -> Result<Option<String>> {
        let name = alt_svc_middleware(name_of(host));
        let m = h3i_scenarios::k8s::get(&self.middlewares(), &name).await?;
        Ok(m.map(|m| {
            let v = &m.data["spec"]["headers"]["customResponseHeaders"]["Alt-Svc"];
            v.as_str().unwrap_or_default().to_string()
        }))
    }
}

impl AltSvc {
    /// Served on both nodes and the header `want` on both, timed from `t0` together.
    async fn served_then(&self, t0: Instant, host: &str, want: &str) -> Result<(f64, f64)> {
        let (s, h) = (
            format!("{host} served on both nodes"),
            format!("alt-svc: {want} on both nodes"),
        );
        let (served, header) = tokio::join!(
            first_true(t0, 120, &s, || self.served(host)),
            first_true(t0, 120, &h, || self.header_is(host, Some(want))),
        );
        Ok((served?, header?))
    }

    pub(super) async fn annotated(&mut self, run: &mut Run) -> Result<()> {
        let want = advertised();
        run.step(format!("(a) the annotation added to {WWW}: served over HTTP/3 on both nodes, then alt-svc: {want} from Traefik over TCP"));
        let t0 = Instant::now();
        self.annotate(WWW, json!({annotations::ENABLED: "true"}))
            .await?;
        let (served, header) = self.served_then(t0, WWW, &want).await?;
        ok(format!("after the annotation: served on both nodes at {served:.2} s, the header on both at {header:.2} s"));
        let own = alt_svc_reference(NS_APP, name_of(WWW));
        let list = self.router_middlewares(WWW).await?;
        ensure!(
            list.as_deref() == Some(own.as_str()),
            "router.middlewares of {WWW}: {list:?}, want {own}"
        );
        let mw = self.operator_middleware(WWW).await?;
        ensure!(
            mw.as_deref() == Some(want.as_str()),
            "the operator's Middleware says {mw:?}"
        );
        ok(format!(
            "Ingress {NS_APP}/{} names {own}; Middleware {} says {want}",
            name_of(WWW),
            alt_svc_middleware(name_of(WWW))
        ));
        self.status_says("advertised >= 1", |s| s.advertised >= 1)
            .await?;
        self.timings.row(
            "(a) annotation added: header after the host is served",
            header - served,
        );
        Ok(())
    }

    /// The listener with `advertise.altSvc`; `off_nodes` adds a nodeSelector no node matches.
    async fn apply_listener(&self, off_nodes: bool) -> Result<()> {
        let mut spec = json!({"ingressClassName": CLASS, "upstream": {"address": "127.0.0.1:443"},
            "http": {"drainTimeoutSeconds": 2}, "advertise": {"altSvc": {}}});
        if off_nodes {
            spec["nodeSelector"] = json!({"h3i.test/altsvc": "nowhere"});
        }
        app::listener(&self.client, LISTENER, spec).await?;
        Ok(())
    }

    pub(super) async fn off_the_nodes(&mut self, run: &mut Run) -> Result<()> {
        run.step("(b) the data plane taken off the nodes (a nodeSelector no node matches): no pod serving, then alt-svc: clear");
        let t0 = Instant::now();
        self.apply_listener(true).await?;
        let (stopped, cleared) = tokio::join!(
            first_true(t0, 120, "no data plane pod Ready and not deleted", || {
                app::none_serving(&self.client, LISTENER)
            }),
            first_true(t0, 120, "alt-svc: clear on both nodes", || self
                .header_is(WWW, Some(CLEAR))),
        );
        let (stopped, cleared) = (stopped?, cleared?);
        ok(format!("after the nodeSelector: no pod serving at {stopped:.2} s, alt-svc: clear at {cleared:.2} s"));
        self.status_says("withdrawn >= 1", |s| s.withdrawn >= 1 && s.advertised == 0)
            .await?;
        self.timings.row(
            "(b) data plane off the nodes: clear after no pod serves",
            cleared - stopped,
        );
        Ok(())
    }

    pub(super) async fn back_on_the_nodes(&mut self, run: &mut Run) -> Result<()> {
        let want = advertised();
        run.step(format!(
            "(c) the data plane back: {WWW} served again, then alt-svc: {want}"
        ));
        let t0 = Instant::now();
        self.apply_listener(false).await?;
        let (served, header) = self.served_then(t0, WWW, &want).await?;
        ok(format!("after the nodeSelector went: served at {served:.2} s, the header back at {header:.2} s"));
        self.timings.row(
            "(c) data plane back: header after the host is served",
            header - served,
        );
        Ok(())
    }

    pub(super) async fn unannotated(&mut self, run: &mut Run) -> Result<()> {
        run.step(format!("(d) the annotation removed from {WWW}: alt-svc: clear, then the operator's reference and Middleware gone while Traefik still routes it"));
        let t0 = Instant::now();
        self.annotate(WWW, json!({annotations::ENABLED: null}))
            .await?;
        let cleared = first_true(
            t0,
            120,
            "alt-svc: clear (or none) on both nodes",
            || async {
                let hs = self.headers_everywhere(WWW).await?;
                Ok(hs
                    .iter()
                    .all(|h| h.is_none() || h.as_deref() == Some(CLEAR)))
            },
        )
        .await?;
        let tidy = first_true(
            t0,
            60,
            "router.middlewares and the Middleware gone",
            || async {
                Ok(self.router_middlewares(WWW).await?.is_none()
                    && self.operator_middleware(WWW).await?.is_none())
            },
        )
        .await?;
        ensure!(
            self.header_is(WWW, None).await?,
            "{WWW}: a header left after the Middleware went"
        );
        ok(format!("after the annotation went: clear at {cleared:.2} s; reference and Middleware gone at {tidy:.2} s; Traefik answers 200 without Alt-Svc on both nodes"));
        self.timings.row(
            "(d) annotation removed: clear (or no header) after the change",
            cleared,
        );
        Ok(())
    }

    pub(super) async fn users_own_list(&mut self, run: &mut Run) -> Result<()> {
        let (own, want) = (alt_svc_reference(NS_APP, name_of(OWN)), advertised());
        run.step(format!("(e) {OWN} names the user's own Middleware: its list untouched, the status names {own}, no header until the user adds it, then the header"));
        first_true(
            Instant::now(),
            120,
            &format!("{OWN} served on both nodes"),
            || self.served(OWN),
        )
        .await?;
        let needs = format!("{NS_APP}/{}: {own}", name_of(OWN));
        self.status_says("needsReference names it", |s| {
            s.needs_reference.contains(&needs)
        })
        .await?;
        let theirs = format!("{NS_APP}-{TEAM}@kubernetescrd");
        let list = self.router_middlewares(OWN).await?;
        ensure!(
            list.as_deref() == Some(theirs.as_str()),
            "{OWN}'s router.middlewares changed: {list:?}"
        );
        for ip in &self.env.ips {
            let (status, alt, team) = self.tcp(OWN, ip).await?;
            ensure!(
                status == 200 && alt.is_none() && team.as_deref() == Some("shop"),
                "{OWN} on {ip}: {status} alt-svc {alt:?} x-team {team:?}"
            );
        }
        ok(format!(
            "router.middlewares still {theirs}; Traefik sends x-team and no Alt-Svc"
        ));
        let t0 = Instant::now();
        self.annotate(
            OWN,
            json!({TRAEFIK_ROUTER_MIDDLEWARES: format!("{theirs},{own}")}),
        )
        .await?;
        let header = first_true(t0, 60, "the header after the user's edit", || async {
            for ip in &self.env.ips {
                let (_, alt, team) = self.tcp(OWN, ip).await?;
                if alt.as_deref() != Some(want.as_str()) || team.as_deref() != Some("shop") {
                    return Ok(false);
                }
            }
            Ok(true)
        })
        .await?;
        self.status_says("needsReference empty", |s| s.needs_reference.is_empty())
            .await?;
        ok(format!(
            "after the user listed {own}: alt-svc and x-team on both nodes at {header:.2} s"
        ));
        Ok(())
    }
}

impl AltSvc {
    pub(super) async fn browser(&mut self, run: &mut Run) -> Result<()> {
        let (ip, want) = (self.env.ips[0].clone(), advertised());
        run.step(format!("(f) Debian's Chromium, empty profile, through Traefik on {ip}: the Alt-Svc the operator put there sends it to the data plane (tests/browser/chromium.py)"));
        let what = format!("{SHOP} served and alt-svc: {want} from Traefik on both nodes");
        wait_ok(60, &what, || async {
            Ok(self.served(SHOP).await? && self.header_is(SHOP, Some(&want)).await?)
        })
        .await?;
        let script = repo().join("tests/browser/run.sh");
        let (ingress, ca, metrics) = (
            format!("{ip}:443"),
            self.ca.to_string_lossy().to_string(),
            format!("http://{ip}:9476/metrics"),
        );
        let args = ["--ingress", &ingress, "--ca", &ca, "--metrics", &metrics];
        let out = h3i_scenarios::cmd::output(&script.to_string_lossy(), &args).await?;
        let text = out.stdout.clone() + &out.stderr;
        indent(&text);
        ensure!(
            out.success(),
            "tests/browser/chromium.py through Traefik on {ip} (exit {:?})",
            out.status
        );
        let discovery = text
            .lines()
            .find(|l| l.starts_with("run 1 discovery:"))
            .unwrap_or_default();
        ok(format!("Chromium through Traefik on {ip}: {discovery}"));
        Ok(())
    }
}
